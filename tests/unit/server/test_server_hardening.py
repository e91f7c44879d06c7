"""The server against hostile and unlucky clients, on a real SQLite file: one test per way the
server could be bricked, wedged, flooded or tricked. In process (``TestClient``) unless only a
``fedper serve`` process over sockets shows it (kill -9, timeouts, bursts, proxy headers,
malformed HTTP: marked ``slow``)."""

from __future__ import annotations

import json
import socket
import struct
import time
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import httpx
import numpy as np
import pytest
from safetensors.numpy import load as st_load

from fedper.common import weights
from tests.support.server_support import InProcessServer, admin, ask, base_like, enroll, round_info, serve, update_body


def _post(http: httpx.Client, body: bytes, headers: dict, number: int = 1) -> httpx.Response:
    """As a device does: ask for the task (a slot in the open round's cohort; whatever the
    answer), then upload."""
    http.get("/v1/task", headers=headers)
    return http.post(f"/v1/rounds/{number}/updates", content=body, headers=headers)


def _safetensors_raw(header: str, data: bytes) -> bytes:
    h = header.encode("utf-8", "surrogatepass")
    return struct.pack("<Q", len(h)) + h + data


def _leftovers(data: Path) -> list[str]:
    """Files under tmp/ and updates/ (accepted updates of the open round excluded by the caller)."""
    return sorted(str(p.relative_to(data)) for d in ("tmp", "updates") for p in (data / d).rglob("*"))


def _assert_json_error(r: httpx.Response, status: int | tuple[int, ...], code: str | None = None) -> None:
    statuses = (status,) if isinstance(status, int) else status
    assert r.status_code in statuses, (r.status_code, r.text[:300])
    body = r.json()
    assert body["message"] and (code is None or body["code"] == code), body


@pytest.mark.slow
def test_headers_the_loader_refuses_are_refused_and_the_server_always_restarts(
    server_artifacts, server_manifest, tmp_path
):
    data = tmp_path / "data"
    name, shape = server_manifest.layout("base")[0]
    size = int(np.prod(shape)) * 4
    good = base_like(server_manifest)
    valid_entry = f'"{name}": {{"dtype": "F32", "shape": {list(shape)}, "data_offsets": [0, {size}]}}'
    hostile = {
        "boolean offset": f'{{"{name}": {{"dtype": "F32", "shape": {list(shape)}, "data_offsets": [false, {size}]}}}}',
        "NaN in an extra field": f'{{"{name}": {{"dtype": "F32", "shape": {list(shape)}, "data_offsets": [0, {size}], "x": NaN}}}}',
        "true in a shape": f'{{"{name}": {{"dtype": "F32", "shape": [true, {size // 4}], "data_offsets": [0, {size}]}}}}',
        "deep nesting": '{"__metadata__": ' + "[" * 50_000 + "]" * 50_000 + f", {valid_entry}}}",
        "huge integer": f'{{"{name}": {{"dtype": "F32", "shape": [{"9" * 5000}], "data_offsets": [0, {size}]}}}}',
        "lone surrogate name": f'{{"\\ud800": {{"dtype": "F32", "shape": {list(shape)}, "data_offsets": [0, {size}]}}}}',
        "duplicate key": f"{{{valid_entry}, {valid_entry}}}",
        "infinite number": f'{{"{name}": {{"dtype": "F32", "shape": {list(shape)}, "data_offsets": [0, 1e999]}}}}',
        "null metadata": f'{{"__metadata__": null, {valid_entry}}}',
    }
    with serve(server_artifacts, data, target_clients=3, round_timeout=0) as s:
        _, h = enroll(s.http)
        for what, header in hostile.items():
            r = _post(s.http, _safetensors_raw(header, b"\0" * size), h)
            assert r.status_code == 400, (what, r.status_code, r.text[:200])
            assert r.json()["code"] == "malformed_safetensors", what
        # An F16 upload with a padded header is accepted; what is stored is the server's own
        # F32 encoding, which the library loads back.
        body = update_body({k: v.astype(np.float16).astype(np.float32) for k, v in good.items()}, dtype=np.float16)
        assert _post(s.http, body, h).status_code == 202
        stored = list((data / "updates" / "r1").iterdir())
        assert len(stored) == 1 and stored[0].read_bytes() != body
        loaded = st_load(stored[0].read_bytes())
        assert {v.dtype for v in loaded.values()} == {np.dtype("float32")}
        s.kill()
        s.start()  # restarts on what it stored
        assert round_info(s.http, 1)["received"] == 1
    assert not (data / "quarantine").exists()  # nothing needed quarantining


