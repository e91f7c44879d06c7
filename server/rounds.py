"""Rounds: the state machine of PROTOCOL.md, durable in SQLite (:mod:`server.storage`) and
the blob folders (:mod:`server.update_store`).

A round is ``open`` until it becomes ``closed`` (aggregated into version v+1), ``abandoned``
(deadline with fewer than ``min_clients``) or ``stopped`` (operator); the run is
``running`` until ``rounds_total`` rounds closed or the operator stopped it. Every
transition is one transaction, and the in-memory :class:`Snapshot` is re-read from the
database after every commit, whether the commit or what followed it failed or not: memory
never runs ahead of or behind the database. Time comes from an injected clock.

An upload goes through two steps so that a rejected one leaves nothing behind: ``stage``
checks the 409 conditions and writes the canonical file into ``tmp/`` (outside the lock);
``commit`` checks them again under the lock, then renames the file into the round's
folder, records it, and closes the round if it is full.

Closing aggregates the round's stored files (:func:`fedper.common.robust_aggregate.robust_aggregate`:
each update clipped to a multiple of the round's median distance from its base, each device's
weight capped, then FedAvg or a coordinate-wise median or trimmed mean), read one at a time,
twice (distances, then the fold), in a canonical order: by the sha256 of each file. The
float64 sum of FedAvg depends on the order of its terms (by a rounding, which can reach the
float32 result), so the new base depends only on the set of accepted updates: not on the order
they arrived in, nor on the (random) device ids.
"""

from __future__ import annotations

import contextlib
import json
import logging
import math
import threading
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path

import numpy as np

from fedper.common import weights
from fedper.common.atomic_write import atomic_write_bytes
from fedper.common.dp.mechanism import DPReport
from fedper.common.errors import ConfigError
from fedper.common.manifest import Manifest, sha256_file
from fedper.common.metrics import summarize
from fedper.common.protocol import RoundInfo
from fedper.common.robust_aggregate import CENTERED, NonFiniteAggregateError, held_bytes, robust_aggregate
from fedper.common.secagg.fixed_point import SumOutOfBoundsError
from fedper.common.secagg.server_session import RoundFailedError
from fedper.server import publish_check
from fedper.server.clock import SteadyClock, iso_time
from fedper.server.cohort import Cohort
from fedper.server.config import ServerConfig
from fedper.server.disk_room import DiskRoom, out_of_space
from fedper.server.metrics_registry import AggregationCounts
from fedper.server.privacy import ServerPrivacy
from fedper.server.refusals import (
    AlreadyReportedError,
    DeviceRevokedError,
    DrainingError,
    NotInCohortError,
    PrivacyBudgetSpentError,
    RoundNotOpenError,
    RunFinishedError,
    SecureRoundError,
    StaleBaseError,
    UnknownVersionError,
)
from fedper.server.secure_round import DONE, SecureRounds, SessionBrokenError
from fedper.server.storage import Database, Round, RoundState, RunState, Slot, StorageError, StoredUpdate
from fedper.server.update_store import UpdateStore
from fedper.server.upload_validation import Upload

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


@dataclass(frozen=True)
class Staged:
    """An upload that passed every check, written to a temporary canonical file."""

    device_id: str
    round: int
    upload: Upload
    temp: Path


