"""What the round jobs share (:mod:`server.admission`, :mod:`server.closing`,
:mod:`server.run_lifecycle`): the run's stores, its round mode, one lock, and the snapshot that
readers see.

Every transition is one transaction, and the :class:`Snapshot` is re-read from the database after
every commit, whether the commit or what followed it failed or not: memory never runs ahead of or
behind the database. Time comes from an injected clock.
"""

from __future__ import annotations

import json
import logging
import math
import threading
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

from fedper.common.manifest import Manifest
from fedper.common.strategy.modes import Strategy, round_strategy
from fedper.common.strategy.round_strategy import Quorum
from fedper.server.cohort import Cohort
from fedper.server.config import ServerConfig
from fedper.server.disk_room import DiskRoom
from fedper.server.metrics_registry import AggregationCounts
from fedper.server.model_store import ModelStore
from fedper.server.privacy import ServerPrivacy
from fedper.server.refusals import DrainingError, RoundNotOpenError, RunFinishedError
from fedper.server.round_refusals import RoundRefusals
from fedper.server.secure_round import SecureRounds
from fedper.server.storage import Database, Round, RoundEnding, RoundState, RunState
from fedper.server.update_store import UpdateStore

log = logging.getLogger("fedper.server")
Clock = Callable[[], float]


@dataclass(frozen=True)
class Snapshot:
    """What readers need, replaced whole after every commit."""

    finished: bool
    round: int
    state: RoundState  # of that round
    model_version: int
    deadline: float | None
    received: int
    rounds_closed: int
    opened_at: float = 0.0  # of that round

    @property
    def is_open(self) -> bool:
        return self.state == RoundState.OPEN


class RoundContext:
    def __init__(
        self, config: ServerConfig, manifest: Manifest, db: Database, data_dir: Path, clock: Clock, disk: DiskRoom
    ) -> None:
        self.config, self.db, self.clock, self.disk = config, db, clock, disk
        self.layout = manifest.layout("base")
        self.store = UpdateStore(data_dir, self.layout)
        self.models = ModelStore(db, data_dir / "models", self.layout, self.store)
        self.cohort = Cohort(config, db)
        words = sum(math.prod(shape) for _, shape in self.layout)
        self.strategy: Strategy = round_strategy(
            config.aggregation, config.privacy, Quorum(config.min_clients, config.target_clients),
            expected_cohort=config.cohort, sampling_probability=config.privacy.dp_sampling_probability,
            population=db.devices.count, secure_words=words if config.secure.secagg else None,
            max_update_norm=config.max_update_norm,
        )  # fmt: skip
        private = self.strategy.private
        self.privacy = ServerPrivacy(private, db) if private is not None else None
        self.secure: SecureRounds | None = None
        if config.secure.secagg:
            dp_clip = self.privacy.clip if self.privacy is not None else None
            self.secure = SecureRounds(config.secure, db, words, self.store.updates_dir, dp_clip)
            self.cohort.on_draw = self.secure.begin
        self.lock = threading.RLock()
        self.snapshot = Snapshot(False, 0, RoundState.OPEN, 0, None, 0, 0)
        self.draining: str | None = None  # why the server takes no uploads (server.disk_room)
        self.aggregation_seconds = 0.0
        self.aggregation_counts = AggregationCounts()  # since this process started
        self.rounds_refused = 0  # aggregates not published (server.publish_check)
        self.refusals = RoundRefusals()

    def ending(self, number: int) -> RoundEnding:
        """What round ``number``'s record keeps when it ends besides the database's rows: its
        refusals, and how many slots fill its cohort (0: under DP or secure aggregation the
        draw fixes the cohort)."""
        drawn = self.config.privacy.dp or self.config.secure.secagg
        return RoundEnding(self.refusals.of(number), 0 if drawn else self.config.slots)

    def round_mode(self) -> Strategy:
        """The round mode, with its DP state as the database holds it."""
        if self.privacy is not None:
            self.privacy.mode()
        return self.strategy

    def finished(self) -> bool:
        return self.db.run_state() == RunState.FINISHED

    def deadline(self, now: float) -> float | None:
        return now + self.config.round_timeout if self.config.round_timeout > 0 else None

    def refresh(self) -> None:
        """The snapshot, read from the database (called after every commit, also after failures)."""
        current = self.db.rounds.latest()
        assert current is not None
        self.snapshot = Snapshot(
            finished=self.finished(),
            round=current.round,
            state=current.state,
            model_version=current.model_version,
            deadline=current.deadline,
            received=self.db.rounds.count_updates(current.round) if current.state == RoundState.OPEN else 0,
            rounds_closed=self.db.rounds.count_closed(),
            opened_at=current.opened_at,
        )

    def open_round(self, number: int) -> Round:
        """Round ``number`` if it is the open one; else why not (410, 409 ``round_not_open``)."""
        if self.finished():
            raise RunFinishedError()
        current = self.db.rounds.latest()
        assert current is not None
        if number != current.round or current.state != RoundState.OPEN:
            raise RoundNotOpenError(f"round {number} is not open (the open round is {current.round})")
        return current

    def pace(self) -> int:
        """Retry-After for a device that has no task in the open round (pace steering)."""
        snap = self.snapshot
        return self.cohort.retry_after(snap.round, snap.opened_at, snap.deadline, self.clock())

    def drain(self, why: str) -> None:
        if self.draining is None:
            what = (
                "downloads and status only: no enrollments, tasks or uploads, no round closes until the disk has room"
            )
            log.error(json.dumps({"event": "draining", "reason": why, "what": what}))
        self.draining = why

    def busy(self) -> DrainingError:
        """The one 503 of a draining server."""
        message = f"the server is draining ({self.draining}); nothing was stored, retry later"
        return DrainingError(message, self.pace())

    def out_of_space(self, exc: BaseException) -> DrainingError:
        """Drain, and the 503 for the request that met the full disk."""
        self.drain(f"a write failed: {exc}")
        return self.busy()
