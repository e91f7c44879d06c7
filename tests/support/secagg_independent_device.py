"""The device side of fedper's secure aggregation, written by a third party from the documents
only: docs/SECAGG.md ("To the byte (revision 1.7)", "A round", "The update as integers"),
docs/PROTOCOL.md (enrollment, tasks, the check-in window, errors, "Secure aggregation (revision
1.6)", "Clipping the base delta"), docs/protocol.schema.json and docs/secagg_vectors.json.

Nothing of the ``fedper`` package is imported: the standard library, numpy, httpx and
``cryptography`` only. Every random value a device draws comes from a :class:`Randomness`, so a
test can inject the vectors' keys, seeds, coefficients and nonces.

The pieces, in the order of SECAGG.md's "To the byte":

- keys: :func:`public_key`, :func:`is_valid_public_key`;
- derived keys: :func:`channel_key`, :func:`pairwise_seed`;
- the mask generator: :func:`prg`;
- Shamir's sharing: :func:`shamir_split`, :func:`encode_share`, :func:`decode_share`,
  :func:`reconstruct` (Lagrange, or Berlekamp-Welch when some shares are wrong);
- the sealed share message: :func:`seal`, :func:`open_sealed`;
- the update as integers: :func:`clip_base` (PROTOCOL.md's clipping), :class:`FixedPointEncoding`;
- a device's round: :class:`SecureSession` (advertise, shares, masked input, unmasking answer);
- the wire: :class:`DeviceClient` (enroll, task with the capability, check-in, the four stages,
  ``204``/``Retry-After``, ``409 secagg_stage_not_open``) and :func:`run_secure_round`.
"""

from __future__ import annotations

import base64
import dataclasses
import json
import math
import secrets
import struct
import time
from collections.abc import Callable, Iterable, Mapping, Sequence
from typing import Any, Protocol

import httpx
import numpy as np
from cryptography.hazmat.primitives import hashes
from cryptography.hazmat.primitives.asymmetric.x25519 import X25519PrivateKey, X25519PublicKey
from cryptography.hazmat.primitives.ciphers import Cipher, algorithms, modes
from cryptography.hazmat.primitives.ciphers.aead import AESGCM
from cryptography.hazmat.primitives.kdf.hkdf import HKDF

# --- constants (SECAGG.md "To the byte", PROTOCOL.md "Secure aggregation") -------------------

CURVE_P = 2**255 - 19  # X25519's field: a canonical public key is below it
FIELD_P = 2**521 - 1  # Shamir's prime field
KEY_BYTES = 32
SECRET_BYTES = 32
NONCE_BYTES = 12
TAG_BYTES = 16
SHARE_BYTES = 68  # 2-byte index || 66-byte value, both big-endian
PLAINTEXT_BYTES = 2 * SHARE_BYTES  # the seed's share, then the mask key's
SEALED_BYTES = NONCE_BYTES + PLAINTEXT_BYTES + TAG_BYTES  # 164
CAPABILITY = "secagg-1.7"
CAPABILITIES_HEADER = "Fedper-Capabilities"
UNOPENED_HEADER = "Fedper-SecAgg-Unopened"
OCTET_STREAM = "application/octet-stream"

# --- errors ---------------------------------------------------------------------------------


class SitOutError(Exception):
    """The device refuses what the server sent and sits the round out (SECAGG.md, "What a device
    does with what it cannot accept")."""


class OutOfRoundError(Exception):
    """The server says the device is out of this round (``409 secagg_stage_closed``,
    ``round_not_open``, ``422 bad_secagg_message``, ...): it asks for a task again next round."""

    def __init__(self, status: int, code: str, message: str = "") -> None:
        super().__init__(f"{status} {code}: {message}")
        self.status, self.code = status, code


class ProtocolFailureError(Exception):
    """An answer the protocol does not allow at this point."""


# --- randomness -----------------------------------------------------------------------------


class Randomness(Protocol):
    """Every random value a device draws in a round."""

    def private_key(self) -> bytes: ...  # 32 bytes; called for the channel key, then the mask key

    def seed(self) -> bytes: ...  # the 32-byte self-mask seed b

    def coefficient(self) -> int: ...  # uniform in [0, FIELD_P)

    def nonce(self) -> bytes: ...  # 12 bytes, one per sealed message


class SystemRandomness:
    """The operating system's randomness (``secrets``)."""

    def private_key(self) -> bytes:
        return secrets.token_bytes(KEY_BYTES)

    def seed(self) -> bytes:
        return secrets.token_bytes(SECRET_BYTES)

    def coefficient(self) -> int:
        return secrets.randbelow(FIELD_P)

    def nonce(self) -> bytes:
        return secrets.token_bytes(NONCE_BYTES)


