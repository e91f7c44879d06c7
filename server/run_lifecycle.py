"""The run's lifecycle: start (or resume where the database says), round 1's clock, stop,
rollback, and draining while the disk is full.

A round is ``open`` until it becomes ``closed`` (aggregated into version v+1), ``abandoned``
(deadline with fewer than ``min_clients``, a refused aggregate, a rollback) or ``stopped``
(operator); the run is ``running`` until ``rounds_total`` rounds closed or the operator stopped it.
"""

from __future__ import annotations

import contextlib
import json
import logging
import math
from collections.abc import Callable
from pathlib import Path

from fedper.common.errors import ConfigError
from fedper.common.robust_aggregate import held_bytes
from fedper.server.closing import Closing
from fedper.server.refusals import PrivacyBudgetSpentError, UnknownVersionError
from fedper.server.round_context import FencedError, RoundContext
from fedper.server.storage import RoundState, RunState, StorageError

log = logging.getLogger("fedper.server")

# Other processes sharing the data directory may have files this young in flight: a process that
# starts leaves them (a request's body, a staged update or version, a masked input).
LEFTOVER_AGE = 3600.0


class RunLifecycle:
    def __init__(self, ctx: RoundContext, closing: Closing, follow: Callable[[], None] | None = None) -> None:
        """``follow``: at a regional server, what the clock does instead of closing rounds itself
        (:class:`server.regional_rounds.RegionalRounds`)."""
        self.ctx, self.closing = ctx, closing
        self._decide = follow or closing.tick
        if ctx.secure is None and ctx.privacy is None:
            self._check_memory()

    def start(self, initial_base: Path) -> None:
        """Open round 1 on version 0 at first start; otherwise resume where the database says.
        On a database opened read-only (a full disk), only read it: the server starts draining."""
        ctx = self.ctx
        if ctx.db.read_only:
            ctx.refresh()
            ctx.drain("the database could not be opened for writing (is the disk full?)")
            return
        ctx.models.dir.mkdir(parents=True, exist_ok=True)
        with ctx.lock:
            with ctx.db.transaction() as tx:  # a process that starts at the same time waits for this one
                if ctx.db.versions.get(0) is None:
                    target, sha256 = ctx.models.write_initial(initial_base)
                    now = ctx.clock()
                    waiting = ctx.db.devices.count() < ctx.config.start_devices  # no clock until they come
                    ctx.db.versions.insert(tx, 0, sha256, target.name, now, None)
                    ctx.db.rounds.open(tx, 1, 0, now, None if waiting else ctx.deadline(now))
                    ctx.db.set_run_state(tx, RunState.WAITING if waiting else RunState.RUNNING)
                    log.info(json.dumps({"event": "round_opened", "round": 1, "model_version": 0}))
                if not ctx.db.shared:  # the only process: a seal left is a dead closer's
                    ctx.db.closers.release_all(tx)
            current = ctx.db.rounds.latest()
            assert current is not None
            open_round = current.round if current.state == RoundState.OPEN and not ctx.finished() else None
            if open_round is not None:
                with contextlib.suppress(FencedError):  # another process is closing it: its closer checks
                    for _ in self.closing.stored(open_round):  # quarantines what the loader refuses
                        pass
            referenced = {u.file for u in ctx.db.rounds.updates(open_round)} if open_round is not None else set()
            if ctx.secure is not None and open_round is not None:
                referenced |= ctx.secure.referenced(open_round)
            if open_round is not None:  # at a root, the regions' sums; at a region, its sum being forwarded
                referenced |= {s.file for s in ctx.db.regions.sums(open_round)}
                if ctx.db.regions.forwarded(open_round) is not None:
                    referenced.add(ctx.store.forwarded_sum(open_round))
            min_age = LEFTOVER_AGE if ctx.db.shared else 0.0
            ctx.store.remove_leftovers(open_round, {f for f in referenced if f is not None}, min_age)
            ctx.models.remove_unrecorded(ctx.db.shared)
            ctx.refresh()
        self.enrolled()  # enough devices may have enrolled before a restart
        self.tick()  # a deadline that passed while we were down, or a full round not yet closed

    def enrolled(self) -> None:
        """After an enrollment: start round 1's clock once ``--start-devices`` devices have enrolled."""
        ctx = self.ctx
        if ctx.db.run_state() != RunState.WAITING or ctx.db.devices.count() < ctx.config.start_devices:
            return
        with ctx.lock:
            if ctx.db.run_state() != RunState.WAITING:
                return
            now = ctx.clock()
            try:
                with ctx.db.transaction() as tx:
                    ctx.db.rounds.start_clock(tx, 1, now, ctx.deadline(now))
                    ctx.db.set_run_state(tx, RunState.RUNNING)
            finally:
                ctx.refresh()
        log.info(json.dumps({"event": "round_clock_started", "round": 1, "devices": ctx.db.devices.count()}))

    def tick(self) -> None:
        """Apply the clock: first enter or leave draining (the disk), then let the closing decide.
        On a database other processes share, first read what they did."""
        ctx = self.ctx
        if ctx.db.shared and not ctx.db.read_only:
            ctx.refresh()
            ctx.share_counts()
            ctx.forget_rate_events()
        self._check_disk()
        if self.ctx.draining is None:
            self._decide()

    def _check_memory(self) -> None:
        """Refuse at start an aggregation that would not fit at close, rather than fail then."""
        config = self.ctx.config
        floats = sum(math.prod(shape) for _, shape in self.ctx.layout)
        need = held_bytes(config.aggregation, floats, config.slots)
        if need > config.aggregation_memory * 2**20:
            raise ConfigError(
                f"--aggregate {config.aggregation.aggregate} holds every update of a round at its close: "
                f"{config.slots} updates of this base ({floats:,} floats) need about {need / 2**20:,.0f} MB, "
                f"more than --aggregation-memory {config.aggregation_memory} MB. Raise it, lower "
                f"--cohort-size, or use --aggregate mean (one update in memory at a time)"
            )

    def _check_disk(self) -> None:
        """Enter or leave draining, by the free space."""
        ctx = self.ctx
        short = ctx.disk.shortage()
        if short is not None:
            ctx.drain(short)
            return
        if ctx.draining is None:
            return
        if ctx.db.read_only:
            try:
                ctx.db.reopen_writable()
            except StorageError as exc:
                ctx.draining = f"the database cannot be opened for writing yet: {exc}"
                return
        log.warning(json.dumps({"event": "draining_ended", "was": ctx.draining}))
        ctx.draining = None

    def stop(self) -> None:
        """Finish the run now (operator): the open round is recorded as stopped, not aggregated."""
        ctx = self.ctx
        with ctx.lock:
            current = ctx.db.rounds.latest()
            assert current is not None
            stopped = current.state == RoundState.OPEN and not ctx.finished()
            try:
                with ctx.db.transaction() as tx:
                    if stopped:
                        ctx.db.rounds.end(
                            tx, current.round, RoundState.STOPPED, ctx.clock(), ending=ctx.ending(current.round)
                        )
                    ctx.db.set_run_state(tx, RunState.FINISHED)
            finally:
                ctx.refresh()
            if stopped:
                ctx.store.remove_round(current.round)
        log.info(json.dumps({"event": "run_stopped", "round": current.round}))

    def rollback(self, to: int) -> tuple[int, int]:
        """Reopen the run from version ``to``: its tensors become a new version (versions only ever
        grow, and a device that cached one never sees it change), the open round is abandoned, and
        a new round trains the new version. A finished run runs again, and finishes when a round
        closes with ``--rounds`` closed rounds counted (a restart may raise it). Returns (new
        version, new round)."""
        ctx = self.ctx
        with ctx.lock:
            found = ctx.models.file(to)
            if found is None or not found[0].exists():
                raise UnknownVersionError(f"model version {to} does not exist")
            if ctx.privacy is not None and not ctx.privacy.mode().allows_next():
                spent = ctx.privacy.spent()
                raise PrivacyBudgetSpentError(
                    f"the run has spent epsilon {spent.epsilon} at delta {spent.delta:.3g} in {spent.rounds} noised "
                    f"rounds; one more would exceed --target-epsilon {spent.target_epsilon}. A rollback does not give "
                    "back what was published: the run stays finished"
                )
            version = ctx.db.versions.latest() + 1
            target = ctx.models.copy(found[0], version)
            current = ctx.db.rounds.latest()
            assert current is not None
            now = ctx.clock()
            try:
                with ctx.db.transaction() as tx:
                    ctx.db.versions.insert(tx, version, found[1], target.name, now, None)
                    ctx.db.rounds.mark_rolled_back(tx, to, current.round if current.state == RoundState.OPEN else None)
                    if current.state == RoundState.OPEN:
                        ctx.db.rounds.end(tx, current.round, RoundState.ABANDONED, now, reason="rolled back",
                                          ending=ctx.ending(current.round))  # fmt: skip
                    ctx.db.set_run_state(tx, RunState.RUNNING)
                    ctx.db.rounds.open(tx, current.round + 1, version, now, ctx.deadline(now))
            finally:
                ctx.refresh()
            ctx.store.remove_round(current.round)
        log.warning(json.dumps({"event": "rolled_back", "to": to, "model_version": version,
                                "round": current.round + 1}))  # fmt: skip
        return version, current.round + 1
