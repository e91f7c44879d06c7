"""A fleet of thousands against one ``fedper serve``: wall time, memory, and wasted uploads.

``--devices`` emulated devices (default 1000, on each backend with each engine: eager PyTorch
and the exported ExecuTorch training program; aesthetic-synth with 10 photos each: small data,
the point is the fleet) take part in
``--rounds`` rounds of a real server on localhost with cohort selection: ``--cohort`` slots
per round (``--over-selection 1``), the round closing when the whole cohort has reported. The
fleet runs as ``fedper fleet --backend BACKEND`` with ``--max-idle-wait`` 60 s, so that devices
without a slot wait as long as the server's ``Retry-After`` says (pace steering) instead of
polling every few seconds; the server runs in its own process.

Reported: the fleet's wall time (launch to exit) and device-rounds per minute, the peak
memory of the fleet's process tree (PSS: shared pages counted once; and the RSS sum) and of
the server, and the server's own counters (``GET /metrics``): updates accepted and updates
refused by code. "Wasted" uploads are the refused ones: with cohort selection there should be
none. The reference measured in the same run is the processes backend on ``--reference-devices``
devices (default 100): its per-device memory and device-rounds per minute.

Usage: python -m bench.fleet_scale [--devices 1000] [--cohort 100] [--rounds 3]
       [--backends processes,ray] [--engines eager,executorch] [--workers 2]
       [--reference-devices 100] [--name NAME]
"""

from __future__ import annotations

import argparse
import os
import re
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path
from typing import Any

import httpx

from bench.common import write_results
from fedper.server.process import ServerProcess

ADMIN = "bench-admin-token-0123456789abcdef"
ENROLL = "bench-enrollment-key"


def _tree(root: int) -> list[int]:
    parents: dict[int, int] = {}
    for entry in os.listdir("/proc"):
        if entry.isdigit():
            try:
                stat = Path(f"/proc/{entry}/stat").read_text()
            except OSError:
                continue
            parents[int(entry)] = int(stat.rsplit(")", 1)[1].split()[1])
    children: dict[int, list[int]] = {}
    for child, parent in parents.items():
        children.setdefault(parent, []).append(child)
    todo, seen = [root], []
    while todo:
        pid = todo.pop()
        seen.append(pid)
        todo.extend(children.get(pid, []))
    return seen


def _memory_mb(pids: list[int]) -> tuple[float, float]:
    """(PSS, RSS) summed over ``pids``, in MB."""
    pss = rss = 0
    for pid in pids:
        try:
            for line in Path(f"/proc/{pid}/smaps_rollup").read_text().splitlines():
                if line.startswith("Pss:"):
                    pss += int(line.split()[1])
                elif line.startswith("Rss:"):
                    rss += int(line.split()[1])
        except OSError:
            continue
    return pss / 1024, rss / 1024


class PeakMemory:
    """Samples a process tree's memory every second in a thread; keeps the peaks."""

    def __init__(self, root: int):
        self.root, self.pss, self.rss = root, 0.0, 0.0
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, daemon=True)
        self._thread.start()

    def _run(self) -> None:
        while not self._stop.wait(1.0):
            pss, rss = _memory_mb(_tree(self.root))
            self.pss, self.rss = max(self.pss, pss), max(self.rss, rss)

    def stop(self) -> None:
        self._stop.set()
        self._thread.join()


def _counters(url: str) -> dict[str, float]:
    text = httpx.get(f"{url}/metrics").text
    out = {}
    for name, labels, value in re.findall(r"^(fedper_updates_\w+?)(?:_total)?(\{[^}]*\})? ([0-9.e+]+)$", text, re.M):
        out[name + labels] = float(value)
    return out


def export_for_fleet(workdir: Path) -> Path:
    """The real export the devices run (width 0.25, 32 px, aesthetic-synth's 5 ratings)."""
    artifacts = workdir / "artifacts"
    command = [sys.executable, "-m", "fedper.cli", "export", "--dataset", "aesthetic-synth", "--alpha", "0.25",
               "--out", str(artifacts)]  # fmt: skip
    subprocess.run(command, check=True, stdout=subprocess.DEVNULL)
    return artifacts