class ScriptedRandomness:
    """Fixed values, handed out in order (a vector's): private keys (channel, then mask), the
    seed, the coefficients (the seed's t - 1, then the mask key's t - 1), the nonces (one per
    neighbour, in id order)."""

    def __init__(
        self, private_keys: Sequence[bytes], seed: bytes, coefficients: Sequence[int], nonces: Sequence[bytes]
    ) -> None:
        self._keys, self._seeds = list(private_keys), [seed]
        self._coefficients, self._nonces = list(coefficients), list(nonces)

    def private_key(self) -> bytes:
        return self._keys.pop(0)

    def seed(self) -> bytes:
        return self._seeds.pop(0)

    def coefficient(self) -> int:
        return self._coefficients.pop(0)

    def nonce(self) -> bytes:
        return self._nonces.pop(0)

    def used_up(self) -> bool:
        return not (self._keys or self._seeds or self._coefficients or self._nonces)


# --- keys -----------------------------------------------------------------------------------

# Any private key will do to detect a low-order public key: X25519 clamps it to a multiple of 8,
# which takes every point of order dividing 8 to the identity (u = 0, 32 zero bytes).
_PROBE = X25519PrivateKey.from_private_bytes(bytes(range(1, 33)))


def public_key(private: bytes) -> bytes:
    """The 32-byte little-endian u-coordinate of X25519(private, 9)."""
    if len(private) != KEY_BYTES:
        raise ValueError("an X25519 private key is 32 bytes")
    return X25519PrivateKey.from_private_bytes(private).public_key().public_bytes_raw()


def is_valid_public_key(key: bytes) -> bool:
    """32 bytes, canonical (below 2^255 - 19 as a little-endian integer) and not of low order."""
    if len(key) != KEY_BYTES or int.from_bytes(key, "little") >= CURVE_P:
        return False
    try:
        shared = _PROBE.exchange(X25519PublicKey.from_public_bytes(key))
    except ValueError:  # cryptography refuses an all-zero shared secret
        return False
    return shared != bytes(KEY_BYTES)


def x25519(private: bytes, public: bytes) -> bytes:
    if not is_valid_public_key(public):
        raise ValueError("invalid X25519 public key")
    return X25519PrivateKey.from_private_bytes(private).exchange(X25519PublicKey.from_public_bytes(public))


# --- derived keys ---------------------------------------------------------------------------


def hkdf_info(purpose: str, session: str) -> bytes:
    """``"fedper secagg <purpose> " || context``, the context being the session's 32 ASCII bytes."""
    return f"fedper secagg {purpose} ".encode("ascii") + session.encode("ascii")


def derive(purpose: str, private: bytes, their_public: bytes, session: str) -> bytes:
    """HKDF-SHA256 (no salt: 32 zero bytes) of X25519(private, their_public), 32 bytes."""
    shared = x25519(private, their_public)
    return HKDF(algorithm=hashes.SHA256(), length=32, salt=bytes(32), info=hkdf_info(purpose, session)).derive(shared)


def channel_key(private: bytes, their_public: bytes, session: str) -> bytes:
    return derive("channel", private, their_public, session)


def pairwise_seed(private: bytes, their_public: bytes, session: str) -> bytes:
    return derive("mask", private, their_public, session)


# --- the mask generator ---------------------------------------------------------------------


def prg(seed: bytes, n: int) -> np.ndarray:
    """n little-endian uint32 words of AES-256-CTR keyed by ``seed`` from the zero counter block."""
    if len(seed) != 32:
        raise ValueError("a mask seed is 32 bytes")
    encryptor = Cipher(algorithms.AES(seed), modes.CTR(bytes(16))).encryptor()
    stream = encryptor.update(bytes(4 * n)) + encryptor.finalize()
    return np.frombuffer(stream, dtype="<u4").astype(np.uint32)


# --- Shamir's sharing -----------------------------------------------------------------------


def _poly_at(coefficients: Sequence[int], x: int) -> int:
    """f(x) mod p for f = coefficients[0] + coefficients[1] x + ... (Horner)."""
    value = 0
    for c in reversed(coefficients):
        value = (value * x + c) % FIELD_P
    return value


def shamir_split(secret: bytes, threshold: int, holders: int, coefficients: Sequence[int]) -> list[tuple[int, int]]:
    """(i, f(i)) for i = 1..holders, f(x) = s + a_1 x + ... + a_(t-1) x^(t-1), s the secret read
    big-endian, ``coefficients`` = a_1, ..., a_(t-1)."""
    if len(secret) != SECRET_BYTES:
        raise ValueError("a secret is 32 bytes")
    if len(coefficients) != threshold - 1:
        raise ValueError("t - 1 coefficients")
    polynomial = [int.from_bytes(secret, "big"), *coefficients]
    return [(i, _poly_at(polynomial, i)) for i in range(1, holders + 1)]


def encode_share(index: int, value: int) -> bytes:
    return index.to_bytes(2, "big") + value.to_bytes(66, "big")


