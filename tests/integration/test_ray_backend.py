"""``--backend ray``: the fleet on Ray actors and the simulation's clients as Ray tasks give the
same numbers as the processes fleet and the serial simulation (one local Ray, two CPUs)."""

from __future__ import annotations

import json
import sys
from collections.abc import Iterator

import httpx
import pytest

from fedper._recipes.simulation import SimulationConfig
from fedper._recipes.simulation import run as simulate
from fedper.cli import main
from fedper.common.train_config import TrainConfig
from fedper.data import DataConfig
from fedper.device_runtime.fleet import run_fleet
from fedper.device_runtime.fleet_config import FleetConfig
from fedper.device_runtime.runtime_config import RuntimeConfig
from fedper.ray_cluster import INSTALL_HINT, LOCAL_OBJECT_STORE_BYTES
from fedper.results import ClientRecord
from tests.support.server_support import ENROLL, admin, serve

ray = pytest.importorskip("ray")

# Twenty devices of the digits, two classes each; eager engine, one local epoch: seconds a round.
DATA = DataConfig(dataset="digits", partition="classes", num_clients=20, classes_per_client=2, seed=0)
SERVER = {"rounds": 2, "target_clients": 20, "min_clients": 20, "local_epochs": 1, "retry_after": 1}


@pytest.fixture(scope="module")
def local_ray() -> Iterator[None]:
    """One local Ray for the module (the backends join it rather than start their own)."""
    ray.init(num_cpus=2, object_store_memory=LOCAL_OBJECT_STORE_BYTES, include_dashboard=False,
             log_to_driver=False, configure_logging=False)  # fmt: skip
    try:
        yield
    finally:
        ray.shutdown()


def _by_key(records: list[ClientRecord]) -> dict[tuple[int, int], ClientRecord]:
    return {(r.round, r.client): r for r in records}


@pytest.mark.slow
def test_ray_fleet_gives_the_processes_fleets_accuracies(server_artifacts, tmp_path, local_ray):
    runs = {}
    for backend in ("processes", "ray"):
        with serve(server_artifacts, tmp_path / f"server-{backend}", **SERVER) as server:  # type: ignore[arg-type]
            fleet = FleetConfig(runtime=RuntimeConfig(server=server.url, engine="eager", threads=1), devices=20,
                                workers=2, storage=tmp_path / backend, backend=backend, max_idle_wait=0.5)  # fmt: skip
            recorder = run_fleet(fleet, DATA, ENROLL, show=False)
            rounds = [httpx.get(f"{server.url}/v1/rounds/{n}", headers=admin()).json() for n in (1, 2)]
        runs[backend] = _by_key(recorder.records("fedper"))
        assert [r["state"] for r in rounds] == ["closed", "closed"]
        assert [r["received"] for r in rounds] == [20, 20]
        # Results and plots as the processes fleet writes them; each device's storage on its host.
        assert json.loads((tmp_path / backend / "results" / "results.json").read_text())["algorithms"]["fedper"]
        assert (tmp_path / backend / "results" / "accuracy_per_round.png").stat().st_size > 0
        assert len(list(tmp_path.joinpath(backend).glob("device_*/heads/*.safetensors"))) == 20
    processes, on_ray = runs["processes"], runs["ray"]
    assert sorted(processes) == sorted(on_ray) == sorted((n, c) for n in (1, 2, 3) for c in range(20))
    # Each device computes the same floats on one thread (two actors or two processes of ten
    # devices, sharing one trainer each), and the server aggregates the
    # set of updates in a canonical order: every accuracy and loss is identical, not just close.
    for key, r in processes.items():
        ray_r = on_ray[key]
        assert (r.accuracy, r.accuracy_after, r.train_loss, r.final) == (
            ray_r.accuracy, ray_r.accuracy_after, ray_r.train_loss, ray_r.final), key  # fmt: skip
    assert len({r.accuracy for k, r in processes.items() if k[0] == 2}) > 1  # the check is not vacuous


@pytest.mark.slow
def test_simulate_on_ray_equals_serial(tmp_path, local_ray):
    data = DataConfig(dataset="digits", num_clients=6, classes_per_client=2, seed=0)
    results = {}
    for backend in ("serial", "ray"):
        sim = SimulationConfig(algorithms=("fedper",), kp=2, rounds=2, training=TrainConfig(local_epochs=1),
                               fraction=0.5, threads=1, backend=backend, out=tmp_path / backend)  # fmt: skip
        recorder = simulate(sim, data)
        results[backend] = {a: _by_key(recorder.records(a)) for a in sim.algorithms}
    # Each client's round is a pure function of (base, own head, data, seed, round, client) on one
    # thread, and FedAvg adds the clients in client order in both: bit-identical, not merely close.
    assert results["ray"] == results["serial"]
    trained = [r for r in results["serial"]["fedper"].values() if r.train_loss is not None]
    assert len(trained) == 2 * 3  # half of the six clients train each round
    for name in ("fedper/final_base.safetensors", "fedper/heads/client_004.safetensors"):
        assert (tmp_path / "ray" / name).read_bytes() == (tmp_path / "serial" / name).read_bytes()


@pytest.mark.parametrize("command", ["fleet", "simulate"])
def test_backend_ray_without_ray_says_how_to_install_it(command, monkeypatch, tmp_path, capsys):
    monkeypatch.setitem(sys.modules, "ray", None)  # as if not installed: `import ray` raises ImportError
    monkeypatch.setenv("FEDPER_ENROLLMENT_KEY", ENROLL)
    out = tmp_path / "out"
    args = ["--storage", str(out)] if command == "fleet" else ["--out", str(out), "--rounds", "1"]
    assert main([command, "--backend", "ray", "--dataset", "digits", *args]) == 2
    assert INSTALL_HINT in capsys.readouterr().err
    assert not out.exists()  # nothing started, nothing written


def test_backend_processes_stays_the_default():
    assert FleetConfig().backend == "processes" and SimulationConfig().backend == "serial"
