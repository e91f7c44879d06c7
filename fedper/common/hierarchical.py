"""Hierarchical FedAvg: regional aggregators each sum their own devices' updates and forward one
(weighted sum, total weight) per region; the root adds the regions' sums and divides once.

FedAvg is a weighted mean, so the root's result is the flat mean up to the order of its float64
additions. To make it reproducible (the same updates give the same bytes, whichever aggregator
took which upload), both the grouping and the orders are fixed:

- a device belongs to region ``region_of(device_id, regions)``: the first 8 bytes of the
  sha256 of its id, big-endian, modulo the number of regions;
- a region sums its devices' updates with :class:`fedper.common.aggregate.FedAvg` (the one
  FedAvg), one at a time, in ascending sha256 of each update's canonical file, as the server
  orders a flat round (``server/closing.py``);
- the root adds the regions' float64 sums in ascending region number, then divides by the total
  weight and rounds to float32 once, as :meth:`FedAvg.result` does.

What composes with it (docs/SCALING.md, "Hierarchical aggregation"): norm bounds and DP clipping
are per device, so a region applies them; DP noise is added once, at the root, to the sum of the
regions' clipped sums; a secure round runs per region, whose unmasked sum is its forwarded sum.
Order statistics (median, trimmed mean, Krum) need every update in one place and do not.

A forwarded sum is safetensors bytes (:func:`encode`): the base's tensors in float64 and the
metadata ``sum_region``, ``sum_weight`` (the sum of the region's ``num_samples``; under DP-FedAvg every
weight is 1), ``sum_count``, ``base_version`` (the model version the region's devices trained) and
under DP ``dp_unclipped`` (how many deltas were within the clip); docs/PROTOCOL.md, "Regional
aggregation", specifies it to the byte.
"""

from __future__ import annotations

import hashlib
import re
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass

import numpy as np

from fedper.common import weights
from fedper.common.aggregate import AggregationError, FedAvg
from fedper.common.protocol import Metadata

Layout = Sequence[tuple[str, tuple[int, ...]]]
INTEGER = re.compile(r"[0-9]{1,15}")  # no sign, no spaces, no exponent: one spelling per number


def region_of(device_id: str, regions: int) -> int:
    """The region of ``device_id`` among ``regions`` (a fixed rule: no table to keep in sync)."""
    if regions < 1:
        raise ValueError(f"regions must be at least 1, got {regions}")
    return int.from_bytes(hashlib.sha256(device_id.encode()).digest()[:8], "big") % regions


@dataclass(frozen=True)
class RegionalSum:
    """What a region forwards: sum_i n_i * w_i over its devices (float64), sum_i n_i, how many,
    and the version they trained."""

    region: int
    weighted_sum: dict[str, np.ndarray]
    weight: int
    count: int
    base_version: int = 0
    unclipped: int | None = None  # under DP-FedAvg: how many of the deltas were within the clip


def regional_sum(
    layout: Layout, region: int, updates: Iterable[tuple[Mapping[str, np.ndarray], int]], base_version: int = 0
) -> RegionalSum:
    """Region ``region``'s sum of ``updates`` ((tensors, num_samples), in the canonical order)."""
    fedavg = FedAvg(layout, group=1)  # one at a time: a strictly sequential float64 sum
    for tensors, num_samples in updates:
        fedavg.add(tensors, num_samples)
    if fedavg.count == 0:
        raise AggregationError(f"region {region} has no updates to forward")
    summed = {name: array.copy() for name, array in fedavg.weighted_sum().items()}
    return RegionalSum(region, summed, fedavg.total_samples, fedavg.count, base_version)


def combine(layout: Layout, sums: Iterable[RegionalSum]) -> dict[str, np.ndarray]:
    """The root: the regions' sums added in ascending region number, divided by the total weight
    and rounded to float32 once."""
    ordered = sorted(sums, key=lambda s: s.region)
    if not ordered:
        raise AggregationError("no region forwarded a sum")
    if len({s.region for s in ordered}) != len(ordered):
        raise AggregationError("a region forwarded two sums")
    total = float(sum(s.weight for s in ordered))
    out: dict[str, np.ndarray] = {}
    for name, shape in layout:
        acc = np.zeros(shape, dtype=np.float64)
        for s in ordered:
            np.add(acc, s.weighted_sum[name], out=acc)
        mean = np.empty(shape, dtype=np.float32)
        np.divide(acc, total, out=mean, casting="same_kind")
        out[name] = mean
    return out


def encode(summed: RegionalSum) -> bytes:
    """A region's sum as the bytes it forwards."""
    metadata = {Metadata.REGION: str(summed.region), Metadata.WEIGHT: str(summed.weight),
                Metadata.COUNT: str(summed.count), Metadata.BASE_VERSION: str(summed.base_version)}  # fmt: skip
    if summed.unclipped is not None:
        metadata[Metadata.UNCLIPPED] = str(summed.unclipped)
    return weights.encode(summed.weighted_sum, metadata, dtype=np.float64)


def decode(data: bytes, layout: Layout, source: str = "a regional sum") -> RegionalSum:
    """The bytes a region forwarded, checked against ``layout`` (float64, finite, every tensor);
    WeightsError with the reason, :class:`MalformedSumError` when they are not safetensors."""
    try:
        tensors = weights.decode(data, source)
    except weights.WeightsError as exc:
        raise MalformedSumError(str(exc)) from exc
    weights.check_layout(tensors, list(layout), source)
    for name, array in tensors.items():
        if array.dtype != np.float64:
            raise weights.WeightsError(f"{source}: tensor {name!r} is {array.dtype}, a regional sum is float64")
    metadata = weights.metadata_of(data, source)
    keys = (Metadata.REGION, Metadata.WEIGHT, Metadata.COUNT, Metadata.BASE_VERSION)
    unknown = sorted(set(metadata) - {*keys, Metadata.UNCLIPPED})
    if unknown:
        raise weights.WeightsError(f"{source}: metadata key {unknown[0]!r} is not a regional sum's")
    if any(not INTEGER.fullmatch(metadata.get(key, "")) for key in keys):
        raise weights.WeightsError(f"{source}: metadata needs {', '.join(keys)} as decimal integers")
    region, weight, count, base_version = (int(metadata[key]) for key in keys)
    if weight < 1 or count < 1 or count > weight:
        raise weights.WeightsError(f"{source}: weight and count must be >= 1, count at most weight")
    unclipped = None
    if Metadata.UNCLIPPED in metadata:
        if not INTEGER.fullmatch(metadata[Metadata.UNCLIPPED]) or int(metadata[Metadata.UNCLIPPED]) > count:
            raise weights.WeightsError(f"{source}: {Metadata.UNCLIPPED} must be decimal digits, at most count")
        unclipped = int(metadata[Metadata.UNCLIPPED])
    return RegionalSum(region, tensors, weight, count, base_version, unclipped)


class MalformedSumError(weights.WeightsError):
    """The bytes are not safetensors at all (not a sum with the wrong content)."""
