"""The schema on PostgreSQL, as numbered steps like :mod:`.migrations` (SQLite's), at the same
version numbers: a new Postgres database is made at version 12 in one step (the tables SQLite's
steps 1 to 12 build, in Postgres' types), and each later version adds a step here as well as
there. The version is the one row of ``schema_version``.

Types: SQLite's INTEGER (64 bits) is BIGINT, REAL (a float64) is DOUBLE PRECISION (Postgres' REAL
is a float32), BLOB is BYTEA; ``secagg_messages.rowid`` keeps the order messages were stored in,
as SQLite's implicit rowid does (the stored sessions are rebuilt in that order).
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import Any

from fedper.server.storage.migrations import VERSION, SchemaError

BASELINE = 12  # the version a new Postgres database is made at

_TABLES = (
    "CREATE TABLE meta (key TEXT PRIMARY KEY, value TEXT NOT NULL)",
    """CREATE TABLE devices (
    id TEXT PRIMARY KEY,
    token_hash TEXT NOT NULL UNIQUE,
    platform TEXT,
    created_at DOUBLE PRECISION NOT NULL,
    revoked BIGINT NOT NULL DEFAULT 0
)""",
    """CREATE TABLE model_versions (
    version BIGINT PRIMARY KEY,
    sha256 TEXT NOT NULL,
    file TEXT NOT NULL,
    created_at DOUBLE PRECISION NOT NULL,
    from_round BIGINT
)""",
    """CREATE TABLE rounds (
    round BIGINT PRIMARY KEY,
    state TEXT NOT NULL CHECK (state IN ('open', 'closed', 'abandoned', 'stopped')),
    model_version BIGINT NOT NULL,
    opened_at DOUBLE PRECISION NOT NULL,
    deadline DOUBLE PRECISION,
    closed_at DOUBLE PRECISION,
    result_version BIGINT,
    metrics TEXT,
    reason TEXT,
    rolled_back BIGINT NOT NULL DEFAULT 0,
    checked_in BIGINT,
    drawn BIGINT,
    refused TEXT,
    secure_stages TEXT,
    filled_at DOUBLE PRECISION,
    aggregation TEXT
)""",
    """CREATE TABLE updates (
    round BIGINT NOT NULL,
    device_id TEXT NOT NULL,
    num_samples BIGINT NOT NULL,
    base_version BIGINT NOT NULL,
    file TEXT,
    metrics TEXT NOT NULL,
    received_at DOUBLE PRECISION NOT NULL,
    unclipped BIGINT,
    PRIMARY KEY (round, device_id)
)""",
    "CREATE INDEX updates_by_device ON updates (device_id, round)",
    """CREATE TABLE slots (
    round BIGINT NOT NULL,
    device_id TEXT NOT NULL,
    assigned_at DOUBLE PRECISION NOT NULL,
    expires_at DOUBLE PRECISION,
    PRIMARY KEY (round, device_id)
)""",
    """CREATE TABLE checkins (
    round BIGINT NOT NULL,
    device_id TEXT NOT NULL,
    at DOUBLE PRECISION NOT NULL,
    PRIMARY KEY (round, device_id)
)""",
    """CREATE TABLE secagg_sessions (
    round BIGINT PRIMARY KEY,
    session TEXT NOT NULL,
    graph TEXT NOT NULL,
    threshold BIGINT NOT NULL,
    clip DOUBLE PRECISION NOT NULL,
    weight_cap BIGINT NOT NULL,
    stage_ends TEXT NOT NULL,
    flags BIGINT NOT NULL DEFAULT 0
)""",
    """CREATE TABLE secagg_messages (
    round BIGINT NOT NULL,
    stage TEXT NOT NULL,
    device_id TEXT NOT NULL,
    body BYTEA NOT NULL,
    at DOUBLE PRECISION NOT NULL,
    rowid BIGSERIAL NOT NULL,
    PRIMARY KEY (round, stage, device_id)
)""",
    """CREATE TABLE run (
    id BIGINT PRIMARY KEY CHECK (id = 1),
    state TEXT NOT NULL CHECK (state IN ('waiting', 'running', 'finished')),
    drawn_round BIGINT,
    step_norms TEXT NOT NULL
)""",
    """CREATE TABLE dp_state (
    id BIGINT PRIMARY KEY CHECK (id = 1),
    clip DOUBLE PRECISION,
    rounds BIGINT NOT NULL CHECK (rounds >= 0),
    delta DOUBLE PRECISION
)""",
    "INSERT INTO run (id, state, drawn_round, step_norms) VALUES (1, 'running', NULL, '[]')",
    "INSERT INTO dp_state (id, clip, rounds, delta) VALUES (1, NULL, 0, NULL)",
)

Execute = Callable[[str], Any]
# version -> the statements that bring a database at the version before it there (the first: a new one)
STEPS: dict[int, Sequence[str]] = {
    BASELINE: _TABLES,
    13: (
        "CREATE TABLE closers (round BIGINT PRIMARY KEY, token BIGINT NOT NULL, holder TEXT NOT NULL,"
        " until DOUBLE PRECISION NOT NULL)",
        "CREATE TABLE rate_events (limiter TEXT NOT NULL, key TEXT NOT NULL, at DOUBLE PRECISION NOT NULL)",
        "CREATE INDEX rate_events_by_key ON rate_events (limiter, key, at)",
        "CREATE TABLE refusal_counts (round BIGINT NOT NULL, code TEXT NOT NULL, n BIGINT NOT NULL,"
        " PRIMARY KEY (round, code))",
        "CREATE TABLE nonces (nonce TEXT PRIMARY KEY, expires_at DOUBLE PRECISION NOT NULL)",
    ),
    14: (
        "CREATE TABLE region_sums (round BIGINT NOT NULL, region BIGINT NOT NULL, file TEXT NOT NULL,"
        " sha256 TEXT NOT NULL, weight BIGINT NOT NULL, count BIGINT NOT NULL, at DOUBLE PRECISION NOT NULL,"
        " PRIMARY KEY (round, region))",
        "CREATE TABLE forwards (round BIGINT PRIMARY KEY, sha256 TEXT NOT NULL, at DOUBLE PRECISION NOT NULL,"
        " acked BIGINT NOT NULL DEFAULT 0)",
    ),
}
assert max(STEPS) == VERSION, "every SQLite schema step needs its Postgres step here"


def plan(current: int) -> list[int]:
    """The steps a Postgres database at ``current`` (0: new) runs to reach :data:`VERSION`."""
    if current > VERSION:
        raise SchemaError(
            f"the database is at schema version {current}, newer than this server's {VERSION}: "
            "it was written by a newer fedper; run that version (or a newer one) on it"
        )
    if current == 0:
        return sorted(STEPS)
    return [v for v in sorted(STEPS) if v > current]
