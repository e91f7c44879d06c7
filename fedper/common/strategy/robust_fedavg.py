"""The base mode: FedAvg behind the norm clip, weight cap and coordinate clip
(:mod:`fedper.common.robust_aggregate`), or a robust mean in its place."""

from __future__ import annotations

import math

import numpy as np

from fedper.common.protocol import ErrorCode
from fedper.common.robust_aggregate import CENTERED, AggregationConfig, negative_variance, robust_aggregate
from fedper.common.strategy.round_strategy import (
    WAIT,
    Decision,
    Layout,
    Quorum,
    RoundInputs,
    RoundProgress,
    RoundResult,
    Tensors,
    UpdateRefusal,
)


class RobustFedAvg:
    """Closes at ``target_clients`` accepted updates, or at the deadline with ``min_clients``;
    abandons below that. Refuses updates farther than ``max_update_norm`` from the base (0: no
    bound). Keeps nothing between rounds: centered clipping's last step is the runner's (the
    server reads it from its published versions)."""

    def __init__(self, config: AggregationConfig, quorum: Quorum, max_update_norm: float = 0.0) -> None:
        self.config, self.quorum, self.max_update_norm = config, quorum, max_update_norm

    @property
    def private(self) -> None:
        return None

    def device_clip(self) -> float | None:
        return None

    def refusal(self, tensors: Tensors, base: Tensors, layout: Layout) -> UpdateRefusal | None:
        """A non-finite value or a negative BatchNorm variance (what no aggregate survives), then
        a distance from the base above ``max_update_norm``."""
        for name, _ in layout:
            values = tensors[name]
            if not np.isfinite(values).all():
                return UpdateRefusal(ErrorCode.NON_FINITE, f"tensor {name!r} contains NaN or Inf")
            smallest = negative_variance(name, values)
            if smallest is not None:
                return UpdateRefusal(
                    ErrorCode.UPDATE_OUT_OF_BOUNDS,
                    f"tensor {name!r} is a BatchNorm variance and must be >= 0; its smallest value is {smallest:.4g}",
                )
        if self.max_update_norm > 0:
            squared = 0.0
            for name, _ in layout:
                diff = tensors[name].astype(np.float64) - base[name]
                squared += float(np.dot(diff.ravel(), diff.ravel()))
            if math.sqrt(squared) > self.max_update_norm:
                return UpdateRefusal(
                    ErrorCode.UPDATE_OUT_OF_BOUNDS,
                    f"the update is at L2 distance {math.sqrt(squared):.4g} from the round's base; "
                    f"this server accepts at most {self.max_update_norm:g}",
                )
        return None

    def needs_base(self) -> bool:
        """Whether ``refusal`` measures an update against the round's base."""
        return self.max_update_norm > 0

    def decide(self, progress: RoundProgress) -> Decision:
        received, quorum = progress.received, self.quorum
        if received >= quorum.target_clients:
            return Decision("close", "target reached")
        if not progress.due:
            return WAIT
        if received >= quorum.min_clients:
            return Decision("close", "deadline")
        return Decision("abandon", f"deadline: {received} updates, fewer than {quorum.min_clients}")

    def aggregate(self, inputs: RoundInputs) -> RoundResult:
        center = inputs.last_step() if self.config.aggregate == CENTERED else None
        pairs = lambda: ((c.tensors, c.num_samples) for c in inputs.updates())  # noqa: E731
        base, report = robust_aggregate(inputs.layout, inputs.base, pairs, self.config, inputs.group, center,
                                        spill=inputs.spill)  # fmt: skip
        return RoundResult(base, report.updates, robust=report)

    def record(self, result: RoundResult) -> bool:
        return True

    def allows_next(self) -> bool:
        return True
