"""``pip install 'fedper[server]'``: an operator's install, with no torch, ExecuTorch or matplotlib,
serves a round to a device of the full install (eager engine, over real HTTP)."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import httpx
import pytest

from fedper.data import DataConfig
from fedper.device_runtime.client import ProtocolClient
from fedper.device_runtime.device import Device, DeviceOptions
from fedper.device_runtime.device_storage import DeviceStorage
from fedper.device_runtime.local_data import share
from tests.support.server_support import ADMIN, ENROLL, round_info, serve
from tests.support.source_tree import copy_tracked

TRAINING_STACK = ("torch", "torchvision", "executorch", "matplotlib", "onnx", "onnxruntime", "sklearn", "skimage")


def _run(*args: object, cwd: Path) -> subprocess.CompletedProcess[str]:
    out = subprocess.run([str(a) for a in args], cwd=cwd, capture_output=True, text=True, check=False)
    assert out.returncode == 0, f"{' '.join(map(str, args))}\n{out.stdout[-3000:]}\n{out.stderr[-3000:]}"
    return out


@pytest.mark.slow
def test_the_server_extra_installs_no_training_stack_and_serves_a_round(server_artifacts: Path, tmp_path: Path) -> None:
    source = copy_tracked(tmp_path / "source")
    venv = tmp_path / "server-venv"
    _run(sys.executable, "-m", "venv", venv, cwd=tmp_path)
    python = venv / "bin" / "python"
    _run(python, "-m", "pip", "install", "--quiet", f"{source}[server]", cwd=tmp_path)
    probe = "import importlib.util as u, sys; print(' '.join(m for m in sys.argv[1:] if u.find_spec(m)))"
    assert _run(python, "-P", "-c", probe, *TRAINING_STACK, cwd=tmp_path).stdout.split() == []
    # The training commands are listed and say what to install.
    help_text = _run(python, "-P", "-m", "fedper.cli", "--help", cwd=tmp_path).stdout
    assert "serve" in help_text and "pip install 'fedper[device]'" in help_text.replace("\n", " ")
    refused = subprocess.run([python, "-P", "-m", "fedper.cli", "simulate", "--rounds", "1"], cwd=tmp_path,
                             capture_output=True, text=True, check=False)  # fmt: skip
    assert refused.returncode == 2 and "pip install 'fedper[device]'" in refused.stderr, refused.stderr

    with serve(server_artifacts, tmp_path / "data", python=python, rounds=1, target_clients=1, min_clients=1) as s:
        client = ProtocolClient(s.url)
        local = share(DataConfig(dataset="digits", partition="classes", num_clients=3, classes_per_client=2), 0)
        options = DeviceOptions(engine="eager", client_id=0, max_idle_wait=0.5)
        device = Device(client, DeviceStorage(tmp_path / "device"), lambda _m: local, options, ENROLL, lambda _e: None)
        try:
            reports = device.run()
        finally:
            client.close()
        closed = round_info(s.http, 1)
        status = httpx.get(f"{s.url}/v1/status").json()
        page = httpx.get(f"{s.url}/dashboard", auth=("operator", ADMIN))  # the page is in the installed package
    assert page.status_code == 200 and "<svg" in page.text
    assert [(r.round, r.uploaded) for r in reports] == [(1, True)]
    assert closed["state"] == "closed" and closed["received"] == 1
    assert status["state"] == "finished" and status["model_version"] == 1
