"""``fedper report``: one markdown table comparing the final accuracies of finished runs, and a
demo run's page drawn again from its results."""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

from fedper._recipes.demo_report import write_report
from fedper.common.config_cli import Positional, add_command
from fedper.common.errors import ConfigError
from fedper.run_results import RoundSummary, RunResults, load_results


def _mean_at(rows: list[RoundSummary], rnd: int) -> str:
    for row in rows:
        if row.round == rnd and row.accuracy is not None:
            return f"{row.accuracy.mean:.3f}"
    return "-"


def _cell(value: float | None) -> str:
    return "-" if value is None else f"{value:.3f}"


def table_rows(name: str, results: RunResults, at_rounds: tuple[int, ...]) -> list[str]:
    """A run's rows: one per algorithm, then one per baseline computed on the run's own split."""
    sim = results.config.get("simulation")
    sim = sim if isinstance(sim, dict) else {}
    lines = []
    for algorithm, final in results.algorithms.items():
        kp = {"fedper": sim.get("kp", ""), "fedavg": 0}.get(algorithm, "-")
        rows = results.rounds.get(algorithm, [])
        at = "".join(f" {_mean_at(rows, r)} |" for r in at_rounds)
        lines.append(
            f"| {name} | {algorithm} | {kp} | {sim.get('base', 'model')} |{at} {final.final_mean_accuracy:.3f} | "
            f"{final.final_weighted_mean_accuracy:.3f} | {final.final_std:.3f} | {_cell(final.last5_mean_accuracy)} | "
            f"{_cell(final.last5_std)} | {final.final_point} |"
        )
    for baseline, b in results.baselines.items():
        dashes = " - |" * len(at_rounds)
        lines.append(
            f"| {name} | baseline: {baseline} | - | - |{dashes} {b.mean_accuracy:.3f} | - | {b.std:.3f} | - | - | - |"
        )
    return lines


def markdown_table(run_dirs: list[Path], at_rounds: tuple[int, ...] = (10, 20)) -> str:
    """One row per algorithm per run: the final accuracy summary (after the last round; its
    ``final_point`` says when), the mean over the last 5 evaluation points, and the mean at the
    start of given rounds; then one row per baseline computed on the run's own split
    (fedper.baselines)."""
    extra = "".join(f" round {r} |" for r in at_rounds)
    lines = [
        f"| run | algorithm | kp | base |{extra} final mean acc | weighted | std | last-5 mean | last-5 std |"
        " final at |",
        "|---|---|---|---|" + "---|" * len(at_rounds) + "---|---|---|---|---|---|",
    ]
    for run_dir in run_dirs:
        lines += table_rows(Path(run_dir).name, load_results(run_dir), at_rounds)
    return "\n".join(lines)


def add_parser(sub: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    add_command(
        sub, "report", report, [],
        help="markdown table of final accuracies from run directories; a demo run's page drawn again",
        description="Print one markdown table comparing the results.json of finished runs. For a `fedper demo` "
        "run, also write its RUN_DIR/report.html again from its results.json (and any missing plot).",
        positionals=[Positional("runs", tuple[Path, ...], "RUN_DIR", "directories of runs")],
    )  # fmt: skip


def report(args: argparse.Namespace) -> int:
    if not args.runs:
        raise ConfigError("name at least one RUN_DIR: a directory holding a finished run's results.json")
    print(markdown_table(list(args.runs)))
    for run_dir in args.runs:
        if load_results(run_dir).demo is not None:
            print(f"wrote {write_report(run_dir)}", file=sys.stderr)
    return 0
