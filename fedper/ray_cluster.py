"""Ray for ``--backend ray`` (the fleet's devices, the simulation's clients): one place that
imports it, joins a running cluster or starts a small local one, and shuts it down.

Ray is an extra (``pip install 'fedper[ray]'``): nothing imports it until a command asks
for that backend, and its absence is a one-line error, not a traceback.
"""

from __future__ import annotations

import os
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from typing import Any

from fedper.common.config_cli import option
from fedper.common.errors import ConfigError

INSTALL_HINT = "pip install 'fedper[ray]'"
JOIN_HINT = (
    "Give the address `ray start --head` printed (the head's IP, not 127.0.0.1); a cluster with "
    "token authentication (the default of `ray start`) also needs RAY_AUTH_MODE=token here and "
    "its token in ~/.ray/auth_token or RAY_AUTH_TOKEN"
)
# A local Ray's shared-memory object store: the runs move weights of a few MB per client, and
# Ray's default (30% of RAM) would reserve memory that the devices need.
LOCAL_OBJECT_STORE_BYTES = 200 * 1024 * 1024


@dataclass(frozen=True)
class RayConfig:
    ray_address: str | None = option(
        None, "join the running Ray cluster at ADDR (e.g. 10.0.0.5:6379 or auto) with --backend ray; "
        "else a local Ray is started for the run", metavar="ADDR",
    )  # fmt: skip


def import_ray() -> Any:
    """The ``ray`` module, or a ConfigError saying how to install it."""
    try:
        import ray
    except ImportError as exc:
        raise ConfigError(f"--backend ray needs Ray, which is not installed: {INSTALL_HINT}") from exc
    return ray


@contextmanager
def ray_session(config: RayConfig) -> Iterator[Any]:
    """Ray, connected for the ``with`` block: the cluster at ``ray_address``, else a local Ray
    sized to this machine (no dashboard, the workers' output kept in Ray's logs so that it does
    not scroll over the live view). A process already connected (a test's session) is reused and
    left connected; otherwise Ray is shut down on the way out."""
    ray = import_ray()
    if ray.is_initialized():
        yield ray
        return
    if config.ray_address:
        try:
            ray.init(address=config.ray_address, log_to_driver=False, configure_logging=False)
        except ConnectionError as exc:
            raise ConfigError(f"{exc}. {JOIN_HINT}") from exc
    else:
        ray.init(num_cpus=os.cpu_count() or 1, object_store_memory=LOCAL_OBJECT_STORE_BYTES,
                 include_dashboard=False, log_to_driver=False, configure_logging=False)  # fmt: skip
    try:
        yield ray
    finally:
        ray.shutdown()


def cluster_cpus(ray: Any) -> int:
    """The CPUs of the connected cluster (at least 1)."""
    return max(1, int(ray.cluster_resources().get("CPU", 1)))
