"""DP-FedAvg's parts (fedper/common/dp/): the clipping contract, the server's noise, adaptive
clipping and the accounting. The statistical tests draw from OS entropy, as the server does,
and state the rate at which a correct implementation fails them."""

import itertools
import math

import dp_accounting
import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from scipy import stats

from fedper.common.dp.accountant import PrivacyBudget, epsilon, round_event, smallest_noise_multiplier
from fedper.common.dp.clipping import MARGIN_STEPS, ClippingError, clip_delta, distance, shrink
from fedper.common.dp.config import DPConfig
from fedper.common.dp.mechanism import ClipExceededError, dp_aggregate
from fedper.common.errors import ConfigError

LAYOUT = [("w", (6, 5)), ("b", (5,)), ("bn.running_var", (5,))]
NAMES = [n for n, _ in LAYOUT]
FIXED = DPConfig(dp=True, dp_clip_learning_rate=0)
ALPHA = 1e-6  # each statistical test's false-failure rate (two-sided)


def _base(rng: np.random.Generator) -> dict[str, np.ndarray]:
    base = {n: rng.standard_normal(s).astype(np.float32) for n, s in LAYOUT}
    base["bn.running_var"] = np.abs(base["bn.running_var"]) + 1
    return base


def _moved(base: dict[str, np.ndarray], rng: np.random.Generator, scale: float) -> dict[str, np.ndarray]:
    return {n: (v + scale * rng.standard_normal(v.shape)).astype(np.float32) for n, v in base.items()}


def _sequential(tensors, base, names) -> float:  # type: ignore[no-untyped-def]
    """The contract's norm as another language writes it: a plain loop over doubles."""
    total = 0.0
    for name in names:
        for t, b in zip(np.ravel(tensors[name]).tolist(), np.ravel(base[name]).tolist(), strict=True):
            d = t - b
            total += d * d
    return math.sqrt(total)


floats32 = st.floats(-1e3, 1e3, width=32, allow_subnormal=False)


@settings(max_examples=200, deadline=None)
@given(st.lists(st.tuples(floats32, floats32), min_size=1, max_size=300), st.integers(1, 4))
def test_distance_is_the_plain_loop_to_the_bit(pairs, cut):
    """Left to right, in float64: what the Java core computes with a for loop."""
    t = np.array([p[0] for p in pairs], np.float32)
    b = np.array([p[1] for p in pairs], np.float32)
    k = len(pairs) * cut // 5  # two tensors, so the running sum crosses a tensor boundary
    tensors, base = {"x": t[:k], "y": t[k:]}, {"x": b[:k], "y": b[k:]}
    assert distance(tensors, base, ["x", "y"]) == _sequential(tensors, base, ["x", "y"])


@settings(max_examples=300, deadline=None)
@given(
    st.integers(0, 2**32 - 1),
    st.floats(1e-4, 1e2),  # how far training moved
    st.floats(1e-3, 1e2),  # the bound
    st.sampled_from([0.01, 1.0, 300.0]),  # the base's magnitude (its float32 rounding)
)
def test_clipping_leaves_the_delta_within_the_bound_the_server_checks(seed, moved, bound, magnitude):
    rng = np.random.default_rng(seed)
    received = {n: (magnitude * rng.standard_normal(s)).astype(np.float32) for n, s in LAYOUT}
    trained = _moved(received, rng, moved)
    norm = distance(trained, received, NAMES)
    clipped = clip_delta(trained, received, NAMES, bound)
    assert distance(clipped.tensors, received, NAMES) <= bound  # what the server checks
    assert all(clipped.tensors[n].dtype == np.float32 and clipped.tensors[n].shape == s for n, s in LAYOUT)
    assert clipped.norm == norm and clipped.unclipped == (norm <= bound)
    if clipped.unclipped:  # sent as trained, to the bit
        assert all(np.array_equal(clipped.tensors[n], trained[n]) for n in NAMES)
        assert clipped.scale == 1.0
    else:
        assert 0 <= clipped.scale <= bound / norm
        # the first scale that passes, by the contract's sequence
        expected = next(
            s
            for s in [(bound / norm) * (1 - (0.0 if k == 0 else 2.0 ** (k - MARGIN_STEPS))) for k in range(25)]
            if distance({n: shrink(trained[n], received[n], s) for n in NAMES}, received, NAMES) <= bound
        )
        assert clipped.scale == expected
        for n in NAMES:  # the delta keeps its direction
            assert np.array_equal(clipped.tensors[n], shrink(trained[n], received[n], clipped.scale))


