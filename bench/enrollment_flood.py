"""An enrollment flood against a slow attestation verifier, on a real ``fedper serve``.

The server runs the documented defaults with ``--attestation bench.slow_attestation:verify``, a
verifier taking ``--verifier-seconds`` (5) per token. An honest, enrolled device asks for its
task (``GET /v1/task``) every 50 ms: ``--quiet-seconds`` (15) alone, then ``--flood-seconds``
(30) while ``--concurrent`` (600) enrollments with fake tokens, from ``--attackers`` (20)
loopback addresses, each take a challenge and enroll, again and again. Reported: the honest
task's p50/p99 latency quiet and under the flood (their ratio, measured in the same run: the
target is at most 3), what the flood got (status codes), and a new phone on another address
enrolling during the flood with a genuine token, retrying after 429/503 as the protocol says:
its answer, attempts and seconds.

Usage: python -m bench.enrollment_flood [--verifier-seconds 5] [--concurrent 600] [--attackers 20]
       [--quiet-seconds 15] [--flood-seconds 30] [--name enrollment_flood]
"""

from __future__ import annotations

import argparse
import asyncio
import multiprocessing
import statistics
import tempfile
import time
from collections import Counter
from multiprocessing.queues import Queue
from multiprocessing.synchronize import Event
from pathlib import Path

import httpx
import numpy as np

from bench.common import write_results
from fedper.server.process import ServerProcess

ADMIN, ENROLL = "bench-admin-token-0123456789abcdefghij", "bench-enroll"
REPO = Path(__file__).resolve().parent.parent
PHONE_ADDRESS = "127.0.0.250"


async def _enroll(client: httpx.AsyncClient, token_for: str | None) -> httpx.Response:
    """Take a challenge and enroll with its nonce: a genuine token if ``token_for`` (the
    platform) is given, else a fake one. A refused challenge's answer is returned as is."""
    challenge = await client.post("/v1/devices/challenge", json={"enrollment_key": ENROLL})
    if challenge.status_code != 201:
        return challenge
    nonce = challenge.json()["nonce"]
    token = f"genuine-{token_for}-{nonce}" if token_for else "fake-token"
    body = {"enrollment_key": ENROLL, "platform": token_for or "android", "attestation": token, "nonce": nonce}
    return await client.post("/v1/devices", json=body)


def _client(url: str, address: str, timeout: float = 120) -> httpx.AsyncClient:
    transport = httpx.AsyncHTTPTransport(local_address=address, limits=httpx.Limits(max_connections=1000))
    return httpx.AsyncClient(base_url=url, transport=transport, timeout=timeout)


def _probe(url: str, token: str, stop: Event, out: Queue[list[tuple[float, float, int]]]) -> None:
    """The honest device asking for its task every 50 ms, in its own process (the flood's client
    loop would otherwise hold the GIL the probe's timing needs): (started, seconds, status)."""
    latencies = []
    with httpx.Client(base_url=url, headers={"Authorization": f"Bearer {token}"}, timeout=60) as client:
        while not stop.is_set():
            start = time.monotonic()
            try:
                status = client.get("/v1/task").status_code
            except httpx.HTTPError:
                status = 0
            latencies.append((start, time.monotonic() - start, status))
            stop.wait(0.05)
    out.put(latencies)


async def _flood(url: str, attackers: int, concurrent: int, seconds: float) -> tuple[Counter[int], dict[str, object]]:
    """``concurrent`` fake enrollments at a time from ``attackers`` addresses for ``seconds``;
    meanwhile, after a third of it, a new phone enrolls (retrying as told)."""
    codes: Counter[int] = Counter()
    deadline = time.monotonic() + seconds
    clients = [_client(url, f"127.0.0.{2 + i}") for i in range(attackers)]

    async def attacker(client: httpx.AsyncClient) -> None:
        while time.monotonic() < deadline:
            try:
                codes[(await _enroll(client, None)).status_code] += 1
            except httpx.HTTPError:
                codes[0] += 1

    async def phone() -> dict[str, object]:
        await asyncio.sleep(seconds / 3)
        start, attempts, answers = time.perf_counter(), 0, []
        async with _client(url, PHONE_ADDRESS) as client:
            while time.perf_counter() - start < 120:
                attempts += 1
                r = await _enroll(client, "android")
                answers.append(r.status_code)
                if r.status_code not in (429, 503):
                    break
                await asyncio.sleep(float(r.headers.get("Retry-After", "1")))
        return {"status": answers[-1], "answers": answers, "attempts": attempts,
                "seconds": time.perf_counter() - start}  # fmt: skip

    try:
        tasks = [asyncio.create_task(attacker(clients[i % attackers])) for i in range(concurrent)]
        phone_result = await phone()
        await asyncio.gather(*tasks)
    finally:
        for client in clients:
            await client.aclose()
    return codes, phone_result


