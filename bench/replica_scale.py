"""1, 2 and 3 replicas of ``fedper serve`` on one PostgreSQL database and data directory behind
nginx (docs/SCALING.md, "Several replicas"), measured in one run.

For each replica count, on a fresh database and directory: ``--devices`` devices provisioned; each
asks ``GET /v1/task`` ``--asks`` times, ``--concurrency`` at a time (the first ``--uploads`` get a
slot: 200, the others 204): requests/s, p50 and p99; then the ``--uploads`` devices with a slot
upload one MobileNet-V1 width-0.25 base update each, ``--concurrency`` at a time, into a round that
closes with the last: accepted updates/s, p50 and p99. The counts run in turn ``--repeats``
times, in a rotated order each time, so that a drift of the machine does not favour one count.
The load comes from this process on the same cores: on 2 cores, more replicas cannot add CPU,
and the ratios say what sharing costs, not how far the design scales on more machines.

Usage: python -m bench.replica_scale [--replicas 1 2 3] [--repeats 3] [--name replica_scale]
"""

from __future__ import annotations

import argparse
import contextlib
import statistics
import tempfile
import threading
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any

import httpx
import numpy as np

from bench.common import write_results
from fedper.common.protocol import Header, Route
from fedper.server.process import ServerProcess

ADMIN, ENROLL = "bench-admin-token-0123456789abcdefghij", "bench-enroll"


def _timed(calls: list[Any], concurrency: int) -> tuple[float, list[float]]:
    """Run the zero-argument ``calls``, ``concurrency`` at a time: wall seconds and each latency."""
    local = threading.local()

    def one(call: Any) -> float:
        if not hasattr(local, "client"):
            local.client = httpx.Client(timeout=300)
        start = time.perf_counter()
        call(local.client)
        return time.perf_counter() - start

    start = time.perf_counter()
    with ThreadPoolExecutor(concurrency) as pool:
        latencies = list(pool.map(one, calls))
    return time.perf_counter() - start, latencies


def _stats(seconds: float, latencies: list[float]) -> dict[str, float]:
    return {"per_s": len(latencies) / seconds, "p50_ms": 1000 * statistics.median(latencies),
            "p99_ms": 1000 * float(np.percentile(latencies, 99))}  # fmt: skip


def measure(replicas: int, args: argparse.Namespace, work: Path, database: str, body: bytes) -> dict[str, Any]:
    from tests.support.load_balancer import LoadBalancer

    artifacts, data = work / "artifacts", work / f"data-{replicas}-{time.monotonic_ns()}"
    options = {"database": database, "target_clients": args.uploads, "min_clients": 1, "rounds": 100,
               "round_timeout": 0, "enroll_total_per_minute": 0, "max_requests_per_address": 0,
               "forwarded_allow_ips": "127.0.0.1"}  # fmt: skip
    env = {"FEDPER_ADMIN_TOKEN": ADMIN, "FEDPER_ENROLLMENT_KEY": ENROLL}
    servers = [ServerProcess(artifacts, data, options, env=env, log=work / f"server-{replicas}-{i}.log")
               for i in range(replicas)]  # fmt: skip
    with contextlib.ExitStack() as stack:
        for server in servers:
            stack.enter_context(server)
        proxy = stack.enter_context(LoadBalancer(data.parent / f"nginx-{data.name}", [s.url for s in servers]))
        url = proxy.url
        made = httpx.post(url + Route.ADMIN_DEVICES, json={"count": args.devices},
                          headers={"Authorization": f"Bearer {ADMIN}"}, timeout=120)  # fmt: skip
        made.raise_for_status()
        tokens = [{"Authorization": f"Bearer {d['token']}"} for d in made.json()["devices"]]

        def ask(headers: dict[str, str]) -> Any:
            def call(client: httpx.Client) -> None:
                r = client.get(url + Route.TASK, headers=headers)
                if r.status_code not in (200, 204):
                    raise RuntimeError(f"task: {r.status_code} {r.text[:200]}")

            return call

        # The first devices take the round's slots, in order; the asks that follow are measured.
        for headers in tokens[: args.uploads]:
            httpx.get(url + Route.TASK, headers=headers, timeout=60).raise_for_status()
        task = _stats(*_timed([ask(h) for _ in range(args.asks) for h in tokens], args.concurrency))

        def upload(headers: dict[str, str]) -> Any:
            def call(client: httpx.Client) -> None:
                r = client.post(url + Route.UPDATES.format(round_number=1), content=body,
                                headers={**headers, Header.CONTENT_TYPE: Header.OCTET_STREAM})  # fmt: skip
                if r.status_code != 202:
                    raise RuntimeError(f"upload: {r.status_code} {r.text[:200]}")

            return call

        ingest = _stats(*_timed([upload(h) for h in tokens[: args.uploads]], args.concurrency))
        deadline = time.monotonic() + 120
        while httpx.get(url + Route.STATUS, timeout=30).json()["model_version"] < 1:
            if time.monotonic() > deadline:
                raise RuntimeError("round 1 did not close")
            time.sleep(0.05)
    return {"replicas": replicas, "task": task, "ingest": ingest}


def main() -> None:
    p = argparse.ArgumentParser(prog="python -m bench.replica_scale", description=__doc__)
    p.add_argument("--replicas", type=int, nargs="+", default=[1, 2, 3])
    p.add_argument("--devices", type=int, default=600)
    p.add_argument("--asks", type=int, default=3)
    p.add_argument("--uploads", type=int, default=60)
    p.add_argument("--concurrency", type=int, default=16)
    p.add_argument("--repeats", type=int, default=3)
    p.add_argument("--name", default="replica_scale")
    args = p.parse_args()
    from fedper.common import weights
    from fedper.common.manifest import read_manifest
    from fedper.export.pipeline import write_server_only_export
    from tests.support.postgres import cluster
    from tests.support.server_support import base_like

    runs: list[dict[str, Any]] = []
    with tempfile.TemporaryDirectory(prefix="replica_scale-") as tmp, cluster() as scratch:
        work = Path(tmp)
        write_server_only_export(work / "artifacts", alpha=0.25)
        tensors = base_like(read_manifest(work / "artifacts"), seed=0)  # random, with variances >= 0
        body = weights.encode(tensors, {"num_samples": "10", "base_version": "0"})
        for repeat in range(args.repeats):
            shift = repeat % len(args.replicas)
            for replicas in args.replicas[shift:] + args.replicas[:shift]:
                run = {"repeat": repeat, **measure(replicas, args, work, scratch.database(), body)}
                print(run, flush=True)
                runs.append(run)
    summary = {}
    for replicas in args.replicas:
        mine = [r for r in runs if r["replicas"] == replicas]
        summary[str(replicas)] = {
            f"{what}_{stat}": [r[what][stat] for r in mine] for what in ("task", "ingest") for stat in
            ("per_s", "p99_ms")
        }  # fmt: skip
    one = {r["repeat"]: r for r in runs if r["replicas"] == args.replicas[0]}
    paired = [{"replicas": r["replicas"], "repeat": r["repeat"],
               "ingest_per_s_vs_first": r["ingest"]["per_s"] / one[r["repeat"]]["ingest"]["per_s"],
               "task_p99_vs_first": r["task"]["p99_ms"] / one[r["repeat"]]["task"]["p99_ms"]}
              for r in runs]  # fmt: skip
    print(write_results(args.name, {"devices": args.devices, "asks": args.asks, "uploads": args.uploads,
                                    "concurrency": args.concurrency, "runs": runs, "by_replicas": summary,
                                    "paired": paired}))  # fmt: skip


if __name__ == "__main__":
    main()
