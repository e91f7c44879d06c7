"""The server's storage, by its typed interface: what every backend must do. The ``storage``
fixture gives each backend (SQLite's file, and a database on a scratch PostgreSQL cluster), and
every test here runs on each."""

from __future__ import annotations

import threading
from collections.abc import Iterator
from pathlib import Path

import pytest

from fedper.common.dp.state import DPState
from fedper.server.storage import (
    SQLITE_MAX,
    Database,
    Device,
    ModelVersion,
    RoundState,
    RunState,
    SecAggSession,
    Slot,
    StorageError,
    StoredUpdate,
)


@pytest.fixture(params=["sqlite", "postgres"])
def storage(request: pytest.FixtureRequest, tmp_path: Path) -> Iterator[Database]:
    if request.param == "postgres":
        db = Database(request.getfixturevalue("postgres_cluster").database())
    else:
        db = Database(tmp_path / "state.db")
    yield db
    db.close()


def _update(number: int, device: str, file: str | None = "f", unclipped: bool | None = None) -> StoredUpdate:
    return StoredUpdate(number, device, 10, number - 1, file, {"loss": 0.5}, unclipped)


def _round_with_updates(db: Database, number: int, devices: list[str], version: int = 0) -> None:
    with db.transaction() as tx:
        db.rounds.open(tx, number, version, 100.0 * number, None)
        for i, d in enumerate(devices):
            db.rounds.insert_update(tx, _update(number, d), 100.0 * number + i)


# --- transactions ---------------------------------------------------------------------------


def test_a_transaction_commits_everything_at_its_end(storage: Database) -> None:
    with storage.transaction() as tx:
        storage.rounds.open(tx, 1, 0, 10.0, 70.0)
        storage.set_meta(tx, "k", "v")
        assert storage.rounds.get(1) is not None  # a read inside sees the transaction's writes
    assert storage.rounds.get(1) is not None and storage.get_meta("k") == "v"


def test_an_exception_inside_a_transaction_leaves_nothing(storage: Database) -> None:
    with pytest.raises(RuntimeError), storage.transaction() as tx:
        storage.rounds.open(tx, 1, 0, 10.0, None)
        storage.versions.insert(tx, 0, "ab", "v0.safetensors", 10.0, None)
        storage.set_run_state(tx, RunState.FINISHED)
        storage.set_dp_state(tx, DPState(0.5, 1, 1e-5))
        storage.set_meta(tx, "k", "v")
        raise RuntimeError("a failure after the writes")
    assert storage.rounds.latest() is None and storage.versions.get(0) is None
    assert storage.run_state() == RunState.RUNNING and storage.dp_state() == DPState()
    assert storage.get_meta("k") is None
    with storage.transaction() as tx:  # the next transaction works
        storage.rounds.open(tx, 1, 0, 10.0, None)
    assert storage.rounds.get(1) is not None


def test_a_failed_write_fails_the_whole_transaction(storage: Database) -> None:
    with storage.transaction() as tx:
        storage.rounds.open(tx, 1, 0, 10.0, None)
    with pytest.raises(StorageError), storage.transaction() as tx:
        storage.versions.insert(tx, 0, "ab", "v0.safetensors", 10.0, None)
        storage.rounds.open(tx, 1, 0, 20.0, None)  # round 1 exists: refused
    assert storage.versions.get(0) is None and storage.rounds.get(1).opened_at == 10.0  # type: ignore[union-attr]


def test_a_transaction_cannot_be_written_after_its_end(storage: Database) -> None:
    with storage.transaction() as tx:
        pass
    with pytest.raises(StorageError, match="transaction has ended"):
        storage.set_meta(tx, "k", "v")
    assert storage.get_meta("k") is None


