"""New users: how accurate a received model gets after training on a user's first N photos.

FedPer's paper (Arivazhagan et al. 2019, Figs 15-18) gives a client that never took part in
training the trained base and lets it train only its personal layers. Here any starting
model (a trained base plus a fresh head, a FedAvg model, the initial weights) is fine-tuned,
separately for each N, on the first N photos of each new user's pool and scored on the user's
test split; N=0 scores the starting model as received.

Every N gets the same budget, ``steps`` SGD steps on batches of min(batch size, N) (epoch after
epoch of the N photos): a budget counted in epochs would give N=5 one or two steps, so small N
would look bad for lack of training rather than lack of data.

A start whose head is fresh (not trained by anyone) has its classifier set, for each user and
N, to the frequencies of the user's first N ratings (:func:`fedper.models.heads.rating_prior`)
before it trains: what a phone can do with nothing but its owner's ratings.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np
import torch

from fedper.common.errors import ConfigError
from fedper.common.metrics import summarize
from fedper.common.train_config import TrainConfig
from fedper.common.weights import WeightsError
from fedper.eager_trainer import EagerTrainer
from fedper.local_training import MIN_BATCH, batches, evaluate
from fedper.models import ModelConfig, build_model, exchanged_names
from fedper.models.heads import rating_prior
from fedper.models.split import ModelSplit

FINE_TUNING_SIZES: tuple[int, ...] = (0, 5, 10, 20, 50, 100)

Tensors = Mapping[str, torch.Tensor | np.ndarray]
# N -> user index -> accuracy on the user's test split, for the users whose pool has N photos
Curve = dict[int, dict[int, float]]


@dataclass(frozen=True)
class NewUser:
    """A new user's photos: the fine-tuning pool in the order the user rates them, and a test split."""

    x_pool: torch.Tensor
    y_pool: torch.Tensor
    x_test: torch.Tensor
    y_test: torch.Tensor


def with_base(initial: Tensors, base: Tensors) -> dict[str, torch.Tensor]:
    """The model a new user starts from: ``initial`` (every exchanged tensor) with the received
    ``base`` in place of its own; e.g. a server's base and the export's initial head."""
    unknown = sorted(set(base) - set(initial))
    if unknown:
        raise WeightsError(f"the base holds tensors the model does not have: {unknown[:3]}")
    out = {n: torch.as_tensor(t) for n, t in initial.items()}
    for name, t in base.items():
        if tuple(t.shape) != tuple(out[name].shape):
            raise WeightsError(f"base tensor {name!r}: shape {list(t.shape)}, expected {list(out[name].shape)}")
        out[name] = torch.as_tensor(t)
    return out


def personal_names(model_split: ModelSplit, base: Tensors) -> tuple[str, ...]:
    """What a new user trains when it keeps the received base: the head, and every tensor the
    base does not hold (the BatchNorm statistics a run with ``--bn local`` keeps on devices)."""
    head = set(model_split.head)
    return tuple(n for n in model_split.names if n in head or n not in base)


def fine_tuning_curve(
    model_config: ModelConfig,
    start: Tensors,
    trainable: Sequence[str] | None,
    users: Sequence[NewUser],
    sizes: Sequence[int],
    training: TrainConfig,
    steps: int,
    seed: int,
    progress: Callable[[], None] | None = None,
    fresh_head: bool = False,
) -> Curve:
    """Each user's test accuracy after fine-tuning ``trainable`` (None: every tensor) of ``start``
    on its first N pool photos, for every N in ``sizes`` that its pool covers. ``training``
    gives the batch size, learning rate and momentum; ``steps`` replaces its epochs. The batch
    order follows from (seed, user, N) alone, so every starting model sees the same batches.
    ``fresh_head``: the start's classifier is untrained, so each user starts it at the
    frequencies of its first N ratings. ``progress`` is called after each (user, N)."""
    bad = [n for n in sizes if n < 0 or 0 < n < MIN_BATCH]
    if bad:
        raise ConfigError(f"fine-tuning sizes must be 0 or at least {MIN_BATCH} photos, got {bad}")
    if steps < 1:
        raise ConfigError(f"fine-tuning needs at least one step, got {steps}")
    model = build_model(model_config, seed=seed)  # every exchanged tensor is overwritten below
    missing = sorted(set(exchanged_names(model)) - set(start))
    if missing:
        raise WeightsError(f"the starting tensors lack {len(missing)} of the model's, e.g. {missing[:3]}")
    trainer = EagerTrainer(model, trainable)
    head_name = model.classifier_name()
    head = model.get_submodule(head_name)
    curve: Curve = {n: {} for n in sizes}
    for u, user in enumerate(users):
        for n in sizes:
            if n > len(user.y_pool):
                continue
            trainer.set_tensors(start)
            if n and fresh_head:
                prior = rating_prior(head, user.y_pool[:n], model_config.num_classes)
                trainer.set_tensors({f"{head_name}.{k}": v for k, v in prior.items()})
            if n:
                rng = np.random.default_rng([seed, 22, u, n])
                fine_tune(trainer, user.x_pool[:n], user.y_pool[:n], training, steps, rng)
            curve[n][u] = evaluate(trainer, user.x_test, user.y_test)
            if progress is not None:
                progress()
    return curve


def fine_tune(
    trainer: EagerTrainer,
    x: torch.Tensor,
    y: torch.Tensor,
    training: TrainConfig,
    steps: int,
    rng: np.random.Generator,
) -> float:
    """``steps`` SGD steps with a fresh optimizer over shuffled epochs of (x, y); the mean loss."""
    trainer.start_round(training.learning_rate, training.momentum)
    batch_size = min(training.batch_size, len(y))
    losses: list[float] = []
    while len(losses) < steps:
        for idx in batches(len(y), batch_size, rng):
            t = torch.from_numpy(idx)
            losses.append(trainer.train_step(x[t], y[t]))
            if len(losses) == steps:
                break
    return float(np.mean(losses))


def majority_curve(users: Sequence[NewUser], sizes: Sequence[int]) -> Curve:
    """The reference a model must beat: predict the rating the user gave most often among its
    first N photos (the smallest on a tie); nothing at N=0, where there is no rating yet."""
    curve: Curve = {n: {} for n in sizes}
    for u, user in enumerate(users):
        for n in sizes:
            if 0 < n <= len(user.y_pool):
                guess = int(torch.bincount(user.y_pool[:n]).argmax())
                curve[n][u] = float((user.y_test == guess).float().mean())
    return curve


def curve_summary(curve: Curve) -> dict[str, dict[str, Any]]:
    """Per N (as a string, for JSON): users covered, mean, std across users (population), standard
    error of the mean (None below two users) and each covered user's accuracy."""
    out: dict[str, dict[str, Any]] = {}
    for n, per_user in curve.items():
        row: dict[str, Any] = {"users": len(per_user)}
        if per_user:
            s = summarize(list(per_user.values()))
            se = s.std / math.sqrt(s.count - 1) if s.count > 1 else None
            row.update(mean=s.mean, std=s.std, se=se, per_user={str(u): a for u, a in per_user.items()})
        out[str(n)] = row
    return out
