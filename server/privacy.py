"""DP-FedAvg's state on the server (docs/PRIVACY.md), durable in the database, and what the run
has spent. The mechanism is the round mode's (:class:`fedper.common.strategy.dp_fedavg.DPFedAvg`).

The state (:class:`fedper.common.dp.state.DPState`, typed columns of the database) is written in
the transaction that closes (or abandons) a round and read back before every use, so the mode
never runs ahead of the database: the clip the next round asks for, the number of rounds whose
noised aggregate was computed (a refused one counts too: the refusal was decided on the noised
result, and it is visible), and delta, fixed by the first noised round (``--dp-delta``, else
N^-1.1 for the N devices enrolled then), so epsilon is reported at one delta for the whole run.
"""

from __future__ import annotations

import json
import logging
import math
from dataclasses import replace

from fedper.common.dp.state import DPState
from fedper.common.protocol import DPTask, PrivacySpent
from fedper.common.strategy.dp_fedavg import DPFedAvg
from fedper.common.strategy.round_strategy import RoundResult
from fedper.server.storage import Database, Transaction

log = logging.getLogger("fedper.server")


class ServerPrivacy:
    def __init__(self, mode: DPFedAvg, db: Database) -> None:
        self._mode, self.db = mode, db
        self._refused_clip = False

    def mode(self) -> DPFedAvg:
        """The DP mode, at the state the database holds."""
        self._mode.state = self._load()
        return self._mode

    def _load(self) -> DPState:
        """A stored clip that is not a finite number above 0 is refused: the first clip is used
        instead, and the refusal logged."""
        state = self.db.dp_state()
        stored = state.clip
        if stored is None or (math.isfinite(stored) and stored > 0):
            return state
        if not self._refused_clip:
            self._refused_clip = True
            used = self._mode.config.dp_clip
            log.error(json.dumps({"event": "dp_clip_refused", "stored": repr(stored), "using": used}))
        return replace(state, clip=None)

    def clip(self) -> float:
        return self.mode().clip()

    def task(self) -> DPTask:
        return DPTask(clip_norm=self.clip())

    def record(self, tx: Transaction, result: RoundResult) -> bool:
        """Count the noised round and keep the next clip (in the caller's transaction); False
        when the next round would take epsilon above the target, so the run must finish."""
        mode = self.mode()
        allowed = mode.record(result)
        self.db.set_dp_state(tx, mode.state)
        return allowed

    def spent(self) -> PrivacySpent:
        mode = self.mode()
        budget, rounds = mode.budget(), mode.state.rounds
        return PrivacySpent(
            epsilon=budget.reported(rounds), delta=budget.delta, rounds=rounds,
            noise_multiplier=budget.noise_multiplier, sampling_probability=budget.sampling_probability,
            clip_norm=mode.clip(), target_epsilon=budget.target_epsilon,
        )  # fmt: skip
