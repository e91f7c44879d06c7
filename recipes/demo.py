"""``fedper demo`` / ``make demo``: the whole system on one machine, and a report.

Export once (the base from the packaged pretrained checkpoint by default, the ordinal head;
the training program serves every kp), re-partition for FedAvg, then for FedPer (kp=1) and
FedAvg (kp=0): start ``fedper serve`` in a subprocess on a free port and
run a fleet of devices against it over HTTP. Writes OUT/report.html (self-contained),
OUT/results.json, metrics.csv and plots.
"""

from __future__ import annotations

import json
import os
import secrets
import shutil
import time
from dataclasses import replace
from pathlib import Path
from typing import Any

import httpx
from rich.console import Console
from rich.markup import escape

from fedper._recipes.demo_config import DemoConfig
from fedper._recipes.demo_report import compare, write_report
from fedper._recipes.new_users import FINAL_BASE, new_user_curves
from fedper.checkpoints import read_checkpoint
from fedper.common.protocol import Env, Route
from fedper.data import DataConfig, load_federated
from fedper.device_runtime.fleet import run_fleet
from fedper.device_runtime.fleet_config import FleetConfig
from fedper.device_runtime.training_program import check_exported, median_step_ms
from fedper.export.pipeline import ExportConfig, run_export
from fedper.pretrained import PACKAGED_BASE, PACKAGED_CARD, checkpoint_path
from fedper.results import RunRecorder, config_json
from fedper.run_results import (
    BaseCard,
    BaseSource,
    CheckpointBase,
    DemoSetup,
    DemoSummary,
    Export,
    PretrainedBase,
    RunResults,
    ScratchBase,
    SecureSetup,
    Traffic,
)
from fedper.server.process import ServerProcess

console = Console(stderr=True)


def _server(artifacts: Path, data_dir: Path, log: Path, config: DemoConfig, keys: dict[str, str]) -> ServerProcess:
    return ServerProcess(artifacts, data_dir, config.server_options(), env=keys, log=log)


def _new_user_curves(config: DemoConfig, data: DataConfig, out: Path) -> dict[str, Any]:
    """The held-out users' fine-tuning curves from each fleet's last model version (what the
    server would ship to a new phone), as ``fedper simulate --holdout-clients`` computes them."""
    for label in ("fedper", "fedavg"):
        versions = sorted((out / f"server-{label}" / "models").glob("v*.safetensors"), key=lambda p: int(p.stem[1:]))
        shutil.copyfile(versions[-1], out / label / FINAL_BASE)
    return new_user_curves(
        load_federated(data), config.model, config.kp, ("fedper", "fedavg"), out, config.training,
        config.fine_tune_steps, config.seed,
        skip=("fedper: head+base",),  # the costliest variant; fedper simulate has it
    )  # fmt: skip


def base_source(init: Path, model_name: str = "mobilenet_v1") -> BaseSource:
    """Where the base's version 0 came from, for the report: the packaged base's model card, a
    checkpoint's file and hash, or random weights."""
    path = checkpoint_path(init)
    if path is None:
        return ScratchBase(kind="scratch")
    checkpoint = read_checkpoint(path, model_name)
    if path != PACKAGED_BASE:
        return CheckpointBase(kind="checkpoint", path=str(path), sha256=checkpoint.sha256)
    card = json.loads(PACKAGED_CARD.read_text())
    scores = card["pretext"]["held_out_scores"]
    summary = BaseCard(
        commit=card["commit"], epochs=card["training"]["epochs"], images=card["data"]["images"],
        image_size=card["data"]["image_size"], seed=card["training"]["seed"], raters=card["data"]["raters"],
        looks={k.removeprefix("look."): v for k, v in scores.items() if k.startswith("look.")},
        category_accuracy=scores["category_accuracy"],
    )  # fmt: skip
    return PretrainedBase(kind="pretrained", path=str(path), sha256=checkpoint.sha256, card=summary)


def demo_setup(config: DemoConfig) -> DemoSetup:
    """What the demo runs, as its page says it."""
    secure = config.secure
    dp = config.privacy.dp
    return DemoSetup(
        devices=config.devices, rounds=config.rounds, local_epochs=config.training.local_epochs,
        batch_size=config.training.batch_size, learning_rate=config.training.learning_rate,
        momentum=config.training.momentum, kp=config.kp, head=config.model.head, images_per_user=config.images_per_user,
        engine=config.runtime.engine, workers=config.workers or os.cpu_count() or 1, seed=config.seed, dp=dp,
        secure=SecureSetup(
            neighbours=secure.neighbours(config.devices), threshold=secure.threshold(config.devices),
            clip=None if dp else secure.secagg_clip, weight_cap=1 if dp else secure.secagg_weight_cap,
        ) if secure.secagg else None,
    )  # fmt: skip


def traffic(up: int, down: int, rounds: int, devices: int) -> Traffic:
    """A fleet's bytes, and per device per round over the rounds it ran."""
    per = devices * rounds
    return Traffic(up=up, down=down, rounds=rounds, up_per_device_round=up / per if per else None,
                   down_per_device_round=down / per if per else None)  # fmt: skip


