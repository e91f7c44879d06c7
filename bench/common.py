"""What every benchmark shares: the machine description and the results file."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path
from typing import Any

from fedper.environment import numeric_environment

RESULTS = Path(__file__).parent / "results"


def machine() -> dict[str, Any]:
    """The results' machine: the fields every benchmark reported before, and the kernel set."""
    env = numeric_environment()
    return {"cpu": env["cpu"], "cores": env["cores"], "torch_threads": env["torch_threads"], "python": env["python"],
            "torch": env["torch"], "cpu_capability": env["cpu_capability"]}  # fmt: skip


def peak_rss_mb() -> float:
    """Peak resident set size of this process's program so far: ``VmHWM``, not ``getrusage``'s
    ``ru_maxrss``, which a process started by ``subprocess`` inherits from its parent (Linux
    keeps it across fork and exec), so a benchmark's child reported the parent's peak."""
    return _status_mb("VmHWM")


def current_rss_mb() -> float:
    """Resident set size now (after imports and setup), to tell it from a run's peak."""
    return _status_mb("VmRSS")


def _status_mb(field: str) -> float:
    for line in Path("/proc/self/status").read_text().splitlines():
        if line.startswith(f"{field}:"):
            return int(line.split()[1]) / 1024  # kB
    return float("nan")


def write_results(name: str, payload: dict[str, Any]) -> Path:
    RESULTS.mkdir(parents=True, exist_ok=True)
    path = RESULTS / f"{name}.json"
    path.write_text(json.dumps({"machine": machine(), **payload}, indent=2) + "\n")
    return path


def run_child(module: str, *args: str) -> dict[str, Any]:
    """``python -m module --child args`` in a fresh process (a clean RSS peak, a thread pool set
    before anything loads); its last line of output is a JSON object, returned."""
    out = subprocess.run([sys.executable, "-m", module, "--child", *args], capture_output=True, text=True)
    if out.returncode != 0:
        raise RuntimeError(out.stderr[-3000:])
    result: dict[str, Any] = json.loads(out.stdout.strip().splitlines()[-1])
    return result
