"""Writes docs/secagg_vectors.json: known-answer vectors of the secure aggregation protocol
(docs/SECAGG.md, "To the byte"), for every implementation to check itself against: the server,
the Python device, the Android core (SecAggVectorsTest) and any third party.

Every random value (private keys, seeds, Shamir coefficients, nonces) is fixed: derived from
SHA-256 of a label, and written into the file, so a reader needs none of this script. Run from the
repository's root: ``.venv/bin/python docs/scripts/secagg_vectors.py`` (``--check``: exit 1 if the
file differs from what the code gives now; tests/unit/common/test_secagg_vectors.py does the same).
"""

from __future__ import annotations

import argparse
import hashlib
import json
import sys
from collections.abc import Callable, Iterator
from pathlib import Path

import numpy as np

from fedper.common.secagg import keys, prg, shamir
from fedper.common.secagg.device_session import (
    Advertisement,
    DeviceSession,
    HeldShares,
    associated_data,
    pack,
)
from fedper.common.secagg.fixed_point import FixedPoint
from fedper.common.secagg.server_session import ServerSession

OUT = Path(__file__).resolve().parents[1] / "secagg_vectors.json"
SESSION = "5ec0a99e0000000000000000000017f7"  # the round's session, as a task gives it


def fixed(label: str, size: int = 32) -> bytes:
    """``size`` bytes that look random and are the same everywhere: SHA-256 of the label, chained."""
    out, counter = b"", 0
    while len(out) < size:
        out += hashlib.sha256(f"{label} {counter}".encode()).digest()
        counter += 1
    return out[:size]


def hexed(data: bytes) -> str:
    return data.hex()


def words_hex(words: np.ndarray) -> str:
    return np.asarray(words, dtype=np.uint32).astype("<u4").tobytes().hex()


class Randomness:
    """The values a device would draw at random, in the order it draws them, recorded."""

    def __init__(self, label: str) -> None:
        self.label, self.coefficients, self.nonces = label, [], []  # type: ignore[var-annotated]
        self._coefficients: Iterator[int] = (
            int.from_bytes(fixed(f"{label} coefficient {i}", 66), "big") % shamir.PRIME for i in range(10**6)
        )
        self._nonces: Iterator[bytes] = (fixed(f"{label} nonce {i}", keys.NONCE_BYTES) for i in range(10**6))

    def randbelow(self, bound: int) -> int:
        assert bound == shamir.PRIME
        value = next(self._coefficients)
        self.coefficients.append(value)
        return value

    def nonce(self, size: int) -> bytes:
        value = next(self._nonces)
        self.nonces.append(value)
        return value


def key_vectors() -> dict[str, object]:
    pairs = []
    for i in range(3):
        private = keys.private_key(fixed(f"key {i}"))
        pairs.append({"private": hexed(keys.private_bytes(private)), "public": hexed(keys.public_bytes(private))})
    p = keys.FIELD
    invalid = {  # low order: X25519 of it with any clamped scalar is all zeros
        "u = 0 (low order)": bytes(32),
        "u = 1 (low order)": (1).to_bytes(32, "little"),
        "u = p - 1 (low order)": (p - 1).to_bytes(32, "little"),
        "a point of order 8": (325606250916557431795983626356110631294008115727848805560023387167927233504).to_bytes(
            32, "little"
        ),
        "u = p: not canonical (u >= p)": p.to_bytes(32, "little"),
        "u = p + 9: not canonical (the base point plus p)": (p + 9).to_bytes(32, "little"),
        "the base point with bit 255 set: not canonical": (9 + 2**255).to_bytes(32, "little"),
        "31 bytes": bytes(range(1, 32)),
    }
    for why, key in invalid.items():  # the generator itself checks what it writes
        try:
            keys.check_public(key)
        except keys.ChannelError:
            continue
        raise AssertionError(f"check_public accepts {why}")
    return {"pairs": pairs, "invalid_public_keys": [{"key": hexed(k), "why": w} for w, k in invalid.items()]}


def agreement_vectors() -> list[dict[str, object]]:
    a, b = keys.private_key(fixed("key 0")), keys.private_key(fixed("key 1"))
    out = []
    for purpose in (keys.CHANNEL, keys.MASK):
        secret = a.exchange(b.public_key())
        out.append({
            "own_private": hexed(keys.private_bytes(a)), "their_public": hexed(keys.public_bytes(b)),
            "purpose": purpose.decode(), "x25519": hexed(secret), "salt": "",
            "info": hexed(keys.info(purpose, SESSION.encode())),
            "key": hexed(keys.agree(a, keys.public_bytes(b), purpose, SESSION.encode())),
        })  # fmt: skip
    return out


def prg_vectors() -> list[dict[str, object]]:
    out = []
    for i, count in enumerate((1, 4, 9)):
        seed = fixed(f"prg {i}")
        out.append({"seed": hexed(seed), "words": count, "output": words_hex(prg.expand(seed, count))})
    return out


