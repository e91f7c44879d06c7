"""Every database layout an earlier server wrote (tests/data/legacy_schemas: each one's SCHEMA,
verbatim from git) is upgraded to the current schema version with its rows intact, and a server
starts on it; what the code cannot open is refused with a clear error, and a failed step leaves
the database as it was."""

from __future__ import annotations

import shutil
import sqlite3
from pathlib import Path

import pytest

from fedper.common.dp.config import DPConfig
from fedper.common.dp.state import DPState
from fedper.common.manifest import MANIFEST_FILE, read_manifest, sha256_file
from fedper.server.config import ServerConfig
from fedper.server.privacy import ServerPrivacy
from fedper.server.storage import Database, RoundState, RunState, StorageError, migrations
from tests.support.server_support import open_in_process, round_mode

SCHEMAS = Path(__file__).resolve().parents[2] / "data" / "legacy_schemas"
LAYOUTS = range(1, 10)  # the version number each earlier layout maps to


def _legacy(path: Path, layout: int, manifest_sha: str = "0" * 64, base_sha: str = "0" * 64) -> None:
    """A database of ``layout`` as its server left it mid-run: round 1 closed into version 1,
    round 2 open, with rows in every table the layout has and the meta keys its server wrote."""
    conn = sqlite3.connect(path, isolation_level=None)
    conn.executescript((SCHEMAS / f"layout_{layout}.sql").read_text())
    tables = {r[0] for r in conn.execute("SELECT name FROM sqlite_master WHERE type = 'table'")}
    meta = {"manifest_sha256": manifest_sha, "state": "running"}
    if layout >= 4:
        meta["recent_step_norms"] = "[0.5, 0.25]"
    if layout >= 5:
        meta |= {"dp_clip": "0.75", "dp_rounds": "3", "dp_delta": "1e-05", "waiting_for_devices": "0"}
    if layout >= 9:
        meta["drawn_round"] = "2"
    conn.executemany("INSERT INTO meta VALUES (?, ?)", meta.items())
    conn.execute("INSERT INTO devices (id, token_hash, platform, created_at) VALUES ('d-1', 'h-1', 'android', 1.0)")
    conn.execute(
        "INSERT INTO devices (id, token_hash, platform, created_at, revoked) VALUES ('d-2', 'h-2', NULL, 2.0, 1)"
    )
    for version, from_round in ((0, None), (1, 1)):
        conn.execute("INSERT INTO model_versions VALUES (?, ?, ?, 10.0, ?)",
                     (version, base_sha, f"v{version}.safetensors", from_round))  # fmt: skip
    conn.execute("INSERT INTO rounds (round, state, model_version, opened_at, deadline, closed_at, result_version, "
                 "metrics) VALUES (1, 'closed', 0, 10.0, 70.0, 20.0, 1, '{\"loss\": 0.5}')")  # fmt: skip
    conn.execute("INSERT INTO rounds (round, state, model_version, opened_at) VALUES (2, 'open', 1, 20.0)")
    unclipped = ", unclipped" if layout >= 5 else ""
    conn.execute(f"INSERT INTO updates (round, device_id, num_samples, base_version, file, metrics, received_at"
                 f"{unclipped}) VALUES (1, 'd-1', 10, 0, NULL, '{{\"loss\": 0.5}}', 15.0{', 1' if unclipped else ''})")  # fmt: skip
    if "slots" in tables:
        conn.execute("INSERT INTO slots VALUES (2, 'd-1', 21.0, NULL)")
    if "checkins" in tables:
        conn.execute("INSERT INTO checkins VALUES (2, 'd-2', 22.0)")
    if "secagg_sessions" in tables:
        conn.execute("INSERT INTO secagg_sessions (round, session, graph, threshold, clip, weight_cap, stage_ends) "
                     "VALUES (2, 'ab', '{\"d-1\": []}', 2, 1.0, 100, '{\"keys\": 30.0}')")  # fmt: skip
        conn.execute("INSERT INTO secagg_messages VALUES (2, 'keys', 'd-1', X'0102', 23.0)")
    conn.close()


