"""CIFAR-10/100 from the official python-pickle batches on a local directory.

The batches are pickles; they are read with an unpickler that only admits the
handful of numpy constructors the official files use, so a tampered file cannot
run code. torchvision's classes are not used: they insist on the official md5s.
"""

from __future__ import annotations

import io
import pickle
from pathlib import Path
from typing import Any

import numpy as np

from fedper.data.dataset import DatasetError, ImageDataset

_ALLOWED_GLOBALS = {
    ("numpy.core.multiarray", "_reconstruct"),
    ("numpy._core.multiarray", "_reconstruct"),
    ("numpy", "ndarray"),
    ("numpy", "dtype"),
    ("numpy.core.multiarray", "scalar"),
    ("numpy._core.multiarray", "scalar"),
    ("_codecs", "encode"),
}

CIFAR10_DIR = "cifar-10-batches-py"
CIFAR10_MEAN, CIFAR10_STD = (0.4914, 0.4822, 0.4465), (0.247, 0.243, 0.261)
CIFAR100_MEAN, CIFAR100_STD = (0.5071, 0.4865, 0.4409), (0.2673, 0.2564, 0.2762)
CIFAR10_CLASSES = (
    "airplane", "automobile", "bird", "cat", "deer", "dog", "frog", "horse", "ship", "truck",
)  # fmt: skip
CIFAR100_DIR = "cifar-100-python"


class _RestrictedUnpickler(pickle.Unpickler):
    def find_class(self, module: str, name: str) -> Any:
        if (module, name) in _ALLOWED_GLOBALS:
            return super().find_class(module, name)
        raise pickle.UnpicklingError(f"refusing to load {module}.{name} from a CIFAR batch")


def read_batch(path: Path) -> dict[str, Any]:
    """One official batch file as a dict with str keys."""
    try:
        raw = path.read_bytes()
    except OSError as exc:
        raise DatasetError(f"cannot read CIFAR batch {path}: {exc.strerror}") from exc
    try:
        obj = _RestrictedUnpickler(io.BytesIO(raw), encoding="latin1").load()
    except Exception as exc:
        raise DatasetError(f"{path} is not a CIFAR python batch: {exc}") from exc
    if not isinstance(obj, dict):
        raise DatasetError(f"{path}: expected a dict, got {type(obj).__name__}")
    return {k.decode() if isinstance(k, bytes) else str(k): v for k, v in obj.items()}


def _images(batch: dict[str, Any], path: Path) -> np.ndarray:
    data = np.asarray(batch.get("data"))
    if data.ndim != 2 or data.shape[1] != 3072 or data.dtype != np.uint8:
        raise DatasetError(f"{path}: 'data' must be uint8 (N, 3072), got {data.dtype} {data.shape}")
    return data.reshape(-1, 3, 32, 32).transpose(0, 2, 3, 1)


def _find(root: Path, subdir: str, names: list[str]) -> Path:
    for candidate in (root / subdir, root):
        if all((candidate / n).is_file() for n in names):
            return candidate
    raise DatasetError(f"no CIFAR files under {root}: expected {', '.join(names)} in {root / subdir} or {root}")


def _decode_names(values: Any) -> tuple[str, ...]:
    return tuple(v.decode() if isinstance(v, bytes) else str(v) for v in values)


def _load(
    root: Path,
    subdir: str,
    batches: list[str],
    meta_file: str,
    keys: tuple[str, str],
    name: str,
    norm: tuple[tuple[float, float, float], tuple[float, float, float]],
) -> ImageDataset:
    label_key, names_key = keys
    folder = _find(Path(root), subdir, [*batches, meta_file])
    images, labels = [], []
    for n in batches:
        batch = read_batch(folder / n)
        images.append(_images(batch, folder / n))
        if label_key not in batch:
            raise DatasetError(f"{folder / n}: no {label_key!r} entry")
        labels.append(np.asarray(batch[label_key], dtype=np.int64))
    meta = read_batch(folder / meta_file)
    return ImageDataset(
        name=name,
        images=np.concatenate(images),
        labels=np.concatenate(labels),
        classes=_decode_names(meta[names_key]),
        mean=norm[0],
        std=norm[1],
    )


def load_cifar10(root: Path) -> ImageDataset:
    """All 60,000 images (train and test batches pooled; clients split their own share)."""
    batches = [f"data_batch_{i}" for i in range(1, 6)] + ["test_batch"]
    return _load(root, CIFAR10_DIR, batches, "batches.meta", ("labels", "label_names"),
                 "cifar10", (CIFAR10_MEAN, CIFAR10_STD))  # fmt: skip


def load_cifar100(root: Path) -> ImageDataset:
    """All 60,000 images with the 100 fine labels."""
    return _load(root, CIFAR100_DIR, ["train", "test"], "meta", ("fine_labels", "fine_label_names"),
                 "cifar100", (CIFAR100_MEAN, CIFAR100_STD))  # fmt: skip
