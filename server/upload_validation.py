"""Parse and check an uploaded safetensors body against the manifest, before anything is stored.

A hand-written parser (the format is small): every length and offset is bounds-checked,
nothing is unpickled, and the tensors come back as numpy views on the body bytes.
Structural problems answer 400; a well-formed body with the wrong content answers 422.
"""

from __future__ import annotations

import json
import math
import re
import struct
from dataclasses import dataclass

import numpy as np

from fedper.manifest import Manifest
from server.errors import ProtocolError, bad_request, unprocessable

MAX_HEADER_BYTES = 16 << 20
DTYPE_SIZES = {
    "BOOL": 1, "U8": 1, "I8": 1, "F8_E4M3": 1, "F8_E5M2": 1, "I16": 2, "U16": 2, "F16": 2,
    "BF16": 2, "I32": 4, "U32": 4, "F32": 4, "F64": 8, "I64": 8, "U64": 8,
}  # fmt: skip
ACCEPTED_DTYPES = {"F32": np.dtype("<f4"), "F16": np.dtype("<f2")}
METRIC_NAME = re.compile(r"[a-z0-9_]{1,64}")
MAX_METRICS = 16


@dataclass(frozen=True)
class Upload:
    tensors: dict[str, np.ndarray]
    num_samples: int
    base_version: int
    metrics: dict[str, float]


@dataclass(frozen=True)
class _Entry:
    name: str
    dtype: str
    shape: tuple[int, ...]
    start: int
    end: int


def parse(body: bytes) -> tuple[list[_Entry], dict[str, str], int]:
    """(entries, metadata, data offset) or a 400 naming what is wrong."""
    if len(body) < 8:
        raise bad_request("malformed_safetensors", "the body is not a safetensors file (too short)")
    (header_len,) = struct.unpack("<Q", body[:8])
    if header_len > MAX_HEADER_BYTES or 8 + header_len > len(body):
        raise bad_request(
            "malformed_safetensors",
            f"the safetensors header claims {header_len} bytes but the body has {len(body) - 8}",
        )
    try:
        header = json.loads(body[8 : 8 + header_len].decode("utf-8"))
    except (UnicodeDecodeError, json.JSONDecodeError) as exc:
        raise bad_request("malformed_safetensors", f"the safetensors header is not JSON: {exc}") from exc
    if not isinstance(header, dict):
        raise bad_request("malformed_safetensors", "the safetensors header must be a JSON object")
    metadata = header.pop("__metadata__", {}) or {}
    if not isinstance(metadata, dict) or not all(
        isinstance(k, str) and isinstance(v, str) for k, v in metadata.items()
    ):
        raise bad_request("malformed_safetensors", "__metadata__ must map strings to strings")
    data_offset = 8 + header_len
    data_len = len(body) - data_offset
    entries = []
    for name, info in header.items():
        if not isinstance(info, dict):
            raise bad_request("malformed_safetensors", f"tensor {name!r}: entry is not an object")
        dtype, shape, offsets = info.get("dtype"), info.get("shape"), info.get("data_offsets")
        if not isinstance(dtype, str) or dtype not in DTYPE_SIZES:
            raise bad_request("malformed_safetensors", f"tensor {name!r}: unknown dtype {dtype!r}")
        if not isinstance(shape, list) or not all(isinstance(d, int) and d >= 0 for d in shape):
            raise bad_request("malformed_safetensors", f"tensor {name!r}: bad shape {shape!r}")
        if (
            not isinstance(offsets, list)
            or len(offsets) != 2
            or not all(isinstance(o, int) for o in offsets)
            or not 0 <= offsets[0] <= offsets[1] <= data_len
        ):
            raise bad_request(
                "malformed_safetensors",
                f"tensor {name!r}: data offsets {offsets!r} fall outside the {data_len}-byte body",
            )
        expected = math.prod(shape) * DTYPE_SIZES[dtype]
        if offsets[1] - offsets[0] != expected:
            raise bad_request(
                "malformed_safetensors",
                f"tensor {name!r}: {offsets[1] - offsets[0]} bytes do not match shape {shape} x {dtype}",
            )
        entries.append(_Entry(name, dtype, tuple(shape), offsets[0], offsets[1]))
    position = 0
    for entry in sorted(entries, key=lambda e: (e.start, e.end)):
        if entry.start != position:
            what = "overlaps another tensor" if entry.start < position else "leaves a gap"
            raise bad_request("malformed_safetensors", f"tensor {entry.name!r} {what}")
        position = entry.end
    if position != data_len:
        raise bad_request("malformed_safetensors", "the body has bytes after the last tensor")
    return entries, metadata, data_offset


