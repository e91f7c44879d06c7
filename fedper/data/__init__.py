"""Datasets (real and generated) and the partitioners that make them federated."""

from fedper.data.dataset import DatasetError, ImageDataset, to_tensor
from fedper.data.registry import (
    DATASETS,
    PARTITIONS,
    DataConfig,
    FederatedData,
    load_dataset,
    load_federated,
    partition,
)

__all__ = [
    "DATASETS",
    "PARTITIONS",
    "DataConfig",
    "DatasetError",
    "FederatedData",
    "ImageDataset",
    "load_dataset",
    "load_federated",
    "partition",
    "to_tensor",
]
