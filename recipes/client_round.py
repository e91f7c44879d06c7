"""One simulated client's round: evaluate the model it holds, then (if selected) train it.

A pure function of the received base, the client's own personal tensors, its data, the seed,
the round and its id, so the simulation can run the clients of a round one after the other on
one trainer or as Ray tasks on other trainers and get the same numbers.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

from fedper.local_training import batch_order_rng, evaluate, train
from fedper.train_config import TrainConfig
from fedper.trainer import Trainer


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
class ClientOutcome:
    accuracy: float  # before training: the model it holds at the start of the round
    accuracy_after: float | None = None
    loss: float | None = None
    personal: dict[str, torch.Tensor] | None = None  # after training (None: unchanged)
    update: dict[str, torch.Tensor] | None = None  # its shared tensors after training


def client_round(
    trainer: Trainer,
    task: ClientRound,
    client: Client,
    shared: dict[str, torch.Tensor],
    personal: dict[str, torch.Tensor],
) -> ClientOutcome:
    trainer.set_tensors(shared)
    trainer.set_tensors(personal)
    accuracy = evaluate(trainer, client.x_test, client.y_test)
    if not task.trains:
        return ClientOutcome(accuracy)
    order = batch_order_rng(task.seed, task.round, task.client_id)
    loss = train(trainer, client.x_train, client.y_train, task.training, order)
    return ClientOutcome(
        accuracy,
        evaluate(trainer, client.x_test, client.y_test),
        loss,
        trainer.get_tensors(task.personal_names),
        trainer.get_tensors(task.shared_names) if task.shared_names else None,
    )