def test_reads_outside_a_transaction_see_only_what_was_committed(storage: Database) -> None:
    inside, release, seen = threading.Event(), threading.Event(), []

    def writer() -> None:
        with storage.transaction() as tx:
            storage.rounds.open(tx, 1, 0, 10.0, None)
            inside.set()
            release.wait(10)

    thread = threading.Thread(target=writer)
    thread.start()
    assert inside.wait(10)
    seen.append(storage.rounds.latest())  # another thread: not the uncommitted round
    release.set()
    thread.join()
    assert seen == [None] and storage.rounds.latest() is not None


# --- devices --------------------------------------------------------------------------------


def test_devices(storage: Database) -> None:
    assert storage.devices.count() == 0 and storage.devices.by_token_hash("h-1") is None
    storage.devices.add("d-1", "h-1", "android")
    storage.devices.add_many([("d-2", "h-2"), ("d-3", "h-3")], None)
    assert storage.devices.count() == 3
    assert storage.devices.by_token_hash("h-2") == Device("d-2", "h-2", False)
    assert storage.devices.revoke("d-2") and not storage.devices.revoke("d-none")
    assert storage.devices.by_token_hash("h-2") == Device("d-2", "h-2", True)
    assert storage.devices.revoked("d-2") and not storage.devices.revoked("d-1")
    with pytest.raises(StorageError):
        storage.devices.add("d-4", "h-1", None)  # a token hash is one device's
    with pytest.raises(StorageError):
        storage.devices.add_many([("d-5", "h-5"), ("d-1", "h-6")], None)  # one known id: none added
    assert storage.devices.count() == 3 and storage.devices.by_token_hash("h-5") is None


# --- rounds, updates, versions --------------------------------------------------------------


def test_rounds_open_start_and_end(storage: Database) -> None:
    assert storage.rounds.latest() is None and storage.rounds.last_closed_seconds() is None
    with storage.transaction() as tx:
        storage.rounds.open(tx, 1, 0, 10.0, None)
    opened = storage.rounds.get(1)
    assert opened is not None and (opened.state, opened.opened_at, opened.deadline) == (RoundState.OPEN, 10.0, None)
    with storage.transaction() as tx:
        storage.rounds.start_clock(tx, 1, 40.0, 100.0)
    assert (storage.rounds.get(1).opened_at, storage.rounds.get(1).deadline) == (40.0, 100.0)  # type: ignore[union-attr]
    with storage.transaction() as tx:
        storage.rounds.end(tx, 1, RoundState.CLOSED, 55.0, result_version=1, metrics={"loss": 0.25})
        storage.rounds.open(tx, 2, 1, 55.0, 115.0)
        storage.rounds.end(tx, 2, RoundState.ABANDONED, 60.0, reason="deadline")
    closed, abandoned = storage.rounds.get(1), storage.rounds.get(2)
    assert closed is not None and (closed.state, closed.closed_at, closed.result_version, closed.metrics) == (
        RoundState.CLOSED, 55.0, 1, {"loss": 0.25})  # fmt: skip
    assert abandoned is not None and (abandoned.state, abandoned.reason) == (RoundState.ABANDONED, "deadline")
    assert storage.rounds.latest() == abandoned and storage.rounds.count_closed() == 1
    assert storage.rounds.last_closed_seconds() == 15.0
    with storage.transaction() as tx:
        storage.rounds.open(tx, 3, 1, 60.0, None)
        storage.rounds.end(tx, 3, RoundState.STOPPED, 61.0)
    assert storage.rounds.get(3).state == RoundState.STOPPED  # type: ignore[union-attr]
    for number in (-1, 4, SQLITE_MAX + 1):
        assert storage.rounds.get(number) is None