@pytest.mark.slow
def test_an_unloadable_stored_update_is_quarantined_and_the_server_starts(server_artifacts, server_manifest, tmp_path):
    data = tmp_path / "data"
    s = serve(server_artifacts, data, target_clients=3, round_timeout=0).start()
    devices = [enroll(s.http) for _ in range(2)]
    for i, (_, h) in enumerate(devices):
        assert _post(s.http, update_body(base_like(server_manifest, seed=i)), h).status_code == 202
    s.kill()
    # What a crash or a bad disk can leave: a stored update the library cannot read, temp files,
    # an unrecorded file in the open round's folder, a folder of a finished round.
    victim = data / "updates" / "r1" / f"{devices[0][0]}.safetensors"
    victim.write_bytes(b'\x10\x00\x00\x00\x00\x00\x00\x00{"a": NaN}     ')
    (data / "tmp" / "tmpabc.body").write_bytes(b"\0" * 70_000)
    (data / "updates" / "r1" / "d-stray.safetensors").write_bytes(b"stray")
    (data / "updates" / "r0").mkdir()
    s.start()
    try:
        assert round_info(s.http, 1)["received"] == 1  # recomputed without the unloadable one
        assert [p.name.split(".")[0] for p in (data / "quarantine").iterdir()] == [f"r1-{devices[0][0]}"]
        assert _leftovers(data) == ["updates/r1", f"updates/r1/{devices[1][0]}.safetensors"]
        # Its device is no longer counted, so it can send its update again.
        assert _post(s.http, update_body(base_like(server_manifest, seed=0)), devices[0][1]).status_code == 202
        assert "update_quarantined" in s.log.read_text()
    finally:
        s.stop()


@pytest.mark.slow
def test_bursts_across_the_close_boundary_never_wedge_the_run(server_artifacts, server_manifest, tmp_path):
    """Four rounds in a row: 30 devices upload at once into a round that closes at 3, while
    10 more send near-limit garbage. Every answer is 202, 409 or 400; the run moves on. (A
    cohort of 31, 41 slots: every device holds a slot, so the race is the close, not the cohort.)"""
    data = tmp_path / "data"
    with serve(server_artifacts, data, target_clients=3, min_clients=1, round_timeout=0, rounds=10,
                       enroll_per_minute=1000, max_inflight_uploads=64, cohort_size=31) as s:  # fmt: skip
        devices = [enroll(s.http) for _ in range(30)]
        senders = [enroll(s.http) for _ in range(10)]  # of garbage (slots: 31 x 1.3 = 41)
        limit = 4 * (server_artifacts / "base.safetensors").stat().st_size
        garbage = b"\x07" * (limit - 16)
        for burst in range(4):
            number, version = burst + 1, burst
            tasks = [s.http.get("/v1/task", headers=h).json() for _, h in devices]
            assert {(t["round"], t["model_version"]) for t in tasks} == {(number, version)}
            # Other tensors every round, as trained updates would be: with the same ones, the same
            # three winners twice in a row make a step of 0, and a later round's ordinary step then
            # fails the publish check (more than 10 x the median step; CI saw it once).
            bodies = [update_body(base_like(server_manifest, seed=100 * burst + i), 10, version) for i in range(30)]

            def upload(i: int, bodies: list[bytes] = bodies, number: int = number) -> int:
                if i >= 30:
                    return _post(s.http, garbage, senders[i - 30][1], number).status_code
                return _post(s.http, bodies[i], devices[i][1], number).status_code

            with ThreadPoolExecutor(max_workers=40) as pool:
                codes = list(pool.map(upload, range(40)))
            assert codes[:30].count(202) == 3 and set(codes[:30]) == {202, 409}, codes
            # 400, or 409 round_not_open for garbage that came after the close (revision 1.4 answers
            # the conflicts that need no body before reading it)
            assert set(codes[30:]) <= {400, 409}, codes
            closed = round_info(s.http, number)
            assert closed["state"] == "closed" and closed["received"] == 3
            assert round_info(s.http, number + 1)["state"] == "open"
            assert _leftovers(data) == []
        assert s.http.get("/v1/status").json()["rounds_closed"] == 4
        assert "Traceback" not in s.log.read_text()


