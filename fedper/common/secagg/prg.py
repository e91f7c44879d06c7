"""The mask generator: a 32-byte seed expanded to uint32 words by the ChaCha20 keystream.

ChaCha20 (RFC 7539 via ``cryptography``) keyed by the seed, with a zero nonce: every seed is a
fresh HKDF output or random, used for one vector, so the nonce is never reused under a key.
"""

from __future__ import annotations

import numpy as np
from cryptography.hazmat.primitives.ciphers import Cipher, algorithms

SEED_BYTES = 32
_NONCE = bytes(16)


def expand(seed: bytes, words: int) -> np.ndarray:
    """``words`` pseudo-random uint32 (little-endian keystream words)."""
    if len(seed) != SEED_BYTES:
        raise ValueError(f"a mask seed is {SEED_BYTES} bytes, got {len(seed)}")
    stream = Cipher(algorithms.ChaCha20(seed, _NONCE), mode=None).encryptor().update(bytes(4 * words))
    return np.frombuffer(stream, dtype="<u4").astype(np.uint32)
