"""The training interface a device (or a simulated client) drives, whatever runs the math.

Two implementations exist: eager PyTorch (:mod:`fedper.eager_trainer`) and the
exported ExecuTorch training program (``device_runtime.training_program``). The local
training loop, the simulation and the device runtime only see this protocol.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from typing import Protocol

import numpy as np
import torch


class Trainer(Protocol):
    def set_tensors(self, tensors: Mapping[str, torch.Tensor | np.ndarray]) -> None:
        """Overwrite the named exchanged tensors (parameters or BN statistics)."""

    def get_tensors(self, names: Iterable[str]) -> dict[str, torch.Tensor]:
        """Copies of the named exchanged tensors."""

    def start_round(self, learning_rate: float, momentum: float) -> None:
        """A fresh SGD optimizer (momentum buffers reset), as each round starts."""

    def train_step(self, x: torch.Tensor, y: torch.Tensor) -> float:
        """One SGD step on a batch in train mode; returns the batch's mean loss."""

    def predict(self, x: torch.Tensor) -> torch.Tensor:
        """Logits of the eval-mode model with the current weights."""


def to_torch(tensors: Mapping[str, np.ndarray]) -> dict[str, torch.Tensor]:
    """Arrays from the weights codec (``fedper.common.weights``) as tensors a trainer takes (copies)."""
    return {name: torch.from_numpy(np.array(a, copy=True)) for name, a in tensors.items()}
