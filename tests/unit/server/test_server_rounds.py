"""The round state machine in process, with an injected clock: interleavings forced step by
step, failures injected where a real disk or database could fail."""

from __future__ import annotations

import shutil
from pathlib import Path

import numpy as np
import pytest

from fedper.common import weights
from fedper.common.manifest import read_manifest
from fedper.common.robust_aggregate import AggregationConfig
from fedper.server import update_store
from fedper.server.config import ServerConfig
from fedper.server.refusals import DeviceRevokedError, RoundNotOpenError, RunFinishedError
from fedper.server.rounds import RoundManager, Staged
from fedper.server.state import ServerState, open_state
from fedper.server.upload_validation import Upload
from tests.support.server_support import FakeClock, base_like

pytestmark = pytest.mark.usefixtures("server_secrets")


def _open(artifacts: Path, data: Path, clock: FakeClock, **options: object) -> ServerState:
    config = ServerConfig(artifacts=artifacts, data_dir=data, **{"round_timeout": 0, **options})  # type: ignore[arg-type]
    return open_state(config, clock)


def _upload(artifacts: Path, seed: int, n: int = 10, version: int = 0) -> Upload:
    return Upload(base_like(read_manifest(artifacts), seed=seed), n, version, {"accuracy": 0.5})


def _stage(rounds: RoundManager, device_id: str, number: int, upload: Upload) -> Staged:
    """As a device does: ask for the round's task (a cohort slot), then upload."""
    rounds.assign(number, device_id)
    return rounds.stage(device_id, number, upload)


def _devices(state: ServerState, count: int) -> list[str]:
    ids = [f"d-{i:04d}" for i in range(count)]
    for i in ids:
        state.db.devices.add(i, f"hash-{i}", "test")
    return ids


def _files(data: Path) -> list[str]:
    return sorted(str(p.relative_to(data)) for p in (data / "updates").rglob("*")) + sorted(
        str(p.relative_to(data)) for p in (data / "tmp").rglob("*")
    )


def test_an_upload_overtaken_by_the_close_is_refused_and_leaves_nothing(server_artifacts, tmp_path):
    data, clock = tmp_path / "data", FakeClock()
    state = _open(server_artifacts, data, clock, target_clients=2, min_clients=1)
    a, b, c = _devices(state, 3)
    rounds = state.rounds
    late = _stage(rounds, a, 1, _upload(server_artifacts, 0))  # checked and written, not yet committed
    assert len(list((data / "tmp").iterdir())) == 1
    assert rounds.commit(_stage(rounds, b, 1, _upload(server_artifacts, 1))) == 1
    assert rounds.commit(_stage(rounds, c, 1, _upload(server_artifacts, 2))) == 2  # closes round 1
    assert rounds.snapshot.round == 2 and rounds.snapshot.state == "open" and rounds.snapshot.model_version == 1
    with pytest.raises(RoundNotOpenError):
        rounds.commit(late)
    assert _files(data) == []  # no temp file, no folder for round 1 or 2
    assert rounds.commit(_stage(rounds, a, 2, _upload(server_artifacts, 0, version=1))) == 1


def test_a_failing_cleanup_never_reaches_a_request_and_is_finished_at_the_next_start(
    server_artifacts, tmp_path, monkeypatch
):
    data, clock = tmp_path / "data", FakeClock()
    state = _open(server_artifacts, data, clock, target_clients=2, min_clients=1)
    a, b = _devices(state, 2)

    def broken_rmtree(path: object, *args: object, **kwargs: object) -> None:
        raise OSError(39, "Directory not empty")

    working_rmtree = shutil.rmtree

    monkeypatch.setattr(update_store.shutil, "rmtree", broken_rmtree)
    state.rounds.commit(_stage(state.rounds, a, 1, _upload(server_artifacts, 0)))
    assert state.rounds.commit(_stage(state.rounds, b, 1, _upload(server_artifacts, 1))) == 2
    snap = state.rounds.snapshot
    assert (snap.round, snap.state, snap.model_version, snap.rounds_closed) == (2, "open", 1, 1)
    assert (data / "updates" / "r1").exists()  # the leftover
    state.db.close()
    monkeypatch.setattr(update_store.shutil, "rmtree", working_rmtree)
    again = _open(server_artifacts, data, clock, target_clients=2, min_clients=1)
    assert not (data / "updates" / "r1").exists()
    assert again.rounds.snapshot.round == 2


def test_a_failing_close_keeps_memory_equal_to_the_database_and_is_retried(server_artifacts, tmp_path, monkeypatch):
    data, clock = tmp_path / "data", FakeClock()
    state = _open(server_artifacts, data, clock, target_clients=2, min_clients=1)
    a, b = _devices(state, 2)
    rounds = state.rounds
    rounds.commit(_stage(rounds, a, 1, _upload(server_artifacts, 0, n=1)))
    original = state.db.versions.insert

    def disk_full(*args: object, **kwargs: object) -> None:
        raise OSError(28, "No space left on device")

    monkeypatch.setattr(state.db.versions, "insert", disk_full)
    assert rounds.commit(_stage(rounds, b, 1, _upload(server_artifacts, 1, n=3))) == 2  # stored: its 202 stands
    assert rounds.snapshot.round == 1 and rounds.snapshot.state == "open" and rounds.snapshot.received == 2
    assert state.db.rounds.latest().state == "open"  # type: ignore[union-attr]
    monkeypatch.setattr(state.db.versions, "insert", original)
    rounds.tick()  # retried
    assert rounds.snapshot.round == 2 and rounds.snapshot.model_version == 1
    v1 = weights.load(data / "models" / "v1.safetensors")
    first, second = _upload(server_artifacts, 0).tensors, _upload(server_artifacts, 1).tensors
    for name, value in v1.items():
        expected = (1 * first[name].astype(np.float64) + 3 * second[name].astype(np.float64)) / 4
        np.testing.assert_allclose(value, expected.astype(np.float32), rtol=1.2e-7, atol=1e-30)