def decode_share(data: bytes) -> tuple[int, int]:
    """(index, value) of a 68-byte share; a share with index 0 or a value not below p is refused."""
    if len(data) != SHARE_BYTES:
        raise ValueError("a share is 68 bytes")
    index, value = int.from_bytes(data[:2], "big"), int.from_bytes(data[2:], "big")
    if index == 0 or value >= FIELD_P:
        raise ValueError("share index 0 or value not below p")
    return index, value


def _inverse(a: int) -> int:
    return pow(a, FIELD_P - 2, FIELD_P)


def _lagrange_at_zero(points: Sequence[tuple[int, int]]) -> int:
    total = 0
    for i, (xi, yi) in enumerate(points):
        num, den = 1, 1
        for j, (xj, _) in enumerate(points):
            if i != j:
                num = num * (-xj) % FIELD_P
                den = den * (xi - xj) % FIELD_P
        total = (total + yi * num * _inverse(den)) % FIELD_P
    return total


def _solve(matrix: list[list[int]], rhs: list[int], unknowns: int) -> list[int] | None:
    """One solution of matrix . x = rhs mod p (free unknowns 0), or None when inconsistent."""
    rows = [[*row, b] for row, b in zip(matrix, rhs, strict=True)]
    pivots: list[int] = []
    r = 0
    for c in range(unknowns):
        pivot = next((i for i in range(r, len(rows)) if rows[i][c] % FIELD_P), None)
        if pivot is None:
            continue
        rows[r], rows[pivot] = rows[pivot], rows[r]
        inv = _inverse(rows[r][c])
        rows[r] = [v * inv % FIELD_P for v in rows[r]]
        for i in range(len(rows)):
            if i != r and rows[i][c]:
                factor = rows[i][c]
                rows[i] = [(a - factor * b) % FIELD_P for a, b in zip(rows[i], rows[r], strict=True)]
        pivots.append(c)
        r += 1
    if any(row[unknowns] and not any(row[:unknowns]) for row in rows[r:]):
        return None
    x = [0] * unknowns
    for i, c in enumerate(pivots):
        x[c] = rows[i][unknowns]
    return x


def _divide(numerator: list[int], denominator: list[int]) -> tuple[list[int], list[int]]:
    """Polynomial long division (coefficients lowest degree first), mod p."""
    num = [c % FIELD_P for c in numerator]
    while len(denominator) > 1 and denominator[-1] == 0:
        denominator = denominator[:-1]
    quotient = [0] * max(1, len(num) - len(denominator) + 1)
    inv = _inverse(denominator[-1])
    for shift in range(len(num) - len(denominator), -1, -1):
        q = num[shift + len(denominator) - 1] * inv % FIELD_P
        quotient[shift] = q
        for k, d in enumerate(denominator):
            num[shift + k] = (num[shift + k] - q * d) % FIELD_P
    return quotient, num[: len(denominator) - 1]


