"""``fedper simulate``: run the simulation with a progress bar and print the summary table."""

from __future__ import annotations

import argparse
import time
from typing import Any

from rich.console import Console
from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeElapsedColumn
from rich.table import Table

from fedper.config_cli import add_command, from_arguments
from fedper.data import DataConfig
from recipes.simulation import SimulationConfig, run

console = Console(stderr=True)


def add_parser(sub: argparse._SubParsersAction) -> None:  # type: ignore[type-arg]
    add_command(
        sub, "simulate", simulate, [DataConfig, SimulationConfig],
        help="compare FedPer, FedAvg and local training in one process",
        description="In-process simulation (eager PyTorch) of FedPer vs FedAvg vs local training. "
        "Writes results.json, metrics.csv, plots and final weights into --out.",
    )  # fmt: skip


def simulate(args: argparse.Namespace) -> int:
    sim = from_arguments(SimulationConfig, args)
    data = from_arguments(DataConfig, args)
    start = time.perf_counter()
    with Progress(
        TextColumn("[bold]{task.description}"),
        BarColumn(),
        MofNCompleteColumn(),
        TextColumn("{task.fields[unit]}"),
        TimeElapsedColumn(),
        console=console,
    ) as bar:
        tasks = {a: bar.add_task(a, total=sim.rounds, unit="rounds") for a in sim.algorithms}

        def progress(task: str, done: int, total: int) -> None:
            if task not in tasks:  # the held-out users' fine-tuning, after the algorithms
                tasks[task] = bar.add_task(task, total=total, unit="fine-tunings")
            bar.update(tasks[task], completed=done)

        recorder = run(sim, data, progress)
    table = Table(
        title=f"{data.dataset}, {len(recorder.config['clients_train_samples'])} clients, "
        f"partition {recorder.config['partition']}, kp={sim.kp}"
    )
    for col in ("algorithm", "final mean acc", "weighted", "std", "round"):
        table.add_column(col, justify="right" if col != "algorithm" else "left")
    for a in recorder.algorithms:
        f = recorder.final(a)
        table.add_row(
            a,
            f"{f['final_mean_accuracy']:.4f}",
            f"{f['final_weighted_mean_accuracy']:.4f}",
            f"{f['final_std']:.4f}",
            str(f["final_round"]),
        )
    for name, b in recorder.baseline_summary().items():
        table.add_row(f"[dim]baseline: {name}[/]", f"{b['mean_accuracy']:.4f}", "", f"{b['std']:.4f}", "")
    Console().print(table)
    if recorder.new_users:
        Console().print(new_users_table(recorder.new_users))
    console.print(f"wrote {sim.out}/results.json, metrics.csv, plots ({time.perf_counter() - start:.0f} s)")
    return 0


def new_users_table(new_users: dict[str, Any]) -> Table:
    """One row per N (with the number of users whose pool has N photos), one column per variant:
    mean accuracy ± standard error across those users."""
    curves = new_users["curves"]
    table = Table(
        title=f"{len(new_users['users'])} new users: accuracy after {new_users['steps']} SGD steps "
        "on their first N photos (mean ± s.e.)"
    )
    table.add_column("N", justify="right")
    table.add_column("users", justify="right")
    for name in curves:
        table.add_column(name, justify="right")
    for n, first in next(iter(curves.values())).items():
        table.add_row(n, str(first["users"]), *(_cell(curve[n]) for curve in curves.values()))
    return table


def _cell(row: dict[str, Any]) -> str:
    if not row["users"]:
        return "-"
    return f"{row['mean']:.3f}" + (f"\n±{row['se']:.3f}" if row["se"] is not None else "")  # fits 80 columns
