"""Named-tensor files (safetensors) with validation against an expected layout."""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from pathlib import Path

import numpy as np
import torch
from safetensors import SafetensorError
from safetensors.numpy import load as st_load_bytes
from safetensors.numpy import save as st_save_bytes

from fedper.atomic_write import atomic_write_bytes

TensorSpec = tuple[str, tuple[int, ...]]


class WeightsError(ValueError):
    """A weights file that does not match what the model expects."""


def to_numpy(tensors: Mapping[str, torch.Tensor | np.ndarray]) -> dict[str, np.ndarray]:
    out: dict[str, np.ndarray] = {}
    for name, t in tensors.items():
        arr = t.detach().cpu().numpy() if isinstance(t, torch.Tensor) else np.asarray(t)
        out[name] = np.ascontiguousarray(arr)
    return out


def to_torch(tensors: Mapping[str, np.ndarray]) -> dict[str, torch.Tensor]:
    return {name: torch.from_numpy(np.array(a, copy=True)) for name, a in tensors.items()}


def encode(
    tensors: Mapping[str, torch.Tensor | np.ndarray],
    metadata: Mapping[str, str] | None = None,
    dtype: np.dtype | type | None = np.float32,
) -> bytes:
    """Serialize named tensors to safetensors bytes (float32 unless told otherwise)."""
    arrays = to_numpy(tensors)
    if dtype is not None:
        arrays = {k: v.astype(dtype, copy=False) for k, v in arrays.items()}
    return bytes(st_save_bytes(arrays, metadata=dict(metadata) if metadata else None))


def save(
    path: Path,
    tensors: Mapping[str, torch.Tensor | np.ndarray],
    metadata: Mapping[str, str] | None = None,
) -> None:
    """Write a safetensors file atomically."""
    atomic_write_bytes(Path(path), encode(tensors, metadata))


def load(path: Path) -> dict[str, np.ndarray]:
    """Read every tensor of a safetensors file, with the file named in any error."""
    path = Path(path)
    try:
        data = path.read_bytes()
    except OSError as exc:
        raise WeightsError(f"cannot read weights file {path}: {exc.strerror}") from exc
    try:
        return dict(st_load_bytes(data))
    except (SafetensorError, ValueError) as exc:
        raise WeightsError(f"{path} is not a valid safetensors file: {exc}") from exc


def check_layout(
    tensors: Mapping[str, np.ndarray],
    expected: Sequence[TensorSpec],
    source: str,
    allow_extra: bool = False,
) -> None:
    """Raise a WeightsError naming the file and tensor when names or shapes differ."""
    want = dict(expected)
    missing = [n for n in want if n not in tensors]
    if missing:
        raise WeightsError(
            f"{source}: missing {len(missing)} tensor(s): {', '.join(missing[:5])}"
            + (" ..." if len(missing) > 5 else "")
        )
    if not allow_extra:
        extra = [n for n in tensors if n not in want]
        if extra:
            raise WeightsError(
                f"{source}: unexpected tensor(s) {', '.join(extra[:5])}" + (" ..." if len(extra) > 5 else "")
            )
    for name, shape in want.items():
        got = tuple(tensors[name].shape)
        if got != tuple(shape):
            raise WeightsError(f"{source}: tensor {name!r} has shape {list(got)}, expected {list(shape)}")
        if not np.issubdtype(tensors[name].dtype, np.floating):
            raise WeightsError(f"{source}: tensor {name!r} has dtype {tensors[name].dtype}, expected a float")
        if not np.isfinite(tensors[name]).all():
            raise WeightsError(f"{source}: tensor {name!r} contains NaN or Inf")


def load_checked(
    paths: Sequence[Path], expected: Sequence[TensorSpec], allow_partial: bool = False
) -> dict[str, np.ndarray]:
    """Merge several weight files (e.g. a server base plus a device head) and check them.

    A name present in two files is an error: it would be ambiguous which one wins.
    """
    merged: dict[str, np.ndarray] = {}
    origin: dict[str, Path] = {}
    want = {n for n, _ in expected}
    for path in paths:
        for name, arr in load(path).items():
            if name in merged:
                raise WeightsError(f"tensor {name!r} appears in both {origin[name]} and {path}")
            if name not in want:
                raise WeightsError(f"{path}: unexpected tensor {name!r} (not part of this model)")
            merged[name] = arr
            origin[name] = Path(path)
    source = " + ".join(str(p) for p in paths)
    if allow_partial:
        expected = [(n, s) for n, s in expected if n in merged]
    check_layout(merged, expected, source)
    return {n: merged[n].astype(np.float32, copy=False) for n, _ in expected}
