"""Upload throughput of a real ``fedper serve`` on localhost, against the transport's own limit.

``--uploads`` enrolled devices (default 100) upload one MobileNet-V1 base update each (width
``--alpha``, 1.0 by default: 8.66 MB, F32) over HTTP into one round, N at a time (N = 1, 10, 50
concurrent uploads); the round closes (aggregation included) with the last one. Reported: accepted
updates/s, p50/p99 upload latency, the server's peak RSS, and the bytes/s of the same
uploads to a minimal uvicorn handler that only reads the body (measured in the same run).

Also the server's resident memory when idle (after start, before any upload) and its start
time (process launch to the first answered ``/v1/health``). ``--serve-args ''`` and
``--name`` measure an older server for a before/after comparison.

Then, in process (no HTTP), ``--phase-uploads`` uploads into one round that closes with the
last: the median time of each step of one upload (checking, writing the server's canonical
file, committing), the time of closing the round (aggregation included) and of all commits
together (``--no-phases`` skips it; ``--devices ''`` runs only it).

Usage: python -m bench.server_ingest [--devices 1,10,50] [--uploads 100] [--phase-uploads 20]
       [--serve-args ARGS] [--name NAME]
"""

from __future__ import annotations

import argparse
import statistics
import subprocess
import sys
import tempfile
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import httpx
import numpy as np

from bench.common import write_results
from fedper.server.process import ServerProcess, free_port, wait_until_answering

ADMIN, ENROLL = "bench-admin-token-0123456789abcdefghij", "bench-enroll"

MINIMAL_APP = """
import uvicorn
async def app(scope, receive, send):
    if scope["type"] != "http":
        return
    more = True
    while more:
        message = await receive()
        more = message.get("more_body", False)
    status = 200 if scope["method"] == "GET" else 202
    await send({"type": "http.response.start", "status": status, "headers": [(b"content-type", b"application/json")]})
    await send({"type": "http.response.body", "body": b'{"accepted": true}'})
uvicorn.run(app, host="127.0.0.1", port=int(__import__("sys").argv[1]), log_level="warning")
"""


def _options(serve_args: list[str]) -> dict[str, str]:
    """``["--max-inflight-uploads", "32"]`` as ServerProcess options."""
    if len(serve_args) % 2:
        raise SystemExit(f"--serve-args takes FLAG VALUE pairs, got {serve_args}")
    return {flag.lstrip("-"): value for flag, value in zip(serve_args[::2], serve_args[1::2], strict=True)}


def _run_uploads(url: str, devices: list[dict[str, str]], body: bytes, concurrency: int,
                 path: str) -> tuple[float, list[float]]:  # fmt: skip
    """Every device uploads ``body`` once, ``concurrency`` at a time."""
    local = __import__("threading").local()

    def one(headers: dict[str, str]) -> float:
        if not hasattr(local, "client"):
            local.client = httpx.Client(timeout=300)
        start = time.perf_counter()
        r = local.client.post(url + path, content=body, headers=headers)
        if r.status_code != 202:
            raise RuntimeError(f"{r.status_code}: {r.text[:200]}")
        return time.perf_counter() - start

    start = time.perf_counter()
    with ThreadPoolExecutor(max_workers=concurrency) as pool:
        latencies = list(pool.map(one, devices))
    return time.perf_counter() - start, latencies


