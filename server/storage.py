"""The server's durable state: one SQLite database in WAL mode (devices, rounds, updates,
model versions) and a blob directory for weights (written to a temp file, fsynced, renamed).

Data directory layout::

    state.db                     SQLite database (WAL: state.db-wal, state.db-shm beside it)
    admin_token, enrollment_key  generated secrets (mode 0600), unless given by environment
    models/v<N>.safetensors      aggregated base of model version N (v0 = the export's)
    updates/r<R>/<device>.safetensors   accepted updates of the open round (deleted once aggregated)
    tmp/                         request bodies and files being written (emptied at start)
    quarantine/                  stored updates that could not be loaded at start (for inspection)

All SQL of the server lives here (the schema's steps in :mod:`server.migrations`). Writes go
through a :class:`Transaction`, reads return typed records: no other module sees SQLite.
"""

from __future__ import annotations

import json
import queue
import sqlite3
import threading
import time
import urllib.parse
from collections.abc import Iterator, Sequence
from contextlib import contextmanager
from dataclasses import dataclass
from enum import StrEnum
from pathlib import Path
from typing import Any

from fedper.common.dp.state import DPState
from fedper.server import migrations

READERS = 4  # read connections (each has its own page cache)
SQLITE_MAX = 2**63 - 1  # larger Python ints cannot be bound as SQLite integers: no such row
SQLITE_FULL = 13  # SQLite's primary result code for a full disk (or a database at its size limit)


class RoundState(StrEnum):
    """How a round stands (the ``rounds`` table's CHECK; the protocol's ``RoundInfo.state``)."""

    OPEN = "open"
    CLOSED = "closed"  # aggregated: it made a model version
    ABANDONED = "abandoned"  # ended without enough updates, or by a restart or rollback
    STOPPED = "stopped"  # the operator stopped the run while it was open


class RunState(StrEnum):
    """How the run stands (the ``run`` table's CHECK)."""

    WAITING = "waiting"  # round 1 is open, its clock not started until --start-devices devices enrolled
    RUNNING = "running"
    FINISHED = "finished"  # --rounds closed, the privacy budget spent, or the operator stopped it


@dataclass(frozen=True)
class Device:
    id: str
    token_hash: str
    revoked: bool


@dataclass(frozen=True)
class ModelVersion:
    version: int
    sha256: str
    file: str


@dataclass(frozen=True)
class SecAggSession:
    """A secure round's fixed part (docs/SECAGG.md): its session id, neighbour graph, threshold,
    encoding and when each stage ends at the latest."""

    round: int
    session: str
    graph: dict[str, list[str]]
    threshold: int
    clip: float
    weight_cap: int
    stage_ends: dict[str, float]
    flags: int = 0  # words between the delta and the weight: 1 under DP (the unclipped bit)


@dataclass(frozen=True)
class Round:
    round: int
    state: RoundState
    model_version: int
    opened_at: float
    deadline: float | None
    closed_at: float | None
    result_version: int | None
    metrics: dict[str, Any] | None
    reason: str | None = None  # why it was abandoned, when the server knows
    rolled_back: bool = False  # a rollback undid it: its updates use up no participation


@dataclass(frozen=True)
class Slot:
    """A device's place in a round's cohort; ``expires_at`` None: it lasts as long as the round."""

    round: int
    device_id: str
    assigned_at: float
    expires_at: float | None


@dataclass(frozen=True)
class StoredUpdate:
    round: int
    device_id: str
    num_samples: int
    base_version: int
    file: str | None
    metrics: dict[str, float]
    unclipped: bool | None = None  # under DP: the delta was within the clip before clipping


class StorageError(Exception):
    """The database refused an operation; a transaction it happened in changed nothing."""


class DatabaseBusyError(StorageError):
    """SQLite stayed locked for longer than the busy timeout (another writer holds it): the
    request changed nothing and is answered 503 with a Retry-After."""


class StorageFullError(StorageError):
    """The disk (or the database's size limit) is full: the server drains."""


