"""The DP-FedAvg settings, one home for ``fedper simulate --dp`` and ``fedper serve --dp``."""

from __future__ import annotations

import math
from dataclasses import dataclass

from fedper.common.config_cli import option
from fedper.common.errors import ConfigError

COUNT_STDDEV_PER_DEVICE = 0.05  # TFF's default: the count's noise std is 5% of the expected cohort


@dataclass(frozen=True)
class DPConfig:
    """DP-FedAvg with adaptive clipping (McMahan et al., ICLR 2018; Andrew et al., NeurIPS 2021)."""

    dp: bool = option(
        False, "user-level differential privacy of the base (DP-FedAvg): each device's base delta is clipped to "
        "an L2 norm, the server adds Gaussian noise to their sum (docs/PRIVACY.md)",
    )  # fmt: skip
    dp_noise_multiplier: float = option(
        1.0, "z: the noise's standard deviation over the clip norm (0: no noise, no privacy)"
    )
    dp_clip: float = option(
        1.0, "C: the L2 norm a device's base delta is clipped to (with adaptive clipping, the first round's)"
    )
    dp_clip_learning_rate: float = option(
        0.2, "adaptive clipping's step: C is multiplied by exp(-rate x (unclipped share - target)) each round "
        "(0: the clip stays C)",
    )  # fmt: skip
    dp_target_quantile: float = option(
        0.5, "adaptive clipping: the share of devices whose delta the clip should leave whole"
    )
    dp_count_stddev: float | None = option(
        None, "adaptive clipping: std of the noise on the count of unclipped devices (default: 0.05 x the "
        "expected cohort, as TFF)",
    )  # fmt: skip
    dp_sampling_probability: float = option(
        1.0, "q: each device that checks in is drawn into a round on its own coin of this probability (fedper "
        "serve and demo; fedper simulate draws each client with probability --fraction)",
    )  # fmt: skip
    dp_delta: float | None = option(
        None, "the delta of the (epsilon, delta) guarantee (default: 1/N^1.1 for N devices)"
    )
    target_epsilon: float | None = option(
        None, "stop before the round that would take epsilon above this (default: no limit)"
    )

    def __post_init__(self) -> None:
        if not (0 <= self.dp_noise_multiplier < math.inf):
            raise ConfigError(f"--dp-noise-multiplier must be a finite number >= 0, got {self.dp_noise_multiplier}")
        if not (0 < self.dp_clip < math.inf):
            raise ConfigError(f"--dp-clip must be a finite number > 0, got {self.dp_clip}")
        if not (0 <= self.dp_clip_learning_rate < math.inf):
            raise ConfigError(f"--dp-clip-learning-rate must be a finite number >= 0, got {self.dp_clip_learning_rate}")
        if not 0 < self.dp_target_quantile < 1:
            raise ConfigError(f"--dp-target-quantile must be in (0, 1), got {self.dp_target_quantile}")
        if not 0 < self.dp_sampling_probability <= 1:
            raise ConfigError(f"--dp-sampling-probability must be in (0, 1], got {self.dp_sampling_probability}")
        if self.dp_count_stddev is not None and not (0 < self.dp_count_stddev < math.inf):
            raise ConfigError(f"--dp-count-stddev must be a finite number > 0, got {self.dp_count_stddev}")
        if self.dp_delta is not None and not 0 < self.dp_delta < 1:
            raise ConfigError(f"--dp-delta must be in (0, 1), got {self.dp_delta}")
        if self.target_epsilon is not None and not (0 < self.target_epsilon < math.inf):
            raise ConfigError(f"--target-epsilon must be a finite number > 0, got {self.target_epsilon}")

    def require_mean(self, aggregate: str) -> None:
        """Refuse a robust combination under DP: a median's or trimmed mean's sensitivity to one
        device is not bounded by the clip, so the noise would not cover it."""
        if self.dp and aggregate != "mean":
            raise ConfigError(
                f"--dp noises a sum of clipped deltas; --aggregate {aggregate} has no bounded sensitivity to "
                "noise: leave --aggregate mean"
            )

    @property
    def adaptive(self) -> bool:
        return self.dp_clip_learning_rate > 0

    def delta(self, population: int) -> float:
        """The configured delta, or 1/N^1.1: below 1/N, so that "the mechanism leaks one device's
        data outright with probability delta" cannot cover a whole device of N."""
        if self.dp_delta is not None:
            return self.dp_delta
        if population < 2:
            raise ConfigError(f"a population of {population} device(s) gives no default --dp-delta; give one")
        return float(population**-1.1)

    def noise(self, expected_cohort: float) -> NoiseSplit:
        """How z is split between the deltas' sum and the unclipped count (Andrew et al.,
        Theorem 1): two Gaussian queries with multipliers z_delta and z_count compose to one with
        z^-2 = z_delta^-2 + z_count^-2. The count sums b_i - 1/2 (sensitivity 1/2), so
        z_count = 2 sigma_b. With fixed clipping there is no count and z_delta = z."""
        z = self.dp_noise_multiplier
        if not self.adaptive or z == 0:
            return NoiseSplit(z, 0.0)
        count_std = self.dp_count_stddev or COUNT_STDDEV_PER_DEVICE * expected_cohort
        if 2 * count_std <= z:
            raise ConfigError(
                f"adaptive clipping with --dp-noise-multiplier {z} needs the count's noise std above z/2 = {z / 2:g} "
                f"(it is {count_std:g}{'' if self.dp_count_stddev else ': 0.05 x the expected cohort'}): give a "
                "larger --dp-count-stddev, a larger cohort, or fixed clipping (--dp-clip-learning-rate 0)"
            )
        return NoiseSplit((z**-2 - (2 * count_std) ** -2) ** -0.5, count_std)


@dataclass(frozen=True)
class NoiseSplit:
    """The noise of one round: the deltas' sum gets std ``delta_multiplier`` x C, the centred
    count of unclipped devices std ``count_stddev``."""

    delta_multiplier: float
    count_stddev: float