def test_updates(storage: Database) -> None:
    _round_with_updates(storage, 1, ["d-1", "d-2"])
    with storage.transaction() as tx:
        storage.rounds.insert_update(tx, _update(1, "d-3", unclipped=False), 150.0)
    assert [u.device_id for u in storage.rounds.updates(1)] == ["d-1", "d-2", "d-3"]  # in the order received
    assert storage.rounds.updates(1)[0] == _update(1, "d-1") and storage.rounds.updates(1)[2].unclipped is False
    assert storage.rounds.has_update(1, "d-2") and not storage.rounds.has_update(2, "d-2")
    assert storage.rounds.count_updates(1) == 3
    assert storage.cohort.reporters(1) == {"d-1", "d-2", "d-3"}
    with pytest.raises(StorageError), storage.transaction() as tx:
        storage.rounds.insert_update(tx, _update(1, "d-1"), 160.0)  # one update per device and round
    with storage.transaction() as tx:
        storage.rounds.delete_update(tx, 1, "d-2")
    assert storage.rounds.count_updates(1) == 2 and not storage.rounds.has_update(1, "d-2")
    with storage.transaction() as tx:
        storage.rounds.end(tx, 1, RoundState.CLOSED, 200.0, result_version=1)
    assert [u.file for u in storage.rounds.updates(1)] == [None, None]  # files no longer needed, rows kept


def test_participations_leave_out_rounds_a_rollback_undid(storage: Database) -> None:
    for number in (1, 2, 3):
        _round_with_updates(storage, number, ["d-1", "d-2"] if number != 2 else ["d-1"])
        with storage.transaction() as tx:
            storage.rounds.end(tx, number, RoundState.CLOSED, 100.0 * number + 50, result_version=number)
    assert storage.cohort.participations("d-1", 1) == 3 and storage.cohort.participations("d-1", 2) == 2
    assert storage.cohort.participation_counts(1) == {"d-1": 3, "d-2": 2}
    _round_with_updates(storage, 4, ["d-2"], version=3)
    with storage.transaction() as tx:
        storage.rounds.mark_rolled_back(tx, 1, 4)  # versions 2 and 3 undone, and open round 4
    assert [storage.rounds.get(n).rolled_back for n in (1, 2, 3, 4)] == [False, True, True, True]  # type: ignore[union-attr]
    assert storage.cohort.participations("d-1", 1) == 1
    assert storage.cohort.participation_counts(1) == {"d-1": 1, "d-2": 1}


def test_versions(storage: Database) -> None:
    assert storage.versions.latest() == -1 and storage.versions.files() == {}
    with storage.transaction() as tx:
        storage.versions.insert(tx, 0, "a0", "v0.safetensors", 1.0, None)
        storage.rounds.open(tx, 1, 0, 1.0, None)
        storage.versions.insert(tx, 1, "a1", "v1.safetensors", 2.0, 1)
        storage.versions.insert(tx, 2, "a2", "v2.safetensors", 3.0, None)
    assert storage.versions.get(1) == ModelVersion(1, "a1", "v1.safetensors")
    assert storage.versions.latest() == 2 and list(storage.versions.files()) == [0, 1, 2]
    assert storage.versions.parent(1) == 0 and storage.versions.parent(2) is None and storage.versions.parent(0) is None
    with storage.transaction() as tx:
        storage.versions.delete(tx, 1)
    assert storage.versions.get(1) is None and storage.versions.files() == {0: "v0.safetensors", 2: "v2.safetensors"}
    assert storage.versions.get(-1) is None and storage.versions.get(SQLITE_MAX + 1) is None


# --- cohort slots and check-ins -------------------------------------------------------------


