"""What a static batch would buy: the training program traced without a dynamic batch (at batch
32), with and without XNNPACK's ``slice_copy`` (which refuses a dynamic batch), against the default
program: export time and step time at 1 and 2 threads, beside eager PyTorch, in one run.

An experiment, not a supported export: a static program takes exactly one batch size, so using it
would need a program per size or a padded, masked remainder (manifest, protocol, both runtimes).
Each export in a fresh process; the steps ``--repeats`` times interleaved, the median.

Usage: python -m bench.static_batch [--alpha 0.25] [--repeats 3]
"""

from __future__ import annotations

import argparse
import json
import statistics
import tempfile
import time
from pathlib import Path
from typing import Any

from bench.common import run_child, write_results

BATCH = 32
SIZE = 32
KINDS = ("dynamic", "static", "static_slices")


def export_child(kind: str, alpha: float, out: Path) -> dict[str, Any]:
    import warnings

    from torch.export import export
    from torch.export.experimental import _copy_graph_module_and_signature, _remove_detach_pass
    from torch.export.exported_program import _decompose_exported_program

    import fedper.export.executorch_lowering as lowering
    from fedper.export.program_memory import planned_memory
    from fedper.export.training_graph import training_step
    from fedper.models import ModelConfig, build_model

    warnings.simplefilter("ignore")

    def static_trace(step: Any, input_size: int, max_batch: int, decompositions: Any = None) -> Any:
        """``trace_joint`` without the dynamic batch: the same body, the example at ``BATCH``."""
        exported = export(step, lowering.example_inputs(step, input_size, BATCH), strict=False)
        joint = _decompose_exported_program(exported, cia_to_decomp={}, python_decomp_table=decompositions,
                                            joint_loss_index=0, decompose_custom_triton_ops=False)  # fmt: skip
        gm, signature = _copy_graph_module_and_signature(joint)
        _remove_detach_pass(gm, signature)
        return joint._update(gm, signature)

    if kind != "dynamic":
        lowering.trace_joint = static_trace  # type: ignore[assignment]
    if kind == "static_slices":
        lowering.XNNPACK_CONFIGS = (*lowering.XNNPACK_CONFIGS, "SliceCopyConfig")
        lowering._PASS_FREE_OPS = lowering._PASS_FREE_OPS | {"aten.slice_copy.Tensor"}
    model = build_model(ModelConfig(alpha=alpha, input_size=SIZE), seed=0)
    step = training_step(model, "fast")
    phases: dict[str, float] = {}
    start = time.perf_counter()
    lowered = lowering.lower_training_program(step, SIZE, BATCH, phases=phases)
    seconds = time.perf_counter() - start
    (out / f"{kind}.pte").write_bytes(lowered.program)
    (out / f"{kind}.ptd").write_bytes(lowered.weights)
    state = model.state_dict()
    (out / "stats.json").write_text(json.dumps([int(state[n].numel()) for n in step.stat_names]))
    return {"export_s": seconds, "phases_s": phases, "planned_mib": planned_memory(lowered.program).total / 2**20}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--alpha", type=float, default=0.25)
    parser.add_argument("--steps", type=int, default=10)
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--child", nargs="+", help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.child:
        print(json.dumps(export_child(args.child[0], float(args.child[1]), Path(args.child[2]))))
        return
    row: dict[str, Any] = {"alpha": args.alpha, "input_size": SIZE, "batch": BATCH}
    runs: dict[str, list[float]] = {}
    with tempfile.TemporaryDirectory() as tmp:
        for kind in KINDS:
            row[kind] = run_child("bench.static_batch", kind, str(args.alpha), tmp)
            print(f"{kind}: export {row[kind]['export_s']:.0f} s", flush=True)
        for _ in range(args.repeats):
            for threads in ("1", "2"):
                for kind in KINDS:
                    files = (f"{tmp}/{kind}.pte", f"{tmp}/{kind}.ptd", f"{tmp}/stats.json")
                    common = (str(SIZE), str(BATCH), str(args.steps), threads)
                    runs.setdefault(f"{kind}_{threads}", []).append(
                        run_child("bench.train_step", "et", *files, *common)["ms"]
                    )
                eager = ("eager", str(args.alpha), str(SIZE), str(BATCH), threads, str(args.steps))
                runs.setdefault(f"eager_{threads}", []).append(run_child("bench.train_step", *eager)["ms"])
    for key, times in runs.items():
        row[f"step_ms_{key}"] = statistics.median(times)
        row[f"step_runs_ms_{key}"] = times
    for threads in ("1", "2"):
        print(
            f"{threads} thread(s): "
            + ", ".join(f"{k} {row[f'step_ms_{k}_{threads}']:.0f} ms" for k in (*KINDS, "eager"))
        )
    print("wrote", write_results("static_batch", row))


if __name__ == "__main__":
    main()
