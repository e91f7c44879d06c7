"""Check an uploaded safetensors file against the manifest before anything is kept.

The body has been streamed to a temporary file. It must satisfy two readers: the protocol's
strict reading of the header (here: JSON as :mod:`server.strict_json` defines it, integers
that are not booleans, no unknown fields, no gaps) and the ``safetensors`` library, the code
that loads stored updates back. Only what both accept goes on, and the server then stores
its own canonical encoding of the checked tensors, never the client's bytes. Nothing is
unpickled. Structural problems answer 400; a well-formed body with the wrong content, 422.
"""

from __future__ import annotations

import math
import re
import struct
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np
from safetensors import SafetensorError, safe_open

from fedper.common.manifest import Manifest
from fedper.common.protocol import ErrorCode, Metadata
from fedper.common.strategy.round_strategy import RoundStrategy
from fedper.server import strict_json
from fedper.server.refusals import MalformedError, UnacceptableError

MAX_HEADER_BYTES = 1 << 20  # a MobileNet or ResNet base needs ~10-20 KiB; parsing more costs memory
DTYPE_SIZES = {
    "BOOL": 1, "U8": 1, "I8": 1, "F8_E4M3": 1, "F8_E5M2": 1, "I16": 2, "U16": 2, "F16": 2,
    "BF16": 2, "I32": 4, "U32": 4, "F32": 4, "F64": 8, "I64": 8, "U64": 8,
}  # fmt: skip
ACCEPTED_DTYPES = ("F32", "F16")
_NUMPY: dict[str, np.dtype[Any]] = {"F32": np.dtype("<f4"), "F16": np.dtype("<f2")}
METRIC_NAME = re.compile(Metadata.METRIC_NAME_PATTERN)
FRACTION_METRIC = re.compile(Metadata.FRACTION_METRIC_PATTERN)
NON_NEGATIVE_METRIC = re.compile(Metadata.NON_NEGATIVE_METRIC_PATTERN)
METRIC_VALUE = re.compile(r"[-+]?([0-9]+\.?[0-9]*|\.[0-9]+)([eE][-+]?[0-9]{1,3})?")
INTEGER = re.compile(r"-?[0-9]{1,18}")
ENTRY_FIELDS = {"dtype", "shape", "data_offsets"}


@dataclass(frozen=True)
class Upload:
    tensors: dict[str, np.ndarray]  # float32, in the manifest's order
    num_samples: int
    base_version: int
    metrics: dict[str, float]
    unclipped: bool | None = None  # under DP: the device's bit (Metadata.UNCLIPPED)

    def metadata(self) -> dict[str, str]:
        """What the stored (canonical) file carries beside the tensors."""
        out = {Metadata.NUM_SAMPLES: str(self.num_samples), Metadata.BASE_VERSION: str(self.base_version)}
        if self.unclipped is not None:
            out[Metadata.UNCLIPPED] = "1" if self.unclipped else "0"
        out.update({f"{Metadata.METRIC_PREFIX}{k}": repr(v) for k, v in self.metrics.items()})
        return out


@dataclass(frozen=True)
class _Entry:
    name: str
    dtype: str
    shape: tuple[int, ...]
    start: int
    end: int


def _malformed(message: str) -> MalformedError:
    return MalformedError(ErrorCode.MALFORMED_SAFETENSORS, message)


def _is_int(value: Any) -> bool:
    return isinstance(value, int) and not isinstance(value, bool)


def read_header(path: Path) -> tuple[list[_Entry], dict[str, str], int]:
    """The tensor entries, metadata and data offset of the file at ``path``, checked as the
    protocol reads them."""
    size = path.stat().st_size
    with path.open("rb") as f:
        prefix = f.read(8)
        if len(prefix) < 8:
            raise _malformed("the body is not a safetensors file (shorter than 8 bytes)")
        (header_len,) = struct.unpack("<Q", prefix)
        if header_len > min(MAX_HEADER_BYTES, size - 8):
            raise _malformed(f"the safetensors header claims {header_len} bytes but the body has {size - 8}")
        raw = f.read(header_len)
    try:
        header = strict_json.loads(raw)
    except strict_json.JsonError as exc:
        raise _malformed(f"the safetensors header is not valid JSON: {exc}") from exc
    if not isinstance(header, dict):
        raise _malformed("the safetensors header must be a JSON object")
    metadata = header.pop("__metadata__", {})
    if not isinstance(metadata, dict) or not all(isinstance(v, str) for v in metadata.values()):
        raise _malformed("__metadata__ must map strings to strings")
    data_len = size - 8 - header_len
    entries = [_entry(name, info, data_len) for name, info in header.items()]
    position = 0
    for entry in sorted(entries, key=lambda e: (e.start, e.end)):
        if entry.start != position:
            what = "overlaps another tensor" if entry.start < position else "leaves a gap before it"
            raise _malformed(f"tensor {entry.name!r} {what}")
        position = entry.end
    if position != data_len:
        raise _malformed(f"the body has {data_len - position} bytes after the last tensor")
    return entries, metadata, 8 + header_len


