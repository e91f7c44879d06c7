"""Streaming FedAvg over K MobileNet-V1 width-1.0 base updates, against Flower's and memcpy.

For K = 10, 100, 1000: updates/s and bytes/s of ``fedper.common.aggregate.FedAvg``, of Flower's
``flwr.server.strategy.aggregate.aggregate`` on the same updates, and of a numpy copy of
the same float32 bytes (the machine's memory bandwidth, measured in the same run); peak
RSS of each, measured in a fresh process. Updates cycle through a pool of 8 distinct
random ones, so the inputs themselves do not grow with K.

Usage: python -m bench.aggregate [--ks 10,100,1000]
"""

from __future__ import annotations

import argparse
import json
import subprocess
import sys
import tempfile
import time

import numpy as np

from bench.common import peak_rss_mb, write_results

POOL = 8


def _layout() -> list[tuple[str, tuple[int, ...]]]:
    from fedper.models import ModelConfig, build_model, split

    model = build_model(ModelConfig(alpha=1.0, input_size=32))
    state = model.state_dict()
    return [(n, tuple(state[n].shape)) for n in split(model, 2).base]


def _pool(layout: list[tuple[str, tuple[int, ...]]]) -> list[dict[str, np.ndarray]]:
    rng = np.random.default_rng(0)
    return [{n: rng.standard_normal(s, dtype=np.float32) for n, s in layout} for _ in range(POOL)]


def run_one(kind: str, k: int, layout_file: str) -> dict[str, float]:
    """In a fresh process: the first pass over K updates ("cold": memory is being allocated
    and first touched, as in a server's round), then the median of three more ("warm")."""
    with open(layout_file) as f:
        layout = [(n, tuple(s)) for n, s in json.load(f)]
    pool = _pool(layout)
    nbytes = sum(int(np.prod(s)) * 4 for _, s in layout)
    weights = [int(n) for n in np.random.default_rng(1).integers(1, 1000, size=k)]
    times = []
    for _ in range(4):
        start = time.perf_counter()
        _work(kind, k, layout, pool, weights)
        times.append(time.perf_counter() - start)
    cold, warm = times[0], sorted(times[1:])[1]
    return {
        "cold_updates_per_s": k / cold,
        "updates_per_s": k / warm,
        "bytes_per_s": k * nbytes / warm,
        "peak_rss_mb": peak_rss_mb(),
        "update_bytes": nbytes,
    }


def _work(
    kind: str,
    k: int,
    layout: list[tuple[str, tuple[int, ...]]],
    pool: list[dict[str, np.ndarray]],
    weights: list[int],
) -> None:
    if kind == "fedper":
        from fedper.common.aggregate import FedAvg

        agg = FedAvg(layout)
        for i in range(k):
            agg.add(pool[i % POOL], weights[i])
        agg.result()
    elif kind == "flower":
        from flwr.server.strategy.aggregate import aggregate

        results = [([pool[i % POOL][n] for n, _ in layout], weights[i]) for i in range(k)]
        aggregate(results)
    elif kind == "memcpy":  # copy into preallocated arrays (the destination stays cached)
        dst = {n: np.empty(s, dtype=np.float32) for n, s in layout}
        for i in range(k):
            for n, _ in layout:
                np.copyto(dst[n], pool[i % POOL][n])
    elif kind == "copy":  # numpy's copy of each array (allocates, as a received update does)
        for i in range(k):
            copies = [pool[i % POOL][n].copy() for n, _ in layout]
            del copies
    else:
        raise ValueError(kind)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--ks", default="10,100,1000")
    parser.add_argument("--one", nargs=3, help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.one:
        print(json.dumps(run_one(args.one[0], int(args.one[1]), args.one[2])))
        return
    with tempfile.NamedTemporaryFile("w", suffix=".json", delete=False) as layout_file:
        json.dump(_layout(), layout_file)
    rows = []
    for k in (int(x) for x in args.ks.split(",")):
        row: dict[str, object] = {"k": k}
        for kind in ("memcpy", "copy", "fedper", "flower"):
            out = subprocess.run(
                [sys.executable, "-m", "bench.aggregate", "--one", kind, str(k), layout_file.name],
                capture_output=True, text=True, check=False,
            )  # fmt: skip
            if out.returncode != 0:
                row[kind] = {"error": out.stderr.strip().splitlines()[-1:]}
                continue
            row[kind] = json.loads(out.stdout.strip().splitlines()[-1])
        rates = {kind: row[kind] for kind in ("fedper", "flower", "memcpy", "copy")}
        if all(isinstance(r, dict) and "updates_per_s" in r for r in rates.values()):
            fp, fl = rates["fedper"], rates["flower"]
            row["vs_flower_warm"] = fp["updates_per_s"] / fl["updates_per_s"]  # type: ignore[index]
            row["vs_flower_cold"] = fp["cold_updates_per_s"] / fl["cold_updates_per_s"]  # type: ignore[index]
            row["vs_memcpy"] = fp["updates_per_s"] / rates["memcpy"]["updates_per_s"]  # type: ignore[index]
            row["vs_copy"] = fp["updates_per_s"] / rates["copy"]["updates_per_s"]  # type: ignore[index]
            print(
                f"K={k:5d} updates/s warm (cold): fedper {fp['updates_per_s']:6.0f} "  # type: ignore[index]
                f"({fp['cold_updates_per_s']:4.0f}), flower {fl['updates_per_s']:6.0f} "  # type: ignore[index]
                f"({fl['cold_updates_per_s']:4.0f}), memcpy {rates['memcpy']['updates_per_s']:6.0f}; "  # type: ignore[index]
                f"peak RSS fedper {fp['peak_rss_mb']:5.0f} MB, flower {fl['peak_rss_mb']:5.0f} MB; "  # type: ignore[index]
                f"fedper/flower {row['vs_flower_warm']:.1f}x warm, {row['vs_flower_cold']:.1f}x cold; "
                f"fedper/memcpy {100 * row['vs_memcpy']:.0f}%",  # type: ignore[operator]
                flush=True,
            )
        else:
            print(f"K={k}: a measurement failed: {rates}", flush=True)
        rows.append(row)
    print("wrote", write_results("aggregate", {"rows": rows}))


if __name__ == "__main__":
    main()
