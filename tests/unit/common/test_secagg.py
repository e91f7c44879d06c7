"""SecAgg+'s pieces (fedper.common.secagg): Shamir sharing, the fixed-point encoding, the graph,
the channel, and whole rounds of devices and a server in one process, dropouts included."""

from __future__ import annotations

import itertools
import os
import random

import numpy as np
import pytest
import sympy
from hypothesis import given, settings
from hypothesis import strategies as st

from fedper.common.errors import ConfigError
from fedper.common.secagg import keys, prg, shamir
from fedper.common.secagg.device_session import Advertisement, DeviceSession, RequestRefusedError
from fedper.common.secagg.fixed_point import FixedPoint
from fedper.common.secagg.graph import check_threshold, default_neighbours, default_threshold, neighbour_graph
from fedper.common.secagg.server_session import RoundFailedError, ServerSession, StageError

CONTEXT = b"run test round 1"


def test_the_field_is_prime_and_holds_any_32_byte_secret() -> None:
    assert sympy.isprime(shamir.PRIME) and shamir.PRIME > 2**256


@settings(max_examples=60, deadline=None)
@given(secret=st.binary(min_size=32, max_size=32), holders=st.integers(1, 12), data=st.data())
def test_any_t_shares_give_the_secret_back_and_t_minus_1_do_not(
    secret: bytes, holders: int, data: st.DataObject
) -> None:
    threshold = data.draw(st.integers(1, holders))
    shares = shamir.split(secret, threshold, holders)
    chosen = data.draw(st.permutations(shares))[:threshold]
    assert shamir.combine(chosen, threshold) == secret
    assert shamir.combine([shamir.Share.from_bytes(s.to_bytes()) for s in chosen], threshold) == secret
    if threshold > 1:
        with pytest.raises(
            shamir.ShamirError, match=f"{threshold - 1} shares cannot give back a secret shared {threshold}"
        ):
            shamir.combine(chosen[:-1], threshold)
        # Interpolating t-1 shares as if they were all: a different secret (but for chance 2^-265).
        with pytest.raises(shamir.ShamirError, match="not of one 32-byte secret"):
            shamir.combine(chosen[:-1], threshold - 1)


def test_t_minus_1_shares_fit_every_secret_equally() -> None:
    """Perfect secrecy, on a small scale: two secrets, t-1 = 1 share of each drawn with the same
    coefficients but one: the share of either is uniform over the field, so a share fixed in
    advance is consistent with both (a polynomial through it exists for each)."""
    share = shamir.split(bytes(32), 2, 3)[0]
    for secret in (bytes(32), os.urandom(32)):
        # The slope that makes the line through (0, secret) pass through the fixed share.
        slope = (share.value - int.from_bytes(secret, "big")) * pow(share.index, -1, shamir.PRIME) % shamir.PRIME
        fitted = shamir.split(secret, 2, 3, randbelow=lambda _, slope=slope: slope)
        assert fitted[0] == share


def test_bad_shares_and_secrets_are_refused() -> None:
    shares = shamir.split(bytes(range(32)), 2, 3)
    with pytest.raises(shamir.ShamirError, match="same index"):
        shamir.combine([shares[0], shares[0]], 2)
    with pytest.raises(shamir.ShamirError, match="a secret is 32 bytes, got 31"):
        shamir.split(bytes(31), 2, 3)
    with pytest.raises(shamir.ShamirError, match="threshold"):
        shamir.split(bytes(32), 4, 3)
    with pytest.raises(shamir.ShamirError, match="a share is 68 bytes"):
        shamir.Share.from_bytes(b"\x00")
    with pytest.raises(shamir.ShamirError, match="out of the field"):
        shamir.Share.from_bytes(bytes(2) + bytes(66))


@settings(max_examples=40, deadline=None)
@given(
    cohort=st.integers(1, 2000),
    clip=st.floats(1e-3, 1e3),
    words=st.integers(1, 40),
    cap=st.integers(1, 1000),
    seed=st.integers(0, 2**32 - 1),
)
def test_a_full_cohort_at_the_clip_cannot_overflow(cohort: int, clip: float, words: int, cap: int, seed: int) -> None:
    """The worst case: every device's every coordinate at +C or -C (alike, so they add up), at the
    weight cap. The sum decodes to the exact mean within the rounding bound."""
    fixed = FixedPoint(clip, cohort, cap)
    rng = np.random.default_rng(seed)
    signs = rng.choice([-1.0, 1.0], size=words)
    delta = signs * clip
    total = np.zeros(words + 1, dtype=np.uint32)
    for _ in range(cohort):
        total += fixed.encode(delta, cap + 5)  # above the cap: weighs the cap
    mean, weight = fixed.decode(total)
    assert weight == cohort * cap
    assert np.max(np.abs(mean - delta)) <= fixed.error_bound(cohort, weight) * (1 + 1e-9)