def _entry(name: str, info: Any, data_len: int) -> _Entry:
    if not isinstance(info, dict):
        raise _malformed(f"tensor {name!r}: the entry is not an object")
    if set(info) != ENTRY_FIELDS:
        raise _malformed(f"tensor {name!r}: the entry must have exactly the fields {sorted(ENTRY_FIELDS)}")
    dtype, shape, offsets = info["dtype"], info["shape"], info["data_offsets"]
    if not isinstance(dtype, str) or dtype not in DTYPE_SIZES:
        raise _malformed(f"tensor {name!r}: unknown dtype {str(dtype)[:32]!r}")
    if not isinstance(shape, list) or len(shape) > 8 or not all(_is_int(d) and d >= 0 for d in shape):
        raise _malformed(f"tensor {name!r}: the shape must be a list of at most 8 non-negative integers")
    if not (
        isinstance(offsets, list)
        and len(offsets) == 2
        and all(_is_int(o) for o in offsets)
        and 0 <= offsets[0] <= offsets[1] <= data_len
    ):
        raise _malformed(
            f"tensor {name!r}: data_offsets must be two non-negative integers within the {data_len}-byte data"
        )
    expected = math.prod(shape) * DTYPE_SIZES[dtype]
    if offsets[1] - offsets[0] != expected:
        raise _malformed(f"tensor {name!r}: {offsets[1] - offsets[0]} bytes do not match shape {shape} x {dtype}")
    return _Entry(name, dtype, tuple(shape), offsets[0], offsets[1])


def _library_view(path: Path) -> tuple[dict[str, tuple[str, tuple[int, ...]]], dict[str, str]]:
    """How the safetensors library (the loader of stored updates) reads the same file."""
    try:
        with safe_open(str(path), framework="numpy") as f:
            layout = {k: (f.get_slice(k).get_dtype(), tuple(f.get_slice(k).get_shape())) for k in f.keys()}  # noqa: SIM118 (safe_open is not iterable)
            return layout, dict(f.metadata() or {})
    except SafetensorError as exc:
        raise _malformed(f"the safetensors library cannot read the body: {exc}") from exc


def validate(
    path: Path,
    manifest: Manifest,
    max_num_samples: int,
    mode: RoundStrategy,
    round_base: Mapping[str, np.ndarray] | None = None,
) -> Upload:
    """The upload in ``path`` as float32 tensors and metadata, or a refusal: 400 for a body that
    is not the protocol's safetensors, then 422 for the wrong content; last, what the round's
    ``mode`` refuses (:meth:`RoundStrategy.refusal`: a non-finite value, a negative BatchNorm
    variance, a distance from ``round_base`` above the bound, a DP delta above the clip: a
    device's clipping is checked, not trusted). Under DP the metadata must carry the device's bit.
    """
    entries, metadata, data_offset = read_header(path)
    library_layout, library_metadata = _library_view(path)
    if library_layout != {e.name: (e.dtype, e.shape) for e in entries} or library_metadata != metadata:
        raise _malformed("the header reads differently to the safetensors library; send a plain safetensors file")
    layout = manifest.layout("base")
    base = dict(layout)
    names = {e.name for e in entries}
    personal = sorted(names & set(manifest.head_names))
    if personal:
        raise UnacceptableError(
            ErrorCode.PERSONAL_TENSOR_IN_UPLOAD,
            f"{len(personal)} personal (head) tensor(s) in the upload, e.g. {personal[0]!r}: "
            "only base tensors leave the device",
        )
    missing, extra = sorted(set(base) - names), sorted(names - set(base))
    if missing:
        raise UnacceptableError(ErrorCode.MISSING_TENSOR, f"missing base tensor(s): {', '.join(missing[:3])}")
    if extra:
        raise UnacceptableError(
            ErrorCode.UNEXPECTED_TENSOR, f"unexpected tensor(s): {', '.join(e[:64] for e in extra[:3])}"
        )
    for e in entries:
        if e.shape != base[e.name]:
            raise UnacceptableError(
                ErrorCode.WRONG_SHAPE, f"tensor {e.name!r} has shape {list(e.shape)}, expected {list(base[e.name])}"
            )
        if e.dtype not in ACCEPTED_DTYPES:
            raise UnacceptableError(ErrorCode.WRONG_DTYPE, f"tensor {e.name!r} is {e.dtype}; send F32 or F16")
    num_samples, base_version, metrics = check_metadata(metadata, max_num_samples)
    unclipped = _unclipped(metadata, mode.device_clip() is not None)
    tensors = _load_tensors(path, {e.name: (e, data_offset + e.start) for e in entries})
    if mode.needs_base() and round_base is None:
        raise ValueError("this round mode measures updates against the round's base: pass it")
    refused = mode.refusal(tensors, round_base or {}, layout)
    if refused is not None:
        raise UnacceptableError(refused.code, refused.message)
    return Upload(tensors, num_samples, base_version, metrics, unclipped)


