"""One client's round, as ``fedper simulate`` and the device runtime both run it.

Load the model the client holds (the received base, its own personal tensors) and score it;
if it takes part, train it in the batch order this client gets in this round, score it again,
and return its personal tensors and its base update. A pure function of those inputs, so the
simulation can run its clients one after the other or as Ray tasks, and a fleet of devices
over HTTP computes the same numbers (``tests/integration/test_device_runtime.py``).
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass

import numpy as np
import torch

from fedper.common.train_config import TrainConfig
from fedper.local_training import batch_order_rng, evaluate, train
from fedper.trainer import Trainer

Held = Sequence[Mapping[str, torch.Tensor | np.ndarray]]  # what the client holds, loaded in order


@dataclass
class Client:
    x_train: torch.Tensor
    y_train: torch.Tensor
    x_test: torch.Tensor
    y_test: torch.Tensor

    @property
    def num_samples(self) -> int:
        return len(self.y_train)


@dataclass(frozen=True)
class ClientRound:
    """What one client does in one round (``trains``: selected, else it is only evaluated)."""

    client_id: int
    round: int
    seed: int
    trains: bool
    training: TrainConfig
    shared_names: tuple[str, ...]  # what it sends to be aggregated
    personal_names: tuple[str, ...]  # what it keeps


@dataclass(frozen=True)
class Trained:
    loss: float
    accuracy_after: float | None
    personal: dict[str, torch.Tensor]
    update: dict[str, torch.Tensor]  # its shared tensors after training (empty: it shares none)


@dataclass(frozen=True)
class ClientOutcome:
    accuracy: float | None  # before training: the model it holds at the start of the round
    accuracy_after: float | None = None
    loss: float | None = None
    personal: dict[str, torch.Tensor] | None = None  # after training (None: unchanged)
    update: dict[str, torch.Tensor] | None = None  # its shared tensors after training


def score(trainer: Trainer, x: torch.Tensor, y: torch.Tensor) -> float | None:
    """Accuracy on a test split; None for an empty one (undefined, and not recorded)."""
    return evaluate(trainer, x, y) if len(y) else None


def score_held(trainer: Trainer, held: Held, client: Client) -> float | None:
    """Load what the client holds and score its test split."""
    for tensors in held:
        trainer.set_tensors(tensors)
    return score(trainer, client.x_test, client.y_test)


def train_held(trainer: Trainer, held: Held, task: ClientRound, client: Client) -> Trained:
    """Load what the client holds (again: a trainer shared by clients may hold another's), train
    it on the client's data in the round's batch order, and score it again."""
    for tensors in held:
        trainer.set_tensors(tensors)
    order = batch_order_rng(task.seed, task.round, task.client_id)
    loss = train(trainer, client.x_train, client.y_train, task.training, order)
    return Trained(
        loss,
        score(trainer, client.x_test, client.y_test),
        trainer.get_tensors(task.personal_names),
        trainer.get_tensors(task.shared_names),
    )


def client_round(
    trainer: Trainer,
    task: ClientRound,
    client: Client,
    shared: dict[str, torch.Tensor],
    personal: dict[str, torch.Tensor],
) -> ClientOutcome:
    """The simulation's round of one client: scored, then trained if ``task.trains``."""
    accuracy = score_held(trainer, (shared, personal), client)
    if not task.trains:
        return ClientOutcome(accuracy)
    trained = train_held(trainer, (shared, personal), task, client)
    return ClientOutcome(accuracy, trained.accuracy_after, trained.loss, trained.personal, trained.update or None)