def test_the_encoding_refuses_what_could_overflow() -> None:
    with pytest.raises(ConfigError, match="below 2"):
        FixedPoint(1.0, 2**20, 2**12)
    with pytest.raises(ConfigError, match="positive"):
        FixedPoint(float("nan"), 10, 1)


@pytest.mark.parametrize("n", [2, 5, 20, 100, 1000])
def test_the_graph_is_symmetric_and_k_regular(n: int) -> None:
    devices = [f"d{i:04d}" for i in range(n)]
    k = default_neighbours(n)
    graph = neighbour_graph(devices, k)
    assert all(len(graph[d]) == k and d not in graph[d] for d in devices)
    assert all(d in graph[e] for d in devices for e in graph[d])
    check_threshold(k, default_threshold(k))
    assert {20: 10, 100: 14, 1000: 20}.get(n, k) == k


def test_the_threshold_must_be_a_strict_majority_of_the_neighbours() -> None:
    with pytest.raises(ConfigError, match="more than half"):
        check_threshold(10, 5)
    with pytest.raises(ConfigError, match="even k"):
        neighbour_graph([str(i) for i in range(10)], 3)


def test_a_share_sealed_for_one_device_opens_for_no_other() -> None:
    a, b, c = keys.KeyPairs.generate(), keys.KeyPairs.generate(), keys.KeyPairs.generate()
    key_ab = keys.agree(a.channel, b.public()[0], keys.CHANNEL, CONTEXT)
    assert key_ab == keys.agree(b.channel, a.public()[0], keys.CHANNEL, CONTEXT)
    assert key_ab != keys.agree(a.channel, b.public()[0], keys.MASK, CONTEXT)  # one key per purpose
    sealed = keys.encrypt(key_ab, b"share", b"a|b")
    assert keys.decrypt(key_ab, sealed, b"a|b") == b"share"
    with pytest.raises(keys.ChannelError, match="authentication"):
        keys.decrypt(keys.agree(c.channel, a.public()[0], keys.CHANNEL, CONTEXT), sealed, b"a|b")
    with pytest.raises(keys.ChannelError, match="authentication"):
        keys.decrypt(key_ab, sealed, b"a|c")  # rerouted to another receiver
    with pytest.raises(keys.ChannelError, match="low order"):
        keys.agree(a.channel, bytes(32), keys.MASK, CONTEXT)  # a low-order point


def _round(n: int, drop: set[int], rng: np.random.Generator, k: int | None = None, t: int | None = None):  # type: ignore[no-untyped-def]
    """A round of n devices, ``drop`` leaving after sharing keys. -> (server, inputs, samples, fixed)."""
    k = default_neighbours(n) if k is None else k
    t = default_threshold(k) if t is None else t
    names = [f"device-{i:03d}" for i in range(n)]
    fixed = FixedPoint(clip=1.0, cohort=n, weight_cap=200)
    words = 50
    server = ServerSession(names, k, t, words + 1, CONTEXT)
    devices = {name: DeviceSession(name, CONTEXT) for name in names}
    for name, device in devices.items():
        server.advertise(name, device.advertise())
    for name, device in devices.items():
        server.share(name, device.share_keys(server.neighbours(name), t))
    for name, device in devices.items():
        device.receive_shares(server.shares_for(name))
    deltas, samples = {}, {}
    for i, (name, device) in enumerate(devices.items()):
        delta = rng.normal(size=words)
        deltas[name] = delta * min(1.0, 1.0 / np.linalg.norm(delta))  # clipped to C = 1
        samples[name] = int(rng.integers(20, 300))
        if i not in drop:
            encoded = fixed.encode(deltas[name], samples[name])
            masked = device.masked_input(encoded)
            assert np.mean(masked == encoded) < 0.1  # what the server receives is not the input
            server.submit(name, masked)
    for name in server.included():
        server.answer(name, devices[name].unmask(*server.unmask_request(name)))
    return server, deltas, samples, fixed


