"""The task use case: the open round's task for a device holding (or now given) one of its
cohort's slots, or how long to wait (PROTOCOL.md: cohorts and pace steering)."""

from __future__ import annotations

from dataclasses import dataclass

from fedper.common.manifest import MANIFEST_FILE
from fedper.common.protocol import Header, Route, Task, TaskConfig
from fedper.server.clock import iso_time
from fedper.server.config import ServerConfig
from fedper.server.refusals import RunFinishedError, SecAggUnsupportedError
from fedper.server.rounds import RoundManager
from fedper.server.storage import Database


@dataclass(frozen=True)
class Wait:
    """No task now: ask again after ``retry_after`` seconds."""

    retry_after: int


@dataclass
class Tasks:
    config: ServerConfig
    db: Database
    rounds: RoundManager
    manifest_sha256: str

    def task(self, device_id: str, capabilities: set[str]) -> Task | Wait:
        rounds = self.rounds
        snap = rounds.snapshot
        if snap.finished:
            raise RunFinishedError()
        if not snap.is_open or rounds.draining is not None:
            return Wait(self.config.retry_after)
        if rounds.secure is not None and Header.SECAGG not in capabilities:
            raise SecAggUnsupportedError(
                "this server aggregates securely (protocol revision 1.7, docs/SECAGG.md) and this device did not say "
                f"it can take part ({Header.CAPABILITIES}: {Header.SECAGG}); it gets no task"
            )
        done = self.db.rounds.has_update(snap.round, device_id)
        if rounds.secure is not None and rounds.secure.took_part(snap.round, device_id):
            done = True  # one session per device and round: its keys are the ones it advertised
        slot = None if done else rounds.assign(snap.round, device_id)
        if slot is None:  # reported already, or every slot is held: come back when the round may have moved on
            return Wait(rounds.pace())
        secure = None
        if rounds.secure is not None:
            secure = rounds.secure.task(snap.round)
            if secure is None:  # fewer than two devices were drawn: no secure sum this round
                return Wait(rounds.pace())
        return Task(
            round=snap.round,
            model_version=snap.model_version,
            deadline=iso_time(snap.deadline),
            base_url=Route.MODEL_BASE.format(version=snap.model_version),
            manifest_url=Route.ARTIFACT.format(name=MANIFEST_FILE),
            manifest_sha256=self.manifest_sha256,
            config=TaskConfig.asking(self.config.training),
            report_by=iso_time(slot.expires_at),
            dp=None if rounds.privacy is None else rounds.privacy.task(),
            secagg=secure,
        )