def shamir_vectors() -> dict[str, object]:
    secret = fixed("shamir secret")
    draw = Randomness("shamir")
    shares = shamir.split(secret, 3, 5, draw.randbelow)
    wrong = list(shares)
    wrong[3] = shamir.Share(wrong[3].index, (wrong[3].value + 1) % shamir.PRIME)
    recovered, liars = shamir.recover(wrong, 3)
    assert recovered == secret and liars == [4]
    return {
        "secret": hexed(secret), "threshold": 3, "holders": 5,
        "coefficients": [format(c, "x") for c in draw.coefficients],
        "shares": [hexed(s.to_bytes()) for s in shares],
        "one_wrong": {"shares": [hexed(s.to_bytes()) for s in wrong], "wrong_indices": liars},
    }  # fmt: skip


def sealed_vector() -> dict[str, object]:
    sender, receiver = "d-0a", "d-1b"
    a, b = keys.private_key(fixed("key 0")), keys.private_key(fixed("key 1"))
    key = keys.agree(a, keys.public_bytes(b), keys.CHANNEL, SESSION.encode())
    seed_share = shamir.Share(2, int.from_bytes(fixed("sealed seed share", 65), "big"))
    key_share = shamir.Share(2, int.from_bytes(fixed("sealed key share", 65), "big"))
    plaintext = pack(HeldShares(seed_share, key_share))
    associated = associated_data(SESSION.encode(), sender, receiver)
    nonce = fixed("sealed nonce", keys.NONCE_BYTES)
    return {
        "sender": sender, "receiver": receiver, "sender_channel_private": hexed(keys.private_bytes(a)),
        "receiver_channel_public": hexed(keys.public_bytes(b)), "key": hexed(key), "nonce": hexed(nonce),
        "plaintext": hexed(plaintext), "associated_data": hexed(associated),
        "sealed": hexed(keys.encrypt(key, plaintext, associated, lambda _: nonce)),
    }  # fmt: skip


def fixed_point_vectors() -> list[dict[str, object]]:
    out = []
    rng = np.random.default_rng(3)
    for clip, cohort, cap, flags, samples in ((0.8, 4, 150, (), 97), (1.0, 100, 1, (1,), 40)):
        delta = rng.normal(size=6)
        delta = delta * min(1.0, clip / float(np.linalg.norm(delta)))
        encoding = FixedPoint(clip, cohort, cap, len(flags))
        out.append({
            "clip": clip, "cohort": cohort, "weight_cap": cap, "flag_words": len(flags), "delta": delta.tolist(),
            "num_samples": samples, "flags": list(flags), "bound": encoding.bound, "scale": encoding.scale,
            "words": words_hex(encoding.encode(delta, samples, flags)),
        })  # fmt: skip
    return out


def round_vector() -> dict[str, object]:
    """Four devices, everyone each other's neighbour (k = 3, t = 2); d-3 shares its keys and drops
    before its masked input; the other three survive. (With three devices, 2t > k leaves t = 2 of
    k = 2: one dropout leaves each survivor's seed one holder, and the round fails.)"""
    names = ["d-0", "d-1", "d-2", "d-3"]
    context = SESSION.encode()
    draws = {n: Randomness(f"round {n}") for n in names}
    sessions = {
        n: DeviceSession(n, context, keys.KeyPairs(keys.private_key(fixed(f"{n} channel")),
                                                  keys.private_key(fixed(f"{n} mask"))),
                         fixed(f"{n} seed"), draws[n].randbelow, draws[n].nonce)
        for n in names
    }  # fmt: skip
    graph = {n: [m for m in names if m != n] for n in names}
    server = ServerSession(names, 3, 2, 5 + 1, context, graph)
    ads = {n: s.advertise() for n, s in sessions.items()}
    for n in names:
        server.advertise(n, ads[n])
    sealed: dict[str, dict[str, bytes]] = {}
    for n in names:
        sealed[n] = sessions[n].share_keys(server.neighbours(n), 2)
        server.share(n, sealed[n])
    for n in names:
        sessions[n].receive_shares(server.shares_for(n))
    encoding = FixedPoint(1.0, 4, 100)
    rng = np.random.default_rng(11)
    devices: dict[str, dict[str, object]] = {}
    survivors = names[:3]
    for i, n in enumerate(names):
        delta = rng.normal(size=5)
        delta = delta * min(1.0, 0.9 / float(np.linalg.norm(delta)))
        samples = [30, 120, 75, 50][i]
        words = encoding.encode(delta, samples)
        entry: dict[str, object] = {
            "channel_private": hexed(fixed(f"{n} channel")), "mask_private": hexed(fixed(f"{n} mask")),
            "seed": hexed(fixed(f"{n} seed")), "channel_public": hexed(ads[n].channel),
            "mask_public": hexed(ads[n].mask), "coefficients": [format(c, "x") for c in draws[n].coefficients],
            "nonces": [hexed(v) for v in draws[n].nonces],
            "sealed": {to: hexed(c) for to, c in sorted(sealed[n].items())},
            "delta": delta.tolist(), "num_samples": samples, "words": words_hex(words),
        }  # fmt: skip
        if n in survivors:
            masked = sessions[n].masked_input(words)
            server.submit(n, masked)
            entry["masked"] = words_hex(masked)
        devices[n] = entry
    for n in survivors:
        dropped, alive = server.unmask_request(n)
        answer = sessions[n].unmask(dropped, alive)
        server.answer(n, answer)
        devices[n]["unmask_request"] = {"dropped": dropped, "survivors": alive}
        devices[n]["unmask_answer"] = {about: hexed(share) for about, share in sorted(answer.items())}
    total = server.total()
    _, weight, _ = encoding.decode_sum(total)
    mean, _ = encoding.decode(total)
    expected = sum(
        np.asarray(devices[n]["delta"]) * encoding.weight(int(devices[n]["num_samples"]))
        for n in survivors  # type: ignore[call-overload]
    ) / sum(encoding.weight(int(devices[n]["num_samples"])) for n in survivors)  # type: ignore[call-overload]
    assert np.max(np.abs(mean - expected)) <= encoding.error_bound(3, weight)
    return {
        "session": SESSION, "devices": devices, "graph": graph, "neighbours": 3, "threshold": 2,
        "encoding": {"clip": 1.0, "cohort": 4, "weight_cap": 100, "flag_words": 0}, "dropped": ["d-3"],
        "total": words_hex(total), "total_weight": weight, "mean_delta": mean.tolist(),
    }  # fmt: skip


