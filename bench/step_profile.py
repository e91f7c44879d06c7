"""Where an exported training step's time goes, per operator, at 1 and 2 threads (ETDump).

Exports the training program (the default export: fast graph, XNNPACK delegation) and runs it
in a fresh process per thread count with ExecuTorch's event tracer on (``enable_etdump``): a
warm-up step, then ``--steps`` steps; each event's time is its median over the steps. Events
are grouped by what ran them:

- ``xnnpack``: ops inside XNNPACK delegates (XNNPACK's own names, e.g. ``Multiply (ND)``),
  which run on ExecuTorch's thread pool;
- ``kernels``: ops of ExecuTorch's kernel library (``native_call_<op>``), single-threaded
  unless the kernel splits its loop (docs/PERFORMANCE.md, "Threads and kernels");
- the rest: each delegate or operator call beyond the ops inside it (``call_overhead_ms``),
  and the method's total beyond its calls (``dispatch_ms``).

The tracer adds its own cost to every event, so the totals are above ``bench.train_step``'s;
the shares and the 1 -> 2 thread ratios are what this benchmark is for (Amdahl's law: the
step cannot go faster at 2 threads than its single-threaded part allows).

Usage: python -m bench.step_profile [--alpha 0.25 | --model torchvision:NAME] [--size 32]
       [--batch 32] [--threads 1,2] [--steps 5] [--name step_profile]
"""

from __future__ import annotations

import argparse
import json
import re
import statistics
import tempfile
import time
from collections import defaultdict
from pathlib import Path
from typing import Any

import torch

from bench.common import run_child, write_results

TOTALS = ("Method::execute", "DELEGATE_CALL", "OPERATOR_CALL")
SKIPPED = ("Program::load_method", "Method::init")


def _op_name(event: str) -> tuple[str, str]:
    """(engine, op) for an ETDump event name: XNNPACK's numbered ops are one op."""
    if event.startswith("native_call_"):
        return "kernels", event.removeprefix("native_call_")
    return "xnnpack", re.sub(r" #\d+$", "", event)


def profile_child(
    pte: str, ptd: str, stats_json: str, size: int, batch: int, steps: int, threads: int
) -> dict[str, Any]:
    """One process: load with the event tracer, run the steps, return per-op milliseconds."""
    import torch
    from executorch.devtools import Inspector
    from executorch.extension.pybindings.portable_lib import _load_for_executorch

    from fedper.device_runtime.compute_threads import set_compute_threads

    set_compute_threads(threads)  # before loading: an XNNPACK delegate keeps the pool it loads with
    module = _load_for_executorch(pte, data_path=ptd, enable_etdump=True)
    stats = [torch.ones(n) for n in json.loads(Path(stats_json).read_text())]
    g = torch.Generator().manual_seed(0)
    x, y = torch.randn(batch, 3, size, size, generator=g), torch.randint(0, 10, (batch,), generator=g)
    for _ in range(steps + 1):
        module.run_method("forward", (x, y, *stats))
    with tempfile.TemporaryDirectory() as tmp:
        etdump = Path(tmp) / "etdump.bin"
        module.write_etdump_result_to_file(str(etdump))
        inspector = Inspector(etdump_path=str(etdump))
    ops: dict[str, dict[str, Any]] = {}
    totals: dict[str, float] = {}
    for block in inspector.event_blocks:
        for event in block.events:
            if event.perf_data is None or event.name in SKIPPED:
                continue
            ms = statistics.median(event.perf_data.raw[1:] or event.perf_data.raw)  # the warm-up step dropped
            if event.name in TOTALS:
                totals[event.name] = totals.get(event.name, 0.0) + ms
                continue
            engine, op = _op_name(event.name)
            row = ops.setdefault(op, {"engine": engine, "calls": 0, "ms": 0.0})
            row["calls"] += 1
            row["ms"] += ms
    return {"totals": totals, "ops": ops}


