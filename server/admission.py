"""Admission: which device may send what into the open round, and recording what it sent.

An upload goes through two steps so that a refused one leaves nothing behind: ``stage`` checks the
409 conditions and writes the canonical file into ``tmp/`` (outside the lock); ``commit`` checks
them again under the lock, then renames the file into the round's folder, records it, and asks
the closing whether the round is now full.
"""

from __future__ import annotations

import contextlib
import json
import logging
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path

from fedper.server.refusals import (
    AlreadyReportedError,
    DeviceRevokedError,
    NotInCohortError,
    RoundNotOpenError,
    RunFinishedError,
    SecureRoundError,
    StaleBaseError,
)
from fedper.server.round_context import RoundContext
from fedper.server.secure_round import SecureRounds, SessionBrokenError
from fedper.server.storage import Round, RoundState, Slot, StoredUpdate
from fedper.server.upload_validation import Upload

log = logging.getLogger("fedper.server")


@dataclass(frozen=True)
class Staged:
    """An upload that passed every check, written to a temporary canonical file."""

    device_id: str
    round: int
    upload: Upload
    temp: Path


class Admission:
    """``on_received(round, count)``: called under the lock after an update is recorded."""

    def __init__(self, ctx: RoundContext, on_received: Callable[[int, int], None], abandon: Callable[[int, str], None]):
        self.ctx, self._on_received, self._abandon = ctx, on_received, abandon

    def assign(self, number: int, device_id: str) -> Slot | None:
        """The device's slot in open round ``number`` (see :mod:`server.cohort`), or None."""
        return self.ctx.cohort.assign(number, device_id, self.ctx.clock())

    def check(self, device_id: str, number: int) -> Round:
        """What can be decided before an upload's body is read: 410, then the 409s
        ``duplicate_update``, ``round_not_open``, ``not_in_cohort``, then 503 while draining; the
        open round if none applies. A device without a slot of the open round is turned away
        here, so it never holds a place among the uploads in flight."""
        ctx = self.ctx
        if ctx.finished():
            raise RunFinishedError()
        if ctx.db.rounds.has_update(number, device_id):
            raise AlreadyReportedError(f"this device already has an accepted update in round {number}")
        current = ctx.open_round(number)
        if ctx.secure is not None:
            raise SecureRoundError(f"round {number} is securely aggregated: send a masked input (docs/SECAGG.md)")
        if not ctx.cohort.may_report(number, device_id, ctx.clock()):
            message = (
                f"this device holds no slot of round {number}'s cohort (it never asked, or its slot expired); "
                "ask for a task again"
            )
            raise NotInCohortError(message, ctx.pace())
        if ctx.draining is not None:
            raise ctx.busy()
        return current

    def _check_conflicts(self, device_id: str, number: int, upload: Upload) -> None:
        """The admission checks again (time passed while the body arrived), then the update's
        base version against the round's (``stale_base_version``)."""
        version = self.check(device_id, number).model_version
        if upload.base_version != version:
            raise StaleBaseError(
                f"round {number} trains model version {version}, the update is from version {upload.base_version}",
            )

    def stage(self, device_id: str, number: int, upload: Upload) -> Staged:
        """Check the conflicts, then write the canonical file (outside the lock: the slow part)."""
        self._check_conflicts(device_id, number, upload)
        return Staged(device_id, number, upload, self.ctx.store.write_canonical(upload.tensors, upload.metadata()))

    def commit(self, staged: Staged) -> int:
        """Record a staged upload (or refuse it, removing its file); returns the round's count.
        The checks run again inside the transaction, which holds the database's write lock: a
        round another process sealed or ended meanwhile refuses the update, so an update is
        either recorded in the round its closer aggregates, or refused (never 202 and lost)."""
        ctx = self.ctx
        try:
            with ctx.lock:
                now = ctx.clock()
                relative: str | None = None
                try:
                    with ctx.db.transaction() as tx:
                        if ctx.db.devices.revoked(staged.device_id):
                            raise DeviceRevokedError("this device has been revoked")
                        self._check_conflicts(staged.device_id, staged.round, staged.upload)
                        relative = ctx.store.commit(staged.temp, staged.round, staged.device_id)
                        u = staged.upload
                        update = StoredUpdate(staged.round, staged.device_id, u.num_samples, u.base_version, relative,
                                              u.metrics, u.unclipped)  # fmt: skip
                        ctx.db.rounds.insert_update(tx, update, now)
                except BaseException:
                    if relative is not None:  # moved into the round's folder, but not recorded
                        ctx.store.remove_file(relative)
                    raise
                finally:
                    ctx.refresh()
                received = ctx.snapshot.received
                self._on_received(staged.round, received)
                return received
        finally:
            ctx.store.remove(staged.temp)

    def discard(self, staged: Staged) -> None:
        self.ctx.store.remove(staged.temp)

    def withdraw(self, device_id: str) -> bool:
        """Take a (revoked) device's update and slot out of the open round; True if it had an update."""
        ctx = self.ctx
        with ctx.lock:
            current = ctx.db.rounds.latest()
            assert current is not None
            if current.state != RoundState.OPEN or ctx.db.closers.sealed(current.round):
                return False  # a round being closed keeps its set: the revoked device's last update counts
            if not ctx.db.rounds.has_update(current.round, device_id):
                with ctx.db.transaction() as tx:
                    ctx.db.cohort.delete_slot(tx, current.round, device_id)  # free for another device
                return False
            files = [u.file for u in ctx.db.rounds.updates(current.round) if u.device_id == device_id]
            try:
                with ctx.db.transaction() as tx:
                    ctx.db.rounds.delete_update(tx, current.round, device_id)
                    ctx.db.cohort.delete_slot(tx, current.round, device_id)  # free for another device
            finally:
                ctx.refresh()
            for file in files:
                if file is not None:
                    ctx.store.remove_file(file)
        log.info(json.dumps({"event": "update_withdrawn", "round": current.round, "device": device_id}))
        return True

    # --- a secure round's messages --------------------------------------------------------

    def secure_post(self, number: int, device_id: str, stage: str, body: bytes, unopened: str = "") -> None:
        with self.ctx.lock, self._broken_session(number) as secure:
            self.ctx.open_round(number)
            secure.post(number, device_id, stage, body, self.ctx.clock(), unopened)

    def secure_get(self, number: int, device_id: str, stage: str) -> dict[str, object] | None:
        with self.ctx.lock, self._broken_session(number) as secure:
            self.ctx.open_round(number)
            return secure.get(number, device_id, stage, self.ctx.clock())

    @contextlib.contextmanager
    def _broken_session(self, number: int) -> Iterator[SecureRounds]:
        """A request that finds the round's session cannot be replayed abandons the round, and
        is told the round is not open (not a 500 until the next tick does it)."""
        assert self.ctx.secure is not None
        try:
            yield self.ctx.secure
        except SessionBrokenError as exc:
            log.error(json.dumps({"event": "secure_session_failed", "round": number, "reason": str(exc)}))
            self._abandon(number, str(exc))
            raise RoundNotOpenError(f"round {number} was abandoned: {exc}") from exc
