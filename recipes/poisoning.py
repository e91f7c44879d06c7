"""``make poisoning``: hostile devices inside the bounds against each aggregation option (docs/SERVER.md).

FedPer on digits (10 clients, 4 classes each, kp=2, 10 rounds of 2 local epochs). The last
``k`` clients are hostile from round 1: they train like the others, then send an attack
instead of their update. They are the last so that, called in client order, they see the
round's honest updates first: omniscient attackers, the strongest case. Each keeps inside
the bound the defaults set (2.99 times its own honest distance from the base, per clipping
group) and claims its honest number of examples, so neither the clip nor the weight cap
fires on it.

Per run: the honest clients' mean final accuracy, and for every round the published step
measured against the honest step (the sample-weighted mean of the honest clients' updates,
what plain FedAvg would publish without the attackers): its *progress* along it (1: as the
honest step; below 0: backwards) and its *drift* off it (the rest of the step, in honest
steps). Both in units where each clipping group (weights, BatchNorm statistics) counts
alike: their scales differ 5-30x, and an attack on one BatchNorm mean should not vanish
beside the weights.
"""

from __future__ import annotations

import json
import math
import re
import sys
import time
from collections.abc import Sequence
from concurrent.futures import ProcessPoolExecutor
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np
from tqdm import tqdm

from fedper._recipes.doc_block import write_block
from fedper._recipes.results_suite import DIGITS, SYNTH, Experiment, mean_std, paired_difference, run_all, summary_of
from fedper._recipes.simulation import Arrays, SimulationConfig, run
from fedper._recipes.suite_options import suite_parser
from fedper.common import weights
from fedper.common.atomic_write import atomic_write_text
from fedper.common.robust_aggregate import (
    BATCHNORM_STATISTICS,
    BATCHNORM_VARIANCE,
    PARAMETERS,
    STATISTICS,
    AggregationConfig,
    norm_group,
)
from fedper.common.train_config import TrainConfig
from fedper.data import DataConfig
from fedper.run_results import load_results

CLIENTS, ROUNDS, SEEDS, HOSTILE_COUNTS = 10, 10, (0, 1, 2), (1, 2, 3)
BUDGET = 2.99  # times the attacker's own honest distance, per group: inside the default 3x bound
BEGIN, END = "<!-- poisoning:begin (make poisoning) -->", "<!-- poisoning:end -->"
ATTACKS: dict[str, str] = {
    "sign-flip": "the honest step reversed, at the budget",
    "orthogonal": "a fixed random direction orthogonal to the honest step, at the budget",
    "one-weight": "the whole weights budget on one weight (the BatchNorm statistics honest)",
    "one-bn-mean": "the whole BatchNorm statistics budget on one running mean (the weights honest)",
    "alternating": "the sign flip in odd rounds, the honest step amplified to the budget in even ones",
}
AGGREGATIONS: dict[str, AggregationConfig] = {
    "mean, clip 3x (before)": AggregationConfig(coordinate_clip=0),
    "mean, clip 3x per tensor": AggregationConfig(clip_by="tensor", coordinate_clip=0),
    "mean, clip 3x, coordinate 3 MAD": AggregationConfig(coordinate_clip=3.0),
    "centered-clip 1x": AggregationConfig(aggregate="centered-clip", clip_factor=1.0, coordinate_clip=0),
    "median": AggregationConfig(aggregate="median", coordinate_clip=0),
    "trimmed-mean 0.1": AggregationConfig(aggregate="trimmed-mean", coordinate_clip=0),
}


DEFAULT = AggregationConfig()
# The honest runs' cost of the default: the settings of docs/RESULTS.md, FedPer, without and with it.
HONEST = (
    ("synth", "aesthetic-synth", (*SYNTH, "--algorithms", "fedper")),
    ("digits", "digits, 4 classes per client",
     (*DIGITS, "--classes-per-client", "4", "--algorithms", "fedper", "--kp", "2")),
)  # fmt: skip
# Spelled out (not left to the defaults) so that a reused run is one of the aggregation named.
DEFAULT_OPTIONS = ("--aggregate", DEFAULT.aggregate, "--clip-factor", f"{DEFAULT.clip_factor:g}",
                   "--weight-cap", f"{DEFAULT.weight_cap:g}", "--clip-by", DEFAULT.clip_by,
                   "--coordinate-clip", f"{DEFAULT.coordinate_clip:g}")  # fmt: skip
BEFORE_OPTIONS = ("--aggregate", "mean", "--clip-factor", "3", "--weight-cap", "3", "--clip-by", "group",
                  "--coordinate-clip", "0")  # fmt: skip