def resolution_vectors() -> list[dict[str, object]]:
    """Who is in the sum when devices could not open each other's shares (ServerSession.included)."""
    names = [f"d-{i}" for i in range(6)]
    cases = (
        ("d-2 sealed garbage for d-0 and d-4: d-2 goes", {"d-0": ["d-2"], "d-4": ["d-2"]}),
        ("d-1 says it could not open d-3's shares: a tie, the larger id goes", {"d-1": ["d-3"]}),
        ("d-5 says so of everyone: d-5 goes", {"d-5": ["d-0", "d-1", "d-2", "d-3", "d-4"]}),
    )
    out = []
    for what, unopened in cases:
        graph = {n: [m for m in names if m != n] for n in names}
        server = ServerSession(names, 5, 3, 1, SESSION.encode(), graph)
        for n in names:
            server.advertise(n, Advertisement(*(keys.public_bytes(keys.private_key(fixed(f"res {n} {r}")))
                                                for r in ("c", "m"))))  # fmt: skip
        for n in names:
            server.share(n, {m: bytes(keys.sealed_size(2 * shamir.SHARE_BYTES)) for m in server.neighbours(n)})
        for i, n in enumerate(names):
            server.submit(n, np.array([i], dtype=np.uint32), unopened.get(n, []))
        requests = {n: dict(zip(("dropped", "survivors"), server.unmask_request(n), strict=True))
                    for n in sorted(server.included())}  # fmt: skip
        out.append({"case": what, "cohort": names, "graph": "everyone", "neighbours": 5, "threshold": 3,
                    "unopened": unopened, "included": sorted(server.included()),
                    "unmask_requests": requests})  # fmt: skip
    return out


def vectors() -> dict[str, object]:
    return {
        "about": "Known-answer vectors of fedper's secure aggregation, protocol revision 1.7 (docs/SECAGG.md, "
        "'To the byte'). Bytes are lowercase hex; uint32 word vectors are their little-endian bytes; Shamir "
        "coefficients are hex integers in the order the device draws them (the seed's t-1, then the mask key's "
        "t-1); written by docs/scripts/secagg_vectors.py.",
        "session": SESSION,
        "keys": key_vectors(),
        "agreement": agreement_vectors(),
        "prg": prg_vectors(),
        "shamir": shamir_vectors(),
        "sealed": sealed_vector(),
        "fixed_point": fixed_point_vectors(),
        "round": round_vector(),
        "resolution": resolution_vectors(),
    }


def render() -> str:
    return json.dumps(vectors(), indent=1) + "\n"


def main(argv: list[str] | None = None, write: Callable[[str], object] = OUT.write_text) -> int:
    p = argparse.ArgumentParser(description=__doc__)
    p.add_argument("--check", action="store_true", help="exit 1 if the file is not what the code gives")
    args = p.parse_args(argv)
    text = render()
    if args.check:
        same = OUT.exists() and OUT.read_text() == text
        print(f"{OUT}: {'up to date' if same else 'differs from what the code gives'}", file=sys.stderr)
        return 0 if same else 1
    write(text)
    print(f"wrote {OUT}", file=sys.stderr)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
