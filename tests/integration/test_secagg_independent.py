"""An independent device implementation of secure aggregation (tests/support/secagg_independent_device.py,
written from docs/SECAGG.md, docs/PROTOCOL.md, docs/protocol.schema.json and
docs/secagg_vectors.json, importing nothing of ``fedper``): it reproduces every device-side
known-answer vector, and five such devices, one of which drops after sharing its keys, complete a
round against a real ``fedper serve --secagg`` whose published base is the survivors' FedAvg."""

from __future__ import annotations

import ast
import json
import sys
import threading
import time
from collections.abc import Callable
from datetime import datetime
from pathlib import Path
from typing import Any

import httpx
import numpy as np
import pytest

from tests.support import secagg_independent_device as dev
from tests.support.server_support import ENROLL, admin, serve

VECTORS = Path(__file__).resolve().parents[2] / "docs" / "secagg_vectors.json"


def _hex(text: str) -> bytes:
    return bytes.fromhex(text)


def _words(text: str) -> np.ndarray:
    return np.frombuffer(_hex(text), dtype="<u4").astype(np.uint32)


@pytest.fixture(scope="module")
def vectors() -> dict[str, Any]:
    result: dict[str, Any] = json.loads(VECTORS.read_text())
    return result


def test_the_device_imports_nothing_of_fedper() -> None:
    """Written from the documents: only the standard library, numpy, httpx and cryptography."""
    tree = ast.parse(Path(dev.__file__).read_text())
    imported = {alias.name for node in ast.walk(tree) if isinstance(node, ast.Import) for alias in node.names}
    imported |= {node.module or "" for node in ast.walk(tree) if isinstance(node, ast.ImportFrom)}
    third_party = {name.split(".")[0] for name in imported} - set(sys.stdlib_module_names) - {"__future__"}
    assert third_party == {"numpy", "httpx", "cryptography"}, third_party


def test_keys_derivations_and_the_mask_generator(vectors: dict[str, Any]) -> None:
    session = vectors["session"]
    for pair in vectors["keys"]["pairs"]:
        public = dev.public_key(_hex(pair["private"]))
        assert public.hex() == pair["public"]
        assert dev.is_valid_public_key(public)
    for invalid in vectors["keys"]["invalid_public_keys"]:
        assert not dev.is_valid_public_key(_hex(invalid["key"])), invalid["why"]
    for a in vectors["agreement"]:
        own, theirs = _hex(a["own_private"]), _hex(a["their_public"])
        assert dev.x25519(own, theirs).hex() == a["x25519"]
        assert dev.hkdf_info(a["purpose"], session).hex() == a["info"]
        derive = {"channel": dev.channel_key, "mask": dev.pairwise_seed}[a["purpose"]]
        assert derive(own, theirs, session).hex() == a["key"]
        # symmetric: the other side derives the same from its private key and our public key
        other = next(p for p in vectors["keys"]["pairs"] if p["public"] == a["their_public"])
        assert derive(_hex(other["private"]), dev.public_key(own), session).hex() == a["key"]
    for v in vectors["prg"]:
        assert dev.prg(_hex(v["seed"]), v["words"]).astype("<u4").tobytes().hex() == v["output"]


def test_shamir_split_and_reconstruction(vectors: dict[str, Any]) -> None:
    v = vectors["shamir"]
    t, k = v["threshold"], v["holders"]
    coefficients = [int(c, 16) for c in v["coefficients"]]
    shares = dev.shamir_split(_hex(v["secret"]), t, k, coefficients)
    assert [dev.encode_share(*s).hex() for s in shares] == v["shares"]
    decoded = [dev.decode_share(_hex(s)) for s in v["shares"]]
    for subset in (decoded[:t], decoded[-t:], decoded[::2], decoded):
        assert dev.reconstruct(subset, t).hex() == v["secret"]
    wrong = [dev.decode_share(_hex(s)) for s in v["one_wrong"]["shares"]]
    polynomial, bad = dev.decode_polynomial(wrong, t)
    assert bad == v["one_wrong"]["wrong_indices"]
    assert polynomial == [int(v["secret"], 16), *coefficients]
    assert dev.reconstruct(wrong, t).hex() == v["secret"]
    with pytest.raises(ValueError):
        dev.reconstruct(decoded[: t - 1], t)