def _percentiles(latencies: list[float]) -> dict[str, float]:
    return {"requests": len(latencies), "p50_ms": 1000 * statistics.median(latencies),
            "p99_ms": 1000 * float(np.percentile(latencies, 99)), "max_ms": 1000 * max(latencies)}  # fmt: skip


def measure(args: argparse.Namespace, workdir: Path) -> dict[str, object]:
    from fedper.export.pipeline import write_server_only_export

    artifacts = write_server_only_export(workdir / "artifacts", alpha=0.25)
    server = ServerProcess(
        artifacts, workdir / "data", {"attestation": "bench.slow_attestation:verify"},
        env={"FEDPER_ADMIN_TOKEN": ADMIN, "FEDPER_ENROLLMENT_KEY": ENROLL, "PYTHONPATH": str(REPO),
             "FEDPER_BENCH_VERIFIER_SECONDS": str(args.verifier_seconds)},
        log=workdir / "server.log",
    )  # fmt: skip
    with server:

        async def enroll_honest() -> str:
            async with _client(server.url, "127.0.0.1") as client:
                r = await _enroll(client, "android")
                assert r.status_code == 201, r.text
                token: str = r.json()["token"]
                return token

        token = asyncio.run(enroll_honest())
        context = multiprocessing.get_context("spawn")
        stop, out = context.Event(), context.Queue()
        probe = context.Process(target=_probe, args=(server.url, token, stop, out))
        probe.start()
        quiet_start = time.monotonic()
        time.sleep(args.quiet_seconds)
        flood_start = time.monotonic()
        codes, phone = asyncio.run(_flood(server.url, args.attackers, args.concurrent, args.flood_seconds))
        flood_end = time.monotonic()
        stop.set()
        latencies = out.get(timeout=120)
        probe.join()
        peak_rss = server.rss_mb()
    statuses = Counter(status for t, _, status in latencies if t >= flood_start)

    def between(start: float, end: float) -> list[float]:
        return [s for t, s, _ in latencies if start <= t < end]

    quiet = _percentiles(between(quiet_start, flood_start))
    flood = _percentiles(between(flood_start, flood_end))
    return {
        "verifier_seconds": args.verifier_seconds, "attackers": args.attackers, "concurrent": args.concurrent,
        "quiet_seconds": args.quiet_seconds, "flood_seconds": args.flood_seconds,
        "task_quiet": quiet, "task_flood": flood, "task_p99_ratio": flood["p99_ms"] / quiet["p99_ms"],
        "task_statuses_during_flood": dict(statuses), "flood_answers": dict(codes), "new_phone": phone,
        "server_peak_rss_mb": peak_rss,
    }  # fmt: skip


def main() -> None:
    p = argparse.ArgumentParser(prog="python -m bench.enrollment_flood", description=__doc__)
    p.add_argument("--verifier-seconds", type=float, default=5.0)
    p.add_argument("--concurrent", type=int, default=600)
    p.add_argument("--attackers", type=int, default=20)
    p.add_argument("--quiet-seconds", type=float, default=15.0)
    p.add_argument("--flood-seconds", type=float, default=30.0)
    p.add_argument("--name", default="enrollment_flood")
    args = p.parse_args()
    with tempfile.TemporaryDirectory() as tmp:
        result = measure(args, Path(tmp))
    quiet, flood, phone = result["task_quiet"], result["task_flood"], result["new_phone"]
    print(f"honest /v1/task quiet p50 {quiet['p50_ms']:.1f} ms p99 {quiet['p99_ms']:.1f} ms; under the flood "  # type: ignore[index]
          f"p50 {flood['p50_ms']:.1f} ms p99 {flood['p99_ms']:.1f} ms (ratio {result['task_p99_ratio']:.2f}); "  # type: ignore[index]
          f"flood answers {result['flood_answers']}; new phone {phone}")  # fmt: skip
    print(write_results(args.name, result))


if __name__ == "__main__":
    main()
