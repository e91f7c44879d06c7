"""Aggregation one hostile device cannot ruin: bounded updates, capped weights, robust means.

Sample-weighted FedAvg (:mod:`fedper.common.aggregate`) trusts what a device sends: its tensors and the
number of examples it claims. One device can then move the base anywhere (an update 1e30 away,
or -1000 times the base) or take nearly all the weight (a claimed count of 100,000 against
honest hundreds). Here, before the round's updates are combined, relative to its base:

- each update's delta (update minus base) is scaled down to at most ``clip_factor`` times the
  round's median delta norm: norm bounding (Sun et al., "Can You Really Backdoor Federated
  Learning?", 2019) with a bound that follows the cohort instead of a constant to guess. The
  weights and the BatchNorm running statistics are two groups, each with its own norm and
  bound: the statistics are not gradient steps, and their deltas (a variance going from 1 to
  what the data has) are 5-30x the weights' and vary far more between honest devices;
- each device's weight is at most ``weight_cap`` times the round's median sample count;
- the updates are combined by the weighted mean (``mean``: FedAvg), or coordinate by coordinate
  by the median or the trimmed mean (Yin et al., ICML 2018; Flower's FedMedian and
  FedTrimmedAvg), which weigh every device equally.

The medians are lower medians (of two, the smaller): while fewer than half of a round's updates
are hostile, every bound is set by an honest one. An update that needs neither clipping nor a
cap reaches FedAvg as it came, so a round of honest updates gives the bytes plain FedAvg gives.
Everything is numpy: the server runs it without torch, the simulation runs the same code.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Literal, get_args

import numpy as np

from fedper.common.aggregate import AggregationError, FedAvg
from fedper.common.config_cli import option
from fedper.common.coordinate_clip import SpilledRound, clipped_in_memory
from fedper.common.errors import ConfigError

Aggregate = Literal["mean", "median", "trimmed-mean", "centered-clip"]
ClipBy = Literal["group", "tensor"]
AGGREGATES: tuple[Aggregate, ...] = get_args(Aggregate)
CENTERED: Aggregate = "centered-clip"  # the one that needs the last published step
BATCHNORM_VARIANCE = ".running_var"  # torch's name for a BatchNorm layer's running variance
BATCHNORM_STATISTICS = (".running_mean", BATCHNORM_VARIANCE)
PARAMETERS, STATISTICS = "parameters", "batchnorm_statistics"  # the groups clipped apart
Tensors = Mapping[str, np.ndarray]
Update = tuple[Tensors, int]  # tensors, claimed number of examples


@dataclass(frozen=True)
class AggregationConfig:
    """How a round's base updates become the next base: the server's and the simulation's."""

    aggregate: Aggregate = option(
        "mean",
        "how a round's updates are combined: mean (sample-weighted FedAvg), median or trimmed-mean "
        "(coordinate-wise, every device weighted equally), centered-clip (clipped around the last published step "
        "at --clip-factor times the median distance from it)",
    )
    clip_factor: float = option(
        3.0, "an update's distance from the round's base is scaled down to at most this many times the "
        "round's median distance (0: no clipping)",
    )  # fmt: skip
    weight_cap: float = option(
        3.0, "a device's aggregation weight is at most this many times the round's median num_samples (0: no cap)"
    )
    trim_fraction: float = option(
        0.1, "trimmed-mean: the share of the updates cut from each end of every coordinate (< 0.5)"
    )
    clip_by: ClipBy = option(
        "group", "what --clip-factor bounds: each group's norm (parameters, BatchNorm statistics) or each tensor's"
    )
    coordinate_clip: float = option(
        3.0, "each coordinate of an update is held to the round's median of that coordinate plus or minus this "
        "many median absolute deviations (0: off; the default 3 was chosen by make poisoning: docs/SERVER.md)",
    )  # fmt: skip

    def __post_init__(self) -> None:
        if self.aggregate not in AGGREGATES:
            raise ConfigError(f"--aggregate must be one of {', '.join(AGGREGATES)}, got {self.aggregate!r}")
        if not (self.clip_factor == 0 or 1 <= self.clip_factor < math.inf):
            raise ConfigError(f"--clip-factor must be 0 (off) or a finite number >= 1, got {self.clip_factor}")
        if not (self.weight_cap == 0 or 1 <= self.weight_cap < math.inf):
            raise ConfigError(f"--weight-cap must be 0 (off) or a finite number >= 1, got {self.weight_cap}")
        if not 0 <= self.trim_fraction < 0.5:
            raise ConfigError(f"--trim-fraction must be in [0, 0.5), got {self.trim_fraction}")
        if self.clip_by not in get_args(ClipBy):
            raise ConfigError(f"--clip-by must be group or tensor, got {self.clip_by!r}")
        if not (self.coordinate_clip == 0 or 1 <= self.coordinate_clip < math.inf):
            raise ConfigError(f"--coordinate-clip must be 0 (off) or a finite number >= 1, got {self.coordinate_clip}")
        if self.aggregate == CENTERED and not self.clip_factor:
            raise ConfigError("--aggregate centered-clip clips around the last step by --clip-factor: give one > 0")


