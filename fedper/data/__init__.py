"""Datasets (real and generated) and the partitioners that make them federated."""

from fedper.data.dataset import DatasetError, ImageDataset, labelled_tensors, to_tensor
from fedper.data.registry import (
    DATASETS,
    PARTITIONS,
    DataConfig,
    DatasetInfo,
    FederatedData,
    dataset_info,
    load_dataset,
    load_federated,
    partition,
)

__all__ = [
    "DATASETS",
    "PARTITIONS",
    "DataConfig",
    "DatasetError",
    "DatasetInfo",
    "FederatedData",
    "ImageDataset",
    "dataset_info",
    "labelled_tensors",
    "load_dataset",
    "load_federated",
    "partition",
    "to_tensor",
]
