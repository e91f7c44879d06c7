"""The reference trainer: the model in eager PyTorch (the simulation and ``--engine eager``)."""

from __future__ import annotations

from collections.abc import Iterable, Mapping, Sequence

import numpy as np
import torch
from torch import nn

from fedper.models.split import exchanged_names


class EagerTrainer:
    """SGD with momentum on an eager model; ``trainable`` limits what the optimizer updates.

    Frozen tensors stay bit-identical: their BatchNorm running statistics are
    restored after each step, as the exported program's caller would discard them. Frozen
    parameters get no gradient (``requires_grad`` off), so a head-only step does not
    backpropagate through the base (same numbers, half the time for kp=2).
    """

    def __init__(self, model: nn.Module, trainable: Sequence[str] | None = None):
        self.model = model
        self._names = exchanged_names(model)
        self._state = model.state_dict(keep_vars=True)
        self._params = dict(model.named_parameters())
        trainable_set = set(self._names if trainable is None else trainable)
        unknown = trainable_set - set(self._names)
        if unknown:
            raise KeyError(f"unknown trainable tensors: {sorted(unknown)[:3]}")
        self._trainable = [p for n, p in self._params.items() if n in trainable_set]
        self._needs_grad = [(p, n in trainable_set) for n, p in self._params.items()]
        self._frozen_stats = [n for n in self._names if n not in self._params and n not in trainable_set]
        self._loss = nn.CrossEntropyLoss()
        self._optimizer: torch.optim.SGD | None = None

    @property
    def names(self) -> tuple[str, ...]:
        return self._names

    def set_tensors(self, tensors: Mapping[str, torch.Tensor | np.ndarray]) -> None:
        with torch.no_grad():
            for name, value in tensors.items():
                if name not in self._state:
                    raise KeyError(f"the model has no tensor {name!r}")
                target = self._state[name]
                src = torch.as_tensor(value)
                if tuple(src.shape) != tuple(target.shape):
                    raise ValueError(f"tensor {name!r}: shape {list(src.shape)}, expected {list(target.shape)}")
                target.copy_(src)

    def get_tensors(self, names: Iterable[str]) -> dict[str, torch.Tensor]:
        return {n: self._state[n].detach().clone() for n in names}

    def start_round(self, learning_rate: float, momentum: float) -> None:
        self._optimizer = torch.optim.SGD(self._trainable, lr=learning_rate, momentum=momentum)

    def train_step(self, x: torch.Tensor, y: torch.Tensor) -> float:
        if self._optimizer is None:
            raise RuntimeError("call start_round() before train_step()")
        if len(x) < 2:
            raise ValueError("BatchNorm cannot train on a batch of one; drop such batches")
        saved = {n: self._state[n].detach().clone() for n in self._frozen_stats}
        for p, needed in self._needs_grad:  # set per step: another trainer may share the model
            p.requires_grad_(needed)
        self.model.train()
        self._optimizer.zero_grad(set_to_none=True)
        loss = self._loss(self.model(x), y)
        loss.backward()
        self._optimizer.step()
        if saved:
            self.set_tensors(saved)
        return float(loss.item())

    def predict(self, x: torch.Tensor) -> torch.Tensor:
        self.model.eval()
        with torch.no_grad():
            return self.model(x)
