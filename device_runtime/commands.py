"""``fedper device`` and ``fedper fleet``."""

from __future__ import annotations

import argparse
import sys
from dataclasses import dataclass
from pathlib import Path

from fedper.common.config_cli import add_command, from_arguments, nested, option
from fedper.common.errors import FedperError
from fedper.data import DataConfig
from fedper.device_runtime.runtime_config import RuntimeConfig


@dataclass(frozen=True)
class DeviceConfig:
    runtime: RuntimeConfig = nested(RuntimeConfig)
    client_id: int = option(0, "which client of the partition this device is")
    storage: Path = option(Path("device"), "this device's private storage directory")
    data_dir: Path | None = option(
        None,
        "the owner's labelled images (DIR/<label>/*.jpg) instead of a dataset share",
        metavar="DIR",
    )
    max_rounds: int = option(0, "stop after this many rounds (0: until the run is finished)")


def add_parsers(sub: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    from fedper.device_runtime.fleet_config import FleetConfig

    add_command(
        sub, "device", device, [DataConfig, DeviceConfig], skip=("holdout_clients",),
        help="run one device (also on a real Linux board)",
        description="One device: takes part in rounds until the run is finished, training the "
        "exported program with its own data and keeping its personal head in --storage.",
    )  # fmt: skip
    add_command(
        sub, "fleet", fleet, [DataConfig, FleetConfig], skip=("num_clients", "holdout_clients"),
        help="emulate many devices against a running server",
        description="Emulated devices in worker processes (or Ray actors: --backend ray) against a running "
        "`fedper serve`; "
        "each has its own storage and data share (client i of --devices). Writes results.json, "
        "metrics.csv and plots.",
    )  # fmt: skip


def device(args: argparse.Namespace) -> int:
    from fedper.device_runtime.compute_threads import set_compute_threads
    from fedper.device_runtime.enrollment import enrollment_key
    from fedper.run_log import third_party_output_to, toolkit_records_to_terminal

    config = from_arguments(DeviceConfig, args)
    data = from_arguments(DataConfig, args)
    key = enrollment_key(config.runtime.enrollment_key_file)
    # The runtime's and torch's own lines go to STORAGE/device.log; the terminal keeps the device's.
    with third_party_output_to(config.storage / "device.log"), toolkit_records_to_terminal():
        set_compute_threads(config.runtime.threads)  # before any program loads; it prints the runtime's CPU probe
        return _run_device(config, data, key)


def _run_device(config: DeviceConfig, data: DataConfig, key: str) -> int:
    from fedper.common.manifest import Manifest
    from fedper.device_runtime.client import ProtocolClient, RefusedError
    from fedper.device_runtime.device import Device, DeviceOptions
    from fedper.device_runtime.device_storage import DeviceStorage
    from fedper.device_runtime.events import DeviceEvent, describe
    from fedper.device_runtime.local_data import LocalData, from_folder, share
    from fedper.device_runtime.retry import TransientError

    owner_dir = config.data_dir
    loaded = share(data, config.client_id) if owner_dir is None else None

    def local(manifest: Manifest) -> LocalData:
        if loaded is not None:
            return loaded
        assert owner_dir is not None
        labels = manifest.output.labels or [str(i) for i in range(manifest.output.num_classes)]
        return from_folder(owner_dir, labels, manifest.model.input_size, data.seed)

    def say(event: DeviceEvent) -> None:
        print(describe(event), file=sys.stderr, flush=True)

    runtime = config.runtime
    client = ProtocolClient(runtime.server)
    options = DeviceOptions(engine=runtime.engine, evaluator=runtime.evaluator, seed=data.seed,
                            client_id=config.client_id)  # fmt: skip
    dev = Device(client, DeviceStorage(config.storage), local, options, key, say)

    try:
        reports = dev.run(max_rounds=config.max_rounds or None)
    except TransientError as exc:
        raise FedperError(f"cannot reach the server at {runtime.server}: {exc}") from exc
    except RefusedError as exc:
        raise FedperError(f"the server at {runtime.server} refused this device: {exc}") from exc
    print(f"device {dev.device_id}: {len(reports)} round(s) done", file=sys.stderr)
    return 0


def fleet(args: argparse.Namespace) -> int:
    from fedper.device_runtime.enrollment import enrollment_key
    from fedper.device_runtime.fleet import run_fleet
    from fedper.device_runtime.fleet_config import FleetConfig
    from fedper.ray_cluster import import_ray
    from fedper.run_log import third_party_output_to

    config = from_arguments(FleetConfig, args)
    data = from_arguments(DataConfig, args)
    key = enrollment_key(config.runtime.enrollment_key_file)
    if config.backend == "ray":
        import_ray()  # a missing Ray is refused before anything is written
    # As in `fedper demo`: torch's, Ray's and the runtime's own lines go to STORAGE/fleet.log (the
    # worker processes inherit it as descriptor 2 until each opens its worker-N.log).
    with third_party_output_to(config.storage / "fleet.log"):
        recorder = run_fleet(config, data, key)
    out = config.out or config.storage / "results"
    final = recorder.final(config.label)
    if final:
        print(f"{config.label}: final mean accuracy {final['final_mean_accuracy']:.4f} ({final['final_point']}), "
              f"last-5 mean {final['last5_mean_accuracy']:.4f}; wrote {out}", file=sys.stderr)  # fmt: skip
    return 0
