"""Publish checks and rollback (issue 28): an aggregate that fails a check is not published, and
the operator can go on from any kept version, in process and from the command line."""

from __future__ import annotations

import sys
from pathlib import Path

import httpx
import numpy as np
import pytest

from fedper import cli
from fedper.common import weights
from fedper.common.manifest import sha256_file
from fedper.common.robust_aggregate import AggregationConfig, NonFiniteAggregateError
from fedper.common.strategy import robust_fedavg as rounds_module
from fedper.server.publish_check import PublishConfig
from fedper.server.refusals import UnknownVersionError
from fedper.server.state import ServerState
from fedper.server.upload_validation import Upload
from tests.support.server_support import open_in_process, serve

PLAIN = AggregationConfig(clip_factor=0, weight_cap=0)

pytestmark = pytest.mark.usefixtures("server_secrets")


def _step(state: ServerState, number: int, scale: float = 0.01, shift: float = 0.0) -> None:
    """One device reports round ``number``: its base plus noise of ``scale`` (plus ``shift``)."""
    base = {k: v.astype(np.float32) for k, v in state.rounds.round_base(number).items()}
    rng = np.random.default_rng(number)
    tensors = {}
    for name, value in base.items():
        moved = value + scale * rng.standard_normal(value.shape).astype(np.float32) + shift
        tensors[name] = np.abs(moved) if name.endswith(".running_var") else moved
    device = f"d-{number}"
    state.db.devices.add(device, f"hash-{device}", "test")
    state.rounds.assign(number, device)
    version = state.rounds.snapshot.model_version
    state.rounds.commit(state.rounds.stage(device, number, Upload(tensors, 10, version, {})))


def _open(artifacts: Path, data: Path, **options: object) -> ServerState:
    return open_in_process(artifacts, data, target_clients=1, min_clients=1, **options)


def test_an_exploding_step_is_not_published(server_artifacts, tmp_path):
    for factor, published in ((10.0, False), (0.0, True)):
        state = _open(server_artifacts, tmp_path / f"data-{factor}", aggregation=PLAIN,
                      publish=PublishConfig(publish_max_step_factor=factor))  # fmt: skip
        try:
            for number in (1, 2, 3):
                _step(state, number)
            assert state.rounds.snapshot.model_version == 3
            _step(state, 4, shift=100.0)  # one device, plain FedAvg: the round moves 1e4 x as far
            snap = state.rounds.snapshot
            assert snap.round == 5 and (snap.model_version == 4) == published
            assert state.db.rounds.get(4).state == ("closed" if published else "abandoned")  # type: ignore[union-attr]
            assert state.rounds.rounds_refused == (0 if published else 1)
            _step(state, 5)  # the run goes on
            assert state.rounds.snapshot.round == 6
        finally:
            state.db.close()


def test_the_operators_check_command_decides(server_artifacts, tmp_path):
    refuse = f"{sys.executable} -c 'import sys; print(\"probe accuracy 0.09\"); sys.exit(3)'"
    accept = f"{sys.executable} -c 'import sys; from safetensors.numpy import load_file; load_file(sys.argv[1])'"
    for command, published in ((refuse, False), (accept, True)):
        state = _open(server_artifacts, tmp_path / f"data-{published}", publish=PublishConfig(publish_command=command))
        try:
            _step(state, 1)
            assert (state.rounds.snapshot.model_version == 1) == published
            assert list((tmp_path / f"data-{published}" / "tmp").iterdir()) == []  # the candidate is gone
        finally:
            state.db.close()


def test_a_non_finite_aggregate_is_not_published_nor_retried_forever(server_artifacts, tmp_path, monkeypatch):
    state = _open(server_artifacts, tmp_path / "data")

    def overflow(*args: object, **kwargs: object) -> None:
        raise NonFiniteAggregateError("the aggregate of tensor 'x' is not finite")

    monkeypatch.setattr(rounds_module, "robust_aggregate", overflow)
    try:
        _step(state, 1)
        snap = state.rounds.snapshot
        assert (snap.round, snap.model_version) == (2, 0) and state.db.rounds.get(1).state == "abandoned"  # type: ignore[union-attr]
    finally:
        state.db.close()


