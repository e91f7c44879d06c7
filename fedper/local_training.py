"""Local training and evaluation over a client's data, for any Trainer."""

from __future__ import annotations

import numpy as np
import torch

from fedper.common.train_config import TrainConfig
from fedper.trainer import Trainer

MIN_BATCH = 2  # BatchNorm cannot train on one example


def accuracy(logits: torch.Tensor, labels: torch.Tensor) -> float:
    """Fraction of correct top-1 predictions."""
    if labels.numel() == 0:
        raise ValueError("accuracy of an empty set is undefined")
    return float((logits.argmax(dim=1) == labels).float().mean().item())


def batch_order_rng(seed: int, round_number: int, client_id: int) -> np.random.Generator:
    """The generator that shuffles client ``client_id``'s batches in round ``round_number``: the
    simulation and an emulated device draw the same batch order from it, so their runs agree."""
    return np.random.default_rng([seed, 21, round_number, client_id])


def batches(num_samples: int, batch_size: int, rng: np.random.Generator) -> list[np.ndarray]:
    """One epoch's shuffled batches; a last batch smaller than 2 is dropped."""
    order = rng.permutation(num_samples)
    out = [order[i : i + batch_size] for i in range(0, num_samples, batch_size)]
    return [b for b in out if len(b) >= MIN_BATCH]


def train(
    trainer: Trainer,
    x: torch.Tensor,
    y: torch.Tensor,
    config: TrainConfig,
    rng: np.random.Generator,
) -> float:
    """Run ``local_epochs`` epochs with a fresh optimizer; returns the mean batch loss."""
    trainer.start_round(config.learning_rate, config.momentum)
    losses = []
    for _ in range(config.local_epochs):
        for idx in batches(len(y), config.batch_size, rng):
            t = torch.from_numpy(idx)
            losses.append(trainer.train_step(x[t], y[t]))
    return float(np.mean(losses)) if losses else float("nan")


def evaluate(trainer: Trainer, x: torch.Tensor, y: torch.Tensor, batch_size: int = 256) -> float:
    """Top-1 accuracy of the eval-mode model with the trainer's current weights."""
    logits = torch.cat([trainer.predict(x[i : i + batch_size]) for i in range(0, len(y), batch_size)])
    return accuracy(logits, y)
