"""Named-tensor files (safetensors) with validation against an expected layout.

Torch-free (the aggregation server runs without torch): a torch tensor given to it is read
through :class:`HostTensor`, and ``fedper.trainer.to_torch`` turns arrays back into tensors.
"""

from __future__ import annotations

import io
import json
import struct
import sys
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import BinaryIO, Protocol, TypeGuard

import numpy as np
from safetensors import SafetensorError
from safetensors.numpy import load as st_load_bytes

from fedper.common.atomic_write import atomic_writer
from fedper.common.errors import FedperError

TensorSpec = tuple[str, tuple[int, ...]]

# numpy dtype -> safetensors dtype, in the order the library lays tensors out (it sorts by
# its dtype enum, largest first, then by name).
_DTYPES = {
    "uint64": "U64",
    "int64": "I64",
    "float64": "F64",
    "complex64": "C64",
    "float32": "F32",
    "uint32": "U32",
    "int32": "I32",
    "float16": "F16",
    "uint16": "U16",
    "int16": "I16",
    "int8": "I8",
    "uint8": "U8",
    "bool": "BOOL",
}
_RANK = {name: rank for rank, name in enumerate(_DTYPES)}
_METADATA_KEY = "__metadata__"


class WeightsError(FedperError, ValueError):
    """A weights file that does not match what the model expects."""


class HostTensor(Protocol):
    """A torch tensor, as this module sees one without importing torch."""

    def detach(self) -> HostTensor: ...

    def cpu(self) -> HostTensor: ...

    def numpy(self) -> np.ndarray: ...


Tensors = Mapping[str, HostTensor] | Mapping[str, np.ndarray] | Mapping[str, HostTensor | np.ndarray]


def _is_torch(t: object) -> TypeGuard[HostTensor]:
    """A torch tensor can only exist if torch was imported, so this never imports it."""
    module = sys.modules.get("torch")
    return module is not None and isinstance(t, module.Tensor)


def to_numpy(tensors: Tensors) -> dict[str, np.ndarray]:
    out: dict[str, np.ndarray] = {}
    for name, t in tensors.items():
        out[name] = _contiguous(t.detach().cpu().numpy() if _is_torch(t) else np.asarray(t))
    return out


def _contiguous(arr: np.ndarray) -> np.ndarray:
    """``arr`` itself when C-contiguous, else a copy (np.ascontiguousarray would turn a scalar into shape (1,))."""
    return arr if arr.flags.c_contiguous else np.ascontiguousarray(arr)


def _layout(tensors: Mapping[str, np.ndarray]) -> list[str]:
    """The library's tensor order: by dtype (largest first), then by name."""
    for name, arr in tensors.items():
        if arr.dtype.name not in _DTYPES:
            raise ValueError(f"tensor {name!r}: dtype {arr.dtype} cannot be stored in safetensors")
        if name == _METADATA_KEY:
            raise ValueError(f"{_METADATA_KEY!r} cannot name a tensor")
    return sorted(tensors, key=lambda name: (_RANK[tensors[name].dtype.name], name))


def _header(tensors: Mapping[str, np.ndarray], order: list[str], metadata: Mapping[str, str] | None) -> bytes:
    """Length prefix and JSON header, byte for byte as the library writes them."""
    header: dict[str, object] = {}
    if metadata is not None:
        if not all(isinstance(k, str) and isinstance(v, str) for k, v in metadata.items()):
            raise ValueError("safetensors metadata keys and values must be strings")
        header[_METADATA_KEY] = dict(metadata)
    offset = 0
    for name in order:
        arr = tensors[name]
        header[name] = {
            "dtype": _DTYPES[arr.dtype.name],
            "shape": list(arr.shape),
            "data_offsets": [offset, offset + arr.nbytes],
        }
        offset += arr.nbytes
    text = json.dumps(header, ensure_ascii=False, separators=(",", ":")).encode("utf-8")
    text += b" " * (-len(text) % 8)  # the library pads the header to a multiple of 8 with spaces
    return len(text).to_bytes(8, "little") + text


