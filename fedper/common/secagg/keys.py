"""A device's two X25519 key pairs and what two devices derive from them.

Each device advertises two public keys (Bonawitz et al.): with the *channel* pair it agrees on an
AES-GCM key with each neighbour, to send it shares through the server; with the *mask* pair it
agrees on the seed of their pairwise mask. Both come out of X25519 through HKDF-SHA256, with
the round and the purpose in its info, so that no key serves two purposes or two rounds.
"""

from __future__ import annotations

import os
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
CHANNEL, MASK = b"channel", b"mask"


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


def public_key(raw: bytes) -> X25519PublicKey:
    if len(raw) != KEY_BYTES:
        raise ChannelError(f"an X25519 public key is {KEY_BYTES} bytes, got {len(raw)}")
    return X25519PublicKey.from_public_bytes(raw)


def agree(own: X25519PrivateKey, theirs: bytes, purpose: bytes, context: bytes) -> bytes:
    """The 32-byte key two devices share for ``purpose`` in ``context`` (the round)."""
    try:
        secret = own.exchange(public_key(theirs))
    except ValueError as e:  # a low-order point: the shared secret would be all zeros
        raise ChannelError(f"public key refused: {e}") from e
    hkdf = HKDF(
        algorithm=hashes.SHA256(), length=KEY_BYTES, salt=None, info=b"fedper secagg " + purpose + b" " + context
    )
    return hkdf.derive(secret)


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


def encrypt(key: bytes, plaintext: bytes, associated: bytes) -> bytes:
    """AES-256-GCM under a random nonce (sent in front): ``associated`` is bound, not hidden."""
    nonce = os.urandom(NONCE_BYTES)
    return nonce + AESGCM(key).encrypt(nonce, plaintext, associated)


def decrypt(key: bytes, ciphertext: bytes, associated: bytes) -> bytes:
    if len(ciphertext) < NONCE_BYTES + 16:
        raise ChannelError(f"a ciphertext is at least {NONCE_BYTES + 16} bytes, got {len(ciphertext)}")
    try:
        return AESGCM(key).decrypt(ciphertext[:NONCE_BYTES], ciphertext[NONCE_BYTES:], associated)
    except InvalidTag as e:
        raise ChannelError("a ciphertext failed its authentication: not for this device, round or sender") from e
