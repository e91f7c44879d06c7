"""What every benchmark shares: the machine description and the results file."""

from __future__ import annotations

import json
import os
import platform
from pathlib import Path
from typing import Any

import torch

RESULTS = Path(__file__).parent / "results"


def machine() -> dict[str, Any]:
    cpu = "unknown"
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                cpu = line.split(":", 1)[1].strip()
                break
    except OSError:
        pass
    return {
        "cpu": cpu,
        "cores": os.cpu_count(),
        "torch_threads": torch.get_num_threads(),
        "python": platform.python_version(),
        "torch": torch.__version__,
    }


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