def write_to(f: BinaryIO, tensors: Mapping[str, np.ndarray], metadata: Mapping[str, str] | None = None) -> int:
    """Write a safetensors file to ``f`` tensor by tensor; returns the number of bytes written.

    Byte-identical to ``safetensors.numpy.save(tensors, metadata)``, except that several
    metadata keys keep the mapping's order (the library's hash map varies it from run to run)
    and that no tensors with ``{}`` metadata give a valid header (safetensors 0.8 writes one
    it cannot load).
    The library's ``save`` copies every tensor into one bytes object first, doubling peak memory
    for a server holding many uploads in flight; the header is small, so we write it ourselves
    and then each tensor's own buffer, copying only a non-contiguous or big-endian tensor.
    """
    order = _layout(tensors)
    written = _write_all(f, memoryview(_header(tensors, order, metadata)))
    for name in order:
        arr = _contiguous(np.asarray(tensors[name]))
        if arr.dtype.byteorder == ">" or (arr.dtype.byteorder == "=" and sys.byteorder == "big"):
            arr = arr.astype(arr.dtype.newbyteorder("<"))
        written += _write_all(f, arr.reshape(-1).view(np.uint8).data)
    return written


def _write_all(f: BinaryIO, data: memoryview) -> int:
    """An unbuffered file may take only part of a large write."""
    done = 0
    while done < len(data):
        done += f.write(data[done:])
    return done


def _as_arrays(tensors: Tensors, dtype: np.dtype | type | None) -> dict[str, np.ndarray]:
    arrays = to_numpy(tensors)
    if dtype is not None:
        arrays = {k: v.astype(dtype, copy=False) for k, v in arrays.items()}
    return arrays


def encode(
    tensors: Tensors,
    metadata: Mapping[str, str] | None = None,
    dtype: np.dtype | type | None = np.float32,
) -> bytes:
    """Serialize named tensors to safetensors bytes (float32 unless told otherwise)."""
    buffer = io.BytesIO()
    write_to(buffer, _as_arrays(tensors, dtype), metadata or None)
    return buffer.getvalue()


def save(
    path: Path,
    tensors: Tensors,
    metadata: Mapping[str, str] | None = None,
) -> None:
    """Write a float32 safetensors file atomically, streaming it (no second copy in memory)."""
    with atomic_writer(Path(path)) as f:
        write_float32(f, tensors, metadata)


def write_float32(f: BinaryIO, tensors: Tensors, metadata: Mapping[str, str] | None = None) -> int:
    """:func:`write_to` of the tensors in float32: streamed to ``f``, not built in memory first."""
    return write_to(f, _as_arrays(tensors, np.float32), metadata or None)


def load(path: Path) -> dict[str, np.ndarray]:
    """Read every tensor of a safetensors file, with the file named in any error."""
    path = Path(path)
    try:
        data = path.read_bytes()
    except OSError as exc:
        raise WeightsError(f"cannot read weights file {path}: {exc.strerror}") from exc
    return decode(data, str(path))


def decode(data: bytes, source: str) -> dict[str, np.ndarray]:
    """Every tensor of safetensors bytes; ``source`` names them in any error."""
    try:
        return dict(st_load_bytes(data))
    except (SafetensorError, ValueError) as exc:
        raise WeightsError(f"{source} is not a valid safetensors file: {exc}") from exc


def metadata_of(data: bytes, source: str) -> dict[str, str]:
    """The ``__metadata__`` of safetensors bytes (strings to strings); ``source`` names them in any error."""
    try:
        (length,) = struct.unpack("<Q", data[:8])
        header = json.loads(data[8 : 8 + length])
    except (struct.error, ValueError) as exc:
        raise WeightsError(f"{source} has no readable safetensors header: {exc}") from exc
    found = header.get(_METADATA_KEY, {}) if isinstance(header, dict) else None
    if not isinstance(found, dict) or not all(isinstance(k, str) and isinstance(v, str) for k, v in found.items()):
        raise WeightsError(f"{source}: {_METADATA_KEY} must map strings to strings")
    return dict(found)


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
