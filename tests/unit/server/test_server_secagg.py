"""``fedper serve --secagg`` (protocol revision 1.6, docs/SECAGG.md): a secure round over the
app's real routes, in process, on a test's clock; devices played by the protocol's own device
sessions with chosen deltas, so the server's result can be compared with plain FedAvg."""

from __future__ import annotations

import base64
import json
import threading
from pathlib import Path

import numpy as np
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from fedper.common import weights
from fedper.common.manifest import Manifest
from fedper.common.protocol import ErrorCode, Header
from fedper.common.secagg.device_session import Advertisement, DeviceSession
from fedper.common.secagg.fixed_point import FixedPoint
from fedper.server import process as server_process
from tests.support.server_support import FakeClock, InProcessServer, admin, enroll, round_info

pytestmark = pytest.mark.usefixtures("server_secrets")
WINDOW, STAGE, TIMEOUT = 5, 10, 120
CAN = {Header.CAPABILITIES: Header.SECAGG}


def _options(**more: object) -> dict[str, object]:
    return {"secagg": True, "checkin_window": WINDOW, "secagg_stage_timeout": STAGE, "round_timeout": TIMEOUT,
            "cohort_size": 20, "over_selection": 1.0, "target_clients": 20, "min_clients": 2, **more}  # fmt: skip


def _b64(data: bytes) -> str:
    return base64.b64encode(data).decode()


def _base(server: InProcessServer, version: int) -> dict[str, np.ndarray]:
    r = server.http.get(f"/v1/models/{version}/base", headers=admin())
    assert r.status_code == 200, r.text
    return weights.decode(r.content, f"version {version}")


def _flat(tensors: dict[str, np.ndarray], manifest: Manifest) -> np.ndarray:
    return np.concatenate([tensors[n].astype(np.float64).ravel() for n in manifest.base_names])


def _play_round(
    server: InProcessServer,
    clock: FakeClock,
    devices: list[tuple[str, dict[str, str]]],
    dropped: set[str],
    deltas: dict[str, np.ndarray],
    samples: dict[str, int],
) -> tuple[int, dict[str, object]]:
    """One secure round over the routes: every device checks in, advertises and shares; those in
    ``dropped`` quit then, the others send ``deltas`` (weighted by ``samples``) masked and answer
    the unmasking; then the server's clock ticks. Returns the round and its task's ``secagg``."""
    http = server.http
    for _, headers in devices:
        assert http.get("/v1/task", headers={**headers, **CAN}).status_code == 204  # checked in
    clock.now += WINDOW
    tasks = {}
    for device_id, headers in devices:
        r = http.get("/v1/task", headers={**headers, **CAN})
        assert r.status_code == 200, r.text
        tasks[device_id] = r.json()
    task = next(iter(tasks.values()))
    secagg, n = task["secagg"], task["round"]
    sessions = {d: DeviceSession(d, secagg["session"].encode()) for d, _ in devices}
    headers_of = dict(devices)
    for d, s in sessions.items():
        a = s.advertise()
        r = http.post(f"/v1/rounds/{n}/secagg/keys", headers=headers_of[d],
                      json={"channel_key": _b64(a.channel), "mask_key": _b64(a.mask)})  # fmt: skip
        assert r.status_code == 202, r.text
    # One session per device and round: asking for the task again gets no task (204).
    assert http.get("/v1/task", headers={**headers_of[d], **CAN}).status_code == 204
    for d, s in sessions.items():
        r = http.get(f"/v1/rounds/{n}/secagg/keys", headers=headers_of[d])
        assert r.status_code == 200, r.text
        body = r.json()
        neighbours = {m: Advertisement(base64.b64decode(k["channel_key"]), base64.b64decode(k["mask_key"]))
                      for m, k in body["neighbours"].items()}  # fmt: skip
        sealed = s.share_keys(neighbours, body["threshold"])
        r = http.post(f"/v1/rounds/{n}/secagg/shares", headers=headers_of[d],
                      json={"shares": {m: _b64(c) for m, c in sealed.items()}})  # fmt: skip
        assert r.status_code == 202, r.text
    for d, s in sessions.items():
        r = http.get(f"/v1/rounds/{n}/secagg/shares", headers=headers_of[d])
        assert r.status_code == 200, r.text
        s.receive_shares({m: base64.b64decode(c) for m, c in r.json()["shares"].items()})
    fixed = FixedPoint(secagg["clip_norm"], secagg["cohort"], secagg["weight_cap"])
    survivors = [d for d in sessions if d not in dropped]
    for d in survivors:
        masked = sessions[d].masked_input(fixed.encode(deltas[d], samples[d]))
        r = http.post(f"/v1/rounds/{n}/secagg/masked", headers={**headers_of[d], "Content-Type": "application/octet-stream"},
                      content=masked.astype("<u4").tobytes())  # fmt: skip
        assert r.status_code == 202, r.text
    if dropped:  # the masked stage waits for those that dropped until its end
        assert http.get(f"/v1/rounds/{n}/secagg/unmask", headers=headers_of[survivors[0]]).status_code == 204
    clock.now += TIMEOUT - STAGE
    for d in survivors:
        r = http.get(f"/v1/rounds/{n}/secagg/unmask", headers=headers_of[d])
        if r.status_code == 409 and r.json()["code"] == ErrorCode.SECAGG_STAGE_CLOSED:
            continue  # left out of the sum (docs/SECAGG.md, "Who is in the sum")
        assert r.status_code == 200, r.text
        ask_for = r.json()
        answer = sessions[d].unmask(ask_for["dropped"], ask_for["survivors"])
        r = http.post(f"/v1/rounds/{n}/secagg/unmask", headers=headers_of[d],
                      json={"shares": {m: _b64(v) for m, v in answer.items()}})  # fmt: skip
        assert r.status_code == 202, r.text
    assert server.state is not None
    server.state.rounds.tick()
    return n, secagg


