"""``fedper fleet``'s settings: where the devices run, how they fail, where results go.

Apart from :mod:`device_runtime.fleet` so the hosts that run the devices (worker processes,
Ray actors) can read it without importing the fleet that starts them.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import Literal

from fedper.common.config_cli import nested, option
from fedper.common.errors import ConfigError
from fedper.device_runtime.runtime_config import RuntimeConfig
from fedper.ray_cluster import RayConfig


@dataclass(frozen=True)
class FleetConfig:
    runtime: RuntimeConfig = nested(lambda: RuntimeConfig(threads=1))  # 1: the workers share the cores
    devices: int = option(20, "emulated devices (each one client of the data partition)")
    backend: Literal["processes", "ray"] = option(
        "processes", "where the devices run: worker processes on this machine, or Ray actors (many devices and one "
        "training program per actor; a local Ray or --ray-address)",
    )  # fmt: skip
    workers: int = option(0, "worker processes, or Ray actors with --backend ray "
                          "(0 = one per core of this machine, or of the Ray cluster)")  # fmt: skip
    ray: RayConfig = nested(RayConfig)
    storage: Path = option(Path("fleet"), "root of the devices' storage directories")
    dropout: float = option(0.0, "chance per device per round of quitting mid-round")
    straggler: float = option(0.0, "chance per device per round of uploading late")
    straggler_delay: float = option(10.0, "seconds a straggler waits before uploading")
    flaky_network: float = option(0.0, "chance that any request fails (and is retried)")
    out: Path | None = option(None, "where to write results (default: STORAGE/results)")
    label: str = option("fedper", "name of this run in results.json (e.g. fedper, fedavg)")
    max_idle_wait: float = option(2.0, "longest wait between polls when there is no task")

    def __post_init__(self) -> None:
        if self.devices < 1:
            raise ConfigError("--devices must be at least 1")
        for name in ("dropout", "straggler", "flaky_network"):
            if not 0 <= getattr(self, name) < 1:
                raise ConfigError(f"--{name.replace('_', '-')} must be in [0, 1)")
