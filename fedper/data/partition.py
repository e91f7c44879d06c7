"""Seeded partitioners: how a pooled dataset becomes each client's local data."""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from fedper.data.dataset import DatasetError


@dataclass(frozen=True)
class ClientIndices:
    """One client's share of a dataset: disjoint local train and test indices."""

    train: np.ndarray
    test: np.ndarray


def iid(num_samples: int, num_clients: int, rng: np.random.Generator) -> list[np.ndarray]:
    """Shuffle and deal out equal shares."""
    _check_clients(num_samples, num_clients)
    return [np.sort(part) for part in np.array_split(rng.permutation(num_samples), num_clients)]


def classes_per_client(labels: np.ndarray, num_clients: int, k: int, rng: np.random.Generator) -> list[np.ndarray]:
    """Each client draws k distinct classes; each class is split evenly among its drawers."""
    num_classes = int(labels.max()) + 1
    if not 1 <= k <= num_classes:
        raise DatasetError(f"classes per client must be in 1..{num_classes}, got {k}")
    _check_clients(len(labels), num_clients)
    drawn = [rng.choice(num_classes, size=k, replace=False) for _ in range(num_clients)]
    parts: list[list[np.ndarray]] = [[] for _ in range(num_clients)]
    for c in range(num_classes):
        owners = [i for i, d in enumerate(drawn) if c in d]
        if not owners:
            continue
        members = rng.permutation(np.flatnonzero(labels == c))
        for owner, share in zip(owners, np.array_split(members, len(owners)), strict=True):
            parts[owner].append(share)
    return [np.sort(np.concatenate(p)) for p in parts]


def dirichlet(labels: np.ndarray, num_clients: int, alpha: float, rng: np.random.Generator) -> list[np.ndarray]:
    """Per class, client shares ~ Dirichlet(alpha): small alpha is strongly non-IID."""
    if alpha <= 0:
        raise DatasetError(f"Dirichlet alpha must be positive, got {alpha}")
    _check_clients(len(labels), num_clients)
    parts: list[list[np.ndarray]] = [[] for _ in range(num_clients)]
    for c in range(int(labels.max()) + 1):
        members = rng.permutation(np.flatnonzero(labels == c))
        shares = rng.dirichlet(np.full(num_clients, alpha))
        cuts = (np.cumsum(shares)[:-1] * len(members)).round().astype(int)
        for owner, share in enumerate(np.split(members, cuts)):
            parts[owner].append(share)
    return [np.sort(np.concatenate(p)) for p in parts]


def by_user(groups: np.ndarray | None, num_clients: int, rng: np.random.Generator) -> list[np.ndarray]:
    """One client per user (FLICKR-AES worker, aesthetic-synth user); users drawn with the seed."""
    if groups is None:
        raise DatasetError("the 'user' partition needs a dataset with owners (users)")
    users = np.unique(groups)
    if num_clients > len(users):
        raise DatasetError(f"{num_clients} clients requested but the dataset has {len(users)} users")
    chosen = np.sort(rng.choice(users, size=num_clients, replace=False))
    return [np.flatnonzero(groups == u) for u in chosen]


def other_users(
    groups: np.ndarray | None, taken: list[np.ndarray], count: int, rng: np.random.Generator
) -> list[np.ndarray]:
    """``count`` users drawn from those who own none of the ``taken`` samples: new users who never
    took part in training. Its own generator, so the training clients do not depend on ``count``."""
    if groups is None:
        raise DatasetError("held-out users need a dataset with owners (users)")
    used = np.unique(np.concatenate([groups[t] for t in taken])) if taken else np.array([], groups.dtype)
    free = np.setdiff1d(np.unique(groups), used)
    if count > len(free):
        raise DatasetError(
            f"{count} held-out users requested but only {len(free)} users are not training clients "
            f"({len(used)} are); generate or draw more users (--users)"
        )
    chosen = np.sort(rng.choice(free, size=count, replace=False))
    return [np.flatnonzero(groups == u) for u in chosen]


def train_test(indices: np.ndarray, test_fraction: float, rng: np.random.Generator) -> ClientIndices:
    """Split one client's samples into local train and test (at least one of each)."""
    if not 0 < test_fraction < 1:
        raise DatasetError(f"test fraction must be in (0, 1), got {test_fraction}")
    if len(indices) < 2:
        raise DatasetError(f"a client needs at least 2 samples, got {len(indices)}")
    shuffled = rng.permutation(indices)
    n_test = min(len(indices) - 1, max(1, round(len(indices) * test_fraction)))
    return ClientIndices(train=np.sort(shuffled[n_test:]), test=np.sort(shuffled[:n_test]))


def _check_clients(num_samples: int, num_clients: int) -> None:
    if num_clients < 1:
        raise DatasetError(f"need at least one client, got {num_clients}")
    if num_samples < 2 * num_clients:
        raise DatasetError(f"{num_samples} samples cannot be shared among {num_clients} clients")