def _assert_upgraded(db: Database, layout: int) -> None:
    assert db.schema_version() == migrations.VERSION
    assert db.devices.count() == 2
    assert db.devices.by_token_hash("h-1") is not None and not db.devices.revoked("d-1") and db.devices.revoked("d-2")
    closed, opened = db.rounds.get(1), db.rounds.get(2)
    assert closed is not None and closed.state == RoundState.CLOSED and closed.metrics == {"loss": 0.5}
    assert closed.result_version == 1 and closed.reason is None and not closed.rolled_back
    assert opened is not None and opened.state == RoundState.OPEN and opened.model_version == 1
    [update] = db.rounds.updates(1)
    assert (update.device_id, update.num_samples, update.unclipped) == ("d-1", 10, True if layout >= 5 else None)
    assert db.versions.files() == {0: "v0.safetensors", 1: "v1.safetensors"} and db.versions.parent(1) == 0
    assert (db.cohort.slot(2, "d-1") is not None) == (layout >= 3)
    assert db.cohort.checkins(2) == (["d-2"] if layout >= 4 else [])
    session = db.secagg.session(2)
    assert (session is not None and session.flags == 0 and session.graph == {"d-1": []}) == (layout >= 6)
    assert db.secagg.messages(2) == ([("keys", "d-1", b"\x01\x02")] if layout >= 6 else [])
    assert db.run_state() == RunState.RUNNING
    assert db.recent_steps() == ([0.5, 0.25] if layout >= 4 else [])
    assert db.dp_state() == (DPState(0.75, 3, 1e-05) if layout >= 5 else DPState())
    assert db.drawn_round() == (2 if layout >= 9 else None)
    for key in ("state", "waiting_for_devices", "drawn_round", "recent_step_norms", "dp_clip", "dp_rounds", "dp_delta"):
        assert db.get_meta(key) is None  # moved into typed columns


# A DP server (fixed clipping: a cohort of 4 is too small for the adaptive clip's count noise).
_DP = dict(privacy=DPConfig(dp=True, dp_sampling_probability=0.5, dp_clip_learning_rate=0), checkin_window=10,
           round_timeout=60, cohort_size=4, target_clients=4, min_clients=1)  # fmt: skip


@pytest.mark.parametrize("layout", LAYOUTS)
def test_each_earlier_layout_is_upgraded_with_its_rows_and_a_server_starts_on_it(
    layout: int, server_artifacts: Path, tmp_path: Path
) -> None:
    data = tmp_path / "data"
    (data / "models").mkdir(parents=True)
    base = server_artifacts / read_manifest(server_artifacts).artifacts["initial_base"]
    for version in (0, 1):
        shutil.copyfile(base, data / "models" / f"v{version}.safetensors")
    _legacy(data / "state.db", layout, sha256_file(server_artifacts / MANIFEST_FILE), sha256_file(base))
    state = open_in_process(server_artifacts, data, **(_DP if layout >= 5 else {}))
    try:
        _assert_upgraded(state.db, layout)
        assert (state.rounds.snapshot.round, state.rounds.snapshot.model_version) == (2, 1)
        assert not state.rounds.snapshot.finished
        if state.rounds.privacy is not None:
            assert state.rounds.privacy.clip() == 0.75 and state.rounds.privacy.spent().rounds == 3
        state.rounds.stop()  # a layout-1 table could not hold a stopped round
        assert state.db.rounds.get(2) is not None and state.db.rounds.get(2).state == RoundState.STOPPED  # type: ignore[union-attr]
        assert state.db.run_state() == RunState.FINISHED
    finally:
        state.db.close()
    again = Database(data / "state.db")  # reopened at the current version: nothing runs twice
    try:
        assert again.schema_version() == migrations.VERSION and again.run_state() == RunState.FINISHED
    finally:
        again.close()


def test_a_new_database_runs_every_step_and_an_upgraded_one_has_the_same_schema(tmp_path: Path) -> None:
    Database(tmp_path / "new.db").close()
    _legacy(tmp_path / "old.db", 1)
    Database(tmp_path / "old.db").close()

    def schema(path: Path) -> list[tuple[str, str]]:
        conn = sqlite3.connect(path)
        rows = conn.execute("SELECT name, sql FROM sqlite_master WHERE sql IS NOT NULL ORDER BY name").fetchall()
        conn.close()
        return [(str(n), " ".join(str(s).split())) for n, s in rows]

    assert schema(tmp_path / "new.db") == schema(tmp_path / "old.db")


