"""PostgreSQL (``--database postgresql://...``): the same statements as SQLite's, one writer
connection and a pool of readers, like :mod:`.sqlite_engine`.

Writes are serialized as SQLite serializes them: every write transaction first takes one
transaction-scoped advisory lock (:data:`WRITE_LOCK`), so two writers never interleave, whether
in one process or in several sharing the database. A writer that waits for it longer than the
busy timeout gets :class:`DatabaseBusyError` (503, nothing changed), as on SQLite. Reads outside
a transaction run in autocommit, each statement on its own snapshot of committed data.
"""

from __future__ import annotations

import functools
import queue
import threading
from collections.abc import Iterator, Sequence
from contextlib import contextmanager
from typing import Any

import psycopg
from psycopg.rows import dict_row

from fedper.server.storage import postgres_schema
from fedper.server.storage.errors import storage_errors
from fedper.server.storage.transaction import Row

READERS = 4
WRITE_LOCK = 0x66656470_65720001  # pg_advisory_xact_lock's key for "a fedper write" ("fedper" and 1)
SCHEMA_LOCK = 0x66656470_65720002  # held while the schema is made or upgraded

Connection = psycopg.Connection[dict[str, Any]]


@functools.lru_cache(maxsize=1024)
def postgres_sql(sql: str) -> str:
    """A statement written for both engines, with psycopg's placeholders: ``?`` becomes ``%s``
    (no statement of the storage has a ``?`` or a ``%`` of its own inside a literal)."""
    return sql.replace("%", "%%").replace("?", "%s")


class _PostgresWriter:
    def __init__(self, conn: Connection) -> None:
        self._conn = conn

    def execute(self, sql: str, args: tuple[Any, ...]) -> int:
        return self._conn.execute(postgres_sql(sql), args).rowcount

    def executemany(self, sql: str, rows: Sequence[tuple[Any, ...]]) -> None:
        with self._conn.cursor() as cur:
            cur.executemany(postgres_sql(sql), rows)


class PostgresEngine:
    read_only = False  # a full disk is Postgres' to handle: its writes fail, and the server drains

    def __init__(self, url: str, busy_timeout: float) -> None:
        self.url, self.busy_timeout = url, busy_timeout
        self.lock = threading.RLock()
        self._idle: queue.LifoQueue[Connection] = queue.LifoQueue()
        self._slots = threading.BoundedSemaphore(READERS)
        with storage_errors():
            self._conn = self._connect()
            try:
                self._migrate()
            except BaseException:
                self._conn.close()
                raise
        self.writer = _PostgresWriter(self._conn)

    def describe(self) -> str:
        info = self._conn.info
        return f"postgresql://{info.user}@{info.host}:{info.port}/{info.dbname}"  # no password

    def _connect(self) -> Connection:
        conn: Connection = psycopg.connect(self.url, autocommit=True, row_factory=dict_row,
                                           connect_timeout=max(1, round(self.busy_timeout)))  # fmt: skip
        conn.execute(f"SET lock_timeout = {max(1, round(self.busy_timeout * 1000))}")
        return conn

    def _migrate(self) -> None:
        """Make or upgrade the schema, one step per transaction, under a lock that keeps two
        servers starting on the same database from running a step twice."""
        with self.lock:
            self._conn.execute("BEGIN")
            try:
                self._conn.execute("SELECT pg_advisory_xact_lock(%s)", (SCHEMA_LOCK,))
                self._conn.execute("CREATE TABLE IF NOT EXISTS schema_version (version BIGINT NOT NULL)")
                rows = self._conn.execute("SELECT version FROM schema_version").fetchall()
                current = int(rows[0]["version"]) if rows else 0
                for step in postgres_schema.plan(current):
                    for statement in postgres_schema.STEPS[step]:
                        self._conn.execute(statement)
                    self._conn.execute("DELETE FROM schema_version")
                    self._conn.execute("INSERT INTO schema_version (version) VALUES (%s)", (step,))
            except BaseException:
                self._conn.execute("ROLLBACK")
                raise
            self._conn.execute("COMMIT")

    @contextmanager
    def _reader(self) -> Iterator[Connection]:
        with self._slots:
            try:
                conn = self._idle.get_nowait()
            except queue.Empty:
                conn = self._connect()
            if conn.closed:
                conn = self._connect()
            try:
                yield conn
            finally:
                if conn.info.transaction_status == psycopg.pq.TransactionStatus.IDLE:
                    self._idle.put(conn)
                else:  # a broken connection: the next reader opens a new one
                    conn.close()

    def reopen_writable(self) -> None:
        """Nothing to reopen: Postgres is never opened read-only."""

    def schema_version(self) -> int:
        with storage_errors(), self.lock:
            return int(self._conn.execute("SELECT version FROM schema_version").fetchall()[0]["version"])

    def close(self) -> None:
        with self.lock:
            while True:
                try:
                    self._idle.get_nowait().close()
                except queue.Empty:
                    break
            self._conn.close()

    def begin(self) -> None:
        self._conn.execute("BEGIN")
        try:
            self._conn.execute("SELECT pg_advisory_xact_lock(%s)", (WRITE_LOCK,))
        except BaseException:  # waited past lock_timeout: nothing was written
            self._conn.execute("ROLLBACK")
            raise

    def commit(self) -> None:
        self._conn.execute("COMMIT")

    def rollback(self) -> None:
        if self._conn.info.transaction_status != psycopg.pq.TransactionStatus.IDLE:
            self._conn.execute("ROLLBACK")

    def query_writer(self, sql: str, args: tuple[Any, ...]) -> list[Row]:
        return list[Row](self._conn.execute(postgres_sql(sql), args).fetchall())

    def query(self, sql: str, args: tuple[Any, ...]) -> list[Row]:
        with self._reader() as conn:
            return list[Row](conn.execute(postgres_sql(sql), args).fetchall())
