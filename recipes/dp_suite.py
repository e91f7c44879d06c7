"""``make dp-results``: accuracy against epsilon for FedPer and FedAvg under DP-FedAvg.

Does keeping the head private make FedPer degrade less under user-level DP than FedAvg, whose
classifier is noised with the rest of its model? ``fedper simulate --dp``
on aesthetic-synth (its preset: the pretrained base, the ordinal head, kp=1) with a population
of USERS generated users, each drawn on its own coin of probability COHORT/USERS per round, for
every target epsilon: the noise multiplier is the smallest (to 0.01) whose epsilon after ROUNDS
rounds at delta = USERS^-1.1 is within the target (the toolkit's accountant), and infinity is the
same pipeline without noise (clipping, Poisson sampling and the fixed denominator kept). Seeds
0, 1, 2, two runs at a time on one torch thread each, through recipes.results_suite's runner (a
finished run with the same command is reused). The table replaces the block between the
markers in docs/RESULTS.md (``--write``).
"""

from __future__ import annotations

import math
import sys
import time
from collections.abc import Sequence
from pathlib import Path

import numpy as np

from fedper._recipes.doc_block import write_block
from fedper._recipes.results_suite import SEEDS, SYNTH, Experiment, mean_std, run_all, summary_of
from fedper._recipes.suite_options import suite_parser
from fedper.common.atomic_write import atomic_write_text
from fedper.common.dp.accountant import smallest_noise_multiplier
from fedper.common.errors import FedperError
from fedper.run_results import RunResults, load_results, report_number

BEGIN, END = "<!-- dp:begin (make dp-results) -->", "<!-- dp:end -->"
USERS, COHORT, ROUNDS = 1000, 100, 20
IMAGES = "20-30"  # rated photos per user: 1,000 users at the preset's 100-200 would take a day here
TARGETS: tuple[float, ...] = (math.inf, 8.0, 4.0, 2.0)
ALGORITHMS = ("fedper", "fedavg")


def delta() -> float:
    return float(USERS**-1.1)


def noise_for(target: float) -> float:
    """The smallest noise multiplier (to 0.01) whose epsilon after ROUNDS rounds is <= target."""
    return 0.0 if math.isinf(target) else smallest_noise_multiplier(target, COHORT / USERS, ROUNDS, delta())


def experiments() -> tuple[Experiment, ...]:
    common = (*SYNTH, "--users", str(USERS), "--clients", str(USERS), "--images-per-user", IMAGES,
              "--fraction", str(COHORT / USERS), "--rounds", str(ROUNDS), "--algorithms", ",".join(ALGORITHMS),
              "--dp")  # fmt: skip
    return tuple(
        Experiment(f"dp-eps-{_label(t)}", "dp", (*common, "--dp-noise-multiplier", f"{noise_for(t):g}"))
        for t in TARGETS
    )


def _label(target: float) -> str:
    return "inf" if math.isinf(target) else f"{target:g}"


def _finals(run: RunResults, algorithm: str) -> dict[str, float]:
    return summary_of(run, algorithm).final_per_client


def _spent(run: RunResults) -> float | None:
    if "fedper" not in run.privacy:
        raise FedperError("a run of the DP suite recorded no privacy spent for fedper")
    return run.privacy["fedper"].epsilon


def _last_clip(run: RunResults, algorithm: str) -> float:
    reports = run.aggregation.get(algorithm)
    if not reports:
        raise FedperError(f"a run of the DP suite has no aggregation report for {algorithm}")
    return report_number(reports[-1], "clip")


def _baseline(run: RunResults, name: str) -> float:
    if name not in run.baselines:
        raise FedperError(f"a run of the DP suite has no {name} baseline")
    return run.baselines[name].mean_accuracy


def _paired(pairs: list[float], per_seed: list[float]) -> str:
    se = float(np.std(pairs, ddof=1)) / math.sqrt(len(pairs))
    seeds = ", ".join(f"{v:+.3f}" for v in per_seed)
    return f"{np.mean(pairs):+.3f} ± {se:.3f} (per seed {seeds})"


