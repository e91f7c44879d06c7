"""The one place a run's round mode is chosen, for the server and the simulation alike."""

from __future__ import annotations

from collections.abc import Callable

from fedper.common.dp.config import DPConfig
from fedper.common.dp.state import DPState
from fedper.common.robust_aggregate import AggregationConfig
from fedper.common.strategy.dp_fedavg import DPFedAvg
from fedper.common.strategy.robust_fedavg import RobustFedAvg
from fedper.common.strategy.round_strategy import Quorum
from fedper.common.strategy.secure_aggregation import SecureAggregation

Strategy = RobustFedAvg | DPFedAvg | SecureAggregation


def round_strategy(
    aggregation: AggregationConfig,
    privacy: DPConfig,
    quorum: Quorum,
    *,
    expected_cohort: float,
    sampling_probability: float,
    population: Callable[[], int],
    dp_state: DPState | None = None,
    secure_words: int | None = None,
    max_update_norm: float = 0.0,
) -> Strategy:
    """Robust FedAvg; with ``privacy.dp``, DP-FedAvg on it; with ``secure_words`` (the base's
    floats), secure aggregation on either. ``dp_state``: where a resumed DP run stands;
    ``max_update_norm``: the farthest an update may be from its round's base (0: no bound)."""
    base = RobustFedAvg(aggregation, quorum, max_update_norm)
    mode: RobustFedAvg | DPFedAvg = base
    if privacy.dp:
        mode = DPFedAvg(base, privacy, expected_cohort, sampling_probability, population, dp_state)
    if secure_words is not None:
        return SecureAggregation(mode, secure_words)
    return mode
