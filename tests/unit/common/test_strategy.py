"""The round policy (fedper/common/strategy): what a round accepts, when it ends, how it
aggregates and what it keeps, as the server and the simulation both run it."""

import math
from functools import partial

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from fedper.common.dp.accountant import PrivacyBudget, largest_cohort
from fedper.common.dp.clipping import distance
from fedper.common.dp.config import DPConfig
from fedper.common.dp.mechanism import dp_aggregate, noised_mean
from fedper.common.dp.state import DPState
from fedper.common.protocol import ErrorCode
from fedper.common.robust_aggregate import AggregationConfig, robust_aggregate
from fedper.common.secagg.fixed_point import FixedPoint, SumOutOfBoundsError
from fedper.common.strategy.dp_fedavg import DPFedAvg
from fedper.common.strategy.modes import round_strategy
from fedper.common.strategy.robust_fedavg import RobustFedAvg
from fedper.common.strategy.round_strategy import (
    Contribution,
    Decision,
    Quorum,
    RoundInputs,
    RoundProgress,
    SecureSum,
)
from fedper.common.strategy.secure_aggregation import SecureAggregation

LAYOUT = [("w", (3, 4)), ("bn.running_var", (4,))]
NAMES = [name for name, _ in LAYOUT]
QUORUM = Quorum(min_clients=2, target_clients=4)
FIXED_DP = DPConfig(dp=True, dp_clip=0.5, dp_clip_learning_rate=0, dp_noise_multiplier=1.0)
ADAPTIVE_DP = DPConfig(dp=True, dp_clip=0.5, dp_noise_multiplier=0.5, dp_count_stddev=1.0)


def _base() -> dict[str, np.ndarray]:
    return {"w": np.linspace(-1, 1, 12).reshape(3, 4), "bn.running_var": np.ones(4)}


def _updates(seed: int, k: int, scale: float = 0.05) -> list[Contribution]:
    rng, base = np.random.default_rng(seed), _base()
    return [
        Contribution({n: (v + rng.normal(0, scale, v.shape)).astype(np.float32) for n, v in base.items()},
                     int(rng.integers(50, 150)), bool(rng.integers(0, 2)))
        for _ in range(k)
    ]  # fmt: skip


def _dp(config: DPConfig = FIXED_DP, state: DPState | None = None, population: int = 20) -> DPFedAvg:
    return DPFedAvg(RobustFedAvg(AggregationConfig(), QUORUM), config, 4, 0.2, lambda: population, state)


def test_the_modes_are_chosen_in_one_place() -> None:
    plain = round_strategy(AggregationConfig(), DPConfig(), QUORUM, expected_cohort=4, sampling_probability=1,
                           population=lambda: 8)  # fmt: skip
    private = round_strategy(AggregationConfig(), FIXED_DP, QUORUM, expected_cohort=4, sampling_probability=0.5,
                             population=lambda: 8)  # fmt: skip
    secure = round_strategy(AggregationConfig(), FIXED_DP, QUORUM, expected_cohort=4, sampling_probability=0.5,
                            population=lambda: 8, secure_words=16)  # fmt: skip
    assert isinstance(plain, RobustFedAvg) and plain.private is None and plain.device_clip() is None
    assert isinstance(private, DPFedAvg) and private.private is private and private.device_clip() == 0.5
    assert isinstance(secure, SecureAggregation) and isinstance(secure.inner, DPFedAvg)
    assert secure.private is secure.inner and secure.device_clip() == 0.5


@pytest.mark.parametrize(
    ("received", "due", "expected"),
    [
        (4, False, Decision("close", "target reached")),
        (5, True, Decision("close", "target reached")),
        (3, False, Decision("wait")),
        (2, True, Decision("close", "deadline")),
        (1, True, Decision("abandon", "deadline: 1 updates, fewer than 2")),
        (0, False, Decision("wait")),
    ],
)
def test_robust_fedavg_closes_at_its_target_or_its_deadline_with_a_quorum(received, due, expected) -> None:
    assert RobustFedAvg(AggregationConfig(), QUORUM).decide(RoundProgress(received, due)) == expected


@given(st.integers(0, 50), st.booleans())
def test_a_dp_round_is_published_at_its_deadline_whoever_took_part(received, due) -> None:
    """When a noised round is published must not depend on who took part: never at a target."""
    decision = _dp().decide(RoundProgress(received, due))
    assert decision == (Decision("close", "deadline") if due else Decision("wait"))