def test_twenty_devices_three_dropping_after_sharing_keys_give_the_survivors_fedavg() -> None:
    rng = np.random.default_rng(7)
    server, deltas, samples, fixed = _round(20, {3, 11, 17}, rng)
    mean, weight = fixed.decode(server.total())
    survivors = sorted(server.masked)
    assert len(survivors) == 17
    w = np.array([min(samples[s], fixed.weight_cap) for s in survivors], dtype=np.float64)
    fedavg = np.sum([wi * deltas[s] for wi, s in zip(w, survivors, strict=True)], axis=0) / w.sum()
    difference, bound = float(np.max(np.abs(mean - fedavg))), fixed.error_bound(17, weight)
    print(f"max abs difference {difference:.3g}, bound {bound:.3g}")
    assert weight == w.sum() and difference <= bound


def test_the_2017_protocol_everyone_neighbours_everyone() -> None:
    server, deltas, samples, fixed = _round(6, {0}, np.random.default_rng(1), k=5, t=3)
    mean, weight = fixed.decode(server.total())
    w = {s: min(samples[s], 200) for s in server.masked}
    fedavg = sum(w[s] * deltas[s] for s in w) / sum(w.values())
    assert np.max(np.abs(mean - fedavg)) <= fixed.error_bound(5, weight)


def test_too_many_dropouts_fail_the_round_cleanly() -> None:
    # 10 devices, k = 4, t = 3: device 0's ring neighbours are unknown, so drop 7 of 10. A survivor
    # holding shares of a dropped device with fewer than 3 holders left cannot have its mask with
    # it removed: it is left out of the sum too, and what remains cannot be unmasked.
    server, *_ = _round(10, set(range(7)), np.random.default_rng(2), k=4, t=3)
    with pytest.raises(RoundFailedError, match="it needs 3|no device's masked input is in the sum"):
        server.total()


def test_a_malicious_server_cannot_collect_both_secrets_of_a_device() -> None:
    names = [f"n{i}" for i in range(5)]
    devices = {n: DeviceSession(n, CONTEXT) for n in names}
    ads = {n: d.advertise() for n, d in devices.items()}
    sealed = {n: d.share_keys({m: ads[m] for m in names if m != n}, 3) for n, d in devices.items()}
    for n, d in devices.items():
        d.receive_shares({m: sealed[m][n] for m in names if m != n})
    victim = devices["n0"]
    with pytest.raises(RequestRefusedError, match=r"both secrets of \['n1'\]"):
        victim.unmask(["n1", "n2"], ["n1", "n3"])
    with pytest.raises(RequestRefusedError, match="holds no share"):
        victim.unmask(["n0"], [])
    victim.unmask(["n1"], ["n2", "n3", "n4"])
    assert victim.unmask(["n1"], ["n2", "n3", "n4"])  # the same request again: the same answer
    with pytest.raises(RequestRefusedError, match="already answered with other lists"):
        victim.unmask([], ["n1", "n2", "n3", "n4"])  # now n1's seed too: refused


def test_a_device_refuses_a_key_list_that_could_trick_it() -> None:
    names = [f"n{i}" for i in range(4)]
    devices = {n: DeviceSession(n, CONTEXT) for n in names}
    ads = {n: d.advertise() for n, d in devices.items()}
    with pytest.raises(RequestRefusedError, match="two keys of the round are the same"):
        devices["n0"].share_keys({"n1": ads["n1"], "n2": ads["n1"], "n3": ads["n3"]}, 2)
    with pytest.raises(RequestRefusedError, match="its own neighbour"):
        devices["n0"].share_keys(ads, 2)
    with pytest.raises(RequestRefusedError, match="cannot hold shares 3 of n"):
        devices["n0"].share_keys({"n1": ads["n1"], "n2": ads["n2"]}, 3)


def test_the_server_takes_each_stage_once_from_members_only() -> None:
    server = ServerSession(["a", "b", "c"], 2, 2, 4, CONTEXT)
    a = DeviceSession("a", CONTEXT)
    server.advertise("a", a.advertise())
    with pytest.raises(StageError, match="already advertised"):
        server.advertise("a", a.advertise())
    with pytest.raises(StageError, match="not in this round's cohort"):
        server.advertise("z", a.advertise())
    with pytest.raises(StageError, match="sent no shares"):
        server.submit("b", np.zeros(4, dtype=np.uint32))
    with pytest.raises(StageError, match="32 bytes"):
        server.advertise("b", Advertisement(b"short", bytes(32)))


