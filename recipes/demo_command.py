"""``fedper demo``: the main job, with its options from :class:`recipes.demo.DemoConfig`."""

from __future__ import annotations

import argparse
from pathlib import Path

from fedper._recipes.demo import run_demo
from fedper._recipes.demo_config import DemoConfig
from fedper.common.config_cli import add_command, from_arguments, given, with_defaults
from fedper.pretrained import SCRATCH
from fedper.run_log import third_party_output_to


def add_parser(sub: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    add_command(
        sub, "demo", demo, [DemoConfig], skip=("server", "evaluator", "threads", "enrollment_key_file"),
        help="the main job: export, serve, and run FedPer and FedAvg fleets; writes a report",
        description="Exports a width-0.25 MobileNet-V1 (or the --model given, from --init scratch unless told) "
        "for aesthetic-synth, starts the server, "
        "runs a fleet of devices for FedPer (kp=2) and then FedAvg (kp=0) over HTTP, and writes "
        "OUT/report.html and OUT/results.json.",
    )  # fmt: skip


def demo_config(args: argparse.Namespace) -> DemoConfig:
    """The demo's config from its options; the packaged base is MobileNet-V1's, so another
    ``--model`` starts from random weights unless ``--init`` says otherwise."""
    if "model" in given(args) and args.model != "mobilenet_v1":
        args = with_defaults(args, {"init": Path(SCRATCH)})
    return from_arguments(DemoConfig, args)


def demo(args: argparse.Namespace) -> int:
    config = demo_config(args)
    # torch's and ExecuTorch's own lines go to OUT/demo.log; the terminal keeps the demo's.
    with third_party_output_to(config.out / "demo.log"):
        run_demo(config)
    return 0