def measure(
    alpha: float, model_name: str | None, size: int, batch: int, threads: list[int], steps: int, workdir: Path
) -> dict[str, Any]:
    from fedper.export.executorch_lowering import lower_training_program
    from fedper.export.training_graph import training_step
    from fedper.models import ModelConfig, build_model

    model: torch.nn.Module
    if model_name is None:
        model = build_model(ModelConfig(alpha=alpha, input_size=size), seed=0)
    else:
        from bench.model_zoo import torchvision_model

        model = torchvision_model(model_name.removeprefix("torchvision:"))
    step = training_step(model, "fast")  # type: ignore[arg-type]
    start = time.perf_counter()
    lowered = lower_training_program(step, size, max(64, batch))
    export_s = time.perf_counter() - start
    pte, ptd, stats = workdir / "step.pte", workdir / "step.ptd", workdir / "stats.json"
    pte.write_bytes(lowered.program)
    ptd.write_bytes(lowered.weights)
    state = model.state_dict()
    stats.write_text(json.dumps([int(state[n].numel()) for n in step.stat_names]))
    runs = {
        t: run_child("bench.step_profile", str(pte), str(ptd), str(stats), str(size), str(batch), str(steps), str(t))
        for t in threads
    }
    return {"alpha": alpha, "model": model_name or "mobilenet_v1", "input_size": size, "batch": batch, "export_s": export_s, "steps": steps,
            "threads": {str(t): run for t, run in runs.items()}}  # fmt: skip


def summarize(result: dict[str, Any]) -> dict[str, Any]:
    """Per engine: ms at each thread count; the step's total, and what its calls and dispatch add."""
    summary: dict[str, Any] = {}
    for t, run in result["threads"].items():
        engines: dict[str, float] = defaultdict(float)
        for row in run["ops"].values():
            engines[row["engine"]] += row["ms"]
        total = run["totals"].get("Method::execute", 0.0)
        calls = run["totals"].get("DELEGATE_CALL", 0.0) + run["totals"].get("OPERATOR_CALL", 0.0)
        summary[t] = {"total_ms": total, "xnnpack_ms": engines["xnnpack"], "kernels_ms": engines["kernels"],
                      "call_overhead_ms": calls - engines["xnnpack"] - engines["kernels"],
                      "dispatch_ms": total - calls}  # fmt: skip
    return summary


def print_table(result: dict[str, Any], top: int = 20) -> None:
    threads = list(result["threads"])
    first = result["threads"][threads[0]]["ops"]
    name = result.get("model", "mobilenet_v1")
    what = f"width {result['alpha']}" if name == "mobilenet_v1" else name
    print(f"{what}, {result['input_size']} px, batch {result['batch']} (ms per step, with the tracer)")
    header = " | ".join(f"{t} thread(s)" for t in threads)
    print(f"| op | engine | calls | {header} |")
    for op, row in sorted(first.items(), key=lambda item: -float(item[1]["ms"]))[:top]:
        cells = " | ".join(f"{result['threads'][t]['ops'].get(op, {}).get('ms', 0.0):.1f}" for t in threads)
        print(f"| {op} | {row['engine']} | {row['calls']} | {cells} |")
    for t, s in summarize(result).items():
        print(f"{t} thread(s): total {s['total_ms']:.1f} ms = XNNPACK {s['xnnpack_ms']:.1f} + kernel library "
              f"{s['kernels_ms']:.1f} + calls {s['call_overhead_ms']:.1f} + dispatch {s['dispatch_ms']:.1f}")  # fmt: skip


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0] if __doc__ else None)
    parser.add_argument("--alpha", type=float, default=0.25)
    parser.add_argument("--model", help="a named torchvision model (torchvision:NAME) instead of MobileNet-V1")
    parser.add_argument("--size", type=int, default=32)
    parser.add_argument("--batch", type=int, default=32)
    parser.add_argument("--threads", default="1,2")
    parser.add_argument("--steps", type=int, default=5)
    parser.add_argument("--name", default="step_profile", help="results/<name>.json")
    parser.add_argument("--child", nargs=7, help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.child:
        pte, ptd, stats, size, batch, steps, threads = args.child
        print(json.dumps(profile_child(pte, ptd, stats, int(size), int(batch), int(steps), int(threads))))
        return
    with tempfile.TemporaryDirectory() as tmp:
        threads = [int(t) for t in args.threads.split(",")]
        result = measure(args.alpha, args.model, args.size, args.batch, threads, args.steps, Path(tmp))
    result["summary"] = summarize(result)
    print_table(result)
    print(f"wrote {write_results(args.name, result)}")


if __name__ == "__main__":
    main()
