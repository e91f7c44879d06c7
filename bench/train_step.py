"""Training-step time: the exported ExecuTorch program (fast and plain graphs) vs eager PyTorch.

Sizes: MobileNet-V1 width 0.25 and 1.0 at 32x32 with batch 32, width 0.25 at 224x224 with
batch 8. Each measurement runs in a fresh process (for its peak RSS): one warm-up step,
then the median of the timed steps; a step is forward + backward + SGD with momentum.
ExecuTorch's kernels run on one thread here (CPU time equals wall time), so eager is
measured with 1 thread (same thread count) and, for reference, with 2.
Also: the batch-1 inference program (unchanged by the training graph), ms per image.

Usage: python -m bench.train_step [--sizes 0.25/32/32,1.0/32/32,0.25/224/8] [--steps N]
"""

from __future__ import annotations

import argparse
import json
import statistics
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable
from pathlib import Path

import torch

from bench.common import current_rss_mb, peak_rss_mb, write_results

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
        torch.nn.functional.cross_entropy(model(x), y).backward()
        opt.step()

    return _measure(step, steps)


def _measure(step: Callable[[], None], steps: int) -> dict[str, float]:
    """Median ms per step, with the memory held before the timed steps and at the peak."""
    setup = current_rss_mb()
    times = _time(step, steps)
    return {"ms": 1000 * statistics.median(times), "peak_rss_mb": peak_rss_mb(), "rss_setup_mb": setup}


def run_et(pte: str, ptd: str, stats_json: str, size: int, batch: int, steps: int) -> dict[str, float]:
    from executorch.extension.pybindings.portable_lib import _load_for_executorch
    from executorch.extension.training import TrainingModule, get_sgd_optimizer

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


def _child(*args: str) -> dict[str, float]:
    out = subprocess.run([sys.executable, "-m", "bench.train_step", "--child", *args], capture_output=True, text=True)
    if out.returncode != 0:
        raise RuntimeError(out.stderr[-2000:])
    return json.loads(out.stdout.strip().splitlines()[-1])


def measure(alpha: float, size: int, batch: int, steps: int, workdir: Path) -> dict[str, object]:
    from export.executorch_lowering import lower_inference_program, lower_training_program
    from export.training_graph import training_step
    from fedper.models import ModelConfig, build_model

    model = build_model(ModelConfig(alpha=alpha, input_size=size), seed=0)
    row: dict[str, object] = {"alpha": alpha, "input_size": size, "batch": batch}
    for variant in ("fast", "plain"):
        step = training_step(model, variant)  # type: ignore[arg-type]
        start = time.perf_counter()
        lowered = lower_training_program(step, size, max(64, batch))
        export_s = time.perf_counter() - start
        pte, ptd = workdir / f"{variant}.pte", workdir / f"{variant}.ptd"
        pte.write_bytes(lowered.program)
        ptd.write_bytes(lowered.weights)
        stats = workdir / "stats.json"
        state = model.state_dict()
        stats.write_text(json.dumps([int(state[n].numel()) for n in step.stat_names]))
        # The plain graph takes seconds per step at width 1.0: fewer timed steps.
        n = steps if variant == "fast" else max(2, steps // 5)
        result = _child("et", str(pte), str(ptd), str(stats), str(size), str(batch), str(n))
        row[f"executorch_{variant}"] = {**result, "export_s": export_s}
    for threads in (1, 2):
        row[f"eager_{threads}thread"] = _child("eager", str(alpha), str(size), str(batch), str(threads), str(steps))
    inference = lower_inference_program(model, size)
    (workdir / "infer.pte").write_bytes(inference.program)
    (workdir / "infer.ptd").write_bytes(inference.weights)
    row["inference_executorch"] = _child(
        "infer", str(workdir / "infer.pte"), str(workdir / "infer.ptd"), str(size), str(steps)
    )
    fast, plain = row["executorch_fast"], row["executorch_plain"]
    e1, e2 = row["eager_1thread"], row["eager_2thread"]
    row["fast_over_eager_1thread"] = fast["ms"] / e1["ms"]  # type: ignore[index]
    row["fast_over_eager_2thread"] = fast["ms"] / e2["ms"]  # type: ignore[index]
    row["plain_over_eager_1thread"] = plain["ms"] / e1["ms"]  # type: ignore[index]
    row["speedup_fast_over_plain"] = plain["ms"] / fast["ms"]  # type: ignore[index]
    return row


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--sizes", default=SIZES, help="alpha/input/batch,...")
    parser.add_argument("--steps", type=int, default=10)
    parser.add_argument("--child", nargs="+", help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.child:
        kind, *rest = args.child
        if kind == "eager":
            out = run_eager(float(rest[0]), int(rest[1]), int(rest[2]), int(rest[3]), int(rest[4]))
        elif kind == "et":
            out = run_et(rest[0], rest[1], rest[2], int(rest[3]), int(rest[4]), int(rest[5]))
        else:
            out = run_inference(rest[0], rest[1], int(rest[2]), int(rest[3]))
        print(json.dumps(out))
        return
    rows = []
    for spec in args.sizes.split(","):
        alpha, size, batch = spec.split("/")
        with tempfile.TemporaryDirectory() as tmp:
            row = measure(float(alpha), int(size), int(batch), args.steps, Path(tmp))
        rows.append(row)
        print(
            f"width {alpha} {size}x{size} batch {batch}: ExecuTorch fast "
            f"{row['executorch_fast']['ms']:.0f} ms, plain {row['executorch_plain']['ms']:.0f} ms; "  # type: ignore[index]
            f"eager {row['eager_1thread']['ms']:.0f} ms (1 thread), "  # type: ignore[index]
            f"{row['eager_2thread']['ms']:.0f} ms (2 threads); fast/eager "  # type: ignore[index]
            f"{row['fast_over_eager_1thread']:.2f}x (1 thread), {row['fast_over_eager_2thread']:.2f}x "
            f"(2 threads); fast is {row['speedup_fast_over_plain']:.1f}x the plain export; peak RSS "
            f"fast {row['executorch_fast']['peak_rss_mb']:.0f} MB, plain "  # type: ignore[index]
            f"{row['executorch_plain']['peak_rss_mb']:.0f} MB, eager "  # type: ignore[index]
            f"{row['eager_1thread']['peak_rss_mb']:.0f} MB; inference "  # type: ignore[index]
            f"{row['inference_executorch']['ms']:.1f} ms/image",  # type: ignore[index]
            flush=True,
        )
    print("wrote", write_results("train_step", {"rows": rows}))


if __name__ == "__main__":
    main()