def test_bad_input_anywhere_is_a_json_4xx(server_artifacts, server_manifest, tmp_path):
    huge = str(2**63)
    with InProcessServer(server_artifacts, tmp_path / "data", round_timeout=0) as s:
        _, h = enroll(s.http)
        for path in (f"/v1/models/{huge}/base", f"/v1/rounds/{huge}", f"/v1/models/{'9' * 5000}/base",
                     "/v1/models/-1/base", "/v1/rounds/1e3", "/v1/artifacts/%ED%A0%80"):  # fmt: skip
            _assert_json_error(s.http.get(path, headers=h), 404, "not_found")
        _assert_json_error(_post(s.http, update_body(base_like(server_manifest)), h, 2**64), 404, "not_found")
        for body in (b"[" * 30_000 + b"]" * 30_000, b'{"enrollment_key": ' + b"9" * 10_000 + b"}",
                     b'{"enrollment_key": "x", "platform": "\\udc80"}', b'{"a": 1, "a": 2}', b"\xff\xfe",
                     b'{"enrollment_key": NaN}', b'{"platform": "' + b"p" * 1000 + b'"}'):  # fmt: skip
            r = s.http.post("/v1/devices", content=body)
            _assert_json_error(r, 400)
        _assert_json_error(s.http.post("/v1/devices", content=b"x" * 70_000), 413, "payload_too_large")
        _assert_json_error(s.http.put("/v1/task", headers=h), 405, "method_not_allowed")
        _assert_json_error(s.http.get("/nowhere"), 404, "not_found")
        assert s.http.get("/v1/status").json()["devices"] == 1


@pytest.mark.slow
def test_malformed_http_is_answered_as_json_and_the_process_has_no_torch(server_artifacts, tmp_path):
    """What only the server process shows: its HTTP layer's answer to bytes that are not HTTP,
    and the libraries it maps."""
    with serve(server_artifacts, tmp_path / "data") as s:
        assert s.proc is not None
        with socket.create_connection(("127.0.0.1", s.port), timeout=5) as sock:
            sock.sendall(b"GET / HTTP/1.1\r\nHost: x\r\nBad Header\r\n\r\n")
            reply = sock.recv(4096)
        assert reply.startswith(b"HTTP/1.1 400") and b'"code": "bad_request"' in reply
        maps = Path(f"/proc/{s.proc.pid}/maps").read_text()
        assert "libtorch" not in maps and "libc10" not in maps


@pytest.mark.slow
def test_forwarded_addresses_are_trusted_only_from_named_proxies(server_artifacts, tmp_path):
    with serve(server_artifacts, tmp_path / "a", enroll_per_minute=2) as s:
        codes = [s.http.post("/v1/devices", json={"enrollment_key": "enrollment-key-for-tests"},
                            headers={"X-Forwarded-For": f"10.0.0.{i}"}).status_code for i in range(4)]  # fmt: skip
        assert codes == [201, 201, 429, 429]
    with serve(server_artifacts, tmp_path / "b", enroll_per_minute=2, forwarded_allow_ips="127.0.0.1") as s:
        codes = [s.http.post("/v1/devices", json={"enrollment_key": "enrollment-key-for-tests"},
                            headers={"X-Forwarded-For": f"10.0.0.{i}"}).status_code for i in range(4)]  # fmt: skip
        assert codes == [201] * 4


