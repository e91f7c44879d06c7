"""The database's schema, as numbered steps: step k takes a database from version k-1 to version
k (``PRAGMA user_version``). A new database runs every step; one at version k runs steps k+1..N,
each in its own transaction, so a crash leaves it at a version, never between two. A database
newer than this code is refused: a downgrade would read columns it does not know about.

Servers before schema versions wrote no ``user_version``: such a database (version 0, with
tables) is recognised once by its layout, each earlier layout having the version whose steps
built it (the protocol revision that introduced it in brackets):

    1  meta, devices, model_versions, rounds, updates          (1.0)
    2  rounds may be ``stopped``                               (1.1)
    3  slots                                                   (1.2)
    4  checkins, and an index of updates by device             (1.4)
    5  updates.unclipped                                       (1.5)
    6  secagg_sessions, secagg_messages                        (1.6, first servers)
    7  secagg_sessions.flags                                   (1.6)
    8  rounds.reason                                           (1.7)
    9  rounds.rolled_back                                      (1.8)

Step 10 moves what those servers kept as text in ``meta`` (the run's state, whether round 1
waits for ``--start-devices``, the last drawn round, the recent step norms, the DP state) into
typed columns of one-row tables.
"""

from __future__ import annotations

import json
import math
import sqlite3
from collections.abc import Callable, Sequence

Step = Callable[[sqlite3.Connection], None]


class SchemaError(Exception):
    """The database's schema is not one this server can open (newer, or an unknown layout)."""


def _statements(*sql: str) -> Step:
    def run(conn: sqlite3.Connection) -> None:
        for statement in sql:
            conn.execute(statement)

    return run


_ROUNDS_1 = """CREATE TABLE rounds (
    round INTEGER PRIMARY KEY,
    state TEXT NOT NULL CHECK (state IN ('open', 'closed', 'abandoned')),
    model_version INTEGER NOT NULL,
    opened_at REAL NOT NULL,
    deadline REAL,
    closed_at REAL,
    result_version INTEGER,
    metrics TEXT
)"""
_ROUND_COLUMNS = "round, state, model_version, opened_at, deadline, closed_at, result_version, metrics"

_V1 = _statements(
    "CREATE TABLE meta (key TEXT PRIMARY KEY, value TEXT NOT NULL)",
    """CREATE TABLE devices (
    id TEXT PRIMARY KEY,
    token_hash TEXT NOT NULL UNIQUE,
    platform TEXT,
    created_at REAL NOT NULL,
    revoked INTEGER NOT NULL DEFAULT 0
)""",
    """CREATE TABLE model_versions (
    version INTEGER PRIMARY KEY,
    sha256 TEXT NOT NULL,
    file TEXT NOT NULL,
    created_at REAL NOT NULL,
    from_round INTEGER
)""",
    _ROUNDS_1,
    """CREATE TABLE updates (
    round INTEGER NOT NULL,
    device_id TEXT NOT NULL,
    num_samples INTEGER NOT NULL,
    base_version INTEGER NOT NULL,
    file TEXT,
    metrics TEXT NOT NULL,
    received_at REAL NOT NULL,
    PRIMARY KEY (round, device_id)
)""",
)
# SQLite cannot change a CHECK in place: the table is made again and its rows copied.
_V2 = _statements(
    "ALTER TABLE rounds RENAME TO rounds_v1",
    _ROUNDS_1.replace("'abandoned')", "'abandoned', 'stopped')"),
    f"INSERT INTO rounds ({_ROUND_COLUMNS}) SELECT {_ROUND_COLUMNS} FROM rounds_v1",
    "DROP TABLE rounds_v1",
)
_V3 = _statements("""CREATE TABLE slots (
    round INTEGER NOT NULL,
    device_id TEXT NOT NULL,
    assigned_at REAL NOT NULL,
    expires_at REAL,
    PRIMARY KEY (round, device_id)
)""")
_V4 = _statements(
    "CREATE INDEX updates_by_device ON updates (device_id, round)",
    """CREATE TABLE checkins (
    round INTEGER NOT NULL,
    device_id TEXT NOT NULL,
    at REAL NOT NULL,
    PRIMARY KEY (round, device_id)
)""",
)
_V5 = _statements("ALTER TABLE updates ADD COLUMN unclipped INTEGER")
_V6 = _statements(
    """CREATE TABLE secagg_sessions (
    round INTEGER PRIMARY KEY,
    session TEXT NOT NULL,
    graph TEXT NOT NULL,
    threshold INTEGER NOT NULL,
    clip REAL NOT NULL,
    weight_cap INTEGER NOT NULL,
    stage_ends TEXT NOT NULL
)""",
    """CREATE TABLE secagg_messages (
    round INTEGER NOT NULL,
    stage TEXT NOT NULL,
    device_id TEXT NOT NULL,
    body BLOB NOT NULL,
    at REAL NOT NULL,
    PRIMARY KEY (round, stage, device_id)
)""",
)
_V7 = _statements("ALTER TABLE secagg_sessions ADD COLUMN flags INTEGER NOT NULL DEFAULT 0")
_V8 = _statements("ALTER TABLE rounds ADD COLUMN reason TEXT")
_V9 = _statements("ALTER TABLE rounds ADD COLUMN rolled_back INTEGER NOT NULL DEFAULT 0")