def test_the_sealed_share_message(vectors: dict[str, Any]) -> None:
    v, session = vectors["sealed"], vectors["session"]
    private, public = _hex(v["sender_channel_private"]), _hex(v["receiver_channel_public"])
    key = dev.channel_key(private, public, session)
    assert key.hex() == v["key"]
    assert dev.associated_data(session, v["sender"], v["receiver"]).hex() == v["associated_data"]
    sealed = dev.seal(key, _hex(v["nonce"]), _hex(v["plaintext"]), session, v["sender"], v["receiver"])
    assert len(sealed) == dev.SEALED_BYTES
    assert sealed.hex() == v["sealed"]
    # the receiver opens it with its own private key and the sender's public key
    receiver = next(p for p in vectors["keys"]["pairs"] if p["public"] == v["receiver_channel_public"])
    its_key = dev.channel_key(_hex(receiver["private"]), dev.public_key(private), session)
    assert dev.open_sealed(its_key, sealed, session, v["sender"], v["receiver"]).hex() == v["plaintext"]
    seed_share, key_share = dev.parse_share_message(_hex(v["plaintext"]))
    assert seed_share[0] == key_share[0]
    for tampered_ids in ((v["receiver"], v["sender"]), (v["sender"], v["sender"])):
        with pytest.raises(Exception):  # noqa: B017 (InvalidTag): bound to the sender and the receiver
            dev.open_sealed(its_key, sealed, session, *tampered_ids)


def test_the_fixed_point_encodings(vectors: dict[str, Any]) -> None:
    for v in vectors["fixed_point"]:
        encoding = dev.FixedPointEncoding(v["clip"], v["cohort"], v["weight_cap"])
        assert encoding.bound == v["bound"]
        assert encoding.scale == v["scale"]
        assert len(v["flags"]) == v["flag_words"]
        words = encoding.encode(np.array(v["delta"]), v["num_samples"], v["flags"])
        assert words.astype("<u4").tobytes().hex() == v["words"]


