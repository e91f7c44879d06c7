"""The connection core: one SQLite database in WAL mode, its writer and pool of readers, write
transactions, and the run's own state (meta, run state, drawn round, recent steps, DP state).
Each table group is an object of its own (:attr:`Database.devices`, ``rounds``, ``versions``,
``cohort``, ``secagg``) that reads through :meth:`Database._query` and writes through a
:class:`Transaction`: none of them sees the connection."""

from __future__ import annotations

import json
import queue
import sqlite3
import threading
import urllib.parse
from collections.abc import Iterator, Sequence
from contextlib import contextmanager
from pathlib import Path
from typing import Any

from fedper.common.dp.state import DPState
from fedper.server.storage import migrations
from fedper.server.storage.cohort import CohortRecords
from fedper.server.storage.devices import DeviceRecords
from fedper.server.storage.errors import StorageError, storage_errors
from fedper.server.storage.records import RunState
from fedper.server.storage.rounds import RoundRecords
from fedper.server.storage.secagg import SecAggRecords
from fedper.server.storage.transaction import Transaction
from fedper.server.storage.versions import VersionRecords

READERS = 4  # read connections (each has its own page cache)


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
        # One object per table group: each reads through _query and writes through a Transaction.
        self.devices = DeviceRecords(self._query, self.transaction)
        self.rounds = RoundRecords(self._query)
        self.versions = VersionRecords(self._query)
        self.cohort = CohortRecords(self._query)
        self.secagg = SecAggRecords(self._query)

    def _open_writer(self) -> sqlite3.Connection:
        """The writer's connection, the schema brought to this server's version (a database opened
        read-only cannot be upgraded: it must be at that version already)."""
        with storage_errors():
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
        with storage_errors(), self._lock:
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
            with storage_errors():
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
                with storage_errors():
                    self._conn.execute("COMMIT")
            except StorageError:
                self._rollback()  # a failed COMMIT may leave the transaction open
                raise

    def _rollback(self) -> None:
        if self._conn.in_transaction:
            with storage_errors():
                self._conn.execute("ROLLBACK")

    def _query(self, sql: str, args: tuple[Any, ...] = ()) -> list[sqlite3.Row]:
        if self._writing == threading.get_ident():
            with storage_errors():
                return list(self._conn.execute(sql, args))
        with storage_errors(), self._reader() as conn:
            return list(conn.execute(sql, args))

    def writable(self) -> None:
        """Take the write lock and let it go at once: DatabaseBusyError if another writer holds it."""
        with self._lock, storage_errors():
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