def _chosen_deltas(
    devices: list[tuple[str, dict[str, str]]], words: int, clip: float, rng: np.random.Generator
) -> tuple[dict[str, np.ndarray], dict[str, int]]:
    """A delta of norm 0.9 x clip and a sample count for each device."""
    deltas, samples = {}, {}
    for d, _ in devices:
        delta = rng.normal(size=words)
        deltas[d] = delta * (0.9 * clip / np.linalg.norm(delta))
        samples[d] = int(rng.integers(10, 200))
    return deltas, samples


def test_twenty_devices_three_dropping_after_sharing_keys_publish_the_survivors_fedavg(
    server_artifacts: Path, server_manifest: Manifest, tmp_path: Path
) -> None:
    clock = FakeClock()
    words = sum(int(np.prod(shape)) for _, shape in server_manifest.layout("base"))
    with InProcessServer(server_artifacts, tmp_path / "data", clock=clock, **_options()) as server:
        http = server.http
        devices = [enroll(http) for _ in range(20)]
        r = http.get("/v1/task", headers=devices[0][1])
        assert r.status_code == 403 and r.json()["code"] == ErrorCode.SECAGG_UNSUPPORTED
        deltas, samples = _chosen_deltas(devices, words, 1.0, np.random.default_rng(3))  # --secagg-clip's default
        dropped = {d for d, _ in sorted(devices)[:3]}
        n, secagg = _play_round(server, clock, devices, dropped, deltas, samples)
        assert (secagg["cohort"], secagg["neighbours"], secagg["threshold"]) == (20, 10, 6)
        info = round_info(http, n)
        assert info["state"] == "closed", info
        before, after = _flat(_base(server, 0), server_manifest), _flat(_base(server, 1), server_manifest)
        fixed = FixedPoint(secagg["clip_norm"], secagg["cohort"], secagg["weight_cap"])  # type: ignore[arg-type]
        survivors = [d for d, _ in devices if d not in dropped]
        w = np.array([min(samples[d], fixed.weight_cap) for d in survivors], dtype=np.float64)
        fedavg = before + sum(wi * deltas[d] for wi, d in zip(w, survivors, strict=True)) / w.sum()
        # float32 rounding of the published base on top of the fixed-point bound
        bound = fixed.error_bound(len(survivors), int(w.sum())) + np.spacing(np.abs(fedavg).astype(np.float32)).max()
        difference = float(np.max(np.abs(after - fedavg)))
        print(f"max abs difference {difference:.3g}, bound {bound:.3g}")
        assert difference <= bound
        # /metrics counts a masked input as an accepted update, and the stages' messages as traffic.
        assert server.metric("fedper_updates_accepted_total") == len(survivors)
        assert server.metric("fedper_bytes_received_total") > len(survivors) * 4 * (words + 1)
        assert server.metric("fedper_bytes_sent_total") > 0  # the relayed keys, shares and unmasking requests
        # The round's stages as /metrics and the dashboard report them: 20 advertised keys and sent
        # shares, the 17 survivors' masked inputs, and their unmasking answers.
        text = http.get("/metrics").text
        stages = {s: server_process.metric_sample(text, "fedper_last_round_secure_messages", stage=s)
                  for s in ("keys", "shares", "masked", "unmask")}  # fmt: skip
        assert stages == {"keys": 20, "shares": 20, "masked": len(survivors), "unmask": len(survivors)}, stages
        row = http.get("/dashboard/data", headers=admin()).json()["rounds"][0]
        assert row["secure_stages"] == stages and row["drawn"] == 20, row


