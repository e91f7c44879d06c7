"""What computed a run's floats: library versions, the CPU and the kernel set.

The same seed gives the same numbers only on the same kernel set: ATen picks vectorized
kernels by CPU (``ATEN_CPU_CAPABILITY`` overrides it), oneDNN and MKL pick theirs, and the
thread count splits sums. Even initial weights differ in the last bit: ATen's ``uniform_``
rounds differently in its AVX2 variant (measured: docs/TESTING.md). A results file says which it was.
"""

from __future__ import annotations

import os
import platform
from importlib.metadata import PackageNotFoundError, version
from pathlib import Path
from typing import Any

import torch

# Environment variables that change which kernels compute (recorded when set).
KERNEL_VARIABLES = ("ATEN_CPU_CAPABILITY", "ONEDNN_MAX_CPU_ISA", "MKL_ENABLE_INSTRUCTIONS", "OMP_NUM_THREADS")


def cpu_model() -> str:
    """The CPU's model name from /proc/cpuinfo ("unknown" elsewhere)."""
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return "unknown"


def _installed(package: str) -> str | None:
    try:
        return version(package)
    except PackageNotFoundError:
        return None


def numeric_environment(threads: int | None = None) -> dict[str, Any]:
    """This process's versions, CPU, kernel set (``torch.backends.cpu.get_cpu_capability()``) and
    thread count, for ``results.json``; ``threads``: the count the computing processes use, when
    they are not this one (a fleet's workers)."""
    out: dict[str, Any] = {
        "torch": torch.__version__,
        "executorch": _installed("executorch"),
        "numpy": _installed("numpy"),
        "python": platform.python_version(),
        "cpu": cpu_model(),
        "machine": platform.machine(),
        "cores": os.cpu_count(),
        "cpu_capability": torch.backends.cpu.get_cpu_capability(),
        "torch_threads": torch.get_num_threads() if threads is None else threads,
    }
    given = {name: os.environ[name] for name in KERNEL_VARIABLES if name in os.environ}
    if given:
        out["kernel_variables"] = given
    return out
