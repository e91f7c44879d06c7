"""What the round jobs share (:mod:`server.admission`, :mod:`server.closing`,
:mod:`server.run_lifecycle`): the run's stores, its round mode, one lock, and the snapshot that
readers see.

Every transition is one transaction, and the :class:`Snapshot` is re-read from the database after
every commit, whether the commit or what followed it failed or not: memory never runs ahead of or
behind the database. Time comes from an injected clock.

Several processes may share one PostgreSQL database (docs/SCALING.md): then the snapshot is also
re-read on each tick of the clock (another process's commits do not tell this one), every decision
that matters is checked again inside the transaction that acts on it (each holds the database's
write lock), and one process at a time closes a round: it seals the round with a lease and a
fencing token first (:mod:`server.storage.closers`).
"""

from __future__ import annotations

import contextlib
import json
import logging
import math
import os
import secrets
import socket
import threading
import time
from collections.abc import Callable, Iterator
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
from fedper.server.rate_limit import WINDOW
from fedper.server.refusals import DrainingError, RoundClosingError, RoundNotOpenError, RunFinishedError
from fedper.server.round_refusals import RoundRefusals
from fedper.server.secure_round import SecureRounds
from fedper.server.storage import Database, Round, RoundEnding, RoundState, RunState, StorageError
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


def quorum(config: ServerConfig) -> Quorum:
    """When a round closes: at ``--target-clients`` updates (at a root: once every region's sum is
    in), or at the deadline with ``--min-clients``."""
    if config.regions:
        return Quorum(config.min_clients, config.regions)
    return Quorum(config.min_clients, config.target_clients)


class FencedError(Exception):
    """This process no longer holds the round it was closing (its lease ran out and another
    process took the round over, or the round ended meanwhile): it publishes nothing."""


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
            config.aggregation, config.privacy, quorum(config),
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
        self._rate_events_pruned = 0.0
        self.holder = f"{socket.gethostname()}:{os.getpid()}:{secrets.token_hex(4)}"  # this process, as a closer

    def ending(self, number: int) -> RoundEnding:
        """What round ``number``'s record keeps when it ends besides the database's rows: its
        refusals, and how many slots fill its cohort (0: under DP or secure aggregation the
        draw fixes the cohort)."""
        drawn = self.config.privacy.dp or self.config.secure.secagg
        return RoundEnding(self.refusals.unshared_of(number), 0 if drawn else self.config.slots)

    def forget_rate_events(self) -> None:
        """Drop rate-limit events older than every window (:class:`server.rate_limit.SharedRateLimiter`)
        and expired attestation nonces, once a minute."""
        now = time.time()
        if now - self._rate_events_pruned < WINDOW:
            return
        self._rate_events_pruned = now
        with self.db.transaction() as tx:
            self.db.rate_events.prune(tx, now - WINDOW)
            self.db.nonces.prune(tx, now)

    def share_counts(self) -> None:
        """Add this process's refusals of the open round to the database's (other processes that
        close the round read them there); a failure keeps them for the next tick."""
        number, counts = self.refusals.unshared()
        if not counts:
            return
        try:
            with self.db.transaction() as tx:
                self.db.rounds.add_refusals(tx, number, counts)
        except StorageError as exc:
            log.warning(json.dumps({"event": "refusals_not_shared", "round": number, "error": str(exc)}))
            return
        self.refusals.shared(number, counts)

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
            received=self.count_received(current.round) if current.state == RoundState.OPEN else 0,
            rounds_closed=self.db.rounds.count_closed(),
            opened_at=current.opened_at,
        )

    def count_received(self, number: int) -> int:
        """What round ``number`` holds towards its quorum: its updates, or at a root its regions' sums."""
        return self.db.regions.count(number) if self.config.regions else self.db.rounds.count_updates(number)

    def open_round(self, number: int) -> Round:
        """Round ``number`` if it is the open one and not being closed; else why not (410, 409
        ``round_not_open``)."""
        if self.finished():
            raise RunFinishedError()
        current = self.db.rounds.latest()
        assert current is not None
        if number != current.round or current.state != RoundState.OPEN:
            raise RoundNotOpenError(f"round {number} is not open (the open round is {current.round})")
        if self.db.closers.sealed(number):
            raise RoundClosingError(f"round {number} is being closed: it takes nothing more")
        return current

    # --- one closer per round -----------------------------------------------------------

    def seal(self, number: int) -> int | None:
        """Seal open round ``number`` for this process to close: its fencing token, or None when the
        round is no longer open or another process's lease on it runs."""
        with self.db.transaction() as tx:
            current = self.db.rounds.get(number)
            if current is None or current.state != RoundState.OPEN:
                return None
            return self.db.closers.seal(tx, number, self.holder, self.clock(), self.config.close_lease)

    def fence(self, number: int, token: int) -> None:
        """Inside the transaction that ends round ``number``: FencedError unless this process still
        holds it and it is still open."""
        current = self.db.rounds.get(number)
        if current is None or current.state != RoundState.OPEN or not self.db.closers.holds(number, token):
            raise FencedError(f"round {number} is no longer this process's to close (token {token})")

    def may_end(self, number: int, now: float) -> None:
        """Inside the transaction that ends round ``number`` without having sealed it (the clock
        abandons it, a secure session broke): FencedError unless it is open and no process's lease
        on it runs."""
        current = self.db.rounds.get(number)
        if current is None or current.state != RoundState.OPEN or self.db.closers.lease_live(number, now):
            raise FencedError(f"round {number} is no longer open, or another process is closing it")

    def unsealed(self, number: int) -> None:
        """Inside a transaction: FencedError unless round ``number`` is open and nobody has sealed it."""
        current = self.db.rounds.get(number)
        if current is None or current.state != RoundState.OPEN or self.db.closers.sealed(number):
            raise FencedError(f"round {number} is no longer open, or a process is closing it")

    def unseal(self, number: int, token: int) -> None:
        """The round takes updates again (its close was deferred, or met a full disk)."""
        try:
            with self.db.transaction() as tx:
                self.db.closers.release(tx, number, token)
        except StorageError as exc:  # the lease runs out by itself
            log.warning(json.dumps({"event": "unseal_failed", "round": number, "error": str(exc)}))

    def end_lease(self, number: int, token: int) -> None:
        """Keep round ``number`` sealed but let its lease run out now (a regional server's forwarded
        round: it takes nothing more, and ends when the root's does)."""
        try:
            with self.db.transaction() as tx:
                self.db.closers.renew(tx, number, token, self.clock())
        except StorageError as exc:  # the lease runs out by itself
            log.warning(json.dumps({"event": "lease_end_failed", "round": number, "error": str(exc)}))

    @contextlib.contextmanager
    def lease(self, number: int, token: int) -> Iterator[None]:
        """Renew the lease on round ``number`` every third of it while the block runs (a closer
        that stalls, e.g. a stopped process, stops renewing and is replaced)."""
        done = threading.Event()
        every = self.config.close_lease / 3

        def renew() -> None:
            while not done.wait(every):
                try:
                    with self.db.transaction() as tx:
                        held = self.db.closers.renew(tx, number, token, self.clock() + self.config.close_lease)
                except StorageError as exc:
                    log.warning(json.dumps({"event": "lease_renewal_failed", "round": number, "error": str(exc)}))
                    continue
                if not held:
                    return

        thread = threading.Thread(target=renew, name=f"lease-r{number}", daemon=True)
        thread.start()
        try:
            yield
        finally:
            done.set()
            thread.join()

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
