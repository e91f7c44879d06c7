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

from fedper.common.errors import ConfigError, FedperError

MODULUS = 2**32


class SumOutOfBoundsError(FedperError, ValueError):
    """A decoded sum that no set of honest devices could have sent: the round is not published."""


@dataclass(frozen=True)
class FixedPoint:
    """The encoding of a round: its clip C, its largest cohort n and the weight cap."""

    clip: float
    cohort: int
    weight_cap: int
    flags: int = 0  # words of 0/1 flags between the delta and the weight (DP: the unclipped bit)

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

    def encode(self, delta: np.ndarray, num_samples: int, flags: tuple[int, ...] = ()) -> np.ndarray:
        """The words a device masks: its weighted delta, its flags (0 or 1 each), then its weight."""
        if len(flags) != self.flags or any(f not in (0, 1) for f in flags):
            raise ValueError(f"expected {self.flags} flags of 0 or 1, got {flags}")
        weight = self.weight(num_samples)
        scaled = np.rint(np.asarray(delta, dtype=np.float64) * (self.scale * weight / self.weight_cap))
        words = np.clip(scaled, -self.bound, self.bound).astype(np.int64)
        return np.concatenate([words, flags, [weight]]).astype(np.uint32)  # negative ints wrap mod 2^32

    def decode_sum(self, total: np.ndarray) -> tuple[np.ndarray, int, list[int]]:
        """From the sum of the cohort's words: the sum of the weighted deltas (float64, in units of
        the weight cap: sum of w_i delta_i with w_i = weight_i / cap), the total weight, and each
        flag's count."""
        data = total[: len(total) - 1 - self.flags]
        signed = data.astype(np.uint32).view(np.int32).astype(np.float64)
        flags = [int(f) for f in total[len(data) : len(total) - 1]]
        return signed / self.scale, int(total[-1]), flags

    def decode(self, total: np.ndarray) -> tuple[np.ndarray, int]:
        """The mean delta (float64) and the total weight from the sum of the cohort's words."""
        summed, weight, _ = self.decode_sum(total)
        if weight == 0:
            return np.zeros_like(summed), 0
        return summed * self.weight_cap / weight, weight

    def check_weight(self, weight: int, devices: int) -> None:
        """A total weight that ``devices`` honest devices can send: in [devices, devices x
        weight_cap] (each honest weight is at least 1 and at most the cap). Under DP-FedAvg the cap
        is 1, so this depends on no honest device's data: it may decide a noised round's fate."""
        if not devices <= weight <= devices * self.weight_cap:
            raise SumOutOfBoundsError(
                f"the total weight {weight} is outside [{devices}, {devices * self.weight_cap}] for {devices} devices"
            )

    def check_sum(self, summed: np.ndarray, weight: int, flags: list[int], devices: int) -> None:
        """What ``devices`` honest devices' words sum to, at most: the weight as ``check_weight``,
        each flag count at most ``devices``, and ``summed`` (the sum of w_i delta_i in units of the
        cap) within C x weight / cap plus every device's rounding, since each honest delta is
        within C. So the published mean step is within C from the first round on, whatever one
        device sent. Not under DP-FedAvg: these depend on the honest devices' data, and whether a
        noised round is published must not (the mechanism bounds them instead)."""
        self.check_weight(weight, devices)
        if any(count > devices for count in flags):
            raise SumOutOfBoundsError(f"a flag counted {max(flags)} times among {devices} devices")
        length = float(np.sqrt(np.sum(np.square(summed))))
        bound = self.clip * weight / self.weight_cap + devices * self.error_norm(len(summed))
        if not length <= bound:
            raise SumOutOfBoundsError(
                f"the weighted sum of deltas has L2 norm {length:.6g}, above the {bound:.6g} that {devices} devices "
                f"within the clip {self.clip:g} can reach (total weight {weight})"
            )

    def error_norm(self, words: int) -> float:
        """The largest L2 distance rounding puts between one device's encoded delta and its
        weighted delta: 1 / (2 scale) per coordinate (DP adds it to the clip it noises)."""
        return math.sqrt(words) / (2 * self.scale)

    def error_bound(self, devices: int, total_weight: int) -> float:
        """The largest the rounding can move a coordinate of the mean."""
        return devices / (2 * self.scale) * self.weight_cap / max(total_weight, 1)
