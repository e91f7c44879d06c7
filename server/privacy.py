"""DP-FedAvg's state on the server (docs/PRIVACY.md), durable in the database, and what the run
has spent. The mechanism itself is the round mode's (:class:`fedper.common.strategy.dp_fedavg.DPFedAvg`).

The state is written in the transaction that closes (or abandons) a round and read back before
every use, so the mode never runs ahead of the database: the clip the next round asks for, the
number of rounds whose noised aggregate was computed (a refused one counts too: the refusal was
decided on the noised result, and it is visible), and delta, fixed by the first noised round
(``--dp-delta``, else N^-1.1 for the N devices enrolled then), so epsilon is reported at one
delta for the whole run.
"""

from __future__ import annotations

import json
import logging
import math
import sqlite3

from fedper.common.dp.state import DPState
from fedper.common.protocol import DPTask, PrivacySpent
from fedper.common.strategy.dp_fedavg import DPFedAvg
from fedper.common.strategy.round_strategy import RoundResult
from fedper.server.storage import Database

log = logging.getLogger("fedper.server")
CLIP_KEY = "dp_clip"  # the clip of the open round (and the next, until a round closes)
ROUNDS_KEY = "dp_rounds"  # noised rounds so far
DELTA_KEY = "dp_delta"


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
        clip_text, rounds, delta = self.db.get_meta(CLIP_KEY), self.db.get_meta(ROUNDS_KEY), self.db.get_meta(DELTA_KEY)
        clip = None
        if clip_text is not None:
            try:
                stored = float(clip_text)
            except ValueError:
                stored = math.nan
            if math.isfinite(stored) and stored > 0:
                clip = stored
            elif not self._refused_clip:
                self._refused_clip = True
                used = self._mode.config.dp_clip
                log.error(json.dumps({"event": "dp_clip_refused", "stored": clip_text, "using": used}))
        return DPState(clip, int(rounds) if rounds is not None else 0, float(delta) if delta is not None else None)

    def clip(self) -> float:
        return self.mode().clip()

    def task(self) -> DPTask:
        return DPTask(clip_norm=self.clip())

    def record(self, conn: sqlite3.Connection, result: RoundResult) -> bool:
        """Count the noised round and keep the next clip (in the caller's transaction); False
        when the next round would take epsilon above the target, so the run must finish."""
        mode = self.mode()
        allowed = mode.record(result)
        state = mode.state
        assert state.clip is not None and state.delta is not None
        if self.db.get_meta(DELTA_KEY) is None:
            self.db.set_meta(conn, DELTA_KEY, repr(state.delta))
        self.db.set_meta(conn, ROUNDS_KEY, str(state.rounds))
        self.db.set_meta(conn, CLIP_KEY, repr(state.clip))
        return allowed

    def spent(self) -> PrivacySpent:
        mode = self.mode()
        budget, rounds = mode.budget(), mode.state.rounds
        return PrivacySpent(
            epsilon=budget.reported(rounds), delta=budget.delta, rounds=rounds,
            noise_multiplier=budget.noise_multiplier, sampling_probability=budget.sampling_probability,
            clip_norm=mode.clip(), target_epsilon=budget.target_epsilon,
        )  # fmt: skip
