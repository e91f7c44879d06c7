"""The storage's errors: every SQLite or PostgreSQL error leaves the package as one of these."""

from __future__ import annotations

import sqlite3
import sys
from collections.abc import Iterator
from contextlib import contextmanager

from fedper.server.storage import migrations

SQLITE_FULL = 13  # SQLite's primary result code for a full disk (or a database at its size limit)


class StorageError(Exception):
    """The database refused an operation; a transaction it happened in changed nothing."""


class DatabaseBusyError(StorageError):
    """The database stayed locked for longer than the busy timeout (another writer holds it): the
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


# PostgreSQL's SQLSTATEs for a lock waited on past lock_timeout, and for a full disk.
_PG_BUSY = {"55P03"}
_PG_FULL = {"53100"}


def _postgres_translated(exc: Exception) -> StorageError | None:
    """psycopg's error as a StorageError; None if ``exc`` is not one (psycopg is imported only
    by a server that opened a Postgres database)."""
    psycopg = sys.modules.get("psycopg")
    if psycopg is None or not isinstance(exc, psycopg.Error):
        return None
    state = getattr(exc, "sqlstate", None)
    text = str(exc).strip() or type(exc).__name__
    if state in _PG_BUSY:
        return DatabaseBusyError(text)
    if state in _PG_FULL:
        return StorageFullError(text)
    return StorageError(text)


@contextmanager
def storage_errors() -> Iterator[None]:
    """SQLite's, PostgreSQL's and the schema's errors, raised as :class:`StorageError` s."""
    try:
        yield
    except sqlite3.Error as exc:
        raise _translated(exc) from exc
    except migrations.SchemaError as exc:
        raise StorageError(str(exc)) from exc
    except Exception as exc:
        translated = _postgres_translated(exc)
        if translated is None:
            raise
        raise translated from exc