def test_a_round_of_four_devices_one_dropping_message_by_message(vectors: dict[str, Any]) -> None:
    r = vectors["round"]
    session, devices, t = r["session"], r["devices"], r["threshold"]
    ids = list(devices)
    encoding = dev.FixedPointEncoding(r["encoding"]["clip"], r["encoding"]["cohort"], r["encoding"]["weight_cap"])
    sessions: dict[str, dev.SecureSession] = {}
    scripted: dict[str, dev.ScriptedRandomness] = {}
    for d, v in devices.items():
        scripted[d] = dev.ScriptedRandomness(
            [_hex(v["channel_private"]), _hex(v["mask_private"])], _hex(v["seed"]),
            [int(c, 16) for c in v["coefficients"]], [_hex(x) for x in v["nonces"]],
        )  # fmt: skip
        sessions[d] = dev.SecureSession(d, session, scripted[d])
        assert sessions[d].channel_public.hex() == v["channel_public"]
        assert sessions[d].mask_public.hex() == v["mask_public"]
    # keys: the server relays each device's neighbours' keys
    for d in ids:
        relayed = {j: (sessions[j].channel_public, sessions[j].mask_public) for j in r["graph"][d]}
        sessions[d].receive_keys(t, relayed)
    # shares: every device (d-3 included: it drops after sharing) seals for each neighbour
    sealed = {d: sessions[d].share_messages() for d in ids}
    for d in ids:
        assert {j: m.hex() for j, m in sealed[d].items()} == devices[d]["sealed"], d
        assert all(len(m) == dev.SEALED_BYTES for m in sealed[d].values())
        assert scripted[d].used_up(), d
    survivors = [d for d in ids if d not in r["dropped"]]
    masked: dict[str, np.ndarray] = {}
    for d in survivors:
        unopened = sessions[d].receive_shares({j: sealed[j][d] for j in r["graph"][d]})
        assert unopened == []
    # masked inputs: the words of each device's delta, then masked
    for d in ids:
        v = devices[d]
        words = encoding.encode(np.array(v["delta"]), v["num_samples"])
        assert words.astype("<u4").tobytes().hex() == v["words"], d
        if d in survivors:
            data = sessions[d].masked(words)
            assert data.hex() == v["masked"], d
            masked[d] = np.frombuffer(data, "<u4").astype(np.uint32)
    # unmasking: each survivor answers the server's request
    answers = {}
    for d in survivors:
        request = devices[d]["unmask_request"]
        answers[d] = sessions[d].unmask(request["dropped"], request["survivors"])
        assert {j: s.hex() for j, s in answers[d].items()} == devices[d]["unmask_answer"], d
        # the same request again is answered the same; a different one, or a malicious one, refused
        assert sessions[d].unmask(request["dropped"], request["survivors"]) == answers[d]
        with pytest.raises(dev.SitOutError):
            sessions[d].unmask(request["survivors"][:1], request["survivors"])
    fresh = dev.SecureSession(survivors[0], session)
    fresh.threshold, fresh.neighbours, fresh.held = t, sessions[survivors[0]].neighbours, sessions[survivors[0]].held
    with pytest.raises(dev.SitOutError):  # one device named as both dropped and surviving
        fresh.unmask([survivors[1]], [survivors[1]])
    with pytest.raises(dev.SitOutError):  # a device it holds no share of
        fresh.unmask([], ["d-9"])

    # What the server then computes (SECAGG.md "The sum"), from the answers: the vector's total.
    n = next(iter(masked.values())).size
    total = np.zeros(n, np.uint32)
    for d in survivors:
        total += masked[d]
    for d in survivors:  # remove each survivor's self mask, its seed from its neighbours' seed shares
        holders = [h for h in survivors if d in answers[h]]
        seed = dev.reconstruct([dev.decode_share(answers[h][d]) for h in holders], t)
        assert seed.hex() == devices[d]["seed"]
        total -= dev.prg(seed, n)
    for g in r["dropped"]:  # and the dropped device's pairwise masks with the survivors that hold its shares
        holders = [h for h in survivors if g in answers[h]]
        mask_private = dev.reconstruct([dev.decode_share(answers[h][g]) for h in holders], t)
        assert dev.public_key(mask_private).hex() == devices[g]["mask_public"]
        for h in holders:
            mask = dev.prg(dev.pairwise_seed(mask_private, sessions[h].mask_public, session), n)
            if h.encode() < g.encode():
                total -= mask
            else:
                total += mask
    assert total.astype("<u4").tobytes().hex() == r["total"]
    mean, weight = encoding.decode_mean(total)
    assert weight == r["total_weight"]
    assert [float(x) for x in mean] == r["mean_delta"]  # (signed sums / scale) · cap / W, in that order
    expected = sum(
        min(devices[d]["num_samples"], encoding.weight_cap) * np.array(devices[d]["delta"]) for d in survivors
    )
    bound = encoding.rounding_bound(len(survivors), weight)
    assert np.max(np.abs(mean - expected / weight)) <= bound


def test_who_is_in_the_sum_from_the_document_alone(vectors: dict[str, Any]) -> None:
    """Not a device's computation, but what its unmasking request must be: SECAGG.md's "Who is in
    the sum" (the disagreement rule) reproduces the vectors' ``resolution`` cases."""
    for case in vectors["resolution"]:
        cohort, unopened = case["cohort"], case["unopened"]
        assert case["graph"] == "everyone"
        neighbours = {d: [j for j in cohort if j != d] for d in cohort}
        held = {d: {j for j in neighbours[d] if j not in unopened.get(d, [])} for d in cohort}
        included = set(cohort)
        while True:
            disagreements = {d: 0 for d in included}
            for u in included:
                for v in neighbours[u]:
                    if v in included and u.encode() < v.encode() and ((v in held[u]) != (u in held[v])):
                        disagreements[u] += 1
                        disagreements[v] += 1
            if not any(disagreements.values()):
                break
            worst = max(included, key=lambda d: (disagreements[d], d.encode()))
            included.discard(worst)
        assert sorted(included, key=str.encode) == case["included"], case["case"]
        requests = {
            d: {"dropped": sorted((j for j in held[d] if j not in included), key=str.encode),
                "survivors": sorted((j for j in held[d] if j in included), key=str.encode)}
            for d in included
        }  # fmt: skip
        assert requests == case["unmask_requests"], case["case"]


