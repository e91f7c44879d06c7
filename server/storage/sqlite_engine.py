"""SQLite, the embedded default: one database file in WAL mode, one writer connection (its
transactions serialized by a lock and SQLite's own write lock) and a pool of readers."""

from __future__ import annotations

import queue
import sqlite3
import threading
import urllib.parse
from collections.abc import Iterator, Sequence
from contextlib import contextmanager
from pathlib import Path
from typing import Any

from fedper.server.storage import migrations
from fedper.server.storage.errors import storage_errors
from fedper.server.storage.transaction import Row

READERS = 4  # read connections (each has its own page cache)


class _SqliteWriter:
    def __init__(self, conn: sqlite3.Connection) -> None:
        self._conn = conn

    def execute(self, sql: str, args: tuple[Any, ...]) -> int:
        return self._conn.execute(sql, args).rowcount

    def executemany(self, sql: str, rows: Sequence[tuple[Any, ...]]) -> None:
        self._conn.executemany(sql, rows)


class SqliteEngine:
    """Readers never wait for the writer, nor for each other (WAL)."""

    def __init__(self, path: Path, busy_timeout: float, read_only: bool) -> None:
        self.path, self.busy_timeout, self.read_only = path, busy_timeout, read_only
        self.lock = threading.RLock()
        self._idle: queue.LifoQueue[tuple[int, sqlite3.Connection]] = queue.LifoQueue()
        self._slots = threading.BoundedSemaphore(READERS)
        self._generation = 0  # bumped by reopen_writable(): readers of an older one are closed
        self._conn = self._open_writer()
        self.writer = _SqliteWriter(self._conn)

    def describe(self) -> str:
        return str(self.path)

    def _open_writer(self) -> sqlite3.Connection:
        """The writer's connection, the schema brought to this server's version (a database opened
        read-only cannot be upgraded: it must be at that version already)."""
        with storage_errors():
            conn = self._connect()
            try:
                if self.read_only:
                    migrations.check_current(conn)
                else:
                    with self.lock:
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
        with self.lock:
            old = self._conn
            self.read_only = False
            try:
                self._conn = self._open_writer()
            except BaseException:
                self.read_only = True
                raise
            self.writer = _SqliteWriter(self._conn)
            self._generation += 1
            self._close_idle()  # those in use are closed when they come back
        old.close()

    def schema_version(self) -> int:
        with storage_errors(), self.lock:
            return migrations.version(self._conn)

    def close(self) -> None:
        with self.lock:
            self._close_idle()
            self._conn.close()

    def begin(self) -> None:
        self._conn.execute("BEGIN IMMEDIATE")

    def commit(self) -> None:
        self._conn.execute("COMMIT")

    def rollback(self) -> None:
        if self._conn.in_transaction:
            self._conn.execute("ROLLBACK")

    def query_writer(self, sql: str, args: tuple[Any, ...]) -> list[Row]:
        return list(self._conn.execute(sql, args))

    def query(self, sql: str, args: tuple[Any, ...]) -> list[Row]:
        with self._reader() as conn:
            return list(conn.execute(sql, args))
