"""``fedper pretrain``: the pretraining recipe with a progress bar and a summary of what it learned."""

from __future__ import annotations

import argparse

from rich.console import Console
from rich.progress import (
    BarColumn,
    MofNCompleteColumn,
    Progress,
    TaskID,
    TextColumn,
    TimeElapsedColumn,
    TimeRemainingColumn,
)

from fedper._recipes.pretrain import BASE, CARD, PretrainConfig, run_pretrain
from fedper.common.config_cli import add_command, from_arguments

console = Console(stderr=True)


def add_parser(sub: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    add_command(
        sub, "pretrain", pretrain, [PretrainConfig],
        help="pretrain a base on unrated photos (no rating, no taste) for --init",
        description="Pretrains MobileNet-V1's base to tell what unrated composite photos show (photographic "
        "properties measured on the pixels and the layout, the edits applied, the content category), with no "
        "rater involved. Writes base.safetensors (for --init of simulate, export and demo) and model_card.json; "
        "an interrupted run resumes from its last finished epoch.",
    )  # fmt: skip


def pretrain(args: argparse.Namespace) -> int:
    config = from_arguments(PretrainConfig, args)
    columns = (TextColumn("{task.description:<12}"), BarColumn(), MofNCompleteColumn(), TimeElapsedColumn(),
               TimeRemainingColumn())  # fmt: skip
    with Progress(*columns, console=console) as bar:
        tasks: dict[str, TaskID] = {}

        def progress(done: int, total: int, what: str) -> None:
            key = "render" if what == "rendering" else "train"
            if key not in tasks:
                tasks[key] = bar.add_task(what, total=total)
            bar.update(tasks[key], completed=done, description=what)

        card = run_pretrain(config, progress)
    scores = card["pretext"]["held_out_scores"]
    looks = {k.removeprefix("look."): v for k, v in scores.items() if k.startswith("look.")}
    console.print("held-out R² of the looks: " + ", ".join(f"{k} {v:.2f}" for k, v in looks.items()), soft_wrap=True)
    console.print(f"category accuracy {scores['category_accuracy']:.3f} (chance {1 / 8:.3f})")
    console.print(f"wrote {config.out / BASE} (sha256 {card['base']['sha256'][:12]}) and {config.out / CARD}")
    return 0
