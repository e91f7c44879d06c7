"""Training-step time: the exported ExecuTorch program vs eager PyTorch, at 1 and 2 threads.

Sizes: MobileNet-V1 width 0.25 and 1.0 at 32x32 with batch 32, width 0.25 at 224x224 with
batch 8. Each measurement runs in a fresh process (for its peak RSS, and because ExecuTorch's
thread pool is set before a program is loaded): one warm-up step, then the median of the timed
steps; a step is forward + backward + SGD with momentum. Both engines get the same thread
count (torch's threads; ExecuTorch's pool). Variants of the training program:

- ``xnnpack``: the default export (fast graph, matrix products delegated to XNNPACK);
- ``fast``: the fast graph on ExecuTorch's kernel library alone (no delegate);
- ``plain``: the stock ``nn.Conv2d`` graph (seconds per step; for comparison only).

Also: the batch-1 inference program, ms per image.

Each measurement runs ``--repeats`` times (default 3), interleaved with the others; the table
gives the median (this machine's speed varies by tens of percent within minutes).

Usage: python -m bench.train_step [--sizes 0.25/32/32,1.0/32/32,0.25/224/8] [--steps N]
       [--variants xnnpack,fast] [--threads 1,2] [--repeats 3]
"""

from __future__ import annotations

import argparse
import json
import statistics
import tempfile
import time
from collections.abc import Callable
from pathlib import Path

import torch

from bench.common import current_rss_mb, peak_rss_mb, run_child, write_results

SIZES = "0.25/32/32,1.0/32/32,0.25/224/8"


def _batch(input_size: int, batch: int) -> tuple[torch.Tensor, torch.Tensor]:
    g = torch.Generator().manual_seed(0)
    return torch.randn(batch, 3, input_size, input_size, generator=g), torch.randint(0, 10, (batch,), generator=g)


def _time(step: object, steps: int) -> list[float]:
    times = []
    for _ in range(steps + 1):
        start = time.perf_counter()
        step()  # type: ignore[operator]
        times.append(time.perf_counter() - start)
    return times[1:]


def run_eager(alpha: float, size: int, batch: int, threads: int, steps: int) -> dict[str, float]:
    from fedper.models import ModelConfig, build_model

    torch.set_num_threads(threads)
    model = build_model(ModelConfig(alpha=alpha, input_size=size), seed=0).train()
    opt = torch.optim.SGD(model.parameters(), lr=0.01, momentum=0.9)
    x, y = _batch(size, batch)

    def step() -> None:
        opt.zero_grad()
        torch.nn.functional.cross_entropy(model(x), y).backward()  # type: ignore[no-untyped-call]
        opt.step()

    return _measure(step, steps)


def _measure(step: Callable[[], None], steps: int) -> dict[str, float]:
    """Median ms per step, with the memory held before the timed steps and at the peak."""
    setup = current_rss_mb()
    times = _time(step, steps)
    return {"ms": 1000 * statistics.median(times), "peak_rss_mb": peak_rss_mb(), "rss_setup_mb": setup}


def run_et(pte: str, ptd: str, stats_json: str, size: int, batch: int, steps: int, threads: int) -> dict[str, float]:
    from executorch.extension.pybindings.portable_lib import _load_for_executorch
    from executorch.extension.training import TrainingModule, get_sgd_optimizer

    from fedper.device_runtime.compute_threads import set_compute_threads

    set_compute_threads(threads)  # before loading: an XNNPACK delegate keeps the pool it loads with
    module = TrainingModule(_load_for_executorch(pte, data_path=ptd))
    stats = [torch.ones(n) for n in json.loads(Path(stats_json).read_text())]
    x, y = _batch(size, batch)
    module.forward_backward("forward", (x, y, *stats))
    opt = get_sgd_optimizer(module.named_parameters(), 0.01, 0.9, 0.0, 0.0, False)

    def step() -> None:
        module.forward_backward("forward", (x, y, *stats))
        opt.step(module.named_gradients())

    return _measure(step, steps)


def run_inference(pte: str, ptd: str, size: int, steps: int) -> dict[str, float]:
    from executorch.extension.pybindings.portable_lib import _load_for_executorch

    module = _load_for_executorch(pte, data_path=ptd)
    x = torch.randn(1, 3, size, size)
    times = _time(lambda: module.forward((x,)), steps)
    return {"ms": 1000 * statistics.median(times), "peak_rss_mb": peak_rss_mb()}


