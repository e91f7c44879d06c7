"""``fedper fleet``: many emulated devices against a running server, in worker processes
(``--backend processes``, the default) or Ray actors (``--backend ray``: :mod:`device_runtime.ray_fleet`).

Each worker process or actor (one compute thread) runs its share of the devices as threads
that take turns computing (:mod:`device_runtime.device_host`); each device has its own storage
directory and data share and talks to the server over real HTTP. Devices report their metrics
to the fleet, which shows a live view and writes results.json, metrics.csv and plots like ``fedper simulate``,
including the final point each device measures once the run is finished.
"""

from __future__ import annotations

import dataclasses
import multiprocessing as mp
import os
import queue
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from typing import Any

from rich.console import Console
from rich.live import Live
from rich.table import Table

from fedper.baselines import per_client_accuracy
from fedper.data import DataConfig, load_federated
from fedper.device_runtime.device_host import FleetEvent, FleetWorkers, SharedTrainers, host_devices, shares
from fedper.device_runtime.events import (
    DeviceFailed,
    Dropped,
    FinalEvaluated,
    Finished,
    Refused,
    Training,
    Uploaded,
    WorkerDone,
)
from fedper.device_runtime.fleet_config import FleetConfig
from fedper.device_runtime.ray_fleet import ray_workers
from fedper.environment import numeric_environment
from fedper.results import ClientRecord, RunRecorder, config_json

console = Console(stderr=True)


def _worker(index: int, device_ids: list[int], fleet: FleetConfig, data: DataConfig, enrollment_key: str,
            events: Any) -> None:  # fmt: skip
    # The runtime's own chatter (cpuinfo probes, warnings) goes to a log file, not over the live view.
    log_path = fleet.storage / f"worker-{index}.log"
    log_path.parent.mkdir(parents=True, exist_ok=True)
    log_fd = os.open(log_path, os.O_WRONLY | os.O_CREAT | os.O_APPEND, 0o644)
    os.dup2(log_fd, 1)
    os.dup2(log_fd, 2)
    from fedper.device_runtime.compute_threads import set_compute_threads

    set_compute_threads(fleet.runtime.threads)
    # One trainer per manifest for the process's devices, as in a Ray actor: one loaded training
    # program per host, not per device (~170 MB of planned memory each with the ExecuTorch engine).
    host_devices(index, device_ids, fleet, data, enrollment_key, events.put,
                 SharedTrainers(fleet.runtime.engine, fleet.runtime.evaluator))  # fmt: skip


class _ProcessWorkers:
    """Worker processes (spawned), reporting through a multiprocessing queue."""

    def __init__(self, fleet: FleetConfig, data: DataConfig, enrollment_key: str) -> None:
        self.count = min(fleet.workers or os.cpu_count() or 1, fleet.devices)
        ctx = mp.get_context("spawn")
        self._events = ctx.Queue()
        self._procs = [ctx.Process(target=_worker, args=(w, ids, fleet, data, enrollment_key, self._events),
                                   daemon=True) for w, ids in enumerate(shares(fleet.devices, self.count))]  # fmt: skip
        for p in self._procs:
            p.start()

    def next_event(self, timeout: float) -> tuple[int, FleetEvent] | None:
        try:
            event: tuple[int, FleetEvent] = self._events.get(timeout=timeout)
        except queue.Empty:
            return None
        return event

    def running(self) -> bool:
        return any(p.is_alive() for p in self._procs)

    def stop(self) -> None:
        for p in self._procs:
            p.join(timeout=5)
            if p.is_alive():
                p.terminate()


@contextmanager
def _process_workers(fleet: FleetConfig, data: DataConfig, enrollment_key: str) -> Iterator[FleetWorkers]:
    workers = _ProcessWorkers(fleet, data, enrollment_key)
    try:
        yield workers
    finally:
        workers.stop()