def measure(n: int, uploads: int, workdir: Path, serve_args: list[str], alpha: float = 1.0) -> dict[str, object]:
    from fedper.common import weights
    from fedper.common.manifest import read_manifest
    from fedper.export.pipeline import write_server_only_export

    artifacts = workdir / f"artifacts-{alpha}-{n}"
    if not artifacts.exists():
        write_server_only_export(artifacts, alpha=alpha)
    manifest = read_manifest(artifacts)
    rng = np.random.default_rng(0)
    tensors = {name: rng.standard_normal(shape).astype(np.float32) for name, shape in manifest.layout("base")}
    tensors = {n: np.abs(v) if n.endswith("running_var") else v for n, v in tensors.items()}  # a variance is >= 0
    body = weights.encode(tensors, {"num_samples": "10", "base_version": "0"})
    server = ServerProcess(
        artifacts, workdir / f"data-{alpha}-{n}",
        {"target_clients": uploads, "min_clients": 1, "rounds": 2, "round_timeout": 0,
         "enroll_per_minute": 100000, "enroll_total_per_minute": 0, **_options(serve_args)},
        env={"FEDPER_ADMIN_TOKEN": ADMIN, "FEDPER_ENROLLMENT_KEY": ENROLL},
        log=workdir / f"server-{n}.log",
    )  # fmt: skip
    launched = time.perf_counter()
    with server:
        start_s = time.perf_counter() - launched
        idle_rss = server.rss_mb("VmRSS")
        devices = []
        for _ in range(uploads):
            token = httpx.post(f"{server.url}/v1/devices", json={"enrollment_key": ENROLL}).json()["token"]
            devices.append({"Authorization": f"Bearer {token}"})
            # A slot in round 1's cohort (asked before the clock starts: the upload path is measured)
            assert httpx.get(f"{server.url}/v1/task", headers=devices[-1]).status_code == 200
        seconds, latencies = _run_uploads(server.url, devices, body, n, "/v1/rounds/1/updates")
        rss = server.rss_mb()
    port = free_port()
    minimal = subprocess.Popen([sys.executable, "-c", MINIMAL_APP, str(port)], text=True)
    try:
        wait_until_answering(f"http://127.0.0.1:{port}/", minimal, timeout=60)
        plain_s, _ = _run_uploads(f"http://127.0.0.1:{port}", [{}] * uploads, body, n, "/upload")
    finally:
        minimal.terminate()
        minimal.wait()
    count = uploads
    nbytes = len(body)
    return {
        "devices": n,
        "alpha": alpha,
        "uploads": count,
        "update_bytes": nbytes,
        "updates_per_s": count / seconds,
        "bytes_per_s": count * nbytes / seconds,
        "p50_ms": 1000 * statistics.median(latencies),
        "p99_ms": 1000 * float(np.percentile(latencies, 99)),
        "server_peak_rss_mb": rss,
        "server_idle_rss_mb": idle_rss,
        "server_start_s": start_s,
        "minimal_handler_bytes_per_s": count * nbytes / plain_s,
        "vs_minimal_handler": plain_s / seconds,
    }