def test_the_meta_text_of_earlier_servers_becomes_typed_state(tmp_path: Path) -> None:
    path = tmp_path / "state.db"
    _legacy(path, 9)
    conn = sqlite3.connect(path, isolation_level=None)
    conn.executemany("INSERT OR REPLACE INTO meta VALUES (?, ?)",
                     [("state", "running"), ("waiting_for_devices", "1"), ("dp_clip", "nan"),
                      ("recent_step_norms", "not json"), ("dp_delta", "0.1")])  # fmt: skip
    conn.close()
    db = Database(path)
    try:
        assert db.run_state() == RunState.WAITING  # round 1 waited for --start-devices
        assert db.dp_state() == DPState(clip=None, rounds=3, delta=0.1)  # a NaN clip: the first clip again
        assert db.recent_steps() == []
    finally:
        db.close()
    _legacy(tmp_path / "finished.db", 9)
    conn = sqlite3.connect(tmp_path / "finished.db", isolation_level=None)
    conn.executemany("INSERT OR REPLACE INTO meta VALUES (?, ?)",
                     [("state", "finished"), ("waiting_for_devices", "1"), ("dp_clip", "0.0")])  # fmt: skip
    conn.close()
    db = Database(tmp_path / "finished.db")
    try:
        assert db.run_state() == RunState.FINISHED
        assert db.dp_state().clip == 0.0  # kept, so that reading it refuses it (and logs the refusal)
    finally:
        db.close()


def test_a_stored_clip_that_is_not_a_positive_number_is_refused_once_with_its_log_event(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    config = ServerConfig(artifacts=tmp_path, data_dir=tmp_path, **_DP)  # type: ignore[arg-type]
    db = Database(tmp_path / "state.db")
    try:
        mode = round_mode(config.privacy.dp_clip).private
        assert mode is not None
        privacy = ServerPrivacy(mode, db)
        for stored in (0.0, -1.0, float("inf")):
            with db.transaction() as tx:
                db.set_dp_state(tx, DPState(clip=stored, rounds=2, delta=1e-5))
            spent = privacy.spent()
            assert privacy.clip() == config.privacy.dp_clip and spent.rounds == 2 and spent.delta == 1e-5
        refused = [r.message for r in caplog.records if "dp_clip_refused" in r.message]
        assert len(refused) == 1 and '"stored": "0.0"' in refused[0]
        with db.transaction() as tx:
            db.set_dp_state(tx, DPState(clip=0.5, rounds=2, delta=1e-5))
        assert privacy.clip() == 0.5
    finally:
        db.close()


def test_a_database_newer_than_the_code_is_refused(tmp_path: Path) -> None:
    path = tmp_path / "state.db"
    Database(path).close()
    conn = sqlite3.connect(path, isolation_level=None)
    conn.execute(f"PRAGMA user_version = {migrations.VERSION + 1}")
    conn.close()
    with pytest.raises(StorageError, match=f"schema version {migrations.VERSION + 1}, newer than this server's"):
        Database(path)
    with pytest.raises(StorageError, match="newer than this server's"):
        Database(path, read_only=True)


@pytest.mark.parametrize("damage", ["foreign tables", "half-upgraded"])
def test_an_unversioned_database_of_no_known_layout_is_refused(damage: str, tmp_path: Path) -> None:
    path = tmp_path / "state.db"
    if damage == "foreign tables":
        conn = sqlite3.connect(path, isolation_level=None)
        conn.execute("CREATE TABLE devices (id TEXT PRIMARY KEY)")
    else:  # a 1.0 database that an earlier server had begun to upgrade (one column added, not the rest)
        _legacy(path, 1)
        conn = sqlite3.connect(path, isolation_level=None)
        conn.execute("ALTER TABLE updates ADD COLUMN unclipped INTEGER")
    conn.close()
    with pytest.raises(StorageError, match="not a layout an earlier fedper server wrote"):
        Database(path)


def test_a_read_only_database_must_be_at_the_current_version(tmp_path: Path) -> None:
    path = tmp_path / "state.db"
    _legacy(path, 9)
    with pytest.raises(StorageError, match="cannot be upgraded while it is opened read-only"):
        Database(path, read_only=True)


def test_a_step_that_fails_leaves_the_database_at_the_version_before_it(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    path = tmp_path / "state.db"
    _legacy(path, 8)

    steps = list(migrations.STEPS)

    def broken(conn: sqlite3.Connection) -> None:
        steps[9](conn)  # the typed tables are made, then the step fails
        raise sqlite3.OperationalError("disk I/O error")

    monkeypatch.setattr(migrations, "STEPS", (*steps[:9], broken))
    with pytest.raises(StorageError, match="disk I/O error"):
        Database(path)
    conn = sqlite3.connect(path)
    tables = {r[0] for r in conn.execute("SELECT name FROM sqlite_master WHERE type = 'table'")}
    version = conn.execute("PRAGMA user_version").fetchone()[0]
    conn.close()
    assert version == 9 and "run" not in tables  # step 9 committed, step 10 left nothing
    monkeypatch.setattr(migrations, "STEPS", tuple(steps))
    db = Database(path)
    try:
        _assert_upgraded(db, 8)
    finally:
        db.close()
