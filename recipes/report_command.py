"""``fedper report``: one markdown table comparing the final accuracies of finished runs."""

from __future__ import annotations

import argparse
import json
from pathlib import Path
from typing import Any

from fedper.common.config_cli import Positional, add_command
from fedper.common.errors import ConfigError, FedperError


def load_results(run_dir: Path) -> dict[str, Any]:
    path = Path(run_dir) / "results.json"
    try:
        results: dict[str, Any] = json.loads(path.read_text())
    except FileNotFoundError as exc:
        raise FileNotFoundError(f"{path} does not exist: is {run_dir} a finished run?") from exc
    except json.JSONDecodeError as exc:
        raise FedperError(f"{path} is not valid JSON: {exc}") from exc
    return results


def _mean_at(rows: list[dict[str, Any]], rnd: int) -> str:
    for row in rows:
        if row["round"] == rnd and "accuracy" in row:
            return f"{row['accuracy']['mean']:.3f}"
    return "-"


def _last5(final: dict[str, Any]) -> str:
    """The last-5-points mean and std; "-" for a results.json written before they existed."""
    if "last5_mean_accuracy" not in final:
        return " - | - |"
    return f" {final['last5_mean_accuracy']:.3f} | {final['last5_std']:.3f} |"


def markdown_table(run_dirs: list[Path], at_rounds: tuple[int, ...] = (10, 20)) -> str:
    """One row per algorithm per run: the final accuracy summary (after the last round; its
    ``final_point`` says when, for runs written before the final point existed), the mean over
    the last 5 evaluation points, and the mean at the start of given rounds; then one row per
    baseline computed on the run's own split (fedper.baselines)."""
    extra = "".join(f" round {r} |" for r in at_rounds)
    lines = [
        f"| run | algorithm | kp | base |{extra} final mean acc | weighted | std | last-5 mean | last-5 std |"
        " final at |",
        "|---|---|---|---|" + "---|" * len(at_rounds) + "---|---|---|---|---|---|",
    ]
    for run_dir in run_dirs:
        results = load_results(run_dir)
        sim = results.get("config", {}).get("simulation", {})
        for algorithm, final in results["algorithms"].items():
            kp = {"fedper": sim.get("kp", ""), "fedavg": 0}.get(algorithm, "-")
            rows = results.get("rounds", {}).get(algorithm, [])
            at = "".join(f" {_mean_at(rows, r)} |" for r in at_rounds)
            point = final.get("final_point") or f"start of round {final['final_round']}"
            lines.append(
                f"| {Path(run_dir).name} | {algorithm} | {kp} | {sim.get('base', 'model')} |{at} "
                f"{final['final_mean_accuracy']:.3f} | "
                f"{final['final_weighted_mean_accuracy']:.3f} | {final['final_std']:.3f} |{_last5(final)} "
                f"{point} |"
            )
        for name, b in results.get("baselines", {}).items():
            dashes = " - |" * len(at_rounds)
            lines.append(
                f"| {Path(run_dir).name} | baseline: {name} | - | - |{dashes} "
                f"{b['mean_accuracy']:.3f} | - | {b['std']:.3f} | - | - | - |"
            )
    return "\n".join(lines)


def add_parser(sub: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    add_command(
        sub, "report", report, [],
        help="markdown table of final accuracies from run directories",
        description="Print one markdown table comparing the results.json of finished runs.",
        positionals=[Positional("runs", tuple[Path, ...], "RUN_DIR", "directories of runs")],
    )  # fmt: skip


def report(args: argparse.Namespace) -> int:
    if not args.runs:
        raise ConfigError("name at least one RUN_DIR: a directory holding a finished run's results.json")
    print(markdown_table(list(args.runs)))
    return 0
