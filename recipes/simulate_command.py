"""``fedper simulate``: run the simulation with a progress bar and print the summary table."""

from __future__ import annotations

import argparse
import time

from rich.console import Console
from rich.markup import escape
from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeElapsedColumn
from rich.table import Table

from fedper._recipes.presets import Setting, help_text, setting
from fedper._recipes.run_estimate import RunEstimate, measure_step, steps_per_round
from fedper._recipes.simulation import SimulationConfig, clients_per_round, model_config, run
from fedper.common.config_cli import add_command
from fedper.common.dp.accountant import PrivacyBudget
from fedper.data import DataConfig, dataset_info
from fedper.models import ModelConfig, build_model
from fedper.models.layer_table import format_layers
from fedper.run_results import CurvePoint, NewUsers, PrivacySummary, RunResults

console = Console(stderr=True)


def add_parser(sub: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    add_command(
        sub, "simulate", simulate, [DataConfig, SimulationConfig], skip=("dp_sampling_probability",),
        help="compare FedPer, FedAvg and local training in one process",
        description="In-process simulation (eager PyTorch) of FedPer vs FedAvg vs local training. "
        "Writes results.json, metrics.csv, plots and final weights into --out. " + help_text(),
    )  # fmt: skip


def describe(chosen: Setting) -> str:
    """The run's effective setting in one line, naming what the dataset's preset set."""
    sim, data, t = chosen.simulation, chosen.data, chosen.simulation.training
    width = f" width {sim.model.alpha}" if sim.model.name == "mobilenet_v1" else ""
    text = (
        f"{data.dataset}: {data.num_clients} clients, {data.image_size} px, {sim.model.name}{width}, kp {sim.kp}, "
        f"{sim.rounds} round{'s' if sim.rounds != 1 else ''} x {t.local_epochs} local epochs, "
        f"batch {t.batch_size}, lr {t.learning_rate}, momentum {t.momentum}; {', '.join(sim.algorithms)}"
    )
    if chosen.from_preset:
        text += f" (preset from {chosen.preset.source}: {', '.join(chosen.from_preset)})"
    return text


def describe_privacy(sim: SimulationConfig, population: int) -> str:
    """The DP mechanism and what the whole run would spend (the run stops earlier at --target-epsilon)."""
    dp = sim.privacy
    q = clients_per_round(sim, population) / population
    budget = PrivacyBudget(dp.dp_noise_multiplier, q, dp.delta(population), dp.target_epsilon)
    clip = f"{dp.dp_clip:g}"
    if dp.adaptive:
        clip = f"adaptive from {clip} toward quantile {dp.dp_target_quantile:g}"
    return (
        f"DP-FedAvg: noise multiplier {dp.dp_noise_multiplier:g}, clip {clip}, each client drawn with "
        f"probability {q:.4g}; {sim.rounds} rounds spend epsilon {budget.epsilon(sim.rounds):.3g} at delta "
        f"{budget.delta:.3g}" + (f" (target {dp.target_epsilon:g})" if dp.target_epsilon is not None else "")
    )


def simulate(args: argparse.Namespace) -> int:
    chosen = setting(args)
    sim, data = chosen.simulation, chosen.data
    if sim.list_layers:
        mcfg = model_config(sim, dataset_info(data.dataset).num_classes, data.image_size)
        Console(soft_wrap=True).print(format_layers(build_model(mcfg, seed=data.seed), mcfg.name), markup=False)
        return 0

    def before_training(model: ModelConfig, train_samples: list[int]) -> None:
        console.print(describe(chosen), soft_wrap=True)
        if sim.privacy.dp:
            console.print(describe_privacy(sim, len(train_samples)), soft_wrap=True)
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
        TextColumn("{task.fields[unit]}"),
        TimeElapsedColumn(),
        console=console,
    ) as bar:
        tasks = {a: bar.add_task(a, total=sim.rounds, unit="rounds") for a in sim.algorithms}

        def progress(task: str, done: int, total: int) -> None:
            if task not in tasks:  # the held-out users' fine-tuning, after the algorithms
                tasks[task] = bar.add_task(task, total=total, unit="fine-tunings")
            bar.update(tasks[task], completed=done)

        recorder = run(sim, data, progress, before_training)
    results = recorder.results()
    title = f"{data.dataset}, {len(recorder.config['clients_train_samples'])} clients, " \
        f"partition {recorder.config['partition']}, kp={sim.kp}"  # fmt: skip
    Console().print(run_table(results, title))
    if results.new_users is not None:
        Console().print(new_users_table(results.new_users))
    console.print(f"wrote {sim.out}/results.json, metrics.csv, plots ({time.perf_counter() - start:.0f} s)")
    return 0


def _value(value: float | None) -> str:
    return "-" if value is None else f"{value:.4f}"


def run_table(results: RunResults, title: str) -> Table:
    """One row per algorithm (its final point, the last-5 mean), then the baselines; with an
    epsilon column when the run was private."""
    table = Table(title=title)
    columns = ["algorithm", "final mean acc", "weighted", "std", "last-5 mean", "last-5 std", "final at"]
    private = bool(results.privacy)
    if private:
        columns.append("epsilon")
    for col in columns:
        table.add_column(col, justify="right" if col != "algorithm" else "left")
    for a, f in results.algorithms.items():
        row = [escape(a), _value(f.final_mean_accuracy), _value(f.final_weighted_mean_accuracy), _value(f.final_std),
               _value(f.last5_mean_accuracy), _value(f.last5_std), escape(f.final_point)]  # fmt: skip
        if private:
            row.append(_epsilon_cell(results.privacy.get(a)))
        table.add_row(*row)
    for name, b in results.baselines.items():
        row = [f"[dim]baseline: {escape(name)}[/]", _value(b.mean_accuracy), "", _value(b.std), "", "", ""]
        table.add_row(*row, *([""] if private else []))
    return table


def _epsilon_cell(spent: PrivacySummary | None) -> str:
    """epsilon at delta; "none shared" for local training, "inf" without noise."""
    if spent is None:
        return "none shared"
    value = "inf" if spent.epsilon is None else f"{spent.epsilon:.3g}"
    stopped = f", stopped before round {spent.stopped_before_round}" if spent.stopped_before_round else ""
    return f"{value} (delta {spent.delta:.2g}{stopped})"


def new_users_table(new_users: NewUsers) -> Table:
    """One row per N (with the number of users whose pool has N photos), one column per variant:
    mean accuracy ± standard error across those users ("-" where none had N)."""
    curves = new_users.curves
    table = Table(title=f"{len(new_users.users)} new users: accuracy after {new_users.steps} SGD steps "
                  "on their first N photos (mean ± s.e.)")  # fmt: skip
    table.add_column("N", justify="right")
    table.add_column("users", justify="right")
    for name in curves:
        table.add_column(escape(name), justify="right")
    sizes = sorted({int(n) for curve in curves.values() for n in curve} | set(new_users.sizes))
    for n in sizes:
        points = [curve.get(str(n)) for curve in curves.values()]
        users = max((p.users for p in points if p is not None), default=0)
        table.add_row(str(n), str(users), *(_cell(p) for p in points))
    return table


def _cell(point: CurvePoint | None) -> str:
    if point is None or point.mean is None:
        return "-"
    return f"{point.mean:.3f}" + (f"\n±{point.se:.3f}" if point.se is not None else "\n(one user)")  # fits 80 columns
