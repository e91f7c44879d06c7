"""100,000 devices checking in to one round of a real ``fedper serve``: the draw and the returns.

The devices are written into the server's database before it starts (the same rows enrollment
writes; the check-in is measured, not the enrollment), and the server runs with a check-in
window (``--window``, 180 s) and a cohort of ``--cohort`` (1,000) slots. Each device asks for its
task once at a moment drawn uniformly over the window's first ``--arrive-over`` seconds (150):
it is checked in and told when to come back (``Retry-After``); it comes back then, and gets its
task (drawn) or a 204 (not drawn). At most ``--connections`` (256) requests are in flight at once
from this process, each device's latency is measured from when it got a connection.

Reported: check-in requests/s and p50/p99 latency; the draw's seconds and the seconds it held
the write lock (the server's ``cohort_drawn`` log line); the returns: how many arrived in the
busiest second, their p50/p99 latency, and the seconds from the window's end until the last
device had its answer; ``GET /v1/status`` (a probe every 0.2 s) at its slowest. ``--old-code
DIR`` also measures the server of another checkout (a git worktree of an older commit) in the same
run: the "before" figures.

``--engines sqlite postgres``: the same run with the server's records in SQLite's file, then on
PostgreSQL (a scratch cluster of Debian's server on a free loopback port, tests/support/
postgres.py), in one invocation.

Usage: python -m bench.checkin_scale [--devices 100000] [--old-code DIR] [--engines sqlite postgres]
       [--name checkin_scale]
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import hashlib
import json
import os
import random
import shutil
import statistics
import sys
import tempfile
import time
from pathlib import Path

import httpx
import numpy as np

from bench.common import write_results
from fedper.server.process import ServerProcess
from fedper.server.storage import Database

# What the server logs about its rounds, kept with each run's result (a round that ended early shows).
ROUND_EVENTS = ("round_opened", "round_clock_started", "cohort_drawn", "round_abandoned", "round_closed", "draining")
ADMIN, ENROLL = "bench-admin-token-0123456789abcdefghij", "bench-enroll"


def _populate(db: Path | str, devices: int) -> list[str]:
    """``devices`` enrolled devices written into a new database (a file, or a Postgres URL)
    before the server first opens it (the server opens round 1 as it starts): their tokens."""
    if isinstance(db, Path):
        db.parent.mkdir(parents=True, exist_ok=True)
    tokens = [f"bench-token-{i:06d}-{random.Random(i).getrandbits(64):016x}" for i in range(devices)]
    database = Database(db)
    try:
        database.devices.add_many([(f"d-bench{i:06d}", hashlib.sha256(t.encode()).hexdigest()) for i, t in enumerate(tokens)],
                             "bench")  # fmt: skip
    finally:
        database.close()
    return tokens


def _pct(values: list[float]) -> dict[str, float]:
    if not values:
        return {"count": 0}
    return {"count": len(values), "p50_ms": 1000 * statistics.median(values),
            "p99_ms": 1000 * float(np.percentile(values, 99)), "max_ms": 1000 * max(values)}  # fmt: skip


async def _fleet(url: str, tokens: list[str], args: argparse.Namespace, opened: float) -> dict[str, object]:
    limits = httpx.Limits(max_connections=args.connections, max_keepalive_connections=args.connections)
    gate = asyncio.Semaphore(args.connections)
    checkins: list[float] = []
    returns: list[tuple[float, float, int]] = []  # (asked at, latency, status)
    status_latencies: list[float] = []
    errors = 0
    rng = random.Random(0)

    async with httpx.AsyncClient(base_url=url, limits=limits, timeout=120) as client:

        async def ask(token: str) -> httpx.Response | None:
            nonlocal errors
            async with gate:
                start = time.monotonic()
                try:
                    r = await client.get("/v1/task", headers={"Authorization": f"Bearer {token}"})
                except httpx.HTTPError:
                    errors += 1
                    return None
                r.extensions["latency"] = time.monotonic() - start
                return r

        async def device(token: str) -> None:
            await asyncio.sleep(max(0.0, opened + rng.uniform(0, args.arrive_over) - time.monotonic()))
            r = await ask(token)
            if r is None:
                return
            checkins.append(r.extensions["latency"])
            if r.status_code != 204:
                return
            await asyncio.sleep(float(r.headers.get("Retry-After", "1")))
            asked = time.monotonic()
            r = await ask(token)
            if r is not None:
                returns.append((asked, r.extensions["latency"], r.status_code))

        done = asyncio.Event()

        async def probe() -> None:
            async with httpx.AsyncClient(base_url=url, timeout=120) as own:
                while not done.is_set():
                    start = time.monotonic()
                    try:
                        await own.get("/v1/status")
                    except httpx.HTTPError:  # counted with the fleet's errors, not the end of the run
                        nonlocal errors
                        errors += 1
                    else:
                        status_latencies.append(time.monotonic() - start)
                    await asyncio.sleep(0.2)

        prober = asyncio.create_task(probe())
        await asyncio.gather(*(device(t) for t in tokens))
        done.set()
        await prober

    window_end = opened + args.window
    per_second: dict[int, int] = {}
    for asked, _, _ in returns:
        per_second[int(asked - window_end)] = per_second.get(int(asked - window_end), 0) + 1
    last = max((asked + latency for asked, latency, _ in returns), default=window_end)
    arrive_span = args.arrive_over
    return {
        "checkin": {**_pct(checkins), "per_s": len(checkins) / arrive_span},
        "returns": {**_pct([latency for _, latency, _ in returns]),
                    "busiest_second": max(per_second.values(), default=0),
                    "drawn": sum(1 for _, _, s in returns if s == 200),
                    "first_ms": 1000 * min(returns)[1] if returns else None,  # the draw is made in its request
                    "seconds_after_window_until_last_answer": last - window_end},
        "status": _pct(status_latencies), "request_errors": errors,
    }  # fmt: skip


def measure(
    args: argparse.Namespace, workdir: Path, code: Path | None, label: str, database: str | None = None
) -> dict[str, object]:
    from fedper.export.pipeline import write_server_only_export

    artifacts = workdir / "artifacts"
    if not artifacts.exists():
        write_server_only_export(artifacts, alpha=0.25)
    data = workdir / f"data-{label}"
    env = {"FEDPER_ADMIN_TOKEN": ADMIN, "FEDPER_ENROLLMENT_KEY": ENROLL}
    if code is not None:
        env["PYTHONPATH"] = str(code)
    options: dict[str, object] = {"checkin_window": args.window, "target_clients": args.cohort, "min_clients": 1,
                                  "round_timeout": args.round_timeout, "rounds": 1}  # fmt: skip
    if code is None:
        options["max_requests_per_address"] = 0  # one address stands for the whole fleet here
    if database is not None:
        options["database"] = database
    log = workdir / f"server-{label}.log"
    tokens = _populate(database or data / "state.db", args.devices)
    server = ServerProcess(artifacts, data, options, env=env, log=log)
    with server:
        opened = time.monotonic()  # the round opens as the server starts: its window runs from here
        fleet = asyncio.run(_fleet(server.url, tokens, args, opened))
        rss = server.rss_mb()
    events = [json.loads(line[line.index("{") :]) for line in log.read_text().splitlines()
              if any(f'"{e}"' in line for e in ROUND_EVENTS)]  # fmt: skip
    drawn = [e for e in events if e["event"] == "cohort_drawn"]
    # The first draw is the measured round's (a slow run may outlast its deadline and draw the next).
    return {"code": label, **fleet, "draw": drawn[0] if drawn else None, "server_peak_rss_mb": rss,
            "round_events": events}  # fmt: skip


def main() -> None:
    p = argparse.ArgumentParser(prog="python -m bench.checkin_scale", description=__doc__)
    p.add_argument("--devices", type=int, default=100_000)
    p.add_argument("--window", type=float, default=180.0)
    p.add_argument("--arrive-over", type=float, default=150.0)
    p.add_argument("--cohort", type=int, default=1000)
    p.add_argument("--round-timeout", type=float, default=900.0)
    p.add_argument("--connections", type=int, default=256)
    p.add_argument("--old-code", type=Path, default=None, help="a checkout whose server is measured too (before)")
    p.add_argument(
        "--engines",
        nargs="+",
        choices=["sqlite", "postgres"],
        default=["sqlite"],
        help="where the server keeps its records (each measured in turn)",
    )
    p.add_argument("--name", default="checkin_scale")
    args = p.parse_args()
    results: list[dict[str, object]] = []
    tmp = tempfile.mkdtemp(prefix="checkin_scale-")
    os.chmod(tmp, 0o755)  # the scratch cluster's owner (postgres, when run as root) enters it
    try:
        _run(args, Path(tmp), results)
    except BaseException:
        print(f"the run failed; its servers' logs and data are kept in {tmp}", file=sys.stderr)
        raise
    shutil.rmtree(tmp)
    print(write_results(args.name, {"devices": args.devices, "window_s": args.window, "arrive_over_s": args.arrive_over,
                                    "cohort": args.cohort, "runs": results}))  # fmt: skip


def _run(args: argparse.Namespace, tmp: Path, results: list[dict[str, object]]) -> None:
    with contextlib.ExitStack() as stack:
        scratch = None
        if "postgres" in args.engines:
            from tests.support.postgres import cluster

            scratch = stack.enter_context(cluster(tmp / "postgres"))
        for engine in args.engines:
            for code, label in ([(args.old_code, "before")] if args.old_code else []) + [(None, "after")]:
                database = scratch.database() if engine == "postgres" and scratch is not None else None
                result = {"engine": engine, **measure(args, tmp, code, f"{label}-{engine}", database)}
                print(json.dumps(result, indent=1), flush=True)
                results.append(result)


if __name__ == "__main__":
    main()
