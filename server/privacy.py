"""DP-FedAvg on the server (docs/PRIVACY.md): the open round's clip, the noised aggregate of a
round, and what the run has spent.

Durable in the database (:class:`fedper.common.dp.state.DPState`), written in the transaction
that closes (or abandons) a round: the clip the next round asks for, the number of rounds whose noised aggregate was
computed (a refused one counts too: the refusal was decided on the noised result, and it is
visible), and delta, fixed by the first noised round (``--dp-delta``, else N^-1.1 for the N
devices enrolled then), so epsilon is reported at one delta for the whole run.
"""

from __future__ import annotations

import json
import logging
import math
import secrets
from collections.abc import Iterable, Mapping, Sequence

import numpy as np

from fedper.common.dp.accountant import PrivacyBudget, largest_cohort
from fedper.common.dp.mechanism import Contribution, DPReport, dp_aggregate, noised_mean
from fedper.common.dp.state import DPState
from fedper.common.protocol import DPTask, PrivacySpent
from fedper.common.weights import TensorSpec
from fedper.server.config import ServerConfig
from fedper.server.storage import Database, Transaction

log = logging.getLogger("fedper.server")


class ServerPrivacy:
    def __init__(self, config: ServerConfig, db: Database) -> None:
        self.config, self.dp, self.db = config, config.privacy, db
        self._refused_clip = False

    def clip(self) -> float:
        """The L2 bound of the open round's deltas. A stored clip that is not a finite number
        above 0 (written by a server before revision 1.7, which did not bound the adaptive step)
        is refused: the first clip is used instead, and the refusal logged."""
        stored = self.db.dp_state().clip
        if stored is None:
            return self.dp.dp_clip
        if math.isfinite(stored) and stored > 0:
            return stored
        if not self._refused_clip:
            self._refused_clip = True
            log.error(json.dumps({"event": "dp_clip_refused", "stored": repr(stored), "using": self.dp.dp_clip}))
        return self.dp.dp_clip

    def task(self) -> DPTask:
        return DPTask(clip_norm=self.clip())

    def rounds(self) -> int:
        return self.db.dp_state().rounds

    def delta(self) -> float:
        """The run's delta: fixed by the first noised round; before it, what it would be now."""
        fixed = self.db.dp_state().delta
        return fixed if fixed is not None else self.dp.delta(max(2, self.db.count_devices()))

    def budget(self) -> PrivacyBudget:
        return PrivacyBudget(
            self.dp.dp_noise_multiplier, self.dp.dp_sampling_probability, self.delta(), self.dp.target_epsilon
        )

    def aggregate(
        self, layout: Sequence[TensorSpec], base: dict[str, np.ndarray], uploads: Iterable[Contribution]
    ) -> tuple[dict[str, np.ndarray], DPReport]:
        """The round's noised mean, with noise from a generator seeded by the OS's entropy."""
        rng = np.random.default_rng(secrets.randbits(128))
        return dp_aggregate(layout, base, uploads, self.clip(), self.dp, self.config.cohort, rng, group=1,
                            max_devices=self.max_devices())  # fmt: skip

    def aggregate_sum(
        self,
        layout: Sequence[TensorSpec],
        base: dict[str, np.ndarray],
        sums: Mapping[str, np.ndarray],
        count: int,
        unclipped: int,
        sensitivity: float,
    ) -> tuple[dict[str, np.ndarray], DPReport]:
        """The noised mean of a sum the server could only see whole (a secure round): ``count``
        deltas, ``unclipped`` of them within the clip before clipping, each within
        ``sensitivity`` (the clip plus the encoding's rounding)."""
        rng = np.random.default_rng(secrets.randbits(128))
        return noised_mean(layout, base, sums, count, unclipped - count / 2, self.clip(), self.dp,
                           self.config.cohort, rng, sensitivity, self.max_devices())  # fmt: skip

    def max_devices(self) -> int:
        """B: the most devices the draw gives (each on its coin of probability q) from the
        population the expected cohort implies (cohort / q), but with probability 1e-9; the
        mechanism projects a larger sum back to B devices' worth."""
        q = self.dp.dp_sampling_probability
        return largest_cohort(math.ceil(self.config.cohort / q - 1e-9), q)

    def record(self, tx: Transaction, report: DPReport) -> bool:
        """Count the round and take the next clip (in the caller's transaction); False when the
        next round would take epsilon above the target, so the run must finish."""
        spent = self.rounds() + 1
        self.db.set_dp_state(tx, DPState(clip=report.next_clip, rounds=spent, delta=self.delta()))
        return self.budget().allows(spent + 1)

    def spent(self) -> PrivacySpent:
        budget, rounds = self.budget(), self.rounds()
        return PrivacySpent(
            epsilon=budget.reported(rounds), delta=budget.delta, rounds=rounds,
            noise_multiplier=budget.noise_multiplier, sampling_probability=budget.sampling_probability,
            clip_norm=self.clip(), target_epsilon=budget.target_epsilon,
        )  # fmt: skip