# The meta keys step 10 turns into columns.
_LEGACY_KEYS = ("state", "waiting_for_devices", "drawn_round", "recent_step_norms", "dp_clip", "dp_rounds", "dp_delta")


def _v10(conn: sqlite3.Connection) -> None:
    conn.execute("""CREATE TABLE run (
    id INTEGER PRIMARY KEY CHECK (id = 1),
    state TEXT NOT NULL CHECK (state IN ('waiting', 'running', 'finished')),
    drawn_round INTEGER,
    step_norms TEXT NOT NULL
)""")
    conn.execute("""CREATE TABLE dp_state (
    id INTEGER PRIMARY KEY CHECK (id = 1),
    clip REAL,
    rounds INTEGER NOT NULL CHECK (rounds >= 0),
    delta REAL
)""")
    placeholders = ", ".join("?" * len(_LEGACY_KEYS))
    rows = conn.execute(f"SELECT key, value FROM meta WHERE key IN ({placeholders})", _LEGACY_KEYS)
    meta = {str(key): str(value) for key, value in rows}
    if meta.get("state") == "finished":
        state = "finished"
    elif meta.get("waiting_for_devices") == "1":
        state = "waiting"
    else:
        state = "running"
    drawn = _int(meta.get("drawn_round"))
    conn.execute("INSERT INTO run (id, state, drawn_round, step_norms) VALUES (1, ?, ?, ?)",
                 (state, drawn, json.dumps(_norms(meta.get("recent_step_norms")))))  # fmt: skip
    # A clip that is no number (or NaN, which SQLite stores as NULL) is left out: the first clip is
    # used, as the server did when it refused such a stored clip. 0, negative and infinite clips are
    # kept, to be refused (and logged) when read.
    conn.execute(
        "INSERT INTO dp_state (id, clip, rounds, delta) VALUES (1, ?, ?, ?)",
        (_float(meta.get("dp_clip")), _int(meta.get("dp_rounds")) or 0, _float(meta.get("dp_delta"))),
    )  # fmt: skip
    conn.execute(f"DELETE FROM meta WHERE key IN ({placeholders})", _LEGACY_KEYS)


def _int(text: str | None) -> int | None:
    try:
        return None if text is None else int(text)
    except ValueError:
        return None


def _float(text: str | None) -> float | None:
    try:
        value = None if text is None else float(text)
    except ValueError:
        return None
    return None if value is None or math.isnan(value) else value


def _norms(text: str | None) -> list[float]:
    try:
        values = json.loads(text) if text else []
    except ValueError:
        return []
    if not isinstance(values, list) or not all(isinstance(v, int | float) for v in values):
        return []
    return [float(v) for v in values]


# What an ended round's cohort was (its check-ins and slots are deleted when it ends): for the
# operator's metrics and dashboard. NULL for rounds ended before this step.
_V11 = _statements("ALTER TABLE rounds ADD COLUMN checked_in INTEGER", "ALTER TABLE rounds ADD COLUMN drawn INTEGER")

# What else an ended round tells the operator: its upload refusals by code (JSON), a secure round's
# messages per stage (JSON), when its cohort was full, and what robust aggregation did (JSON: the
# round's AggregationReport). NULL for rounds ended before this step.
_V12 = _statements(
    "ALTER TABLE rounds ADD COLUMN refused TEXT",
    "ALTER TABLE rounds ADD COLUMN secure_stages TEXT",
    "ALTER TABLE rounds ADD COLUMN filled_at REAL",
    "ALTER TABLE rounds ADD COLUMN aggregation TEXT",
)

# Several server processes on one database (PostgreSQL): who closes a round (a lease with a fencing
# token), sliding-window rate limits, the open round's upload refusals counted by each process, and
# attestation nonces (a challenge and its enrollment may reach different processes).
_V13 = _statements(
    "CREATE TABLE closers (round INTEGER PRIMARY KEY, token INTEGER NOT NULL, holder TEXT NOT NULL,"
    " until REAL NOT NULL)",
    "CREATE TABLE rate_events (limiter TEXT NOT NULL, key TEXT NOT NULL, at REAL NOT NULL)",
    "CREATE INDEX rate_events_by_key ON rate_events (limiter, key, at)",
    "CREATE TABLE refusal_counts (round INTEGER NOT NULL, code TEXT NOT NULL, n INTEGER NOT NULL,"
    " PRIMARY KEY (round, code))",
    "CREATE TABLE nonces (nonce TEXT PRIMARY KEY, expires_at REAL NOT NULL)",
)