def test_rollback_goes_on_from_a_copy_of_the_version(server_artifacts, tmp_path):
    data = tmp_path / "data"
    state = _open(server_artifacts, data, rounds=3)
    try:
        for number in (1, 2, 3):
            _step(state, number)
        assert state.rounds.snapshot.finished
        assert state.rounds.rollback(1) == (4, 4)
        snap = state.rounds.snapshot
        assert not snap.finished and (snap.round, snap.model_version, snap.state) == (4, 4, "open")
        assert sha256_file(data / "models" / "v4.safetensors") == sha256_file(data / "models" / "v1.safetensors")
        with pytest.raises(UnknownVersionError):
            state.rounds.rollback(99)
        _step(state, 4)  # trains version 4 = version 1
        assert state.rounds.snapshot.finished and state.db.versions.latest() == 5
        state.rounds.rollback(2)  # from a finished run
        state.rounds.rollback(0)  # with round 5 open: it is abandoned
        assert state.db.rounds.get(5).state == "abandoned"  # type: ignore[union-attr]
        assert state.rounds.snapshot.round == 6 and state.rounds.snapshot.model_version == 7
        v0 = weights.load(data / "models" / "v0.safetensors")
        v7 = weights.load(data / "models" / "v7.safetensors")
        assert all(np.array_equal(v0[k], v7[k]) for k in v0)
    finally:
        state.db.close()


@pytest.mark.slow
def test_fedper_admin_rollback_against_a_running_server(server_artifacts, tmp_path, capsys):
    with serve(server_artifacts, tmp_path / "data", target_clients=1, min_clients=1, round_timeout=0) as s:
        assert cli.main(["admin", "rollback", "--to", "0", "--server", s.url]) == 0
        assert "round 2 trains version 1" in capsys.readouterr().err
        status = httpx.get(f"{s.url}/v1/status").json()
        assert (status["round"], status["model_version"]) == (2, 1)
        assert cli.main(["admin", "rollback", "--to", "9", "--server", s.url]) == 2
        assert "404" in capsys.readouterr().err
        assert cli.main(["admin", "rollback", "--server", s.url]) == 2
        assert "--to N is required" in capsys.readouterr().err
        assert cli.main(["admin", "stop", "--server", s.url]) == 0
        assert httpx.get(f"{s.url}/v1/status").json()["state"] == "finished"


def test_a_rollback_does_not_lock_out_the_devices_whose_updates_it_threw_away(server_artifacts, tmp_path):
    """Issue 50's finding: with --max-participation 1, the devices whose updates a rollback discarded
    got 204 for the next W rounds; with a target of 3, 2 of 3 devices were locked out and the round
    could not fill. Their updates no longer count: the work they did was thrown away."""
    state = open_in_process(server_artifacts, tmp_path / "data", target_clients=3, min_clients=3,
                            max_participation=1, participation_rounds=10, aggregation=PLAIN)  # fmt: skip
    try:
        devices = [f"d-{i}" for i in range(3)]
        for device in devices:
            state.db.devices.add(device, f"hash-{device}", "test")
        base = {k: v.astype(np.float32) for k, v in state.rounds.round_base(1).items()}
        for device in devices:
            assert state.rounds.assign(1, device) is not None
            state.rounds.commit(state.rounds.stage(device, 1, Upload(base, 10, 0, {})))
        assert state.rounds.snapshot.model_version == 1 and state.rounds.snapshot.round == 2
        assert state.rounds.assign(2, devices[0]) is None  # one participation each: used up
        state.rounds.rollback(0)
        assert state.db.rounds.get(1).rolled_back  # type: ignore[union-attr]
        number = state.rounds.snapshot.round
        for device in devices:
            assert state.rounds.assign(number, device) is not None, device  # the thrown-away round does not count
    finally:
        state.db.close()
