"""The secure aggregation settings, one home for ``fedper serve --secagg`` and the demo."""

from __future__ import annotations

import math
from dataclasses import dataclass

from fedper.common.config_cli import option
from fedper.common.errors import ConfigError
from fedper.common.secagg.fixed_point import MODULUS
from fedper.common.secagg.graph import check_threshold, default_neighbours, default_threshold


@dataclass(frozen=True)
class SecAggConfig:
    """SecAgg+ (docs/SECAGG.md): the server learns only the sum of a round's base updates."""

    secagg: bool = option(
        False, "secure aggregation (SecAgg+): devices mask their base updates so that the server learns only "
        "their sum (docs/SECAGG.md)",
    )  # fmt: skip
    secagg_neighbours: int = option(
        0, "k: the devices each device shares its secrets with (0: 2 ceil(log2 n) for a cohort of n; n - 1 or "
        "more: every other device, the 2017 protocol)",
    )  # fmt: skip
    secagg_threshold: int = option(
        0, "t: the shares that put a device's secret together; more than half of k (0: floor(k/2) + 1)"
    )
    secagg_clip: float = option(
        1.0, "the L2 norm each device's base delta is clipped to before it is encoded (with --dp: --dp-clip's)"
    )
    secagg_weight_cap: int = option(
        1000, "a device's FedAvg weight is min(num_samples, this): what keeps the encoded sum from overflowing"
    )
    secagg_stage_timeout: float = option(
        30.0, "seconds each of the key, share and unmasking stages waits for the devices"
    )

    def __post_init__(self) -> None:
        if self.secagg_neighbours < 0 or self.secagg_threshold < 0:
            raise ConfigError("--secagg-neighbours and --secagg-threshold must be >= 0 (0: their defaults)")
        if not (0 < self.secagg_clip < math.inf):
            raise ConfigError(f"--secagg-clip must be a finite number > 0, got {self.secagg_clip}")
        if self.secagg_weight_cap < 1:
            raise ConfigError(f"--secagg-weight-cap must be >= 1, got {self.secagg_weight_cap}")
        if not (0 < self.secagg_stage_timeout < math.inf):
            raise ConfigError(f"--secagg-stage-timeout must be > 0, got {self.secagg_stage_timeout}")

    def neighbours(self, cohort: int) -> int:
        """k for a cohort of ``cohort`` devices (at most cohort - 1; even unless everyone)."""
        if cohort < 2:
            return 0
        k = self.secagg_neighbours or default_neighbours(cohort)
        return cohort - 1 if k >= cohort - 1 else k + k % 2

    def threshold(self, cohort: int) -> int:
        k = self.neighbours(cohort)
        t = self.secagg_threshold or default_threshold(k)
        check_threshold(k, t)
        return t

    def check(self, slots: int) -> None:
        """What a server with ``slots`` devices a round needs: a weight sum that fits in a word, and
        a threshold that fits the graph."""
        if slots * self.secagg_weight_cap >= MODULUS:
            raise ConfigError(
                f"--secagg-weight-cap {self.secagg_weight_cap} x {slots} devices a round must be below 2^32"
            )
        if slots >= 3:
            self.threshold(slots)
