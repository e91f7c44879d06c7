"""The aggregation server on a real SQLite file: in process (``TestClient``), and as a real
``fedper serve`` over sockets where only a process shows it (kill -9, bursts: marked ``slow``)."""

from __future__ import annotations

import io
import json
import struct
import time
from pathlib import Path

import httpx
import numpy as np
import pytest

from fedper.common import weights
from fedper.common.errors import ConfigError
from tests.support.server_support import (
    ENROLL,
    FakeClock,
    InProcessServer,
    admin,
    ask,
    base_like,
    enroll,
    round_info,
    serve,
    update_body,
)

# The mean as revision 1.3 defines it (clip, weight cap), which these tests check to the bit; the
# default's coordinate clip has its own tests (test_robust_aggregate.py, test_server_poisoning.py).
MEAN = {"coordinate_clip": 0}


@pytest.fixture
def server(server_artifacts: Path, tmp_path: Path):
    with InProcessServer(server_artifacts, tmp_path / "data", target_clients=3, min_clients=2, rounds=3,
                         round_timeout=0, enroll_per_minute=1000, **MEAN) as s:  # fmt: skip
        yield s


def test_full_protocol_flow_and_weighted_mean(server, server_manifest, server_artifacts):
    artifacts = server_artifacts
    http = server.http
    assert http.get("/v1/health").json() == {"status": "ok", "protocol": 1}
    devices = [enroll(http) for _ in range(3)]
    _, h0 = devices[0]
    task = http.get("/v1/task", headers=h0).json()
    assert task["round"] == 1 and task["model_version"] == 0 and task["base_url"] == "/v1/models/0/base"
    assert task["config"] == {
        "local_epochs": 1,
        "batch_size": 32,
        "learning_rate": 0.01,
        "momentum": 0.9,
    }
    assert task["deadline"] is None
    # Manifest and base downloads, with ETag / If-None-Match.
    m = http.get(task["manifest_url"], headers=h0)
    assert m.status_code == 200 and m.content == (artifacts / "manifest.json").read_bytes()
    base = http.get("/v1/models/0/base", headers=h0)
    assert base.status_code == 200 and base.headers["content-type"] == "application/octet-stream"
    assert base.content == (artifacts / "base.safetensors").read_bytes()
    again = http.get("/v1/models/0/base", headers={**h0, "If-None-Match": base.headers["etag"]})
    assert again.status_code == 304
    head = http.get("/v1/artifacts/head.safetensors", headers=h0)
    assert head.status_code == 200  # the exported initial head is public
    for bad in ("../manifest.json", "..%2Fmanifest.json", "state.db", "admin_token"):
        assert http.get(f"/v1/artifacts/{bad}", headers=h0).status_code == 404
    # Three devices upload; one in float16. The round closes at target_clients.
    updates, counts = [], [5, 20, 75]
    for i, ((_, h), n) in enumerate(zip(devices, counts, strict=True)):
        tensors = base_like(server_manifest, seed=i)
        dtype = np.float16 if i == 1 else np.float32
        if dtype is np.float16:
            tensors = {k: v.astype(np.float16).astype(np.float32) for k, v in tensors.items()}
        updates.append((tensors, n))
        body = update_body(tensors, n, 0, {"accuracy": 0.5 + i / 10, "train_loss": 1.0}, dtype=dtype)
        ask(http, h)  # a slot in round 1's cohort
        r = http.post("/v1/rounds/1/updates", content=body, headers=h)
        assert r.status_code == 202, r.text
        assert r.json() == {"round": 1, "accepted": True, "received": i + 1}
        if i == 0:
            assert http.get("/v1/task", headers=h).status_code == 204  # already counted
            assert "retry-after" in http.get("/v1/task", headers=h).headers
    closed = round_info(http, 1)
    assert closed["state"] == "closed" and closed["result_version"] == 1 and closed["received"] == 3
    acc = closed["metrics"]["accuracy"]
    assert acc["mean"] == pytest.approx(0.6)
    assert acc["weighted_mean"] == pytest.approx((0.5 * 5 + 0.6 * 20 + 0.7 * 75) / 100)
    v1 = http.get("/v1/models/1/base", headers=h0)
    got = weights.st_load_bytes(v1.content) if hasattr(weights, "st_load_bytes") else None
    from safetensors.numpy import load as st_load

    got = st_load(v1.content)
    # Revision 1.3's weight cap: at most 3x the lower median count (20), so 75 counts as 60. The
    # three updates are at similar distances from v0 (random tensors): none is clipped.
    capped = [(t, min(n, 3 * 20)) for t, n in updates]
    total = sum(n for _, n in capped)
    for name, _ in server_manifest.layout("base"):
        ref = sum(n * t[name].astype(np.float64) for t, n in capped) / total
        np.testing.assert_allclose(got[name], ref.astype(np.float32), rtol=1.2e-7, atol=1e-30)
    status = http.get("/v1/status").json()
    assert status == {"state": "running", "round": 2, "model_version": 1, "rounds_total": 3, "draining": False,
                      "rounds_closed": 1, "devices": 3, "privacy": None}  # fmt: skip
    assert http.get("/v1/task", headers=h0).json()["model_version"] == 1
    latest = http.get("/v1/admin/models/latest/base", headers=admin())
    assert latest.content == v1.content
    # Stored updates of an aggregated version are gone; the version file stays.
    assert not list((server.data_dir / "updates").glob("r1/*"))
    assert (server.data_dir / "models" / "v1.safetensors").exists()
    assert server.metric("fedper_updates_accepted_total") == 3
    assert server.metric("fedper_rounds_closed_total") == 1
    assert server.metric("fedper_bytes_received_total") > 0
    assert "/v1/rounds/{round_number}/updates" in http.get("/openapi.json").text


