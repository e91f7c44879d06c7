"""``fedper simulate --backend ray``: the clients of a round trained as Ray tasks.

Each client's data goes into Ray's object store once; each round puts the received base there
once and runs one task per client (one CPU, one torch thread each), which returns what the
serial simulation would compute for that client (:func:`fedper.client_round.client_round`).
"""

from __future__ import annotations

from typing import Any

import torch

from fedper.client_round import Client, ClientOutcome, ClientRound, client_round
from fedper.eager_trainer import EagerTrainer
from fedper.models import ModelConfig, build_model

# One trainer per model in each Ray worker process, reused by the tasks that process runs
# (building a model per task would cost more than a small client's round).
_trainers: dict[ModelConfig, EagerTrainer] = {}


def _client_task(mcfg: ModelConfig, seed: int, task: ClientRound, client: Client, shared: dict[str, torch.Tensor],
                 personal: dict[str, torch.Tensor]) -> ClientOutcome:  # fmt: skip
    torch.set_num_threads(1)  # the task has one CPU; one thread also keeps the floats the serial run's
    if mcfg not in _trainers:
        _trainers[mcfg] = EagerTrainer(build_model(mcfg, seed=seed))
    return client_round(_trainers[mcfg], task, client, shared, personal)


class RayRounds:
    """The clients' rounds as Ray tasks in the connected Ray."""

    def __init__(self, ray: Any, mcfg: ModelConfig, seed: int, clients: list[Client]) -> None:
        self._ray, self._mcfg, self._seed = ray, mcfg, seed
        self._clients = [ray.put(c) for c in clients]
        self._task = ray.remote(num_cpus=1)(_client_task)

    def run(self, tasks: list[ClientRound], shared: dict[str, torch.Tensor],
            personal: list[dict[str, torch.Tensor]]) -> list[ClientOutcome]:  # fmt: skip
        base = self._ray.put(shared)
        refs = [self._task.remote(self._mcfg, self._seed, t, self._clients[t.client_id], base, personal[t.client_id])
                for t in tasks]  # fmt: skip
        outcomes: list[ClientOutcome] = self._ray.get(refs)
        return outcomes
