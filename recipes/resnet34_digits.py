"""``make resnet34-digits``: the FedPer paper's second architecture, end to end, on digits.

ResNet-34 as torchvision builds it (random weights), its classifier ``fc`` the personal head:
first ``fedper export --model torchvision:resnet34 --head-modules fc`` (the on-device programs,
as a user makes them; the export's check trains the program through ExecuTorch's runtime),
then ``fedper simulate`` with the same model and head on digits with 4 classes per client
(docs/RESULTS.md's digits settings: 20 rounds of 2 local epochs, from scratch), FedPer and
FedAvg on seeds 0, 1 and 2, paired per client as ``make results`` pairs MobileNet-V1's. The
table replaces the block between its markers in docs/RESULTS.md (``--write``, which also copies
seed 0's accuracy-per-round plot into docs/img); runs whose
``results.json`` exists with the same command are reused.
"""

from __future__ import annotations

import csv
import math
import os
import shutil
import subprocess
import sys
import time
from collections.abc import Sequence
from pathlib import Path

import numpy as np

from fedper._recipes.doc_block import write_block
from fedper._recipes.results_suite import DIGITS, FEDPER_FEDAVG, SEEDS, Experiment, run_all, tables
from fedper._recipes.suite_options import suite_parser
from fedper.common.atomic_write import atomic_write_text
from fedper.common.errors import FedperError
from fedper.common.manifest import read_manifest

BEGIN, END = "<!-- resnet34:begin (make resnet34-digits) -->", "<!-- resnet34:end -->"
MODEL = ("--model", "torchvision:resnet34", "--head-modules", "fc")
EXPERIMENT = Experiment(
    "digits-k4-resnet34",
    "digits, 4 classes per client: ResNet-34 (torchvision, head fc)",
    (*DIGITS, "--classes-per-client", "4", *FEDPER_FEDAVG, *MODEL),
)


def export(fedper: str, out: Path) -> str:
    """``fedper export`` of the model for digits; a line saying what it made and how long it took."""
    start = time.perf_counter()
    command = [fedper, "export", *MODEL, "--dataset", "digits", "--bypass-cache", "--out", str(out)]
    wide = {**os.environ, "COLUMNS": "1000"}  # a warning on one line
    done = subprocess.run(command, capture_output=True, text=True, check=False, env=wide)
    if done.returncode != 0:
        output = done.stdout[-2000:] + done.stderr[-2000:]
        raise FedperError(f"{' '.join(command)} failed ({done.returncode}):\n{output}")
    manifest = read_manifest(out)
    warnings = [line for line in (done.stdout + done.stderr).splitlines() if line.startswith("warning:")]
    return (f"`fedper export {' '.join(MODEL)} --dataset digits`: {time.perf_counter() - start:.0f} s, "
            f"training program `{manifest.training_program.variant}`, {len(manifest.base_names)} base and "
            f"{len(manifest.head_names)} head tensors ({', '.join(manifest.head_names)}), "
            f"{len(warnings)} warnings.")  # fmt: skip


CHECKPOINTS = (3, 5, 10, 15, 20)


def _accuracies(run: Path) -> dict[tuple[str, int, int], float]:
    """(algorithm, round, client) -> the client's accuracy at the start of that round (metrics.csv)."""
    with (run / "metrics.csv").open() as f:
        return {(r["algorithm"], int(r["round"]), int(r["client"])): float(r["accuracy"]) for r in csv.DictReader(f)}


def per_round_table(runs: Sequence[Path], rounds: Sequence[int] = CHECKPOINTS) -> str:
    """How fast each algorithm gets there: the clients' mean accuracy at the start of some rounds
    (mean ± std over seeds) and FedPer - FedAvg per client at that round, pooled over seeds."""
    seen = [_accuracies(r) for r in runs]
    lines = [
        "| at the start of round | fedper | fedavg | fedper - fedavg per client (mean ± SE) |",
        "|---|---|---|---|",
    ]
    for n in rounds:
        means: dict[str, list[float]] = {"fedper": [], "fedavg": []}
        diffs: list[float] = []
        for acc in seen:
            clients = sorted(c for (a, r, c) in acc if a == "fedper" and r == n)
            for algorithm in means:
                means[algorithm].append(float(np.mean([acc[(algorithm, n, c)] for c in clients])))
            diffs += [acc[("fedper", n, c)] - acc[("fedavg", n, c)] for c in clients]
        se = float(np.std(diffs, ddof=1)) / math.sqrt(len(diffs))
        won, lost = sum(d > 0 for d in diffs), sum(d < 0 for d in diffs)
        cells = " | ".join(f"{np.mean(v):.3f} ± {np.std(v):.3f}" for v in means.values())
        lines.append(f"| {n} | {cells} | {np.mean(diffs):+.3f} ± {se:.3f} ({won} won / {lost} lost of {len(diffs)}) |")
    return "\n".join(lines)


def main(argv: Sequence[str] | None = None) -> int:
    p = suite_parser("resnet34_digits", __doc__, Path("runs/resnet34"), "resnet34")
    args = p.parse_args(argv)
    start = time.perf_counter()
    exported = export(args.fedper, args.out / "artifacts")
    print(exported, file=sys.stderr, flush=True)
    runs = run_all(args.fedper, args.out, SEEDS, args.jobs, [EXPERIMENT])
    text = f"{exported}\n\n{tables(runs, [EXPERIMENT])}\n**On the way** (seeds 0, 1, 2)\n\n"
    text += per_round_table(runs[EXPERIMENT.name])
    atomic_write_text(args.out / "tables.md", text + "\n")
    print(text)
    if args.write is not None:
        write_block(args.write, BEGIN, END, text)
        plot = runs[EXPERIMENT.name][0] / "accuracy_per_round.png"  # seed 0's
        shutil.copyfile(plot, args.write.parent / "img" / f"{EXPERIMENT.name.replace('-', '_')}_accuracy_per_round.png")
    print(f"{len(SEEDS)} runs and an export, {time.perf_counter() - start:.0f} s", file=sys.stderr)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
