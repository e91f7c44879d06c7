"""``make bench``: run every benchmark in turn (each prints its numbers and writes results/)."""

from __future__ import annotations

import runpy
import sys

BENCHMARKS = [
    "bench.payload",
    "bench.aggregate",
    "bench.secagg_cost",
    "bench.server_ingest",
    "bench.train_step",
    "bench.export_sizes",
    "bench.export_time",
    "bench.export_passes",
    "bench.train_memory",
    "bench.step_profile",
    "bench.price_table",
    "bench.fleet_scale",
    "bench.model_zoo",
]

if __name__ == "__main__":
    only = sys.argv[1:]
    for name in BENCHMARKS:
        if only and name.split(".")[-1] not in only:
            continue
        print(f"=== {name}", flush=True)
        sys.argv = [name]
        runpy.run_module(name, run_name="__main__")