HONEST_EXPERIMENTS = tuple(
    Experiment(f"honest-{name}-{which}", dataset, (*options, *extra))
    for name, dataset, options in HONEST
    for which, extra in (("before", BEFORE_OPTIONS), ("default", DEFAULT_OPTIONS))
)


@dataclass(frozen=True)
class Scenario:
    attack: str | None  # None: the clean run
    hostile: int

    @property
    def label(self) -> str:
        return "clean run" if self.attack is None else f"{self.attack}, {self.hostile} of {CLIENTS}"


SCENARIOS = [Scenario(None, 0)] + [Scenario(a, k) for a in ATTACKS for k in HOSTILE_COUNTS]


def _grouped(delta: Arrays) -> dict[str, np.ndarray]:
    """Each clipping group's deltas, flattened in sorted tensor order."""
    groups: dict[str, list[np.ndarray]] = {}
    for name in sorted(delta):
        groups.setdefault(norm_group(name), []).append(delta[name].ravel())
    return {g: np.concatenate(v) for g, v in groups.items()}


def _ungrouped(grouped: dict[str, np.ndarray], like: Arrays) -> Arrays:
    out: Arrays = {}
    offsets = dict.fromkeys(grouped, 0)
    for name in sorted(like):
        g, size = norm_group(name), like[name].size
        out[name] = grouped[g][offsets[g] : offsets[g] + size].reshape(like[name].shape)
        offsets[g] += size
    return out


def _unit(v: np.ndarray) -> np.ndarray:
    norm = float(np.linalg.norm(v))
    return v / norm if norm > 0 else v


@dataclass
class Adversary:
    """The hostile clients of one run, and what each round's honest clients sent."""

    attack: str | None
    hostile: int
    seed: int
    rounds: list[tuple[Arrays, list[tuple[Arrays, int]]]] = field(default_factory=list)  # (base, honest updates)
    direction: dict[str, np.ndarray] | None = None  # the orthogonal attack's fixed random direction

    def tamper(self, client: int, update: Arrays, n: int, base: Arrays) -> tuple[Arrays, int]:
        if not self.rounds or self.rounds[-1][0] is not base:
            self.rounds.append((base, []))
        honest = self.rounds[-1][1]
        if self.attack is None or client < CLIENTS - self.hostile:
            honest.append((update, n))
            return update, n
        return self._attack(update, base, honest), n

    def honest_step(self, honest: list[tuple[Arrays, int]], base: Arrays) -> Arrays:
        """The sample-weighted mean of the honest updates' deltas: plain FedAvg without the attackers."""
        total = sum(n for _, n in honest)
        step: Arrays = {}
        for k in base:
            step[k] = np.sum([n * (u[k].astype(np.float64) - base[k]) for u, n in honest], axis=0) / total
        return step

    def _attack(self, update: Arrays, base: Arrays, honest: list[tuple[Arrays, int]]) -> Arrays:
        own = _grouped({k: update[k].astype(np.float64) - base[k] for k in base})
        budget = {g: BUDGET * float(np.linalg.norm(v)) for g, v in own.items()}
        step = {g: _unit(v) for g, v in _grouped(self.honest_step(honest, base)).items()}
        rnd = len(self.rounds)
        if self.attack == "sign-flip" or (self.attack == "alternating" and rnd % 2 == 1):
            sent = {g: -budget[g] * step[g] for g in own}
        elif self.attack == "alternating":
            sent = {g: budget[g] * step[g] for g in own}
        elif self.attack == "orthogonal":
            if self.direction is None:
                rng = np.random.default_rng([self.seed, 50])
                self.direction = {g: rng.standard_normal(v.size) for g, v in own.items()}
            sent = {}
            for g, u in self.direction.items():
                off = u - float(u @ step[g]) * step[g]
                sent[g] = budget[g] * _unit(off)
        else:
            group, suffix = (PARAMETERS, "") if self.attack == "one-weight" else (STATISTICS, BATCHNORM_STATISTICS[0])
            sent = dict(own)
            target = np.zeros_like(own[group])
            target[self._coordinate(base, group, suffix)] = budget[group]
            sent[group] = target
        tensors = {k: base[k] + d for k, d in _ungrouped(sent, base).items()}
        return {k: (np.abs(v) if k.endswith(BATCHNORM_VARIANCE) else v).astype(np.float32) for k, v in tensors.items()}

    @staticmethod
    def _coordinate(base: Arrays, group: str, suffix: str) -> int:
        """The flat index, within ``group``, of the first element of the first tensor ending in
        ``suffix`` (the first weight of the first layer; the first BatchNorm running mean)."""
        offset = 0
        for name in sorted(base):
            if norm_group(name) != group:
                continue
            if name.endswith(suffix):
                return offset
            offset += base[name].size
        raise ValueError(f"no {suffix!r} tensor in the {group} group")

    def measure(self, final: Arrays) -> dict[str, list[float]]:
        """Each round's progress along the honest step and drift off it (module docstring)."""
        progress, drift = [], []
        bases = [b for b, _ in self.rounds] + [final]
        for (base, honest), after in zip(self.rounds, bases[1:], strict=True):
            h = _grouped(self.honest_step(honest, base))
            s = _grouped({k: after[k].astype(np.float64) - base[k] for k in base})
            scale = {g: float(np.linalg.norm(v)) or 1.0 for g, v in h.items()}
            hv = np.concatenate([h[g] / scale[g] for g in sorted(h)])
            sv = np.concatenate([s[g] / scale[g] for g in sorted(s)])
            along = float(sv @ hv) / float(hv @ hv)
            progress.append(along)
            drift.append(float(np.linalg.norm(sv - along * hv)) / math.sqrt(float(hv @ hv)))
        return {"progress": progress, "drift": drift}