def test_deadlines_follow_the_injected_clock(server_artifacts, tmp_path):
    data, clock = tmp_path / "data", FakeClock()
    state = _open(server_artifacts, data, clock, target_clients=5, min_clients=2, round_timeout=60)
    a, b, c = _devices(state, 3)
    rounds = state.rounds
    rounds.commit(_stage(rounds, a, 1, _upload(server_artifacts, 0)))
    clock.now += 59.9
    rounds.tick()
    assert rounds.snapshot.round == 1
    clock.now += 0.1
    rounds.tick()  # 1 < min_clients: abandoned, a new round on the same version
    assert state.db.rounds.get(1).state == "abandoned"  # type: ignore[union-attr]
    assert (rounds.snapshot.round, rounds.snapshot.model_version) == (2, 0)
    assert rounds.snapshot.deadline == clock.now + 60
    for device, seed in ((b, 1), (c, 2)):
        rounds.commit(_stage(rounds, device, 2, _upload(server_artifacts, seed)))
    clock.now += 60
    rounds.tick()
    assert state.db.rounds.get(2).state == "closed" and rounds.snapshot.model_version == 1  # type: ignore[union-attr]
    assert _files(data) == []


def test_withdrawal_of_a_revoked_device_and_stop(server_artifacts, tmp_path):
    data, clock = tmp_path / "data", FakeClock()
    state = _open(server_artifacts, data, clock, target_clients=3, min_clients=1)
    a, b, c = _devices(state, 3)
    rounds = state.rounds
    rounds.commit(_stage(rounds, a, 1, _upload(server_artifacts, 0, n=5)))
    staged_b = _stage(rounds, b, 1, _upload(server_artifacts, 1, n=7))
    assert state.db.devices.revoke(b) and state.db.devices.revoke(a)
    assert rounds.withdraw(a) and not rounds.withdraw(b)
    with pytest.raises(DeviceRevokedError):
        rounds.commit(staged_b)  # revoked between its checks and its commit
    assert rounds.snapshot.received == 0 and _files(data) == []
    rounds.commit(_stage(rounds, c, 1, _upload(server_artifacts, 2)))
    rounds.stop()
    assert state.db.rounds.get(1).state == "stopped" and rounds.snapshot.finished  # type: ignore[union-attr]
    with pytest.raises(RunFinishedError):
        _stage(rounds, c, 1, _upload(server_artifacts, 2))
    assert _files(data) == []


def test_an_update_unloadable_at_close_is_quarantined_and_the_round_stays_open(server_artifacts, tmp_path):
    """The aggregate is computed from the stored files at close: one the loader refuses then is
    dropped as at a restart, and whether the round closes is decided again on the new count."""
    data, clock = tmp_path / "data", FakeClock()
    state = _open(server_artifacts, data, clock, target_clients=3, min_clients=1,
                  aggregation=AggregationConfig(coordinate_clip=0))  # the plain mean, checked to the bit  # fmt: skip
    a, b, c = _devices(state, 3)
    rounds = state.rounds
    rounds.commit(_stage(rounds, a, 1, _upload(server_artifacts, 0, n=2)))
    rounds.commit(_stage(rounds, b, 1, _upload(server_artifacts, 1, n=3)))
    (data / "updates" / "r1" / f"{a}.safetensors").write_bytes(b"\x08\x00\x00\x00\x00\x00\x00\x00{}      ")
    assert rounds.commit(_stage(rounds, c, 1, _upload(server_artifacts, 2, n=5))) == 3  # stored: its 202 stands
    assert (rounds.snapshot.round, rounds.snapshot.state, rounds.snapshot.received) == (1, "open", 2)
    assert [p.name.split(".")[0] for p in (data / "quarantine").iterdir()] == [f"r1-{a}"]
    assert not (data / "models" / "v1.safetensors").exists()
    assert rounds.commit(_stage(rounds, a, 1, _upload(server_artifacts, 3, n=7))) == 3  # a sends again
    assert (rounds.snapshot.round, rounds.snapshot.model_version) == (2, 1)
    v1 = weights.load(data / "models" / "v1.safetensors")
    parts = [(_upload(server_artifacts, seed).tensors, n) for seed, n in ((3, 7), (1, 3), (2, 5))]
    for name, value in v1.items():
        expected = sum(n * t[name].astype(np.float64) for t, n in parts) / 15
        np.testing.assert_allclose(value, expected.astype(np.float32), rtol=1.2e-7, atol=1e-30)
    assert _files(data) == []