def test_a_round_whose_masks_cannot_be_removed_is_abandoned_and_the_next_one_runs(
    server_artifacts: Path, server_manifest: Manifest, tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    """Item 4 of issue 32: with fewer than t neighbours of a dropped device left, its mask cannot
    be removed; the round ends unaggregated (nothing published, its files gone) and the next
    round trains the same version, which then closes normally."""
    clock = FakeClock()
    words = sum(int(np.prod(shape)) for _, shape in server_manifest.layout("base"))
    options = _options(cohort_size=6, target_clients=6, secagg_neighbours=4, secagg_threshold=3)
    with InProcessServer(server_artifacts, tmp_path / "data", clock=clock, **options) as server:
        devices = [enroll(server.http) for _ in range(6)]
        deltas, samples = _chosen_deltas(devices, words, 1.0, np.random.default_rng(5))
        dropped = {d for d, _ in devices[2:]}  # 2 survivors: no dropped device keeps 3 neighbours
        n, secagg = _play_round(server, clock, devices, dropped, deltas, samples)
        assert (secagg["neighbours"], secagg["threshold"]) == (4, 3)
        assert round_info(server.http, n)["state"] == "abandoned"
        failed = [json.loads(r.message) for r in caplog.records if "secure_round_failed" in r.message]
        # Each survivor holds shares of dropped devices that have fewer than 3 holders left: their
        # masks cannot be removed, so they leave the sum, and nothing is left in it.
        assert len(failed) == 1 and "no device's masked input is in the sum" in failed[0]["reason"], failed
        assert "no device's masked input is in the sum" in round_info(server.http, n)["reason"]
        assert server.http.get("/v1/models/1/base", headers=admin()).status_code == 404  # nothing half-applied
        assert not list((tmp_path / "data" / "updates").rglob("*.masked"))
        nxt = round_info(server.http, n + 1)
        assert nxt["state"] == "open" and nxt["model_version"] == 0, nxt
        n2, _ = _play_round(server, clock, devices, set(), deltas, samples)
        assert n2 == n + 1 and round_info(server.http, n2)["state"] == "closed"
        before, after = _flat(_base(server, 0), server_manifest), _flat(_base(server, 1), server_manifest)
    w = {d: min(samples[d], 1000) for d, _ in devices}
    fedavg = before + sum(w[d] * deltas[d] for d in w) / sum(w.values())
    assert np.max(np.abs(after - fedavg)) <= 1e-6


JSONISH = st.recursive(
    st.none() | st.booleans() | st.integers() | st.floats(allow_nan=False) | st.text(max_size=40),
    lambda inner: st.lists(inner, max_size=4) | st.dictionaries(st.text(max_size=12), inner, max_size=4),
    max_leaves=12,
)


def _in_keys_stage(server: InProcessServer, clock: FakeClock) -> tuple[int, list[tuple[str, dict[str, str]]]]:
    devices = [enroll(server.http) for _ in range(4)]
    for _, headers in devices:
        assert server.http.get("/v1/task", headers={**headers, **CAN}).status_code == 204
    clock.now += WINDOW
    for _, headers in devices:
        assert server.http.get("/v1/task", headers={**headers, **CAN}).status_code == 200
    return 1, devices


@settings(max_examples=120, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(stage=st.sampled_from(["keys", "shares", "masked", "unmask"]), data=st.data())
def test_whatever_a_device_sends_a_stage_is_a_4xx_or_accepted_never_a_5xx(
    secure_server: tuple[InProcessServer, FakeClock, list[tuple[str, dict[str, str]]]],
    stage: str,
    data: st.DataObject,
) -> None:
    """Generated bodies (JSON of any shape, fields of the right names with generated values, raw
    bytes) against every stage's POST: a JSON 4xx with a code, or 202 for a message that fits;
    a refused one stores nothing."""
    server, _clock, devices = secure_server
    assert server.state is not None
    headers = devices[data.draw(st.integers(0, len(devices) - 1))][1]
    fields = {"keys": ["channel_key", "mask_key"], "shares": ["shares"], "unmask": ["shares"], "masked": []}[stage]
    body = data.draw(st.one_of(
        st.binary(max_size=300),
        JSONISH.map(lambda v: json.dumps(v).encode()),
        st.fixed_dictionaries({f: JSONISH | st.binary(max_size=40).map(_b64) for f in fields}).map(
            lambda v: json.dumps(v).encode()),
    ))  # fmt: skip
    before = server.state.db.secagg.messages(1)
    r = server.http.post(f"/v1/rounds/1/secagg/{stage}", headers=headers, content=body)
    assert r.status_code < 500, r.text
    if r.status_code != 202:
        assert 400 <= r.status_code < 500 and r.json()["code"] and r.json()["message"], r.text
        assert server.state.db.secagg.messages(1) == before


@pytest.fixture(scope="module")
def secure_server(server_artifacts: Path, tmp_path_factory: pytest.TempPathFactory):  # type: ignore[no-untyped-def]
    from tests.support.server_support import ADMIN, ENROLL

    mp = pytest.MonkeyPatch()
    mp.setenv("FEDPER_ADMIN_TOKEN", ADMIN)
    mp.setenv("FEDPER_ENROLLMENT_KEY", ENROLL)
    clock = FakeClock()
    options = _options(cohort_size=4, target_clients=4, enroll_per_minute=10**6, auth_failures_per_minute=10**6)
    with InProcessServer(server_artifacts, tmp_path_factory.mktemp("secure") / "data", clock=clock, **options) as s:
        _, devices = _in_keys_stage(s, clock)
        yield s, clock, devices
    mp.undo()


def test_dp_inside_a_secure_round_noises_the_unmasked_sum_over_the_expected_cohort(
    server_artifacts: Path, server_manifest: Manifest, tmp_path: Path
) -> None:
    """``--secagg --dp``: every drawn device is in the session (its coin came up), weights are
    equal (cap 1), each device's unclipped bit is a word of its masked input, and the server
    noises the unmasked sum and divides by the expected cohort. Without noise (z = 0) the
    published base is the base plus the survivors' sum over the expected cohort; the bits' count
    moved the clip as adaptive clipping does."""
    clock = FakeClock()
    options = _options(cohort_size=6, target_clients=6, dp=True, dp_noise_multiplier=0.0, dp_clip=0.5,
                       dp_count_stddev=1e-9, dp_sampling_probability=1.0)  # fmt: skip
    with InProcessServer(server_artifacts, tmp_path / "data", clock=clock, **options) as server:
        http = server.http
        devices = [enroll(http) for _ in range(6)]
        for _, headers in devices:
            assert http.get("/v1/task", headers={**headers, **CAN}).status_code == 204
        clock.now += WINDOW
        tasks = {d: http.get("/v1/task", headers={**h, **CAN}).json() for d, h in devices}
        secagg = next(iter(tasks.values()))["secagg"]
        assert secagg["weight_cap"] == 1 and secagg["clip_norm"] == 0.5
        assert all(t["dp"]["clip_norm"] == 0.5 for t in tasks.values())
        sessions = {d: DeviceSession(d, secagg["session"].encode()) for d, _ in devices}
        headers_of = dict(devices)
        for d, s in sessions.items():
            a = s.advertise()
            http.post("/v1/rounds/1/secagg/keys", headers=headers_of[d],
                      json={"channel_key": _b64(a.channel), "mask_key": _b64(a.mask)})  # fmt: skip
        for d, s in sessions.items():
            body = http.get("/v1/rounds/1/secagg/keys", headers=headers_of[d]).json()
            neighbours = {m: Advertisement(base64.b64decode(k["channel_key"]), base64.b64decode(k["mask_key"]))
                          for m, k in body["neighbours"].items()}  # fmt: skip
            sealed = s.share_keys(neighbours, body["threshold"])
            http.post("/v1/rounds/1/secagg/shares", headers=headers_of[d],
                      json={"shares": {m: _b64(c) for m, c in sealed.items()}})  # fmt: skip
        for d, s in sessions.items():
            shares = http.get("/v1/rounds/1/secagg/shares", headers=headers_of[d]).json()["shares"]
            s.receive_shares({m: base64.b64decode(c) for m, c in shares.items()})
        fixed = FixedPoint(0.5, 6, 1, flags=1)
        words = sum(int(np.prod(shape)) for _, shape in server_manifest.layout("base"))
        rng = np.random.default_rng(9)
        survivors = sorted(sessions)[1:]  # the first drops after sharing
        deltas, bits = {}, {}
        for i, d in enumerate(survivors):
            delta = rng.normal(size=words)
            deltas[d] = delta * (0.5 * (0.5 if i % 2 else 1.0) / np.linalg.norm(delta))
            bits[d] = i % 2  # within the clip before clipping, or clipped to it
            masked = sessions[d].masked_input(fixed.encode(deltas[d], 40, (bits[d],)))
            r = http.post("/v1/rounds/1/secagg/masked", headers={**headers_of[d], "Content-Type": "application/octet-stream"},
                          content=masked.astype("<u4").tobytes())  # fmt: skip
            assert r.status_code == 202, r.text
        clock.now += TIMEOUT - STAGE
        for d in survivors:
            ask_for = http.get("/v1/rounds/1/secagg/unmask", headers=headers_of[d]).json()
            answer = sessions[d].unmask(ask_for["dropped"], ask_for["survivors"])
            http.post("/v1/rounds/1/secagg/unmask", headers=headers_of[d],
                      json={"shares": {m: _b64(v) for m, v in answer.items()}})  # fmt: skip
        assert server.state is not None
        server.state.rounds.tick()
        assert round_info(http, 1)["state"] == "open"  # unmasked, but a DP round is published at its deadline
        clock.now += STAGE
        server.state.rounds.tick()
        assert round_info(http, 1)["state"] == "closed"
        before, after = _flat(_base(server, 0), server_manifest), _flat(_base(server, 1), server_manifest)
        expected = before + sum(deltas.values()) / 6  # the expected cohort, not the 5 that reported
        bound = 5 / (2 * fixed.scale) / 6 + np.spacing(np.abs(expected).astype(np.float32)).max()
        assert np.max(np.abs(after - expected)) <= bound
        privacy = http.get("/v1/status").json()["privacy"]
        unclipped = sum(bits.values())  # 2 of 5: share (2 - 2.5) / 6 + 0.5, the clip moves up
        share = (unclipped - len(survivors) / 2) / 6 + 0.5
        assert privacy["rounds"] == 1
        assert privacy["clip_norm"] == pytest.approx(0.5 * np.exp(-0.2 * (share - 0.5)), rel=1e-6)


def test_a_secure_round_survives_restarts_between_its_stages(
    server_artifacts: Path, server_manifest: Manifest, tmp_path: Path
) -> None:
    """The server is stopped and started again (same data directory) after the share stage and
    after the masked inputs: the session is replayed from what it stored, and the round ends as
    if nothing had happened; what a device sent before a restart is a duplicate after it."""
    clock = FakeClock()
    options = _options(cohort_size=5, target_clients=5)
    data = tmp_path / "data"

    def server() -> InProcessServer:
        return InProcessServer(server_artifacts, data, clock=clock, **options)

    with server() as s:
        devices = [enroll(s.http) for _ in range(5)]
        for _, headers in devices:
            assert s.http.get("/v1/task", headers={**headers, **CAN}).status_code == 204
        clock.now += WINDOW
        tasks = [s.http.get("/v1/task", headers={**h, **CAN}).json() for _, h in devices]
        secagg = tasks[0]["secagg"]
        sessions = {d: DeviceSession(d, secagg["session"].encode()) for d, _ in devices}
        headers_of = dict(devices)
        for d, ds in sessions.items():
            a = ds.advertise()
            s.http.post("/v1/rounds/1/secagg/keys", headers=headers_of[d],
                        json={"channel_key": _b64(a.channel), "mask_key": _b64(a.mask)})  # fmt: skip
        for d, ds in sessions.items():
            body = s.http.get("/v1/rounds/1/secagg/keys", headers=headers_of[d]).json()
            neighbours = {m: Advertisement(base64.b64decode(k["channel_key"]), base64.b64decode(k["mask_key"]))
                          for m, k in body["neighbours"].items()}  # fmt: skip
            sealed = ds.share_keys(neighbours, body["threshold"])
            r = s.http.post("/v1/rounds/1/secagg/shares", headers=headers_of[d],
                            json={"shares": {m: _b64(c) for m, c in sealed.items()}})  # fmt: skip
            assert r.status_code == 202
    fixed = FixedPoint(secagg["clip_norm"], secagg["cohort"], secagg["weight_cap"])
    words = sum(int(np.prod(shape)) for _, shape in server_manifest.layout("base"))
    rng = np.random.default_rng(11)
    deltas = {d: (lambda v: v * (0.5 / np.linalg.norm(v)))(rng.normal(size=words)) for d in sessions}
    sent: dict[str, bytes] = {}
    with server() as s:  # restarted: the shares are relayed from what was stored
        for d, ds in sessions.items():
            shares = s.http.get("/v1/rounds/1/secagg/shares", headers=headers_of[d]).json()["shares"]
            ds.receive_shares({m: base64.b64decode(c) for m, c in shares.items()})
            sent[d] = ds.masked_input(fixed.encode(deltas[d], 50)).astype("<u4").tobytes()
            r = s.http.post("/v1/rounds/1/secagg/masked", headers={**headers_of[d], "Content-Type": "application/octet-stream"},
                            content=sent[d])  # fmt: skip
            assert r.status_code == 202, r.text
    with server() as s:  # restarted again: the running sum is rebuilt from the stored masked inputs
        first = sorted(sessions)[0]
        r = s.http.post("/v1/rounds/1/secagg/masked", headers={**headers_of[first], "Content-Type": "application/octet-stream"},
                        content=bytes(4 * (words + 1)))  # fmt: skip
        assert r.status_code == 409 and r.json()["code"] == ErrorCode.DUPLICATE_UPDATE  # the stored one counts
        # ... and stays stored: a second, different input must not replace the file the next replay reads.
        assert (data / "updates" / "r1" / f"{first}.masked").read_bytes() == sent[first]
        for d, ds in sessions.items():
            ask_for = s.http.get("/v1/rounds/1/secagg/unmask", headers=headers_of[d]).json()
            answer = ds.unmask(ask_for["dropped"], ask_for["survivors"])
            s.http.post("/v1/rounds/1/secagg/unmask", headers=headers_of[d],
                        json={"shares": {m: _b64(v) for m, v in answer.items()}})  # fmt: skip
        assert s.state is not None
        s.state.rounds.tick()
        assert round_info(s.http, 1)["state"] == "closed"
        before, after = _flat(_base(s, 0), server_manifest), _flat(_base(s, 1), server_manifest)
    expected = before + sum(deltas.values()) / 5  # equal samples: the plain mean
    bound = fixed.error_bound(5, 250) + np.spacing(np.abs(expected).astype(np.float32)).max()
    assert np.max(np.abs(after - expected)) <= bound
    assert not list((data / "updates").rglob("*.masked"))  # the round's files went with it


def test_a_reader_rebuilding_the_session_cannot_drop_a_message_posted_meanwhile(
    server_artifacts: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The session cache is rebuilt from the stored messages by readers that do not hold the
    rounds' lock (a task's took_part, a 204's retry_after). A rebuild that read the messages
    before a device's keys were stored must not replace the session that holds them: the device
    would be out of the round although the server accepted its keys (one device silently left
    out, as CI saw). Here the reader is held inside its read while the keys are posted."""
    clock = FakeClock()
    with InProcessServer(
        server_artifacts, tmp_path / "data", clock=clock, **_options(cohort_size=2, target_clients=2)
    ) as server:
        http = server.http
        devices = [enroll(http) for _ in range(2)]
        for _, headers in devices:
            assert http.get("/v1/task", headers={**headers, **CAN}).status_code == 204
        clock.now += WINDOW
        tasks = [http.get("/v1/task", headers={**h, **CAN}).json() for _, h in devices]
        n, secagg = tasks[0]["round"], tasks[0]["secagg"]
        assert server.state is not None
        secure = server.state.rounds.secure
        assert secure is not None
        secure._cached = None  # as after the draw: the next reader rebuilds
        entered, release = threading.Event(), threading.Event()
        read = secure.db.secagg.messages_after

        def held(number: int, after: int) -> object:
            found = read(number, after)
            if threading.current_thread().name == "reader":
                entered.set()
                release.wait(10)
            return found

        monkeypatch.setattr(secure.db.secagg, "messages_after", held)
        reader = threading.Thread(target=secure.took_part, args=(n, "d-nobody"), name="reader")
        reader.start()
        assert entered.wait(10)
        device, headers = devices[0]
        advert = DeviceSession(device, secagg["session"].encode()).advertise()
        answers: list[int] = []
        post = threading.Thread(target=lambda: answers.append(http.post(
            f"/v1/rounds/{n}/secagg/keys", headers=headers,
            json={"channel_key": _b64(advert.channel), "mask_key": _b64(advert.mask)}).status_code))  # fmt: skip
        post.start()
        post.join(0.5)  # it waits for the reader's rebuild
        release.set()
        reader.join(10)
        post.join(10)
        assert answers == [202]
        found = secure.session(n)
        assert found is not None and device in found[1].advertised
        assert http.get("/v1/task", headers={**headers, **CAN}).status_code == 204  # it took part: no second task
