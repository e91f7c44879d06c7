"""The server's half of DP-FedAvg (McMahan et al., ICLR 2018; adaptive clipping: Andrew et
al., NeurIPS 2021), the server's and the simulation's one implementation.

The round's deltas (each upload minus the round's base, each within the round's clip C, which
is checked again here) are summed with equal weights by :class:`fedper.common.aggregate.FedAvg`
in float64; Gaussian noise of std z_delta x C is added to every coordinate of the sum, which is
divided by the *expected* cohort size, not the number that reported: with sample-count weights
or the actual count as the denominator, one device could move the result by more than C over
the expected cohort, and the noise would not cover it. With adaptive clipping the devices' bits
(delta norm within C) are summed as b - 1/2, noised, and move C geometrically toward the
target quantile. BatchNorm running variances that the noise takes below zero are set to zero
(post-processing: it costs no privacy).
"""

from __future__ import annotations

import math
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import asdict, dataclass

import numpy as np

from fedper.common.aggregate import AggregationError, FedAvg
from fedper.common.dp.clipping import deltas, norm
from fedper.common.dp.config import DPConfig
from fedper.common.robust_aggregate import BATCHNORM_VARIANCE, NonFiniteAggregateError

Tensors = Mapping[str, np.ndarray]
Contribution = tuple[Tensors, bool]  # an upload (the clipped trained base) and its unclipped bit


class ClipExceededError(AggregationError):
    """An upload whose delta is longer than the round's clip: the server refuses it at upload."""


@dataclass(frozen=True)
class DPReport:
    """One DP round, as the server logs it and the simulation keeps it."""

    updates: int
    clip: float  # the round's C
    next_clip: float
    expected_cohort: float  # the denominator
    noise_stddev: float  # per coordinate of the sum (z_delta x C); of the mean: / expected_cohort
    unclipped_share: float | None  # the noised estimate adaptive clipping used (None: fixed clip)
    variances_zeroed: int  # BatchNorm running-variance entries the noise took below zero

    def to_dict(self) -> dict[str, object]:
        return asdict(self)


def dp_aggregate(
    layout: Sequence[tuple[str, tuple[int, ...]]],
    base: Tensors,
    uploads: Iterable[Contribution],
    clip: float,
    config: DPConfig,
    expected_cohort: float,
    rng: np.random.Generator,
    group: int = 8,
) -> tuple[dict[str, np.ndarray], DPReport]:
    """The next base (float32): ``base + (sum of deltas + N(0, (z_delta C)^2)) / expected_cohort``;
    and what was done. ``uploads`` may be empty (the base moves by noise alone, as the
    mechanism requires: whether and how many devices took part is what it hides)."""
    if not expected_cohort > 0:
        raise AggregationError(f"the expected cohort must be > 0, got {expected_cohort}")
    names = [name for name, _ in layout]
    fedavg = FedAvg(layout, group=group)
    centred_count = 0.0
    for tensors, unclipped in uploads:
        fedavg.check(tensors)
        delta = deltas(tensors, base, names)
        length = norm(delta, names)
        if not length <= clip:
            raise ClipExceededError(f"an update's delta has L2 norm {length:.6g}, above the round's clip {clip:.6g}")
        fedavg.add(delta, 1)
        centred_count += 0.5 if unclipped else -0.5
    return noised_mean(layout, base, fedavg.weighted_sum(), fedavg.count, centred_count, clip, config,
                       expected_cohort, rng)  # fmt: skip


def noised_mean(
    layout: Sequence[tuple[str, tuple[int, ...]]],
    base: Tensors,
    sums: Mapping[str, np.ndarray],
    count: int,
    centred_count: float,
    clip: float,
    config: DPConfig,
    expected_cohort: float,
    rng: np.random.Generator,
    sensitivity: float | None = None,
) -> tuple[dict[str, np.ndarray], DPReport]:
    """The mechanism on a sum already made (by FedAvg here, or under secure aggregation from the
    unmasked words): ``sums`` of ``count`` deltas, each within ``sensitivity`` (default: the clip)
    of nothing, and the sum of their bits centred (bit - 1/2)."""
    if not expected_cohort > 0:
        raise AggregationError(f"the expected cohort must be > 0, got {expected_cohort}")
    split = config.noise(expected_cohort)
    noise_std = split.delta_multiplier * (clip if sensitivity is None else sensitivity)
    out: dict[str, np.ndarray] = {}
    zeroed = 0
    for name, shape in layout:
        noised = sums[name] + rng.standard_normal(shape) * noise_std if noise_std else sums[name]
        new = np.asarray(base[name], np.float64) + noised / expected_cohort
        if name.endswith(BATCHNORM_VARIANCE):
            zeroed += int(np.count_nonzero(new < 0))
            np.maximum(new, 0.0, out=new)
        out[name] = new.astype(np.float32)
    share: float | None = None
    next_clip = clip
    if config.adaptive:
        noised_count = centred_count + (rng.normal(0.0, split.count_stddev) if split.count_stddev else 0.0)
        share = noised_count / expected_cohort + 0.5
        next_clip = clip * math.exp(-config.dp_clip_learning_rate * (share - config.dp_target_quantile))
    for name, arr in out.items():
        if not np.isfinite(arr).all():
            raise NonFiniteAggregateError(f"the noised aggregate of tensor {name!r} is not finite; not published")
    report = DPReport(count, clip, next_clip, float(expected_cohort), noise_std, share, zeroed)
    return out, report