def table(runs_by_name: dict[str, list[Path]]) -> str:
    """A row per epsilon: each algorithm's clients' mean final accuracy (mean ± std over seeds),
    FedPer − FedAvg per client, and how much more FedPer keeps than FedAvg against the same
    algorithm without noise, per client: [FedPer(eps) − FedPer(inf)] − [FedAvg(eps) − FedAvg(inf)]."""
    names = [e.name for e in experiments()]
    reference = [load_results(d) for d in runs_by_name[names[0]]]
    lines = [
        f"aesthetic-synth, {USERS} users (each {IMAGES} rated photos, 80/20 split), each drawn with probability "
        f"{COHORT / USERS:g} per round (expected cohort {COHORT}), {ROUNDS} rounds, delta {delta():.3g}, seeds "
        f"{', '.join(map(str, SEEDS))}; per-client differences pooled over seeds (mean ± SE, and each seed's mean):",
        "",
        "| epsilon | noise multiplier | epsilon spent | last round's clip C, FedPer / FedAvg | FedPer final acc "
        "| FedAvg final acc | FedPer − FedAvg per client | FedPer's loss to DP minus FedAvg's, per client |",
        "|---|---|---|---|---|---|---|---|",
    ]
    for e, target in zip(experiments(), TARGETS, strict=True):
        runs = [load_results(d) for d in runs_by_name[e.name]]
        z = float(e.options[-1])
        spent = _spent(runs[0])
        accs = {a: mean_std([summary_of(r, a).final_mean_accuracy for r in runs]) for a in ALGORITHMS}
        gap, gap_seeds, keep, keep_seeds = [], [], [], []
        for run, ref in zip(runs, reference, strict=True):
            fp, fa = _finals(run, "fedper"), _finals(run, "fedavg")
            fp0, fa0 = _finals(ref, "fedper"), _finals(ref, "fedavg")
            d = [fp[c] - fa[c] for c in fp if c in fa]
            k = [(fp[c] - fp0[c]) - (fa[c] - fa0[c]) for c in fp if c in fa and c in fp0 and c in fa0]
            gap += d
            keep += k
            gap_seeds.append(float(np.mean(d)))
            keep_seeds.append(float(np.mean(k)))
        shown = "∞" if math.isinf(target) else f"{target:g}"
        eps = "∞" if spent is None else f"{spent:.2f}"
        vs_inf = "-" if math.isinf(target) else _paired(keep, keep_seeds)
        clips = " / ".join(f"{np.mean([_last_clip(r, a) for r in runs]):.3g}" for a in ALGORITHMS)
        lines.append(f"| {shown} | {z:g} | {eps} | {clips} | {accs['fedper']} | {accs['fedavg']} "
                     f"| {_paired(gap, gap_seeds)} | {vs_inf} |")  # fmt: skip
    majority = mean_std([_baseline(r, "majority") for r in reference])
    ceiling = mean_std([_baseline(r, "per_client_features") for r in reference])
    lines += ["", f"On the same clients: each client's majority rating {majority}; a logistic regression per client "
              f"on the generator's features (the ceiling) {ceiling}."]  # fmt: skip
    return "\n".join(lines) + "\n"


def main(argv: Sequence[str] | None = None) -> int:
    p = suite_parser("dp_suite", __doc__, Path("runs/dp"), "dp")
    args = p.parse_args(argv)
    start = time.perf_counter()
    runs = run_all(args.fedper, args.out, SEEDS, args.jobs, experiments())
    text = table(runs)
    atomic_write_text(args.out / "table.md", text)
    print(text)
    if args.write is not None:
        write_block(args.write, BEGIN, END, text)
    print(f"{len(TARGETS) * len(SEEDS)} runs, {time.perf_counter() - start:.0f} s", file=sys.stderr)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