def _safetensors(header: dict, data: bytes) -> bytes:
    h = json.dumps(header).encode()
    return struct.pack("<Q", len(h)) + h + data


def test_every_rejection_class_changes_nothing(server, server_manifest):
    http = server.http
    _, h = enroll(http)
    ask(http, h)
    good = base_like(server_manifest)
    name0, shape0 = server_manifest.layout("base")[0]
    head_name, head_shape = server_manifest.layout("head")[0]

    def post(body: bytes, headers: dict | None = None, round_number: int = 1, **kw) -> httpx.Response:
        return http.post(f"/v1/rounds/{round_number}/updates", content=body,
                          headers=headers if headers is not None else h, **kw)  # fmt: skip

    cases = [
        (post(update_body(good), headers={}), 401, "unauthorized"),
        (post(update_body(good), headers={"Authorization": "Bearer nope"}), 401, "unauthorized"),
        (post(update_body(good), headers=admin()), 403, "forbidden"),
        (post(update_body(good), round_number=7), 404, "not_found"),
        (post(b"x" * (50 << 20)), 413, "payload_too_large"),
        (post(b"not safetensors"), 400, "malformed_safetensors"),
        (post(update_body(good)[:-5]), 400, "malformed_safetensors"),
        (post(struct.pack("<Q", 5) + b"{nope"), 400, "malformed_safetensors"),
        (post(_safetensors({"a": {"dtype": "F32", "shape": [2], "data_offsets": [0, 99]}}, b"\0" * 8)),
         400, "malformed_safetensors"),
        (post(_safetensors({"a": {"dtype": "F32", "shape": [2], "data_offsets": [0, 8]},
                            "b": {"dtype": "F32", "shape": [1], "data_offsets": [4, 8]}}, b"\0" * 8)),
         400, "malformed_safetensors"),
        (post(_safetensors({"a": {"dtype": "F32", "shape": [1], "data_offsets": [4, 8]}}, b"\0" * 8)),
         400, "malformed_safetensors"),
        (post(_safetensors({"a": {"dtype": "F32", "shape": [3], "data_offsets": [0, 8]}}, b"\0" * 8)),
         400, "malformed_safetensors"),
        (post(update_body({**good, head_name: np.zeros(head_shape, np.float32)})), 422, "personal_tensor_in_upload"),
        (post(update_body({k: v for k, v in good.items() if k != name0})), 422, "missing_tensor"),
        (post(update_body({**good, "extra.weight": np.zeros(3, np.float32)})), 422, "unexpected_tensor"),
        (post(update_body({**good, name0: np.zeros((1, *shape0), np.float32)})), 422, "wrong_shape"),
        (post(weights.encode({**good, name0: np.zeros(shape0, np.int32)},
                             {"num_samples": "3", "base_version": "0"}, dtype=None)), 422, "wrong_dtype"),
        (post(update_body({**good, name0: np.full(shape0, np.nan, np.float32)})), 422, "non_finite"),
        (post(update_body(good, num_samples=0)), 422, "num_samples_out_of_range"),
        (post(update_body(good, num_samples=100001)), 422, "num_samples_out_of_range"),
        (post(update_body(good, num_samples="3.5")), 422, "num_samples_out_of_range"),
        (post(update_body(good, base_version="latest")), 422, "bad_metadata"),
        (post(update_body(good, metrics={"Accuracy!": 0.5})), 422, "bad_metadata"),
        (post(update_body(good, metrics={"accuracy": "nan"})), 422, "bad_metadata"),
        (post(update_body(good, metrics={"accuracy": "NaN"})), 422, "bad_metadata"),  # Java's Float.toString
        (post(update_body(good, metrics={"accuracy": "inf"})), 422, "bad_metadata"),
        (post(update_body(good, metrics={"accuracy": "-Infinity"})), 422, "bad_metadata"),
        (post(update_body(good, base_version=3)), 409, "stale_base_version"),
    ]  # fmt: skip
    for response, status, code in cases:
        assert response.status_code == status, (code, response.text)
        assert response.json()["code"] == code
        assert response.json()["message"]

    # A chunked body over the limit is refused too (no Content-Length).
    def chunks():
        for _ in range(60):
            yield b"\0" * (1 << 20)

    r = http.post("/v1/rounds/1/updates", content=chunks(), headers=h)
    assert r.status_code == 413 and r.json()["code"] == "payload_too_large"
    # Nothing of the rejected uploads was kept: the round is untouched.
    assert round_info(http, 1)["received"] == 0
    assert not [p for p in (server.data_dir / "updates").rglob("*") if p.is_file()]
    ok = post(update_body(good))
    assert ok.status_code == 202
    dup = post(update_body(good))
    assert dup.status_code == 409 and dup.json()["code"] == "duplicate_update"
    # Device-only and operator-only endpoints.
    assert http.get("/v1/task", headers=admin()).status_code == 403
    assert http.post("/v1/admin/stop", headers=h).status_code == 403
    assert http.get("/v1/models/9/base", headers=h).status_code == 404
    assert http.get("/v1/rounds/9", headers=h).status_code == 404
    bad_enroll = http.post("/v1/devices", json={"enrollment_key": "wrong"})
    assert bad_enroll.status_code == 401 and bad_enroll.json()["code"] == "unauthorized"
    assert http.post("/v1/devices", content=b"{not json").status_code == 400
    assert round_info(http, 1)["received"] == 1


