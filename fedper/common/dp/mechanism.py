"""The server's half of DP-FedAvg (McMahan et al., ICLR 2018; adaptive clipping: Andrew et
al., NeurIPS 2021), the server's and the simulation's one implementation.

The round's deltas (each upload minus the round's base, each within the round's clip C, which
is checked again here) are summed with equal weights by :class:`fedper.common.aggregate.FedAvg`
in float64; Gaussian noise of std z_delta x C is added to every coordinate of the sum, which is
divided by the *expected* cohort size, not the number that reported: with sample-count weights
or the actual count as the denominator, one device could move the result by more than C over
the expected cohort, and the noise would not cover it. With adaptive clipping the devices' bits
(delta norm within C) are summed as b - 1/2, noised, and move C geometrically toward the
target quantile, within bounds that no honest run reaches (the noised share taken into [-1, 2],
the clip into 2^-20 to 2^20 times the first): a hostile count cannot overflow or zero it.
BatchNorm running variances that the noise takes below zero are set to zero (post-processing: it
costs no privacy).

**The sum is projected** onto the ball of radius B x C before the noise, B the most devices the
sampling the accountant assumes draws (accountant.largest_cohort, but with probability 1e-9):
many devices drawn together (sybils checking in beside the honest ones) cannot move the base by
more than B honest ones could. A projection onto a convex set moves no two points further apart,
so one device still changes the projected sum by at most C: the guarantee and its accounting are
unchanged, and in an honest run (at most B drawn) the projection changes nothing.
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


SHARE_RANGE = (-1.0, 2.0)  # the noised unclipped share adaptive clipping uses, held to this
CLIP_RANGE = 2.0**20  # the clip stays within this factor of the first one, either way


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
    sum_projected: float | None = None  # the sum's L2 norm when it was above B x C and projected

    def to_dict(self) -> dict[str, object]:
        out = asdict(self)
        if self.sum_projected is None:  # an honest run's reports as before the projection existed
            del out["sum_projected"]
        return out


def dp_aggregate(
    layout: Sequence[tuple[str, tuple[int, ...]]],
    base: Tensors,
    uploads: Iterable[Contribution],
    clip: float,
    config: DPConfig,
    expected_cohort: float,
    rng: np.random.Generator,
    group: int = 8,
    max_devices: int | None = None,
) -> tuple[dict[str, np.ndarray], DPReport]:
    """The next base (float32): ``base + (sum of deltas + N(0, (z_delta C)^2)) / expected_cohort``;
    and what was done. ``uploads`` may be empty (the base moves by noise alone, as the
    mechanism requires: whether and how many devices took part is what it hides).
    ``max_devices``: B, the sum is projected onto the ball of radius B x C (None: not)."""
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
                       expected_cohort, rng, max_devices=max_devices)  # fmt: skip


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
    max_devices: int | None = None,
) -> tuple[dict[str, np.ndarray], DPReport]:
    """The mechanism on a sum already made (by FedAvg here, or under secure aggregation from the
    unmasked words): ``sums`` of ``count`` deltas, each within ``sensitivity`` (default: the clip)
    of nothing, and the sum of their bits centred (bit - 1/2); the sum projected onto the ball of
    radius ``max_devices`` x sensitivity first (None: not)."""
    if not expected_cohort > 0:
        raise AggregationError(f"the expected cohort must be > 0, got {expected_cohort}")
    split = config.noise(expected_cohort)
    bound = clip if sensitivity is None else sensitivity
    noise_std = split.delta_multiplier * bound
    projected = None
    if max_devices is not None:
        length = math.sqrt(sum(float(np.sum(np.square(sums[name], dtype=np.float64))) for name, _ in layout))
        if length > max_devices * bound:
            projected, factor = length, max_devices * bound / length
            sums = {name: sums[name] * factor for name, _ in layout}
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
        step = min(max(share, SHARE_RANGE[0]), SHARE_RANGE[1]) - config.dp_target_quantile
        next_clip = clip * math.exp(-config.dp_clip_learning_rate * step)
        next_clip = min(max(next_clip, config.dp_clip / CLIP_RANGE), config.dp_clip * CLIP_RANGE)
    for name, arr in out.items():
        if not np.isfinite(arr).all():
            raise NonFiniteAggregateError(f"the noised aggregate of tensor {name!r} is not finite; not published")
    report = DPReport(count, clip, next_clip, float(expected_cohort), noise_std, share, zeroed, projected)
    return out, report
