"""Helpers for the server tests: a real ``fedper serve`` process on 127.0.0.1 and update bodies."""

from __future__ import annotations

import os
import signal
import socket
import subprocess
import sys
import time
from collections.abc import Mapping
from pathlib import Path

import httpx
import numpy as np

from fedper import weights
from fedper.manifest import Manifest

ADMIN = "admin-token-for-tests-0123456789abcdef"
ENROLL = "enrollment-key-for-tests"


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


class ServerProcess:
    """``fedper serve`` in a subprocess; ``kill()`` is kill -9."""

    def __init__(self, artifacts: Path, data_dir: Path, secrets: bool = True, **options: object):
        self.artifacts, self.data_dir, self.options = artifacts, data_dir, options
        self.port = free_port()
        self.url = f"http://127.0.0.1:{self.port}"
        self.env = {**os.environ}
        if secrets:
            self.env.update(FEDPER_ADMIN_TOKEN=ADMIN, FEDPER_ENROLLMENT_KEY=ENROLL)
        self.proc: subprocess.Popen[str] | None = None
        self.log = data_dir.parent / f"server-{self.port}.log"

    def start(self, timeout: float = 60) -> ServerProcess:
        if self.proc is not None and self.proc.poll() is None:
            raise RuntimeError("already started (use either start() or `with`, not both)")
        args = [sys.executable, "-m", "fedper.cli", "serve", "--artifacts", str(self.artifacts),
                "--data-dir", str(self.data_dir), "--port", str(self.port)]  # fmt: skip
        for key, value in self.options.items():
            args += [f"--{key.replace('_', '-')}", str(value)]
        self.log_file = self.log.open("a")
        self.proc = subprocess.Popen(args, env=self.env, stdout=self.log_file, stderr=subprocess.STDOUT, text=True)
        deadline = time.time() + timeout
        while time.time() < deadline:
            if self.proc.poll() is not None:
                raise RuntimeError(f"server exited: {self.log.read_text()[-3000:]}")
            try:
                if httpx.get(f"{self.url}/v1/health", timeout=1).status_code == 200:
                    return self
            except httpx.HTTPError:
                time.sleep(0.2)
        raise RuntimeError("server did not start")

    def kill(self) -> None:
        assert self.proc is not None
        self.proc.send_signal(signal.SIGKILL)
        self.proc.wait()

    def stop(self) -> None:
        if self.proc is not None and self.proc.poll() is None:
            self.proc.terminate()
            try:
                self.proc.wait(timeout=10)
            except subprocess.TimeoutExpired:
                self.kill()

    def peak_rss_mb(self) -> float:
        assert self.proc is not None
        for line in Path(f"/proc/{self.proc.pid}/status").read_text().splitlines():
            if line.startswith("VmHWM:"):
                return int(line.split()[1]) / 1024
        raise RuntimeError("no VmHWM")

    def __enter__(self) -> ServerProcess:
        return self.start()

    def __exit__(self, *exc: object) -> None:
        self.stop()


def enroll(url: str, key: str = ENROLL) -> tuple[str, dict[str, str]]:
    r = httpx.post(f"{url}/v1/devices", json={"enrollment_key": key, "platform": "python"})
    assert r.status_code == 201, r.text
    body = r.json()
    return body["device_id"], {"Authorization": f"Bearer {body['token']}"}


def admin() -> dict[str, str]:
    return {"Authorization": f"Bearer {ADMIN}"}


def round_info(url: str, number: int) -> dict:
    """``GET /v1/rounds/{number}`` as the operator."""
    r = httpx.get(f"{url}/v1/rounds/{number}", headers=admin())
    assert r.status_code == 200, r.text
    return r.json()


def update_body(
    tensors: Mapping[str, np.ndarray],
    num_samples: object = 10,
    base_version: object = 0,
    metrics: Mapping[str, object] | None = None,
    dtype: type = np.float32,
    extra_metadata: Mapping[str, str] | None = None,
) -> bytes:
    meta = {"num_samples": str(num_samples), "base_version": str(base_version)}
    meta.update({f"metric.{k}": str(v) for k, v in (metrics or {}).items()})
    meta.update(extra_metadata or {})
    return weights.encode(tensors, meta, dtype=dtype)


def base_like(manifest: Manifest, value: float | None = None, seed: int = 0) -> dict[str, np.ndarray]:
    rng = np.random.default_rng(seed)
    return {
        n: (np.full(s, value, np.float32) if value is not None else rng.standard_normal(s).astype(np.float32))
        for n, s in manifest.layout("base")
    }


def decode_update(body: bytes) -> tuple[dict[str, np.ndarray], dict[str, str]]:
    """An update body's tensors and its metadata (safetensors header ``__metadata__``)."""
    import json
    import struct

    from safetensors.numpy import load

    (length,) = struct.unpack("<Q", body[:8])
    metadata = json.loads(body[8 : 8 + length]).get("__metadata__", {})
    return dict(load(body)), metadata