def test_clipping_refuses_what_it_cannot_clip():
    rng = np.random.default_rng(0)
    received = _base(rng)
    broken = dict(received, w=np.full((6, 5), np.nan, np.float32))
    with pytest.raises(ClippingError, match="non-finite"):
        clip_delta(broken, received, NAMES, 1.0)
    with pytest.raises(ClippingError, match="shape"):
        clip_delta(dict(received, b=np.zeros(4, np.float32)), received, NAMES, 1.0)
    for bound in (0.0, -1.0, math.inf, math.nan):
        with pytest.raises(ClippingError, match="clip norm"):
            clip_delta(received, received, NAMES, bound)


def _chi2_bounds(n: int) -> tuple[float, float]:
    """Where (n - 1) s^2 / sigma^2 of n normal samples falls with probability 1 - ALPHA."""
    return stats.chi2.ppf(ALPHA / 2, n - 1), stats.chi2.ppf(1 - ALPHA / 2, n - 1)


@pytest.mark.parametrize("config", [FIXED, DPConfig(dp=True, dp_count_stddev=5.0)], ids=["fixed", "adaptive"])
def test_the_noise_on_a_round_of_zero_updates_has_std_z_c_over_n(config):
    """Rounds whose every device sent the base back: the new base minus the old is the noise over
    the expected cohort alone. Its sample variance over 400 rounds x 40 coordinates passes a
    two-sided chi-square test at ALPHA, its mean a z-test at ALPHA: a correct mechanism fails
    either with probability below 2 x ALPHA. With adaptive clipping the deltas' share of the
    noise is z_delta = (z^-2 - (2 sigma_b)^-2)^-1/2, not z."""
    rng = np.random.default_rng()  # OS entropy, as the server's
    base = {n: np.zeros(s, np.float32) for n, s in LAYOUT}  # zero: the float32 result holds the noise
    clip, cohort, reporting = 0.5, 20, 13
    expected_std = config.noise(cohort).delta_multiplier * clip / cohort
    if config.adaptive:
        assert expected_std == pytest.approx(((1.0**-2 - 10.0**-2) ** -0.5) * clip / cohort)
    samples = []
    for _ in range(400):
        new, report = dp_aggregate(LAYOUT, base, [(base, True)] * reporting, clip, config, cohort, rng)
        samples.append(np.concatenate([new[n].astype(np.float64).ravel() for n in NAMES if "running_var" not in n]))
        assert report.updates == reporting
    x = np.concatenate(samples)
    lo, hi = _chi2_bounds(x.size)
    statistic = (x.size - 1) * x.var(ddof=1) / expected_std**2
    assert lo < statistic < hi, f"sample std {x.std(ddof=1):.6g}, expected {expected_std:.6g}"
    assert abs(x.mean()) / (expected_std / math.sqrt(x.size)) < stats.norm.ppf(1 - ALPHA / 2)


def test_the_noised_count_has_the_configured_std():
    """The adaptive clip's count of unclipped devices: (share - 1/2) x n is the centred count plus
    N(0, sigma_b^2); over 3000 rounds of 10 devices of which 7 unclipped, chi-square at ALPHA."""
    rng = np.random.default_rng()
    config = DPConfig(dp=True, dp_count_stddev=2.5)
    layout = [("w", (1,))]
    base = {"w": np.zeros(1, np.float32)}
    cohort = 10
    shares = []
    for _ in range(3000):
        uploads = [(base, True)] * 7 + [(base, False)] * 3
        shares.append(dp_aggregate(layout, base, uploads, 1.0, config, cohort, rng)[1].unclipped_share)
    noise = (np.array(shares) - 0.5) * cohort - (7 * 0.5 - 3 * 0.5)
    lo, hi = _chi2_bounds(noise.size)
    assert lo < (noise.size - 1) * noise.var(ddof=1) / 2.5**2 < hi
    assert abs(noise.mean()) / (2.5 / math.sqrt(noise.size)) < stats.norm.ppf(1 - ALPHA / 2)


