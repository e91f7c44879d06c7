"""A share of a fleet's devices as threads of one process: a fleet worker process or a Ray actor.

The devices take turns computing under one lock (the ExecuTorch runtime is not safe to use from
two threads at once) while their network I/O overlaps; each reports its events through ``put``.
"""

from __future__ import annotations

import threading
from collections.abc import Callable
from pathlib import Path
from typing import Protocol

from fedper.common.manifest import Manifest
from fedper.data import DataConfig
from fedper.device_runtime.events import DeviceEvent, DeviceFailed, WorkerDone
from fedper.device_runtime.fleet_config import FleetConfig
from fedper.device_runtime.runtime_config import Engine, Evaluator
from fedper.trainer import Trainer

# (client id or -1 for the host itself, event): what a host reports to the fleet.
FleetEvent = DeviceEvent | DeviceFailed | WorkerDone
Put = Callable[[tuple[int, FleetEvent]], None]


class FleetWorkers(Protocol):
    """Where a fleet's devices run (worker processes, Ray actors) and how their events come back."""

    count: int  # hosts; each reports WorkerDone once its devices are done

    def next_event(self, timeout: float) -> tuple[int, FleetEvent] | None:
        """The next (client id, event), or None if none came within ``timeout`` seconds."""
        ...

    def running(self) -> bool:
        """False once every host has ended (normally or not)."""
        ...


def shares(devices: int, hosts: int) -> list[list[int]]:
    """Client ids dealt round-robin to ``hosts`` hosts."""
    return [list(range(devices))[w::hosts] for w in range(hosts)]


class SharedTrainers:
    """One trainer per manifest for every device of a host, made by the first device that needs
    it: one loaded training program per host instead of one per device. The devices load their
    own base and head into it before every evaluation and every training (``Device.run_round``)."""

    def __init__(self, engine: Engine, evaluator: Evaluator) -> None:
        self._engine, self._evaluator = engine, evaluator
        self._trainers: dict[str, Trainer] = {}
        self._lock = threading.Lock()

    def __call__(self, sha: str, directory: Path, manifest: Manifest) -> Trainer:
        from fedper.device_runtime.device import make_trainer

        with self._lock:
            if sha not in self._trainers:
                self._trainers[sha] = make_trainer(self._engine, directory, manifest, self._evaluator)
            return self._trainers[sha]

    @property
    def loaded(self) -> int:
        """How many trainers were loaded. (Not ``__len__``: an empty set would be falsy, and a
        device's ``trainer_for or default`` once loaded a program per device because of it.)"""
        return len(self._trainers)


def device_dir(storage: Path, client_id: int) -> Path:
    """Device ``client_id``'s storage directory under the fleet's (on the host that runs it)."""
    return storage / f"device_{client_id:03d}"


def host_devices(
    index: int,
    device_ids: list[int],
    fleet: FleetConfig,
    data: DataConfig,
    enrollment_key: str,
    put: Put,
    trainers: SharedTrainers,
) -> None:
    """Run devices ``device_ids`` until each has finished (or failed), then report WorkerDone."""
    from fedper.data import load_federated
    from fedper.device_runtime.client import ProtocolClient
    from fedper.device_runtime.device import Device, DeviceOptions
    from fedper.device_runtime.device_storage import DeviceStorage
    from fedper.device_runtime.emulation import Faults, FlakyTransport
    from fedper.device_runtime.local_data import LocalData

    fed = load_federated(data)
    lock = threading.Lock()

    def run(client_id: int) -> None:
        def emit(event: DeviceEvent | DeviceFailed) -> None:
            put((client_id, event))

        transport = (
            FlakyTransport(fleet.flaky_network, seed=data.seed * 1000 + client_id) if fleet.flaky_network else None
        )
        client = ProtocolClient(fleet.runtime.server, transport=transport)
        local = LocalData(fed.client_train(client_id), fed.client_test(client_id))
        options = DeviceOptions(
            engine=fleet.runtime.engine,
            evaluator=fleet.runtime.evaluator,
            seed=data.seed,
            client_id=client_id,
            max_idle_wait=fleet.max_idle_wait,
        )
        faults = Faults(dropout=fleet.dropout, straggler=fleet.straggler, straggler_delay=fleet.straggler_delay)
        device = Device(client, DeviceStorage(device_dir(fleet.storage, client_id)), lambda _manifest: local,
                        options, enrollment_key, emit, lock, trainer_for=trainers, plan=faults)  # fmt: skip
        try:
            device.run()
        except Exception as exc:  # reported, not fatal for the other devices
            emit(DeviceFailed(f"{type(exc).__name__}: {exc}"))
        finally:
            client.close()

    threads = [threading.Thread(target=run, args=(i,), daemon=True) for i in device_ids]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    put((-1, WorkerDone(index)))
