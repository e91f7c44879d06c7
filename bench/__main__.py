"""``make bench``: run every benchmark in turn (each prints its numbers and writes results/)."""

from __future__ import annotations

import runpy
import sys

BENCHMARKS = ["bench.export_sizes"]

if __name__ == "__main__":
    for name in BENCHMARKS:
        print(f"=== {name}", flush=True)
        sys.argv = [name]
        runpy.run_module(name, run_name="__main__")