def test_without_noise_the_mean_divides_by_the_expected_cohort_with_equal_weights():
    rng = np.random.default_rng(3)
    base = _base(rng)
    uploads = [clip_delta(_moved(base, rng, 0.1), base, NAMES, 0.3) for _ in range(4)]
    config = DPConfig(dp=True, dp_noise_multiplier=0, dp_clip_learning_rate=0)
    new, report = dp_aggregate(LAYOUT, base, [(u.tensors, u.unclipped) for u in uploads], 0.3, config, 10, rng)
    for n in NAMES:
        deltas = sum(u.tensors[n].astype(np.float64) - base[n].astype(np.float64) for u in uploads)
        np.testing.assert_allclose(new[n], base[n] + deltas / 10, rtol=1e-6, atol=1e-7)
    assert report.noise_stddev == 0 and report.next_clip == 0.3 and report.unclipped_share is None


def test_an_update_beyond_the_clip_is_refused():
    rng = np.random.default_rng(4)
    base = _base(rng)
    far = _moved(base, rng, 1.0)
    with pytest.raises(ClipExceededError, match="above the round's clip"):
        dp_aggregate(LAYOUT, base, [(far, False)], 0.5, FIXED, 10, rng)
    within = clip_delta(far, base, NAMES, 0.5).tensors
    dp_aggregate(LAYOUT, base, [(within, False)], 0.5, FIXED, 10, rng)


def test_noise_that_takes_a_variance_below_zero_is_cut_at_zero():
    rng = np.random.default_rng(5)
    base = {n: np.zeros(s, np.float32) for n, s in LAYOUT}
    config = DPConfig(dp=True, dp_noise_multiplier=10, dp_clip_learning_rate=0)
    new, report = dp_aggregate(LAYOUT, base, [], 1.0, config, 1, rng)
    assert new["bn.running_var"].min() >= 0 and report.variances_zeroed > 0
    assert new["w"].min() < 0  # other tensors keep their sign


@pytest.mark.parametrize("quantile", [0.2, 0.5, 0.8])
def test_adaptive_clipping_converges_to_the_target_quantile(quantile):
    """Without noise, devices whose delta norms are spread log-uniformly over [0.1, 10]: the clip
    settles where the target share of them is unclipped (Andrew et al.'s geometric update)."""
    rng = np.random.default_rng(6)
    config = DPConfig(dp=True, dp_noise_multiplier=0, dp_clip=0.05, dp_target_quantile=quantile)
    layout = [("w", (1,))]
    base = {"w": np.zeros(1, np.float32)}
    clip, shares = 0.05, []
    for _ in range(300):
        norms = np.exp(rng.uniform(math.log(0.1), math.log(10), 50))
        uploads = [clip_delta({"w": np.array([v], np.float32)}, base, ["w"], clip) for v in norms]
        _, report = dp_aggregate(layout, base, [(u.tensors, u.unclipped) for u in uploads], clip, config, 50, rng)
        clip = report.next_clip
        shares.append(report.unclipped_share)
    target = math.exp(math.log(0.1) + quantile * (math.log(10) - math.log(0.1)))  # the quantile's norm
    assert clip == pytest.approx(target, rel=0.25)
    assert np.mean(shares[-100:]) == pytest.approx(quantile, abs=0.03)


def test_the_noise_split_and_its_limits():
    config = DPConfig(dp=True, dp_noise_multiplier=1.0)
    split = config.noise(100)  # sigma_b = 5: z_delta = (1 - 1/100)^-1/2
    assert split.count_stddev == 5.0
    assert split.delta_multiplier == pytest.approx(1 / math.sqrt(0.99))
    assert FIXED.noise(100).delta_multiplier == 1.0 and FIXED.noise(100).count_stddev == 0
    with pytest.raises(ConfigError, match="count's noise std above z/2"):
        DPConfig(dp=True, dp_noise_multiplier=1.0).noise(3)  # sigma_b = 0.15 < 0.5