def test_round_not_open_revocation_and_stop(server, server_manifest):
    http = server.http
    devices = [enroll(http) for _ in range(4)]
    for _, h in devices[:3]:
        ask(http, h)
        assert (
            http.post("/v1/rounds/1/updates", content=update_body(base_like(server_manifest)), headers=h).status_code
            == 202
        )
    late = http.post(
        "/v1/rounds/1/updates",
        content=update_body(base_like(server_manifest)),
        headers=devices[3][1],
    )
    assert late.status_code == 409 and late.json()["code"] == "round_not_open"
    device_id, h = devices[3]
    assert http.post(f"/v1/admin/devices/{device_id}/revoke", headers=admin()).status_code == 200
    assert http.get("/v1/task", headers=h).status_code == 401
    assert http.post("/v1/admin/stop", headers=admin()).status_code == 200
    gone = http.get("/v1/task", headers=devices[0][1])
    assert gone.status_code == 410 and gone.json()["code"] == "run_finished"
    assert http.get("/v1/status").json()["state"] == "finished"


def test_enrollment_is_rate_limited(server_artifacts, tmp_path):
    artifacts = server_artifacts
    with InProcessServer(artifacts, tmp_path / "data", enroll_per_minute=3) as s:
        codes = [s.http.post("/v1/devices", json={"enrollment_key": ENROLL}).status_code for _ in range(4)]
        assert codes == [201, 201, 201, 429]
        r = s.http.post("/v1/devices", json={"enrollment_key": ENROLL})
        assert r.json()["code"] == "rate_limited" and int(r.headers["retry-after"]) >= 1