@dataclass
class _Progress:
    round: int = 0
    training: set[int] = dataclasses.field(default_factory=set)
    uploads: int = 0
    dropped: int = 0
    refused: int = 0
    errors: list[str] = dataclasses.field(default_factory=list)
    finished: set[int] = dataclasses.field(default_factory=set)
    accuracy: dict[int, list[float]] = dataclasses.field(default_factory=dict)

    def table(self, devices: int) -> Table:
        t = Table(title="fleet", show_header=True)
        for col in (
            "round",
            "training",
            "uploads accepted",
            "refused",
            "dropped",
            "mean accuracy (round)",
            "done",
        ):
            t.add_column(col, justify="right")
        accs = self.accuracy.get(self.round) or self.accuracy.get(self.round - 1) or []
        mean = f"{sum(accs) / len(accs):.3f}" if accs else "-"
        counts = (self.round, len(self.training), self.uploads, self.refused, self.dropped)
        t.add_row(*map(str, counts), mean, f"{len(self.finished)}/{devices}")
        return t


def run_fleet(fleet: FleetConfig, data: DataConfig, enrollment_key: str, recorder: RunRecorder | None = None,
              show: bool = True) -> RunRecorder:  # fmt: skip
    """Run the fleet until the server finishes the run; returns (and writes) its results."""
    data = dataclasses.replace(data, num_clients=fleet.devices)
    recorder = recorder or RunRecorder({"fleet": config_json(fleet), "data": config_json(data)})
    if recorder.environment is None:  # this machine's; with --ray-address, the driver's
        recorder.environment = numeric_environment(threads=fleet.runtime.threads or os.cpu_count())
    if not recorder.baselines:  # the devices' own split, scored as the devices score themselves
        recorder.baselines = per_client_accuracy(load_federated(data), data.seed)
    if fleet.backend == "ray":
        hosts = ray_workers(fleet, data, enrollment_key)
    else:
        hosts = _process_workers(fleet, data, enrollment_key)
    with hosts as workers:
        progress = _collect(workers, fleet, recorder, show)
    for err in progress.errors:
        console.print(f"[red]{err}[/]")
    recorder.write(fleet.out or fleet.storage / "results")
    return recorder


def _collect(workers: FleetWorkers, fleet: FleetConfig, recorder: RunRecorder, show: bool) -> _Progress:
    """The live view and the results, from the hosts' events until every host is done."""
    progress = _Progress()
    done = 0
    live = Live(progress.table(fleet.devices), console=console, refresh_per_second=4, transient=False) if show else None
    if live is not None:
        live.start()
    try:
        while done < workers.count:
            received = workers.next_event(timeout=1.0)
            if received is None:
                if not workers.running():
                    break
                continue
            client_id, event = received
            match event:
                case WorkerDone():
                    done += 1
                case Training(round=number):
                    progress.training.add(client_id)
                    progress.round = max(progress.round, number)
                case Uploaded(report=r):
                    progress.training.discard(client_id)
                    progress.uploads += 1
                    if r.accuracy is not None:  # a device without test examples has no accuracy
                        progress.accuracy.setdefault(r.round, []).append(r.accuracy)
                        recorder.add(ClientRecord(fleet.label, r.round, client_id, r.num_samples,
                                                  r.accuracy, r.accuracy_after, r.train_loss))  # fmt: skip
                case FinalEvaluated(round=number, num_samples=n, accuracy=accuracy):
                    progress.accuracy.setdefault(number, []).append(accuracy)
                    recorder.add(ClientRecord(fleet.label, number, client_id, n, accuracy, final=True))
                case Refused():
                    progress.training.discard(client_id)
                    progress.refused += 1
                case Dropped():
                    progress.dropped += 1
                case Finished():
                    progress.finished.add(client_id)
                case DeviceFailed(error=error):
                    progress.errors.append(f"device {client_id}: {error}")
            if live is not None:
                live.update(progress.table(fleet.devices))
    finally:
        if live is not None:
            live.stop()
    return progress
