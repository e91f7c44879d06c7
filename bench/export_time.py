"""Lowering the training program: ``lower_training_program`` (one trace with the decompositions,
then XNNPACK delegation of the matrix products and ``XNNPACK_CONFIGS``' ops) and the same without XNNPACK, against the
public ``to_edge`` path of before (a trace, our decompositions, then ``to_edge``'s own second
``run_decompositions``), in the same run on the same step, each in a fresh process (the first
lowering in a process also pays one-time costs), and where ours spends its time, phase by
phase. The programs differ (node order, delegates); the tests check that they compute the
same step.

Also the default without its shortcuts (``shortcuts=False``: ExecuTorch's own partitioning, and
every pass even where it changes nothing): it must give the same program bytes.

Usage: python -m bench.export_time [--alpha 0.25] [--input-size 32] [--variant fast]
"""

from __future__ import annotations

import argparse
import hashlib
import json
import logging
import subprocess
import sys
import time
import warnings

import torch

from bench.common import write_results
from fedper.export.executorch_lowering import (
    drop_aliases,
    edge_compile_config,
    lower_training_program,
    trace_joint,
    use_linear_for_transposed_matmul,
)
from fedper.export.fast_ops import DECOMPOSITIONS
from fedper.export.training_graph import training_step
from fedper.models import ModelConfig, build_model

MAX_BATCH = 64
# reference: the public to_edge path; ours_without_shortcuts: ours with ExecuTorch's own
# partitioner merge test, every XNNPACK pass and every edge and to_executorch pass (the same
# bytes as ours, slower).
PATHS = ("reference", "ours_no_xnnpack", "ours_without_shortcuts", "ours")


def reference(step: torch.nn.Module, input_size: int) -> bytes:
    """The lowering as it was: decompose with ours, then ``to_edge`` (which decomposes again)."""
    from executorch.exir import ExecutorchBackendConfig, to_edge

    joint = trace_joint(step, input_size, MAX_BATCH).run_decompositions(DECOMPOSITIONS)
    drop_aliases(joint.graph_module)
    use_linear_for_transposed_matmul(joint.graph_module)
    manager = to_edge(joint, compile_config=edge_compile_config()).to_executorch(
        ExecutorchBackendConfig(external_constants=True, external_mutable_weights=True)
    )
    return bytes(manager.buffer)


def one(path: str, alpha: float, input_size: int, variant: str) -> None:
    """Lower once (``path``: ours or reference) and print seconds and the program's sha256."""
    warnings.simplefilter("ignore")
    logging.getLogger("torch").setLevel(logging.ERROR)
    step = training_step(build_model(ModelConfig(alpha=alpha, input_size=input_size), seed=0), variant)
    phases: dict[str, float] = {}
    start = time.perf_counter()
    if path == "reference":
        program = reference(step, input_size)
    else:
        program = lower_training_program(
            step, input_size, MAX_BATCH, xnnpack=path != "ours_no_xnnpack", phases=phases,
            shortcuts=path != "ours_without_shortcuts",
        ).program  # fmt: skip
    print(json.dumps({"seconds": time.perf_counter() - start, "sha256": hashlib.sha256(program).hexdigest(),
                      "phases": phases}))  # fmt: skip


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--alpha", type=float, default=0.25)
    parser.add_argument("--input-size", type=int, default=32)
    parser.add_argument("--variant", default="fast", choices=("fast", "plain"))
    parser.add_argument("--one", choices=PATHS, help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.one:
        one(args.one, args.alpha, args.input_size, args.variant)
        return
    measured = {}
    for path in PATHS:
        out = subprocess.run(
            [sys.executable, "-m", "bench.export_time", "--one", path, "--alpha", str(args.alpha),
             "--input-size", str(args.input_size), "--variant", args.variant],
            check=True, capture_output=True, text=True,
        ).stdout  # fmt: skip
        measured[path] = json.loads(out.strip().splitlines()[-1])
    ref_s, ours_s = measured["reference"]["seconds"], measured["ours"]["seconds"]
    plain_s = measured["ours_no_xnnpack"]["seconds"]
    stock = measured["ours_without_shortcuts"]
    if stock["sha256"] != measured["ours"]["sha256"]:
        raise SystemExit("the shortcuts changed the training program's bytes")
    row = {
        "alpha": args.alpha,
        "input_size": args.input_size,
        "variant": args.variant,
        "reference_s": round(ref_s, 1),
        "ours_no_xnnpack_s": round(plain_s, 1),
        "ours_s": round(ours_s, 1),
        "ours_without_shortcuts_s": round(stock["seconds"], 1),
        "ours_without_shortcuts_phases_s": {k: round(v, 1) for k, v in stock["phases"].items()},
        "same_program_bytes": True,
        "ratio": round(ours_s / ref_s, 3),
        "ours_phases_s": {k: round(v, 1) for k, v in measured["ours"]["phases"].items()},
    }
    print(f"training program, width {args.alpha}, {args.input_size} px, {args.variant}: "
          f"{ours_s:.0f} s ({plain_s:.0f} s without XNNPACK, {stock['seconds']:.0f} s without the "
          f"shortcuts, same bytes) vs {ref_s:.0f} s through to_edge "
          f"({row['ratio']:.2f}x); phases: {row['ours_phases_s']}")  # fmt: skip
    print("wrote", write_results(f"export_time_{args.variant}", row))


if __name__ == "__main__":
    main()
