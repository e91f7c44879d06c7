"""``make poisoning``: one hostile device of 10 against each aggregation option (docs/SERVER.md).

FedPer on digits (10 clients, 4 classes each, kp=2, 5 rounds of 2 local epochs), client 0
hostile from round 1: it trains like the others, then sends one of the attacks below instead
of its update. The table gives the 9 honest clients' mean final accuracy (mean ± std over
seeds) per attack and aggregation, beside the clean run; what the server would refuse (a
negative BatchNorm variance) is left out of the round, as the server leaves it out.
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from collections.abc import Callable, Sequence
from concurrent.futures import ProcessPoolExecutor
from pathlib import Path

import numpy as np

from fedper._recipes.doc_block import write_block
from fedper._recipes.simulation import Arrays, SimulationConfig, run
from fedper.common.atomic_write import atomic_write_text
from fedper.common.robust_aggregate import BATCHNORM_VARIANCE, AggregationConfig
from fedper.common.train_config import TrainConfig
from fedper.data import DataConfig

HOSTILE = 0  # the attacker's client index
BEGIN, END = "<!-- poisoning:begin (make poisoning) -->", "<!-- poisoning:end -->"
Attack = Callable[[Arrays, int, Arrays], tuple[Arrays, int]]  # (update, num_samples, base) -> sent


def _delta(update: Arrays, base: Arrays) -> Arrays:
    return {n: update[n].astype(np.float64) - base[n] for n in base}


def _positive_variances(tensors: dict[str, np.ndarray]) -> Arrays:
    """An attacker who knows the server refuses negative variances keeps them positive."""
    return {n: (np.abs(v) if n.endswith(BATCHNORM_VARIANCE) else v).astype(np.float32) for n, v in tensors.items()}


def _poison_variance(update: Arrays, n: int, base: Arrays) -> tuple[Arrays, int]:
    out = dict(update)
    name = sorted(k for k in update if k.endswith(BATCHNORM_VARIANCE))[0]
    out[name] = update[name].copy()
    out[name][0] = -40.0
    return out, n


ATTACKS: dict[str, Attack | None] = {
    "none (clean run)": None,
    "base + 1e30, n = 100,000 (finding 1)": lambda u, n, b: (_positive_variances({k: b[k] + 1e30 for k in b}), 100_000),
    "-1000 x base (finding 1)": lambda u, n, b: (_positive_variances({k: -1000.0 * b[k] for k in b}), n),
    "ascent, 2.9 x its step, n = 100,000 (finding 2)": lambda u, n, b: (
        _positive_variances({k: b[k] - 2.9 * d for k, d in _delta(u, b).items()}), 100_000),
    "one BatchNorm variance -40 (finding 3)": _poison_variance,
    "sign flip (-1 x its step)": lambda u, n, b: (
        _positive_variances({k: b[k] - d for k, d in _delta(u, b).items()}), n),
    "scaled step (10 x)": lambda u, n, b: (_positive_variances({k: b[k] + 10 * d for k, d in _delta(u, b).items()}), n),
}  # fmt: skip
AGGREGATIONS: dict[str, AggregationConfig] = {
    "plain FedAvg": AggregationConfig(clip_factor=0, weight_cap=0),
    "defaults (mean, clip 3x, cap 3x)": AggregationConfig(),
    "median": AggregationConfig(aggregate="median"),
    "trimmed-mean (0.1)": AggregationConfig(aggregate="trimmed-mean"),
}
SEEDS = (0, 1, 2)


def one_run(attack: str, aggregation: str, seed: int, out: Path) -> float:
    """The honest clients' mean final FedPer accuracy of one run (reused from ``out`` if there)."""
    path = out / f"{list(ATTACKS).index(attack)}-{list(AGGREGATIONS).index(aggregation)}-seed{seed}.json"
    if path.exists():
        return float(json.loads(path.read_text())["honest_mean"])
    chosen = ATTACKS[attack]

    def tamper(client: int, update: Arrays, n: int, base: Arrays) -> tuple[Arrays, int] | None:
        return chosen(update, n, base) if chosen is not None and client == HOSTILE else (update, n)

    sim = SimulationConfig(algorithms=("fedper",), kp=2, rounds=5, training=TrainConfig(local_epochs=2), threads=1,
                           aggregation=AGGREGATIONS[aggregation], out=out / path.stem)  # fmt: skip
    data = DataConfig(dataset="digits", num_clients=10, classes_per_client=4, seed=seed)
    recorder = run(sim, data, tamper=tamper)
    final = recorder.final("fedper")["final_per_client"]
    honest_mean = float(np.mean([float(a) for c, a in final.items() if int(c) != HOSTILE]))
    result = {"attack": attack, "aggregation": aggregation, "seed": seed, "honest_mean": honest_mean,
              "aggregation_reports": recorder.aggregation["fedper"]}  # fmt: skip
    atomic_write_text(path, json.dumps(result) + "\n")
    return honest_mean


def table(results: dict[tuple[str, str], list[float]]) -> str:
    lines = [
        f"FedPer on digits, 10 clients (client {HOSTILE} hostile), 5 rounds; the 9 honest clients' mean final "
        f"accuracy, mean ± std over seeds {', '.join(map(str, SEEDS))}:",
        "",
        "| attack | " + " | ".join(AGGREGATIONS) + " |",
        "|---|" + "---|" * len(AGGREGATIONS),
    ]
    for attack in ATTACKS:
        cells = [f"{np.mean(v):.3f} ± {np.std(v):.3f}" for v in (results[attack, a] for a in AGGREGATIONS)]
        lines.append(f"| {attack} | " + " | ".join(cells) + " |")
    return "\n".join(lines) + "\n"


def write_into(doc: Path, text: str) -> None:
    """Replace the block between BEGIN and END in ``doc`` with ``text``."""
    write_block(doc, BEGIN, END, text)


def main(argv: Sequence[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="python -m fedper._recipes.poisoning", description=__doc__)
    p.add_argument("--out", type=Path, default=Path("runs/poisoning"), help="where the runs go (reused)")
    p.add_argument("--jobs", type=int, default=2, help="runs at a time (each one torch thread)")
    p.add_argument("--write", type=Path, default=None, help="replace the poisoning block of this markdown file")
    args = p.parse_args(argv)
    args.out.mkdir(parents=True, exist_ok=True)
    start = time.perf_counter()
    keys = [(a, g, s) for a in ATTACKS for g in AGGREGATIONS for s in SEEDS]
    with ProcessPoolExecutor(args.jobs) as pool:
        values = list(pool.map(one_run, *zip(*keys, strict=True), [args.out] * len(keys)))
    results: dict[tuple[str, str], list[float]] = {}
    for (attack, aggregation, _), value in zip(keys, values, strict=True):
        results.setdefault((attack, aggregation), []).append(value)
    text = table(results)
    print(text)
    if args.write is not None:
        write_into(args.write, text)
    print(f"{len(keys)} runs, {time.perf_counter() - start:.0f} s", file=sys.stderr)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