def run_demo(config: DemoConfig) -> RunResults:
    out = config.out
    out.mkdir(parents=True, exist_ok=True)
    timings: dict[str, float] = {}
    start = time.perf_counter()
    model = f"MobileNet-V1 width {config.model.alpha:g}" if config.model.name == "mobilenet_v1" else config.model.name
    console.print(f"[bold]1/4[/] exporting {escape(model)} for aesthetic-synth into {out / 'artifacts'} ...")
    exported = run_export(
        ExportConfig(
            model=config.model,
            dataset="aesthetic-synth",
            kp=config.kp,
            out=out / "artifacts",
            seed=config.seed,
            init=config.init,
        ),
        check=check_exported,
    )
    timings["export"] = time.perf_counter() - start
    t = time.perf_counter()
    run_export(ExportConfig(kp=0, from_dir=out / "artifacts", out=out / "artifacts-kp0"), check=check_exported)
    timings["re-partition for kp=0"] = time.perf_counter() - t
    step_ms = median_step_ms(out / "artifacts")
    console.print(f"    {exported.seconds['total']:.0f} s; training step {step_ms:.0f} ms at batch 32 (ExecuTorch)")
    for warning in exported.warnings:
        console.print(f"    warning: {warning}", markup=False)
    data = DataConfig(
        dataset="aesthetic-synth",
        partition="user",
        users=config.devices + config.new_users,
        num_clients=config.devices,
        holdout_clients=config.new_users,
        images_per_user=config.images_per_user,
        seed=config.seed,
    )
    keys = {
        Env.ADMIN_TOKEN: secrets.token_urlsafe(32),
        Env.ENROLLMENT_KEY: secrets.token_urlsafe(24),
    }
    recorder = RunRecorder({"demo": config_json(config), "data": config_json(data)})
    bytes_counted: dict[str, tuple[int, int]] = {}
    for step, (label, artifacts) in enumerate(
        (("fedper", out / "artifacts"), ("fedavg", out / "artifacts-kp0")), start=2
    ):
        console.print(
            f"[bold]{step}/4[/] {label}: server + fleet of {config.devices} devices, {config.rounds} rounds ..."
        )
        t = time.perf_counter()
        # A demo starts from scratch: a previous run's server state (a finished run) and device
        # identities (enrolled with that server) in the same --out would end this one at once.
        data_dir, log = out / f"server-{label}", out / f"server-{label}.log"
        for stale in (data_dir, out / f"fleet-{label}", out / label):
            shutil.rmtree(stale, ignore_errors=True)
        log.unlink(missing_ok=True)
        with _server(artifacts, data_dir, log, config, keys) as server:
            console.print(f"    live: {server.url}/dashboard (any user name, password {keys[Env.ADMIN_TOKEN]})",
                          markup=False, highlight=False)  # fmt: skip
            fleet = FleetConfig(
                runtime=replace(config.runtime, server=server.url),
                devices=config.devices,
                workers=config.workers,
                storage=out / f"fleet-{label}",
                label=label,
                out=out / label,
                max_idle_wait=1.0,
            )
            os.environ[Env.ENROLLMENT_KEY] = keys[Env.ENROLLMENT_KEY]
            run_fleet(fleet, data, keys[Env.ENROLLMENT_KEY], recorder)
            bytes_counted[label] = (
                int(server.metric("fedper_bytes_received_total")),
                int(server.metric("fedper_bytes_sent_total")),
            )
            if config.privacy.dp:  # what the run spent, as the server reports it
                recorder.privacy[label] = httpx.get(server.url + Route.STATUS, timeout=30).json()["privacy"]
        timings[label] = time.perf_counter() - t
    if config.new_users:
        t = time.perf_counter()
        console.print(f"[bold]4/4[/] {config.new_users} new users fine-tune FedPer's and FedAvg's final models ...")
        recorder.new_users = _new_user_curves(config, data, out)
        timings["new users"] = time.perf_counter() - t
    timings["total"] = time.perf_counter() - start
    console.print("writing the results and the report ...")
    measured = recorder.results()
    rounds_run = {a: sum(not r.final for r in rows) for a, rows in measured.rounds.items()}
    majority = measured.baselines.get("majority")
    fedper = measured.algorithms.get("fedper")
    recorder.demo = DemoSummary(
        setup=demo_setup(config),
        base=base_source(config.init, config.model.name),
        step_ms=step_ms,
        timings=timings,
        traffic={a: traffic(up, down, rounds_run.get(a, 0), config.devices) for a, (up, down) in bytes_counted.items()},
        export=Export(sizes=exported.sizes, seconds=exported.seconds["total"]),
        comparison=compare(measured),
        majority_baseline=majority.mean_accuracy if majority else None,
        fedper_minus_majority=fedper.final_mean_accuracy - majority.mean_accuracy if majority and fedper else None,
    )
    results = recorder.write(out)  # results.json, metrics.csv and the plots, before the page
    report = write_report(out)
    finals = " vs ".join(f"{a} {s.final_mean_accuracy:.3f}" for a, s in results.algorithms.items())
    console.print(f"{finals or 'no fleet recorded a round'} mean client accuracy; {timings['total'] / 60:.1f} min; "
                  f"report: {report}")  # fmt: skip
    return results