def _slug(label: str) -> str:
    return re.sub(r"[^a-z0-9]+", "-", label.lower()).strip("-")


def one_run(scenario: Scenario, aggregation: str, seed: int, out: Path) -> dict[str, object]:
    """One run's measurements (reused from ``out`` if there)."""
    key = f"{_slug(scenario.label)}--{_slug(aggregation)}--seed{seed}"
    path = out / f"{key}.json"
    if path.exists():
        result: dict[str, object] = json.loads(path.read_text())
        return result
    adversary = Adversary(scenario.attack, scenario.hostile, seed)
    sim = SimulationConfig(algorithms=("fedper",), kp=2, rounds=ROUNDS, training=TrainConfig(local_epochs=2),
                           threads=1, aggregation=AGGREGATIONS[aggregation], out=out / key)  # fmt: skip
    data = DataConfig(dataset="digits", num_clients=CLIENTS, classes_per_client=4, seed=seed)
    recorder = run(sim, data, tamper=adversary.tamper)
    final_accuracy = recorder.final("fedper")["final_per_client"]
    honest = [float(a) for c, a in final_accuracy.items() if int(c) < CLIENTS - scenario.hostile]
    measured = adversary.measure(weights.load(out / key / "fedper" / "final_base.safetensors"))
    result = {"attack": scenario.attack, "hostile": scenario.hostile, "aggregation": aggregation, "seed": seed,
              "honest_accuracy": float(np.mean(honest)), **measured,
              "aggregation_reports": recorder.aggregation["fedper"]}  # fmt: skip
    atomic_write_text(path, json.dumps(result) + "\n")
    return result


Results = dict[tuple[str, str], list[dict[str, object]]]  # (scenario label, aggregation) -> one per seed


def _cell(values: list[float], digits: int = 2) -> str:
    return f"{np.mean(values):.{digits}f} ± {np.std(values):.{digits}f}"


def _mean(values: object) -> float:
    """A run's value, or the mean of its per-round values."""
    assert isinstance(values, (list, float))
    return float(np.mean(values))


def _column(aggregation: str) -> str:
    return f"**{aggregation} (default)**" if AGGREGATIONS[aggregation] == DEFAULT else aggregation


def honest_cost_table(runs: dict[str, list[Path]]) -> str:
    """The default against the aggregation before it on honest runs, paired per client."""
    lines = ["| dataset | FedPer final mean acc, before (`--coordinate-clip 0`) | with the default | "
             "paired difference per client, default - before (mean ± SE) |", "|---|---|---|---|"]  # fmt: skip
    for i in range(0, len(HONEST_EXPERIMENTS), 2):
        before, default = ([load_results(d) for d in runs[e.name]] for e in HONEST_EXPERIMENTS[i : i + 2])
        means = [mean_std([summary_of(r, "fedper").final_mean_accuracy for r in rs]) for rs in (before, default)]
        lines.append(f"| {HONEST_EXPERIMENTS[i].table} | {means[0]} | {means[1]} | "
                     f"{paired_difference(default, 'fedper', 'fedper', against=before)} |")  # fmt: skip
    return "\n".join(lines)


BEFORE = "mean, clip 3x (before)"


