"""The aggregate depends on the set of accepted updates only: the same updates arriving in
another order, from devices with other ids, give a byte-identical model version.

The updates are crafted so that their float64 sum depends on the order of its terms
(2a + 3s + 4(-a/2) with |s| far below |a|: summed as (2a + 3s) - 2a, part of s is lost;
as (2a - 2a) + 3s, none is), so folding them in arrival order gives different bytes.
"""

from __future__ import annotations

import itertools
import tempfile
from collections.abc import Sequence
from pathlib import Path

import numpy as np
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from safetensors.numpy import load as st_load

from fedper.common.aggregate import FedAvg
from fedper.common.manifest import Manifest, read_manifest
from fedper.server.config import ServerConfig
from fedper.server.state import open_state
from fedper.server.upload_validation import Upload
from tests.support.server_support import ADMIN, ENROLL, InProcessServer, ask, base_like, enroll, update_body

Update = tuple[dict[str, np.ndarray], int]


def order_sensitive(manifest: Manifest, seed: int = 0, n: int = 2, halvings: int = 1, n_small: int = 3,
                    exponent: int = -50) -> list[Update]:  # fmt: skip
    """a with n samples, s (|s| ~ 2^exponent) with n_small, and -a / 2^halvings with
    n * 2^halvings samples: the first and last cancel exactly, the mean is n_small * s / total."""
    rng = np.random.default_rng(seed)
    layout = manifest.layout("base")
    big = {name: (rng.uniform(1, 2, shape) * rng.choice([-1, 1], shape)).astype(np.float32) for name, shape in layout}
    small = {name: (rng.uniform(1, 2, shape) * 2.0**exponent).astype(np.float32) for name, shape in layout}
    cancel = {name: (-value / 2**halvings).astype(np.float32) for name, value in big.items()}
    for name, shape in layout:  # the server refuses a negative BatchNorm variance: these stay at 1
        if name.endswith(".running_var"):
            big[name], small[name], cancel[name] = (np.ones(shape, np.float32) for _ in range(3))
    return [(big, n), (small, n_small), (cancel, n * 2**halvings)]


def fold(manifest: Manifest, updates: Sequence[Update], order: Sequence[int], group: int = 8) -> dict[str, np.ndarray]:
    """FedAvg fed in ``order``; with the default group, in arrival order, what the server
    computed before canonical order."""
    fedavg = FedAvg(manifest.layout("base"), group)
    for i in order:
        fedavg.add(*updates[i])
    return fedavg.result()


def _differ(a: dict[str, np.ndarray], b: dict[str, np.ndarray]) -> bool:
    return any(a[name].tobytes() != b[name].tobytes() for name in a)


def test_two_servers_give_the_same_bytes_whatever_the_arrival_order(server_artifacts, server_manifest, tmp_path):
    updates = order_sensitive(server_manifest)
    orders = [(0, 1, 2), (2, 0, 1)]
    # Folded in arrival order, these two orders give different bases: the old server's behaviour.
    assert _differ(*(fold(server_manifest, updates, order) for order in orders))
    served = []
    for k, order in enumerate(orders):
        data = tmp_path / f"data-{k}"
        # Plain FedAvg (no clipping, no weight cap): these updates are far apart by design.
        with InProcessServer(server_artifacts, data, target_clients=3, min_clients=3, round_timeout=0,
                             clip_factor=0, weight_cap=0) as s:  # fmt: skip
            devices = [enroll(s.http)[1] for _ in updates]  # random ids, others in each server
            for i in order:
                tensors, n = updates[i]
                ask(s.http, devices[i])
                r = s.http.post("/v1/rounds/1/updates", content=update_body(tensors, n), headers=devices[i])
                assert r.status_code == 202, r.text
            r = s.http.get("/v1/models/1/base", headers=devices[0])
            assert r.status_code == 200, r.text
            assert r.content == (data / "models" / "v1.safetensors").read_bytes()
            served.append(r.content)
    assert served[0] == served[1]
    # It is FedAvg of exactly these updates, folded one at a time in one of their orders.
    base = dict(st_load(served[0]))
    folds = [fold(server_manifest, updates, p, group=1) for p in itertools.permutations(range(3))]
    assert any(not _differ(base, f) for f in folds)


def _close_round(artifacts: Path, updates: Sequence[Update], arrival: Sequence[int], owners: Sequence[int]) -> bytes:
    """A fresh server in process (real SQLite, real files): update i is sent by device
    ``d-<owners[i]>``, in the order ``arrival``; the round closes with the last one."""
    with tempfile.TemporaryDirectory() as tmp:
        data = Path(tmp) / "data"
        config = ServerConfig(artifacts=artifacts, data_dir=data, target_clients=len(updates),
                              min_clients=1, round_timeout=0)  # fmt: skip
        state = open_state(config)
        try:
            for owner in owners:
                state.db.devices.add(f"d-{owner}", f"hash-{owner}", "test")
            for i in arrival:
                tensors, n = updates[i]
                state.rounds.assign(1, f"d-{owners[i]}")  # a device asks for its task first
                staged = state.rounds.stage(f"d-{owners[i]}", 1, Upload(tensors, n, 0, {"accuracy": 0.5}))
                state.rounds.commit(staged)
            assert state.rounds.snapshot.model_version == 1
            return (data / "models" / "v1.safetensors").read_bytes()
        finally:
            state.db.close()


@pytest.fixture
def secrets_env(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("FEDPER_ADMIN_TOKEN", ADMIN)
    monkeypatch.setenv("FEDPER_ENROLLMENT_KEY", ENROLL)


@given(
    arrival=st.permutations(range(4)),
    owners=st.permutations(range(4)),
    seed=st.integers(0, 2**16),
    n=st.integers(1, 100),
    halvings=st.integers(0, 5),
    n_small=st.integers(1, 1000),
    exponent=st.integers(-70, -20),
    exponent_4=st.integers(-70, -20),
)
@settings(max_examples=12, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
def test_the_base_depends_on_the_set_of_updates_only(
    server_artifacts, secrets_env, arrival, owners, seed, n, halvings, n_small, exponent, exponent_4
) -> None:
    manifest = read_manifest(server_artifacts)
    fourth = {name: value * np.float32(2.0**exponent_4) for name, value in base_like(manifest, seed=seed).items()}
    updates = [*order_sensitive(manifest, seed, n, halvings, n_small, exponent), (fourth, 7)]
    in_order = _close_round(server_artifacts, updates, range(4), range(4))
    assert _close_round(server_artifacts, updates, arrival, owners) == in_order
