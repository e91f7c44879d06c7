"""Dataset names, their loaders, and the client shares they are partitioned into."""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import Literal, get_args

import numpy as np

from fedper.common.config_cli import option
from fedper.common.errors import ConfigError
from fedper.data import aesthetic_synth, cifar, digits, flickr_aes
from fedper.data.dataset import DEFAULT_MEAN, DEFAULT_STD, DatasetError, ImageDataset
from fedper.data.partition import (
    ClientIndices,
    by_user,
    classes_per_client,
    dirichlet,
    iid,
    other_users,
    train_test,
)

DatasetName = Literal["digits", "aesthetic-synth", "cifar10", "cifar100", "flickr-aes"]
DATASETS: tuple[DatasetName, ...] = get_args(DatasetName)
Partition = Literal["auto", "classes", "dirichlet", "iid", "user"]
PARTITIONS: tuple[Partition, ...] = get_args(Partition)


@dataclass(frozen=True)
class DataConfig:
    """Which data, and how it is shared among clients. Every field is reproducible from the seed."""

    dataset: DatasetName = option("digits", "dataset name")
    data_root: Path | None = option(
        None, "directory with the local files of cifar10/cifar100/flickr-aes", metavar="DIR"
    )
    partition: Partition = option(
        "auto", "how clients get their data; auto = 'user' for rating datasets, else 'classes'"
    )
    num_clients: int = option(10, "number of clients", flags=("--clients",))
    classes_per_client: int = option(4, "k for the 'classes' partition (k random classes each)")
    dirichlet_alpha: float = option(0.5, "alpha for the 'dirichlet' partition")
    test_fraction: float = option(0.2, "share of each client's data kept as its local test split")
    image_size: int = option(32, "image side in pixels (the model's input size)")
    users: int = option(30, "aesthetic-synth users generated / FLICKR-AES workers drawn")
    images_per_user: tuple[int, int] = option((100, 200), "aesthetic-synth images rated per user, N or MIN-MAX")
    seed: int = option(0, "seed for data generation, partitioning and training")
    holdout_clients: int = option(
        0, "new users who never train with the federation, drawn from the users no client has "
        "(user partition only); each gets a fine-tuning pool and a test split",
    )  # fmt: skip
    validate: bool = option(
        False, "score every client on a validation split of its training photos (the --test-fraction share of "
        "them) instead of its test photos, which are then not used at all: for choosing settings",
    )  # fmt: skip

    def __post_init__(self) -> None:
        if self.holdout_clients < 0:
            raise ConfigError(f"--holdout-clients must be >= 0, got {self.holdout_clients}")
        if self.validate and self.holdout_clients:
            raise ConfigError("--validate chooses settings on the clients' training photos; drop --holdout-clients")


@dataclass(frozen=True)
class FederatedData:
    """A dataset and each client's share of it; ``holdout``: the held-out users' shares, whose
    ``train`` is the fine-tuning pool in the (seeded) order the user rates its photos."""

    dataset: ImageDataset
    clients: tuple[ClientIndices, ...]
    partition: str
    holdout: tuple[ClientIndices, ...] = ()

    def client_train(self, client: int) -> ImageDataset:
        return self.dataset.subset(self.clients[client].train)

    def client_test(self, client: int) -> ImageDataset:
        return self.dataset.subset(self.clients[client].test)

    def holdout_pool(self, user: int) -> ImageDataset:
        return self.dataset.subset(self.holdout[user].train)

    def holdout_test(self, user: int) -> ImageDataset:
        return self.dataset.subset(self.holdout[user].test)


@dataclass(frozen=True)
class DatasetInfo:
    """What an export needs to know about a dataset without loading it."""

    mean: tuple[float, float, float]
    std: tuple[float, float, float]
    labels: tuple[str, ...] | None
    num_classes: int


def dataset_info(name: str) -> DatasetInfo:
    infos = {
        "digits": DatasetInfo(digits.MEAN, digits.STD, digits.CLASSES, 10),
        "aesthetic-synth": DatasetInfo(DEFAULT_MEAN, DEFAULT_STD, aesthetic_synth.CLASSES, 5),
        "cifar10": DatasetInfo(cifar.CIFAR10_MEAN, cifar.CIFAR10_STD, cifar.CIFAR10_CLASSES, 10),
        "cifar100": DatasetInfo(cifar.CIFAR100_MEAN, cifar.CIFAR100_STD, None, 100),
        "flickr-aes": DatasetInfo(flickr_aes.MEAN, flickr_aes.STD, flickr_aes.CLASSES, 5),
    }
    if name not in infos:
        raise DatasetError(f"unknown dataset {name!r}; choose one of: {', '.join(DATASETS)}")
    return infos[name]


