"""``make bn-sharing``: the base's BatchNorm statistics shared and validated, or kept on the device.

Which serves FedPer better? With ``--bn shared`` (the default) every device sends
its base's BatchNorm running statistics and the server aggregates them behind its checks: the
statistics are clipped apart from the weights (3x the round's lower median distance) and an
update with a negative variance is refused. With ``--bn local`` (FedBN, Li et al., ICLR 2021)
the statistics never leave the device: each client normalizes the shared base's features with
its own data's statistics, and there is nothing to validate. Validation guards the server; only
a measurement says which gives the clients better models, so this measures it.

``fedper simulate --algorithms fedper --bn shared|local`` on the same splits and initial weights
(the same seed), seeds 0, 1, 2, on aesthetic-synth (its preset: pretrained base, ordinal head,
kp=1) and on digits, non-IID (4 classes per client, kp=2). Runs go one at a time (one torch
thread each) through recipes.results_suite's runner, so a run whose results.json exists with the
same command is reused. The table gives each mode's clients' mean final accuracy (mean ± std over
seeds) and local − shared per client (same client, same test photos, same seed), pooled over
seeds (mean ± SE, won / lost); it replaces the block between the markers in docs/RESULTS.md
(``--write``).
"""

from __future__ import annotations

import sys
import time
from collections.abc import Sequence
from pathlib import Path

from fedper._recipes.doc_block import write_block
from fedper._recipes.results_suite import (
    DIGITS,
    FEDPER,
    SEEDS,
    SYNTH,
    Experiment,
    mean_std,
    paired_difference,
    run_one,
    summary_of,
)
from fedper._recipes.suite_options import suite_parser
from fedper.common.atomic_write import atomic_write_text
from fedper.run_results import RunResults, load_results, report_number

BEGIN, END = "<!-- bn-sharing:begin (make bn-sharing) -->", "<!-- bn-sharing:end -->"
MODES = ("shared", "local")
# (run-name prefix, the table's dataset cell, the fedper simulate options but --bn)
DATASETS: tuple[tuple[str, str, tuple[str, ...]], ...] = (
    ("synth", "aesthetic-synth", (*SYNTH, *FEDPER)),
    ("digits-k4", "digits, 4 classes per client", (*DIGITS, "--classes-per-client", "4", *FEDPER, "--kp", "2")),
)
EXPERIMENTS: tuple[Experiment, ...] = tuple(
    Experiment(
        f"{p}-bn-{mode}", dataset, (*options, "--bn", mode), reference=f"{p}-bn-shared" if mode == "local" else ""
    )
    for p, dataset, options in DATASETS
    for mode in MODES
)


def run_all(fedper: str, root: Path, seeds: Sequence[int]) -> dict[str, list[Path]]:
    """Every experiment on every seed, one run at a time; experiment name -> run dirs, seed order."""
    root.mkdir(parents=True, exist_ok=True)
    return {e.name: [run_one(fedper, e, seed, root) for seed in seeds] for e in EXPERIMENTS}


def _clipped(runs: list[RunResults]) -> tuple[int, int]:
    """(updates clipped, updates aggregated) by FedPer's robust aggregation, over rounds and runs."""
    reports = [r for run in runs for r in run.aggregation.get("fedper", [])]
    return (int(sum(report_number(r, "clipped") for r in reports)),
            int(sum(report_number(r, "updates") for r in reports)))  # fmt: skip


def table(runs_by_name: dict[str, list[Path]]) -> str:
    """The markdown table: a row per dataset and mode, local paired with shared client by client."""
    lines = [
        f"FedPer, seeds {', '.join(map(str, SEEDS))}; `--bn local` paired with `--bn shared` on the same "
        "clients, test photos and seeds:",
        "",
        "| dataset | --bn | final mean acc (mean ± std over seeds) | "
        "paired difference local − shared per client (mean ± SE, won/lost) |",
        "|---|---|---|---|",
    ]
    notes = []
    for e in EXPERIMENTS:
        runs = [load_results(d) for d in runs_by_name[e.name]]
        mode = e.options[-1]
        paired = "-"
        if e.reference:
            shared = [load_results(d) for d in runs_by_name[e.reference]]
            paired = paired_difference(runs, "fedper", "fedper", shared)
        final = mean_std([summary_of(r, "fedper").final_mean_accuracy for r in runs])
        lines.append(f"| {e.table} | {mode} | {final} | {paired} |")
        clipped, updates = _clipped(runs)
        notes.append(f"{e.table}, {mode}: {clipped} of {updates}")
    lines += ["", "Updates clipped by the default aggregation (in either group), over rounds and seeds: "
              + "; ".join(notes) + "."]  # fmt: skip
    return "\n".join(lines) + "\n"


def write_into(doc: Path, text: str) -> None:
    """Replace the block between BEGIN and END in ``doc`` with ``text``."""
    write_block(doc, BEGIN, END, text)


def main(argv: Sequence[str] | None = None) -> int:
    p = suite_parser("bn_sharing", __doc__, Path("runs/bn_sharing"), "bn-sharing", jobs=False)
    args = p.parse_args(argv)
    start = time.perf_counter()
    runs = run_all(args.fedper, args.out, SEEDS)
    text = table(runs)
    atomic_write_text(args.out / "table.md", text)
    print(text)
    if args.write is not None:
        write_into(args.write, text)
    print(f"{len(EXPERIMENTS) * len(SEEDS)} runs, {time.perf_counter() - start:.0f} s", file=sys.stderr)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
