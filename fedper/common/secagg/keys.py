"""A device's two X25519 key pairs, what two devices derive from them, and the sealed messages
that carry shares between them through the server (docs/SECAGG.md, "To the byte").

Each device advertises two public keys (Bonawitz et al.): with the *channel* pair it agrees on an
AES-GCM key with each neighbour, to send it shares through the server; with the *mask* pair it
agrees on the seed of their pairwise mask. Both come out of X25519 through HKDF-SHA256, with
the purpose and the round in its info, so that no key serves two purposes or two rounds.
"""

from __future__ import annotations

import os
from collections.abc import Callable
from dataclasses import dataclass

from cryptography.exceptions import InvalidTag
from cryptography.hazmat.primitives import hashes
from cryptography.hazmat.primitives.asymmetric.x25519 import X25519PrivateKey, X25519PublicKey
from cryptography.hazmat.primitives.ciphers.aead import AESGCM
from cryptography.hazmat.primitives.kdf.hkdf import HKDF
from cryptography.hazmat.primitives.serialization import Encoding, NoEncryption, PrivateFormat, PublicFormat

from fedper.common.errors import FedperError

KEY_BYTES = 32
NONCE_BYTES = 12
TAG_BYTES = 16
CHANNEL, MASK = b"channel", b"mask"
FIELD = 2**255 - 19  # X25519's prime: a canonical public key is below it
# Any scalar does: X25519 clamps it to a multiple of 8, which takes every low-order point to zero.
_PROBE = X25519PrivateKey.from_private_bytes(bytes([8]) + bytes(30) + bytes([64]))


class ChannelError(FedperError, ValueError):
    """A public key, private key or ciphertext that is not what the protocol expects."""


def private_key(raw: bytes | None = None) -> X25519PrivateKey:
    """A fresh private key, or the one whose 32 raw bytes are given (a reconstructed one)."""
    if raw is None:
        return X25519PrivateKey.generate()
    if len(raw) != KEY_BYTES:
        raise ChannelError(f"an X25519 private key is {KEY_BYTES} bytes, got {len(raw)}")
    return X25519PrivateKey.from_private_bytes(raw)


def private_bytes(key: X25519PrivateKey) -> bytes:
    return key.private_bytes(Encoding.Raw, PrivateFormat.Raw, NoEncryption())


def public_bytes(key: X25519PrivateKey) -> bytes:
    return key.public_key().public_bytes(Encoding.Raw, PublicFormat.Raw)


def check_public(raw: bytes) -> None:
    """A public key the protocol accepts: 32 bytes, the canonical encoding of a u-coordinate
    (below 2^255 - 19, so the top bit is clear) and not of low order (X25519 of it with a clamped
    scalar, a multiple of 8, would be all zeros). Two encodings of one point, or a point every
    private key agrees on, would defeat the checks for repeated keys and the masks."""
    if len(raw) != KEY_BYTES:
        raise ChannelError(f"an X25519 public key is {KEY_BYTES} bytes, got {len(raw)}")
    if int.from_bytes(raw, "little") >= FIELD:
        raise ChannelError("the public key is not in canonical form (u >= 2^255 - 19)")
    try:
        _PROBE.exchange(X25519PublicKey.from_public_bytes(raw))
    except ValueError as e:  # the shared secret would be all zeros
        raise ChannelError("the public key is a point of low order") from e


def agree(own: X25519PrivateKey, theirs: bytes, purpose: bytes, context: bytes) -> bytes:
    """The 32-byte key two devices share for ``purpose`` in ``context`` (the round's session):
    HKDF-SHA256 (no salt) of their X25519 secret, info ``fedper secagg <purpose> <context>``.
    ``theirs`` was checked (check_public) when it arrived; a low-order key still fails here."""
    if len(theirs) != KEY_BYTES:
        raise ChannelError(f"an X25519 public key is {KEY_BYTES} bytes, got {len(theirs)}")
    try:
        secret = own.exchange(X25519PublicKey.from_public_bytes(theirs))
    except ValueError as e:  # the shared secret would be all zeros
        raise ChannelError("the public key is a point of low order") from e
    hkdf = HKDF(algorithm=hashes.SHA256(), length=KEY_BYTES, salt=None, info=info(purpose, context))
    return hkdf.derive(secret)


def info(purpose: bytes, context: bytes) -> bytes:
    return b"fedper secagg " + purpose + b" " + context


@dataclass(frozen=True)
class KeyPairs:
    """A device's keys for one round."""

    channel: X25519PrivateKey
    mask: X25519PrivateKey

    @classmethod
    def generate(cls) -> KeyPairs:
        return cls(private_key(), private_key())

    def public(self) -> tuple[bytes, bytes]:
        return public_bytes(self.channel), public_bytes(self.mask)


def sealed_size(plaintext: int) -> int:
    return NONCE_BYTES + plaintext + TAG_BYTES


def encrypt(key: bytes, plaintext: bytes, associated: bytes, nonce: Callable[[int], bytes] = os.urandom) -> bytes:
    """AES-256-GCM under a random 96-bit nonce: nonce || ciphertext || tag; ``associated`` is
    bound, not sent (``nonce``: a fixed one only for the known-answer vectors)."""
    iv = nonce(NONCE_BYTES)
    return iv + AESGCM(key).encrypt(iv, plaintext, associated)


def decrypt(key: bytes, ciphertext: bytes, associated: bytes) -> bytes:
    if len(ciphertext) < NONCE_BYTES + TAG_BYTES:
        raise ChannelError(f"a ciphertext is at least {NONCE_BYTES + TAG_BYTES} bytes, got {len(ciphertext)}")
    try:
        return AESGCM(key).decrypt(ciphertext[:NONCE_BYTES], ciphertext[NONCE_BYTES:], associated)
    except InvalidTag as e:
        raise ChannelError("a ciphertext failed its authentication: not for this device, round or sender") from e
