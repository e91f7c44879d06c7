"""Helpers for the server tests: a real ``fedper serve`` process on 127.0.0.1 and update bodies."""

from __future__ import annotations

import contextlib
import sys
from collections.abc import AsyncIterator, Mapping
from pathlib import Path

import httpx
import numpy as np

from fedper.common import weights
from fedper.common.manifest import Manifest
from fedper.server import process as server_process

ADMIN = "admin-token-for-tests-0123456789abcdef"
ENROLL = "enrollment-key-for-tests"


def serve(
    artifacts: Path, data_dir: Path, secrets: bool = True, python: Path | None = None, **options: object
) -> server_process.ServerProcess:
    """A test server: the secrets above (unless ``secrets=False``), its log beside ``data_dir``;
    ``python``: another environment's interpreter (default: this one)."""
    port = server_process.free_port()
    env = {"FEDPER_ADMIN_TOKEN": ADMIN, "FEDPER_ENROLLMENT_KEY": ENROLL} if secrets else {}
    log = data_dir.parent / f"server-{port}.log"
    return server_process.ServerProcess(
        artifacts, data_dir, options, env=env, log=log, port=port, python=python or sys.executable
    )


def enroll(url: str, key: str = ENROLL) -> tuple[str, dict[str, str]]:
    r = httpx.post(f"{url}/v1/devices", json={"enrollment_key": key, "platform": "python"})
    assert r.status_code == 201, r.text
    body = r.json()
    return body["device_id"], {"Authorization": f"Bearer {body['token']}"}


def ask(url: str, headers: dict[str, str]) -> httpx.Response:
    """``GET /v1/task``, as a device does before it uploads: the open round gives it a cohort slot."""
    r = httpx.get(f"{url}/v1/task", headers=headers, timeout=60)
    assert r.status_code in (200, 204, 410), r.text
    return r


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
    """Tensors of the base's layout, all ``value`` or random; random BatchNorm running variances
    are positive, as the server requires (a negative one is refused: 422 update_out_of_bounds)."""
    rng = np.random.default_rng(seed)
    out = {}
    for n, s in manifest.layout("base"):
        if value is not None:
            out[n] = np.full(s, value, np.float32)
        else:
            drawn = rng.standard_normal(s).astype(np.float32)
            out[n] = np.abs(drawn) if n.endswith(".running_var") else drawn
    return out


def decode_update(body: bytes) -> tuple[dict[str, np.ndarray], dict[str, str]]:
    """An update body's tensors and its metadata (safetensors header ``__metadata__``)."""
    import json
    import struct

    from safetensors.numpy import load

    (length,) = struct.unpack("<Q", body[:8])
    metadata = json.loads(body[8 : 8 + length]).get("__metadata__", {})
    return dict(load(body)), metadata


def open_in_process(artifacts: Path, data: Path, clock: object = None, free: object = None, **options: object):  # type: ignore[no-untyped-def]
    """A server's state in this process (``round_timeout`` 0 unless given); the caller closes its
    database. The secrets come from the environment (the tests' ``secrets_env`` fixtures)."""
    from fedper.server.config import ServerConfig
    from fedper.server.state import open_state

    config = ServerConfig(artifacts=artifacts, data_dir=data, **{"round_timeout": 0, **options})  # type: ignore[arg-type]
    return open_state(config, clock, free)  # type: ignore[arg-type]


@contextlib.asynccontextmanager
async def http_in_process(state: object, address: str = "10.0.0.1") -> AsyncIterator[httpx.AsyncClient]:
    """The app over ``state``, called over ASGI from ``address`` (no socket, no lifespan: the
    deadline clock does not tick; call ``state.rounds.tick()``). Request bodies stream: an async
    generator's chunks reach the app as they are produced."""
    from fedper.server.app import create_app

    app = create_app(state.config, state)  # type: ignore[attr-defined]
    app.state.fedper = state
    transport = httpx.ASGITransport(app=app, client=(address, 40000))
    async with httpx.AsyncClient(transport=transport, base_url="http://fedper.test", timeout=60) as client:
        yield client


async def enroll_async(client: httpx.AsyncClient, key: str = ENROLL, **fields: object) -> dict[str, str]:
    r = await client.post("/v1/devices", json={"enrollment_key": key, "platform": "python", **fields})
    assert r.status_code == 201, r.text
    return {"Authorization": f"Bearer {r.json()['token']}"}


class FakeClock:
    """A clock the test moves (``clock.now += 60``), for ``open_state(config, clock)``."""

    def __init__(self) -> None:
        self.now = 1_000_000.0

    def __call__(self) -> float:
        return self.now
