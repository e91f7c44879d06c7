-- The SCHEMA of server/storage.py at commit e44c465e0667bb4b76108aaf715747793ced3697 (protocol revision 1.1),
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
    metrics TEXT
);
CREATE TABLE IF NOT EXISTS updates (
    round INTEGER NOT NULL,
    device_id TEXT NOT NULL,
    num_samples INTEGER NOT NULL,
    base_version INTEGER NOT NULL,
    file TEXT,
    metrics TEXT NOT NULL,
    received_at REAL NOT NULL,
    PRIMARY KEY (round, device_id)
);
