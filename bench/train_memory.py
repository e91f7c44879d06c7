"""Memory of on-device training: what the exported training program plans, against the lower
bound of a training step, with the export's time and one training device's peak RSS.

For each model size and batch, the program is exported with ``max_batch`` equal to the batch
(a program plans for its largest batch), in a fresh process (the export's time is a cold one,
no cache). Then, each in a fresh process:

- the lower bound (``export.program_memory.step_lower_bound``: parameters, gradients, the tensors
  saved for backward, the largest other tensor, measured on the same step in eager PyTorch);
- the program's planned buffers (what ``MethodMeta`` reports) and liveness peak
  (``export.program_memory.planned_memory``);
- one training device: the program loaded through the ExecuTorch runtime as a device loads it,
  3 steps; its peak RSS (``VmHWM``) and its RSS before loading (Python, torch and ExecuTorch).

Usage: python -m bench.train_memory [--sizes 0.25/32,1.0/32,0.25/224,1.0/224] [--batches 32,64]
"""

from __future__ import annotations

import argparse
import json
import tempfile
import time
from pathlib import Path

import torch

from bench.common import current_rss_mb, peak_rss_mb, run_child, write_results

SIZES = "0.25/32,1.0/32,0.25/224,1.0/224"
MIB = 2**20


def _model_and_step(alpha: float, size: int) -> tuple[torch.nn.Module, torch.nn.Module]:
    from fedper.export.training_graph import training_step
    from fedper.models import ModelConfig, build_model

    model = build_model(ModelConfig(alpha=alpha, input_size=size), seed=0)
    return model, training_step(model, "fast")


def export_child(alpha: float, size: int, batch: int, out: Path) -> dict[str, object]:
    from fedper.export.executorch_lowering import lower_training_program
    from fedper.export.program_memory import planned_memory

    _, step = _model_and_step(alpha, size)
    phases: dict[str, float] = {}
    start = time.perf_counter()
    lowered = lower_training_program(step, size, batch, phases=phases)
    seconds = time.perf_counter() - start
    (out / "train.pte").write_bytes(lowered.program)
    (out / "train.ptd").write_bytes(lowered.weights)
    memory = planned_memory(lowered.program)
    return {"export_s": seconds, "export_phases_s": phases, "planned_mib": memory.total / MIB,
            "liveness_peak_mib": memory.liveness_peak / MIB}  # fmt: skip


def bound_child(alpha: float, size: int, batch: int) -> dict[str, object]:
    from fedper.export.executorch_lowering import example_inputs
    from fedper.export.program_memory import step_lower_bound

    _, step = _model_and_step(alpha, size)
    bound = step_lower_bound(step, example_inputs(step, size, batch))
    return {"parameters_mib": bound.parameters / MIB, "gradients_mib": bound.gradients / MIB,
            "saved_mib": bound.saved / MIB, "largest_transient_mib": bound.largest_transient / MIB,
            "lower_bound_mib": bound.total / MIB}  # fmt: skip


def device_child(alpha: float, size: int, batch: int, out: Path) -> dict[str, object]:
    from executorch.extension.pybindings.portable_lib import _load_for_executorch
    from executorch.extension.training import TrainingModule, get_sgd_optimizer

    from fedper.export.executorch_lowering import example_inputs

    _, step = _model_and_step(alpha, size)
    inputs = example_inputs(step, size, batch)
    before = current_rss_mb()
    module = TrainingModule(_load_for_executorch(str(out / "train.pte"), data_path=str(out / "train.ptd")))
    module.forward_backward("forward", inputs)
    opt = get_sgd_optimizer(module.named_parameters(), 0.01, 0.9, 0.0, 0.0, False)
    for _ in range(3):
        module.forward_backward("forward", inputs)
        opt.step(module.named_gradients())
    return {"device_rss_before_load_mb": before, "device_peak_rss_mb": peak_rss_mb()}


def measure(alpha: float, size: int, batch: int) -> dict[str, object]:
    row: dict[str, object] = {"alpha": alpha, "input_size": size, "batch": batch}
    with tempfile.TemporaryDirectory() as tmp:
        common = (str(alpha), str(size), str(batch))
        row.update(run_child("bench.train_memory", "export", *common, tmp))
        row.update(run_child("bench.train_memory", "bound", *common))
        row.update(run_child("bench.train_memory", "device", *common, tmp))
    row["planned_over_bound"] = row["planned_mib"] / row["lower_bound_mib"]  # type: ignore[operator]
    row["liveness_over_bound"] = row["liveness_peak_mib"] / row["lower_bound_mib"]  # type: ignore[operator]
    return row


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--sizes", default=SIZES, help="alpha/input,...")
    parser.add_argument("--batches", default="32,64")
    parser.add_argument("--name", default="train_memory", help="results file name")
    parser.add_argument("--child", nargs="+", help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.child:
        import warnings

        warnings.simplefilter("ignore")
        kind, alpha, size, batch, *rest = args.child
        common = (float(alpha), int(size), int(batch))
        if kind == "export":
            result = export_child(*common, Path(rest[0]))
        elif kind == "bound":
            result = bound_child(*common)
        else:
            result = device_child(*common, Path(rest[0]))
        print(json.dumps(result))
        return
    rows = []
    for spec in args.sizes.split(","):
        alpha, size = spec.split("/")
        for batch in args.batches.split(","):
            row = measure(float(alpha), int(size), int(batch))
            rows.append(row)
            print(f"width {alpha}, {size} px, batch {batch}: export {row['export_s']:.0f} s; lower bound "
                  f"{row['lower_bound_mib']:.0f} MiB, liveness peak {row['liveness_peak_mib']:.0f} MiB, planned "
                  f"{row['planned_mib']:.0f} MiB ({row['planned_over_bound']:.2f}x the bound); one training "
                  f"device {row['device_peak_rss_mb']:.0f} MB peak RSS ({row['device_rss_before_load_mb']:.0f} MB "
                  "before loading)", flush=True)  # fmt: skip
    print("wrote", write_results(args.name, {"rows": rows}))


if __name__ == "__main__":
    main()
