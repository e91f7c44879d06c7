"""What a DP-FedAvg run spends: epsilon at delta, from Google's ``dp-accounting`` (its RDP
accountant, add-or-remove-one-device adjacency).

Each round is one Poisson-subsampled Gaussian mechanism (Mironov, Talwar and Zhang, "Rényi
Differential Privacy of the Sampled Gaussian Mechanism", 2019): every device takes part
independently with probability q, and the noise multiplier is z (adaptive clipping's two
queries compose to exactly z, :meth:`fedper.common.dp.config.DPConfig.noise`). A run of T
rounds is T of them composed. Which sampling makes q true is the caller's to say
(docs/PRIVACY.md): the simulation draws each client with probability q; the server flips a coin
of probability q for each device that checks in.

Where the library's series for a fractional Rényi order does not converge it leaves that order
out, with a warning per order on the ``absl`` logger; epsilon is then the minimum over the
remaining orders, still an upper bound (only possibly a looser one), so those warnings are
silenced here.
"""

from __future__ import annotations

import logging
import math
from dataclasses import dataclass
from functools import lru_cache

import dp_accounting
from dp_accounting.rdp import RdpAccountant

from fedper.common.errors import ConfigError

COHORT_TAIL = 1e-9  # the chance that the assumed sampling draws more devices than largest_cohort


def largest_cohort(population: int, sampling_probability: float) -> int:
    """The most devices the sampling the accountant assumes draws from ``population``, but with
    probability COHORT_TAIL: each device on its own coin of probability q, so the count is
    Binomial(population, q) (q = 1: everyone). What more devices than that contribute is more
    than the assumed sampling gives: the mechanism projects their sum back (mechanism.noised_mean)."""
    if population < 1:
        raise ConfigError(f"a population of {population} devices has no cohort")
    if sampling_probability >= 1:
        return population
    from scipy.stats import binom

    return int(binom.isf(COHORT_TAIL, population, sampling_probability))


def round_event(noise_multiplier: float, sampling_probability: float) -> dp_accounting.DpEvent:
    """One round: the Gaussian mechanism on a Poisson sample (or on everyone, q = 1)."""
    gaussian = dp_accounting.GaussianDpEvent(noise_multiplier)
    if sampling_probability >= 1:
        return gaussian
    return dp_accounting.PoissonSampledDpEvent(sampling_probability, gaussian)


def run_event(noise_multiplier: float, sampling_probability: float, rounds: int) -> dp_accounting.DpEvent:
    return dp_accounting.SelfComposedDpEvent(round_event(noise_multiplier, sampling_probability), rounds)


@lru_cache(maxsize=1024)
def epsilon(noise_multiplier: float, sampling_probability: float, rounds: int, delta: float) -> float:
    """epsilon after ``rounds`` rounds at ``delta`` (0 before any round, inf without noise)."""
    if rounds == 0:
        return 0.0
    if noise_multiplier == 0:
        return math.inf
    accountant = RdpAccountant(neighboring_relation=dp_accounting.NeighboringRelation.ADD_OR_REMOVE_ONE)
    absl = logging.getLogger("absl")
    level = absl.level
    absl.setLevel(logging.ERROR)  # "failed to converge ... excluding this order" (see above)
    try:
        accountant.compose(run_event(noise_multiplier, sampling_probability, rounds))
        return float(accountant.get_epsilon(delta))
    finally:
        absl.setLevel(level)


def smallest_noise_multiplier(target: float, sampling_probability: float, rounds: int, delta: float) -> float:
    """The smallest noise multiplier, in hundredths, whose epsilon after ``rounds`` rounds is at
    most ``target`` (epsilon falls as the noise grows: a bisection over the hundredths)."""
    lo, hi = 0, 10_000  # hi/100 = 100 is enough for any target a run would set
    if epsilon(hi / 100, sampling_probability, rounds, delta) > target:
        raise ConfigError(f"no noise multiplier up to {hi / 100:g} keeps epsilon within {target:g}")
    while hi - lo > 1:
        mid = (lo + hi) // 2
        lo, hi = (lo, mid) if epsilon(mid / 100, sampling_probability, rounds, delta) <= target else (mid, hi)
    return hi / 100


@dataclass(frozen=True)
class PrivacyBudget:
    """A run's accounting: its mechanism's parameters, delta and the epsilon it may not exceed."""

    noise_multiplier: float
    sampling_probability: float
    delta: float
    target_epsilon: float | None = None

    def __post_init__(self) -> None:
        if not 0 < self.sampling_probability <= 1:
            raise ConfigError(f"the sampling probability must be in (0, 1], got {self.sampling_probability}")

    def epsilon(self, rounds: int) -> float:
        return epsilon(self.noise_multiplier, self.sampling_probability, rounds, self.delta)

    def allows(self, rounds: int) -> bool:
        """Whether ``rounds`` rounds stay within the target epsilon (always, without one)."""
        return self.target_epsilon is None or self.epsilon(rounds) <= self.target_epsilon

    def reported(self, rounds: int) -> float | None:
        """epsilon as JSON carries it: null for infinity (no noise)."""
        spent = self.epsilon(rounds)
        return spent if math.isfinite(spent) else None

    def to_dict(self, rounds: int) -> dict[str, object]:
        """For results.json."""
        return {
            "epsilon": self.reported(rounds), "delta": self.delta, "rounds": rounds,
            "noise_multiplier": self.noise_multiplier, "sampling_probability": self.sampling_probability,
            "target_epsilon": self.target_epsilon, "accountant": "rdp (dp-accounting), add-or-remove-one device",
        }  # fmt: skip
