"""Shamir's t-of-n secret sharing over the prime field of the Mersenne prime 2^521 - 1.

A secret is 32 bytes (an X25519 private key, a self-mask seed), an integer below 2^256, so one
field element holds it whole. Share i is the random degree t-1 polynomial with the secret as its
constant term, evaluated at x = i (1-based); any t shares give the secret back by Lagrange
interpolation at 0, and t-1 shares say nothing about it (every secret fits them equally well).
Written here because the issue asks for it, and it is 40 lines; the field is big enough that the
shares are uniform over it whatever the secret.
"""

from __future__ import annotations

import secrets
from collections.abc import Callable, Sequence
from dataclasses import dataclass

from fedper.common.errors import FedperError

PRIME = 2**521 - 1
SECRET_BYTES = 32
VALUE_BYTES = (PRIME.bit_length() + 7) // 8  # 66
SHARE_BYTES = 2 + VALUE_BYTES


class ShamirError(FedperError, ValueError):
    """Shares that cannot give a secret back: too few, repeated, or not of one secret."""


@dataclass(frozen=True)
class Share:
    """The polynomial's value at ``index`` (1-based: the holder's position)."""

    index: int
    value: int

    def to_bytes(self) -> bytes:
        return self.index.to_bytes(2, "big") + self.value.to_bytes(VALUE_BYTES, "big")

    @classmethod
    def from_bytes(cls, data: bytes) -> Share:
        if len(data) != SHARE_BYTES:
            raise ShamirError(f"a share is {SHARE_BYTES} bytes, got {len(data)}")
        index, value = int.from_bytes(data[:2], "big"), int.from_bytes(data[2:], "big")
        if index == 0 or value >= PRIME:
            raise ShamirError(f"share index {index} or value is out of the field")
        return cls(index, value)


def split(
    secret: bytes, threshold: int, holders: int, randbelow: Callable[[int], int] = secrets.randbelow
) -> list[Share]:
    """``holders`` shares of ``secret``, any ``threshold`` of which give it back."""
    if len(secret) != SECRET_BYTES:
        raise ShamirError(f"a secret is {SECRET_BYTES} bytes, got {len(secret)}")
    if not 1 <= threshold <= holders < 2**16:
        raise ShamirError(f"need 1 <= threshold ({threshold}) <= holders ({holders}) < 65536")
    coefficients = [int.from_bytes(secret, "big")] + [randbelow(PRIME) for _ in range(threshold - 1)]
    return [Share(x, _evaluate(coefficients, x)) for x in range(1, holders + 1)]


def combine(shares: Sequence[Share], threshold: int) -> bytes:
    """The secret from at least ``threshold`` shares of distinct holders (the first ``threshold`` used)."""
    indices = {s.index for s in shares}
    if len(indices) != len(shares):
        raise ShamirError("two shares have the same index")
    if len(shares) < threshold:
        raise ShamirError(f"{len(shares)} shares cannot give back a secret shared {threshold} of n")
    used = shares[:threshold]
    secret = 0
    for s in used:
        numerator, denominator = 1, 1
        for other in used:
            if other.index != s.index:
                numerator = numerator * other.index % PRIME
                denominator = denominator * (other.index - s.index) % PRIME
        secret = (secret + s.value * numerator * pow(denominator, -1, PRIME)) % PRIME
    if secret >= 2 ** (8 * SECRET_BYTES):
        raise ShamirError("the shares are not of one 32-byte secret")
    return secret.to_bytes(SECRET_BYTES, "big")


def _evaluate(coefficients: list[int], x: int) -> int:
    value = 0
    for c in reversed(coefficients):  # Horner
        value = (value * x + c) % PRIME
    return value
