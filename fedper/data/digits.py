"""scikit-learn's bundled handwritten digits (real scans, 1,797 images), as 32x32 RGB."""

from __future__ import annotations

import numpy as np
from sklearn.datasets import load_digits

from fedper.data.dataset import ImageDataset
from fedper.data.imaging import resize, to_rgb_uint8

MEAN = (0.25, 0.25, 0.25)
STD = (0.35, 0.35, 0.35)
CLASSES = tuple(str(i) for i in range(10))


def load(image_size: int = 32) -> ImageDataset:
    raw = load_digits()
    pixels = (raw.images / 16.0 * 255.0).round().astype(np.uint8)  # 0..16 ink levels
    images = np.stack([resize(to_rgb_uint8(p), image_size) for p in pixels])
    return ImageDataset(
        name="digits",
        images=images,
        labels=raw.target.astype(np.int64),
        classes=CLASSES,
        mean=MEAN,
        std=STD,
    )