def load_dataset(config: DataConfig) -> ImageDataset:
    name = config.dataset
    if name == "digits":
        return digits.load(config.image_size)
    if name == "aesthetic-synth":
        return aesthetic_synth.load(
            aesthetic_synth.SynthConfig(
                users=config.users,
                images_per_user=config.images_per_user,
                image_size=config.image_size,
                seed=config.seed,
            )
        )
    if name in ("cifar10", "cifar100", "flickr-aes"):
        if config.data_root is None:
            raise DatasetError(f"dataset {name!r} reads local files: pass --data-root DIR")
        if name == "cifar10":
            ds = cifar.load_cifar10(config.data_root)
        elif name == "cifar100":
            ds = cifar.load_cifar100(config.data_root)
        else:
            return flickr_aes.load(config.data_root, config.users, config.seed, config.image_size)
        if config.image_size != 32:
            raise DatasetError(f"{name} images are 32x32; use --image-size 32")
        return ds
    raise DatasetError(f"unknown dataset {name!r}; choose one of: {', '.join(DATASETS)}")


def resolve_partition(config: DataConfig, dataset: ImageDataset) -> str:
    if config.partition not in PARTITIONS:
        raise DatasetError(f"unknown partition {config.partition!r}; choose one of: {', '.join(PARTITIONS)}")
    if config.partition == "auto":
        return "user" if dataset.groups is not None else "classes"
    return config.partition


def partition(dataset: ImageDataset, config: DataConfig) -> FederatedData:
    """Deal the dataset out to ``num_clients`` clients, each split into local train/test."""
    kind = resolve_partition(config, dataset)
    rng = np.random.default_rng([config.seed, 10])
    if kind == "classes":
        shares = classes_per_client(dataset.labels, config.num_clients, config.classes_per_client, rng)
    elif kind == "dirichlet":
        shares = dirichlet(dataset.labels, config.num_clients, config.dirichlet_alpha, rng)
    elif kind == "iid":
        shares = iid(len(dataset), config.num_clients, rng)
    else:
        shares = by_user(dataset.groups, config.num_clients, rng)
    clients = []
    for i, share in enumerate(shares):
        try:
            split = train_test(share, config.test_fraction, np.random.default_rng([config.seed, 11, i]))
            if config.validate:  # the test photos are set aside; the training photos split again
                split = train_test(split.train, config.test_fraction, np.random.default_rng([config.seed, 12, i]))
            clients.append(split)
        except DatasetError as exc:
            raise DatasetError(f"client {i}: {exc} (too many clients for this dataset?)") from exc
    holdout = _holdout(dataset, config, kind, shares) if config.holdout_clients else ()
    return FederatedData(dataset=dataset, clients=tuple(clients), partition=kind, holdout=holdout)


def _holdout(
    dataset: ImageDataset, config: DataConfig, kind: str, shares: list[np.ndarray]
) -> tuple[ClientIndices, ...]:
    """The held-out users: whole users outside the training clients, so only the user partition
    has them (dealing extra shares of a class partition would change the training clients')."""
    if kind != "user":
        raise DatasetError(
            f"--holdout-clients needs the 'user' partition (aesthetic-synth, flickr-aes), "
            f"not {kind!r}: only whole users can be new to the federation"
        )
    users = other_users(dataset.groups, shares, config.holdout_clients, np.random.default_rng([config.seed, 12]))
    out = []
    for j, share in enumerate(users):
        rng = np.random.default_rng([config.seed, 13, j])
        try:
            split = train_test(share, config.test_fraction, rng)
        except DatasetError as exc:
            raise DatasetError(f"held-out user {j}: {exc}") from exc
        out.append(ClientIndices(train=rng.permutation(split.train), test=split.test))
    return tuple(out)


def load_federated(config: DataConfig) -> FederatedData:
    return partition(load_dataset(config), config)
