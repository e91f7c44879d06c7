"""The mask generator: a 32-byte seed expanded to uint32 words by AES-256 in counter mode.

AES-256-CTR keyed by the seed, from an all-zero 128-bit counter block (incremented as one
big-endian integer, as NIST SP 800-38A and Java's ``AES/CTR/NoPadding`` do), encrypting zeros:
the keystream, read as little-endian uint32 words. Every seed is a fresh HKDF output or random
and expands one vector, so no counter block repeats under a key. AES-CTR rather than ChaCha20
because every Android version's JCA has it, so the Java core can produce the same masks.
"""

from __future__ import annotations

import numpy as np
from cryptography.hazmat.primitives.ciphers import Cipher, algorithms, modes

SEED_BYTES = 32
_COUNTER = bytes(16)


def expand(seed: bytes, words: int) -> np.ndarray:
    """``words`` pseudo-random uint32 (the keystream's little-endian words)."""
    if len(seed) != SEED_BYTES:
        raise ValueError(f"a mask seed is {SEED_BYTES} bytes, got {len(seed)}")
    stream = Cipher(algorithms.AES(seed), modes.CTR(_COUNTER)).encryptor().update(bytes(4 * words))
    return np.frombuffer(stream, dtype="<u4").astype(np.uint32)
