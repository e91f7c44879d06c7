-- The SCHEMA of server/storage.py at commit e26c73049747af7e1c84957bb4b69b132147c54c (protocol revision 1.7),
-- verbatim: what that server created in a new database.
CREATE TABLE IF NOT EXISTS meta (key TEXT PRIMARY KEY, value TEXT NOT NULL);
CREATE TABLE IF NOT EXISTS devices (
    id TEXT PRIMARY KEY,
    token_hash TEXT NOT NULL UNIQUE,
    platform TEXT,
    created_at REAL NOT NULL,
    revoked INTEGER NOT NULL DEFAULT 0
);
CREATE TABLE IF NOT EXISTS model_versions (
    version INTEGER PRIMARY KEY,
    sha256 TEXT NOT NULL,
    file TEXT NOT NULL,
    created_at REAL NOT NULL,
    from_round INTEGER
);
CREATE TABLE IF NOT EXISTS rounds (
    round INTEGER PRIMARY KEY,
    state TEXT NOT NULL CHECK (state IN ('open', 'closed', 'abandoned', 'stopped')),
    model_version INTEGER NOT NULL,
    opened_at REAL NOT NULL,
    deadline REAL,
    closed_at REAL,
    result_version INTEGER,
    metrics TEXT,
    reason TEXT
);
CREATE TABLE IF NOT EXISTS updates (
    round INTEGER NOT NULL,
    device_id TEXT NOT NULL,
    num_samples INTEGER NOT NULL,
    base_version INTEGER NOT NULL,
    file TEXT,
    metrics TEXT NOT NULL,
    received_at REAL NOT NULL,
    unclipped INTEGER,
    PRIMARY KEY (round, device_id)
);
CREATE INDEX IF NOT EXISTS updates_by_device ON updates (device_id, round);
CREATE TABLE IF NOT EXISTS checkins (
    round INTEGER NOT NULL,
    device_id TEXT NOT NULL,
    at REAL NOT NULL,
    PRIMARY KEY (round, device_id)
);
CREATE TABLE IF NOT EXISTS slots (
    round INTEGER NOT NULL,
    device_id TEXT NOT NULL,
    assigned_at REAL NOT NULL,
    expires_at REAL,
    PRIMARY KEY (round, device_id)
);
CREATE TABLE IF NOT EXISTS secagg_sessions (
    round INTEGER PRIMARY KEY,
    session TEXT NOT NULL,
    graph TEXT NOT NULL,
    threshold INTEGER NOT NULL,
    clip REAL NOT NULL,
    weight_cap INTEGER NOT NULL,
    stage_ends TEXT NOT NULL,
    flags INTEGER NOT NULL DEFAULT 0
);
CREATE TABLE IF NOT EXISTS secagg_messages (
    round INTEGER NOT NULL,
    stage TEXT NOT NULL,
    device_id TEXT NOT NULL,
    body BLOB NOT NULL,
    at REAL NOT NULL,
    PRIMARY KEY (round, stage, device_id)
);