@dataclass(frozen=True)
class AggregationReport:
    """What the defences did in one round (logged by the server, kept by the simulation)."""

    aggregate: str
    updates: int
    median_norm: dict[str, float]  # per group (parameters, BatchNorm statistics), before clipping
    largest_norm: dict[str, float]
    norm_bound: dict[str, float] | None  # None: clipping off
    clipped: int  # updates scaled down in at least one group
    weight_limit: int | None  # None: no cap
    capped: int
    largest_weight_share: float  # of the weights used (mean); 1/updates for median, trimmed-mean
    coordinates_clipped: int = 0  # coordinate values held to the round's median +- c MAD, over all updates

    def to_dict(self) -> dict[str, object]:
        return asdict(self)


class NonFiniteAggregateError(AggregationError):
    """The updates were well-formed but their aggregate overflowed: nothing to publish."""


def negative_variance(name: str, values: np.ndarray) -> float | None:
    """The smallest value of a BatchNorm running variance if it is below zero, else None: once
    averaged in, a negative variance makes every device's evaluation NaN, however small the
    update's distance from the base (so it is refused, not clipped)."""
    if name.endswith(BATCHNORM_VARIANCE) and values.size:
        smallest = float(np.min(values))
        if smallest < 0:
            return smallest
    return None


def lower_median(values: Sequence[float]) -> float:
    """The ceil(n/2)-th smallest value: with fewer than half the values hostile, an honest one."""
    if not values:
        raise AggregationError("no updates to aggregate")
    return float(sorted(values)[(len(values) - 1) // 2])


def norm_group(name: str, clip_by: ClipBy = "group") -> str:
    """Which clipping group a base tensor is in: BatchNorm running statistics, or parameters; or,
    clipping by tensor, the tensor itself."""
    if clip_by == "tensor":
        return name
    return STATISTICS if name.endswith(BATCHNORM_STATISTICS) else PARAMETERS


def group_norms(tensors: Tensors, base: Tensors, clip_by: ClipBy = "group") -> dict[str, float]:
    """L2 norm of ``tensors - base`` per group, over the tensors of ``base``, in float64, the same
    bits whatever the order of the mappings (the clipping bound depends on it, and the aggregate
    must depend on the set of updates only): numpy's pairwise sum within a tensor (not BLAS's
    dot, whose rounding may follow the memory alignment), an exact sum across tensors."""
    squared: dict[str, list[float]] = {}
    for name, b in base.items():
        d = np.asarray(tensors[name], dtype=np.float64).ravel() - np.asarray(b, dtype=np.float64).ravel()
        squared.setdefault(norm_group(name, clip_by), []).append(float(np.sum(np.square(d))))
    return {g: math.sqrt(math.fsum(v)) for g, v in sorted(squared.items())}


def delta_norm(tensors: Tensors, base: Tensors) -> float:
    """L2 norm of ``tensors - base`` over every tensor of ``base`` (both groups)."""
    return math.sqrt(math.fsum(n * n for n in group_norms(tensors, base).values()))


def held_bytes(config: AggregationConfig, floats: int, updates: int) -> int:
    """Memory the server's aggregation holds beyond one update (an upper bound): none for the mean
    (folded one update at a time; its coordinate clip spilled to a file), each update in float64
    otherwise."""
    if config.aggregate == "mean":
        return 0
    return updates * floats * 8


def robust_aggregate(
    layout: Sequence[tuple[str, tuple[int, ...]]],
    base: Tensors,
    updates: Callable[[], Iterable[Update]],
    config: AggregationConfig,
    group: int = 8,
    center: Tensors | None = None,
    spill: Path | None = None,
) -> tuple[dict[str, np.ndarray], AggregationReport]:
    """The next base (float32) from the round's ``base`` and its updates, and what was done.

    ``updates()`` is called twice and must yield the same updates in the same order both times
    (the server reads its stored files again rather than keep them in memory; the order fixes
    the float64 sum's rounding). ``group`` is FedAvg's (1: one update in memory at a time).
    ``center``: the last published step (a delta), around which ``centered-clip`` clips (None:
    no step yet, it clips around the base). The median, the trimmed mean and centered clipping
    hold the round's updates in memory; so does the coordinate clip, unless ``spill`` names a
    directory for a temporary file of them (the server's, with ``group=1``: the same bytes).
    """
    fedavg = FedAvg(layout, group=group)  # also checks every update's layout
    norms: list[dict[str, float]] = []
    counts: list[int] = []
    for tensors, num_samples in updates():
        fedavg.check(tensors)
        if num_samples < 1:
            raise AggregationError(f"num_samples must be positive, got {num_samples}")
        norms.append(group_norms(tensors, base, config.clip_by))
        counts.append(int(num_samples))
    if not norms:
        raise AggregationError("no updates to aggregate")
    groups = list(norms[0])
    median = {g: lower_median([n[g] for n in norms]) for g in groups}
    bound = {g: config.clip_factor * median[g] for g in groups} if config.clip_factor else None
    limit = max(1, math.floor(config.weight_cap * lower_median(counts))) if config.weight_cap else None
    weights = [min(n, limit) if limit is not None else n for n in counts]
    centered = config.aggregate == CENTERED
    scales = [{g: bound[g] / n[g] if bound is not None and not centered and n[g] > bound[g] else 1.0 for g in groups}
              for n in norms]  # fmt: skip
    coordinates_clipped = 0
    share = 1.0 / len(norms)
    if config.aggregate == "mean" and not config.coordinate_clip:
        for i, (tensors, _) in enumerate(_same(updates(), len(norms))):
            fedavg.add(_scaled(tensors, base, scales[i], config.clip_by), weights[i])
        result = fedavg.result()
        share = max(weights) / sum(weights)
    elif config.aggregate == "mean" and spill is not None:
        with SpilledRound(layout, base, spill) as spilled:
            for i, (tensors, _) in enumerate(_same(updates(), len(norms))):
                spilled.append(_scaled(tensors, base, scales[i], config.clip_by))
            result, coordinates_clipped = spilled.clipped_mean(weights, config.coordinate_clip)
        share = max(weights) / sum(weights)
    else:
        held = [_scaled(t, base, scales[i], config.clip_by) for i, (t, _) in enumerate(_same(updates(), len(norms)))]
        if config.coordinate_clip:
            held, coordinates_clipped = clipped_in_memory(held, base, config.coordinate_clip)
        if config.aggregate == "mean":
            for tensors, weight in zip(held, weights, strict=True):
                fedavg.add(tensors, weight)
            result = fedavg.result()
            share = max(weights) / sum(weights)
        elif centered:
            result, clipped_around = _centered_clip(layout, base, held, weights, center, config.clip_factor)
            scales = [{g: (0.5 if i in clipped_around else 1.0) for g in groups} for i in range(len(held))]
            share = max(weights) / sum(weights)
        else:
            result = {name: _coordinatewise(config, [u[name] for u in held]) for name, _ in layout}
    for name, arr in result.items():
        if not np.isfinite(arr).all():
            raise NonFiniteAggregateError(f"the aggregate of tensor {name!r} is not finite; the round is not published")
    report = AggregationReport(
        aggregate=config.aggregate, updates=len(norms), median_norm=median,
        largest_norm={g: max(n[g] for n in norms) for g in groups}, norm_bound=bound,
        clipped=sum(min(s.values()) < 1.0 for s in scales), weight_limit=limit,
        capped=sum(w < n for w, n in zip(weights, counts, strict=True)), largest_weight_share=share,
        coordinates_clipped=coordinates_clipped,
    )  # fmt: skip
    return result, report


def _centered_clip(
    layout: Sequence[tuple[str, tuple[int, ...]]],
    base: Tensors,
    held: list[Tensors],
    weights: list[int],
    center: Tensors | None,
    factor: float,
    iterations: int = 3,
) -> tuple[dict[str, np.ndarray], set[int]]:
    """Centered clipping (Karimireddy, He and Jaggi, ICML 2021): starting from the last published
    step v, ``iterations`` times v <- v + weighted mean of clip_tau(delta_i - v), tau ``factor``
    times the round's lower median of ||delta_i - v||; one device moves v by at most its share
    of tau per iteration, whatever it sent. Returns the next base and who was clipped at first."""
    names = [name for name, _ in layout]
    deltas = [{n: np.asarray(u[n], dtype=np.float64) - np.asarray(base[n], dtype=np.float64) for n in names}
              for u in held]  # fmt: skip
    v = {n: (np.asarray(center[n], dtype=np.float64) if center is not None else np.zeros(base[n].shape)) for n in names}

    def distance(d: Mapping[str, np.ndarray]) -> float:
        return math.sqrt(math.fsum(float(np.sum(np.square(d[n] - v[n]))) for n in names))

    tau = factor * lower_median([distance(d) for d in deltas])
    total = float(sum(weights))
    first: set[int] = set()
    for step in range(iterations):
        moved = {n: np.zeros(base[n].shape) for n in names}
        for i, (d, w) in enumerate(zip(deltas, weights, strict=True)):
            length = distance(d)
            scale = min(1.0, tau / length) if length > 0 else 1.0
            if scale < 1.0 and step == 0:
                first.add(i)
            for n in names:
                moved[n] += (w * scale / total) * (d[n] - v[n])
        v = {n: v[n] + moved[n] for n in names}
    return {n: (np.asarray(base[n], dtype=np.float64) + v[n]).astype(np.float32) for n in names}, first


def _same(updates: Iterable[Update], expected: int) -> Iterable[Update]:
    """The second pass, checked to be as long as the first."""
    count = 0
    for update in updates:
        count += 1
        if count > expected:
            break
        yield update
    if count != expected:
        raise AggregationError(f"the updates changed between passes ({expected}, then {count})")


def _scaled(tensors: Tensors, base: Tensors, scales: Mapping[str, float], clip_by: ClipBy = "group") -> Tensors:
    """``base + scale * (tensors - base)`` in float64, with each tensor's group's scale; the
    tensors themselves when no group is scaled."""
    if min(scales.values()) >= 1.0:
        return tensors
    out = {}
    for name, b in base.items():  # every tensor computed alone: the mapping's order does not matter
        scale = scales[norm_group(name, clip_by)]
        if scale >= 1.0:
            out[name] = tensors[name]
            continue
        b64 = np.asarray(b, dtype=np.float64)
        out[name] = b64 + scale * (np.asarray(tensors[name], dtype=np.float64) - b64)
    return out


def _coordinatewise(config: AggregationConfig, values: list[np.ndarray]) -> np.ndarray:
    stacked = np.stack([np.asarray(v, dtype=np.float64) for v in values])
    if config.aggregate == "median":
        return np.median(stacked, axis=0).astype(np.float32)
    k = len(values)
    cut = min(math.floor(config.trim_fraction * k), (k - 1) // 2)
    ordered = np.sort(stacked, axis=0)
    return ordered[cut : k - cut].mean(axis=0).astype(np.float32)
