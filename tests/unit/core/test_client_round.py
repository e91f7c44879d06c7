"""The one client round (``fedper.client_round``) that the simulation and the device runtime share.

What the device runtime relies on beyond the simulation: a trainer shared by several devices
holds whoever used it last, so a round must give the same numbers on a trainer that held
another client's tensors as on a fresh one; and a device without test examples has no accuracy.
"""

from __future__ import annotations

import torch

from fedper.client_round import Client, ClientRound, client_round, score_held, train_held
from fedper.common.train_config import TrainConfig
from fedper.eager_trainer import EagerTrainer
from fedper.models import ModelConfig, build_model
from fedper.models.split import exchanged_state, split

CONFIG = ModelConfig(num_classes=3, alpha=0.25, input_size=32)


def _client(seed: int, n_test: int = 8) -> Client:
    g = torch.Generator().manual_seed(seed)
    return Client(
        torch.randn(12, 3, 32, 32, generator=g), torch.randint(0, 3, (12,), generator=g),
        torch.randn(n_test, 3, 32, 32, generator=g), torch.randint(0, 3, (n_test,), generator=g),
    )  # fmt: skip


def _setup() -> tuple[EagerTrainer, ClientRound, dict[str, torch.Tensor], dict[str, torch.Tensor]]:
    model = build_model(CONFIG, seed=0)
    parts = split(model, kp=1)
    state = exchanged_state(model)
    task = ClientRound(5, 2, 0, True, TrainConfig(batch_size=4), parts.base, parts.head)
    return (
        EagerTrainer(model),
        task,
        {n: state[n] for n in parts.base},
        {n: state[n] for n in parts.head},
    )


def test_a_shared_trainer_gives_what_a_fresh_one_gives() -> None:
    trainer, task, base, head = _setup()
    client = _client(1)
    fresh = client_round(trainer, task, client, base, head)
    assert fresh.personal is not None and fresh.update is not None
    # Another client's round leaves its tensors in the trainer; this client's round loads its own.
    other = {n: t + 0.5 for n, t in head.items()}
    client_round(trainer, ClientRound(6, 2, 0, True, task.training, task.shared_names, task.personal_names),
                 _client(2), base, other)  # fmt: skip
    trained = train_held(trainer, (base, head), task, client)
    assert trained.loss == fresh.loss
    assert trained.accuracy_after == fresh.accuracy_after
    for name, tensor in fresh.update.items():
        assert torch.equal(trained.update[name], tensor), name
    for name, tensor in fresh.personal.items():
        assert torch.equal(trained.personal[name], tensor), name
    # The trainer now holds the trained tensors; scoring loads the held ones again.
    assert score_held(trainer, (base, head), client) == fresh.accuracy


def test_no_test_examples_no_accuracy() -> None:
    trainer, task, base, head = _setup()
    outcome = client_round(trainer, task, _client(1, n_test=0), base, head)
    assert outcome.accuracy is None and outcome.accuracy_after is None
    assert outcome.loss is not None and outcome.update  # it still trains and shares


def test_a_client_that_shares_nothing_sends_no_update() -> None:
    trainer, task, _base, head = _setup()
    local = ClientRound(5, 2, 0, True, task.training, (), task.personal_names)
    outcome = client_round(trainer, local, _client(1), {}, head)
    assert outcome.update is None and outcome.personal is not None
