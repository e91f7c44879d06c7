"""PostgreSQL's schema and engine (a scratch cluster: tests/support/postgres.py): a new database
is made at the current version with SQLite's tables and columns in Postgres' types, servers
starting together make it once, a newer schema is refused, and a writer waiting for another
past the busy timeout gets DatabaseBusyError with nothing changed. (What every engine must do is
tests/unit/server/test_storage.py, run on both.)"""

from __future__ import annotations

import sqlite3
import threading
from pathlib import Path
from typing import Any

import psycopg
import pytest

from fedper.server.storage import Database, DatabaseBusyError, StorageError, migrations
from fedper.server.storage.postgres_engine import postgres_sql

# SQLite's declared types as Postgres declares them (information_schema.columns.data_type).
TYPES = {"INTEGER": "bigint", "REAL": "double precision", "TEXT": "text", "BLOB": "bytea"}


def _sqlite_columns(path: Path) -> dict[str, dict[str, str]]:
    conn = sqlite3.connect(path)
    tables = [r[0] for r in conn.execute("SELECT name FROM sqlite_master WHERE type = 'table'")]
    out = {t: {str(r[1]): TYPES[str(r[2])] for r in conn.execute(f"PRAGMA table_info({t})")} for t in tables}
    conn.close()
    return out


def _postgres_columns(url: str) -> dict[str, dict[str, str]]:
    with psycopg.connect(url) as conn:
        rows = conn.execute("SELECT table_name, column_name, data_type FROM information_schema.columns "
                            "WHERE table_schema = 'public'").fetchall()  # fmt: skip
    out: dict[str, dict[str, str]] = {}
    for table, column, kind in rows:
        out.setdefault(table, {})[column] = kind
    return out


def test_a_new_postgres_database_has_sqlites_tables_and_columns_at_the_current_version(
    postgres_cluster: Any, tmp_path: Path
) -> None:
    url = postgres_cluster.database()
    db = Database(url)
    assert db.schema_version() == migrations.VERSION and db.location == url
    db.close()
    Database(tmp_path / "state.db").close()
    sqlite, postgres = _sqlite_columns(tmp_path / "state.db"), _postgres_columns(url)
    # Postgres' own: the version's row, and the order messages were stored in (SQLite's rowid).
    assert postgres.pop("schema_version") == {"version": "bigint"}
    assert postgres["secagg_messages"].pop("rowid") == "bigint"
    assert postgres == sqlite


def test_servers_starting_together_make_the_schema_once(postgres_cluster: Any) -> None:
    url = postgres_cluster.database()
    opened: list[Database] = []
    errors: list[BaseException] = []

    def start() -> None:
        try:
            opened.append(Database(url))
        except BaseException as exc:
            errors.append(exc)

    threads = [threading.Thread(target=start) for _ in range(4)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert errors == [] and len(opened) == 4
    assert {db.schema_version() for db in opened} == {migrations.VERSION}
    assert opened[0].run_state().value == "running"  # the one row of `run`, made once
    for db in opened:
        db.close()


def test_a_postgres_database_newer_than_the_code_is_refused(postgres_cluster: Any) -> None:
    url = postgres_cluster.database()
    Database(url).close()
    with psycopg.connect(url, autocommit=True) as conn:
        conn.execute("UPDATE schema_version SET version = %s", (migrations.VERSION + 1,))
    with pytest.raises(StorageError, match=f"schema version {migrations.VERSION + 1}, newer than this server's"):
        Database(url)
    with pytest.raises(StorageError, match="never opened read-only"):
        Database(url, read_only=True)


def test_a_writer_kept_waiting_past_the_busy_timeout_gets_busy_and_changes_nothing(postgres_cluster: Any) -> None:
    """Writers are serialized across processes by one advisory lock, as SQLite's write lock does."""
    url = postgres_cluster.database()
    first, second = Database(url), Database(url, busy_timeout=0.3)
    held, release = threading.Event(), threading.Event()

    def hold() -> None:
        with first.transaction() as tx:
            first.set_meta(tx, "k", "first")
            held.set()
            release.wait(10)

    holder = threading.Thread(target=hold)
    holder.start()
    held.wait(10)
    with pytest.raises(DatabaseBusyError), second.transaction() as tx:
        second.set_meta(tx, "k", "second")
    with pytest.raises(DatabaseBusyError):
        second.writable()
    release.set()
    holder.join()
    assert second.get_meta("k") == "first"
    second.writable()  # free again
    with second.transaction() as tx:
        second.set_meta(tx, "k", "second")
    assert first.get_meta("k") == "second"
    first.close()
    second.close()


def test_an_unreachable_server_is_a_storage_error_that_names_no_password() -> None:
    with pytest.raises(StorageError) as caught:
        Database("postgresql://fedper:secret-pw@127.0.0.1:1/nothing", busy_timeout=1)
    assert "secret-pw" not in str(caught.value)


def test_statements_are_written_once_for_both_engines() -> None:
    assert (
        postgres_sql("SELECT a FROM t WHERE b = ? AND c LIKE '5%'") == "SELECT a FROM t WHERE b = %s AND c LIKE '5%%'"
    )
