"""``--ray-address``: a fleet joins a Ray cluster that is already running (started here with
``ray start --head``, as an operator would on the head node) instead of starting its own, runs
its devices on that cluster's workers, and leaves the cluster running."""

from __future__ import annotations

import json
import os
import re
import secrets
import shutil
import subprocess
import sys
import tempfile
from collections.abc import Iterator
from pathlib import Path

import httpx
import pytest

from fedper.server.process import free_port
from tests.support.server_support import ENROLL, admin, serve

pytest.importorskip("ray")
RAY = str(Path(sys.executable).with_name("ray"))


def _ray(*args: str, **env: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run([RAY, *args], capture_output=True, text=True, timeout=120, env={**os.environ, **env})


@pytest.fixture
def cluster() -> Iterator[tuple[str, Path, dict[str, str]]]:
    """A one-node cluster with token authentication (its address, its session's log directory,
    the environment a driver needs to join it). Its temp dir is
    short: Ray's socket paths must fit in 107 bytes."""
    temp = Path(tempfile.mkdtemp(prefix="rc", dir="/tmp"))
    port = free_port()
    # Token authentication, with a token of this test's own (not ~/.ray/auth_token).
    auth = {"RAY_AUTH_MODE": "token", "RAY_AUTH_TOKEN": secrets.token_hex(32)}
    started = _ray("start", "--head", f"--port={port}", "--num-cpus=2", "--include-dashboard=false",
                   f"--temp-dir={temp}", "--object-store-memory=209715200", "--disable-usage-stats", **auth)  # fmt: skip
    assert started.returncode == 0, started.stdout + started.stderr
    # The address to join, as `ray start` prints it: "ray start --address='10.0.0.5:6379'".
    address = re.search(r"--address='([^']+)'", started.stdout + started.stderr)
    try:
        assert address is not None, started.stdout + started.stderr
        yield address.group(1), temp / "session_latest" / "logs", auth
    finally:
        _ray("stop", "--force")
        shutil.rmtree(temp, ignore_errors=True)


def _fleet(env: dict[str, str], *args: str) -> subprocess.CompletedProcess[str]:
    """``fedper fleet`` as an operator runs it: its own process, its own environment."""
    fedper = str(Path(sys.executable).with_name("fedper"))
    return subprocess.run([fedper, "fleet", *args], capture_output=True, text=True, timeout=600, env=env)


@pytest.mark.slow
def test_a_fleet_joins_a_running_cluster(server_artifacts, tmp_path, cluster):
    address, logs, auth = cluster
    env = {k: v for k, v in os.environ.items() if not k.startswith("RAY_")}
    env["FEDPER_ENROLLMENT_KEY"] = ENROLL
    storage = tmp_path / "fleet"
    config = {"rounds": 1, "target_clients": 4, "min_clients": 4, "local_epochs": 1, "retry_after": 1}
    with serve(server_artifacts, tmp_path / "server", **config) as server:  # type: ignore[arg-type]
        args = ("--backend", "ray", "--ray-address", address, "--server", server.url, "--devices", "4",
                "--workers", "2", "--engine", "eager", "--dataset", "digits", "--partition", "classes",
                "--classes-per-client", "2", "--max-idle-wait", "0.5", "--storage", str(storage))  # fmt: skip
        # A driver without the cluster's token is refused, and told in one line what to do.
        refused = _fleet(env, *args)
        assert refused.returncode == 2, refused.stdout + refused.stderr
        assert "RAY_AUTH_MODE=token" in refused.stderr and "Traceback" not in refused.stderr, refused.stderr
        workers_before = set(logs.glob("worker-*.out"))
        joined = _fleet({**env, **auth}, *args)
        assert joined.returncode == 0, joined.stdout[-2000:] + joined.stderr[-2000:]
        closed = httpx.get(f"{server.url}/v1/rounds/1", headers=admin()).json()
    assert (closed["state"], closed["received"]) == ("closed", 4)
    assert json.loads((storage / "results" / "results.json").read_text())["algorithms"]["fedper"]
    assert len(list(storage.glob("device_*/heads/*.safetensors"))) == 4
    # The devices ran in workers the cluster started (their logs are in its session), and the
    # fleet left the cluster running.
    assert set(logs.glob("worker-*.out")) - workers_before
    assert _ray("status", f"--address={address}", **auth).returncode == 0
