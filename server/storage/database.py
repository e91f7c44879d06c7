"""The connection core: the database engine (SQLite's file, or PostgreSQL), write transactions,
and the run's own state (meta, run state, drawn round, recent steps, DP state). Each table group
is an object of its own (:attr:`Database.devices`, ``rounds``, ``versions``, ``cohort``,
``secagg``) that reads through :meth:`Database._query` and writes through a
:class:`Transaction`: none of them sees a connection, and their statements run on either engine."""

from __future__ import annotations

import json
import threading
from collections.abc import Iterator, Sequence
from contextlib import contextmanager
from pathlib import Path
from typing import Any, Protocol

from fedper.common.dp.state import DPState
from fedper.server.storage.closers import CloserRecords
from fedper.server.storage.cohort import CohortRecords
from fedper.server.storage.devices import DeviceRecords
from fedper.server.storage.errors import StorageError, storage_errors
from fedper.server.storage.nonces import NonceRecords
from fedper.server.storage.rate_events import RateEventRecords
from fedper.server.storage.records import RunState
from fedper.server.storage.regions import RegionRecords
from fedper.server.storage.rounds import RoundRecords
from fedper.server.storage.secagg import SecAggRecords
from fedper.server.storage.sqlite_engine import READERS, SqliteEngine
from fedper.server.storage.transaction import Row, Transaction, Writer
from fedper.server.storage.versions import VersionRecords

__all__ = ["READERS", "Database", "is_database_url"]


def is_database_url(location: str | Path) -> bool:
    """Whether ``location`` names a PostgreSQL database (``postgresql://`` or ``postgres://``)
    rather than an SQLite file."""
    return isinstance(location, str) and location.startswith(("postgresql://", "postgres://"))


class Engine(Protocol):
    """What :class:`Database` needs of an engine (:mod:`.sqlite_engine`, :mod:`.postgres_engine`)."""

    read_only: bool
    lock: threading.RLock

    @property
    def writer(self) -> Writer: ...

    def describe(self) -> str: ...
    def reopen_writable(self) -> None: ...
    def schema_version(self) -> int: ...
    def close(self) -> None: ...
    def begin(self) -> None: ...
    def commit(self) -> None: ...
    def rollback(self) -> None: ...
    def query_writer(self, sql: str, args: tuple[Any, ...]) -> list[Row]: ...
    def query(self, sql: str, args: tuple[Any, ...]) -> list[Row]: ...


class Database:
    """Writes on one connection, serialized by a lock; reads outside a transaction on a pool of
    connections; reads inside a transaction on the writer's connection, so that they see what the
    transaction wrote. ``location``: an SQLite file's path, or a ``postgresql://`` URL."""

    def __init__(self, location: Path | str, busy_timeout: float = 5.0, read_only: bool = False):
        self._engine: Engine
        if is_database_url(location):
            if read_only:
                raise StorageError("a PostgreSQL database is never opened read-only")
            from fedper.server.storage.postgres_engine import PostgresEngine  # psycopg only when asked for

            self._engine = PostgresEngine(str(location), busy_timeout)
        else:
            self._engine = SqliteEngine(Path(location), busy_timeout, read_only)
        self.busy_timeout = busy_timeout
        self._location = location
        self._writing: int | None = None  # the thread inside a transaction
        # One object per table group: each reads through _query and writes through a Transaction.
        self.devices = DeviceRecords(self._query, self.transaction)
        self.rounds = RoundRecords(self._query)
        self.versions = VersionRecords(self._query)
        self.cohort = CohortRecords(self._query)
        self.secagg = SecAggRecords(self._query)
        self.closers = CloserRecords(self._query)
        self.rate_events = RateEventRecords(self._query)
        self.nonces = NonceRecords(self._query)
        self.regions = RegionRecords(self._query)

    @property
    def shared(self) -> bool:
        """Whether other processes may use this database at once (PostgreSQL: replicas of
        ``fedper serve``); SQLite's file belongs to one process."""
        return is_database_url(self._location)

    @property
    def read_only(self) -> bool:
        return self._engine.read_only

    @property
    def location(self) -> str:
        """Where the database is (an SQLite file, or the Postgres server and database, no password)."""
        return self._engine.describe()

    def reopen_writable(self) -> None:
        """Leave read-only mode (the disk has room again): every connection is opened anew."""
        self._engine.reopen_writable()

    def schema_version(self) -> int:
        """The schema version the database is at."""
        return self._engine.schema_version()

    def close(self) -> None:
        self._engine.close()

    @contextmanager
    def transaction(self) -> Iterator[Transaction]:
        """One write transaction (the write lock held throughout): committed when the block ends,
        rolled back when it raises, so nothing of it stays."""
        engine = self._engine
        with engine.lock:
            with storage_errors():
                engine.begin()
            outer, self._writing = self._writing, threading.get_ident()
            tx = Transaction(engine.writer)
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
                    engine.commit()
            except StorageError:
                self._rollback()  # a failed COMMIT may leave the transaction open
                raise

    def _rollback(self) -> None:
        with storage_errors():
            self._engine.rollback()

    def _query(self, sql: str, args: tuple[Any, ...] = ()) -> list[Row]:
        with storage_errors():
            if self._writing == threading.get_ident():
                return self._engine.query_writer(sql, args)
            return self._engine.query(sql, args)

    def writable(self) -> None:
        """Take the write lock and let it go at once: DatabaseBusyError if another writer holds it."""
        with self._engine.lock, storage_errors():
            self._engine.begin()
            self._engine.rollback()

    # --- meta, the run's state, DP state ------------------------------------------------

    def get_meta(self, key: str) -> str | None:
        rows = self._query("SELECT value FROM meta WHERE key = ?", (key,))
        return str(rows[0]["value"]) if rows else None

    def set_meta(self, tx: Transaction, key: str, value: str) -> None:
        upsert = "INSERT INTO meta (key, value) VALUES (?, ?) ON CONFLICT (key) DO UPDATE SET value = excluded.value"
        tx._execute(upsert, (key, value))

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
        """Store ``state``: both engines keep a float64 exactly, but SQLite a NaN only as NULL, which
        would read back as "not set": refused, as a negative round count is."""
        for name, value in (("clip", state.clip), ("delta", state.delta)):
            if value is not None and value != value:
                raise ValueError(f"a NaN DP {name} cannot be stored")
        if state.rounds < 0:
            raise ValueError(f"a negative count of noised rounds ({state.rounds}) cannot be stored")
        tx._execute("UPDATE dp_state SET clip = ?, rounds = ?, delta = ?", (state.clip, state.rounds, state.delta))
