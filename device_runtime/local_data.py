"""A device's own data: its share of a federated dataset, or the owner's labelled photos."""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

import numpy as np
import torch

from fedper.common.manifest import Manifest
from fedper.data import DataConfig, DatasetError, ImageDataset, load_federated, to_tensor
from fedper.data.imaging import read_photo, resize
from fedper.data.partition import train_test

IMAGE_SUFFIXES = {".jpg", ".jpeg", ".png", ".bmp", ".webp"}


@dataclass(frozen=True)
class LocalData:
    """uint8 images kept as loaded; tensors are made with the manifest's normalization."""

    train: ImageDataset
    test: ImageDataset

    @property
    def num_samples(self) -> int:
        """Distinct training examples (what ``num_samples`` reports)."""
        return len(self.train)

    def tensors(self, manifest: Manifest) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor]:
        size = manifest.model.input_size
        norm = manifest.input.normalization
        mean, std = tuple(norm.mean), tuple(norm.std)

        def prepare(ds: ImageDataset) -> torch.Tensor:
            images = ds.images
            if images.shape[1] != size:
                images = np.stack([resize(img, size) for img in images])
            return to_tensor(images, mean, std)

        return (
            prepare(self.train),
            torch.from_numpy(self.train.labels),
            prepare(self.test),
            torch.from_numpy(self.test.labels),
        )


def share(config: DataConfig, client_id: int) -> LocalData:
    """Client ``client_id``'s share of the dataset, exactly as ``fedper simulate`` deals it."""
    fed = load_federated(config)
    if not 0 <= client_id < len(fed.clients):
        raise DatasetError(f"--client-id must be in 0..{len(fed.clients) - 1}, got {client_id}")
    return LocalData(fed.client_train(client_id), fed.client_test(client_id))


def from_folder(root: Path, labels: list[str], image_size: int, seed: int, test_fraction: float = 0.2) -> LocalData:
    """The owner's photos: ``root/<label>/*.jpg``, labels as the manifest names its classes."""
    root = Path(root)
    images, targets = [], []
    for index, label in enumerate(labels):
        folder = root / label
        if not folder.is_dir():
            continue
        for path in sorted(folder.iterdir()):
            if path.suffix.lower() not in IMAGE_SUFFIXES:
                continue
            images.append(read_photo(path, image_size))
            targets.append(index)
    if len(images) < 3:
        raise DatasetError(
            f"{root} needs labelled images in sub-folders named {', '.join(labels)} (found {len(images)})"
        )
    ds = ImageDataset("own", np.stack(images), np.asarray(targets, dtype=np.int64), tuple(labels))
    split = train_test(np.arange(len(ds)), test_fraction, np.random.default_rng([seed, 11]))
    return LocalData(ds.subset(split.train), ds.subset(split.test))