@pytest.mark.parametrize(
    ("field", "value"),
    [("dp_noise_multiplier", -1), ("dp_noise_multiplier", math.inf), ("dp_clip", 0), ("dp_clip_learning_rate", -0.1),
     ("dp_target_quantile", 1), ("dp_count_stddev", 0), ("dp_delta", 1), ("target_epsilon", 0)],
)  # fmt: skip
def test_bad_settings_name_the_option(field, value):
    with pytest.raises(ConfigError, match="--" + field.replace("_", "-")):
        DPConfig(dp=True, **{field: value})


def test_default_delta_is_below_one_over_the_population():
    assert DPConfig().delta(1000) == pytest.approx(1000**-1.1)
    assert DPConfig(dp_delta=1e-7).delta(1000) == 1e-7
    with pytest.raises(ConfigError, match="give one"):
        DPConfig().delta(1)


def test_epsilon_reproduces_tensorflow_privacys_reference():
    """tensorflow/privacy's compute_dp_sgd_privacy_test: 60,000 examples, batch 150, noise 1.3,
    15 epochs, delta 1e-5 give epsilon 0.7242234026109595 (its RDP accountant, Poisson sampling)."""
    assert epsilon(1.3, 150 / 60000, 15 * 60000 // 150, 1e-5) == pytest.approx(0.7242234026109595, rel=1e-9)


def test_epsilon_reproduces_the_tff_tutorials_cohort():
    """TensorFlow Federated's "Differential Privacy in TFF" tutorial: 3,383 clients, 100 rounds,
    noise multiplier 0.01 x clients per round, delta 1e-5: (2, 1e-5)-DP needs 120 clients a
    round with noise multiplier 1.2. The smallest cohort our accountant allows is the same."""

    def eps(clients: int) -> float:
        return epsilon(clients * 0.01, clients / 3383, 100, 1e-5)

    assert eps(120) <= 2 < eps(119)


@pytest.mark.parametrize(("z", "q", "rounds"), [(1.0, 0.1, 12), (0.7, 0.03, 30), (2.0, 1.0, 5)])
def test_epsilon_equals_dp_accountings_round_by_round_composition(z, q, rounds):
    """The one-shot self-composition equals composing each round's event as it happens (how a
    server that accounts round by round would use the library), and the PLD accountant, a
    different method, is tighter, never looser, than the RDP bound reported."""
    accountant = dp_accounting.rdp.RdpAccountant()
    for _ in range(rounds):
        accountant.compose(round_event(z, q))
    assert epsilon(z, q, rounds, 1e-5) == pytest.approx(accountant.get_epsilon(1e-5), rel=1e-12)
    pld = dp_accounting.pld.PLDAccountant()
    pld.compose(dp_accounting.SelfComposedDpEvent(round_event(z, q), rounds))
    assert pld.get_epsilon(1e-5) <= epsilon(z, q, rounds, 1e-5)


def test_a_budget_grows_with_rounds_and_stops_at_its_target():
    budget = PrivacyBudget(1.0, 0.1, 1e-5, target_epsilon=3.0)  # epsilon 2.9 after 5 rounds, 3.4 after 10
    spent = [budget.epsilon(r) for r in range(0, 12)]
    assert spent[0] == 0 and all(a < b for a, b in itertools.pairwise(spent))
    last = max(r for r in range(12) if spent[r] <= 3.0)
    assert 5 <= last < 10
    assert budget.allows(last) and not budget.allows(last + 1)
    assert PrivacyBudget(0.0, 0.1, 1e-5).to_dict(3)["epsilon"] is None  # no noise: infinite, null in JSON
    with pytest.raises(ConfigError, match="sampling probability"):
        PrivacyBudget(1.0, 0.0, 1e-5)


def test_the_smallest_noise_multiplier_is_exact_to_the_hundredth_and_refuses_a_target_out_of_reach() -> None:
    for target, rounds in ((8.0, 20), (2.0, 50), (0.5, 1)):
        z = smallest_noise_multiplier(target, 0.1, rounds, 1e-5)
        assert epsilon(z, 0.1, rounds, 1e-5) <= target < epsilon(round(z - 0.01, 2), 0.1, rounds, 1e-5)
    with pytest.raises(ConfigError, match="no noise multiplier up to 100 keeps epsilon within 0.001"):
        smallest_noise_multiplier(0.001, 1.0, 10_000, 1e-9)