def validate(body: bytes, manifest: Manifest, max_num_samples: int) -> Upload:
    """The upload as tensors and metadata, or a ProtocolError (400, then 422)."""
    entries, metadata, data_offset = parse(body)
    base = dict(manifest.layout("base"))
    head = set(manifest.head_names)
    names = {e.name for e in entries}
    personal = sorted(names & head)
    if personal:
        raise unprocessable(
            "personal_tensor_in_upload",
            f"{len(personal)} personal (head) tensor(s) in the upload, e.g. {personal[0]!r}: "
            "only base tensors leave the device",
        )
    missing, extra = sorted(set(base) - names), sorted(names - set(base))
    if missing:
        raise unprocessable("missing_tensor", f"missing base tensor(s): {', '.join(missing[:3])}")
    if extra:
        raise unprocessable("unexpected_tensor", f"unexpected tensor(s): {', '.join(extra[:3])}")
    tensors: dict[str, np.ndarray] = {}
    for e in entries:
        if e.shape != base[e.name]:
            raise unprocessable(
                "wrong_shape",
                f"tensor {e.name!r} has shape {list(e.shape)}, expected {list(base[e.name])}",
            )
        if e.dtype not in ACCEPTED_DTYPES:
            raise unprocessable("wrong_dtype", f"tensor {e.name!r} is {e.dtype}; send F32 or F16")
        arr = np.frombuffer(
            body,
            dtype=ACCEPTED_DTYPES[e.dtype],  # type: ignore[call-overload]
            count=math.prod(e.shape),
            offset=data_offset + e.start,
        ).reshape(e.shape)
        if not np.isfinite(arr).all():
            raise unprocessable("non_finite", f"tensor {e.name!r} contains NaN or Inf")
        tensors[e.name] = arr
    num_samples, base_version, metrics = _metadata(metadata, max_num_samples)
    return Upload(tensors, num_samples, base_version, metrics)


def _metadata(metadata: dict[str, str], max_num_samples: int) -> tuple[int, int, dict[str, float]]:
    def integer(key: str) -> int | None:
        text = metadata.get(key)
        if text is None or not re.fullmatch(r"-?[0-9]{1,18}", text.strip()):
            return None
        return int(text)

    num_samples = integer("num_samples")
    if num_samples is None or not 1 <= num_samples <= max_num_samples:
        raise unprocessable(
            "num_samples_out_of_range",
            f"num_samples must be an integer in 1..{max_num_samples}, got {metadata.get('num_samples')!r}",
        )
    base_version = integer("base_version")
    if base_version is None:
        raise unprocessable("bad_metadata", "base_version must be the integer model version you trained from")
    metrics: dict[str, float] = {}
    for key, text in metadata.items():
        if key in ("num_samples", "base_version"):
            continue
        if not key.startswith("metric."):
            raise unprocessable("bad_metadata", f"metadata key {key!r} is not allowed")
        name = key[len("metric.") :]
        if not METRIC_NAME.fullmatch(name):
            raise unprocessable("bad_metadata", f"metric name {name!r} must match [a-z0-9_]{{1,64}}")
        try:
            value = float(text)
        except ValueError as exc:
            raise unprocessable("bad_metadata", f"metric {name!r} is not a number: {text!r}") from exc
        if not math.isfinite(value):
            raise unprocessable("bad_metadata", f"metric {name!r} is not finite")
        metrics[name] = value
    if len(metrics) > MAX_METRICS:
        raise unprocessable("bad_metadata", f"at most {MAX_METRICS} metrics, got {len(metrics)}")
    return num_samples, base_version, metrics


__all__ = ["ProtocolError", "Upload", "parse", "validate"]