def test_failed_authentication_is_throttled_per_address(server_artifacts, tmp_path):
    with InProcessServer(server_artifacts, tmp_path / "data", auth_failures_per_minute=5) as s:
        _, device = enroll(s.http)
        guesses = [s.http.get("/v1/admin/models/latest/base", headers={"Authorization": f"Bearer guess-{i}"})
                   for i in range(5)]  # fmt: skip
        assert [g.status_code for g in guesses] == [401] * 5
        throttled = s.http.get("/v1/admin/models/latest/base", headers={"Authorization": "Bearer guess-5"})
        _assert_json_error(throttled, 429, "rate_limited")
        assert int(throttled.headers["retry-after"]) >= 1
        # Issue 50: the operator is not locked out by other tokens' failures from its address.
        assert s.http.get("/v1/admin/models/latest/base", headers=admin()).status_code == 200
        # Revision 1.4: wrong enrollment keys are counted apart, and the right key always enrolls, so
        # one phone guessing tokens behind a carrier NAT does not stop the others from enrolling.
        wrong_key = s.http.post("/v1/devices", json={"enrollment_key": "guess"})
        _assert_json_error(wrong_key, 401, "unauthorized")
        enroll(s.http)
        assert s.http.get("/v1/task", headers=device).status_code == 200  # devices keep working


def test_short_admin_tokens_are_refused(server_artifacts, tmp_path, monkeypatch):
    from fedper.server.config import ServerConfig
    from fedper.server.state import StartupError, open_state

    monkeypatch.setenv("FEDPER_ADMIN_TOKEN", "only-20-characters..")
    with pytest.raises(StartupError, match="at least 32"):
        open_state(ServerConfig(artifacts=server_artifacts, data_dir=tmp_path / "data"))


@pytest.mark.slow
def test_a_client_disconnect_mid_upload_is_one_info_line(server_artifacts, tmp_path):
    with serve(server_artifacts, tmp_path / "data") as s:
        _, h = enroll(s.http)
        ask(s.http, h)  # a slot: without one, the upload is refused before its body is read
        for _ in range(20):
            with socket.create_connection(("127.0.0.1", s.port)) as sock:
                sock.sendall(f"POST /v1/rounds/1/updates HTTP/1.1\r\nHost: x\r\nAuthorization: {h['Authorization']}"
                             f"\r\nContent-Length: 100000\r\n\r\n".encode() + b"\0" * 1000)  # fmt: skip
                time.sleep(0.05)
        _until(lambda: s.log.read_text().count('"client_disconnected"') >= 20)  # logged as each is noticed
        assert s.http.get("/v1/health").status_code == 200
        log = s.log.read_text()
        assert log.count('"client_disconnected"') == 20
        assert "Traceback" not in log and len(log.splitlines()) < 40
        assert _leftovers(s.data_dir) == []


def test_rejected_uploads_leave_no_trace(server_artifacts, server_manifest, tmp_path):
    data = tmp_path / "data"
    with InProcessServer(server_artifacts, data, target_clients=1, min_clients=1, round_timeout=0, rounds=5) as s:
        (_, a), (_, b) = enroll(s.http), enroll(s.http)
        assert _post(s.http, update_body(base_like(server_manifest)), a).status_code == 202  # closes round 1
        assert _leftovers(data) == []
        _assert_json_error(_post(s.http, update_body(base_like(server_manifest)), a), 409, "duplicate_update")
        _assert_json_error(_post(s.http, update_body(base_like(server_manifest)), b), 409, "round_not_open")
        _assert_json_error(_post(s.http, update_body(base_like(server_manifest), base_version=0), b, 2), 409,
                           "stale_base_version")  # fmt: skip
        _assert_json_error(_post(s.http, b"garbage" * 1000, b, 2), 400, "malformed_safetensors")
        assert _leftovers(data) == []  # no folder for round 1 or 2, no temp file


def _fds(pid: int) -> int:
    return len(list(Path(f"/proc/{pid}/fd").iterdir()))


def _until_closed(sock: socket.socket, timeout: float = 15.0) -> bytes:
    """Everything the server sends on ``sock`` until it closes the connection."""
    sock.settimeout(timeout)
    received = b""
    while chunk := sock.recv(65536):
        received += chunk
    return received


def _until(check: Callable[[], bool], timeout: float = 15.0) -> None:
    """Wait for what a server process does at its own (asyncio) deadlines, which no fake clock
    of the test reaches: until ``check`` holds, or fail after ``timeout`` seconds."""
    deadline = time.monotonic() + timeout
    while not check():
        assert time.monotonic() < deadline, "timed out"
        time.sleep(0.05)


