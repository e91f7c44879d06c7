"""The server's durable state: one SQLite database in WAL mode (devices, rounds, updates,
model versions) and a blob directory for weights (written to a temp file, fsynced, renamed).

Data directory layout::

    state.db                     SQLite database (WAL: state.db-wal, state.db-shm beside it)
    admin_token, enrollment_key  generated secrets (mode 0600), unless given by environment
    models/v<N>.safetensors      aggregated base of model version N (v0 = the export's)
    updates/r<R>/<device>.safetensors   accepted updates of the open round (deleted once aggregated)
    tmp/                         request bodies and files being written (emptied at start)
    quarantine/                  stored updates that could not be loaded at start (for inspection)

All SQL of the server lives here.
"""

from __future__ import annotations

import json
import queue
import sqlite3
import threading
import time
import urllib.parse
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from enum import StrEnum
from pathlib import Path
from typing import Any

READERS = 4  # read connections (each has its own page cache)
SQLITE_MAX = 2**63 - 1  # larger Python ints cannot be bound as SQLite integers: no such row
SCHEMA = """
CREATE TABLE IF NOT EXISTS meta (key TEXT PRIMARY KEY, value TEXT NOT NULL);
CREATE TABLE IF NOT EXISTS devices (
    id TEXT PRIMARY KEY,
    token_hash TEXT NOT NULL UNIQUE,
    platform TEXT,
    created_at REAL NOT NULL,
    revoked INTEGER NOT NULL DEFAULT 0
);
CREATE TABLE IF NOT EXISTS model_versions (
    version INTEGER PRIMARY KEY,
    sha256 TEXT NOT NULL,
    file TEXT NOT NULL,
    created_at REAL NOT NULL,
    from_round INTEGER
);
CREATE TABLE IF NOT EXISTS rounds (
    round INTEGER PRIMARY KEY,
    state TEXT NOT NULL CHECK (state IN ('open', 'closed', 'abandoned', 'stopped')),
    model_version INTEGER NOT NULL,
    opened_at REAL NOT NULL,
    deadline REAL,
    closed_at REAL,
    result_version INTEGER,
    metrics TEXT,
    reason TEXT,
    rolled_back INTEGER NOT NULL DEFAULT 0
);
CREATE TABLE IF NOT EXISTS updates (
    round INTEGER NOT NULL,
    device_id TEXT NOT NULL,
    num_samples INTEGER NOT NULL,
    base_version INTEGER NOT NULL,
    file TEXT,
    metrics TEXT NOT NULL,
    received_at REAL NOT NULL,
    unclipped INTEGER,
    PRIMARY KEY (round, device_id)
);
CREATE INDEX IF NOT EXISTS updates_by_device ON updates (device_id, round);
CREATE TABLE IF NOT EXISTS checkins (
    round INTEGER NOT NULL,
    device_id TEXT NOT NULL,
    at REAL NOT NULL,
    PRIMARY KEY (round, device_id)
);
CREATE TABLE IF NOT EXISTS slots (
    round INTEGER NOT NULL,
    device_id TEXT NOT NULL,
    assigned_at REAL NOT NULL,
    expires_at REAL,
    PRIMARY KEY (round, device_id)
);
CREATE TABLE IF NOT EXISTS secagg_sessions (
    round INTEGER PRIMARY KEY,
    session TEXT NOT NULL,
    graph TEXT NOT NULL,
    threshold INTEGER NOT NULL,
    clip REAL NOT NULL,
    weight_cap INTEGER NOT NULL,
    stage_ends TEXT NOT NULL,
    flags INTEGER NOT NULL DEFAULT 0
);
CREATE TABLE IF NOT EXISTS secagg_messages (
    round INTEGER NOT NULL,
    stage TEXT NOT NULL,
    device_id TEXT NOT NULL,
    body BLOB NOT NULL,
    at REAL NOT NULL,
    PRIMARY KEY (round, stage, device_id)
);
"""


