"""A device's weighted, clipped base delta as integers mod 2^32, and the cohort's sum back.

The device scales its delta by its weight w = min(num_samples, weight_cap) / weight_cap (FedAvg's
sample weight, capped so that one device cannot dominate or overflow), and sends
round(scale * w * delta) per coordinate, and min(num_samples, weight_cap) as one more word. The
server learns only the sums; the mean delta is sum / scale * weight_cap / (sum of the weights).

**Overflow is impossible by construction:** the delta is clipped to L2 norm C, so every
coordinate is within [-C, C] and so is w * delta. With at most n devices, each word's integer is
at most M = (2^31 - 1) // n in size (scale = (M - 1) / C, and the encoder clamps to M, never
needed for a clipped delta), so the sum of n of them stays within a signed 32-bit word and the
wrap-around of mod 2^32 arithmetic undoes exactly. The weights' sum is at most n * weight_cap,
below 2^32 (checked). The rounding costs at most 1 / (2 scale) per coordinate per device: on the
mean, at most n / (2 scale) * weight_cap / (sum of the weights).
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import numpy as np

from fedper.common.errors import ConfigError

MODULUS = 2**32


@dataclass(frozen=True)
class FixedPoint:
    """The encoding of a round: its clip C, its largest cohort n and the weight cap."""

    clip: float
    cohort: int
    weight_cap: int

    def __post_init__(self) -> None:
        if not (math.isfinite(self.clip) and self.clip > 0):
            raise ConfigError(f"the clip must be a positive number, got {self.clip}")
        if not 1 <= self.cohort <= 2**20:
            raise ConfigError(f"the cohort must be 1 to 2^20 devices, got {self.cohort}")
        if self.weight_cap < 1 or self.cohort * self.weight_cap >= MODULUS:
            raise ConfigError(f"the weight cap ({self.weight_cap}) times the cohort ({self.cohort}) must be below 2^32")

    @property
    def bound(self) -> int:
        """The largest integer one device's coordinate can be."""
        return (2**31 - 1) // self.cohort

    @property
    def scale(self) -> float:
        return (self.bound - 1) / self.clip

    def weight(self, num_samples: int) -> int:
        return max(0, min(num_samples, self.weight_cap))

    def encode(self, delta: np.ndarray, num_samples: int) -> np.ndarray:
        """The words a device masks: its weighted delta, then its weight."""
        weight = self.weight(num_samples)
        scaled = np.rint(np.asarray(delta, dtype=np.float64) * (self.scale * weight / self.weight_cap))
        words = np.clip(scaled, -self.bound, self.bound).astype(np.int64)
        return np.append(words, weight).astype(np.uint32)  # negative ints wrap to their mod-2^32 word

    def decode(self, total: np.ndarray) -> tuple[np.ndarray, int]:
        """The mean delta (float64) and the total weight from the sum of the cohort's words."""
        signed = total[:-1].astype(np.uint32).view(np.int32).astype(np.float64)
        weight = int(total[-1])
        if weight == 0:
            return np.zeros_like(signed), 0
        return signed / self.scale * self.weight_cap / weight, weight

    def error_bound(self, devices: int, total_weight: int) -> float:
        """The largest the rounding can move a coordinate of the mean."""
        return devices / (2 * self.scale) * self.weight_cap / max(total_weight, 1)