def test_a_device_refuses_key_lists_and_messages_it_cannot_accept(vectors: dict[str, Any]) -> None:
    session = vectors["session"]
    pairs = [_hex(p["public"]) for p in vectors["keys"]["pairs"]]
    me = dev.SecureSession("d-0", session)
    ok = {"d-1": (pairs[0], pairs[1]), "d-2": (pairs[2], dev.public_key(bytes(range(32))))}
    for bad in (
        {**ok, "d-0": (pairs[0], pairs[1])},  # names itself
        {**ok, "d-3": (_hex(vectors["keys"]["invalid_public_keys"][3]["key"]), pairs[1])},  # invalid
        {"d-1": (pairs[0], pairs[1]), "d-2": (pairs[1], pairs[2])},  # a repeated key
    ):
        with pytest.raises(dev.SitOutError):
            dev.SecureSession("d-0", session).receive_keys(2, bad)
    with pytest.raises(dev.SitOutError):  # its own key
        me.receive_keys(2, {"d-1": (me.channel_public, pairs[1]), "d-2": (pairs[2], pairs[0])})
    with pytest.raises(dev.SitOutError):  # shorter than the threshold
        dev.SecureSession("d-0", session).receive_keys(3, ok)
    me.receive_keys(1, ok)
    with pytest.raises(dev.SitOutError):  # a sealed message from a device that is not its neighbour
        me.receive_shares({"d-7": bytes(dev.SEALED_BYTES)})
    # garbage from d-2 is unopened, not the end of the round (the threshold of 1 is still met)
    me, other = dev.SecureSession("d-0", session), dev.SecureSession("d-1", session)
    me.receive_keys(1, {"d-1": (other.channel_public, other.mask_public), "d-2": ok["d-2"]})
    other.receive_keys(1, {"d-0": (me.channel_public, me.mask_public), "d-2": ok["d-2"]})
    from_d1 = other.share_messages()["d-0"]
    assert me.receive_shares({"d-1": from_d1, "d-2": bytes(dev.SEALED_BYTES)}) == ["d-2"]
    assert list(me.held) == ["d-1"]


def test_the_client_retries_a_stage_that_has_not_begun_and_waits_on_204() -> None:
    """The HTTP client against a scripted server: ``409 secagg_stage_not_open`` with Retry-After is
    sent again; ``204`` with Retry-After is asked again; ``409 secagg_stage_closed`` ends the round."""
    calls: list[tuple[str, str]] = []
    script = {
        ("POST", "/v1/rounds/3/secagg/masked"): [
            httpx.Response(409, json={"code": "secagg_stage_not_open", "message": "m"}, headers={"Retry-After": "2"}),
            httpx.Response(202, json={"round": 3, "stage": "masked"}),
        ],
        ("GET", "/v1/rounds/3/secagg/unmask"): [
            httpx.Response(204, headers={"Retry-After": "3"}),
            httpx.Response(200, json={"dropped": [], "survivors": ["a"]}),
        ],
        ("POST", "/v1/rounds/3/secagg/unmask"): [
            httpx.Response(409, json={"code": "secagg_stage_closed", "message": "m"}),
        ],
    }

    def handler(request: httpx.Request) -> httpx.Response:
        calls.append((request.method, request.url.path))
        if request.method == "POST" and request.url.path.endswith("/masked"):
            assert request.headers["Content-Type"] == dev.OCTET_STREAM
        return script[(request.method, request.url.path)].pop(0)

    slept: list[float] = []
    with httpx.Client(transport=httpx.MockTransport(handler), base_url="http://server") as http:
        client = dev.DeviceClient(http, sleep=slept.append)
        assert client.post_stage(3, "masked", content=b"\0" * 8)["stage"] == "masked"
        assert client.get_stage(3, "unmask") == {"dropped": [], "survivors": ["a"]}
        with pytest.raises(dev.OutOfRoundError) as out:
            client.post_stage(3, "unmask", json_body={"shares": {}})
    assert out.value.code == "secagg_stage_closed"
    assert slept == [2.0, 3.0]
    assert len(calls) == 5


