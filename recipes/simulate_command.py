"""``fedper simulate``: run the simulation with a progress bar and print the summary table."""

from __future__ import annotations

import argparse
import time

from rich.console import Console
from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeElapsedColumn
from rich.table import Table

from fedper.config_cli import add_command
from fedper.data import DataConfig
from fedper.models import ModelConfig
from recipes.presets import Setting, help_text, setting
from recipes.run_estimate import RunEstimate, measure_step, steps_per_round
from recipes.simulation import SimulationConfig, clients_per_round, run

console = Console(stderr=True)


def add_parser(sub: argparse._SubParsersAction) -> None:  # type: ignore[type-arg]
    add_command(
        sub, "simulate", simulate, [DataConfig, SimulationConfig],
        help="compare FedPer, FedAvg and local training in one process",
        description="In-process simulation (eager PyTorch) of FedPer vs FedAvg vs local training. "
        "Writes results.json, metrics.csv, plots and final weights into --out. " + help_text(),
    )  # fmt: skip


def describe(chosen: Setting) -> str:
    """The run's effective setting in one line, naming what the dataset's preset set."""
    sim, data, t = chosen.simulation, chosen.data, chosen.simulation.training
    width = f" width {sim.alpha}" if sim.model == "mobilenet_v1" else ""
    text = (
        f"{data.dataset}: {data.num_clients} clients, {data.image_size} px, {sim.model}{width}, kp {sim.kp}, "
        f"{sim.rounds} round{'s' if sim.rounds != 1 else ''} x {t.local_epochs} local epochs, "
        f"batch {t.batch_size}, lr {t.learning_rate}, momentum {t.momentum}; {', '.join(sim.algorithms)}"
    )
    if chosen.from_preset:
        text += f" (preset from {chosen.preset.source}: {', '.join(chosen.from_preset)})"
    return text


def simulate(args: argparse.Namespace) -> int:
    chosen = setting(args)
    sim, data = chosen.simulation, chosen.data

    def before_training(model: ModelConfig, train_samples: list[int]) -> None:
        console.print(describe(chosen), soft_wrap=True)
        estimate = RunEstimate(
            measure_step(model, sim.training),
            steps_per_round(train_samples, sim.training, clients_per_round(sim, len(train_samples))),
            sim.rounds,
            len(sim.algorithms),
        )
        console.print(f"estimate: {estimate}", soft_wrap=True)

    start = time.perf_counter()
    with Progress(
        TextColumn("[bold]{task.description}"),
        BarColumn(),
        MofNCompleteColumn(),
        TextColumn("rounds"),
        TimeElapsedColumn(),
        console=console,
    ) as bar:
        tasks = {a: bar.add_task(a, total=sim.rounds) for a in sim.algorithms}

        def progress(algorithm: str, rnd: int, total: int) -> None:
            bar.update(tasks[algorithm], completed=rnd)

        recorder = run(sim, data, progress, before_training)
    table = Table(
        title=f"{data.dataset}, {len(recorder.config['clients_train_samples'])} clients, "
        f"partition {recorder.config['partition']}, kp={sim.kp}"
    )
    columns = ("algorithm", "final mean acc", "weighted", "std", "last-5 mean", "last-5 std", "final at")
    for col in columns:
        table.add_column(col, justify="right" if col != "algorithm" else "left")
    for a in recorder.algorithms:
        f = recorder.final(a)
        table.add_row(
            a,
            f"{f['final_mean_accuracy']:.4f}",
            f"{f['final_weighted_mean_accuracy']:.4f}",
            f"{f['final_std']:.4f}",
            f"{f['last5_mean_accuracy']:.4f}",
            f"{f['last5_std']:.4f}",
            f["final_point"],
        )
    for name, b in recorder.baseline_summary().items():
        table.add_row(f"[dim]baseline: {name}[/]", f"{b['mean_accuracy']:.4f}", "", f"{b['std']:.4f}", "", "", "")
    Console().print(table)
    console.print(f"wrote {sim.out}/results.json, metrics.csv, plots ({time.perf_counter() - start:.0f} s)")
    return 0