@pytest.mark.slow
def test_slow_and_idle_clients_are_cut_off(server_artifacts, server_manifest, tmp_path):
    # The deadlines leave the steps before the descriptor count ~2 s (they take ~1 s here):
    # with header_timeout=1 the idle connections were sometimes cut before they were counted.
    with serve(server_artifacts, tmp_path / "data", header_timeout=3, upload_timeout=4,
                       max_inflight_uploads=3, round_timeout=0) as s:  # fmt: skip
        assert s.proc is not None
        devices = [enroll(s.http) for _ in range(5)]
        baseline = _fds(s.proc.pid)
        # Headers never finished (slowloris), and connections that never say anything.
        idle = [socket.create_connection(("127.0.0.1", s.port)) for _ in range(40)]
        idle[0].sendall(b"POST /v1/rounds/1/updates HTTP/1.1\r\nHost: x\r\n")
        # Uploads whose body trickles in: three fill the in-flight slots, the fourth is refused.
        slow = []
        for _, h in devices[:3]:
            ask(s.http, h)  # a slot: without one, the upload is refused before its body is read
            sock = socket.create_connection(("127.0.0.1", s.port))
            sock.sendall(f"POST /v1/rounds/1/updates HTTP/1.1\r\nHost: x\r\nAuthorization: {h['Authorization']}"
                         f"\r\nContent-Length: 100000\r\n\r\n".encode() + b"\0")  # fmt: skip
            slow.append(sock)
        time.sleep(0.5)
        busy = _post(s.http, update_body(base_like(server_manifest)), devices[3][1])
        _assert_json_error(busy, 503, "server_busy")
        assert int(busy.headers["retry-after"]) >= 1
        assert _fds(s.proc.pid) >= baseline + 40
        for sock in slow:  # each is answered 408 at its deadline (4 s after it began) and closed
            reply = _until_closed(sock)
            assert reply.startswith(b"HTTP/1.1 408") and b"upload_timeout" in reply, reply[:200]
        for sock in idle:
            reply = _until_closed(sock)
            assert reply == b"" or reply.startswith(b"HTTP/1.1 408"), reply[:100]
        _until(lambda: _fds(s.proc.pid) <= baseline + 5)
        assert _post(s.http, update_body(base_like(server_manifest)), devices[3][1]).status_code == 202  # slots freed
        for sock in idle + slow:
            sock.close()
        assert _leftovers(s.data_dir) == ["updates/r1", f"updates/r1/{devices[3][0]}.safetensors"]


def test_a_revoked_devices_update_is_withdrawn(server_artifacts, server_manifest, tmp_path):
    with InProcessServer(server_artifacts, tmp_path / "data", target_clients=2, min_clients=1, round_timeout=0) as s:
        (bad_id, bad), (_, good) = enroll(s.http), enroll(s.http)
        poison = {k: np.full_like(v, 100.0) for k, v in base_like(server_manifest).items()}
        assert _post(s.http, update_body(poison, 50), bad).status_code == 202
        r = s.http.post(f"/v1/admin/devices/{bad_id}/revoke", headers=admin())
        assert r.json()["update_withdrawn"] is True
        assert round_info(s.http, 1)["received"] == 0
        _assert_json_error(_post(s.http, update_body(poison, 50), bad), 401)
        _, again = enroll(s.http)  # the same phone, re-enrolled: a new device, counted once
        assert _post(s.http, update_body(base_like(server_manifest, seed=1), 10), again).status_code == 202
        clean = base_like(server_manifest, seed=2)
        assert _post(s.http, update_body(clean, 30), good).status_code == 202
        v1 = st_load(s.http.get("/v1/models/1/base", headers=good).content)
        first = base_like(server_manifest, seed=1)
        for name in list(v1)[:5]:
            expected = (10 * first[name].astype(np.float64) + 30 * clean[name].astype(np.float64)) / 40
            np.testing.assert_allclose(v1[name], expected, rtol=1e-6)


