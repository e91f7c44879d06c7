"""In-memory image datasets: uint8 NHWC images, integer labels, optional owner ids."""

from __future__ import annotations

from dataclasses import dataclass, field

import numpy as np
import torch

from fedper.common.errors import FedperError

# Normalization used for every dataset unless it says otherwise; goes into the manifest.
DEFAULT_MEAN = (0.5, 0.5, 0.5)
DEFAULT_STD = (0.25, 0.25, 0.25)


class DatasetError(FedperError, ValueError):
    """A dataset that cannot be loaded: missing files, wrong format, bad options."""


@dataclass(frozen=True)
class ImageDataset:
    """Images (N, H, W, 3) uint8 and labels (N,) int64.

    ``groups`` names the owner of each sample (a user, for rating datasets); the
    by-user partitioner gives each client one owner's samples.
    """

    name: str
    images: np.ndarray
    labels: np.ndarray
    classes: tuple[str, ...]
    groups: np.ndarray | None = None
    mean: tuple[float, float, float] = DEFAULT_MEAN
    std: tuple[float, float, float] = DEFAULT_STD
    info: dict[str, object] = field(default_factory=dict)
    # What a generator knows of each sample (N, F): what its labels are a function of. The
    # ceiling baselines learn from it; None for real data.
    features: np.ndarray | None = None

    def __post_init__(self) -> None:
        if self.images.ndim != 4 or self.images.shape[-1] != 3 or self.images.dtype != np.uint8:
            raise DatasetError(
                f"{self.name}: images must be uint8 (N, H, W, 3), got {self.images.dtype} {self.images.shape}"
            )
        if self.labels.shape != (len(self.images),):
            raise DatasetError(f"{self.name}: {len(self.images)} images but labels {self.labels.shape}")
        if self.groups is not None and self.groups.shape != self.labels.shape:
            raise DatasetError(f"{self.name}: groups do not match labels")
        if self.features is not None and (self.features.ndim != 2 or len(self.features) != len(self.labels)):
            raise DatasetError(f"{self.name}: features {self.features.shape} do not match {len(self.labels)} labels")
        if len(self.labels) and (self.labels.min() < 0 or self.labels.max() >= len(self.classes)):
            raise DatasetError(f"{self.name}: labels outside 0..{len(self.classes) - 1}")

    def __len__(self) -> int:
        return len(self.labels)

    @property
    def image_size(self) -> int:
        return int(self.images.shape[1])

    @property
    def num_classes(self) -> int:
        return len(self.classes)

    def subset(self, indices: np.ndarray) -> ImageDataset:
        return ImageDataset(
            name=self.name,
            images=self.images[indices],
            labels=self.labels[indices],
            classes=self.classes,
            groups=None if self.groups is None else self.groups[indices],
            mean=self.mean,
            std=self.std,
            info=self.info,
            features=None if self.features is None else self.features[indices],
        )


def to_tensor(images: np.ndarray, mean: tuple[float, ...], std: tuple[float, ...]) -> torch.Tensor:
    """uint8 NHWC -> normalized float32 NCHW, the layout and scaling the manifest declares."""
    x = torch.from_numpy(np.ascontiguousarray(images)).permute(0, 3, 1, 2).float().div_(255.0)
    m = torch.tensor(mean, dtype=torch.float32).view(1, 3, 1, 1)
    s = torch.tensor(std, dtype=torch.float32).view(1, 3, 1, 1)
    return ((x - m) / s).contiguous()


def labelled_tensors(part: ImageDataset, like: ImageDataset) -> tuple[torch.Tensor, torch.Tensor]:
    """A subset's (images, labels) as model inputs, normalized with its whole dataset's statistics."""
    return to_tensor(part.images, like.mean, like.std), torch.from_numpy(part.labels)
