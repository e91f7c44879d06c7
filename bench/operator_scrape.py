"""What watching a 100,000-device run costs: ``GET /metrics`` and ``GET /dashboard/data`` against
``GET /v1/task`` on the same real ``fedper serve``, in one run (issue 54: within 2x).

The run's state is written into the server's database before it starts, as a long run leaves it:
``--devices`` (100,000) enrolled devices and ``--rounds`` (200) closed rounds, each with
``--cohort`` (1,000) accepted updates that reported accuracy, accuracy after and train loss, its
refusals and cohort, each round closing into a new model version (the files are links to
version 0's). The server resumes at the next round, open, with ``--cohort`` slots.

Measured by one probe client, in turn (task, metrics, data), ``--probes`` (150) times each:
1. quiet: no other traffic;
2. loaded: ``--connections`` (64) other connections keep asking ``GET /v1/task`` as random
   devices of the 100,000 (each answered 200 with a slot or 204), as a fleet's check-ins do.
The first scrape after the start is reported on its own: it reads the stored history once.

Reported: p50/p90 latency of each, and each operator endpoint's p50 over ``/v1/task``'s p50,
quiet and loaded (the target: at most 2).

Usage: python -m bench.operator_scrape [--devices 100000] [--rounds 200] [--cohort 1000]
"""

from __future__ import annotations

import argparse
import asyncio
import hashlib
import json
import os
import random
import statistics
import tempfile
import time
from pathlib import Path

import httpx
import numpy as np

from bench.common import write_results
from fedper.server.process import ServerProcess
from fedper.server.storage import Database, RoundEnding, RoundState, StoredUpdate

ADMIN, ENROLL = "bench-admin-token-0123456789abcdefghij", "bench-enroll"
PATHS = {"task": "/v1/task", "metrics": "/metrics", "data": "/dashboard/data"}


def _history(data: Path, devices: int, rounds: int, cohort: int) -> list[str]:
    """Devices and ``rounds`` closed rounds written into the database the server made at its first
    start (round 1 open on version 0); round ``rounds + 1`` is left open. The devices' tokens."""
    rng = np.random.default_rng(0)
    tokens = [f"bench-token-{i:06d}-{random.Random(i).getrandbits(64):016x}" for i in range(devices)]
    ids = [f"d-bench{i:06d}" for i in range(devices)]
    db = Database(data / "state.db")
    try:
        db.devices.add_many([(d, hashlib.sha256(t.encode()).hexdigest()) for d, t in zip(ids, tokens, strict=True)],
                            "bench")  # fmt: skip
        v0 = db.versions.get(0)
        assert v0 is not None
        models = data / "models"
        now = time.time() - 60 * rounds
        for number in range(1, rounds + 1):
            file = f"v{number}.safetensors"
            os.link(models / v0.file, models / file)
            with db.transaction() as tx:
                if number > 1:
                    db.rounds.open(tx, number, number - 1, now, None)
                else:
                    db.rounds.start_clock(tx, 1, now, None)
                for k in rng.choice(devices, size=cohort, replace=False):
                    acc = float(np.clip(rng.normal(0.4 + 0.2 * number / rounds, 0.1), 0, 1))
                    metrics = {"accuracy": acc, "accuracy_after": min(1.0, acc + 0.05), "train_loss": 1.5 - acc}
                    db.rounds.insert_update(tx, StoredUpdate(number, ids[k], 20, number - 1, None, metrics), now + 30)
                ending = RoundEnding({"not_in_cohort": int(rng.integers(0, 20)), "stale_base_version": 1}, cohort)
                db.rounds.end(tx, number, RoundState.CLOSED, now + 45, number, {}, ending=ending)
                db.versions.insert(tx, number, v0.sha256, file, now + 45, number)
                now += 60
        with db.transaction() as tx:
            db.rounds.open(tx, rounds + 1, rounds, time.time(), None)
    finally:
        db.close()
    return tokens


def _pct(values: list[float]) -> dict[str, float]:
    return {"count": len(values), "p50_ms": 1000 * statistics.median(values),
            "p90_ms": 1000 * float(np.percentile(values, 90)), "max_ms": 1000 * max(values)}  # fmt: skip


