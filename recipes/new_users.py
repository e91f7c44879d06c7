"""After a simulation: how many rated photos a new user needs before the trained model fits them.

The held-out users (``--holdout-clients``) never took part in training. Each variant gives
them a starting model and fine-tunes part of it on their first N photos
(:func:`fedper.fine_tuning.fine_tuning_curve`):

- ``fedper: head``: FedPer's final base and the run's initial head; the head is trained (the
  paper's new clients, Figs 15-18);
- ``fedper: head+base``: the same start, every tensor trained;
- ``fedavg: head``: FedAvg's final model; the same head layers are trained;
- ``scratch``: the run's initial weights (with ``--init``, the checkpoint's base and a fresh head), every
  tensor trained;
- ``majority of N``: no model, the rating the user gave most often among its first N photos.

Every variant but FedAvg's starts with a fresh classifier, which each user first sets to the
frequencies of its own first N ratings (:func:`fedper.models.heads.rating_prior`).
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

import torch

from fedper.common import weights
from fedper.common.train_config import TrainConfig
from fedper.data import FederatedData, labelled_tensors
from fedper.fine_tuning import (
    FINE_TUNING_SIZES,
    NewUser,
    curve_summary,
    fine_tuning_curve,
    majority_curve,
    personal_names,
    with_base,
)
from fedper.models import ModelConfig, build_model, exchanged_state, split

FINAL_BASE = "final_base.safetensors"
ProgressFn = Callable[[str, int, int], None]
TASK = "new users"
MAJORITY = "majority of N"

# start, trainable (None: all), whether the start's classifier is fresh
Variant = tuple[dict[str, torch.Tensor], tuple[str, ...] | None, bool]


def holdout_users(fed: FederatedData) -> list[NewUser]:
    """The held-out users' pools (in rating order) and test splits, normalized like the clients'."""
    ds = fed.dataset
    users = []
    for j in range(len(fed.holdout)):
        pool, test = fed.holdout_pool(j), fed.holdout_test(j)
        users.append(NewUser(*labelled_tensors(pool, ds), *labelled_tensors(test, ds)))
    return users


def variants(mcfg: ModelConfig, kp: int, algorithms: Sequence[str], out: Path, seed: int) -> dict[str, Variant]:
    """The starting models and what each trains, from the run's initial weights and the final
    bases the run wrote (``out/<algorithm>/final_base.safetensors``)."""
    model = build_model(mcfg, seed=seed)
    initial = exchanged_state(model)
    model_split = split(model, kp)
    found: dict[str, Variant] = {}
    if "fedper" in algorithms:
        base = weights.load(out / "fedper" / FINAL_BASE)
        start = with_base(initial, base)
        found["fedper: head"] = (start, personal_names(model_split, base), True)
        found["fedper: head+base"] = (start, None, True)
    if "fedavg" in algorithms:
        base = weights.load(out / "fedavg" / FINAL_BASE)
        found["fedavg: head"] = (with_base(initial, base), personal_names(model_split, base), False)
    found["scratch"] = (initial, None, True)
    return found


def new_user_curves(
    fed: FederatedData,
    mcfg: ModelConfig,
    kp: int,
    algorithms: Sequence[str],
    out: Path,
    training: TrainConfig,
    steps: int,
    seed: int,
    progress: ProgressFn | None = None,
    skip: Sequence[str] = (),
) -> dict[str, Any]:
    """Accuracy against N for every variant but those in ``skip``, as it goes into results.json's
    ``"new_users"``."""
    users = holdout_users(fed)
    found = {k: v for k, v in variants(mcfg, kp, algorithms, out, seed).items() if k not in skip}
    sizes = FINE_TUNING_SIZES
    total = len(found) * sum(1 for u in users for n in sizes if n <= len(u.y_pool))
    done = 0

    def tick() -> None:
        nonlocal done
        done += 1
        if progress is not None:
            progress(TASK, done, total)

    curves = {
        name: curve_summary(fine_tuning_curve(mcfg, start, trainable, users, sizes, training, steps, seed, tick, fresh))
        for name, (start, trainable, fresh) in found.items()
    }
    curves[MAJORITY] = curve_summary(majority_curve(users, sizes))
    groups = fed.dataset.groups
    return {
        "users": [int(groups[h.test[0]]) if groups is not None else j for j, h in enumerate(fed.holdout)],
        "pool_sizes": [len(u.y_pool) for u in users],
        "test_sizes": [len(u.y_test) for u in users],
        "sizes": list(sizes),
        "steps": steps,
        "curves": curves,
    }