@pytest.mark.parametrize("private", [False, True])
@pytest.mark.parametrize(("unmasked", "session", "due"), [(u, s, d) for u in (0, 1) for s in (0, 1) for d in (0, 1)])
def test_a_secure_round_closes_once_unmasked_under_dp_at_its_deadline(private, unmasked, session, due) -> None:
    inner = _dp() if private else RobustFedAvg(AggregationConfig(), QUORUM)
    decision = SecureAggregation(inner, 16).decide(RoundProgress(0, bool(due), bool(unmasked), bool(session)))
    if unmasked and (due or not private):
        assert decision == Decision("close", "unmasked")
    elif not session and due:
        expected = "close" if private else "abandon"  # noise alone, or no secure sum to publish
        assert decision.action == expected
    else:
        assert decision == Decision("wait")


@settings(max_examples=60, deadline=None)
@given(st.integers(0, 2**31), st.sampled_from(["nan", "inf", "variance", "far", "none"]))
def test_what_a_round_refuses_is_what_the_aggregate_would_not_survive(seed, poison) -> None:
    base = _base()
    update = dict(_updates(seed, 1)[0].tensors)
    if poison == "nan":
        update["w"] = update["w"].copy()
        update["w"][1, 2] = np.nan
    elif poison == "inf":
        update["w"] = np.full((3, 4), np.inf, np.float32)
    elif poison == "variance":
        update["bn.running_var"] = -np.abs(update["bn.running_var"])
    elif poison == "far":
        update["w"] = update["w"] + 100
    bounded = RobustFedAvg(AggregationConfig(), QUORUM, max_update_norm=10.0)
    refused = bounded.refusal(update, base, LAYOUT)
    expected = {"nan": ErrorCode.NON_FINITE, "inf": ErrorCode.NON_FINITE, "variance": ErrorCode.UPDATE_OUT_OF_BOUNDS,
                "far": ErrorCode.UPDATE_OUT_OF_BOUNDS, "none": None}[poison]  # fmt: skip
    assert (refused.code if refused else None) == expected
    unbounded = RobustFedAvg(AggregationConfig(), QUORUM).refusal(update, base, LAYOUT)
    assert (unbounded is None) == (poison in ("far", "none"))  # no distance bound: only what breaks an aggregate


@settings(max_examples=40, deadline=None)
@given(st.integers(0, 2**31), st.floats(0.01, 3.0))
def test_dp_refuses_exactly_the_deltas_longer_than_the_clip(seed, scale) -> None:
    base, mode = _base(), _dp()
    update = _updates(seed, 1, scale)[0].tensors
    update = {**update, "bn.running_var": np.abs(update["bn.running_var"])}
    refused = mode.refusal(update, base, LAYOUT)
    within = distance(update, base, NAMES) <= 0.5
    assert (refused is None) == within
    assert within or (refused is not None and refused.code == ErrorCode.DELTA_ABOVE_CLIP)


@pytest.mark.parametrize("config", [AggregationConfig(), AggregationConfig(aggregate="median"),
                                    AggregationConfig(coordinate_clip=0, clip_by="tensor")])  # fmt: skip
def test_robust_fedavg_aggregates_as_robust_aggregate_to_the_bit(config) -> None:
    updates, base = _updates(3, 6), _base()
    result = RobustFedAvg(config, QUORUM).aggregate(RoundInputs(LAYOUT, base, partial(iter, updates)))
    expected, report = robust_aggregate(LAYOUT, base, lambda: ((c.tensors, c.num_samples) for c in updates), config)
    assert result.updates == 6 and result.robust == report and result.dp is None
    assert all(np.array_equal(result.base[n], expected[n]) for n in NAMES)


def test_centered_clipping_starts_from_the_step_the_runner_gives() -> None:
    updates, base = _updates(4, 5), _base()
    step = {n: np.full(v.shape, 0.01) for n, v in base.items()}
    config = AggregationConfig(aggregate="centered-clip")
    result = RobustFedAvg(config, QUORUM).aggregate(RoundInputs(LAYOUT, base, partial(iter, updates),
                                                                last_step=lambda: step))  # fmt: skip
    pairs = lambda: ((c.tensors, c.num_samples) for c in updates)  # noqa: E731
    expected, _ = robust_aggregate(LAYOUT, base, pairs, config, center=step)
    assert all(np.array_equal(result.base[n], expected[n]) for n in NAMES)


