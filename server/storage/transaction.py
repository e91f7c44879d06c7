"""What the table groups get from the connection core: a write :class:`Transaction` and a
:class:`Query` for reads. Neither hands out the connection itself."""

from __future__ import annotations

import sqlite3
from collections.abc import Sequence
from contextlib import AbstractContextManager
from typing import Any, Protocol

from fedper.server.storage.errors import StorageError, storage_errors

SQLITE_MAX = 2**63 - 1  # larger Python ints cannot be bound as SQLite integers: no such row


class Query(Protocol):
    """A read: the rows of one statement (inside a transaction, on the writer's connection, so
    that it sees what the transaction wrote)."""

    def __call__(self, sql: str, args: tuple[Any, ...] = ()) -> list[sqlite3.Row]: ...


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
        with storage_errors():
            return self._live().execute(sql, args).rowcount

    def _executemany(self, sql: str, rows: Sequence[tuple[Any, ...]]) -> None:
        with storage_errors():
            self._live().executemany(sql, rows)

    def _end(self) -> None:
        self._conn = None


class Begin(Protocol):
    """Opens a write transaction (:meth:`Database.transaction`), for a group whose method writes
    on its own."""

    def __call__(self) -> AbstractContextManager[Transaction]: ...
