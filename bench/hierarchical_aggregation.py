"""What the root of a hierarchical FedAvg (fedper/common/hierarchical.py) receives and does,
against one flat aggregator, for the same updates, measured in one run.

``--devices`` updates of MobileNet-V1's base (width ``--alpha``), random, each device weighted by
a random number of samples, are aggregated flat (one FedAvg over every update, one at a time)
and by regions (each of ``--regions`` sums its devices' updates, forwards its float64 sum as
bytes, the root decodes and combines them). Reported per region count: the bytes the root
receives, the root's seconds (decoding and combining the forwarded sums; flat: adding every
update), the regions' seconds (the slowest region's sum and encoding, as regions run in
parallel; making the random updates is not timed), and how far the
two results are apart in float32 units in the last place. Updates are taken in device order
within a region and by region number at the root (the server orders by sha256; the cost is the
same).

Usage: python -m bench.hierarchical_aggregation [--devices 1000] [--regions 10 32 100]
"""

from __future__ import annotations

import argparse
import tempfile
import time
from pathlib import Path
from typing import Any

import numpy as np

from bench.common import write_results
from fedper.common.aggregate import FedAvg
from fedper.common.hierarchical import combine, decode, encode, region_of, regional_sum


def _update(layout: list[tuple[str, tuple[int, ...]]], device: int) -> tuple[dict[str, np.ndarray], int]:
    rng = np.random.default_rng(device)
    return {n: rng.standard_normal(s).astype(np.float32) for n, s in layout}, int(rng.integers(1, 500))


def main() -> None:
    p = argparse.ArgumentParser(prog="python -m bench.hierarchical_aggregation", description=__doc__)
    p.add_argument("--devices", type=int, default=1000)
    p.add_argument("--regions", type=int, nargs="+", default=[10, 32, 100])
    p.add_argument("--alpha", type=float, default=0.25)
    p.add_argument("--name", default="hierarchical_aggregation")
    args = p.parse_args()
    from fedper.common.manifest import read_manifest
    from fedper.export.pipeline import write_server_only_export

    with tempfile.TemporaryDirectory() as tmp:
        layout = read_manifest(write_server_only_export(Path(tmp) / "a", alpha=args.alpha)).layout("base")
    floats = sum(int(np.prod(s)) for _, s in layout)
    ids = [f"d-{i:016x}" for i in range(args.devices)]
    flat, flat_s = FedAvg(layout, group=1), 0.0
    for device in range(args.devices):
        update = _update(layout, device)
        began = time.perf_counter()
        flat.add(*update)
        flat_s += time.perf_counter() - began
    began = time.perf_counter()
    flat_result = flat.result()
    flat_s += time.perf_counter() - began  # the adding and the division, not making the updates
    runs: list[dict[str, Any]] = []
    for regions in args.regions:
        members: dict[int, list[int]] = {}
        for device, name in enumerate(ids):
            members.setdefault(region_of(name, regions), []).append(device)
        forwarded, slowest = [], 0.0
        for region, devices in sorted(members.items()):
            updates = [_update(layout, d) for d in devices]
            began = time.perf_counter()
            forwarded.append(encode(regional_sum(layout, region, updates)))
            slowest = max(slowest, time.perf_counter() - began)
        began = time.perf_counter()
        result = combine(layout, [decode(data, layout) for data in forwarded])
        root_s = time.perf_counter() - began
        ulps = max(int(np.abs(result[n].view(np.int32).astype(np.int64) - flat_result[n].view(np.int32)
                              .astype(np.int64)).max()) for n, _ in layout)  # fmt: skip
        differing = sum(int((result[n] != flat_result[n]).sum()) for n, _ in layout)
        run = {"regions": regions, "root_bytes": sum(len(d) for d in forwarded), "root_s": root_s,
               "slowest_region_s": slowest, "largest_region": max(len(m) for m in members.values()),
               "max_ulps_from_flat": ulps, "floats_differing_from_flat": differing}  # fmt: skip
        print(run, flush=True)
        runs.append(run)
    print(write_results(args.name, {"devices": args.devices, "alpha": args.alpha, "floats": floats,
                                    "flat": {"root_bytes": args.devices * 4 * floats, "root_s": flat_s},
                                    "runs": runs}))  # fmt: skip


if __name__ == "__main__":
    main()