def _translated(exc: sqlite3.Error) -> StorageError:
    text = str(exc)
    if isinstance(exc, sqlite3.OperationalError) and ("locked" in text or "busy" in text):
        return DatabaseBusyError(text)
    code = getattr(exc, "sqlite_errorcode", None)
    if (code is not None and code & 0xFF == SQLITE_FULL) or "database or disk is full" in text:
        return StorageFullError(text)
    return StorageError(text)


@contextmanager
def _storage_errors() -> Iterator[None]:
    try:
        yield
    except sqlite3.Error as exc:
        raise _translated(exc) from exc
    except migrations.SchemaError as exc:
        raise StorageError(str(exc)) from exc


class Transaction:
    """One write transaction, from :meth:`Database.transaction`: every write method takes one, so
    no write can happen outside a transaction. It is spent when its ``with`` block ends."""

    def __init__(self, conn: sqlite3.Connection) -> None:
        self._conn: sqlite3.Connection | None = conn

    def _live(self) -> sqlite3.Connection:
        if self._conn is None:
            raise StorageError("this transaction has ended: writes take the transaction they are part of")
        return self._conn

    def _execute(self, sql: str, args: tuple[Any, ...] = ()) -> int:
        """Run one statement; the number of rows it changed."""
        with _storage_errors():
            return self._live().execute(sql, args).rowcount

    def _executemany(self, sql: str, rows: Sequence[tuple[Any, ...]]) -> None:
        with _storage_errors():
            self._live().executemany(sql, rows)

    def _end(self) -> None:
        self._conn = None