class RoundManager:
    def __init__(
        self,
        config: ServerConfig,
        manifest: Manifest,
        db: Database,
        data_dir: Path,
        clock: Clock | None = None,
        disk: DiskRoom | None = None,
    ):
        self.config = config
        self.db = db
        self.clock = clock or SteadyClock()
        self.models_dir = data_dir / "models"
        self._layout = manifest.layout("base")
        self.store = UpdateStore(data_dir, self._layout)
        self.cohort = Cohort(config, db)
        self.privacy = ServerPrivacy(config, db) if config.privacy.dp else None
        self.secure: SecureRounds | None = None
        if config.secure.secagg:
            words = sum(math.prod(shape) for _, shape in self._layout)
            dp_clip = self.privacy.clip if self.privacy is not None else None
            self.secure = SecureRounds(config.secure, db, words, self.store.updates_dir, dp_clip)
            self.cohort.on_draw = self.secure.begin
        elif self.privacy is None:
            self._check_memory()
        self._lock = threading.RLock()
        self._bases: dict[int, dict[str, np.ndarray]] = {}  # model versions, for the update bound
        self.snapshot = Snapshot(False, 0, RoundState.OPEN, 0, None, 0, 0)
        self.aggregation_seconds = 0.0
        self.aggregation_counts = AggregationCounts()  # since this process started
        self.rounds_refused = 0  # aggregates not published (server.publish_check)
        self.disk = disk or DiskRoom(data_dir, 0)
        self.draining: str | None = None  # why the server takes no uploads (server.disk_room)

    # --- start and resume ---------------------------------------------------------------

    def start(self, initial_base: Path) -> None:
        """Open round 1 on version 0 at first start; otherwise resume where the database says.
        On a database opened read-only (a full disk), only read it: the server starts draining."""
        if self.db.read_only:
            self._refresh()
            self._drain("the database could not be opened for writing (is the disk full?)")
            return
        self.models_dir.mkdir(parents=True, exist_ok=True)
        with self._lock:
            if self.db.model_version(0) is None:
                target = self.models_dir / "v0.safetensors"
                weights.load_checked([initial_base], self._layout)  # served as is, so it must load
                atomic_write_bytes(target, initial_base.read_bytes())
                now = self.clock()
                waiting = self.db.count_devices() < self.config.start_devices  # no clock until they come
                with self.db.transaction() as tx:
                    self.db.insert_version(tx, 0, sha256_file(target), target.name, now, None)
                    self.db.open_round(tx, 1, 0, now, None if waiting else self._deadline(now))
                    self.db.set_run_state(tx, RunState.WAITING if waiting else RunState.RUNNING)
                log.info(json.dumps({"event": "round_opened", "round": 1, "model_version": 0}))
            current = self.db.latest_round()
            assert current is not None
            open_round = current.round if current.state == RoundState.OPEN and not self._finished() else None
            if open_round is not None:
                for _ in self._stored(open_round):  # quarantines what the loader refuses
                    pass
            referenced = {u.file for u in self.db.updates(open_round)} if open_round is not None else set()
            if self.secure is not None and open_round is not None:
                referenced |= self.secure.referenced(open_round)
            self.store.remove_leftovers(open_round, {f for f in referenced if f is not None})
            self._remove_unrecorded_models()
            self._refresh()
        self.enrolled()  # enough devices may have enrolled before a restart
        self.tick()  # a deadline that passed while we were down, or a full round not yet closed

    def enrolled(self) -> None:
        """After an enrollment: start round 1's clock once ``--start-devices`` devices have enrolled."""
        if self.db.run_state() != RunState.WAITING or self.db.count_devices() < self.config.start_devices:
            return
        with self._lock:
            if self.db.run_state() != RunState.WAITING:
                return
            now = self.clock()
            try:
                with self.db.transaction() as tx:
                    self.db.start_round_clock(tx, 1, now, self._deadline(now))
                    self.db.set_run_state(tx, RunState.RUNNING)
            finally:
                self._refresh()
        log.info(json.dumps({"event": "round_clock_started", "round": 1, "devices": self.db.count_devices()}))

    def _remove_unrecorded_models(self) -> None:
        """At start: temp files of writes a crash interrupted (``.v1.safetensors.*.tmp``), version
        files written but never recorded, and files of versions pruned before a crash."""
        recorded = {self.models_dir / file for file in self.db.versions().values()}
        for path in list(self.models_dir.iterdir()):
            if path not in recorded and (path.name.endswith(".tmp") or path.suffix == ".safetensors"):
                self.store.remove(path)
        for path in list(self.models_dir.parent.glob(".*.tmp")):  # the secrets' atomic writes
            self.store.remove(path)

    def _check_memory(self) -> None:
        """Refuse at start an aggregation that would not fit at close, rather than fail then."""
        floats = sum(math.prod(shape) for _, shape in self._layout)
        need = held_bytes(self.config.aggregation, floats, self.config.slots)
        if need > self.config.aggregation_memory * 2**20:
            raise ConfigError(
                f"--aggregate {self.config.aggregation.aggregate} holds every update of a round at its close: "
                f"{self.config.slots} updates of this base ({floats:,} floats) need about {need / 2**20:,.0f} MB, "
                f"more than --aggregation-memory {self.config.aggregation_memory} MB. Raise it, lower "
                f"--cohort-size, or use --aggregate mean (one update in memory at a time)"
            )

    def _stored(self, number: int) -> Iterator[tuple[StoredUpdate, dict[str, np.ndarray]]]:
        """Round ``number``'s stored updates, read with the loader one at a time, in ascending
        order of the sha256 of their files (then device id, for identical files). A file that
        cannot be read or that the loader refuses is quarantined and its row removed, so the
        round's count is recomputed and that device may upload again."""
        keyed = []
        for update in self.db.updates(number):
            try:
                if update.file is None:
                    raise FileNotFoundError("no file recorded")
                keyed.append((self.store.digest(update.file), update.device_id, update))
            except OSError as exc:
                self._drop(update, exc)
        for _, _, update in sorted(keyed, key=lambda k: k[:2]):
            assert update.file is not None
            try:
                tensors = self.store.load(update.file)
            except (weights.WeightsError, OSError) as exc:
                self._drop(update, exc)
                continue
            yield update, tensors

    def _drop(self, update: StoredUpdate, exc: Exception) -> None:
        if update.file is not None:
            self.store.quarantine(update.file, str(exc))
        with self.db.transaction() as tx:
            self.db.delete_update(tx, update.round, update.device_id)
        log.warning(json.dumps({"event": "update_dropped", "round": update.round, "device": update.device_id,
                                "reason": str(exc)[:300]}))  # fmt: skip

    def _deadline(self, now: float) -> float | None:
        return now + self.config.round_timeout if self.config.round_timeout > 0 else None

    def _finished(self) -> bool:
        return self.db.run_state() == RunState.FINISHED

    def _refresh(self) -> None:
        """The snapshot, read from the database (called after every commit, also after failures)."""
        current = self.db.latest_round()
        assert current is not None
        self.snapshot = Snapshot(
            finished=self._finished(),
            round=current.round,
            state=current.state,
            model_version=current.model_version,
            deadline=current.deadline,
            received=self.db.count_updates(current.round) if current.state == RoundState.OPEN else 0,
            rounds_closed=self.db.count_closed_rounds(),
            opened_at=current.opened_at,
        )

    # --- the cohort -----------------------------------------------------------------------

    def assign(self, number: int, device_id: str) -> Slot | None:
        """The device's slot in open round ``number`` (see :mod:`server.cohort`), or None."""
        return self.cohort.assign(number, device_id, self.clock())

    def pace(self) -> int:
        """Retry-After for a device that has no task in the open round (pace steering)."""
        snap = self.snapshot
        return self.cohort.retry_after(snap.round, snap.opened_at, snap.deadline, self.clock())

    def _not_in_cohort(self, number: int) -> NotInCohortError:
        message = (
            f"this device holds no slot of round {number}'s cohort (it never asked, or its slot expired); "
            "ask for a task again"
        )
        return NotInCohortError(message, self.pace())

    # --- uploads ------------------------------------------------------------------------

    def round_exists(self, number: int) -> bool:
        return 1 <= number <= self.snapshot.round

    def round_base(self, number: int) -> dict[str, np.ndarray]:
        """The base that round ``number`` trains (float64, for the update bound)."""
        info = self.db.round(number)
        if info is None:
            raise KeyError(number)
        version = info.model_version
        if version not in self._bases:
            found = self.version_file(version)
            assert found is not None
            self._bases = {version: {k: v.astype(np.float64) for k, v in weights.load(found[0]).items()}}
        return self._bases[version]

    def _last_step(self, version: int) -> dict[str, np.ndarray] | None:
        """The published step that made ``version`` (its base minus its parent's), where centered
        clipping starts; None (clip around the base) for version 0 or a pruned parent."""
        parent = self.db.parent_version(version)
        found = self.version_file(version)
        parent_file = self.version_file(parent) if parent is not None else None
        if found is None or parent_file is None:
            return None
        after, before = weights.load(found[0]), weights.load(parent_file[0])
        return {k: after[k].astype(np.float64) - before[k].astype(np.float64) for k in after}

    def check_admission(self, device_id: str, number: int) -> Round:
        """What can be decided before an upload's body is read (revision 1.4): 410, then the
        409s ``duplicate_update``, ``round_not_open``, ``not_in_cohort``, then 503 while
        draining; the open round if none applies. A device without a slot of the open round is
        turned away here, so it never holds a place among the uploads in flight."""
        if self._finished():
            raise RunFinishedError()
        if self.db.has_update(number, device_id):
            raise AlreadyReportedError(f"this device already has an accepted update in round {number}")
        current = self.db.latest_round()
        assert current is not None
        if number != current.round or current.state != RoundState.OPEN:
            raise RoundNotOpenError(f"round {number} is not open (the open round is {current.round})")
        if self.secure is not None:
            raise SecureRoundError(f"round {number} is securely aggregated: send a masked input (docs/SECAGG.md)")
        if not self.cohort.may_report(number, device_id, self.clock()):
            raise self._not_in_cohort(number)
        if self.draining is not None:
            raise self.busy()
        return current

    def check_conflicts(self, device_id: str, number: int, upload: Upload) -> None:
        """The admission checks again (time passed while the body arrived), then the update's
        base version against the round's (``stale_base_version``)."""
        version = self.check_admission(device_id, number).model_version
        if upload.base_version != version:
            raise StaleBaseError(
                f"round {number} trains model version {version}, the update is from version {upload.base_version}",
            )

    def stage(self, device_id: str, number: int, upload: Upload) -> Staged:
        """Check the conflicts, then write the canonical file (outside the lock: the slow part)."""
        self.check_conflicts(device_id, number, upload)
        return Staged(device_id, number, upload, self.store.write_canonical(upload.tensors, upload.metadata()))

    def commit(self, staged: Staged) -> int:
        """Record a staged upload (or refuse it, removing its file); returns the round's count."""
        try:
            with self._lock:
                if self.db.device_revoked(staged.device_id):
                    raise DeviceRevokedError("this device has been revoked")
                self.check_conflicts(staged.device_id, staged.round, staged.upload)
                now = self.clock()
                try:
                    relative = self.store.commit(staged.temp, staged.round, staged.device_id)
                    update = StoredUpdate(staged.round, staged.device_id, staged.upload.num_samples,
                                          staged.upload.base_version, relative, staged.upload.metrics,
                                          staged.upload.unclipped)  # fmt: skip
                    with self.db.transaction() as tx:
                        self.db.insert_update(tx, update, now)
                finally:
                    self._refresh()
                received = self.snapshot.received
                if received >= self.config.target_clients and self.privacy is None:
                    self._try_close(staged.round, "target reached")
                return received
        finally:
            self.store.remove(staged.temp)

    def discard(self, staged: Staged) -> None:
        self.store.remove(staged.temp)

    # --- closing, abandoning, stopping ----------------------------------------------------

    def _try_close(self, number: int, reason: str) -> None:
        """Close. A full disk drains the server (the round closes when there is room); any other
        failure (a secure round's masks that cannot be removed, an overflow, a bug) abandons the
        round with its reason recorded and opens the next one: no round can wedge the server, and
        a restart does not meet the same failure again. The update that filled the round is
        stored either way, so its device gets its 202."""
        noised: list[DPReport] = []  # a DP round noised before it failed still counts
        try:
            self._close(number, reason, noised)
        except Exception as exc:
            if out_of_space(exc):
                self._drain(f"round {number} could not be closed: {exc}")
                return
            log.exception(json.dumps({"event": "round_close_failed", "round": number}))
            self._abandon_failed(number, f"closing failed: {type(exc).__name__}: {exc}", noised[0] if noised else None)

    def _abandon_failed(self, number: int, why: str, dp_report: DPReport | None = None) -> None:
        """Abandon a round that cannot be closed (if it is still open), counted as not published."""
        current = self.db.round(number)
        if current is None or current.state != RoundState.OPEN:
            return
        self._refuse(number, current.model_version, why[:500], dp_report)

    def _close(self, number: int, reason: str, noised: list[DPReport] | None = None) -> None:
        """Aggregate, check the aggregate (:mod:`server.publish_check`), write version v+1
        durably, then record it and open the next round; an aggregate that fails a check is not
        published: the round is abandoned and the next one trains the same version.

        If a stored update had to be dropped, the round stays open with its recomputed count,
        as after a restart: whether it closes is decided again (a later upload, the deadline).
        """
        start = time.perf_counter()
        current = self.db.round(number)
        assert current is not None and current.state == RoundState.OPEN
        updates = self.db.updates(number)

        def stored() -> Iterator[tuple[dict[str, np.ndarray], int]]:
            return ((tensors, u.num_samples) for u, tensors in self._stored(number))

        round_base = self.round_base(number)
        dp_report = None
        try:  # group=1: one loaded update in memory at a time (for the mean)
            if self.secure is not None:
                try:
                    secured = self._secure_aggregate(number, round_base, noised)
                except (RoundFailedError, SumOutOfBoundsError) as exc:
                    log.warning(json.dumps({"event": "secure_round_failed", "round": number, "reason": str(exc)}))
                    self._refuse(number, current.model_version, f"secure round failed: {exc}",
                                 noised[0] if noised else None)  # fmt: skip
                    return
                if isinstance(secured, str):
                    self._abandon(number, current.model_version, reason=secured)
                    return
                base, count, dp_report = secured
            elif self.privacy is not None:
                contributions = ((tensors, bool(u.unclipped)) for u, tensors in self._stored(number))
                base, dp_report = self.privacy.aggregate(self._layout, round_base, contributions)
                if noised is not None:
                    noised.append(dp_report)
                count = dp_report.updates
            else:
                centered = self.config.aggregation.aggregate == CENTERED
                center = self._last_step(current.model_version) if centered else None
                base, report = robust_aggregate(self._layout, round_base, stored, self.config.aggregation, 1, center,
                                                spill=self.store.tmp_dir)  # fmt: skip
                count = report.updates
        except NonFiniteAggregateError as exc:
            self._refuse(number, current.model_version, str(exc))
            return
        if count < len(updates):
            self._refresh()
            log.warning(json.dumps({"event": "round_close_deferred", "round": number,
                                    "dropped": len(updates) - count}))  # fmt: skip
            return
        steps = self._recent_steps()
        refused = publish_check.problem(self.config.publish, base, round_base, steps)
        if refused is None and self.config.publish.publish_command:
            with self.store.temp_file(".candidate") as (candidate, f):
                f.write(weights.encode(base))
                f.flush()
                refused = publish_check.command_problem(self.config.publish, candidate)
        if refused is not None:
            self._refuse(number, current.model_version, refused, dp_report)
            return
        version = self.db.latest_version() + 1
        target = self.models_dir / f"v{version}.safetensors"
        weights.save(target, base)  # temp file, fsync, rename, fsync directory
        metrics = round_metrics(updates)
        finished = self.db.count_closed_rounds() + 1 >= self.config.rounds
        steps = [*steps, publish_check.step_norm(base, round_base)][-publish_check.HISTORY :]
        now = self.clock()
        try:
            with self.db.transaction() as tx:
                self.db.insert_version(tx, version, sha256_file(target), target.name, now, number)
                self.db.end_round(tx, number, RoundState.CLOSED, now, version, metrics)
                self.db.set_recent_steps(tx, steps)
                if self.privacy is not None and dp_report is not None and not self.privacy.record(tx, dp_report):
                    finished = True  # the next round would take epsilon above --target-epsilon
                if finished:
                    self.db.set_run_state(tx, RunState.FINISHED)
                else:
                    self.db.open_round(tx, number + 1, version, now, self._deadline(now))
        finally:
            self._refresh()
        self.store.remove_round(number)
        self.aggregation_seconds += time.perf_counter() - start
        if dp_report is not None:
            done: dict[str, object] = {**self._privacy_log(dp_report), "secure": self.secure is not None}
        elif self.secure is not None:
            done = {"secure": True, "updates": count}
        else:
            self.aggregation_counts.add(report)
            done = report.to_dict()
        log.info(json.dumps({
            "event": "round_closed", "round": number, "reason": reason, "updates": count,
            "model_version": version, "seconds": round(time.perf_counter() - start, 3), "finished": finished,
            "aggregation" if dp_report is None else "privacy": done,
        }))  # fmt: skip
        self._prune()

    def _recent_steps(self) -> list[float]:
        """The distances of the last published versions from their rounds' bases."""
        return self.db.recent_steps()

    def _prune(self) -> None:
        """Keep the newest ``--keep-versions`` model versions (and version 0, the export's, and the
        open round's): the rows go in one transaction, then the files (a crash between leaves
        files that the next start removes)."""
        keep = self.config.keep_versions
        if not keep:
            return
        with self._lock:
            latest = self.db.latest_version()
            training = self.snapshot.model_version
            doomed = [v for v in self.db.versions() if v != 0 and v != training and v <= latest - keep]
            if not doomed:
                return
            with self.db.transaction() as tx:
                for v in doomed:
                    self.db.delete_version(tx, v)
            self._bases = {k: b for k, b in self._bases.items() if k not in doomed}
        for v in doomed:
            self.store.remove(self.models_dir / f"v{v}.safetensors")
        log.info(json.dumps({"event": "versions_pruned", "versions": doomed}))

    def _privacy_log(self, report: DPReport) -> dict[str, object]:
        assert self.privacy is not None
        spent = self.privacy.spent()
        return {**report.to_dict(), "epsilon": spent.epsilon, "noised_rounds": spent.rounds}

    def _refuse(self, number: int, version: int, why: str, dp_report: DPReport | None = None) -> None:
        """A round whose aggregate may not be published: abandoned, counted, logged as a warning.
        A noised round counts against the privacy budget all the same (its refusal is visible)."""
        self._abandon(number, version, dp_report, why)
        self.rounds_refused += 1
        log.warning(json.dumps({"event": "round_not_published", "round": number, "model_version": version,
                                "reason": why}))  # fmt: skip

    def _abandon(self, number: int, version: int, dp_report: DPReport | None = None, reason: str | None = None) -> None:
        """End the round unaggregated (with ``reason`` recorded: GET /v1/rounds/{r} says it) and
        open the next on the same version, or finish the run, when a refused noised round used up
        the privacy budget. A secure round's secrets (sealed shares, answers) go with its row's
        messages, its masked inputs with its folder."""
        now = self.clock()
        try:
            with self.db.transaction() as tx:
                self.db.end_round(tx, number, RoundState.ABANDONED, now, reason=reason)
                if self.privacy is not None and dp_report is not None and not self.privacy.record(tx, dp_report):
                    self.db.set_run_state(tx, RunState.FINISHED)
                else:
                    self.db.open_round(tx, number + 1, version, now, self._deadline(now))
        finally:
            self._refresh()
        self.store.remove_round(number)
        log.info(json.dumps({"event": "round_abandoned", "round": number, "model_version": version, "reason": reason}))

    def rollback(self, to: int) -> tuple[int, int]:
        """Reopen the run from version ``to``: its tensors become a new version (versions only ever
        grow, and a device that cached one never sees it change), the open round is abandoned, and
        a new round trains the new version. A finished run runs again, and finishes when a round
        closes with ``--rounds`` closed rounds counted (a restart may raise it). Returns (new
        version, new round)."""
        with self._lock:
            found = self.version_file(to)
            if found is None or not found[0].exists():
                raise UnknownVersionError(f"model version {to} does not exist")
            if self.privacy is not None and not self.privacy.budget().allows(self.privacy.rounds() + 1):
                spent = self.privacy.spent()
                raise PrivacyBudgetSpentError(
                    f"the run has spent epsilon {spent.epsilon} at delta {spent.delta:.3g} in {spent.rounds} noised "
                    f"rounds; one more would exceed --target-epsilon {spent.target_epsilon}. A rollback does not give "
                    "back what was published: the run stays finished"
                )
            version = self.db.latest_version() + 1
            target = self.models_dir / f"v{version}.safetensors"
            atomic_write_bytes(target, found[0].read_bytes())
            current = self.db.latest_round()
            assert current is not None
            now = self.clock()
            try:
                with self.db.transaction() as tx:
                    self.db.insert_version(tx, version, found[1], target.name, now, None)
                    self.db.mark_rolled_back(tx, to, current.round if current.state == RoundState.OPEN else None)
                    if current.state == RoundState.OPEN:
                        self.db.end_round(tx, current.round, RoundState.ABANDONED, now, reason="rolled back")
                    self.db.set_run_state(tx, RunState.RUNNING)
                    self.db.open_round(tx, current.round + 1, version, now, self._deadline(now))
            finally:
                self._refresh()
            self.store.remove_round(current.round)
        log.warning(json.dumps({"event": "rolled_back", "to": to, "model_version": version,
                                "round": current.round + 1}))  # fmt: skip
        return version, current.round + 1

    def _drain(self, why: str) -> None:
        if self.draining is None:
            what = (
                "downloads and status only: no enrollments, tasks or uploads, no round closes until the disk has room"
            )
            log.error(json.dumps({"event": "draining", "reason": why, "what": what}))
        self.draining = why

    def out_of_space(self, exc: BaseException) -> DrainingError:
        """Drain, and the 503 for the request that met the full disk."""
        self._drain(f"a write failed: {exc}")
        return self.busy()

    def busy(self) -> DrainingError:
        message = f"the server is draining ({self.draining}); nothing was stored, retry later"
        return DrainingError(message, self.pace())

    def _check_disk(self) -> None:
        """Enter or leave draining, by the free space."""
        short = self.disk.shortage()
        if short is not None:
            self._drain(short)
            return
        if self.draining is None:
            return
        if self.db.read_only:
            try:
                self.db.reopen_writable()
            except StorageError as exc:
                self.draining = f"the database cannot be opened for writing yet: {exc}"
                return
        log.warning(json.dumps({"event": "draining_ended", "was": self.draining}))
        self.draining = None

    def tick(self) -> None:
        """Apply the clock: close (>= min_clients) or abandon a round past its deadline, and close
        a full round whose closing failed earlier; first, enter or leave draining (the disk)."""
        self._check_disk()
        if self.draining is not None:
            return
        snap = self.snapshot
        now = self.clock()
        if self.secure is not None:
            self._tick_secure(now)
            return
        due = snap.deadline is not None and now >= snap.deadline
        full = snap.received >= self.config.target_clients and self.privacy is None
        if snap.finished or not snap.is_open or not (due or full):
            return
        with self._lock:
            current = self.db.latest_round()
            if current is None or current.state != RoundState.OPEN or self._finished():
                return
            received = self.db.count_updates(current.round)
            if self.privacy is not None:  # every noised round is published, at its deadline
                if current.deadline is not None and now >= current.deadline:
                    self._try_close(current.round, "deadline")
            elif received >= self.config.target_clients:
                self._try_close(current.round, "target reached")
            elif current.deadline is not None and now >= current.deadline:
                if received >= self.config.min_clients:
                    self._try_close(current.round, "deadline")
                else:
                    why = f"deadline: {received} updates, fewer than {self.config.min_clients}"
                    self._abandon(current.round, current.model_version, reason=why)

    def _tick_secure(self, now: float) -> None:
        """A secure round closes once its unmasking is over, under DP not before its deadline
        (when a noised round is published must not depend on who took part: PRIVACY.md); it
        abandons at its deadline without a session (fewer than two devices were drawn)."""
        assert self.secure is not None
        snap = self.snapshot
        if snap.finished or not snap.is_open:
            return
        with self._lock:
            current = self.db.latest_round()
            if current is None or current.state != RoundState.OPEN or self._finished():
                return
            try:
                stage = self.secure.stage(current.round, now)
            except Exception as exc:  # a stored session that no longer replays must not wedge the run
                if out_of_space(exc):
                    raise
                log.exception(json.dumps({"event": "secure_session_failed", "round": current.round}))
                self._abandon_failed(current.round, f"the secure session cannot be replayed: {exc}")
                return
            due = current.deadline is not None and now >= current.deadline
            if stage == DONE and (self.privacy is None or due):
                self._try_close(current.round, "unmasked")
            elif stage is None and due:  # no session: fewer than two devices were drawn
                if self.privacy is not None:
                    self._try_close(current.round, "deadline")  # noise alone: every DP round is published
                else:
                    self._abandon(current.round, current.model_version,
                                  reason="deadline: fewer than two devices were drawn, so no secure sum")  # fmt: skip

    def _secure_aggregate(
        self, number: int, round_base: dict[str, np.ndarray], noised: list[DPReport] | None = None
    ) -> tuple[dict[str, np.ndarray], int, DPReport | None] | str:
        """A secure round's new base (float32), the devices in its sum, and under DP what the
        mechanism did; or why it publishes nothing (fewer than ``min_clients`` in the sum, without
        DP). The decoded sum is checked first (FixedPoint.check_sum): SumOutOfBoundsError when no
        set of honest devices could have sent it; RoundFailedError when the masks cannot be removed."""
        assert self.secure is not None
        try:
            summed = self.secure.summed(number, self._layout)
        finally:
            self._log_secure_session(number)
        if self.privacy is not None:  # every round is published: noise alone if nobody took part
            if summed is None:
                zeros = {name: np.zeros(shape) for name, shape in self._layout}
                base, report = self.privacy.aggregate_sum(self._layout, round_base, zeros, 0, 0, self.privacy.clip())
            else:
                # Only what depends on no honest device's data may stop a noised round (every honest
                # weight is 1); the bits' count and the sum are bounded by the mechanism instead
                # (clamped to [0, B], projected onto B x the sensitivity), with B fixed by the sampling.
                sums, weight, flags, fixed, survivors = summed
                fixed.check_weight(weight, survivors)
                bits = min(max(flags[0], 0), self.privacy.max_devices())
                sensitivity = fixed.clip + fixed.error_norm(self.secure.words)
                base, report = self.privacy.aggregate_sum(self._layout, round_base, sums, survivors, bits, sensitivity)
            if noised is not None:
                noised.append(report)
            return base, 0 if summed is None else survivors, report
        if summed is None:
            return "no secure session: fewer than two devices were drawn"
        sums, weight, flags, fixed, survivors = summed
        fixed.check_sum(np.concatenate([sums[name].ravel() for name, _ in self._layout]), weight, flags, survivors)
        if survivors < self.config.min_clients:
            return f"{survivors} devices in the secure sum, fewer than {self.config.min_clients}"
        scale = fixed.weight_cap / weight
        out = {name: (round_base[name] + sums[name] * scale).astype(np.float32) for name, _ in self._layout}
        return out, survivors, None

    def _log_secure_session(self, number: int) -> None:
        """Who a secure round left out of its sum, and whose shares of a secret were wrong."""
        assert self.secure is not None
        found = self.secure.session(number)
        if found is None:
            return
        s = found[1]
        if s.left_out() or s.wrong_shares:
            log.warning(json.dumps({"event": "secure_round_devices", "round": number, "left_out": sorted(s.left_out()),
                                    "wrong_shares": s.wrong_shares}))  # fmt: skip

    def secure_post(self, number: int, device_id: str, stage: str, body: bytes, unopened: str = "") -> None:
        assert self.secure is not None
        with self._lock, self._broken_session(number):
            self.check_open(number)
            self.secure.post(number, device_id, stage, body, self.clock(), unopened)

    def secure_get(self, number: int, device_id: str, stage: str) -> dict[str, object] | None:
        assert self.secure is not None
        with self._lock, self._broken_session(number):
            self.check_open(number)
            return self.secure.get(number, device_id, stage, self.clock())

    @contextlib.contextmanager
    def _broken_session(self, number: int) -> Iterator[None]:
        """A request that finds the round's session cannot be replayed abandons the round, and
        is told the round is not open (not a 500 until the next tick does it)."""
        try:
            yield
        except SessionBrokenError as exc:
            log.error(json.dumps({"event": "secure_session_failed", "round": number, "reason": str(exc)}))
            self._abandon_failed(number, str(exc))
            raise RoundNotOpenError(f"round {number} was abandoned: {exc}") from exc

    def check_open(self, number: int) -> None:
        if self._finished():
            raise RunFinishedError()
        current = self.db.latest_round()
        assert current is not None
        if number != current.round or current.state != RoundState.OPEN:
            raise RoundNotOpenError(f"round {number} is not open (the open round is {current.round})")

    def stop(self) -> None:
        """Finish the run now (operator): the open round is recorded as stopped, not aggregated."""
        with self._lock:
            current = self.db.latest_round()
            assert current is not None
            stopped = current.state == RoundState.OPEN and not self._finished()
            try:
                with self.db.transaction() as tx:
                    if stopped:
                        self.db.end_round(tx, current.round, RoundState.STOPPED, self.clock())
                    self.db.set_run_state(tx, RunState.FINISHED)
            finally:
                self._refresh()
            if stopped:
                self.store.remove_round(current.round)
        log.info(json.dumps({"event": "run_stopped", "round": current.round}))

    def withdraw(self, device_id: str) -> bool:
        """Take a (revoked) device's update and slot out of the open round; True if it had an update."""
        with self._lock:
            current = self.db.latest_round()
            assert current is not None
            if current.state != RoundState.OPEN:
                return False
            if not self.db.has_update(current.round, device_id):
                with self.db.transaction() as tx:
                    self.db.delete_slot(tx, current.round, device_id)  # free for another device
                return False
            files = [u.file for u in self.db.updates(current.round) if u.device_id == device_id]
            try:
                with self.db.transaction() as tx:
                    self.db.delete_update(tx, current.round, device_id)
                    self.db.delete_slot(tx, current.round, device_id)  # free for another device
            finally:
                self._refresh()
            for file in files:
                if file is not None:
                    self.store.remove_file(file)
        log.info(json.dumps({"event": "update_withdrawn", "round": current.round, "device": device_id}))
        return True

    # --- readers ------------------------------------------------------------------------

    def version_file(self, version: int) -> tuple[Path, str] | None:
        row = self.db.model_version(version)
        if row is None:
            return None
        return self.models_dir / row.file, row.sha256

    def round_info(self, number: int) -> RoundInfo | None:
        r = self.db.round(number)
        if r is None:
            return None
        updates = self.db.updates(number)
        metrics = r.metrics if r.metrics is not None else round_metrics(updates)
        received = len(updates)
        if self.secure is not None and r.state == RoundState.OPEN:  # a secure round's updates are masked inputs
            received = sum(stage == "masked" for stage, _, _ in self.db.secagg_messages(number))
        return RoundInfo(
            round=r.round,
            state=r.state,  # type: ignore[arg-type]
            model_version=r.model_version,
            received=received,
            min_clients=self.config.min_clients,
            target_clients=self.config.target_clients,
            result_version=r.result_version,
            deadline=iso_time(r.deadline),
            metrics=metrics,  # type: ignore[arg-type]
            reason=r.reason,
        )


def round_metrics(updates: list[StoredUpdate]) -> dict[str, dict[str, float]]:
    """Per metric name: mean, sample-weighted mean and std across the round's devices."""
    names = sorted({name for u in updates for name in u.metrics})
    out = {}
    for name in names:
        pairs = [(u.metrics[name], u.num_samples) for u in updates if name in u.metrics]
        s = summarize([v for v, _ in pairs], [n for _, n in pairs])
        out[name] = {"mean": s.mean, "weighted_mean": s.weighted_mean, "std": s.std, "count": s.count}
    return out