def _unclipped(metadata: Mapping[str, str], private: bool) -> bool | None:
    """The DP bit: "1" or "0" in a DP round, absent in any other."""
    text = metadata.get(Metadata.UNCLIPPED)
    if not private:
        if text is not None:
            message = f"{Metadata.UNCLIPPED} is only sent in a round whose task has dp"
            raise UnacceptableError(ErrorCode.BAD_METADATA, message)
        return None
    if text not in ("0", "1"):
        raise UnacceptableError(
            ErrorCode.BAD_METADATA,
            f'this round runs DP-FedAvg: {Metadata.UNCLIPPED} must be "1" (the delta was within clip_norm before '
            f'clipping) or "0", got {None if text is None else text[:16]!r}',
        )
    return text == "1"


def _load_tensors(path: Path, located: dict[str, tuple[_Entry, int]]) -> dict[str, np.ndarray]:
    """The data section read once into one buffer (no mapping of the file: peak memory is about
    one body), each tensor a float32 view on it at the offset both readers agreed on."""
    start = min((offset for _, offset in located.values()), default=0)
    end = max((offset + entry.end - entry.start for entry, offset in located.values()), default=0)
    with path.open("rb") as f:
        f.seek(start)
        data = np.fromfile(f, dtype=np.uint8, count=end - start)
    tensors: dict[str, np.ndarray] = {}
    for name, (entry, offset) in located.items():
        raw = data[offset - start : offset - start + entry.end - entry.start].view(_NUMPY[entry.dtype])
        tensors[name] = raw.astype(np.float32, copy=False).reshape(entry.shape)
    return tensors


def check_metadata(metadata: Mapping[str, str], max_num_samples: int) -> tuple[int, int, dict[str, float]]:
    """(num_samples, base_version, metrics) from an update's ``__metadata__``, or a 422."""

    def integer(key: str) -> int | None:
        text = metadata.get(key)
        return int(text) if text is not None and INTEGER.fullmatch(text) else None

    num_samples = integer(Metadata.NUM_SAMPLES)
    if num_samples is None or not 1 <= num_samples <= max_num_samples:
        shown = str(metadata.get(Metadata.NUM_SAMPLES))[:32]
        raise UnacceptableError(
            ErrorCode.NUM_SAMPLES_OUT_OF_RANGE, f"num_samples must be an integer in 1..{max_num_samples}, got {shown!r}"
        )
    base_version = integer(Metadata.BASE_VERSION)
    if base_version is None:
        message = "base_version must be the integer model version you trained from"
        raise UnacceptableError(ErrorCode.BAD_METADATA, message)
    metrics: dict[str, float] = {}
    for key, text in metadata.items():
        if key in (Metadata.NUM_SAMPLES, Metadata.BASE_VERSION, Metadata.UNCLIPPED):
            continue
        if not key.startswith(Metadata.METRIC_PREFIX):
            raise UnacceptableError(ErrorCode.BAD_METADATA, f"metadata key {key[:80]!r} is not allowed")
        name = key[len(Metadata.METRIC_PREFIX) :]
        if not METRIC_NAME.fullmatch(name):
            raise UnacceptableError(ErrorCode.BAD_METADATA, f"metric name {name[:80]!r} must match [a-z0-9_]{{1,64}}")
        if len(text) > 40 or not METRIC_VALUE.fullmatch(text):
            raise UnacceptableError(ErrorCode.BAD_METADATA, f"metric {name!r} is not a decimal number: {text[:40]!r}")
        value = float(text)
        if not abs(value) <= Metadata.MAX_METRIC_ABS:
            raise UnacceptableError(ErrorCode.BAD_METADATA, f"metric {name!r} = {text} is outside [-1e9, 1e9]")
        if FRACTION_METRIC.fullmatch(name) and not 0 <= value <= 1:
            message = f"metric {name!r} = {text} is a fraction: it must be in [0, 1]"
            raise UnacceptableError(ErrorCode.BAD_METADATA, message)
        if NON_NEGATIVE_METRIC.fullmatch(name) and not value >= 0:
            raise UnacceptableError(ErrorCode.BAD_METADATA, f"metric {name!r} = {text} is a loss: it must be >= 0")
        metrics[name] = value
        if len(metrics) > Metadata.MAX_METRICS:
            raise UnacceptableError(ErrorCode.BAD_METADATA, f"at most {Metadata.MAX_METRICS} metrics")
    return num_samples, base_version, metrics
