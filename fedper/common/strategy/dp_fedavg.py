"""DP-FedAvg (docs/PRIVACY.md) composed on the base mode: the base's acceptance plus the clip,
every round published at its deadline with noise, and the state the budget needs."""

from __future__ import annotations

import math
from collections.abc import Callable

import numpy as np

from fedper.common.dp.accountant import PrivacyBudget, largest_cohort
from fedper.common.dp.clipping import distance
from fedper.common.dp.config import DPConfig
from fedper.common.dp.mechanism import dp_aggregate, noised_mean
from fedper.common.dp.state import DPState
from fedper.common.protocol import ErrorCode
from fedper.common.strategy.robust_fedavg import RobustFedAvg
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


class DPFedAvg:
    """``expected_cohort`` devices a round in expectation, each drawn with probability
    ``sampling_probability`` (the accountant's assumption); ``population()`` fixes delta at the
    first noised round (``--dp-delta``, else N^-1.1). ``state`` is what the runner persists."""

    def __init__(
        self,
        inner: RobustFedAvg,
        config: DPConfig,
        expected_cohort: float,
        sampling_probability: float,
        population: Callable[[], int],
        state: DPState | None = None,
    ) -> None:
        config.require_mean(inner.config.aggregate)
        config.noise(expected_cohort)  # a count noise too small for z is refused before any round
        self.inner, self.config = inner, config
        self.expected_cohort, self.sampling_probability = expected_cohort, sampling_probability
        self.population = population
        self.state = state or DPState()

    @property
    def quorum(self) -> Quorum:
        return self.inner.quorum

    @property
    def private(self) -> DPFedAvg:
        return self

    def clip(self) -> float:
        """The open round's clip: the adaptive one once a round moved it, else ``--dp-clip``."""
        return self.state.clip if self.state.clip is not None else self.config.dp_clip

    def device_clip(self) -> float | None:
        return self.clip()

    def needs_base(self) -> bool:
        return True

    def delta(self) -> float:
        """The run's delta: fixed by the first noised round; before it, what it would be now."""
        if self.state.delta is not None:
            return self.state.delta
        return self.config.delta(max(2, self.population()))

    def budget(self) -> PrivacyBudget:
        c = self.config
        return PrivacyBudget(c.dp_noise_multiplier, self.sampling_probability, self.delta(), c.target_epsilon)

    def max_devices(self) -> int:
        """B: the most devices the draw gives (each on its coin of probability q) from the
        population the expected cohort implies (cohort / q), but with probability 1e-9; the
        mechanism projects a larger sum back to B devices' worth."""
        q = self.sampling_probability
        return largest_cohort(math.ceil(self.expected_cohort / q - 1e-9), q)

    def refusal(self, tensors: Tensors, base: Tensors, layout: Layout) -> UpdateRefusal | None:
        """The base mode's refusals, then a delta longer than the round's clip, measured as the
        clipping contract defines it (a device's clipping is checked, not trusted)."""
        refused = self.inner.refusal(tensors, base, layout)
        if refused is not None:
            return refused
        clip = self.clip()
        length = distance(tensors, base, [name for name, _ in layout])
        if not length <= clip:
            return UpdateRefusal(
                ErrorCode.DELTA_ABOVE_CLIP,
                f"the base delta has L2 norm {length:.9g}, above this round's clip_norm {clip!r}; clip it as "
                'PROTOCOL.md, "Clipping the base delta", defines (the server measures it the same way)',
            )
        return None

    def decide(self, progress: RoundProgress) -> Decision:
        """Every noised round is published, at its deadline: when it is must not depend on who
        took part."""
        return Decision("close", "deadline") if progress.due else WAIT

    def aggregate(self, inputs: RoundInputs) -> RoundResult:
        """The noised mean of the clipped deltas; noise alone when nobody took part."""
        contributions = ((c.tensors, bool(c.unclipped)) for c in inputs.updates())
        base, report = dp_aggregate(inputs.layout, inputs.base, contributions, self.clip(), self.config,
                                    self.expected_cohort, self._noise(inputs), inputs.group,
                                    max_devices=self.max_devices())  # fmt: skip
        return RoundResult(base, report.updates, dp=report)

    def aggregate_sum(
        self, inputs: RoundInputs, sums: Tensors, count: int, unclipped: int, sensitivity: float
    ) -> RoundResult:
        """The noised mean of a sum seen only whole (a secure round): ``count`` deltas,
        ``unclipped`` of them within the clip before clipping, each within ``sensitivity``."""
        base, report = noised_mean(inputs.layout, inputs.base, sums, count, unclipped - count / 2, self.clip(),
                                   self.config, self.expected_cohort, self._noise(inputs), sensitivity,
                                   self.max_devices())  # fmt: skip
        return RoundResult(base, report.updates, dp=report, secure=True)

    def record(self, result: RoundResult) -> bool:
        """Count the noised round (a refused one too: its refusal is visible) and take the next
        clip; False when one more round would take epsilon above the target."""
        assert result.dp is not None
        self.state = DPState(clip=result.dp.next_clip, rounds=self.state.rounds + 1, delta=self.delta())
        return self.allows_next()

    def allows_next(self) -> bool:
        return self.budget().allows(self.state.rounds + 1)

    def epsilon(self) -> float | None:
        """Epsilon spent by the rounds counted so far."""
        return self.budget().reported(self.state.rounds)

    def _noise(self, inputs: RoundInputs) -> np.random.Generator:
        if inputs.noise is None:
            raise ValueError("a DP round needs its noise generator")
        return inputs.noise