def _timeline(task: dev.Task | None, outcomes: dict[int, dev.RoundOutcome]) -> str:
    """When each device's stages happened, against the task's stage deadlines (seconds: + before)."""
    if task is None:
        return "no task"
    by = {k: datetime.fromisoformat(task.secagg[f"{k}_by"]).timestamp() for k in ("keys", "shares", "masked", "unmask")}
    lines = [f"stage deadlines: {task.secagg['keys_by']} .. {task.secagg['unmask_by']}"]
    for i, o in sorted(outcomes.items()):
        posted = " ".join(f"{k} {by[k] - t:+.2f}" for k, t in o.posted_at.items())
        fetched = " ".join(f"{k} {t - by[k]:+.2f}" for k, t in o.fetched_at.items())
        lines.append(
            f"  device {i}: posted before its deadline: {posted}; fetched after the stage's deadline: {fetched}"
        )
    return "\n".join(lines)


# --- against a real server ---------------------------------------------------------------------

DEVICES = 5
# A checked-in device comes back at most a second after the window's end plus a quarter of STAGE
# (0 s here), and the key stage ends STAGE after the draw: 2 s to fetch the base and send its
# keys. The masked stage waits for the dropped device until TIMEOUT - STAGE. A device that waits
# out the Retry-After of its GET of the shares (the seconds until shares_by, rounded down, plus
# one) wakes up to 1 s after shares_by, and its masked input is due by masked_by = shares_by +
# (TIMEOUT - WINDOW - 3 STAGE): with 1 s there (TIMEOUT 12 for these stages), about one run in six
# lost a device to 409 secagg_stage_closed. 3 s leaves it 2 s to "train" and mask.
WINDOW, STAGE, TIMEOUT = 1, 3, 13
SERVER = {"rounds": 1, "secagg": True, "checkin_window": WINDOW, "secagg_stage_timeout": STAGE,
          "round_timeout": TIMEOUT, "start_devices": DEVICES, "cohort_size": DEVICES, "over_selection": 1.0,
          "target_clients": DEVICES, "min_clients": 2, "retry_after": 1, "secagg_weight_cap": 1000}  # fmt: skip


