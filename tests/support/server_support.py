"""Helpers for the server tests: the server in process or as a real ``fedper serve`` on 127.0.0.1,
and update bodies."""

from __future__ import annotations

import contextlib
import os
import sys
from collections.abc import AsyncIterator, Callable, Mapping
from pathlib import Path
from typing import TYPE_CHECKING
from unittest import mock

import httpx
import numpy as np

from fedper.common import weights
from fedper.common.dp.config import DPConfig
from fedper.common.manifest import Manifest
from fedper.common.protocol import Env
from fedper.common.robust_aggregate import AggregationConfig
from fedper.common.strategy.modes import Strategy, round_strategy
from fedper.common.strategy.round_strategy import Quorum
from fedper.server import process as server_process
from fedper.server.metrics_registry import METRICS_PATH

if TYPE_CHECKING:
    from fedper.server.config import ServerConfig

ADMIN = "admin-token-for-tests-0123456789abcdef"
ENROLL = "enrollment-key-for-tests"


def secrets_env(secrets: bool = True) -> dict[str, str]:
    """The server's secrets, as a test's server takes them from the environment (or none: the
    server generates its own)."""
    return {Env.ADMIN_TOKEN: ADMIN, Env.ENROLLMENT_KEY: ENROLL} if secrets else {}


class ServerUnderTest(server_process.ServerProcess):
    """A ``fedper serve`` process with an HTTP client (``.http``), like :class:`InProcessServer`'s;
    the client is made again after a restart (a killed server's pooled connections are dead)."""

    _http: httpx.Client | None = None

    @property
    def http(self) -> httpx.Client:
        if self._http is None:
            self._http = httpx.Client(base_url=self.url, timeout=60)
        return self._http

    def stop(self) -> None:
        self._close_client()
        super().stop()

    def kill(self) -> None:
        self._close_client()
        super().kill()

    def _close_client(self) -> None:
        if self._http is not None:
            self._http.close()
            self._http = None


def serve(
    artifacts: Path, data_dir: Path, secrets: bool = True, python: Path | None = None, **options: object
) -> ServerUnderTest:
    """A test server process: the secrets above (unless ``secrets=False``), its log beside
    ``data_dir``; ``python``: another environment's interpreter (default: this one)."""
    port = server_process.free_port()
    env = secrets_env(secrets)
    log = data_dir.parent / f"server-{port}.log"
    options = with_test_database(data_dir, options)
    return ServerUnderTest(artifacts, data_dir, options, env=env, log=log, port=port, python=python or sys.executable)


def with_test_database(data_dir: Path, options: dict[str, object]) -> dict[str, object]:
    """``options`` with ``database`` set when the suite runs on PostgreSQL
    (``FEDPER_TEST_DATABASE=postgres``, docs/TESTING.md): one database per data directory."""
    if os.environ.get("FEDPER_TEST_DATABASE") != "postgres" or "database" in options:
        return options
    from tests.support.postgres import database_for

    return {**options, "database": database_for(data_dir)}


def serve_config(artifacts: Path, data_dir: Path, **options: object) -> ServerConfig:
    """The config ``fedper serve`` builds from these options (``clip_factor=0`` ->
    ``--clip-factor 0``), by its own parser: the same options as :func:`serve`'s process."""
    from fedper.cli import parse_arguments
    from fedper.common.config_cli import from_arguments
    from fedper.server.config import ServerConfig

    argv = ["serve", "--artifacts", str(artifacts), "--data-dir", str(data_dir)]
    options = with_test_database(data_dir, options)
    return from_arguments(ServerConfig, parse_arguments(argv + server_process.option_flags(options)))


class InProcessServer:
    """A server in this process: ``create_app(config)`` behind Starlette's ``TestClient``, whose
    lifespan opens the state from the config as ``fedper serve`` does (or takes one opened on a
    test's ``clock``) and applies deadlines as the server's own timer does. Requests are ASGI
    calls from 127.0.0.1, no socket: what only sockets show (kill -9, timeouts, bursts, proxy
    headers) is left to :func:`serve`; :func:`http_in_process` streams bodies asynchronously."""

    def __init__(
        self,
        artifacts: Path,
        data_dir: Path,
        secrets: bool = True,
        clock: Callable[[], float] | None = None,
        **options: object,
    ) -> None:
        self.data_dir, self._clock = data_dir, clock
        self.config = serve_config(artifacts, data_dir, **options)
        self._env = secrets_env(secrets)
        self._stack = contextlib.ExitStack()

    def __enter__(self) -> InProcessServer:
        from starlette.testclient import TestClient

        from fedper.server.app import create_app
        from fedper.server.state import open_state

        with self._stack as stack:
            stack.enter_context(mock.patch.dict(os.environ, self._env))
            for name in (Env.ADMIN_TOKEN, Env.ENROLLMENT_KEY):
                if name not in self._env:
                    os.environ.pop(name, None)
            # A test's clock is given to the state, opened here; otherwise the lifespan opens it.
            state = open_state(self.config, self._clock) if self._clock else None
            self.state = state  # a test on its own clock ticks it: ``server.state.rounds.tick()``
            if state is not None:  # closed by the lifespan too; here in case the client never starts
                stack.callback(state.db.close)
            app = create_app(self.config, state)
            self.http = stack.enter_context(TestClient(app, client=("127.0.0.1", 50000)))
            self._stack = stack.pop_all()
        return self

    def __exit__(self, *exc: object) -> None:
        self._stack.close()

    def metric(self, name: str) -> float:
        """One unlabelled sample of the server's ``/metrics``."""
        return server_process.metric_sample(self.http.get(METRICS_PATH).text, name)


def enroll(http: httpx.Client, key: str = ENROLL) -> tuple[str, dict[str, str]]:
    r = http.post("/v1/devices", json={"enrollment_key": key, "platform": "python"})
    assert r.status_code == 201, r.text
    body = r.json()
    return body["device_id"], {"Authorization": f"Bearer {body['token']}"}


def ask(http: httpx.Client, headers: dict[str, str]) -> httpx.Response:
    """``GET /v1/task``, as a device does before it uploads: the open round gives it a cohort slot."""
    r = http.get("/v1/task", headers=headers)
    assert r.status_code in (200, 204, 410), r.text
    return r


def admin() -> dict[str, str]:
    return {"Authorization": f"Bearer {ADMIN}"}


def round_info(http: httpx.Client, number: int) -> dict:
    """``GET /v1/rounds/{number}`` as the operator."""
    r = http.get(f"/v1/rounds/{number}", headers=admin())
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


def round_mode(clip: float | None = None, max_update_norm: float = 0.0) -> Strategy:
    """A server's round mode, as its upload validation consults it: robust FedAvg, or with
    ``clip`` DP-FedAvg at that fixed clip."""
    private = DPConfig() if clip is None else DPConfig(dp=True, dp_clip=clip, dp_clip_learning_rate=0)
    return round_strategy(AggregationConfig(), private, Quorum(1, 1), expected_cohort=10, sampling_probability=0.5,
                          population=lambda: 20, max_update_norm=max_update_norm)  # fmt: skip
