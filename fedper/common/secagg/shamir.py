"""Shamir's t-of-n secret sharing over the prime field of the Mersenne prime 2^521 - 1.

A secret is 32 bytes (an X25519 private key, a self-mask seed), an integer below 2^256, so one
field element holds it whole. Share i is the random degree t-1 polynomial with the secret as its
constant term, evaluated at x = i (1-based); any t shares give the secret back by Lagrange
interpolation at 0, and t-1 shares say nothing about it (every secret fits them equally well).
Written here, in 40 lines, so that the shares' layout and the order their coefficients are drawn
in are the ones docs/SECAGG.md defines to the byte; the field is big enough that the shares are
uniform over it whatever the secret.

With more than t shares, :func:`recover` also finds wrong ones (a holder that lied, or a share
that was corrupted): Berlekamp-Welch decoding of the Reed-Solomon code the shares form corrects up
to (m - t) // 2 wrong shares of m, and says which they were.
"""

from __future__ import annotations

import secrets
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from functools import lru_cache

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


def recover(shares: Sequence[Share], threshold: int) -> tuple[bytes, list[int]]:
    """The secret from ``shares`` of distinct holders, and the indices of the shares that do not
    fit it: with m > t shares, up to (m - t) // 2 wrong ones are corrected (Berlekamp-Welch);
    ShamirError if they cannot be (too few, or too many wrong to decide)."""
    indices = [s.index for s in shares]
    if len(set(indices)) != len(indices):
        raise ShamirError("two shares have the same index")
    if len(shares) < threshold:
        raise ShamirError(f"{len(shares)} shares cannot give back a secret shared {threshold} of n")
    points = [(s.index, s.value) for s in shares]
    xs, newton = _newton(points[:threshold])  # the usual case: every share fits the first t
    if all(_newton_at(xs, newton, x) == y for x, y in points[threshold:]):
        secret, wrong = _newton_at(xs, newton, 0), []
    else:
        polynomial = _decode(points, threshold)
        wrong = [x for x, y in points if _evaluate(polynomial, x) != y]
        secret = polynomial[0] if polynomial else 0
    if secret >= 2 ** (8 * SECRET_BYTES):
        raise ShamirError("the shares are not of one 32-byte secret")
    return secret.to_bytes(SECRET_BYTES, "big"), wrong


@lru_cache(maxsize=4096)
def _inverse(d: int) -> int:
    """1/d in the field; d is a difference of share indices (small), so a round needs few."""
    return pow(d % PRIME, -1, PRIME)


def _newton(points: Sequence[tuple[int, int]]) -> tuple[list[int], list[int]]:
    """The polynomial through ``points`` in Newton's form (its divided differences): O(t^2)
    multiplications and only inverses of index differences, which are cached."""
    xs = [x for x, _ in points]
    coefficients = [y for _, y in points]
    for level in range(1, len(points)):
        for i in range(len(points) - 1, level - 1, -1):
            step = (coefficients[i] - coefficients[i - 1]) * _inverse(xs[i] - xs[i - level])
            coefficients[i] = step % PRIME
    return xs, coefficients


def _newton_at(xs: Sequence[int], coefficients: Sequence[int], x: int) -> int:
    value = 0
    for i in range(len(coefficients) - 1, -1, -1):
        value = (value * (x - xs[i]) + coefficients[i]) % PRIME
    return value


def _decode(points: Sequence[tuple[int, int]], threshold: int) -> list[int]:
    """Berlekamp-Welch: P of degree < t that all but at most e = (m - t) // 2 points fit.
    Solve Q(x_i) = y_i E(x_i) for Q of degree < t + e and E monic of degree e; then P = Q / E."""
    m = len(points)
    errors = (m - threshold) // 2
    q_terms = threshold + errors
    rows = []
    for x, y in points:  # unknowns: Q's q_terms coefficients, then E's e lower ones
        powers = [pow(x, j, PRIME) for j in range(q_terms)]
        rows.append(powers + [-y * powers[j] % PRIME for j in range(errors)] + [y * pow(x, errors, PRIME) % PRIME])
    solution = _solve(rows, q_terms + errors)
    if solution is None:
        raise ShamirError(f"the {m} shares cannot be decoded: more than {errors} of them are wrong")
    q, e = solution[:q_terms], [*solution[q_terms:], 1]
    p, remainder = _divide(q, e)
    if any(remainder) or len(p) > threshold:
        raise ShamirError(f"the {m} shares cannot be decoded: more than {errors} of them are wrong")
    wrong = sum(_evaluate(p, x) != y for x, y in points)
    if wrong > errors:
        raise ShamirError(f"the {m} shares cannot be decoded: more than {errors} of them are wrong")
    return p + [0] * (threshold - len(p))


def _solve(rows: list[list[int]], unknowns: int) -> list[int] | None:
    """One solution of the linear system (rows: coefficients then the right-hand side) over the
    field, free unknowns set to 0; None if it has none."""
    rows = [list(r) for r in rows]
    pivots, r = [], 0
    for c in range(unknowns):
        found = next((i for i in range(r, len(rows)) if rows[i][c]), None)
        if found is None:
            continue
        rows[r], rows[found] = rows[found], rows[r]
        inverse = pow(rows[r][c], -1, PRIME)
        rows[r] = [v * inverse % PRIME for v in rows[r]]
        for i in range(len(rows)):
            if i != r and rows[i][c]:
                f = rows[i][c]
                rows[i] = [(a - f * b) % PRIME for a, b in zip(rows[i], rows[r], strict=True)]
        pivots.append(c)
        r += 1
    if any(row[unknowns] for row in rows[r:]):
        return None
    solution = [0] * unknowns
    for i, c in enumerate(pivots):
        solution[c] = rows[i][unknowns]
    return solution


def _divide(numerator: list[int], divisor: list[int]) -> tuple[list[int], list[int]]:
    """Quotient and remainder (coefficients, lowest first) by a monic ``divisor``."""
    rest = list(numerator)
    quotient = [0] * max(1, len(rest) - len(divisor) + 1)
    for i in range(len(rest) - len(divisor), -1, -1):
        factor = rest[i + len(divisor) - 1]
        quotient[i] = factor
        for j, d in enumerate(divisor):
            rest[i + j] = (rest[i + j] - factor * d) % PRIME
    while len(quotient) > 1 and quotient[-1] == 0:
        quotient.pop()
    return quotient, rest[: len(divisor) - 1]


def _evaluate(coefficients: list[int], x: int) -> int:
    value = 0
    for c in reversed(coefficients):  # Horner
        value = (value * x + c) % PRIME
    return value