def per_upload_phases(workdir: Path, uploads: int = 20) -> dict[str, dict[str, float]]:
    """``uploads`` width-1.0 uploads in process (no HTTP) into a round that closes with the last.
    Per upload, the median milliseconds of each step: checking (strict header, the library's
    reading, data and finiteness), writing the canonical file (with fsync), and the commit
    under the round lock (of the uploads before the last). Per round: the milliseconds spent
    closing it (``aggregation_seconds``: aggregation, writing the new version, the database)
    and those of all commits together, the closing one included (work under the round lock)."""
    import os

    from fedper.common import weights
    from fedper.common.manifest import read_manifest
    from fedper.export.pipeline import write_server_only_export
    from fedper.server.config import ServerConfig
    from fedper.server.state import open_state
    from fedper.server.upload_validation import validate

    os.environ.setdefault("FEDPER_ADMIN_TOKEN", ADMIN)
    os.environ.setdefault("FEDPER_ENROLLMENT_KEY", ENROLL)
    artifacts = write_server_only_export(workdir / "artifacts-phases", alpha=1.0)
    manifest = read_manifest(artifacts)
    rng = np.random.default_rng(0)
    tensors = {name: rng.standard_normal(shape).astype(np.float32) for name, shape in manifest.layout("base")}
    tensors = {n: np.abs(v) if n.endswith("running_var") else v for n, v in tensors.items()}  # a variance is >= 0
    body = weights.encode(tensors, {"num_samples": "10", "base_version": "0"})
    config = ServerConfig(artifacts=artifacts, data_dir=workdir / "data-phases", target_clients=uploads,
                          min_clients=1, round_timeout=0)  # fmt: skip
    state = open_state(config)
    times: dict[str, list[float]] = {"check": [], "write_canonical": [], "commit": []}
    for i in range(uploads):
        state.db.devices.add(f"d-{i}", f"hash-{i}", None)
        state.rounds.assign(1, f"d-{i}")  # its task: a slot in the round's cohort
        path = workdir / "body.safetensors"
        path.write_bytes(body)
        t0 = time.perf_counter()
        upload = validate(path, manifest, config.max_num_samples, state.rounds.mode())
        t1 = time.perf_counter()
        staged = state.rounds.stage(f"d-{i}", 1, upload)
        t2 = time.perf_counter()
        state.rounds.commit(staged)
        t3 = time.perf_counter()
        for key, seconds in zip(times, (t1 - t0, t2 - t1, t3 - t2), strict=True):
            times[key].append(1000 * seconds)
    assert state.rounds.snapshot.model_version == 1, "the round did not close"
    close_ms = 1000 * state.rounds.aggregation_seconds
    state.db.close()
    commits_ms = sum(times["commit"])
    times["commit"].pop()  # the closing one
    return {
        "per_upload_ms": {key: statistics.median(values) for key, values in times.items()},
        "round_ms": {"uploads": uploads, "close": close_ms, "all_commits": commits_ms},
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--devices", default="1,10,50")
    parser.add_argument("--uploads", type=int, default=100)
    parser.add_argument("--alpha", type=float, default=1.0, help="MobileNet-V1 width of the uploaded base")
    parser.add_argument(
        "--serve-args",
        default="--max-inflight-uploads 64",
        help="extra options of fedper serve (50 uploads at once need more than the default 32 in flight)",
    )
    parser.add_argument("--phase-uploads", type=int, default=20, help="uploads of the in-process round")
    parser.add_argument("--no-phases", action="store_true", help="skip the in-process per-upload timing")
    parser.add_argument("--name", default="server_ingest", help="results file name (bench/results/NAME.json)")
    args = parser.parse_args()
    rows = []
    with tempfile.TemporaryDirectory() as tmp:
        for n in (int(x) for x in args.devices.split(",") if x.strip()):
            row = measure(n, args.uploads, Path(tmp), args.serve_args.split(), args.alpha)
            rows.append(row)
            print(
                f"N={n:3d}: {row['updates_per_s']:.1f} updates/s ({row['bytes_per_s'] / 1e6:.0f} MB/s), "
                f"p50 {row['p50_ms']:.0f} ms, p99 {row['p99_ms']:.0f} ms, server peak RSS "
                f"{row['server_peak_rss_mb']:.0f} MB (idle {row['server_idle_rss_mb']:.0f} MB, "
                f"start {row['server_start_s']:.1f} s); minimal handler "
                f"{row['minimal_handler_bytes_per_s'] / 1e6:.0f} MB/s -> "
                f"{100 * row['vs_minimal_handler']:.0f}% of the transport's limit",  # type: ignore[operator]
                flush=True,
            )
        phases = {} if args.no_phases else per_upload_phases(Path(tmp), args.phase_uploads)
    if phases:
        per_upload, per_round = phases["per_upload_ms"], phases["round_ms"]
        print("per upload, in process (median ms): " + ", ".join(f"{k} {v:.1f}" for k, v in per_upload.items()))
        print(f"round of {per_round['uploads']:.0f} uploads: closing {per_round['close']:.0f} ms, "
              f"all commits (the closing one included) {per_round['all_commits']:.0f} ms")  # fmt: skip
    print("wrote", write_results(args.name, {"rows": rows, **phases}))


if __name__ == "__main__":
    main()
