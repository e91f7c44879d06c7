"""How long a simulation will take on this machine, told before it starts.

One eager training step of the run's model at its input size and batch size is timed (a few
steps after a warm-up) and multiplied by the steps the run makes: the clients' batches over
their local epochs, per round, per algorithm. Evaluation is not counted: it adds a forward
pass over each client's test split once or twice a round.

``python -m fedper._recipes.run_estimate`` takes ``fedper simulate``'s options (a dataset's preset
included) and prints the step time alone, without loading any data.
"""

from __future__ import annotations

import sys
import time
from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np
import torch

from fedper._recipes.presets import help_text, setting
from fedper._recipes.simulation import SimulationConfig, model_config
from fedper.common.config_cli import parse
from fedper.common.train_config import TrainConfig
from fedper.data import DataConfig, dataset_info
from fedper.eager_trainer import EagerTrainer
from fedper.local_training import batches
from fedper.models import ModelConfig, build_model

WARMUP_STEPS, TIMED_STEPS = 1, 3


def measure_step(model: ModelConfig, training: TrainConfig, steps: int = TIMED_STEPS) -> float:
    """Seconds per eager training step (forward, backward, SGD with momentum) on random inputs:
    the mean of ``steps`` after a warm-up. The caller's random state is left as it was."""
    with torch.random.fork_rng(devices=[]):
        trainer = EagerTrainer(build_model(model, seed=0))
        x = torch.randn(training.batch_size, 3, model.input_size, model.input_size)
        y = torch.randint(0, model.num_classes, (training.batch_size,))
        trainer.start_round(training.learning_rate, training.momentum)
        for _ in range(WARMUP_STEPS):
            trainer.train_step(x, y)
        start = time.perf_counter()
        for _ in range(steps):
            trainer.train_step(x, y)
        return (time.perf_counter() - start) / steps


def steps_per_round(train_samples: Sequence[int], training: TrainConfig, clients_per_round: int) -> float:
    """Training steps in one round: the batches of ``clients_per_round`` clients (the mean client's
    when not all train) over their local epochs, as :func:`fedper.local_training.batches` deals them."""
    counts = [len(batches(n, training.batch_size, np.random.default_rng(0))) for n in train_samples]
    return training.local_epochs * sum(counts) / len(counts) * clients_per_round


@dataclass(frozen=True)
class RunEstimate:
    """A run's time: seconds per step x steps per round x rounds x algorithms."""

    step_seconds: float
    steps_per_round: float
    rounds: int
    algorithms: int

    @property
    def seconds(self) -> float:
        return self.step_seconds * self.steps_per_round * self.rounds * self.algorithms

    def __str__(self) -> str:
        return (
            f"about {duration(self.seconds)} on this machine ({step_time(self.step_seconds)} per step x "
            f"{self.steps_per_round:.0f} steps per round x {self.rounds} round{'s' if self.rounds != 1 else ''} x "
            f"{self.algorithms} "
            f"algorithm{'s' if self.algorithms != 1 else ''}; evaluation not counted)"
        )


def step_time(seconds: float) -> str:
    return f"{seconds:.2f} s" if seconds >= 1 else f"{seconds * 1000:.0f} ms"


def duration(seconds: float) -> str:
    if seconds < 90:
        return f"{seconds:.0f} s"
    if seconds < 90 * 60:
        return f"{seconds / 60:.0f} min"
    if seconds < 48 * 3600:
        return f"{seconds / 3600:.1f} h"
    return f"{seconds / 86400:.1f} days"


def main(argv: Sequence[str] | None = None) -> None:
    description = ("Time one eager training step of the model `fedper simulate` would train with these options. "
                   + help_text())  # fmt: skip
    args = parse([DataConfig, SimulationConfig], sys.argv[1:] if argv is None else argv,
                 "python -m fedper._recipes.run_estimate", description)  # fmt: skip
    chosen = setting(args)
    sim, data = chosen.simulation, chosen.data
    if sim.threads:
        torch.set_num_threads(sim.threads)
    model = model_config(sim, dataset_info(data.dataset).num_classes, data.image_size)
    seconds = measure_step(model, sim.training)
    print(
        f"{sim.model.name} width {sim.model.alpha}, {data.image_size} px, batch {sim.training.batch_size}, "
        f"{torch.get_num_threads()} thread(s): {step_time(seconds)} per eager training step "
        f"(mean of {TIMED_STEPS} after {WARMUP_STEPS} warm-up)"
    )


if __name__ == "__main__":
    main()
