"""``fedper fleet --backend ray``: the fleet's devices hosted by Ray actors.

Each actor runs its share of the devices as threads (:func:`device_runtime.device_host.host_devices`,
as a worker process does) with one trainer per manifest shared by all of them
(:class:`~device_runtime.device_host.SharedTrainers`), so a thousand devices need a few loaded
programs, not a thousand. Each device's storage is ``STORAGE/device_NNN`` on the node whose actor
hosts it. The actors report their events through a Ray queue, which the fleet reads as it reads
its worker processes' queue: the live view and the results are the same.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Iterator
from contextlib import contextmanager
from typing import Any

from rich.console import Console

from fedper.data import DataConfig
from fedper.device_runtime.device_host import FleetEvent, FleetWorkers, SharedTrainers, host_devices, shares
from fedper.device_runtime.fleet_config import FleetConfig
from fedper.device_runtime.runtime_config import Engine, Evaluator
from fedper.ray_cluster import cluster_cpus, ray_session

# glibc gives each thread that allocates its own malloc arena (up to 8 per core), and a host's
# hundreds of device threads each keep theirs: measured here, 14 MB per eager device with the
# default, 7 MB with two arenas (50 devices in one process, 2 rounds).
HOST_ENV = {"env_vars": {"MALLOC_ARENA_MAX": "2"}}
console = Console(stderr=True)


class DeviceHost:
    """A Ray actor's body: one compute thread, one set of shared trainers, many devices."""

    def __init__(self, engine: Engine, evaluator: Evaluator, threads: int) -> None:
        from fedper.device_runtime.compute_threads import set_compute_threads

        set_compute_threads(threads)  # as in a worker process: the actors share the node's cores
        self.trainers = SharedTrainers(engine, evaluator)

    def run(self, index: int, device_ids: list[int], fleet: FleetConfig, data: DataConfig, enrollment_key: str,
            events: Any) -> int:  # fmt: skip
        """Run the devices until each is done; returns how many trainers they shared."""
        host_devices(index, device_ids, fleet, data, enrollment_key, events.put, self.trainers)
        return self.trainers.loaded


class _RayWorkers:
    """Actors running their devices; ``next_event`` reads the queue they report into."""

    def __init__(self, ray: Any, fleet: FleetConfig, data: DataConfig, enrollment_key: str) -> None:
        from ray.util.queue import Queue

        self._ray = ray
        cpus = cluster_cpus(ray)
        self.count = min(fleet.workers or cpus, fleet.devices)
        # The queue's actor needs no CPU: it must not wait behind the device hosts for one.
        self._events = Queue(actor_options={"num_cpus": 0})
        host = ray.remote(DeviceHost).options(num_cpus=min(1.0, cpus / self.count), runtime_env=HOST_ENV)
        runtime = fleet.runtime
        self.actors = [host.remote(runtime.engine, runtime.evaluator, runtime.threads) for _ in range(self.count)]
        dealt = shares(fleet.devices, self.count)
        self.runs = [actor.run.remote(w, dealt[w], fleet, data, enrollment_key, self._events)
                     for w, actor in enumerate(self.actors)]  # fmt: skip

    def next_event(self, timeout: float) -> tuple[int, FleetEvent] | None:
        from ray.util.queue import Empty

        try:
            event: tuple[int, FleetEvent] = self._events.get(timeout=timeout)
        except Empty:
            return None
        return event

    def running(self) -> bool:
        _ready, pending = self._ray.wait(self.runs, num_returns=len(self.runs), timeout=0)
        return bool(pending)

    def stop(self) -> None:
        ready, _pending = self._ray.wait(self.runs, num_returns=len(self.runs), timeout=0)
        for ref in ready:  # an actor that died (out of memory, a lost node) says so
            try:
                self._ray.get(ref)
            except Exception as exc:
                console.print(f"[red]a Ray actor failed: {type(exc).__name__}: {exc}[/]")
        for actor in self.actors:
            self._ray.kill(actor)
        self._events.shutdown()


@contextmanager
def ray_workers(fleet: FleetConfig, data: DataConfig, enrollment_key: str) -> Iterator[FleetWorkers]:
    """The fleet's devices on Ray actors, in a Ray session (joined or started) for the block."""
    # Every node resolves the same storage path: a relative one would depend on each worker's cwd.
    fleet = dataclasses.replace(fleet, storage=fleet.storage.absolute())
    with ray_session(fleet.ray) as ray:
        workers = _RayWorkers(ray, fleet, data, enrollment_key)
        try:
            yield workers
        finally:
            workers.stop()