@pytest.mark.slow
def test_kill_9_between_uploads_loses_nothing(server_artifacts, server_manifest, tmp_path):
    artifacts = server_artifacts
    data = tmp_path / "data"
    s = serve(artifacts, data, target_clients=3, min_clients=3, round_timeout=0, **MEAN).start()
    http = s.http
    devices = [enroll(http) for _ in range(3)]
    for _, h in devices:
        ask(http, h)  # the slots survive the kill too
    tensors = [base_like(server_manifest, seed=i) for i in range(3)]
    for i in range(2):
        r = http.post(
            "/v1/rounds/1/updates",
            content=update_body(tensors[i], 10 * (i + 1)),
            headers=devices[i][1],
        )
        assert r.status_code == 202
    s.kill()
    s2 = serve(artifacts, data, target_clients=3, min_clients=3, round_timeout=0, **MEAN)
    s2.port, s2.url = s.port, s.url
    with s2:
        http = s2.http
        assert round_info(http, 1)["received"] == 2  # both updates survived kill -9
        dup = http.post(
            "/v1/rounds/1/updates",
            content=update_body(tensors[0], 10),
            headers=devices[0][1],
        )
        assert dup.json()["code"] == "duplicate_update"  # tokens still valid, still counted
        r = http.post(
            "/v1/rounds/1/updates",
            content=update_body(tensors[2], 30),
            headers=devices[2][1],
        )
        assert r.status_code == 202 and r.json()["received"] == 3
        from safetensors.numpy import load as st_load

        v1 = st_load(http.get("/v1/models/1/base", headers=devices[0][1]).content)
        name = server_manifest.layout("base")[0][0]
        ref = sum(n * t[name].astype(np.float64) for n, t in zip((10, 20, 30), tensors, strict=True)) / 60
        np.testing.assert_allclose(v1[name], ref, rtol=1.2e-7, atol=1e-30)


def _wait_for(check, timeout: float = 15.0) -> None:
    deadline = time.time() + timeout
    while not check():
        assert time.time() < deadline, "timed out"
        time.sleep(0.1)


def test_deadlines_close_or_abandon(server_artifacts, server_manifest, tmp_path):
    artifacts = server_artifacts
    clock = FakeClock()
    with InProcessServer(artifacts, tmp_path / "data", target_clients=5, min_clients=2, round_timeout=3,
                         clock=clock) as s:  # fmt: skip
        http = s.http
        devices = [enroll(http) for _ in range(3)]
        task = http.get("/v1/task", headers=devices[0][1]).json()
        assert task["deadline"].endswith("Z")
        http.post(
            "/v1/rounds/1/updates",
            content=update_body(base_like(server_manifest)),
            headers=devices[0][1],
        )
        # No request arrives meanwhile: the server's own timer abandons the round (1 < min_clients).
        clock.now += 3.1
        _wait_for(lambda: round_info(http, 1)["state"] != "open")
        r1 = round_info(http, 1)
        assert r1["state"] == "abandoned" and r1["result_version"] is None
        r2 = round_info(http, 2)
        assert r2["model_version"] == 0 and r2["state"] == "open"
        for _, h in devices[:2]:
            ask(http, h)
            assert (
                http.post(
                    "/v1/rounds/2/updates",
                    content=update_body(base_like(server_manifest)),
                    headers=h,
                ).status_code
                == 202
            )
        assert round_info(http, 2)["state"] == "open"  # 2 of 5: only the deadline closes it
        clock.now += 3.1
        _wait_for(lambda: round_info(http, 2)["state"] != "open")
        assert round_info(http, 2)["state"] == "closed" and round_info(http, 2)["result_version"] == 1
        assert round_info(http, 3)["model_version"] == 1


def test_a_round_that_would_not_fit_at_close_is_refused_at_start(server_artifacts, tmp_path):
    """The median holds every update of a round at its close: a cohort whose updates would not
    fit in --aggregation-memory is refused when the server starts, not at a close. The mean
    (with the default coordinate clip, spilled to a file) folds one at a time: any cohort."""
    from fedper.server.state import open_state
    from tests.support.server_support import serve_config

    options = {"target_clients": 2000, "min_clients": 1, "round_timeout": 0, "aggregation_memory": 64}
    with pytest.raises(ConfigError) as refused:
        open_state(serve_config(server_artifacts, tmp_path / "a", **options, aggregate="median"))
    message = str(refused.value)
    assert "2600 updates" in message and "--aggregation-memory 64 MB" in message and "--aggregate mean" in message
    state = open_state(serve_config(server_artifacts, tmp_path / "b", **options))  # the default: streamed
    state.db.close()
    state = open_state(serve_config(server_artifacts, tmp_path / "c", **{**options, "aggregation_memory": 4096},
                                    aggregate="median"))  # fmt: skip
    state.db.close()