def decode_polynomial(shares: Sequence[tuple[int, int]], threshold: int) -> tuple[list[int], list[int]]:
    """The polynomial of degree < t that all but at most floor((m - t)/2) of the m shares fit
    (Berlekamp-Welch), and the indices of those that do not; ValueError when there is none."""
    m = len(shares)
    if m < threshold or len({x for x, _ in shares}) != m:
        raise ValueError("fewer than t shares of distinct indices")
    for errors in range((m - threshold) // 2 + 1):
        # Q(x_i) = y_i E(x_i), E monic of degree e, Q of degree < t + e.
        q_terms, e_terms = threshold + errors, errors
        matrix, rhs = [], []
        for x, y in shares:
            row = [pow(x, k, FIELD_P) for k in range(q_terms)]
            row += [(-y * pow(x, k, FIELD_P)) % FIELD_P for k in range(e_terms)]
            matrix.append(row)
            rhs.append(y * pow(x, errors, FIELD_P) % FIELD_P)
        solution = _solve(matrix, rhs, q_terms + e_terms)
        if solution is None:
            continue
        q, e = solution[:q_terms], [*solution[q_terms:], 1]
        f, remainder = _divide(q, e)
        if any(remainder) or any(f[threshold:]):
            continue
        f = (f + [0] * threshold)[:threshold]
        wrong = [x for x, y in shares if _poly_at(f, x) != y % FIELD_P]
        if len(wrong) <= errors:
            return f, wrong
    raise ValueError("no polynomial of degree < t fits enough of the shares")


def reconstruct(shares: Sequence[tuple[int, int]], threshold: int) -> bytes:
    """The 32-byte secret f(0) from m >= t shares: Lagrange when they all fit one polynomial,
    else Berlekamp-Welch; the secret must be below 2^256."""
    points = list(shares)
    if len(points) < threshold or len({x for x, _ in points}) != len(points):
        raise ValueError("fewer than t shares of distinct indices")
    secret = _lagrange_at_zero(points[:threshold])
    if not all(_lagrange_at(points[:threshold], x) == y for x, y in points[threshold:]):
        secret = decode_polynomial(points, threshold)[0][0]
    if secret >= 2**256:
        raise ValueError("the secret put together is not below 2^256")
    return secret.to_bytes(SECRET_BYTES, "big")


def _lagrange_at(points: Sequence[tuple[int, int]], x: int) -> int:
    total = 0
    for i, (xi, yi) in enumerate(points):
        num, den = 1, 1
        for j, (xj, _) in enumerate(points):
            if i != j:
                num = num * (x - xj) % FIELD_P
                den = den * (xi - xj) % FIELD_P
        total = (total + yi * num * _inverse(den)) % FIELD_P
    return total


# --- the sealed share message ---------------------------------------------------------------


def associated_data(session: str, sender: str, receiver: str) -> bytes:
    """``"fedper secagg share" || 0 || context || 0 || sender || 0 || receiver``."""
    parts = [b"fedper secagg share", session.encode("ascii"), sender.encode("ascii"), receiver.encode("ascii")]
    return b"\x00".join(parts)


def seal(key: bytes, nonce: bytes, plaintext: bytes, session: str, sender: str, receiver: str) -> bytes:
    """nonce || AES-256-GCM(plaintext) || tag: 164 bytes for a 136-byte plaintext."""
    if len(nonce) != NONCE_BYTES:
        raise ValueError("a nonce is 12 bytes")
    return nonce + AESGCM(key).encrypt(nonce, plaintext, associated_data(session, sender, receiver))


def open_sealed(key: bytes, sealed: bytes, session: str, sender: str, receiver: str) -> bytes:
    """The plaintext; raises (``cryptography.exceptions.InvalidTag`` or ValueError) when the
    message does not open."""
    if len(sealed) < NONCE_BYTES + TAG_BYTES:
        raise ValueError("too short to be a sealed message")
    nonce, body = sealed[:NONCE_BYTES], sealed[NONCE_BYTES:]
    return AESGCM(key).decrypt(nonce, body, associated_data(session, sender, receiver))


def parse_share_message(plaintext: bytes) -> tuple[tuple[int, int], tuple[int, int]]:
    """The seed's share and the mask key's share of a 136-byte plaintext, with the same index."""
    if len(plaintext) != PLAINTEXT_BYTES:
        raise ValueError("a share message's plaintext is 136 bytes")
    seed_share, key_share = decode_share(plaintext[:SHARE_BYTES]), decode_share(plaintext[SHARE_BYTES:])
    if seed_share[0] != key_share[0]:
        raise ValueError("the two shares have different indices")
    return seed_share, key_share


# --- the update as integers -----------------------------------------------------------------


def sequential_norm(x: np.ndarray, b: np.ndarray) -> float:
    """PROTOCOL.md "Clipping the base delta", step 1: float64 differences, squared, summed left
    to right (np.cumsum is a strictly sequential running sum), then a correctly rounded sqrt."""
    d = x.astype(np.float64) - b.astype(np.float64)
    if d.size == 0:
        return 0.0
    return math.sqrt(float(np.cumsum(d * d)[-1]))


def clip_base(trained: np.ndarray, base: np.ndarray, clip: float) -> tuple[np.ndarray, bool] | None:
    """The trained base clipped to ``clip`` (float32, flat, in the manifest's order) and whether it
    was within the clip already (``dp_unclipped``); None when its norm is not finite."""
    t, b = trained.astype(np.float32), base.astype(np.float32)
    n = sequential_norm(t, b)
    if not math.isfinite(n):
        return None
    if n <= clip:
        return t, True
    t64, b64 = t.astype(np.float64), b.astype(np.float64)
    for k in range(25):
        margin = 0.0 if k == 0 else 2.0 ** (k - 24)
        scale = (clip / n) * (1.0 - margin)
        u = (b64 + scale * (t64 - b64)).astype(np.float32)
        if sequential_norm(u, b) <= clip:
            return u, False
    raise AssertionError("k = 24 gives u = b, within any clip")


@dataclasses.dataclass(frozen=True)
class FixedPointEncoding:
    """``FixedPoint(clip C, cohort n, weight_cap, flags)`` of SECAGG.md, "The update as integers"."""

    clip: float
    cohort: int
    weight_cap: int

    @property
    def bound(self) -> int:
        """M = floor((2^31 - 1) / n)."""
        return (2**31 - 1) // self.cohort

    @property
    def scale(self) -> float:
        return (self.bound - 1) / self.clip

    def weight(self, num_samples: int) -> int:
        return min(int(num_samples), self.weight_cap)

    def encode(self, delta: np.ndarray, num_samples: int, flags: Sequence[int] = ()) -> np.ndarray:
        """The delta words (two's complement), the flag words, then w, as uint32."""
        w = self.weight(num_samples)
        factor = (self.scale * w) / self.weight_cap
        scaled = np.rint(np.asarray(delta, dtype=np.float64) * factor)  # ties to even
        clamped = np.clip(scaled, -self.bound, self.bound).astype(np.int64)
        words = (clamped & 0xFFFFFFFF).astype(np.uint32)
        tail = np.array([*(int(f) for f in flags), w], dtype=np.uint32)
        return np.concatenate([words, tail])

    def decode_mean(self, total: np.ndarray, flag_words: int = 0) -> tuple[np.ndarray, int]:
        """From the sum of the cohort's words: Σ (w_i / cap) δ_i · cap / W, and W."""
        m = total.size - flag_words - 1
        signed = total[:m].astype(np.uint32).view(np.int32).astype(np.float64)
        weight = int(total[-1])
        return signed / self.scale * self.weight_cap / weight, weight

    def rounding_bound(self, devices: int, total_weight: int) -> float:
        """The encoding's error on the mean, per coordinate: n / (2 scale) · cap / W."""
        return devices / (2 * self.scale) * self.weight_cap / total_weight


# --- a device's round -----------------------------------------------------------------------


def _id_key(device_id: str) -> bytes:
    """Ids are ordered by their bytes."""
    return device_id.encode("ascii")


def _sorted_ids(ids: Iterable[str]) -> list[str]:
    return sorted(ids, key=_id_key)


@dataclasses.dataclass
class Neighbour:
    channel_public: bytes
    mask_public: bytes
    index: int  # the neighbour's 1-based position among this device's neighbours in id order


class SecureSession:
    """One device's secure round, stage by stage, with no network: what it sends and what it
    answers, from what the server relays."""

    def __init__(self, device_id: str, session: str, randomness: Randomness | None = None) -> None:
        if len(session) != 32 or any(c not in "0123456789abcdef" for c in session):
            raise ValueError("a session is 32 lowercase hex digits")
        self.device_id, self.session = device_id, session
        self.randomness = randomness or SystemRandomness()
        self.channel_private = self.randomness.private_key()
        self.mask_private = self.randomness.private_key()
        self.channel_public = public_key(self.channel_private)
        self.mask_public = public_key(self.mask_private)
        self.threshold = 0
        self.neighbours: dict[str, Neighbour] = {}
        self.seed = b""
        # what this device holds of each neighbour: (seed share, mask key share)
        self.held: dict[str, tuple[tuple[int, int], tuple[int, int]]] = {}
        self.unopened: list[str] = []
        self._answered: tuple[tuple[str, ...], tuple[str, ...]] | None = None

    # stage 1 ---------------------------------------------------------------------------------
    def advertisement(self) -> dict[str, str]:
        return {"channel_key": b64(self.channel_public), "mask_key": b64(self.mask_public)}

    def receive_keys(self, threshold: int, neighbours: Mapping[str, tuple[bytes, bytes]]) -> None:
        """The key list of ``GET .../secagg/keys``: (channel public, mask public) by id."""
        if self.device_id in neighbours:
            raise SitOutError("the key list names this device")
        seen = [self.channel_public, self.mask_public]
        for channel, mask in neighbours.values():
            if not (is_valid_public_key(channel) and is_valid_public_key(mask)):
                raise SitOutError("an invalid public key in the key list")
            seen += [channel, mask]
        if len(set(seen)) != len(seen):
            raise SitOutError("two equal keys in the key list (this device's included)")
        if threshold < 1 or len(neighbours) < threshold:
            raise SitOutError(f"{len(neighbours)} neighbours, fewer than the threshold {threshold}")
        self.threshold = threshold
        self.neighbours = {
            d: Neighbour(neighbours[d][0], neighbours[d][1], i) for i, d in enumerate(_sorted_ids(neighbours), start=1)
        }

    # stage 2 ---------------------------------------------------------------------------------
    def share_messages(self) -> dict[str, bytes]:
        """Draw b, split b then the mask private key among the neighbours (index = the holder's
        1-based position in id order), seal each holder's two shares."""
        t, k = self.threshold, len(self.neighbours)
        self.seed = self.randomness.seed()
        seed_coefficients = [self.randomness.coefficient() for _ in range(t - 1)]
        key_coefficients = [self.randomness.coefficient() for _ in range(t - 1)]
        seed_shares = shamir_split(self.seed, t, k, seed_coefficients)
        key_shares = shamir_split(self.mask_private, t, k, key_coefficients)
        out = {}
        for d, neighbour in self.neighbours.items():  # in id order
            i = neighbour.index
            plaintext = encode_share(*seed_shares[i - 1]) + encode_share(*key_shares[i - 1])
            key = channel_key(self.channel_private, neighbour.channel_public, self.session)
            out[d] = seal(key, self.randomness.nonce(), plaintext, self.session, self.device_id, d)
        return out

    def receive_shares(self, sealed_by_sender: Mapping[str, bytes]) -> list[str]:
        """Open what the neighbours sealed for this device; returns the senders whose messages
        did not open (for ``Fedper-SecAgg-Unopened``), in id order."""
        for sender in sealed_by_sender:
            if sender not in self.neighbours:
                raise SitOutError(f"a sealed message from {sender!r}, not a neighbour")
        self.held, self.unopened = {}, []
        for sender in _sorted_ids(sealed_by_sender):
            key = channel_key(self.channel_private, self.neighbours[sender].channel_public, self.session)
            try:
                plaintext = open_sealed(key, sealed_by_sender[sender], self.session, sender, self.device_id)
                self.held[sender] = parse_share_message(plaintext)
            except Exception:  # does not open, or does not parse: unopened
                self.unopened.append(sender)
        if len(self.held) < self.threshold:
            raise SitOutError(f"shares of {len(self.held)} neighbours, fewer than the threshold {self.threshold}")
        return list(self.unopened)

    # stage 3 ---------------------------------------------------------------------------------
    def masked(self, words: np.ndarray) -> bytes:
        """words + PRG(b) ± PRG(s_j) for each neighbour j whose shares this device holds (added
        when this device's id is below j's), mod 2^32, as little-endian bytes."""
        n = words.size
        total = words.astype(np.uint32).copy()
        total += prg(self.seed, n)
        me = _id_key(self.device_id)
        for j in _sorted_ids(self.held):
            mask = prg(pairwise_seed(self.mask_private, self.neighbours[j].mask_public, self.session), n)
            if me < _id_key(j):
                total += mask
            else:
                total -= mask
        return total.astype("<u4").tobytes()

    # stage 4 ---------------------------------------------------------------------------------
    def unmask(self, dropped: Sequence[str], survivors: Sequence[str]) -> dict[str, bytes]:
        """The mask key's share of each dropped device and the seed's of each survivor."""
        request = (tuple(dropped), tuple(survivors))
        if self._answered is not None:
            if request != self._answered:
                raise SitOutError("a second, different unmasking request")
        elif set(dropped) & set(survivors):
            raise SitOutError("a device named both dropped and surviving")
        missing = [d for d in (*dropped, *survivors) if d not in self.held]
        if missing:
            raise SitOutError(f"asked for shares it does not hold: {missing}")
        if len(set(dropped)) != len(dropped) or len(set(survivors)) != len(survivors):
            raise SitOutError("a device named twice")
        self._answered = request
        answer = {d: encode_share(*self.held[d][1]) for d in dropped}
        answer.update({d: encode_share(*self.held[d][0]) for d in survivors})
        return answer


# --- the wire -------------------------------------------------------------------------------


def b64(data: bytes) -> str:
    return base64.b64encode(data).decode("ascii")


def unb64(text: str) -> bytes:
    return base64.b64decode(text.encode("ascii"), validate=True)


def read_safetensors(body: bytes) -> dict[str, np.ndarray]:
    """A safetensors file: 8-byte little-endian header length, JSON header, raw tensor bytes."""
    (length,) = struct.unpack("<Q", body[:8])
    header = json.loads(body[8 : 8 + length])
    data = body[8 + length :]
    dtypes = {"F32": "<f4", "F16": "<f2"}
    out = {}
    for name, entry in header.items():
        if name == "__metadata__":
            continue
        start, end = entry["data_offsets"]
        array = np.frombuffer(data[start:end], dtype=dtypes[entry["dtype"]])
        out[name] = array.astype(np.float32).reshape(entry["shape"])
    return out


def retry_after(response: httpx.Response, default: float = 1.0) -> float:
    value = response.headers.get("Retry-After")
    try:
        return max(0.0, float(value)) if value is not None else default
    except ValueError:
        return default


@dataclasses.dataclass
class Task:
    round: int
    model_version: int
    base_url: str
    manifest_url: str
    secagg: dict[str, Any]
    dp: dict[str, Any] | None
    raw: dict[str, Any]


class DeviceClient:
    """The HTTP calls a device makes (PROTOCOL.md), over an httpx client with the server's base URL.

    ``max_wait`` caps a single wait on ``Retry-After`` (None: wait as long as the server says);
    ``sleep`` is injectable for tests."""

    def __init__(
        self,
        http: httpx.Client,
        max_wait: float | None = None,
        sleep: Callable[[float], None] = time.sleep,
        log: Callable[[str], None] | None = None,
    ) -> None:
        self.http, self.max_wait, self.sleep = http, max_wait, sleep
        self.device_id = ""
        self.token = ""
        self.log = log or (lambda _message: None)

    # helpers
    @property
    def auth(self) -> dict[str, str]:
        return {"Authorization": f"Bearer {self.token}"}

    def _wait(self, response: httpx.Response) -> None:
        seconds = retry_after(response)
        if self.max_wait is not None:
            seconds = min(seconds, self.max_wait)
        self.sleep(seconds)

    @staticmethod
    def _error(response: httpx.Response) -> OutOfRoundError:
        try:
            body = response.json()
            code, message = str(body.get("code", "")), str(body.get("message", ""))
        except ValueError:
            code, message = "", response.text
        return OutOfRoundError(response.status_code, code, message)

    def _stage_path(self, round_number: int, stage: str) -> str:
        return f"/v1/rounds/{round_number}/secagg/{stage}"

    # enrollment and tasks
    def enroll(self, enrollment_key: str, platform: str = "independent") -> str:
        r = self.http.post("/v1/devices", json={"enrollment_key": enrollment_key, "platform": platform})
        if r.status_code != 201:
            raise self._error(r)
        body = r.json()
        self.device_id, self.token = body["device_id"], body["token"]
        return self.device_id

    def ask_for_task(self) -> Task | None:
        """One ``GET /v1/task`` with the capability: the task, or None after a ``204`` (or ``409
        not_in_cohort``: the same), having waited its ``Retry-After``."""
        r = self.http.get("/v1/task", headers={**self.auth, CAPABILITIES_HEADER: CAPABILITY})
        if r.status_code == 200:
            body = r.json()
            return Task(body["round"], body["model_version"], body["base_url"], body["manifest_url"],
                        body.get("secagg") or {}, body.get("dp"), body)  # fmt: skip
        if r.status_code == 204 or (r.status_code == 409 and self._code(r) == "not_in_cohort"):
            self._wait(r)
            return None
        raise self._error(r)

    def task(self, give_up_after: float) -> Task:
        """Ask until a task arrives: check in during the window (``204``s), then the draw."""
        end = time.monotonic() + give_up_after
        while time.monotonic() < end:
            task = self.ask_for_task()
            if task is not None:
                return task
        raise ProtocolFailureError("no task in time")

    @staticmethod
    def _code(response: httpx.Response) -> str:
        try:
            return str(response.json().get("code", ""))
        except ValueError:
            return ""

    def download(self, url: str) -> bytes:
        r = self.http.get(url, headers=self.auth)
        if r.status_code != 200:
            raise self._error(r)
        return r.content

    def manifest(self, task: Task) -> dict[str, Any]:
        result: dict[str, Any] = json.loads(self.download(task.manifest_url))
        return result

    def base(self, task: Task, manifest: Mapping[str, Any]) -> np.ndarray:
        """The base's float32 tensors, flattened in the manifest's ``base`` order."""
        tensors = read_safetensors(self.download(task.base_url))
        return flatten(tensors, manifest)

    def round_info(self, round_number: int) -> dict[str, Any]:
        r = self.http.get(f"/v1/rounds/{round_number}", headers=self.auth)
        if r.status_code != 200:
            raise self._error(r)
        result: dict[str, Any] = r.json()
        return result

    # the stages
    def post_stage(
        self,
        round_number: int,
        stage: str,
        *,
        json_body: Any = None,
        content: bytes | None = None,
        headers: Mapping[str, str] | None = None,
        give_up_after: float = 120.0,
    ) -> dict[str, Any]:
        """POST a stage's part: ``202``; ``409 secagg_stage_not_open``: wait ``Retry-After`` and
        send again; ``409 duplicate_update``: already there (done); anything else: out."""
        end = time.monotonic() + give_up_after
        while True:
            all_headers = {**self.auth, **(headers or {})}
            if content is not None:
                all_headers["Content-Type"] = OCTET_STREAM
                r = self.http.post(self._stage_path(round_number, stage), content=content, headers=all_headers)
            else:
                r = self.http.post(self._stage_path(round_number, stage), json=json_body, headers=all_headers)
            if r.status_code == 202:
                result: dict[str, Any] = r.json()
                return result
            code = self._code(r)
            if r.status_code == 409 and code == "duplicate_update":
                return {"round": round_number, "stage": stage, "duplicate": True}
            if r.status_code == 409 and code == "secagg_stage_not_open" and time.monotonic() < end:
                self.log(f"{self.device_id} {stage}: stage not open, retry after {retry_after(r)}")
                self._wait(r)
                continue
            raise self._error(r)

    def get_stage(self, round_number: int, stage: str, give_up_after: float = 120.0) -> Any:
        """GET what the server relays once the stage before is over: ``204`` + ``Retry-After``
        until then."""
        end = time.monotonic() + give_up_after
        while time.monotonic() < end:
            r = self.http.get(self._stage_path(round_number, stage), headers=self.auth)
            if r.status_code == 200:
                return r.json()
            if r.status_code == 204:
                self.log(f"{self.device_id} GET {stage}: 204, Retry-After {r.headers.get('Retry-After')}")
                self._wait(r)
                continue
            raise self._error(r)
        raise ProtocolFailureError(f"GET {stage}: nothing in time")


def flatten(tensors: Mapping[str, np.ndarray], manifest: Mapping[str, Any]) -> np.ndarray:
    """The base tensors in the manifest's ``tensors.base`` order, each row-major, float32."""
    parts = []
    for entry in manifest["tensors"]["base"]:
        array = np.asarray(tensors[entry["name"]], dtype=np.float32)
        if list(array.shape) != list(entry["shape"]):
            raise ProtocolFailureError(f"{entry['name']}: shape {array.shape}, manifest {entry['shape']}")
        parts.append(array.ravel())
    return np.concatenate(parts) if parts else np.zeros(0, np.float32)


@dataclasses.dataclass
class RoundOutcome:
    """What one device did in a secure round (for the test's checks)."""

    device_id: str
    round: int = 0
    task: Task | None = None
    base: np.ndarray | None = None
    clipped_delta: np.ndarray | None = None  # float64: the clipped trained base minus the base
    num_samples: int = 0
    weight: int = 0
    unopened: list[str] = dataclasses.field(default_factory=list)
    stages_done: list[str] = dataclasses.field(default_factory=list)
    unmask_request: dict[str, list[str]] | None = None
    out: str | None = None  # why it left the round, if it did
    posted_at: dict[str, float] = dataclasses.field(default_factory=dict)  # stage -> wall clock of its 202
    fetched_at: dict[str, float] = dataclasses.field(default_factory=dict)  # stage -> wall clock of its 200


def run_secure_round(
    client: DeviceClient,
    train: Callable[[np.ndarray], tuple[np.ndarray, int]],
    *,
    randomness: Randomness | None = None,
    drop_after: str | None = None,
    give_up_after: float = 120.0,
) -> RoundOutcome:
    """One device's secure round over HTTP: task (with the capability, checking in), manifest and
    base, keys, shares, the "training" (``train(base) -> (trained base, num_samples)``, flat
    float32 in the manifest's order), the masked input and the unmasking answer.
    ``drop_after``: a stage after which the device sends nothing more (it vanishes)."""
    outcome = RoundOutcome(client.device_id)
    task = client.task(give_up_after)
    outcome.task, outcome.round = task, task.round
    if not task.secagg:
        raise ProtocolFailureError("the task has no secagg: not a secure round")
    s = task.secagg
    manifest = client.manifest(task)
    base = client.base(task, manifest)
    outcome.base = base
    session = SecureSession(client.device_id, s["session"], randomness)
    n = task.round
    try:
        # 1. advertise keys; then the neighbours' keys
        client.post_stage(n, "keys", json_body=session.advertisement(), give_up_after=give_up_after)
        outcome.stages_done.append("keys")
        outcome.posted_at["keys"] = time.time()
        if drop_after == "keys":
            return outcome
        relayed = client.get_stage(n, "keys", give_up_after)
        outcome.fetched_at["keys"] = time.time()
        neighbours = {d: (unb64(k["channel_key"]), unb64(k["mask_key"])) for d, k in relayed["neighbours"].items()}
        session.receive_keys(int(relayed["threshold"]), neighbours)
        # 2. share keys; then what the neighbours sealed for this device
        sealed = session.share_messages()
        client.post_stage(n, "shares", json_body={"shares": {d: b64(m) for d, m in sealed.items()}},
                          give_up_after=give_up_after)  # fmt: skip
        outcome.stages_done.append("shares")
        outcome.posted_at["shares"] = time.time()
        if drop_after == "shares":
            return outcome
        fetched = client.get_stage(n, "shares", give_up_after)["shares"]
        outcome.fetched_at["shares"] = time.time()
        outcome.unopened = session.receive_shares({d: unb64(m) for d, m in fetched.items()})
        # 3. "train", clip, encode, mask
        trained, num_samples = train(base)
        clipped = clip_base(trained, base, float(s["clip_norm"]))
        if clipped is None:
            raise SitOutError("the trained base's distance is not finite")
        clipped_base, unclipped = clipped
        delta = clipped_base.astype(np.float64) - base.astype(np.float64)
        encoding = FixedPointEncoding(float(s["clip_norm"]), int(s["cohort"]), int(s["weight_cap"]))
        flags = [int(unclipped)] if task.dp else []
        words = encoding.encode(delta, num_samples, flags)
        outcome.clipped_delta, outcome.num_samples = delta, num_samples
        outcome.weight = encoding.weight(num_samples)
        headers = {UNOPENED_HEADER: ",".join(outcome.unopened)} if outcome.unopened else {}
        client.post_stage(n, "masked", content=session.masked(words), headers=headers, give_up_after=give_up_after)
        outcome.stages_done.append("masked")
        outcome.posted_at["masked"] = time.time()
        if drop_after == "masked":
            return outcome
        # 4. unmasking
        request = client.get_stage(n, "unmask", give_up_after)
        outcome.fetched_at["unmask"] = time.time()
        outcome.unmask_request = request
        answer = session.unmask(request["dropped"], request["survivors"])
        client.post_stage(n, "unmask", json_body={"shares": {d: b64(v) for d, v in answer.items()}},
                          give_up_after=give_up_after)  # fmt: skip
        outcome.stages_done.append("unmask")
        outcome.posted_at["unmask"] = time.time()
    except SitOutError as e:
        outcome.out = f"sat out: {e}"
    except OutOfRoundError as e:
        outcome.out = f"out of the round: {e}"
    return outcome