def test_five_independent_devices_one_dropping_after_its_shares_publish_the_survivors_fedavg(
    server_artifacts: Path, tmp_path: Path
) -> None:
    rng = np.random.default_rng(49)
    # num_samples: two above the weight cap, so min(num_samples, cap) matters
    samples = [40, 700, 1000, 1800, 5000]
    norms = [0.4, 0.95, 1.7, 3.0, 2.2]  # times the clip: two survivors' must be clipped
    dropping = 2  # sends its keys and its shares, then nothing
    outcomes: dict[int, dev.RoundOutcome] = {}
    errors: list[BaseException] = []
    log: list[str] = []

    rng_of = [np.random.default_rng(int(s)) for s in rng.integers(0, 2**31, DEVICES)]

    def trainer(i: int, clip: float) -> Callable[[np.ndarray], tuple[np.ndarray, int]]:
        """No training: the "trained base" is the base plus a random delta of a chosen norm."""

        def train(base: np.ndarray) -> tuple[np.ndarray, int]:
            step = rng_of[i].standard_normal(base.size)
            step *= norms[i] * clip / np.linalg.norm(step)
            return (base.astype(np.float64) + step).astype(np.float32), samples[i]

        return train

    start = time.monotonic()
    with serve(server_artifacts, tmp_path / "server", **SERVER) as server:  # type: ignore[arg-type]
        clip = 1.0  # --secagg-clip's default

        def run(i: int) -> None:
            try:
                with httpx.Client(base_url=server.url, timeout=30) as http:
                    client = dev.DeviceClient(http, log=log.append)
                    client.enroll(ENROLL)
                    outcomes[i] = dev.run_secure_round(
                        client, trainer(i, clip), drop_after="shares" if i == dropping else None, give_up_after=45
                    )
            except BaseException as e:  # reported below
                errors.append(e)

        threads = [threading.Thread(target=run, args=(i,)) for i in range(DEVICES)]
        for th in threads:
            th.start()
        for th in threads:
            th.join(60)
        assert not errors, errors
        assert len(outcomes) == DEVICES
        for i, o in outcomes.items():
            assert o.out is None, (i, o.out, _timeline(outcomes[0].task, outcomes), log)
            assert o.stages_done == (["keys", "shares"] if i == dropping else ["keys", "shares", "masked", "unmask"])
            assert o.unopened == []
        n = outcomes[0].round
        task = outcomes[0].task
        assert task is not None
        secagg = task.secagg
        assert (secagg["cohort"], secagg["neighbours"], secagg["threshold"]) == (DEVICES, DEVICES - 1, 3)
        print(_timeline(task, outcomes))
        # PROTOCOL.md: "`unmask_by` is the round's deadline; the task's `report_by` is null". The
        # server sends the deadline as report_by (the slot lasts the round: the same meaning).
        assert secagg["unmask_by"] == task.raw["deadline"]
        assert task.raw["report_by"] in (None, task.raw["deadline"])
        stages = [secagg[k] for k in ("keys_by", "shares_by", "masked_by", "unmask_by")]
        assert stages == sorted(stages)
        # the dropped device is named dropped in every survivor's unmasking request
        gone = outcomes[dropping].device_id
        survivors = [i for i in range(DEVICES) if i != dropping]
        for i in survivors:
            request = outcomes[i].unmask_request
            assert request is not None and request["dropped"] == [gone], request
            assert sorted(request["survivors"]) == sorted(outcomes[j].device_id for j in survivors if j != i)
        # the round closes and publishes a new version
        with httpx.Client(base_url=server.url, timeout=30) as http:
            info: dict[str, Any] = {}
            for _ in range(100):
                info = http.get(f"/v1/rounds/{n}", headers=admin()).json()
                if info["state"] != "open":
                    break
                time.sleep(0.2)
            assert info["state"] == "closed", info
            # PROTOCOL.md: "In a secure round, `received` counts the masked inputs." The closed
            # round says 0 (the server counts masked inputs only while the round is open).
            assert info["received"] in (0, len(survivors)), info
            version = info["result_version"]
            r = http.get(f"/v1/models/{version}/base", headers=admin())
            assert r.status_code == 200, r.text
            manifest = json.loads(http.get(task.manifest_url, headers=admin()).content)
            published = dev.flatten(dev.read_safetensors(r.content), manifest).astype(np.float64)
    elapsed = time.monotonic() - start

    base = outcomes[0].base
    assert base is not None
    assert all(np.array_equal(outcomes[i].base, base) for i in survivors)  # type: ignore[arg-type]
    weights = np.array([outcomes[i].weight for i in survivors], dtype=np.float64)
    assert list(weights) == [min(samples[i], 1000) for i in survivors]
    deltas: list[np.ndarray] = []
    for i in survivors:
        delta = outcomes[i].clipped_delta
        assert delta is not None
        assert dev.sequential_norm(delta, np.zeros_like(delta)) <= clip  # clipped as PROTOCOL.md says
        assert (dev.sequential_norm(delta, np.zeros_like(delta)) < 0.99 * clip) == (norms[i] < 1)
        deltas.append(delta)
    weighted_sum = np.zeros_like(deltas[0])
    for w, delta in zip(weights, deltas, strict=True):
        weighted_sum += w * delta
    expected = base.astype(np.float64) + weighted_sum / weights.sum()
    encoding = dev.FixedPointEncoding(float(secagg["clip_norm"]), int(secagg["cohort"]), int(secagg["weight_cap"]))
    fixed = encoding.rounding_bound(len(survivors), int(weights.sum()))
    # the published base is rounded once to float32: at most half a float32 spacing (taken at the
    # larger magnitude, in case the rounding crosses a power of two); float64's own error is ~1e-16
    half_ulp = 0.5 * np.spacing((np.abs(expected) + fixed).astype(np.float32)).astype(np.float64)
    difference = np.abs(published - expected)
    slack = fixed + half_ulp + 4 * np.finfo(np.float64).eps * np.abs(expected)
    worst = int(np.argmax(difference - slack))
    print(
        f"\nindependent devices: round {n} closed in {elapsed:.1f} s (server included); "
        f"max |published - FedAvg| = {difference.max():.3g}; fixed-point bound {fixed:.3g}, "
        f"+ half a float32 ulp (max {half_ulp.max():.3g}); tightest coordinate {difference[worst]:.3g} "
        f"<= {slack[worst]:.3g}; max difference beyond the fixed-point bound alone "
        f"{max(0.0, float((difference - fixed).max())):.3g}"
    )
    correctly_rounded = float(np.mean(published == expected.astype(np.float32)))
    print(f"published == float32(FedAvg) on {correctly_rounded:.2%} of {published.size} coordinates")
    assert np.all(difference <= slack)
    assert not np.array_equal(published, base.astype(np.float64))