class Database:
    """One SQLite database: writes on one connection, serialized by a lock; reads outside a
    transaction on a pool of ``READERS`` connections (WAL: readers never wait for the writer,
    nor for each other); reads inside a transaction on the writer's connection, so that they
    see what the transaction wrote."""

    def __init__(self, path: Path, busy_timeout: float = 5.0, read_only: bool = False):
        self.path = path
        self.busy_timeout = busy_timeout
        self.read_only = read_only
        self._lock = threading.RLock()
        self._idle: queue.LifoQueue[tuple[int, sqlite3.Connection]] = queue.LifoQueue()
        self._slots = threading.BoundedSemaphore(READERS)
        self._generation = 0  # bumped by reopen_writable(): readers of an older one are closed
        self._writing: int | None = None  # the thread inside a transaction
        self._conn = self._open_writer()
        self._devices = int(self._query("SELECT COUNT(*) AS n FROM devices")[0]["n"])

    def _open_writer(self) -> sqlite3.Connection:
        """The writer's connection, the schema brought to this server's version (a database opened
        read-only cannot be upgraded: it must be at that version already)."""
        with _storage_errors():
            conn = self._connect()
            try:
                if self.read_only:
                    migrations.check_current(conn)
                else:
                    with self._lock:
                        conn.execute("PRAGMA journal_mode=WAL")
                        conn.execute("PRAGMA synchronous=FULL")  # a committed 202 survives power loss
                        conn.execute("PRAGMA foreign_keys=ON")
                        migrations.migrate(conn)
            except BaseException:
                conn.close()
                raise
        return conn

    def _connect(self) -> sqlite3.Connection:
        if self.read_only:
            # A full disk: SQLite cannot create the WAL index it needs to open the file for
            # reading; with no WAL content to replay, the file alone is the whole database.
            wal = self.path.with_name(self.path.name + "-wal")
            immutable = "&immutable=1" if not wal.exists() or wal.stat().st_size == 0 else ""
            target = f"file:{urllib.parse.quote(str(self.path))}?mode=ro{immutable}"
            conn = sqlite3.connect(target, uri=True, timeout=self.busy_timeout, check_same_thread=False,
                                   isolation_level=None)  # fmt: skip
        else:
            conn = sqlite3.connect(self.path, timeout=self.busy_timeout, check_same_thread=False, isolation_level=None)
        conn.row_factory = sqlite3.Row
        return conn

    @contextmanager
    def _reader(self) -> Iterator[sqlite3.Connection]:
        """A reader from the pool (opened if none is idle), returned after use."""
        with self._slots:
            try:
                generation, conn = self._idle.get_nowait()
            except queue.Empty:
                generation, conn = self._generation, self._connect()
            if generation != self._generation:
                conn.close()
                generation, conn = self._generation, self._connect()
            try:
                yield conn
            finally:
                if generation == self._generation:
                    self._idle.put((generation, conn))
                else:  # reopened meanwhile
                    conn.close()

    def _close_idle(self) -> None:
        while True:
            try:
                self._idle.get_nowait()[1].close()
            except queue.Empty:
                return

    def reopen_writable(self) -> None:
        """Leave read-only mode (the disk has room again): every connection is opened anew."""
        with self._lock:
            old = self._conn
            self.read_only = False
            try:
                self._conn = self._open_writer()
            except BaseException:
                self.read_only = True
                raise
            self._generation += 1
            self._close_idle()  # those in use are closed when they come back
        old.close()

    def schema_version(self) -> int:
        """The schema version the database is at (``PRAGMA user_version``)."""
        with _storage_errors(), self._lock:
            return migrations.version(self._conn)

    def close(self) -> None:
        with self._lock:
            self._close_idle()
            self._conn.close()

    @contextmanager
    def transaction(self) -> Iterator[Transaction]:
        """One write transaction (the write lock held throughout): committed when the block ends,
        rolled back when it raises, so nothing of it stays."""
        with self._lock:
            with _storage_errors():
                self._conn.execute("BEGIN IMMEDIATE")
            outer, self._writing = self._writing, threading.get_ident()
            tx = Transaction(self._conn)
            try:
                yield tx
            except BaseException:
                tx._end()
                self._rollback()
                raise
            finally:
                self._writing = outer
            tx._end()
            try:
                with _storage_errors():
                    self._conn.execute("COMMIT")
            except StorageError:
                self._rollback()  # a failed COMMIT may leave the transaction open
                raise

    def _rollback(self) -> None:
        if self._conn.in_transaction:
            with _storage_errors():
                self._conn.execute("ROLLBACK")

    def _query(self, sql: str, args: tuple[Any, ...] = ()) -> list[sqlite3.Row]:
        if self._writing == threading.get_ident():
            with _storage_errors():
                return list(self._conn.execute(sql, args))
        with _storage_errors(), self._reader() as conn:
            return list(conn.execute(sql, args))

    def writable(self) -> None:
        """Take the write lock and let it go at once: DatabaseBusyError if another writer holds it."""
        with self._lock, _storage_errors():
            self._conn.execute("BEGIN IMMEDIATE")
            self._conn.execute("ROLLBACK")

    # --- meta, the run's state, DP state ------------------------------------------------

    def get_meta(self, key: str) -> str | None:
        rows = self._query("SELECT value FROM meta WHERE key = ?", (key,))
        return str(rows[0]["value"]) if rows else None

    def set_meta(self, tx: Transaction, key: str, value: str) -> None:
        tx._execute("INSERT OR REPLACE INTO meta (key, value) VALUES (?, ?)", (key, value))

    def run_state(self) -> RunState:
        return RunState(self._query("SELECT state FROM run")[0]["state"])

    def set_run_state(self, tx: Transaction, state: RunState) -> None:
        tx._execute("UPDATE run SET state = ?", (RunState(state).value,))

    def drawn_round(self) -> int | None:
        """The last round whose cohort was drawn at the end of its check-in window."""
        value = self._query("SELECT drawn_round FROM run")[0]["drawn_round"]
        return None if value is None else int(value)

    def set_drawn_round(self, tx: Transaction, number: int) -> None:
        tx._execute("UPDATE run SET drawn_round = ?", (number,))

    def recent_steps(self) -> list[float]:
        """The distances of the last published versions from their rounds' bases (oldest first)."""
        return [float(v) for v in json.loads(self._query("SELECT step_norms FROM run")[0]["step_norms"])]

    def set_recent_steps(self, tx: Transaction, norms: Sequence[float]) -> None:
        tx._execute("UPDATE run SET step_norms = ?", (json.dumps([float(v) for v in norms]),))

    def dp_state(self) -> DPState:
        row = self._query("SELECT clip, rounds, delta FROM dp_state")[0]
        return DPState(
            clip=None if row["clip"] is None else float(row["clip"]),
            rounds=int(row["rounds"]),
            delta=None if row["delta"] is None else float(row["delta"]),
        )

    def set_dp_state(self, tx: Transaction, state: DPState) -> None:
        """Store ``state``: SQLite keeps a float64 exactly, but a NaN only as NULL, which would
        read back as "not set": refused, as a negative round count is."""
        for name, value in (("clip", state.clip), ("delta", state.delta)):
            if value is not None and value != value:
                raise ValueError(f"a NaN DP {name} cannot be stored")
        if state.rounds < 0:
            raise ValueError(f"a negative count of noised rounds ({state.rounds}) cannot be stored")
        tx._execute("UPDATE dp_state SET clip = ?, rounds = ?, delta = ?", (state.clip, state.rounds, state.delta))

    # --- devices ------------------------------------------------------------------------

    def add_device(self, device_id: str, token_hash: str, platform: str | None) -> None:
        with self.transaction() as tx:
            tx._execute(
                "INSERT INTO devices (id, token_hash, platform, created_at) VALUES (?, ?, ?, ?)",
                (device_id, token_hash, platform, time.time()),
            )
        with self._lock:
            self._devices += 1

    def add_devices(self, devices: list[tuple[str, str]], platform: str | None) -> None:
        """Many (id, token hash) at once, in one transaction (the operator's bulk enrollment)."""
        now = time.time()
        with self.transaction() as tx:
            tx._executemany("INSERT INTO devices (id, token_hash, platform, created_at) VALUES (?, ?, ?, ?)",
                             [(d, h, platform, now) for d, h in devices])  # fmt: skip
        with self._lock:
            self._devices += len(devices)

    def device_by_token_hash(self, token_hash: str) -> Device | None:
        rows = self._query("SELECT id, token_hash, revoked FROM devices WHERE token_hash = ?", (token_hash,))
        return Device(str(rows[0]["id"]), str(rows[0]["token_hash"]), bool(rows[0]["revoked"])) if rows else None

    def revoke_device(self, device_id: str) -> bool:
        with self.transaction() as tx:
            return tx._execute("UPDATE devices SET revoked = 1 WHERE id = ?", (device_id,)) > 0

    def count_devices(self) -> int:
        """Enrolled devices, counted in memory (a COUNT(*) over a million rows on every anonymous
        /v1/status would be a denial of service)."""
        return self._devices

    def device_revoked(self, device_id: str) -> bool:
        return bool(self._query("SELECT 1 FROM devices WHERE id = ? AND revoked = 1", (device_id,)))

    # --- rounds, updates, versions ------------------------------------------------------

    def round(self, number: int) -> Round | None:
        if not 0 <= number <= SQLITE_MAX:
            return None
        rows = self._query("SELECT * FROM rounds WHERE round = ?", (number,))
        return _round(rows[0]) if rows else None

    def latest_round(self) -> Round | None:
        rows = self._query("SELECT * FROM rounds ORDER BY round DESC LIMIT 1")
        return _round(rows[0]) if rows else None

    def count_closed_rounds(self) -> int:
        return int(self._query("SELECT COUNT(*) AS n FROM rounds WHERE state = 'closed'")[0]["n"])

    def updates(self, number: int) -> list[StoredUpdate]:
        rows = self._query("SELECT * FROM updates WHERE round = ? ORDER BY received_at", (number,))
        return [
            StoredUpdate(
                r["round"],
                r["device_id"],
                r["num_samples"],
                r["base_version"],
                r["file"],
                json.loads(r["metrics"]),
                _bit(r["unclipped"]),
            )
            for r in rows
        ]

    def has_update(self, number: int, device_id: str) -> bool:
        return bool(self._query("SELECT 1 FROM updates WHERE round = ? AND device_id = ?", (number, device_id)))

    def count_updates(self, number: int) -> int:
        return int(self._query("SELECT COUNT(*) AS n FROM updates WHERE round = ?", (number,))[0]["n"])

    def insert_update(self, tx: Transaction, update: StoredUpdate, received_at: float) -> None:
        tx._execute(
            "INSERT INTO updates (round, device_id, num_samples, base_version, file, metrics, received_at, "
            "unclipped) VALUES (?, ?, ?, ?, ?, ?, ?, ?)",
            (update.round, update.device_id, update.num_samples, update.base_version, update.file,
             json.dumps(update.metrics), received_at, None if update.unclipped is None else int(update.unclipped)),
        )  # fmt: skip

    def delete_update(self, tx: Transaction, number: int, device_id: str) -> None:
        tx._execute("DELETE FROM updates WHERE round = ? AND device_id = ?", (number, device_id))

    # --- cohort slots -------------------------------------------------------------------

    def slot(self, number: int, device_id: str) -> Slot | None:
        rows = self._query("SELECT * FROM slots WHERE round = ? AND device_id = ?", (number, device_id))
        return Slot(number, device_id, rows[0]["assigned_at"], rows[0]["expires_at"]) if rows else None

    def count_held_slots(self, number: int, now: float) -> int:
        """Slots of round ``number`` that are taken at ``now``: not expired, or already reported."""
        return int(self._query(_HELD.format(what="COUNT(*) AS n"), (number, now))[0]["n"])

    def earliest_slot_expiry(self, number: int, now: float) -> float | None:
        """When the first slot of round ``number`` that is held but not reported will expire."""
        unreported = " AND s.expires_at IS NOT NULL AND NOT EXISTS " + _REPORTED
        rows = self._query(_HELD.format(what="MIN(s.expires_at) AS t") + unreported, (number, now))
        t = rows[0]["t"]
        return None if t is None else float(t)

    def put_slot(self, tx: Transaction, slot: Slot) -> None:
        tx._execute(
            "INSERT OR REPLACE INTO slots (round, device_id, assigned_at, expires_at) VALUES (?, ?, ?, ?)",
            (slot.round, slot.device_id, slot.assigned_at, slot.expires_at),
        )

    def delete_slot(self, tx: Transaction, number: int, device_id: str) -> None:
        tx._execute("DELETE FROM slots WHERE round = ? AND device_id = ?", (number, device_id))

    def put_checkin(self, tx: Transaction, number: int, device_id: str, now: float) -> None:
        tx._execute("INSERT OR IGNORE INTO checkins (round, device_id, at) VALUES (?, ?, ?)", (number, device_id, now))

    def checkins(self, number: int) -> list[str]:
        """The devices that checked in for round ``number``, in the order they came (a read: no
        lock held while a large cohort is drawn)."""
        rows = self._query("SELECT device_id FROM checkins WHERE round = ? ORDER BY at, device_id", (number,))
        return [str(r["device_id"]) for r in rows]

    def put_slots(self, tx: Transaction, slots: list[Slot]) -> None:
        tx._executemany(
            "INSERT OR REPLACE INTO slots (round, device_id, assigned_at, expires_at) VALUES (?, ?, ?, ?)",
            [(s.round, s.device_id, s.assigned_at, s.expires_at) for s in slots],
        )

    def participation_counts(self, first_round: int) -> dict[str, int]:
        """Every device's accepted updates in rounds ``first_round`` and later but those a rollback
        undid (as :meth:`participations`, for all devices in one query)."""
        rows = self._query(
            "SELECT u.device_id AS d, COUNT(*) AS n FROM updates u JOIN rounds r ON r.round = u.round "
            "WHERE u.round >= ? AND r.rolled_back = 0 GROUP BY u.device_id",
            (first_round,),
        )
        return {str(r["d"]): int(r["n"]) for r in rows}

    def reporters(self, number: int) -> set[str]:
        """Devices with an accepted update in round ``number``."""
        return {str(r["device_id"]) for r in self._query("SELECT device_id FROM updates WHERE round = ?", (number,))}

    def participations(self, device_id: str, first_round: int) -> int:
        """Accepted updates of ``device_id`` in rounds ``first_round`` and later, but those of rounds a
        rollback undid: their work was thrown away, so it uses up no device's participation."""
        rows = self._query(
            "SELECT COUNT(*) AS n FROM updates u JOIN rounds r ON r.round = u.round "
            "WHERE u.device_id = ? AND u.round >= ? AND r.rolled_back = 0",
            (device_id, first_round),
        )
        return int(rows[0]["n"])

    def mark_rolled_back(self, tx: Transaction, after_version: int, open_round: int | None) -> None:
        """The rounds a rollback to ``after_version`` undoes: those that closed into a later version,
        and the open one."""
        tx._execute("UPDATE rounds SET rolled_back = 1 WHERE state = 'closed' AND result_version > ?", (after_version,))
        if open_round is not None:
            tx._execute("UPDATE rounds SET rolled_back = 1 WHERE round = ?", (open_round,))

    def last_closed_round_seconds(self) -> float | None:
        """How long the most recently closed round was open (for pace steering)."""
        rows = self._query("SELECT closed_at - opened_at AS s FROM rounds WHERE state = 'closed' "
                          "ORDER BY round DESC LIMIT 1")  # fmt: skip
        return float(rows[0]["s"]) if rows else None

    # --- secure rounds (docs/SECAGG.md) ----------------------------------------------------

    def put_secagg_session(self, tx: Transaction, session: SecAggSession) -> None:
        tx._execute(
            "INSERT OR REPLACE INTO secagg_sessions (round, session, graph, threshold, clip, weight_cap, stage_ends, "
            "flags) VALUES (?, ?, ?, ?, ?, ?, ?, ?)",
            (session.round, session.session, json.dumps(session.graph, sort_keys=True), session.threshold,
             session.clip, session.weight_cap, json.dumps(session.stage_ends, sort_keys=True), session.flags),
        )  # fmt: skip

    def secagg_session(self, number: int) -> SecAggSession | None:
        rows = self._query("SELECT * FROM secagg_sessions WHERE round = ?", (min(number, SQLITE_MAX),))
        if not rows:
            return None
        r = rows[0]
        return SecAggSession(int(r["round"]), str(r["session"]), json.loads(r["graph"]), int(r["threshold"]),
                             float(r["clip"]), int(r["weight_cap"]), json.loads(r["stage_ends"]),
                             int(r["flags"]))  # fmt: skip

    def put_secagg_message(
        self, tx: Transaction, number: int, stage: str, device_id: str, body: bytes, now: float
    ) -> None:
        tx._execute(
            "INSERT INTO secagg_messages (round, stage, device_id, body, at) VALUES (?, ?, ?, ?, ?)",
            (number, stage, device_id, body, now),
        )

    def secagg_messages(self, number: int) -> list[tuple[str, str, bytes]]:
        """(stage, device, body) of round ``number``'s accepted messages, in the order they came."""
        rows = self._query(
            "SELECT stage, device_id, body FROM secagg_messages WHERE round = ? ORDER BY at, rowid", (number,)
        )
        return [(str(r["stage"]), str(r["device_id"]), bytes(r["body"])) for r in rows]

    # --- rounds (writes) ----------------------------------------------------------------

    def open_round(self, tx: Transaction, number: int, version: int, now: float, deadline: float | None) -> None:
        tx._execute(
            "INSERT INTO rounds (round, state, model_version, opened_at, deadline) VALUES (?, 'open', ?, ?, ?)",
            (number, version, now, deadline),
        )

    def start_round_clock(self, tx: Transaction, number: int, now: float, deadline: float | None) -> None:
        """Round ``number`` (open, waiting for devices) starts now: its window and deadline count from here."""
        tx._execute("UPDATE rounds SET opened_at = ?, deadline = ? WHERE round = ?", (now, deadline, number))

    def end_round(
        self,
        tx: Transaction,
        number: int,
        state: RoundState,
        now: float,
        result_version: int | None = None,
        metrics: dict[str, Any] | None = None,
        reason: str | None = None,
    ) -> None:
        """Record how round ``number`` ended; its update files are no longer needed."""
        tx._execute("DELETE FROM checkins WHERE round <= ?", (number,))  # drawn long ago, or never to be
        tx._execute(
            "UPDATE rounds SET state = ?, closed_at = ?, result_version = ?, metrics = ?, reason = ? WHERE round = ?",
            (state.value, now, result_version, json.dumps(metrics) if metrics is not None else None, reason, number),
        )
        tx._execute("UPDATE updates SET file = NULL WHERE round = ?", (number,))
        tx._execute("DELETE FROM slots WHERE round = ?", (number,))  # an ended round has no cohort
        tx._execute("DELETE FROM checkins WHERE round = ?", (number,))
        tx._execute("DELETE FROM secagg_messages WHERE round = ?", (number,))  # sealed shares, answers
        tx._execute("DELETE FROM secagg_sessions WHERE round = ?", (number,))

    def insert_version(
        self, tx: Transaction, version: int, sha256: str, file: str, now: float, from_round: int | None
    ) -> None:
        tx._execute(
            "INSERT OR REPLACE INTO model_versions (version, sha256, file, created_at, from_round) "
            "VALUES (?, ?, ?, ?, ?)",
            (version, sha256, file, now, from_round),
        )

    def model_version(self, version: int) -> ModelVersion | None:
        if not 0 <= version <= SQLITE_MAX:
            return None
        rows = self._query("SELECT version, sha256, file FROM model_versions WHERE version = ?", (version,))
        return ModelVersion(int(rows[0]["version"]), str(rows[0]["sha256"]), str(rows[0]["file"])) if rows else None

    def parent_version(self, version: int) -> int | None:
        """The version that the round which produced ``version`` trained (None: the export's
        version 0, an imported one, or its round gone)."""
        rows = self._query("SELECT r.model_version AS v FROM model_versions m JOIN rounds r ON r.round = m.from_round "
                          "WHERE m.version = ?", (version,))  # fmt: skip
        return int(rows[0]["v"]) if rows else None

    def versions(self) -> dict[int, str]:
        """Every recorded model version and its file's name, oldest first."""
        return {int(r["version"]): str(r["file"]) for r in self._query("SELECT version, file FROM model_versions "
                                                                      "ORDER BY version")}  # fmt: skip

    def delete_version(self, tx: Transaction, version: int) -> None:
        tx._execute("DELETE FROM model_versions WHERE version = ?", (version,))

    def latest_version(self) -> int:
        rows = self._query("SELECT MAX(version) AS v FROM model_versions")
        v = rows[0]["v"]
        return -1 if v is None else int(v)


# Slots of a round that are taken at a moment (the two parameters): not expired, or reported.
_REPORTED = "(SELECT 1 FROM updates u WHERE u.round = s.round AND u.device_id = s.device_id)"
_HELD = (
    "SELECT {what} FROM slots s WHERE s.round = ? AND (s.expires_at IS NULL OR s.expires_at > ? OR EXISTS "
    + _REPORTED
    + ")"
)


def _bit(value: int | None) -> bool | None:
    return None if value is None else bool(value)


def _round(row: sqlite3.Row) -> Round:
    return Round(
        round=row["round"],
        state=RoundState(row["state"]),
        model_version=row["model_version"],
        opened_at=row["opened_at"],
        deadline=row["deadline"],
        closed_at=row["closed_at"],
        result_version=row["result_version"],
        metrics=json.loads(row["metrics"]) if row["metrics"] else None,
        reason=row["reason"],
        rolled_back=bool(row["rolled_back"]),
    )