def test_dp_fedavg_is_the_mechanism_with_its_clip_cohort_and_bound() -> None:
    base, mode = _base(), _dp(ADAPTIVE_DP)
    updates = [c._replace(tensors={**c.tensors, "bn.running_var": np.abs(c.tensors["bn.running_var"])})
               for c in _updates(5, 3, 0.01)]  # fmt: skip
    result = mode.aggregate(RoundInputs(LAYOUT, base, partial(iter, updates), np.random.default_rng(7)))
    expected, report = dp_aggregate(LAYOUT, base, ((c.tensors, bool(c.unclipped)) for c in updates), 0.5,
                                    ADAPTIVE_DP, 4, np.random.default_rng(7),
                                    max_devices=largest_cohort(20, 0.2))  # fmt: skip
    assert result.dp == report and all(np.array_equal(result.base[n], expected[n]) for n in NAMES)
    with pytest.raises(ValueError, match="noise generator"):
        mode.aggregate(RoundInputs(LAYOUT, base, partial(iter, updates)))


def test_dp_state_moves_round_by_round_and_the_budget_stops_the_run() -> None:
    config = DPConfig(dp=True, dp_clip=0.5, dp_noise_multiplier=0.8, dp_count_stddev=1.0, target_epsilon=2.0)
    mode = _dp(config, population=20)
    delta = config.delta(20)
    assert mode.state == DPState() and mode.clip() == 0.5 and mode.delta() == delta
    budget = PrivacyBudget(0.8, 0.2, delta, 2.0)
    rounds = 0
    while mode.allows_next():
        result = mode.aggregate(RoundInputs(LAYOUT, _base(), lambda: (), np.random.default_rng(rounds)))
        assert result.updates == 0  # noise alone: nobody took part
        mode.record(result)
        rounds += 1
        assert mode.state.rounds == rounds and mode.state.clip == result.dp.next_clip  # type: ignore[union-attr]
        assert mode.state.delta == delta  # fixed by the first noised round
    assert rounds > 1 and budget.allows(rounds) and not budget.allows(rounds + 1)
    assert mode.epsilon() == budget.reported(rounds)
    resumed = _dp(config, state=mode.state, population=1000)  # a restart: the stored state wins
    assert resumed.delta() == delta and not resumed.allows_next()


def test_a_secure_sum_becomes_the_base_or_says_why_not() -> None:
    base = _base()
    fixed = FixedPoint(clip=1.0, cohort=3, weight_cap=100)
    sums = {n: np.full(s, 0.1) for n, s in LAYOUT}
    secure = SecureAggregation(RobustFedAvg(AggregationConfig(), QUORUM), 16)
    result = secure.aggregate(RoundInputs(LAYOUT, base, secure=SecureSum(sums, 200, [0], fixed, 2)))
    assert not isinstance(result, str) and result.secure and result.updates == 2
    assert all(np.allclose(result.base[n], base[n] + 0.1 * 100 / 200) for n in NAMES)
    one = secure.aggregate(RoundInputs(LAYOUT, base, secure=SecureSum(sums, 100, [0], fixed, 1)))
    assert one == "1 devices in the secure sum, fewer than 2"
    beyond = {n: v * 3 for n, v in sums.items()}  # no single device within the clip can send this
    with pytest.raises(SumOutOfBoundsError):
        secure.aggregate(RoundInputs(LAYOUT, base, secure=SecureSum(beyond, 100, [0], fixed, 1)))
    assert secure.aggregate(RoundInputs(LAYOUT, base)) == "no secure session: fewer than two devices were drawn"


def test_a_secure_dp_round_is_noised_even_without_a_session() -> None:
    base, private = _base(), _dp()
    secure = SecureAggregation(private, 16)
    result = secure.aggregate(RoundInputs(LAYOUT, base, noise=np.random.default_rng(1)))
    zeros = {n: np.zeros(s) for n, s in LAYOUT}
    expected, report = noised_mean(LAYOUT, base, zeros, 0, 0, 0.5, FIXED_DP, 4, np.random.default_rng(1), 0.5,
                                   private.max_devices())  # fmt: skip
    assert not isinstance(result, str) and result.secure and result.dp == report and result.updates == 0
    assert all(np.array_equal(result.base[n], expected[n]) for n in NAMES)
    assert math.isclose(private.max_devices(), largest_cohort(20, 0.2))
