"""What the table groups get from the connection core: a write :class:`Transaction` and a
:class:`Query` for reads. Neither hands out the connection itself."""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from contextlib import AbstractContextManager
from typing import Any, Protocol

from fedper.server.storage.errors import StorageError, storage_errors

SQLITE_MAX = 2**63 - 1  # larger Python ints cannot be bound as 64-bit integers (SQLite's, Postgres' BIGINT)

Row = Mapping[str, Any]  # a row by column name (sqlite3.Row, or Postgres' dict row)


class Query(Protocol):
    """A read: the rows of one statement (inside a transaction, on the writer's connection, so
    that it sees what the transaction wrote). Statements are written with ``?`` placeholders and
    SQL both engines run."""

    def __call__(self, sql: str, args: tuple[Any, ...] = ()) -> list[Row]: ...


class Writer(Protocol):
    """The writer's connection as a transaction uses it (:mod:`.engines`)."""

    def execute(self, sql: str, args: tuple[Any, ...]) -> int: ...

    def executemany(self, sql: str, rows: Sequence[tuple[Any, ...]]) -> None: ...


class Transaction:
    """One write transaction, from :meth:`Database.transaction`: every write method takes one, so
    no write can happen outside a transaction. It is spent when its ``with`` block ends."""

    def __init__(self, writer: Writer) -> None:
        self._writer: Writer | None = writer

    def _live(self) -> Writer:
        if self._writer is None:
            raise StorageError("this transaction has ended: writes take the transaction they are part of")
        return self._writer

    def _execute(self, sql: str, args: tuple[Any, ...] = ()) -> int:
        """Run one statement; the number of rows it changed."""
        with storage_errors():
            return self._live().execute(sql, args)

    def _executemany(self, sql: str, rows: Sequence[tuple[Any, ...]]) -> None:
        with storage_errors():
            self._live().executemany(sql, rows)

    def _end(self) -> None:
        self._writer = None


class Begin(Protocol):
    """Opens a write transaction (:meth:`Database.transaction`), for a group whose method writes
    on its own."""

    def __call__(self) -> AbstractContextManager[Transaction]: ...