class RoundState(StrEnum):
    """How a round stands (the ``rounds`` table's CHECK; the protocol's ``RoundInfo.state``)."""

    OPEN = "open"
    CLOSED = "closed"  # aggregated: it made a model version
    ABANDONED = "abandoned"  # ended without enough updates, or by a restart or rollback
    STOPPED = "stopped"  # the operator stopped the run while it was open


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
    unclipped: bool | None = None  # under DP (revision 1.5): the delta was within the clip before clipping


class DatabaseBusyError(Exception):
    """SQLite stayed locked for longer than the busy timeout (another writer holds it): the
    request changed nothing and is answered 503 with a Retry-After."""


@contextmanager
def _busy_as_error() -> Iterator[None]:
    try:
        yield
    except sqlite3.OperationalError as exc:
        if "locked" in str(exc) or "busy" in str(exc):
            raise DatabaseBusyError(str(exc)) from exc
        raise


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
        self._devices = int(self.query("SELECT COUNT(*) AS n FROM devices")[0]["n"])

    def _open_writer(self) -> sqlite3.Connection:
        conn = self._connect()
        if not self.read_only:
            with self._lock:
                conn.execute("PRAGMA journal_mode=WAL")
                conn.execute("PRAGMA synchronous=FULL")  # a committed 202 survives power loss
                conn.execute("PRAGMA foreign_keys=ON")
                self._conn = conn
                self._migrate()
                conn.executescript(SCHEMA)
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
            self._conn = self._open_writer()
            self._generation += 1
            self._close_idle()  # those in use are closed when they come back
        old.close()

    def _migrate(self) -> None:
        """Data directories of protocol revision 1.0 cannot record a ``stopped`` round: widen the
        check; those before 1.5 have no column for an update's DP bit, those before 1.7 none for
        why a round was abandoned: add them."""
        columns = {r["name"] for r in self._conn.execute("PRAGMA table_info(updates)")}
        if columns and "unclipped" not in columns:
            self._conn.execute("ALTER TABLE updates ADD COLUMN unclipped INTEGER")
        columns = {r["name"] for r in self._conn.execute("PRAGMA table_info(secagg_sessions)")}
        if columns and "flags" not in columns:  # a secure session of the first revision 1.6 server
            self._conn.execute("ALTER TABLE secagg_sessions ADD COLUMN flags INTEGER NOT NULL DEFAULT 0")
        columns = {r["name"] for r in self._conn.execute("PRAGMA table_info(rounds)")}
        if columns and "reason" not in columns:  # before revision 1.7: no recorded reason for an abandoned round
            self._conn.execute("ALTER TABLE rounds ADD COLUMN reason TEXT")
        if columns and "rolled_back" not in columns:  # before revision 1.8: no mark of a round a rollback undid
            self._conn.execute("ALTER TABLE rounds ADD COLUMN rolled_back INTEGER NOT NULL DEFAULT 0")
        rows = list(self._conn.execute("SELECT sql FROM sqlite_master WHERE type = 'table' AND name = 'rounds'"))
        if not rows or "'stopped'" in rows[0]["sql"]:
            return
        rounds_schema = SCHEMA[SCHEMA.index("CREATE TABLE IF NOT EXISTS rounds") :].split(";")[0]
        self._conn.execute("BEGIN IMMEDIATE")
        try:
            self._conn.execute("ALTER TABLE rounds RENAME TO rounds_rev10")
            self._conn.execute(rounds_schema)
            self._conn.execute(
                "INSERT INTO rounds (round, state, model_version, opened_at, deadline, closed_at, result_version, "
                "metrics) SELECT round, state, model_version, opened_at, deadline, closed_at, result_version, metrics "
                "FROM rounds_rev10"
            )
            self._conn.execute("DROP TABLE rounds_rev10")
        except BaseException:
            self._conn.execute("ROLLBACK")
            raise
        self._conn.execute("COMMIT")

    def close(self) -> None:
        with self._lock:
            self._close_idle()
            self._conn.close()

    @contextmanager
    def transaction(self) -> Iterator[sqlite3.Connection]:
        with self._lock:
            with _busy_as_error():
                self._conn.execute("BEGIN IMMEDIATE")
            outer, self._writing = self._writing, threading.get_ident()
            try:
                yield self._conn
            except BaseException:
                self._conn.execute("ROLLBACK")
                raise
            finally:
                self._writing = outer
            with _busy_as_error():
                self._conn.execute("COMMIT")

    def query(self, sql: str, args: tuple[Any, ...] = ()) -> list[sqlite3.Row]:
        if self._writing == threading.get_ident():
            return list(self._conn.execute(sql, args))
        with _busy_as_error(), self._reader() as conn:
            return list(conn.execute(sql, args))

    def writable(self) -> None:
        """Take the write lock and let it go at once: DatabaseBusyError if another writer holds it."""
        with self._lock, _busy_as_error():
            self._conn.execute("BEGIN IMMEDIATE")
            self._conn.execute("ROLLBACK")

    # --- meta ---------------------------------------------------------------------------

    def get_meta(self, key: str) -> str | None:
        rows = self.query("SELECT value FROM meta WHERE key = ?", (key,))
        return str(rows[0]["value"]) if rows else None

    def set_meta(self, conn: sqlite3.Connection, key: str, value: str) -> None:
        conn.execute("INSERT OR REPLACE INTO meta (key, value) VALUES (?, ?)", (key, value))

    # --- devices ------------------------------------------------------------------------

    def add_device(self, device_id: str, token_hash: str, platform: str | None) -> None:
        with self.transaction() as conn:
            conn.execute(
                "INSERT INTO devices (id, token_hash, platform, created_at) VALUES (?, ?, ?, ?)",
                (device_id, token_hash, platform, time.time()),
            )
        with self._lock:
            self._devices += 1

    def add_devices(self, devices: list[tuple[str, str]], platform: str | None) -> None:
        """Many (id, token hash) at once, in one transaction (the operator's bulk enrollment)."""
        now = time.time()
        with self.transaction() as conn:
            conn.executemany("INSERT INTO devices (id, token_hash, platform, created_at) VALUES (?, ?, ?, ?)",
                             [(d, h, platform, now) for d, h in devices])  # fmt: skip
        with self._lock:
            self._devices += len(devices)

    def device_by_token_hash(self, token_hash: str) -> Device | None:
        rows = self.query("SELECT id, token_hash, revoked FROM devices WHERE token_hash = ?", (token_hash,))
        return Device(str(rows[0]["id"]), str(rows[0]["token_hash"]), bool(rows[0]["revoked"])) if rows else None

    def revoke_device(self, device_id: str) -> bool:
        with self.transaction() as conn:
            cur = conn.execute("UPDATE devices SET revoked = 1 WHERE id = ?", (device_id,))
            return cur.rowcount > 0

    def count_devices(self) -> int:
        """Enrolled devices, counted in memory (a COUNT(*) over a million rows on every anonymous
        /v1/status would be a denial of service)."""
        return self._devices

    def device_revoked(self, device_id: str) -> bool:
        return bool(self.query("SELECT 1 FROM devices WHERE id = ? AND revoked = 1", (device_id,)))

    # --- rounds, updates, versions ------------------------------------------------------

    def round(self, number: int) -> Round | None:
        if not 0 <= number <= SQLITE_MAX:
            return None
        rows = self.query("SELECT * FROM rounds WHERE round = ?", (number,))
        return _round(rows[0]) if rows else None

    def latest_round(self) -> Round | None:
        rows = self.query("SELECT * FROM rounds ORDER BY round DESC LIMIT 1")
        return _round(rows[0]) if rows else None

    def count_closed_rounds(self) -> int:
        return int(self.query("SELECT COUNT(*) AS n FROM rounds WHERE state = 'closed'")[0]["n"])

    def updates(self, number: int) -> list[StoredUpdate]:
        rows = self.query("SELECT * FROM updates WHERE round = ? ORDER BY received_at", (number,))
        return [
            StoredUpdate(
                r["round"],
                r["device_id"],
                r["num_samples"],
                r["base_version"],
                r["file"],
                json.loads(r["metrics"]),
                _bit(r["unclipped"] if "unclipped" in r.keys() else None),  # noqa: SIM118 (a Row: keys)
            )
            for r in rows
        ]

    def has_update(self, number: int, device_id: str) -> bool:
        return bool(self.query("SELECT 1 FROM updates WHERE round = ? AND device_id = ?", (number, device_id)))

    def count_updates(self, number: int) -> int:
        return int(self.query("SELECT COUNT(*) AS n FROM updates WHERE round = ?", (number,))[0]["n"])

    def insert_update(self, conn: sqlite3.Connection, update: StoredUpdate, received_at: float) -> None:
        conn.execute(
            "INSERT INTO updates (round, device_id, num_samples, base_version, file, metrics, received_at, "
            "unclipped) VALUES (?, ?, ?, ?, ?, ?, ?, ?)",
            (update.round, update.device_id, update.num_samples, update.base_version, update.file,
             json.dumps(update.metrics), received_at, None if update.unclipped is None else int(update.unclipped)),
        )  # fmt: skip

    def delete_update(self, conn: sqlite3.Connection, number: int, device_id: str) -> None:
        conn.execute("DELETE FROM updates WHERE round = ? AND device_id = ?", (number, device_id))

    # --- cohort slots -------------------------------------------------------------------

    def slot(self, number: int, device_id: str) -> Slot | None:
        rows = self.query("SELECT * FROM slots WHERE round = ? AND device_id = ?", (number, device_id))
        return Slot(number, device_id, rows[0]["assigned_at"], rows[0]["expires_at"]) if rows else None

    def count_held_slots(self, number: int, now: float) -> int:
        """Slots of round ``number`` that are taken at ``now``: not expired, or already reported."""
        return int(self.query(_HELD.format(what="COUNT(*) AS n"), (number, now))[0]["n"])

    def earliest_slot_expiry(self, number: int, now: float) -> float | None:
        """When the first slot of round ``number`` that is held but not reported will expire."""
        unreported = " AND s.expires_at IS NOT NULL AND NOT EXISTS " + _REPORTED
        rows = self.query(_HELD.format(what="MIN(s.expires_at) AS t") + unreported, (number, now))
        t = rows[0]["t"]
        return None if t is None else float(t)

    def put_slot(self, conn: sqlite3.Connection, slot: Slot) -> None:
        conn.execute(
            "INSERT OR REPLACE INTO slots (round, device_id, assigned_at, expires_at) VALUES (?, ?, ?, ?)",
            (slot.round, slot.device_id, slot.assigned_at, slot.expires_at),
        )

    def delete_slot(self, conn: sqlite3.Connection, number: int, device_id: str) -> None:
        conn.execute("DELETE FROM slots WHERE round = ? AND device_id = ?", (number, device_id))

    def put_checkin(self, conn: sqlite3.Connection, number: int, device_id: str, now: float) -> None:
        conn.execute("INSERT OR IGNORE INTO checkins (round, device_id, at) VALUES (?, ?, ?)", (number, device_id, now))

    def checkins(self, number: int) -> list[str]:
        """The devices that checked in for round ``number``, in the order they came (a read: no
        lock held while a large cohort is drawn)."""
        rows = self.query("SELECT device_id FROM checkins WHERE round = ? ORDER BY at, device_id", (number,))
        return [str(r["device_id"]) for r in rows]

    def put_slots(self, conn: sqlite3.Connection, slots: list[Slot]) -> None:
        conn.executemany(
            "INSERT OR REPLACE INTO slots (round, device_id, assigned_at, expires_at) VALUES (?, ?, ?, ?)",
            [(s.round, s.device_id, s.assigned_at, s.expires_at) for s in slots],
        )

    def participation_counts(self, first_round: int) -> dict[str, int]:
        """Every device's accepted updates in rounds ``first_round`` and later but those a rollback
        undid (as :meth:`participations`, for all devices in one query)."""
        rows = self.query(
            "SELECT u.device_id AS d, COUNT(*) AS n FROM updates u JOIN rounds r ON r.round = u.round "
            "WHERE u.round >= ? AND r.rolled_back = 0 GROUP BY u.device_id",
            (first_round,),
        )
        return {str(r["d"]): int(r["n"]) for r in rows}

    def reporters(self, number: int) -> set[str]:
        """Devices with an accepted update in round ``number``."""
        return {str(r["device_id"]) for r in self.query("SELECT device_id FROM updates WHERE round = ?", (number,))}

    def participations(self, device_id: str, first_round: int) -> int:
        """Accepted updates of ``device_id`` in rounds ``first_round`` and later, but those of rounds a
        rollback undid: their work was thrown away, so it uses up no device's participation."""
        rows = self.query(
            "SELECT COUNT(*) AS n FROM updates u JOIN rounds r ON r.round = u.round "
            "WHERE u.device_id = ? AND u.round >= ? AND r.rolled_back = 0",
            (device_id, first_round),
        )
        return int(rows[0]["n"])

    def mark_rolled_back(self, conn: sqlite3.Connection, after_version: int, open_round: int | None) -> None:
        """The rounds a rollback to ``after_version`` undoes: those that closed into a later version,
        and the open one."""
        conn.execute(
            "UPDATE rounds SET rolled_back = 1 WHERE state = 'closed' AND result_version > ?", (after_version,)
        )
        if open_round is not None:
            conn.execute("UPDATE rounds SET rolled_back = 1 WHERE round = ?", (open_round,))

    def last_closed_round_seconds(self) -> float | None:
        """How long the most recently closed round was open (for pace steering)."""
        rows = self.query("SELECT closed_at - opened_at AS s FROM rounds WHERE state = 'closed' "
                          "ORDER BY round DESC LIMIT 1")  # fmt: skip
        return float(rows[0]["s"]) if rows else None

    # --- secure rounds (docs/SECAGG.md) ----------------------------------------------------

    def put_secagg_session(self, conn: sqlite3.Connection, session: SecAggSession) -> None:
        conn.execute(
            "INSERT OR REPLACE INTO secagg_sessions (round, session, graph, threshold, clip, weight_cap, stage_ends, "
            "flags) VALUES (?, ?, ?, ?, ?, ?, ?, ?)",
            (session.round, session.session, json.dumps(session.graph, sort_keys=True), session.threshold,
             session.clip, session.weight_cap, json.dumps(session.stage_ends, sort_keys=True), session.flags),
        )  # fmt: skip

    def secagg_session(self, number: int) -> SecAggSession | None:
        rows = self.query("SELECT * FROM secagg_sessions WHERE round = ?", (min(number, SQLITE_MAX),))
        if not rows:
            return None
        r = rows[0]
        return SecAggSession(int(r["round"]), str(r["session"]), json.loads(r["graph"]), int(r["threshold"]),
                             float(r["clip"]), int(r["weight_cap"]), json.loads(r["stage_ends"]),
                             int(r["flags"]))  # fmt: skip

    def put_secagg_message(
        self, conn: sqlite3.Connection, number: int, stage: str, device_id: str, body: bytes, now: float
    ) -> None:
        conn.execute(
            "INSERT INTO secagg_messages (round, stage, device_id, body, at) VALUES (?, ?, ?, ?, ?)",
            (number, stage, device_id, body, now),
        )

    def secagg_messages(self, number: int) -> list[tuple[str, str, bytes]]:
        """(stage, device, body) of round ``number``'s accepted messages, in the order they came."""
        rows = self.query(
            "SELECT stage, device_id, body FROM secagg_messages WHERE round = ? ORDER BY at, rowid", (number,)
        )
        return [(str(r["stage"]), str(r["device_id"]), bytes(r["body"])) for r in rows]

    # --- rounds (writes) ----------------------------------------------------------------

    def open_round(
        self, conn: sqlite3.Connection, number: int, version: int, now: float, deadline: float | None
    ) -> None:
        conn.execute(
            "INSERT INTO rounds (round, state, model_version, opened_at, deadline) VALUES (?, 'open', ?, ?, ?)",
            (number, version, now, deadline),
        )

    def start_round_clock(self, conn: sqlite3.Connection, number: int, now: float, deadline: float | None) -> None:
        """Round ``number`` (open, waiting for devices) starts now: its window and deadline count from here."""
        conn.execute("UPDATE rounds SET opened_at = ?, deadline = ? WHERE round = ?", (now, deadline, number))

    def end_round(
        self,
        conn: sqlite3.Connection,
        number: int,
        state: RoundState,
        now: float,
        result_version: int | None = None,
        metrics: dict[str, Any] | None = None,
        reason: str | None = None,
    ) -> None:
        """Record how round ``number`` ended; its update files are no longer needed."""
        conn.execute("DELETE FROM checkins WHERE round <= ?", (number,))  # drawn long ago, or never to be
        conn.execute(
            "UPDATE rounds SET state = ?, closed_at = ?, result_version = ?, metrics = ?, reason = ? WHERE round = ?",
            (state.value, now, result_version, json.dumps(metrics) if metrics is not None else None, reason, number),
        )
        conn.execute("UPDATE updates SET file = NULL WHERE round = ?", (number,))
        conn.execute("DELETE FROM slots WHERE round = ?", (number,))  # an ended round has no cohort
        conn.execute("DELETE FROM checkins WHERE round = ?", (number,))
        conn.execute("DELETE FROM secagg_messages WHERE round = ?", (number,))  # sealed shares, answers
        conn.execute("DELETE FROM secagg_sessions WHERE round = ?", (number,))

    def insert_version(
        self, conn: sqlite3.Connection, version: int, sha256: str, file: str, now: float, from_round: int | None
    ) -> None:
        conn.execute(
            "INSERT OR REPLACE INTO model_versions (version, sha256, file, created_at, from_round) "
            "VALUES (?, ?, ?, ?, ?)",
            (version, sha256, file, now, from_round),
        )

    def model_version(self, version: int) -> ModelVersion | None:
        if not 0 <= version <= SQLITE_MAX:
            return None
        rows = self.query("SELECT version, sha256, file FROM model_versions WHERE version = ?", (version,))
        return ModelVersion(int(rows[0]["version"]), str(rows[0]["sha256"]), str(rows[0]["file"])) if rows else None

    def parent_version(self, version: int) -> int | None:
        """The version that the round which produced ``version`` trained (None: the export's
        version 0, an imported one, or its round gone)."""
        rows = self.query("SELECT r.model_version AS v FROM model_versions m JOIN rounds r ON r.round = m.from_round "
                          "WHERE m.version = ?", (version,))  # fmt: skip
        return int(rows[0]["v"]) if rows else None

    def versions(self) -> dict[int, str]:
        """Every recorded model version and its file's name, oldest first."""
        return {int(r["version"]): str(r["file"]) for r in self.query("SELECT version, file FROM model_versions "
                                                                      "ORDER BY version")}  # fmt: skip

    def delete_version(self, conn: sqlite3.Connection, version: int) -> None:
        conn.execute("DELETE FROM model_versions WHERE version = ?", (version,))

    def latest_version(self) -> int:
        rows = self.query("SELECT MAX(version) AS v FROM model_versions")
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