def test_refuses_another_export_and_keeps_secrets(server_artifacts, tmp_path, monkeypatch):
    from fedper.server.config import ServerConfig
    from fedper.server.serve_command import announce
    from fedper.server.state import StartupError, open_state

    monkeypatch.delenv("FEDPER_ADMIN_TOKEN", raising=False)
    monkeypatch.delenv("FEDPER_ENROLLMENT_KEY", raising=False)
    artifacts, data = server_artifacts, tmp_path / "data"
    config = ServerConfig(artifacts=artifacts, data_dir=data)

    def start() -> str:
        """What ``fedper serve`` tells the operator at start, on this data directory."""
        state = open_state(config)
        out = io.StringIO()
        announce(config, state, out)
        state.db.close()
        return out.getvalue()

    first = start()
    assert first.count("generated admin_token") == 1 and first.count("generated enrollment_key") == 1
    token = (data / "admin_token").read_text().strip()
    assert (data / "admin_token").stat().st_mode & 0o777 == 0o600
    assert token in first and token not in json.dumps(list(data.iterdir()), default=str)
    again = start()
    assert "generated" not in again and "round 1, model version 0, running" in again  # printed once only
    # The stored token authenticates the operator of the restarted server.
    with InProcessServer(artifacts, data, secrets=False) as s:
        assert s.http.get("/v1/rounds/1", headers={"Authorization": f"Bearer {token}"}).status_code == 200
    other = tmp_path / "other"
    other.mkdir()
    for f in artifacts.iterdir():
        (other / f.name).write_bytes(f.read_bytes())
    server_manifest = json.loads((other / "manifest.json").read_text())
    server_manifest["training"]["learning_rate"] = 0.5
    (other / "manifest.json").write_text(json.dumps(server_manifest))
    with pytest.raises(StartupError, match="was made for another export"):
        open_state(ServerConfig(artifacts=other, data_dir=data))


@pytest.mark.slow
def test_fifty_concurrent_width1_devices(tmp_path):
    """50 devices upload MobileNet-V1 width-1.0 base updates at once: each accepted exactly
    once, the aggregate is the weighted mean, and server memory does not grow with uploads."""
    from concurrent.futures import ThreadPoolExecutor

    from safetensors.numpy import load as st_load

    from fedper.common.manifest import read_manifest
    from fedper.export.pipeline import write_server_only_export

    artifacts = write_server_only_export(tmp_path / "artifacts", alpha=1.0)
    manifest = read_manifest(artifacts)
    n = 50
    # The default: the mean behind the coordinate clip, whose updates are spilled to a file at close.
    with serve(artifacts, tmp_path / "data", target_clients=n, min_clients=n, round_timeout=0,
               enroll_per_minute=1000) as s:  # fmt: skip
        http = s.http
        devices = [enroll(http) for _ in range(n)]
        for _, h in devices:
            ask(http, h)
        base = base_like(manifest, seed=0)
        body0 = update_body(base)
        rss_start = s.rss_mb()

        def upload(i: int) -> httpx.Response:
            # Device i sends base + i, weighted by i + 1: the mean is known in closed form.
            tensors = {k: v + np.float32(i) for k, v in base.items()}
            body = update_body(tensors, num_samples=i + 1)
            with httpx.Client(timeout=120) as client:
                return client.post(f"{s.url}/v1/rounds/1/updates", content=body, headers=devices[i][1])

        with ThreadPoolExecutor(max_workers=16) as pool:
            first = list(pool.map(upload, range(10)))
            rss_10 = s.rss_mb()
            rest = list(pool.map(upload, range(10, n)))
        responses = first + rest
        assert [r.status_code for r in responses] == [202] * n
        assert sorted(r.json()["received"] for r in responses) == list(range(1, n + 1))
        rss_50 = s.rss_mb()
        info = round_info(http, 1)
        assert info["state"] == "closed" and info["received"] == n
        v1 = st_load(http.get("/v1/models/1/base", headers=devices[0][1]).content)
        weights_sum = sum(i + 1 for i in range(n))
        shift = sum((i + 1) * i for i in range(n)) / weights_sum
        for name, _ in manifest.layout("base")[:20]:
            np.testing.assert_allclose(v1[name], base[name].astype(np.float64) + shift, rtol=1e-6, atol=1e-6)
        # 40 more uploads of 8.7 MB each (350 MB) after the first 10: the server keeps at most
        # the (up to 16, 10 of them already counted) uploads in flight, and at close one stored
        # update loaded at a time (spilled to a file for the coordinate clip, then worked through
        # in 16 MB chunks of coordinates), so its peak moves by about 6 updates' worth plus chunks
        # and allocator slack, well under the 40 it would if memory grew with the number of uploads.
        update_mb = len(body0) / 2**20
        print(f"server peak RSS: start {rss_start:.0f} MB, after 10 {rss_10:.0f} MB, after 50 {rss_50:.0f} MB")
        assert rss_50 - rss_10 < 24 * update_mb, (rss_start, rss_10, rss_50)