def _paired(results: Results, aggregation: str, key: str) -> str:
    """``aggregation`` minus the defaults before, paired by attack row and seed: mean ± SE, won/lost."""
    diffs = [_mean(a[key]) - _mean(b[key])
             for s in SCENARIOS if s.attack is not None
             for a, b in zip(results[s.label, aggregation], results[s.label, BEFORE], strict=True)]  # fmt: skip
    se = float(np.std(diffs, ddof=1)) / math.sqrt(len(diffs))
    won, lost = sum(d > 0 for d in diffs), sum(d < 0 for d in diffs)
    return f"{np.mean(diffs):+.2f} ± {se:.2f} ({won} won / {lost} lost of {len(diffs)})"


def summary_table(results: Results) -> str:
    """Each option over every attack row: its mean, and its paired difference with the defaults before."""
    lines = ["**Over the 15 attack rows** (mean of the rows; the difference with the defaults before, paired by "
             "attack row and seed: mean ± standard error, how many pairs the option won and lost):", "",
             "| option | progress | accuracy | progress minus before | accuracy minus before |",
             "|---|---|---|---|---|"]  # fmt: skip
    attacked = [s for s in SCENARIOS if s.attack is not None]
    for a in AGGREGATIONS:
        progress = np.mean([_mean(r["progress"]) for s in attacked for r in results[s.label, a]])
        accuracy = np.mean([_mean(r["honest_accuracy"]) for s in attacked for r in results[s.label, a]])
        paired = ["-", "-"] if a == BEFORE else [_paired(results, a, k) for k in ("progress", "honest_accuracy")]
        lines.append(f"| {_column(a)} | {progress:.2f} | {accuracy:.3f} | {paired[0]} | {paired[1]} |")
    return "\n".join(lines)


def table(results: Results) -> str:
    """The three tables of docs/SERVER.md: progress, drift, honest accuracy."""
    columns = [_column(a) for a in AGGREGATIONS]
    header = ["| attack, hostile devices | " + " | ".join(columns) + " |", "|---|" + "---|" * len(AGGREGATIONS)]
    seeds = ", ".join(map(str, SEEDS))
    parts = []
    for title, key in (
        (f"**Progress** per round along the honest step (1: the honest step; mean over the {ROUNDS} rounds, "
         f"mean ± std over seeds {seeds}):", "progress"),
        (f"**Drift** per round off the honest step (in honest steps; mean over the {ROUNDS} rounds):", "drift"),
        (f"**Accuracy** of the honest clients after {ROUNDS} rounds (mean of their final accuracies):",
         "honest_accuracy"),
    ):  # fmt: skip
        lines = [title, "", *header]
        for scenario in SCENARIOS:
            cells = [_cell([_mean(r[key]) for r in results[scenario.label, a]]) for a in AGGREGATIONS]
            lines.append(f"| {scenario.label} | " + " | ".join(cells) + " |")
        parts.append("\n".join(lines))
    parts.append(summary_table(results))
    intro = (f"FedPer on digits, {CLIENTS} clients (the last k hostile), kp=2, {ROUNDS} rounds of 2 local epochs; "
             f"{len(SCENARIOS) * len(AGGREGATIONS) * len(SEEDS)} runs.")  # fmt: skip
    return intro + "\n\n" + "\n\n".join(parts) + "\n"


def main(argv: Sequence[str] | None = None) -> int:
    p = suite_parser("poisoning", __doc__, Path("runs/poisoning"), "poisoning")
    args = p.parse_args(argv)
    args.out.mkdir(parents=True, exist_ok=True)
    start = time.perf_counter()
    keys = [(s, g, seed) for s in SCENARIOS for g in AGGREGATIONS for seed in SEEDS]
    results: Results = {}
    with ProcessPoolExecutor(args.jobs) as pool:
        futures = [pool.submit(one_run, s, g, seed, args.out) for s, g, seed in keys]
        for (s, g, _), future in tqdm(zip(keys, futures, strict=True), total=len(keys), desc="poisoning runs"):
            results.setdefault((s.label, g), []).append(future.result())
    honest = run_all(args.fedper, args.out / "honest", SEEDS, args.jobs, HONEST_EXPERIMENTS)
    text = table(results) + (
        f"\n**What the default costs an honest run** (no hostile device; the settings of "
        f"[RESULTS.md](RESULTS.md), FedPer only, seeds {', '.join(map(str, SEEDS))}; the paired difference "
        f"pools every client of every seed):\n\n{honest_cost_table(honest)}\n"
    )
    print(text)
    if args.write is not None:
        write_block(args.write, BEGIN, END, text)
    print(f"{len(keys)} runs, {time.perf_counter() - start:.0f} s", file=sys.stderr)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
