"""``make test-portable``: the numeric tests under every kernel set this CPU supports.

A float result depends on which kernels computed it: ATen's vectorized kernels
(``ATEN_CPU_CAPABILITY``), oneDNN's convolutions and MKL's matrix products (each picks its own
instruction set from the CPU), and the thread count (how sums are split). Another machine runs
other kernels, so a numeric test (marker ``numeric``) must pass under each. This runs them under
each kernel set the CPU can execute, at each thread count, then prints every recorded claim
(tests/support/numeric_claims.py) beside its bound: the smallest margin over all runs is the room the
threshold was set with.

    python -m tests.support.portable [--threads 1,2] [--sets default,avx2] [--out DIR] [pytest args]
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import subprocess
import sys
import time
import xml.etree.ElementTree as ET
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

from tests.support.numeric_claims import PROPERTY_PREFIX


def _cpu_has(feature: str) -> Callable[[], bool]:
    def check() -> bool:
        import torch.cpu

        return bool(getattr(torch.cpu, f"_is_{feature}_supported")())

    return check


@dataclass(frozen=True)
class KernelSet:
    name: str
    env: dict[str, str]
    what: str
    supported: Callable[[], bool] = lambda: True


# ATEN_CPU_CAPABILITY=avx512 on a CPU without AVX-512 dies of an illegal instruction (measured),
# hence the checks. ONEDNN_MAX_CPU_ISA and MKL_ENABLE_INSTRUCTIONS can only lower an ISA.
KERNEL_SETS = (
    KernelSet("default", {"ATEN_CPU_CAPABILITY": "default"},
              "ATen's scalar kernels; oneDNN and MKL at the CPU's own ISA (= ATEN_CPU_CAPABILITY=default make test)"),
    KernelSet("no-avx", {"ATEN_CPU_CAPABILITY": "default", "ONEDNN_MAX_CPU_ISA": "SSE41",
                         "MKL_ENABLE_INSTRUCTIONS": "SSE4_2"},
              "every library's pre-AVX path: a CPU without AVX"),
    KernelSet("avx2", {"ATEN_CPU_CAPABILITY": "avx2", "ONEDNN_MAX_CPU_ISA": "AVX2", "MKL_ENABLE_INSTRUCTIONS": "AVX2"},
              "an AVX2 CPU", _cpu_has("avx2")),
    KernelSet("avx512", {"ATEN_CPU_CAPABILITY": "avx512"},
              "an AVX-512 CPU (oneDNN and MKL at their own AVX-512 paths)", _cpu_has("avx512")),
)  # fmt: skip


@dataclass(frozen=True)
class Run:
    kernel_set: KernelSet
    threads: int

    @property
    def name(self) -> str:
        return f"{self.kernel_set.name}-{self.threads}t"


def _pytest(run: Run, out: Path, extra: list[str]) -> tuple[int, float]:
    """The numeric tests under one kernel set and thread count; their JUnit report in ``out``."""
    env = {**os.environ, **run.kernel_set.env, "OMP_NUM_THREADS": str(run.threads),
           "FEDPER_TEST_THREADS": str(run.threads),
           "FEDPER_TEST_EXPORTS": str((out / "exports" / run.kernel_set.name).resolve())}  # fmt: skip
    args = [sys.executable, "-m", "pytest", "-m", "numeric", "-q", "-p", "no:cacheprovider",
            f"--junitxml={out / (run.name + '.xml')}", *extra]  # fmt: skip
    start = time.monotonic()
    code = subprocess.call(args, env=env)
    return code, time.monotonic() - start


def read_claims(report: Path) -> dict[tuple[str, str], dict[str, float | str]]:
    """(test, claim) -> {value, bound, sense} from one JUnit report."""
    claims: dict[tuple[str, str], dict[str, float | str]] = {}
    for case in ET.parse(report).getroot().iter("testcase"):
        test = f"{case.get('classname', '').rsplit('.', 1)[-1]}::{case.get('name')}"
        for prop in case.iter("property"):
            name = prop.get("name", "")
            if name.startswith(PROPERTY_PREFIX):
                claims[(test, name[len(PROPERTY_PREFIX) :])] = json.loads(prop.get("value", "{}"))
    return claims


def margin(claim: dict[str, float | str]) -> float:
    value, bound = float(claim["value"]), float(claim["bound"])
    return value - bound if claim["sense"] == ">" else bound - value


def claims_table(runs: list[str], claims: dict[str, dict[tuple[str, str], dict[str, float | str]]]) -> str:
    """Markdown: each claim's bound, its value in every run and the smallest margin."""
    keys = sorted({k for per_run in claims.values() for k in per_run})
    lines = ["| test | claim | bound | " + " | ".join(runs) + " | smallest margin |",
             "|---|---|---|" + "---|" * len(runs) + "---|"]  # fmt: skip
    for test, name in keys:
        seen = [claims[r].get((test, name)) for r in runs]
        first = next(c for c in seen if c is not None)
        values = [f"{float(c['value']):.4g}" if c else "-" for c in seen]  # "-": not reached in that run
        smallest = min(margin(c) for c in seen if c)
        lines.append(f"| {test} | {name} | {first['sense']} {float(first['bound']):.4g} | " + " | ".join(values)
                     + f" | {smallest:.3g} |")  # fmt: skip
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--threads", default="1,2", help="comma-separated thread counts (default 1,2)")
    parser.add_argument("--sets", default="", help="kernel sets to run (default: every one this CPU supports)")
    parser.add_argument("--out", type=Path, default=Path("test-portable"), help="JUnit reports and claims.md")
    parser.add_argument("--claims", type=Path, help="only print the claims table of this JUnit report (make test-zoo)")
    args, extra = parser.parse_known_args(argv)
    if args.claims is not None:
        print(claims_table([args.claims.stem], {args.claims.stem: read_claims(args.claims)}))
        return 0
    wanted = set(args.sets.split(",")) if args.sets else None
    unknown = (wanted or set()) - {k.name for k in KERNEL_SETS}
    if unknown:
        parser.error(f"unknown kernel set(s) {sorted(unknown)}; choose from {', '.join(k.name for k in KERNEL_SETS)}")
    sets = [k for k in KERNEL_SETS if (wanted is None or k.name in wanted)]
    skipped = [k.name for k in sets if not k.supported()]
    runs = [Run(k, int(t)) for k in sets if k.supported() for t in args.threads.split(",")]
    args.out.mkdir(parents=True, exist_ok=True)
    shutil.rmtree(args.out / "exports", ignore_errors=True)  # exported by this code, not an earlier one
    results: dict[str, tuple[int, float]] = {}
    for run in runs:
        print(f"== {run.name}: {run.kernel_set.what}; {run.threads} thread(s): {run.kernel_set.env}", flush=True)
        results[run.name] = _pytest(run, args.out, extra)
    claims = {r.name: read_claims(args.out / f"{r.name}.xml") for r in runs if (args.out / f"{r.name}.xml").exists()}
    table = claims_table(list(claims), claims) if any(claims.values()) else "(no claims recorded)"
    summary = "\n".join(f"- {name}: {'passed' if code == 0 else f'FAILED ({code})'} in {seconds:.0f} s"
                        for name, (code, seconds) in results.items())  # fmt: skip
    if skipped:
        summary += f"\n- not supported by this CPU: {', '.join(skipped)}"
    report = f"{summary}\n\n{table}\n"
    (args.out / "claims.md").write_text(report)
    print(f"\n{report}\nwritten to {args.out / 'claims.md'}")
    return 0 if all(code == 0 for code, _ in results.values()) else 1


if __name__ == "__main__":
    sys.exit(main())
