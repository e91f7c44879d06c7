"""Secure aggregation (docs/SECAGG.md) composed on the base mode or on DP-FedAvg: the server
sees only the sum of the masked inputs, which this mode turns into the next base."""

from __future__ import annotations

import numpy as np

from fedper.common.strategy.dp_fedavg import DPFedAvg
from fedper.common.strategy.robust_fedavg import RobustFedAvg
from fedper.common.strategy.round_strategy import (
    WAIT,
    Decision,
    Layout,
    RoundInputs,
    RoundProgress,
    RoundResult,
    SecureSum,
    Tensors,
    UpdateRefusal,
)


class SecureAggregation:
    """``words``: the base's floats, the length of a masked input's delta."""

    def __init__(self, inner: RobustFedAvg | DPFedAvg, words: int) -> None:
        self.inner, self.words = inner, words

    @property
    def private(self) -> DPFedAvg | None:
        return self.inner.private

    def device_clip(self) -> float | None:
        return self.inner.device_clip()

    def refusal(self, tensors: Tensors, base: Tensors, layout: Layout) -> UpdateRefusal | None:
        return self.inner.refusal(tensors, base, layout)

    def needs_base(self) -> bool:
        return self.inner.needs_base()

    def decide(self, progress: RoundProgress) -> Decision:
        """Closes once the unmasking is over, under DP not before the deadline (when a noised
        round is published must not depend on who took part); at the deadline without a session
        (fewer than two devices were drawn) DP publishes noise alone, else the round is abandoned."""
        private = self.private is not None
        if progress.unmasked and (not private or progress.due):
            return Decision("close", "unmasked")
        if not progress.session and progress.due:
            if private:
                return Decision("close", "deadline")
            return Decision("abandon", "deadline: fewer than two devices were drawn, so no secure sum")
        return WAIT

    def aggregate(self, inputs: RoundInputs) -> RoundResult | str:
        """The next base from the unmasked sum, or why the round publishes nothing. The decoded
        sum is checked first (``FixedPoint.check_sum``): SumOutOfBoundsError when no set of honest
        devices could have sent it."""
        summed, private = inputs.secure, self.private
        if private is not None:  # every round is published: noise alone if nobody took part
            if summed is None:
                zeros = {name: np.zeros(shape) for name, shape in inputs.layout}
                return private.aggregate_sum(inputs, zeros, 0, 0, private.clip())
            # Only what depends on no honest device's data may stop a noised round (every honest
            # weight is 1); the bits' count and the sum are bounded by the mechanism instead
            # (clamped to [0, B], projected onto B x the sensitivity), with B fixed by the sampling.
            summed.fixed.check_weight(summed.weight, summed.survivors)
            bits = min(max(summed.flags[0], 0), private.max_devices())
            sensitivity = summed.fixed.clip + summed.fixed.error_norm(self.words)
            return private.aggregate_sum(inputs, summed.sums, summed.survivors, bits, sensitivity)
        checked = self.checked_sum(inputs)
        if isinstance(checked, str):
            return checked
        scale = checked.fixed.weight_cap / checked.weight
        base = {name: (inputs.base[name] + checked.sums[name] * scale).astype(np.float32) for name, _ in inputs.layout}
        return RoundResult(base, checked.survivors, secure=True)

    def checked_sum(self, inputs: RoundInputs) -> SecureSum | str:
        """Without DP: the unmasked sum, once it is one honest devices could have sent
        (SumOutOfBoundsError if not) from at least ``min_clients`` of them; else why not. What a
        round publishes, or a regional server forwards (docs/SCALING.md)."""
        summed = inputs.secure
        if summed is None:
            return "no secure session: fewer than two devices were drawn"
        flat = np.concatenate([summed.sums[name].ravel() for name, _ in inputs.layout])
        summed.fixed.check_sum(flat, summed.weight, summed.flags, summed.survivors)
        quorum = self.inner.quorum
        if summed.survivors < quorum.min_clients:
            return f"{summed.survivors} devices in the secure sum, fewer than {quorum.min_clients}"
        return summed

    def record(self, result: RoundResult) -> bool:
        return self.inner.record(result)

    def allows_next(self) -> bool:
        return self.inner.allows_next()