# A tree of servers (docs/SCALING.md): the root's regional sums of the open round, and at a region
# the rounds whose sum went to the root (both deleted when their round ends).
_V14 = _statements(
    "CREATE TABLE region_sums (round INTEGER NOT NULL, region INTEGER NOT NULL, file TEXT NOT NULL,"
    " sha256 TEXT NOT NULL, weight INTEGER NOT NULL, count INTEGER NOT NULL, at REAL NOT NULL,"
    " PRIMARY KEY (round, region))",
    "CREATE TABLE forwards (round INTEGER PRIMARY KEY, sha256 TEXT NOT NULL, at REAL NOT NULL,"
    " acked INTEGER NOT NULL DEFAULT 0)",
)

STEPS: Sequence[Step] = (_V1, _V2, _V3, _V4, _V5, _V6, _V7, _V8, _V9, _v10, _V11, _V12, _V13, _V14)
VERSION = len(STEPS)


def version(conn: sqlite3.Connection) -> int:
    return int(conn.execute("PRAGMA user_version").fetchone()[0])


def migrate(conn: sqlite3.Connection) -> None:
    """Bring the database (a connection in autocommit mode) to :data:`VERSION`, one step per
    transaction. The version is read again inside each transaction, so two processes opening
    the same database never run a step twice."""
    while True:
        conn.execute("BEGIN IMMEDIATE")
        try:
            current = _current(conn)
            if current < VERSION:
                STEPS[current](conn)
                conn.execute(f"PRAGMA user_version = {current + 1}")
        except BaseException:
            conn.execute("ROLLBACK")
            raise
        conn.execute("COMMIT")
        if current + 1 >= VERSION:
            return


def check_current(conn: sqlite3.Connection) -> None:
    """For a database opened read-only (it cannot be migrated): it must be at this version."""
    current = _current(conn)
    if current != VERSION:
        raise SchemaError(f"the database is at schema version {current}, this server reads {VERSION}; "
                          "it cannot be upgraded while it is opened read-only")  # fmt: skip


def _current(conn: sqlite3.Connection) -> int:
    current = version(conn)
    if current > VERSION:
        raise SchemaError(
            f"the database is at schema version {current}, newer than this server's {VERSION}: "
            "it was written by a newer fedper; run that version (or a newer one) on it"
        )
    if current == 0 and _tables(conn):
        return legacy_version(conn)
    return current


def _tables(conn: sqlite3.Connection) -> set[str]:
    rows = conn.execute("SELECT name FROM sqlite_master WHERE type = 'table' AND name NOT LIKE 'sqlite_%'")
    return {str(r[0]) for r in rows}


def _columns(conn: sqlite3.Connection, table: str) -> set[str]:
    return {str(r[1]) for r in conn.execute(f"PRAGMA table_info({table})")}


# The tables of each earlier layout (version: tables it added).
_LEGACY_TABLES = {
    1: {"meta", "devices", "model_versions", "rounds", "updates"},
    3: {"slots"},
    4: {"checkins"},
    6: {"secagg_sessions", "secagg_messages"},
}


def legacy_version(conn: sqlite3.Connection) -> int:
    """The version of a database written before schema versions, recognised by its layout; an
    unknown layout (a half-upgraded one, or another program's tables) is refused."""
    tables = _tables(conn)
    rounds = conn.execute("SELECT sql FROM sqlite_master WHERE type = 'table' AND name = 'rounds'").fetchone()
    features = {
        1: _LEGACY_TABLES[1] <= tables,
        2: rounds is not None and "'stopped'" in str(rounds[0]),
        3: "slots" in tables,
        4: "checkins" in tables,
        5: "unclipped" in _columns(conn, "updates"),
        6: _LEGACY_TABLES[6] <= tables,
        7: "flags" in _columns(conn, "secagg_sessions"),
        8: "reason" in _columns(conn, "rounds"),
        9: "rolled_back" in _columns(conn, "rounds"),
    }
    found = 0
    while features.get(found + 1, False):
        found += 1
    known = set().union(*(t for v, t in _LEGACY_TABLES.items() if v <= found))
    if found == 0 or any(features[v] for v in range(found + 1, 10)) or tables != known:
        have = ", ".join(sorted(tables))
        raise SchemaError(
            f"the database has no schema version and its tables ({have}) are not a layout an earlier "
            "fedper server wrote (a half-finished upgrade, or another program's database)"
        )
    return found
