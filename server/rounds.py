"""The round service: the one object the routes call, composed of the round jobs.

- :mod:`server.admission`: who may send what into the open round, and recording it;
- :mod:`server.closing`: when a round ends (the round mode decides), aggregating and publishing;
- :mod:`server.run_lifecycle`: start and resume, round 1's clock, stop, rollback, draining;
- :mod:`server.model_store`: the published versions;
- :mod:`server.round_context`: what they share (stores, round mode, lock, snapshot).

The round mode itself (what a round accepts, when it closes, how it aggregates) is the shared
layer's :mod:`fedper.common.strategy`, which the simulation runs too.
"""

from __future__ import annotations

from pathlib import Path

import numpy as np

from fedper.common.manifest import Manifest
from fedper.common.protocol import RoundInfo
from fedper.common.strategy.modes import Strategy
from fedper.server.admission import Admission, Staged
from fedper.server.clock import SteadyClock, iso_time
from fedper.server.closing import Closing, round_metrics
from fedper.server.cohort import Cohort
from fedper.server.config import ServerConfig
from fedper.server.disk_room import DiskRoom
from fedper.server.metrics_registry import AggregationCounts
from fedper.server.privacy import ServerPrivacy
from fedper.server.refusals import DrainingError
from fedper.server.regional_intake import RegionalIntake
from fedper.server.regional_rounds import RegionalRounds
from fedper.server.root_link import RootLink
from fedper.server.round_context import Clock, RoundContext, Snapshot, quorum
from fedper.server.run_lifecycle import RunLifecycle
from fedper.server.secure_round import SecureRounds
from fedper.server.storage import Database, Round, RoundState, Slot
from fedper.server.update_store import UpdateStore
from fedper.server.upload_validation import Upload

__all__ = ["Clock", "RoundManager", "Snapshot", "Staged"]


class RoundManager:
    def __init__(
        self,
        config: ServerConfig,
        manifest: Manifest,
        db: Database,
        data_dir: Path,
        clock: Clock | None = None,
        disk: DiskRoom | None = None,
        root: RootLink | None = None,
    ):
        """``root``: at a regional server, its link to the root (its rounds follow the root's)."""
        self.ctx = RoundContext(config, manifest, db, data_dir, clock or SteadyClock(), disk or DiskRoom(data_dir, 0))
        self.closing = Closing(self.ctx)
        self.following = RegionalRounds(self.ctx, self.closing, root) if root is not None else None
        self.lifecycle = RunLifecycle(self.ctx, self.closing, self.following.tick if self.following else None)
        self.admission = Admission(self.ctx, self.closing.received, self.closing.abandon_failed)
        self.regional = RegionalIntake(self.ctx, self.closing.received) if config.regions else None
        self.config, self.db, self.clock = config, db, self.ctx.clock

    # --- what the jobs share, for readers ---------------------------------------------------

    @property
    def snapshot(self) -> Snapshot:
        return self.ctx.snapshot

    @property
    def draining(self) -> str | None:
        return self.ctx.draining

    @property
    def store(self) -> UpdateStore:
        return self.ctx.store

    @property
    def disk(self) -> DiskRoom:
        return self.ctx.disk

    @property
    def cohort(self) -> Cohort:
        return self.ctx.cohort

    @property
    def privacy(self) -> ServerPrivacy | None:
        return self.ctx.privacy

    @property
    def secure(self) -> SecureRounds | None:
        return self.ctx.secure

    @property
    def aggregation_seconds(self) -> float:
        return self.ctx.aggregation_seconds

    @property
    def aggregation_counts(self) -> AggregationCounts:
        return self.ctx.aggregation_counts

    @property
    def rounds_refused(self) -> int:
        return self.ctx.rounds_refused

    def refused_upload(self, code: str) -> None:
        """Count a refused upload against the open round (its record keeps the count when it ends)."""
        self.ctx.refusals.add(self.ctx.snapshot.round, code)

    def refused_in(self, number: int) -> dict[str, int]:
        """The open round's refused uploads by code, so far (an ended round's record keeps them)."""
        counted = self.db.rounds.refusals(number)  # what processes sharing the database added
        for code, n in self.ctx.refusals.unshared_of(number).items():
            counted[code] = counted.get(code, 0) + n
        return counted

    # --- the lifecycle ----------------------------------------------------------------------

    def start(self, initial_base: Path) -> None:
        self.lifecycle.start(initial_base)

    def enrolled(self) -> None:
        self.lifecycle.enrolled()

    def tick(self) -> None:
        self.lifecycle.tick()

    def stop(self) -> None:
        self.lifecycle.stop()

    def rollback(self, to: int) -> tuple[int, int]:
        return self.lifecycle.rollback(to)

    def mode(self) -> Strategy:
        """The round mode, with its state as the database holds it."""
        return self.ctx.round_mode()

    def busy(self) -> DrainingError:
        return self.ctx.busy()

    def out_of_space(self, exc: BaseException) -> DrainingError:
        return self.ctx.out_of_space(exc)

    # --- admission --------------------------------------------------------------------------

    def assign(self, number: int, device_id: str) -> Slot | None:
        return self.admission.assign(number, device_id)

    def pace(self) -> int:
        return self.ctx.pace()

    def check_admission(self, device_id: str, number: int) -> Round:
        return self.admission.check(device_id, number)

    def stage(self, device_id: str, number: int, upload: Upload) -> Staged:
        return self.admission.stage(device_id, number, upload)

    def commit(self, staged: Staged) -> int:
        return self.admission.commit(staged)

    def discard(self, staged: Staged) -> None:
        self.admission.discard(staged)

    def withdraw(self, device_id: str) -> bool:
        return self.admission.withdraw(device_id)

    def secure_post(self, number: int, device_id: str, stage: str, body: bytes, unopened: str = "") -> None:
        self.admission.secure_post(number, device_id, stage, body, unopened)

    def secure_get(self, number: int, device_id: str, stage: str) -> dict[str, object] | None:
        return self.admission.secure_get(number, device_id, stage)

    # --- readers ----------------------------------------------------------------------------

    def round_exists(self, number: int) -> bool:
        if number > self.ctx.snapshot.round and self.db.shared:  # another process may have opened it
            self.ctx.refresh()
        return 1 <= number <= self.ctx.snapshot.round

    def round_base(self, number: int) -> dict[str, np.ndarray]:
        """The base that round ``number`` trains (float64, for the update bound)."""
        info = self.db.rounds.get(number)
        if info is None:
            raise KeyError(number)
        return self.ctx.models.base(info.model_version)

    def version_file(self, version: int) -> tuple[Path, str] | None:
        return self.ctx.models.file(version)

    def received(self, number: int) -> int:
        """How many updates round ``number`` holds (a secure round's are its masked inputs)."""
        if self.secure is not None:
            return self.db.secagg.count_messages(number, "masked")
        return self.ctx.count_received(number)

    def round_info(self, number: int) -> RoundInfo | None:
        r = self.db.rounds.get(number)
        if r is None:
            return None
        updates = self.db.rounds.updates(number)
        metrics = r.metrics if r.metrics is not None else round_metrics(updates)
        received = self.received(number) if r.state == RoundState.OPEN else len(updates)
        return RoundInfo(
            round=r.round,
            state=r.state,  # type: ignore[arg-type]
            model_version=r.model_version,
            received=received,
            min_clients=quorum(self.config).min_clients,
            target_clients=quorum(self.config).target_clients,
            result_version=r.result_version,
            deadline=iso_time(r.deadline),
            metrics=metrics,  # type: ignore[arg-type]
            reason=r.reason,
        )
