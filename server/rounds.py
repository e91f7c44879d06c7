"""Rounds: the state machine of PROTOCOL.md v1, durable in SQLite and the blob directory.

Uploads are parsed and validated outside any lock, written to a temporary file and
fsynced outside the lock too; only the final checks, the rename, the database insert and
the fold into the streaming FedAvg happen under the round lock. Closing a round writes
and fsyncs model version v+1, then records it and opens the next round in one
transaction. Readers (tasks, status, downloads) use an immutable snapshot and never wait
for an aggregation.
"""

from __future__ import annotations

import json
import logging
import os
import threading
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from fedper import weights
from fedper.aggregate import FedAvg
from fedper.atomic_write import atomic_write_bytes, fsync_directory
from fedper.manifest import Manifest, sha256_file
from fedper.metrics import summarize
from server.config import ServerConfig
from server.errors import conflict
from server.storage import Database, Round
from server.upload_validation import Upload

log = logging.getLogger("fedper.server")


@dataclass(frozen=True)
class Snapshot:
    """What readers need, replaced atomically whenever the state changes."""

    finished: bool
    round: int
    state: str  # of that round
    model_version: int
    deadline: float | None
    received: int
    rounds_closed: int


class RoundManager:
    def __init__(self, config: ServerConfig, manifest: Manifest, db: Database, data_dir: Path):
        self.config = config
        self.manifest = manifest
        self.db = db
        self.data_dir = data_dir
        self.models_dir = data_dir / "models"
        self.updates_dir = data_dir / "updates"
        self._layout = manifest.layout("base")
        self._lock = threading.Lock()
        self._accumulator: FedAvg | None = None
        self._closing = False
        self.snapshot = Snapshot(False, 0, "open", 0, None, 0, 0)
        self.aggregation_seconds = 0.0

    # --- start and resume ---------------------------------------------------------------

    def start(self, initial_base: Path) -> None:
        """Open round 1 on version 0 at first start; otherwise resume exactly where we were."""
        self.models_dir.mkdir(parents=True, exist_ok=True)
        self.updates_dir.mkdir(parents=True, exist_ok=True)
        with self._lock:
            if self.db.model_version(0) is None:
                target = self.models_dir / "v0.safetensors"
                atomic_write_bytes(target, initial_base.read_bytes())
                with self.db.transaction() as conn:
                    conn.execute(
                        "INSERT INTO model_versions (version, sha256, file, created_at, "
                        "from_round) VALUES (0, ?, ?, ?, NULL)",
                        (sha256_file(target), target.name, time.time()),
                    )
                    self._open_round(conn, 1, 0)
                    self.db.set_meta(conn, "state", "running")
                log.info(json.dumps({"event": "round_opened", "round": 1, "model_version": 0}))
            current = self.db.latest_round()
            assert current is not None
            if current.state == "open":
                self._accumulator = self._rebuild(current)
            self._refresh()
        self.check_deadline()  # a deadline that passed while we were down applies now

    def _rebuild(self, current: Round) -> FedAvg:
        """The open round's accumulator, from the updates stored before a restart."""
        acc = FedAvg(self._layout)
        for update in self.db.updates(current.round):
            if update.file is None:
                continue
            tensors = weights.load(self.updates_dir / update.file)
            acc.add(tensors, update.num_samples)
        return acc

    def _open_round(self, conn: Any, number: int, version: int) -> None:
        timeout = self.config.round_timeout
        deadline = time.time() + timeout if timeout > 0 else None
        conn.execute(
            "INSERT INTO rounds (round, state, model_version, opened_at, deadline) VALUES (?, 'open', ?, ?, ?)",
            (number, version, time.time(), deadline),
        )

    def _refresh(self) -> None:
        current = self.db.latest_round()
        assert current is not None
        received = len(self.db.updates(current.round)) if current.state == "open" else 0
        self.snapshot = Snapshot(
            finished=self.db.get_meta("state") == "finished",
            round=current.round,
            state=current.state,
            model_version=current.model_version,
            deadline=current.deadline,
            received=received,
            rounds_closed=self.db.count_closed_rounds(),
        )

    # --- uploads ------------------------------------------------------------------------

    def accept(self, device_id: str, number: int, upload: Upload, body: bytes) -> int:
        """Store and fold one validated update; returns how many the round has now."""
        round_dir = self.updates_dir / f"r{number}"
        round_dir.mkdir(parents=True, exist_ok=True)
        final = round_dir / f"{device_id}.safetensors"
        temp = round_dir / f".{device_id}.{os.getpid()}.{threading.get_ident()}.tmp"
        with temp.open("wb") as f:  # durable before we answer 202, written outside the lock
            f.write(body)
            f.flush()
            os.fsync(f.fileno())
        try:
            with self._lock:
                self._check_conflicts(device_id, number, upload)
                os.replace(temp, final)
                fsync_directory(round_dir)
                with self.db.transaction() as conn:
                    conn.execute(
                        "INSERT INTO updates (round, device_id, num_samples, base_version, file, "
                        "metrics, received_at) VALUES (?, ?, ?, ?, ?, ?, ?)",
                        (number, device_id, upload.num_samples, upload.base_version,
                         f"r{number}/{final.name}", json.dumps(upload.metrics), time.time()),
                    )  # fmt: skip
                assert self._accumulator is not None
                self._accumulator.add(upload.tensors, upload.num_samples)
                received = self.snapshot.received + 1
                self.snapshot = _replace(self.snapshot, received=received)
                if received >= self.config.target_clients:
                    self._close(number, "target reached")
                return received
        finally:
            temp.unlink(missing_ok=True)

    def _check_conflicts(self, device_id: str, number: int, upload: Upload) -> None:
        """409s in the protocol's order: duplicate, round not open, stale base version."""
        if self.db.has_update(number, device_id):
            raise conflict("duplicate_update", f"this device already has an accepted update in round {number}")
        current = self.db.latest_round()
        assert current is not None
        if number != current.round or current.state != "open" or self.snapshot.finished:
            raise conflict("round_not_open", f"round {number} is not open (the open round is {current.round})")
        if upload.base_version != current.model_version:
            raise conflict(
                "stale_base_version",
                f"round {number} trains model version {current.model_version}, the update is from "
                f"version {upload.base_version}",
            )

    def round_exists(self, number: int) -> bool:
        return 1 <= number <= self.snapshot.round

    # --- closing, abandoning, finishing --------------------------------------------------

    def _close(self, number: int, reason: str) -> None:
        """Aggregate, write version v+1 durably, then record it and open the next round."""
        start = time.perf_counter()
        current = self.db.round(number)
        assert current is not None and self._accumulator is not None
        updates = self.db.updates(number)
        base = self._accumulator.result()
        version = current.model_version + 1
        target = self.models_dir / f"v{version}.safetensors"
        weights.save(target, base)  # temp file, fsync, rename, fsync directory
        metrics = round_metrics(updates)
        finished = self.db.count_closed_rounds() + 1 >= self.config.rounds
        with self.db.transaction() as conn:
            conn.execute(
                "INSERT OR REPLACE INTO model_versions "
                "(version, sha256, file, created_at, from_round) VALUES (?, ?, ?, ?, ?)",
                (version, sha256_file(target), target.name, time.time(), number),
            )
            conn.execute(
                "UPDATE rounds SET state = 'closed', closed_at = ?, result_version = ?, metrics = ? WHERE round = ?",
                (time.time(), version, json.dumps(metrics), number),
            )
            conn.execute("UPDATE updates SET file = NULL WHERE round = ?", (number,))
            if finished:
                self.db.set_meta(conn, "state", "finished")
            else:
                self._open_round(conn, number + 1, version)
        self._delete_update_files(number)
        self._accumulator = None if finished else FedAvg(self._layout)
        self.aggregation_seconds += time.perf_counter() - start
        self._refresh()
        log.info(json.dumps({
            "event": "round_closed", "round": number, "reason": reason, "updates": len(updates),
            "model_version": version, "seconds": round(time.perf_counter() - start, 3),
            "finished": finished,
        }))  # fmt: skip

    def _abandon(self, number: int) -> None:
        current = self.db.round(number)
        assert current is not None
        with self.db.transaction() as conn:
            conn.execute(
                "UPDATE rounds SET state = 'abandoned', closed_at = ? WHERE round = ?",
                (time.time(), number),
            )
            conn.execute("UPDATE updates SET file = NULL WHERE round = ?", (number,))
            self._open_round(conn, number + 1, current.model_version)
        self._delete_update_files(number)
        self._accumulator = FedAvg(self._layout)
        self._refresh()
        log.info(
            json.dumps(
                {
                    "event": "round_abandoned",
                    "round": number,
                    "model_version": current.model_version,
                }
            )
        )

    def _delete_update_files(self, number: int) -> None:
        round_dir = self.updates_dir / f"r{number}"
        if round_dir.exists():
            for file in round_dir.iterdir():
                file.unlink(missing_ok=True)
            round_dir.rmdir()

    def check_deadline(self, now: float | None = None) -> None:
        """Close (>= min_clients) or abandon a round whose deadline has passed."""
        snap = self.snapshot
        now = time.time() if now is None else now
        if snap.finished or snap.state != "open" or snap.deadline is None or now < snap.deadline:
            return
        with self._lock:
            current = self.db.latest_round()
            if current is None or current.state != "open" or current.deadline is None or now < current.deadline:
                return
            if self.db.get_meta("state") == "finished":
                return
            if len(self.db.updates(current.round)) >= self.config.min_clients:
                self._close(current.round, "deadline")
            else:
                self._abandon(current.round)

    def stop(self) -> None:
        """Finish the run now (operator)."""
        with self._lock:
            with self.db.transaction() as conn:
                self.db.set_meta(conn, "state", "finished")
            self._refresh()
        log.info(json.dumps({"event": "run_stopped", "round": self.snapshot.round}))

    # --- readers ------------------------------------------------------------------------

    def version_file(self, version: int) -> tuple[Path, str] | None:
        row = self.db.model_version(version)
        if row is None:
            return None
        return self.models_dir / row["file"], str(row["sha256"])

    def round_info(self, number: int) -> dict[str, Any] | None:
        r = self.db.round(number)
        if r is None:
            return None
        updates = self.db.updates(number)
        metrics = r.metrics if r.metrics is not None else round_metrics(updates)
        return {
            "round": r.round,
            "state": r.state,
            "model_version": r.model_version,
            "received": len(updates),
            "min_clients": self.config.min_clients,
            "target_clients": self.config.target_clients,
            "result_version": r.result_version,
            "deadline": _iso(r.deadline),
            "metrics": metrics,
        }


def round_metrics(updates: list[Any]) -> dict[str, dict[str, float]]:
    """Per metric name: mean, sample-weighted mean and std across the round's devices."""
    names = sorted({name for u in updates for name in u.metrics})
    out = {}
    for name in names:
        pairs = [(u.metrics[name], u.num_samples) for u in updates if name in u.metrics]
        s = summarize([v for v, _ in pairs], [n for _, n in pairs])
        out[name] = {
            "mean": s.mean,
            "weighted_mean": s.weighted_mean,
            "std": s.std,
            "count": s.count,
        }
    return out


def _replace(snapshot: Snapshot, **changes: Any) -> Snapshot:
    from dataclasses import replace

    return replace(snapshot, **changes)


def _iso(timestamp: float | None) -> str | None:
    if timestamp is None:
        return None
    return time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime(timestamp))