@settings(max_examples=30, deadline=None)
@given(garbage=st.binary(max_size=80), words=st.lists(st.integers(0, 2**32 - 1), max_size=6))
def test_what_a_device_sends_the_server_is_checked_before_it_is_kept(garbage: bytes, words: list[int]) -> None:
    """A masked input of the wrong size or type, or a share that is not one, is refused with a
    StageError (the HTTP layer's 422), and the round goes on as if it had not been sent."""
    server, *_ = _round(5, {0}, np.random.default_rng(4), k=4, t=3)
    with pytest.raises(StageError, match="is 51 uint32 words"):
        server.submit("device-000", np.array(words, dtype=np.uint32))  # device-000 dropped: sent none
    with pytest.raises(StageError, match="is 51 uint32 words"):
        server.submit("device-000", np.zeros(51, dtype=np.int64))
    assert "device-000" not in server.masked
    name = sorted(server.masked)[0]
    assert server.answers.pop(name)  # let this device answer again, with garbage
    dropped, survivors = server.unmask_request(name)
    about = (dropped + survivors)[0]
    bad = dict.fromkeys(dropped + survivors, bytes(shamir.SHARE_BYTES))
    bad[about] = garbage
    try:
        shamir.Share.from_bytes(garbage)
    except shamir.ShamirError:
        with pytest.raises(StageError, match=f"share for '{about}'"):
            server.answer(name, bad)
        assert name not in server.answers


def test_masks_cancel_over_random_graphs_and_dropouts() -> None:
    rnd = random.Random(5)
    for n, k in itertools.product((7, 12), (4, 6)):  # one drop leaves k - 1 >= t
        drop = set(rnd.sample(range(n), 1))
        server, deltas, samples, fixed = _round(n, drop, np.random.default_rng(n * k), k=k, t=default_threshold(k))
        mean, weight = fixed.decode(server.total())
        w = {s: min(samples[s], 200) for s in server.masked}
        fedavg = sum(w[s] * deltas[s] for s in w) / sum(w.values())
        assert np.max(np.abs(mean - fedavg)) <= fixed.error_bound(len(w), weight)


def test_the_mask_generator_is_aes_256_ctr_from_a_zero_counter() -> None:
    """Known answer: AES-256 of the zero block under the zero key (the first keystream block)
    is dc95c078a2408989ad48a21492842087; the next block uses counter 1 (big-endian)."""
    words = prg.expand(bytes(32), 8)
    assert words[:4].astype("<u4").tobytes().hex() == "dc95c078a2408989ad48a21492842087"
    from cryptography.hazmat.primitives.ciphers import Cipher, algorithms, modes

    second = Cipher(algorithms.AES(bytes(32)), modes.ECB()).encryptor().update((1).to_bytes(16, "big"))
    assert words[4:].astype("<u4").tobytes() == second
    with pytest.raises(ValueError, match="32 bytes"):
        prg.expand(bytes(16), 1)


def test_a_device_refuses_a_threshold_a_lying_server_could_beat_and_a_request_naming_a_device_twice() -> None:
    """2t > k is what keeps a server that lies about who dropped from collecting both secrets of a
    device: a device refuses a threshold of half its neighbours or fewer (helper's finding)."""
    names = [f"n{i}" for i in range(5)]
    devices = {n: DeviceSession(n, CONTEXT) for n in names}
    ads = {n: d.advertise() for n, d in devices.items()}
    with pytest.raises(RequestRefusedError, match="not more than half"):
        devices["n0"].share_keys({m: ads[m] for m in names[1:]}, 2)  # k = 4, t = 2
    sealed = {n: d.share_keys({m: ads[m] for m in names if m != n}, 3) for n, d in devices.items()}
    for n, d in devices.items():
        d.receive_shares({m: sealed[m][n] for m in names if m != n})
    with pytest.raises(RequestRefusedError, match="names a device twice"):
        devices["n0"].unmask([], ["n1", "n1", "n2"])


@settings(max_examples=60, deadline=None)
@given(t=st.integers(1, 6), extra=st.integers(0, 6), data=st.data())
def test_wrong_shares_up_to_half_the_spare_ones_are_corrected_and_named(
    t: int, extra: int, data: st.DataObject
) -> None:
    """Berlekamp-Welch: m = t + extra shares, up to extra // 2 of them wrong (any values)."""
    secret = data.draw(st.binary(min_size=32, max_size=32))
    shares = shamir.split(secret, t, t + extra)
    wrong = data.draw(st.sets(st.sampled_from(range(t + extra)), max_size=extra // 2))
    given_shares = [
        shamir.Share(s.index, data.draw(st.integers(0, shamir.PRIME - 1).filter(lambda v, s=s: v != s.value)))
        if i in wrong
        else s
        for i, s in enumerate(shares)
    ]
    recovered, named = shamir.recover(given_shares, t)
    assert recovered == secret and named == sorted(shares[i].index for i in wrong)