def run_fleet(
    devices: int, cohort: int, rounds: int, backend: str, engine: str, workers: int, artifacts: Path,
    workdir: Path, idle_wait: float,
) -> dict[str, Any]:  # fmt: skip
    data = workdir / f"{backend}-{engine}-{devices}"
    env = {**os.environ, "FEDPER_ADMIN_TOKEN": ADMIN, "FEDPER_ENROLLMENT_KEY": ENROLL}
    server = ServerProcess(
        artifacts, data / "server",
        {"rounds": rounds, "target_clients": cohort, "min_clients": cohort, "cohort_size": cohort,
         "over_selection": 1, "round_timeout": 0, "local_epochs": 1, "retry_after": 2,
         "enroll_per_minute": 1_000_000, "enroll_total_per_minute": 0, "max_requests_per_address": 0},
        env={"FEDPER_ADMIN_TOKEN": ADMIN, "FEDPER_ENROLLMENT_KEY": ENROLL},
        log=data / "server.log",
    )  # fmt: skip
    with server:
        command = [
            sys.executable, "-m", "fedper.cli", "fleet", "--server", server.url, "--devices", str(devices),
            "--backend", backend, "--workers", str(workers), "--engine", engine,
            "--dataset", "aesthetic-synth", "--users", str(devices), "--images-per-user", "10",
            "--storage", str(data / "fleet"), "--max-idle-wait", str(idle_wait),
        ]  # fmt: skip
        start = time.perf_counter()
        fleet = subprocess.Popen(command, env=env, stdout=subprocess.DEVNULL, stderr=(data / "fleet.log").open("w"))
        peak = PeakMemory(fleet.pid)
        code = fleet.wait()
        seconds = time.perf_counter() - start
        peak.stop()
        counters = _counters(server.url)
        server_rss = server.rss_mb()
    if code != 0:
        raise SystemExit(f"the fleet exited with {code}; see {data / 'fleet.log'}")
    refused = {k: v for k, v in counters.items() if k.startswith("fedper_updates_rejected{")}
    return {
        "backend": backend, "engine": engine, "devices": devices, "cohort": cohort, "rounds": rounds, "workers": workers,
        "seconds": seconds, "device_rounds_per_minute": cohort * rounds / seconds * 60,
        "fleet_peak_pss_mb": peak.pss, "fleet_peak_rss_sum_mb": peak.rss, "server_peak_rss_mb": server_rss,
        "accepted": counters.get("fedper_updates_accepted", 0.0), "refused": refused,
        "wasted": sum(refused.values()),
    }  # fmt: skip


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--devices", type=int, default=1000)
    parser.add_argument("--cohort", type=int, default=100)
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--backends", default="processes,ray", help="comma-separated: processes, ray")
    parser.add_argument("--engines", default="eager,executorch", help="comma-separated: eager, executorch")
    parser.add_argument("--workers", type=int, default=2)
    parser.add_argument(
        "--max-idle-wait", type=float, default=60.0,
        help="the devices' longest wait between polls: large, so that they follow the server's pace steering",
    )  # fmt: skip
    parser.add_argument("--reference-devices", type=int, default=100, help="the processes backend's run (0: skip)")
    parser.add_argument("--name", default="fleet_scale", help="results file name (bench/results/NAME.json)")
    args = parser.parse_args()
    rows = []
    with tempfile.TemporaryDirectory() as tmp:
        cohort = min(args.cohort, args.devices)
        runs = [(args.devices, cohort, b, e) for e in args.engines.split(",") for b in args.backends.split(",")]
        if args.reference_devices:
            ref = args.reference_devices
            runs.insert(0, (ref, min(args.cohort, ref), "processes", "eager"))
        artifacts = export_for_fleet(Path(tmp))
        for devices, cohort, backend, engine in runs:
            row = run_fleet(devices, cohort, args.rounds, backend, engine, args.workers, artifacts, Path(tmp),
                            args.max_idle_wait)  # fmt: skip
            rows.append(row)
            print(
                f"{backend}, {engine}: {devices} devices, cohort {cohort}, {args.rounds} rounds: {row['seconds']:.0f} s "
                f"({row['device_rounds_per_minute']:.0f} device-rounds/min), fleet peak PSS "
                f"{row['fleet_peak_pss_mb']:.0f} MB ({row['fleet_peak_pss_mb'] / devices:.1f} MB per device; "
                f"RSS sum {row['fleet_peak_rss_sum_mb']:.0f} MB), server peak RSS {row['server_peak_rss_mb']:.0f} MB, "
                f"{row['accepted']:.0f} updates accepted, {row['wasted']:.0f} refused {row['refused']}",
                flush=True,
            )
    print("wrote", write_results(args.name, {"rows": rows}))


if __name__ == "__main__":
    main()