def test_slots(storage: Database) -> None:
    with storage.transaction() as tx:
        storage.rounds.open(tx, 1, 0, 0.0, None)
        storage.cohort.put_slot(tx, Slot(1, "d-1", 1.0, 10.0))
        storage.cohort.put_slots(tx, [Slot(1, "d-2", 2.0, 20.0), Slot(1, "d-3", 3.0, None)])
    assert storage.cohort.slot(1, "d-1") == Slot(1, "d-1", 1.0, 10.0) and storage.cohort.slot(2, "d-1") is None
    assert storage.cohort.count_held(1, 5.0) == 3 and storage.cohort.count_held(1, 15.0) == 2
    assert storage.cohort.earliest_expiry(1, 5.0) == 10.0 and storage.cohort.earliest_expiry(1, 15.0) == 20.0
    with storage.transaction() as tx:
        storage.rounds.insert_update(tx, _update(1, "d-2"), 12.0)  # a reported slot stays held, and expires never
    assert storage.cohort.count_held(1, 25.0) == 2 and storage.cohort.earliest_expiry(1, 5.0) == 10.0
    assert storage.cohort.earliest_expiry(1, 15.0) is None
    with storage.transaction() as tx:
        storage.cohort.put_slot(tx, Slot(1, "d-1", 30.0, 40.0))  # taken again: replaced
        storage.cohort.delete_slot(tx, 1, "d-3")
    assert storage.cohort.slot(1, "d-1") == Slot(1, "d-1", 30.0, 40.0) and storage.cohort.slot(1, "d-3") is None
    with storage.transaction() as tx:
        storage.rounds.end(tx, 1, RoundState.ABANDONED, 50.0)
    assert storage.cohort.slot(1, "d-1") is None and storage.cohort.count_held(1, 0.0) == 0  # an ended round has none


def test_checkins(storage: Database) -> None:
    with storage.transaction() as tx:
        storage.rounds.open(tx, 1, 0, 0.0, None)
        storage.cohort.put_checkin(tx, 1, "d-b", 2.0)
        storage.cohort.put_checkin(tx, 1, "d-a", 1.0)
        storage.cohort.put_checkin(tx, 1, "d-c", 2.0)
        storage.cohort.put_checkin(tx, 1, "d-a", 3.0)  # asking again keeps the first check-in
    assert storage.cohort.checkins(1) == ["d-a", "d-b", "d-c"] and storage.cohort.checkins(2) == []
    with storage.transaction() as tx:
        storage.rounds.end(tx, 1, RoundState.CLOSED, 5.0, result_version=1)
    assert storage.cohort.checkins(1) == []


# --- the run's state, DP state, meta --------------------------------------------------------


def test_run_state(storage: Database) -> None:
    assert storage.run_state() == RunState.RUNNING and storage.drawn_round() is None and storage.recent_steps() == []
    for state in (RunState.WAITING, RunState.FINISHED, RunState.RUNNING):
        with storage.transaction() as tx:
            storage.set_run_state(tx, state)
        assert storage.run_state() == state
    with storage.transaction() as tx:
        storage.set_drawn_round(tx, 7)
        storage.set_recent_steps(tx, [0.1, 1 / 3, 2.5e-300])
    assert storage.drawn_round() == 7 and storage.recent_steps() == [0.1, 1 / 3, 2.5e-300]


def test_dp_state_round_trips_exactly(storage: Database) -> None:
    assert storage.dp_state() == DPState(clip=None, rounds=0, delta=None)
    for state in (DPState(0.1 + 0.2, 3, 1 / 3 * 1e-5), DPState(5e-324, 2**40, 1.7976931348623157e308),
                  DPState(None, 1, None), DPState(0.0, 0, 0.0)):  # fmt: skip
        with storage.transaction() as tx:
            storage.set_dp_state(tx, state)
        assert storage.dp_state() == state  # the same float64s, bit for bit


@pytest.mark.parametrize("bad", [DPState(clip=float("nan")), DPState(delta=float("nan")), DPState(rounds=-1)])
def test_dp_state_that_would_not_read_back_is_refused(storage: Database, bad: DPState) -> None:
    with pytest.raises(ValueError, match="cannot be stored"), storage.transaction() as tx:
        storage.set_dp_state(tx, bad)
    assert storage.dp_state() == DPState()