def test_stop_records_the_round_and_answers_uploads_410(server_artifacts, server_manifest, tmp_path):
    data = tmp_path / "data"
    with InProcessServer(server_artifacts, data, target_clients=3, round_timeout=0) as s:
        _, h = enroll(s.http)
        assert _post(s.http, update_body(base_like(server_manifest)), h).status_code == 202
        assert s.http.post("/v1/admin/stop", headers=admin()).status_code == 200
        _assert_json_error(_post(s.http, update_body(base_like(server_manifest)), h), 410, "run_finished")
        _assert_json_error(s.http.get("/v1/task", headers=h), 410, "run_finished")
        assert round_info(s.http, 1)["state"] == "stopped"
        assert _leftovers(data) == []
    with InProcessServer(server_artifacts, data, target_clients=3, round_timeout=0) as s:  # restarted
        assert round_info(s.http, 1)["state"] == "stopped"
        assert s.http.get("/v1/status").json()["state"] == "finished"


def test_metrics_are_bounded_and_their_means_finite(server_artifacts, server_manifest, tmp_path):
    with InProcessServer(server_artifacts, tmp_path / "data", target_clients=3, round_timeout=0) as s:
        devices = [enroll(s.http) for _ in range(3)]
        for value in ("1e308", "1e10", "-1e9999", "0x10", "1_000", " 1"):
            r = _post(s.http, update_body(base_like(server_manifest), metrics={"accuracy": value}), devices[0][1])
            _assert_json_error(r, 422, "bad_metadata")
        for _, h in devices:
            assert (
                _post(s.http, update_body(base_like(server_manifest), 100000, metrics={"loss": "1e9"}), h).status_code
                == 202
            )
        loss = round_info(s.http, 1)["metrics"]["loss"]
        assert loss["mean"] == 1e9 and loss["weighted_mean"] == 1e9


def test_the_update_bound(server_artifacts, server_manifest, tmp_path):
    initial = weights.load(server_artifacts / "base.safetensors")
    with InProcessServer(server_artifacts, tmp_path / "data", target_clients=3, round_timeout=0,
                         max_update_norm=50) as s:  # fmt: skip
        _, h = enroll(s.http)
        huge = {k: np.full_like(v, 1e30) for k, v in initial.items()}
        _assert_json_error(_post(s.http, update_body(huge, 100000), h), 422, "update_out_of_bounds")
        near = {k: v + np.float32(0.01) for k, v in initial.items()}
        assert _post(s.http, update_body(near), h).status_code == 202


def test_the_app_is_built_without_torch(server_artifacts, tmp_path):
    import subprocess
    import sys

    code = (
        "import json, sys\n"
        "from pathlib import Path\n"
        "from fedper.server.app import create_app\n"
        "from fedper.server.config import ServerConfig\n"
        "from fedper.server.state import open_state\n"
        "config = ServerConfig(artifacts=Path(sys.argv[1]), data_dir=Path(sys.argv[2]))\n"
        "create_app(config, open_state(config))\n"
        "print(json.dumps(sorted(m for m in sys.modules if m.split('.')[0] == 'torch')))\n"
    )
    env = {"FEDPER_ADMIN_TOKEN": "x" * 40, "FEDPER_ENROLLMENT_KEY": "k", "PATH": "/usr/bin"}
    out = subprocess.run([sys.executable, "-c", code, str(server_artifacts), str(tmp_path / "d")], env=env,
                         capture_output=True, text=True, cwd=Path(__file__).resolve().parents[3])  # fmt: skip
    assert out.returncode == 0, out.stderr
    assert json.loads(out.stdout) == []


def test_the_server_process_limits_malloc_arenas_unless_the_operator_set_them(monkeypatch):
    """Measured by test_server.py's fifty width-1.0 uploads: resident memory grew 95-202 MB with
    glibc's default arenas, 18-41 MB with 2 (server/malloc_arenas.py)."""
    import platform

    from fedper.server.malloc_arenas import limit_malloc_arenas

    monkeypatch.setenv("MALLOC_ARENA_MAX", "4")
    assert limit_malloc_arenas() is False  # the operator's setting stands
    monkeypatch.delenv("MALLOC_ARENA_MAX")
    assert limit_malloc_arenas() is (platform.libc_ver()[0] == "glibc")
