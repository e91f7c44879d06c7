"""``fedper export``: run the pipeline with progress and print what was written."""

from __future__ import annotations

import argparse
from pathlib import Path

from rich.console import Console
from rich.table import Table

from fedper.common.atomic_write import make_parent
from fedper.common.config_cli import add_command, from_arguments
from fedper.export.pipeline import ExportConfig, export_model_config, run_export
from fedper.models import build_model
from fedper.models.layer_table import format_layers
from fedper.run_log import third_party_output_to

console = Console(stderr=True)

ROLES_HELP = {
    "manifest.json": "which tensors are base/head, program I/O, input spec, sha256s",
    "train.pte": "ExecuTorch training program (forward + backward), any kp",
    "train.ptd": "its initial weights (a device copies its own in)",
    "infer.pte": "ExecuTorch inference program, batch 1",
    "infer.ptd": "its initial weights (a device writes its own)",
    "model.onnx": "eval model for ONNX Runtime: inputs are the image and every base/head weight",
    "base.safetensors": "initial base tensors (what the server serves as version 0)",
    "head.safetensors": "initial head tensors (each device's starting head)",
}


def add_parser(sub: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    add_command(
        sub, "export", export, [ExportConfig],
        help="export a split model for phones (ExecuTorch training/inference programs, ONNX)",
        description="Export a FedPer model into the files a phone needs: an ExecuTorch training "
        "program, inference models, initial weights and a manifest. The output directory is "
        "replaced atomically: a failed export leaves no partial directory behind. torch's and ExecuTorch's own "
        "output goes to OUT.log beside it.",
    )  # fmt: skip


def export_log(out: Path) -> Path:
    """The export's run log, beside the output directory: an export replaces that directory whole
    (a failed one leaves it untouched), and the log of a failed export is kept too."""
    out = out.absolute()
    return out.parent / f"{out.name}.log"


def export(args: argparse.Namespace) -> int:
    config = from_arguments(ExportConfig, args)
    if config.list_layers:
        mcfg = export_model_config(config)
        Console(soft_wrap=True).print(format_layers(build_model(mcfg, seed=config.seed), mcfg.name), markup=False)
        return 0
    make_parent(config.out)  # where the log goes too: an unwritable place is refused before anything runs
    log = export_log(config.out)
    log.unlink(missing_ok=True)  # the log of this export only, as the directory holds this export only
    with third_party_output_to(log), console.status("exporting...") as status:
        report = run_export(config, progress=lambda msg: status.update(msg), check=getattr(args, "check", None))
    table = Table(
        title=f"{report.out} (kp={report.manifest.kp}, {len(report.manifest.tensors.base)} "
        f"base / {len(report.manifest.tensors.head)} head tensors)"
    )
    table.add_column("file")
    table.add_column("bytes", justify="right")
    table.add_column("what it is for")
    for name, size in report.sizes.items():
        table.add_row(name, f"{size:,}", ROLES_HELP.get(name, ""))
    Console().print(table)
    for note in report.notes:
        console.print(f"note: {note}", markup=False)
    for warning in report.warnings:
        console.print(f"warning: {warning}", markup=False)
    timings = ", ".join(f"{k} {v:.1f} s" for k, v in report.seconds.items())
    console.print(f"export took {report.seconds['total']:.1f} s ({timings}); torch's and ExecuTorch's output: {log}")
    return 0