def test_meta(storage: Database) -> None:
    assert storage.get_meta("manifest_sha256") is None
    with storage.transaction() as tx:
        storage.set_meta(tx, "manifest_sha256", "ab")
        storage.set_meta(tx, "manifest_sha256", "cd")
    assert storage.get_meta("manifest_sha256") == "cd"


# --- a tree of servers -----------------------------------------------------------------------


def test_regional_sums_and_forwards_last_as_long_as_their_round(storage: Database) -> None:
    from fedper.server.storage.regions import StoredRegionSum

    two = StoredRegionSum(1, 2, "r1/region-2.sum", "a" * 64, 30, 3)
    zero = StoredRegionSum(1, 0, "r1/region-0.sum", "b" * 64, 5, 1)
    with storage.transaction() as tx:
        storage.rounds.open(tx, 1, 0, 0.0, 60.0)
        storage.regions.put_sum(tx, two, 1.0)
        storage.regions.put_sum(tx, zero, 2.0)
        storage.regions.put_forward(tx, 1, "c" * 64, 3.0)
        storage.regions.put_forward(tx, 1, "d" * 64, 4.0)  # the first forward of a round holds
    assert storage.regions.sums(1) == [zero, two] and storage.regions.count(1) == 2  # in region order
    assert storage.regions.get(1, 2) == two and storage.regions.get(1, 1) is None
    assert storage.regions.forwarded(1) == ("c" * 64, False) and storage.regions.forwarded(2) is None
    assert storage.closers.sealed(1) and not storage.closers.sealed(2)  # a made sum seals its round
    with storage.transaction() as tx:
        storage.regions.acknowledged(tx, 1)
    assert storage.regions.forwarded(1) == ("c" * 64, True)
    assert storage.regions.sums(SQLITE_MAX + 5) == []
    with pytest.raises(StorageError), storage.transaction() as tx:
        storage.regions.put_sum(tx, two, 5.0)  # one sum per region and round
    with storage.transaction() as tx:
        storage.rounds.end(tx, 1, RoundState.CLOSED, 70.0, result_version=1)
    assert storage.regions.sums(1) == [] and storage.regions.forwarded(1) is None


# --- secure rounds ---------------------------------------------------------------------------


def test_secagg_sessions_and_messages(storage: Database) -> None:
    session = SecAggSession(1, "s" * 32, {"d-1": ["d-2"], "d-2": ["d-1"]}, 2, 0.75, 100, {"keys": 1.5}, flags=1)
    with storage.transaction() as tx:
        storage.rounds.open(tx, 1, 0, 0.0, 60.0)
        storage.secagg.put_session(tx, session)
        storage.secagg.put_message(tx, 1, "keys", "d-2", b"\x00two", 2.0)
        storage.secagg.put_message(tx, 1, "keys", "d-1", b"one\xff", 1.0)
        storage.secagg.put_message(tx, 1, "shares", "d-1", b"", 1.0)
    assert storage.secagg.session(1) == session and storage.secagg.session(2) is None
    assert storage.secagg.session(SQLITE_MAX + 5) is None
    assert storage.secagg.messages(1) == [  # in the order stored, whatever their clocks said
        ("keys", "d-2", b"\x00two"),
        ("keys", "d-1", b"one\xff"),
        ("shares", "d-1", b""),
    ]
    first = storage.secagg.messages_after(1, 0)[0][0]
    assert [m[1:] for m in storage.secagg.messages_after(1, first)] == storage.secagg.messages(1)[1:]
    assert storage.secagg.messages_after(1, storage.secagg.messages_after(1, 0)[-1][0]) == []
    with pytest.raises(StorageError), storage.transaction() as tx:
        storage.secagg.put_message(tx, 1, "keys", "d-1", b"again", 3.0)  # one message per stage and device
    with storage.transaction() as tx:
        storage.rounds.end(tx, 1, RoundState.CLOSED, 70.0, result_version=1)
    assert storage.secagg.session(1) is None and storage.secagg.messages(1) == []  # its secrets go with it
