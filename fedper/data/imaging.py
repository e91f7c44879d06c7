"""Image conversions shared by the loaders: to RGB uint8, square crop, resize."""

from __future__ import annotations

from pathlib import Path

import numpy as np
from PIL import Image


def to_rgb_uint8(img: np.ndarray) -> np.ndarray:
    """Grayscale, RGBA or float images to (H, W, 3) uint8."""
    arr = np.asarray(img)
    if arr.dtype != np.uint8:
        scale = 255.0 if arr.max(initial=0) <= 1.0 else 1.0
        arr = np.clip(arr.astype(np.float64) * scale, 0, 255).round().astype(np.uint8)
    if arr.ndim == 2:
        arr = np.repeat(arr[:, :, None], 3, axis=2)
    if arr.shape[2] == 4:
        arr = arr[:, :, :3]
    return np.ascontiguousarray(arr)


def center_square(img: np.ndarray) -> np.ndarray:
    h, w = img.shape[:2]
    side = min(h, w)
    top, left = (h - side) // 2, (w - side) // 2
    return img[top : top + side, left : left + side]


def resize(img: np.ndarray, size: int) -> np.ndarray:
    """Resize an (H, W, 3) uint8 image to (size, size, 3) with antialiasing."""
    pil = Image.fromarray(img)
    return np.asarray(pil.resize((size, size), Image.Resampling.BILINEAR, reducing_gap=3.0))


def read_photo(path: Path, size: int, what: str = "image") -> np.ndarray:
    """A photo file as a ``size`` x ``size`` RGB uint8 array (center square), or a DatasetError
    naming the file."""
    from PIL import UnidentifiedImageError

    from fedper.data.dataset import DatasetError

    try:
        with Image.open(path) as im:
            pixels = to_rgb_uint8(np.asarray(im.convert("RGB")))
    except (OSError, UnidentifiedImageError) as exc:
        raise DatasetError(f"cannot read {what} {path}: {exc}") from exc
    return resize(center_square(pixels), size)