async def _probe(url: str, token: str, probes: int) -> dict[str, list[float]]:
    times: dict[str, list[float]] = {name: [] for name in PATHS}
    async with httpx.AsyncClient(base_url=url, timeout=120) as client:
        for _ in range(probes):
            for name, path in PATHS.items():
                bearer = token if name == "task" else ADMIN
                start = time.perf_counter()
                r = await client.get(path, headers={"Authorization": f"Bearer {bearer}"})
                times[name].append(time.perf_counter() - start)
                assert r.status_code in (200, 204), (path, r.status_code, r.text[:200])
    return times


async def _loaded(url: str, tokens: list[str], connections: int, probes: int) -> tuple[dict[str, list[float]], int]:
    stop = asyncio.Event()
    asked = 0
    limits = httpx.Limits(max_connections=connections, max_keepalive_connections=connections)
    async with httpx.AsyncClient(base_url=url, limits=limits, timeout=120) as fleet:

        async def device_traffic(seed: int) -> None:
            nonlocal asked
            rng = random.Random(seed)
            while not stop.is_set():
                await fleet.get("/v1/task", headers={"Authorization": f"Bearer {rng.choice(tokens)}"})
                asked += 1

        workers = [asyncio.create_task(device_traffic(k)) for k in range(connections)]
        await asyncio.sleep(2)  # the load is on before the first probe
        times = await _probe(url, tokens[0], probes)
        stop.set()
        await asyncio.gather(*workers)
    return times, asked


def measure(args: argparse.Namespace, workdir: Path) -> dict[str, object]:
    from fedper.export.pipeline import write_server_only_export

    artifacts = write_server_only_export(workdir / "artifacts", alpha=0.25)
    data = workdir / "data"
    env = {"FEDPER_ADMIN_TOKEN": ADMIN, "FEDPER_ENROLLMENT_KEY": ENROLL}
    options: dict[str, object] = {
        "target_clients": args.cohort,
        "min_clients": 1,
        "rounds": args.rounds + 10,
        "max_requests_per_address": 0,
    }  # one address stands for the whole fleet here
    with ServerProcess(artifacts, data, options, env=env, log=workdir / "first.log"):
        pass  # creates the database, version 0 and round 1
    started = time.perf_counter()
    tokens = _history(data, args.devices, args.rounds, args.cohort)
    print(f"history written in {time.perf_counter() - started:.0f} s", flush=True)
    with ServerProcess(artifacts, data, options, env=env, log=workdir / "server.log") as server:
        first = {}
        for name in ("metrics", "data"):
            start = time.perf_counter()
            r = httpx.get(server.url + PATHS[name], headers={"Authorization": f"Bearer {ADMIN}"}, timeout=120)
            first[name] = {"ms": 1000 * (time.perf_counter() - start), "bytes": len(r.content)}
        quiet = asyncio.run(_probe(server.url, tokens[0], args.probes))
        loaded, asked = asyncio.run(_loaded(server.url, tokens, args.connections, args.probes))
        rss = server.rss_mb()
    out: dict[str, object] = {"first_request": first, "server_peak_rss_mb": rss, "load_requests": asked}
    for label, times in (("quiet", quiet), ("loaded", loaded)):
        summary = {name: _pct(values) for name, values in times.items()}
        task = summary["task"]["p50_ms"]
        out[label] = {**summary, "ratio_p50_metrics_over_task": summary["metrics"]["p50_ms"] / task,
                      "ratio_p50_data_over_task": summary["data"]["p50_ms"] / task}  # fmt: skip
    return out


def main() -> None:
    p = argparse.ArgumentParser(prog="python -m bench.operator_scrape", description=__doc__)
    p.add_argument("--devices", type=int, default=100_000)
    p.add_argument("--rounds", type=int, default=200)
    p.add_argument("--cohort", type=int, default=1000)
    p.add_argument("--probes", type=int, default=150)
    p.add_argument("--connections", type=int, default=64)
    p.add_argument("--name", default="operator_scrape")
    args = p.parse_args()
    with tempfile.TemporaryDirectory() as tmp:
        result = measure(args, Path(tmp))
    print(json.dumps(result, indent=1))
    print(write_results(args.name, {"devices": args.devices, "rounds": args.rounds, "cohort": args.cohort,
                                    "probes": args.probes, "connections": args.connections, **result}))  # fmt: skip


if __name__ == "__main__":
    main()