def measure(
    alpha: float,
    size: int,
    batch: int,
    steps: int,
    workdir: Path,
    variants: list[str],
    threads: list[int],
    repeats: int = 1,
) -> dict[str, object]:
    from fedper.export.executorch_lowering import lower_inference_program, lower_training_program
    from fedper.export.training_graph import training_step
    from fedper.models import ModelConfig, build_model

    model = build_model(ModelConfig(alpha=alpha, input_size=size), seed=0)
    row: dict[str, object] = {"alpha": alpha, "input_size": size, "batch": batch}
    programs: dict[str, tuple[Path, Path, float]] = {}
    stats = workdir / "stats.json"
    for variant in variants:
        step = training_step(model, "plain" if variant == "plain" else "fast")
        start = time.perf_counter()
        lowered = lower_training_program(step, size, max(64, batch), xnnpack=variant == "xnnpack")
        export_s = time.perf_counter() - start
        pte, ptd = workdir / f"{variant}.pte", workdir / f"{variant}.ptd"
        pte.write_bytes(lowered.program)
        ptd.write_bytes(lowered.weights)
        state = model.state_dict()
        stats.write_text(json.dumps([int(state[n].numel()) for n in step.stat_names]))
        programs[variant] = (pte, ptd, export_s)
    # Every measurement `repeats` times, the programs and eager interleaved, so that a slow spell
    # of the machine hits all of them alike; the row keeps the median and every run.
    runs: dict[str, list[dict[str, float]]] = {}
    for _ in range(repeats):
        for t in threads:
            for variant, (pte, ptd, _export_s) in programs.items():
                # The plain graph takes seconds per step at width 1.0: fewer timed steps.
                n = steps if variant != "plain" else max(2, steps // 5)
                result = run_child(
                    "bench.train_step", "et", str(pte), str(ptd), str(stats), str(size), str(batch), str(n), str(t)
                )
                runs.setdefault(f"executorch_{variant}_{t}thread", []).append(result)
            runs.setdefault(f"eager_{t}thread", []).append(
                run_child("bench.train_step", "eager", str(alpha), str(size), str(batch), str(t), str(steps))
            )
    for key, results in runs.items():
        times = [r["ms"] for r in results]
        largest = max(results, key=lambda r: r["peak_rss_mb"])  # its peak RSS is the row's
        summary: dict[str, object] = dict(largest)
        summary.update(ms=statistics.median(times), runs_ms=times)
        variant = key.removeprefix("executorch_").rsplit("_", 1)[0]
        if variant in programs:
            summary["export_s"] = programs[variant][2]
        row[key] = summary
    inference = lower_inference_program(model, size)
    (workdir / "infer.pte").write_bytes(inference.program)
    (workdir / "infer.ptd").write_bytes(inference.weights)
    row["inference_executorch"] = run_child(
        "bench.train_step", "infer", str(workdir / "infer.pte"), str(workdir / "infer.ptd"), str(size), str(steps)
    )
    ms = {k: v["ms"] for k, v in row.items() if isinstance(v, dict)}
    for variant in variants:
        for t in threads:
            row[f"{variant}_over_eager_{t}thread"] = ms[f"executorch_{variant}_{t}thread"] / ms[f"eager_{t}thread"]
        if len(threads) > 1:
            lo, hi = min(threads), max(threads)
            row[f"{variant}_speedup_{hi}_over_{lo}_threads"] = (
                ms[f"executorch_{variant}_{lo}thread"] / ms[f"executorch_{variant}_{hi}thread"]
            )
    return row


def _summary(row: dict[str, object], variants: list[str], threads: list[int]) -> str:
    ms = {k: v["ms"] for k, v in row.items() if isinstance(v, dict)}
    parts = [f"width {row['alpha']} {row['input_size']}x{row['input_size']} batch {row['batch']}:"]
    for t in threads:
        et = ", ".join(
            f"{v} {ms[f'executorch_{v}_{t}thread']:.0f} ms ({row[f'{v}_over_eager_{t}thread']:.2f}x)" for v in variants
        )
        parts.append(f"{t} thread(s): eager {ms[f'eager_{t}thread']:.0f} ms, ExecuTorch {et};")
    for v in variants:
        key = f"{v}_speedup_{max(threads)}_over_{min(threads)}_threads"
        if key in row:
            parts.append(f"{v} {max(threads)}-thread speedup {row[key]:.2f}x;")
    parts.append(f"inference {ms['inference_executorch']:.1f} ms/image")
    return " ".join(parts)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--sizes", default=SIZES, help="alpha/input/batch,...")
    parser.add_argument("--steps", type=int, default=10)
    parser.add_argument("--variants", default="xnnpack,fast", help="training programs: xnnpack, fast, plain")
    parser.add_argument("--threads", default="1,2", help="thread counts, each for both engines")
    parser.add_argument("--repeats", type=int, default=3, help="runs of each measurement (median reported)")
    parser.add_argument("--child", nargs="+", help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.child:
        kind, *rest = args.child
        if kind == "eager":
            out = run_eager(float(rest[0]), int(rest[1]), int(rest[2]), int(rest[3]), int(rest[4]))
        elif kind == "et":
            out = run_et(rest[0], rest[1], rest[2], int(rest[3]), int(rest[4]), int(rest[5]), int(rest[6]))
        else:
            out = run_inference(rest[0], rest[1], int(rest[2]), int(rest[3]))
        print(json.dumps(out))
        return
    variants = args.variants.split(",")
    threads = [int(t) for t in args.threads.split(",")]
    rows = []
    for spec in args.sizes.split(","):
        alpha, size, batch = spec.split("/")
        with tempfile.TemporaryDirectory() as tmp:
            row = measure(float(alpha), int(size), int(batch), args.steps, Path(tmp), variants, threads, args.repeats)
        rows.append(row)
        print(_summary(row, variants, threads), flush=True)
    print("wrote", write_results("train_step", {"rows": rows}))


if __name__ == "__main__":
    main()
