"""``fedper fleet``: many emulated devices against a running server, in worker processes.

Each worker process (one compute thread) runs its share of the devices as threads that
take turns computing; each device has its own storage directory and data share and talks
to the server over real HTTP. Devices report their metrics to the fleet, which shows a
live view and writes results.json, metrics.csv and plots like ``fedper simulate``,
including the final point each device measures once the run is finished.
"""

from __future__ import annotations

import dataclasses
import multiprocessing as mp
import os
import queue
import threading
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from rich.console import Console
from rich.live import Live
from rich.table import Table

from device_runtime.events import (
    DeviceEvent,
    DeviceFailed,
    Dropped,
    FinalEvaluated,
    Finished,
    Training,
    Uploaded,
    WorkerDone,
)
from fedper.baselines import per_client_accuracy
from fedper.config_cli import option
from fedper.data import DataConfig, load_federated
from fedper.errors import ConfigError
from fedper.results import ClientRecord, RunRecorder, config_json

console = Console(stderr=True)


@dataclass(frozen=True)
class FleetConfig:
    server: str = option("http://127.0.0.1:8000", "server URL")
    devices: int = option(20, "emulated devices (each one client of the data partition)")
    workers: int = option(0, "worker processes (0 = one per core)")
    storage: Path = option(Path("fleet"), "root of the devices' storage directories")
    engine: str = option("executorch", "training engine", choices=("executorch", "eager"))
    evaluator: str = option("onnx", "exported model that scores the local test split (executorch engine)",
                            choices=("onnx", "executorch"))  # fmt: skip
    dropout: float = option(0.0, "chance per device per round of quitting mid-round")
    straggler: float = option(0.0, "chance per device per round of uploading late")
    straggler_delay: float = option(10.0, "seconds a straggler waits before uploading")
    flaky_network: float = option(0.0, "chance that any request fails (and is retried)")
    out: Path | None = option(None, "where to write results (default: STORAGE/results)")
    label: str = option("fedper", "name of this run in results.json (e.g. fedper, fedavg)")
    max_idle_wait: float = option(2.0, "longest wait between polls when there is no task")
    enrollment_key_file: Path | None = option(
        None, "file holding the enrollment key (else FEDPER_ENROLLMENT_KEY)", metavar="FILE"
    )

    def __post_init__(self) -> None:
        if self.devices < 1:
            raise ConfigError("--devices must be at least 1")
        for name in ("dropout", "straggler", "flaky_network"):
            if not 0 <= getattr(self, name) < 1:
                raise ConfigError(f"--{name.replace('_', '-')} must be in [0, 1)")


def _worker(
    index: int,
    device_ids: list[int],
    fleet: FleetConfig,
    data: DataConfig,
    enrollment_key: str,
    events: Any,
) -> None:
    # The runtime's own chatter (cpuinfo probes, warnings) goes to a log file, not over the live view.
    log_path = fleet.storage / f"worker-{index}.log"
    log_path.parent.mkdir(parents=True, exist_ok=True)
    log_fd = os.open(log_path, os.O_WRONLY | os.O_CREAT | os.O_APPEND, 0o644)
    os.dup2(log_fd, 1)
    os.dup2(log_fd, 2)
    import torch

    torch.set_num_threads(1)
    from device_runtime.client import ProtocolClient
    from device_runtime.device import Device, DeviceOptions
    from device_runtime.device_storage import DeviceStorage
    from device_runtime.local_data import LocalData
    from device_runtime.network_faults import FlakyTransport
    from fedper.data import load_federated

    fed = load_federated(data)
    lock = threading.Lock()

    def run(client_id: int) -> None:
        def emit(event: DeviceEvent | DeviceFailed) -> None:
            events.put((client_id, event))

        transport = (
            FlakyTransport(fleet.flaky_network, seed=data.seed * 1000 + client_id) if fleet.flaky_network else None
        )
        client = ProtocolClient(fleet.server, transport=transport)
        local = LocalData(fed.client_train(client_id), fed.client_test(client_id))
        options = DeviceOptions(
            engine=fleet.engine,  # type: ignore[arg-type]
            evaluator=fleet.evaluator,  # type: ignore[arg-type]
            seed=data.seed,
            client_id=client_id,
            dropout=fleet.dropout,
            straggler=fleet.straggler,
            straggler_delay=fleet.straggler_delay,
            max_idle_wait=fleet.max_idle_wait,
        )
        device = Device(client, DeviceStorage(fleet.storage / f"device_{client_id:03d}"),
                        lambda _manifest: local, options, enrollment_key, emit, lock)  # fmt: skip
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
    events.put((-1, WorkerDone(index)))


@dataclass
class _Progress:
    round: int = 0
    training: set[int] = dataclasses.field(default_factory=set)
    uploads: int = 0
    dropped: int = 0
    errors: list[str] = dataclasses.field(default_factory=list)
    finished: set[int] = dataclasses.field(default_factory=set)
    accuracy: dict[int, list[float]] = dataclasses.field(default_factory=dict)

    def table(self, devices: int) -> Table:
        t = Table(title="fleet", show_header=True)
        for col in (
            "round",
            "training",
            "uploads accepted",
            "dropped",
            "mean accuracy (round)",
            "done",
        ):
            t.add_column(col, justify="right")
        accs = self.accuracy.get(self.round) or self.accuracy.get(self.round - 1) or []
        mean = f"{sum(accs) / len(accs):.3f}" if accs else "-"
        t.add_row(str(self.round), str(len(self.training)), str(self.uploads), str(self.dropped), mean,
                  f"{len(self.finished)}/{devices}")  # fmt: skip
        return t


def run_fleet(fleet: FleetConfig, data: DataConfig, enrollment_key: str, recorder: RunRecorder | None = None,
              show: bool = True) -> RunRecorder:  # fmt: skip
    """Run the fleet until the server finishes the run; returns (and writes) its results."""
    data = dataclasses.replace(data, num_clients=fleet.devices)
    workers = min(fleet.workers or os.cpu_count() or 1, fleet.devices)
    recorder = recorder or RunRecorder({"fleet": config_json(fleet), "data": config_json(data)})
    if not recorder.baselines:  # the devices' own split, scored as the devices score themselves
        recorder.baselines = per_client_accuracy(load_federated(data), data.seed)
    ctx = mp.get_context("spawn")
    events = ctx.Queue()
    shares = [list(range(fleet.devices))[w::workers] for w in range(workers)]
    procs = [ctx.Process(target=_worker, args=(w, ids, fleet, data, enrollment_key, events), daemon=True)
             for w, ids in enumerate(shares)]  # fmt: skip
    for p in procs:
        p.start()
    progress = _Progress()
    done = 0
    live = Live(progress.table(fleet.devices), console=console, refresh_per_second=4, transient=False) if show else None
    if live is not None:
        live.start()
    try:
        while done < workers:
            try:
                client_id, event = events.get(timeout=1.0)
            except queue.Empty:
                if all(not p.is_alive() for p in procs):
                    break
                continue
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
        for p in procs:
            p.join(timeout=5)
            if p.is_alive():
                p.terminate()
    for err in progress.errors:
        console.print(f"[red]{err}[/]")
    recorder.write(fleet.out or fleet.storage / "results")
    return recorder
