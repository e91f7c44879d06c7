"""An experiment, not the default export: more element-wise ops to XNNPACK.

The default export delegates the matrix products and ``add``/``sub``/``mul`` to XNNPACK
(``export.executorch_lowering.delegate_to_xnnpack``); the element-wise kernels of ExecuTorch's
optimized library are single-threaded (docs/PERFORMANCE.md). This lowers the width-0.25, 32 px,
10-class training step twice, each in a fresh process: the default, and with XNNPACK also taking
``div``, ``hardtanh``, ``relu``, ``clamp``, ``sqrt`` and ``rsqrt`` (``--ops``) whose inputs are all
runtime tensors (a parameter input would be baked into the delegate as a constant, and training
would not see its updates). For each program:
export seconds; step time at 1 and 2 threads (``bench.train_step``'s child, eager in the same
run); and gradients against eager PyTorch (float32 and float64) with the same random weights,
at batch 32 and then at batch 17 after a step at batch 32 (a device's last batch of an epoch is
smaller).

Usage: python -m bench.xnnpack_elementwise [--steps 20] [--ops DivConfig,ReLUConfig,...]
"""

from __future__ import annotations

import argparse
import functools
import json
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

import torch

from bench.common import run_child, write_results

# Beyond the default's (``XNNPACK_CONFIGS``, which has ``relu`` and ``clamp`` too).
ELEMENTWISE = ["DivConfig", "HardtanhConfig", "SquareRootConfig", "ReciprocalSquareRootConfig"]
ALPHA, SIZE, BATCH = 0.25, 32, 32


def export(out: Path, ops: list[str]) -> None:
    from executorch.backends.xnnpack.partition.config import generic_node_configs

    import fedper.export.executorch_lowering as lowering
    from fedper.export.training_graph import training_step
    from fedper.models import ModelConfig, build_model

    already = set(lowering.XNNPACK_CONFIGS)  # XNNPACK's partitioner refuses a config given twice
    extra = [lowering.runtime_inputs_only(getattr(generic_node_configs, n)) for n in ops if n not in already]
    lowering.delegate_to_xnnpack = functools.partial(lowering.delegate_to_xnnpack, extra_configs=extra)
    model = build_model(ModelConfig(alpha=ALPHA, input_size=SIZE), seed=0)
    step = training_step(model, "fast")
    start = time.perf_counter()
    lowered = lowering.lower_training_program(step, SIZE, 64)
    seconds = time.perf_counter() - start
    (out / "p.pte").write_bytes(lowered.program)
    (out / "p.ptd").write_bytes(lowered.weights)
    state = model.state_dict()
    (out / "stats.json").write_text(json.dumps([int(state[n].numel()) for n in step.stat_names]))
    print(json.dumps({"export_s": seconds}))


def parity(out: Path, batch: int) -> None:
    """Gradients of the program against eager PyTorch with the same random weights, at ``batch``
    after a first step at batch 32. The reference is float64: where a gradient nearly cancels,
    eager float32 is itself far off (17% on one BatchNorm channel at batch 17), so each tensor's
    error (largest absolute difference over the tensor's largest float64 gradient) is compared
    with eager float32's, as ``tests/unit/export/test_export.py`` does: "bad" tensors are those more than 3x
    eager float32's error plus 1e-3. Also the largest difference from eager float32 (what this
    benchmark reported before it had the float64 reference)."""
    import copy

    from executorch.extension.pybindings.portable_lib import _load_for_executorch
    from executorch.extension.training import TrainingModule

    from fedper.models import ModelConfig, build_model

    module = TrainingModule(_load_for_executorch(str(out / "p.pte"), data_path=str(out / "p.ptd")))
    stats = [torch.ones(n) for n in json.loads((out / "stats.json").read_text())]
    g = torch.Generator().manual_seed(1)
    x, y = torch.randn(BATCH, 3, SIZE, SIZE, generator=g), torch.randint(0, 10, (BATCH,), generator=g)
    module.forward_backward("forward", (x, y, *stats))
    g = torch.Generator().manual_seed(5)
    params = module.named_parameters()
    for name, p in params.items():
        p.copy_(torch.randn(p.shape, generator=g) * 0.1 + (1.0 if p.dim() == 1 and name.endswith("weight") else 0.0))
    module.forward_backward("forward", (x[:batch], y[:batch], *stats))
    grads = module.named_gradients()
    model = build_model(ModelConfig(alpha=ALPHA, input_size=SIZE), seed=0).train()
    state = model.state_dict()
    with torch.no_grad():
        for name, p in params.items():
            state[name].copy_(p)
    model64 = copy.deepcopy(model).double()
    torch.nn.functional.cross_entropy(model(x[:batch]), y[:batch]).backward()  # type: ignore[no-untyped-call]
    torch.nn.functional.cross_entropy(model64(x[:batch].double()), y[:batch]).backward()  # type: ignore[no-untyped-call]
    eager, exact = dict(model.named_parameters()), dict(model64.named_parameters())

    def off(a: torch.Tensor, b: torch.Tensor) -> float:
        return float((a.double() - b.double()).abs().max() / (b.double().abs().max() + 1e-12))

    vs32 = {n: off(grads[n], eager[n].grad) for n in grads}  # type: ignore[arg-type]
    vs64 = {n: (off(grads[n], exact[n].grad), off(eager[n].grad, exact[n].grad)) for n in grads}  # type: ignore[arg-type]
    bad = [n for n, (program, eager32) in vs64.items() if program > 3 * eager32 + 1e-3]
    worst = max(vs32, key=vs32.__getitem__)
    worst64 = max(vs64, key=lambda n: vs64[n][0])
    print(json.dumps({"worst": vs32[worst], "worst_tensor": worst, "over_1e-3": sum(v > 1e-3 for v in vs32.values()),
                      "tensors": len(vs32), "worst_vs_float64": vs64[worst64][0],
                      "eager_float32_vs_float64_there": vs64[worst64][1], "worst_vs_float64_tensor": worst64,
                      "bad_vs_float64": bad}))  # fmt: skip


def _run(*args: str) -> dict[str, Any]:
    out = subprocess.run([sys.executable, "-m", "bench.xnnpack_elementwise", *args], capture_output=True, text=True)
    if out.returncode != 0:
        raise RuntimeError(out.stderr[-2000:])
    result: dict[str, Any] = json.loads(out.stdout.strip().splitlines()[-1])
    return result


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--steps", type=int, default=20)
    parser.add_argument(
        "--ops", default=",".join(ELEMENTWISE),
        help="the XNNPACK partitioner configs added to the default's (a subset bisects which one breaks)",
    )  # fmt: skip
    parser.add_argument("--name", default="xnnpack_elementwise", help="results file: bench/results/NAME.json")
    parser.add_argument("--export", nargs=2, help=argparse.SUPPRESS)
    parser.add_argument("--parity", nargs=2, help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.export:
        export(Path(args.export[0]), [n for n in args.export[1].split(",") if n])
        return
    if args.parity:
        parity(Path(args.parity[0]), int(args.parity[1]))
        return
    rows: dict[str, Any] = {}
    with tempfile.TemporaryDirectory() as tmp:
        for variant in ("default", "elementwise"):
            out = Path(tmp) / variant
            out.mkdir()
            row = _run("--export", str(out), args.ops if variant == "elementwise" else "")
            row["ops"] = args.ops if variant == "elementwise" else ""
            pte, ptd, stats = str(out / "p.pte"), str(out / "p.ptd"), str(out / "stats.json")
            for t in (1, 2):
                row[f"ms_{t}thread"] = run_child(
                    "bench.train_step", "et", pte, ptd, stats, str(SIZE), str(BATCH), str(args.steps), str(t)
                )["ms"]
            for batch in (32, 17):
                row[f"parity_batch{batch}"] = _run("--parity", str(out), str(batch))
            rows[variant] = row
            print(variant, json.dumps(row), flush=True)
    for t in (1, 2):
        rows[f"eager_ms_{t}thread"] = run_child(
            "bench.train_step", "eager", str(ALPHA), str(SIZE), str(BATCH), str(t), str(args.steps)
        )["ms"]
    d, e = rows["default"], rows["elementwise"]
    print(
        f"step at 1 / 2 threads: default {d['ms_1thread']:.0f} / {d['ms_2thread']:.0f} ms, elementwise "
        f"{e['ms_1thread']:.0f} / {e['ms_2thread']:.0f} ms, eager {rows['eager_ms_1thread']:.0f} / "
        f"{rows['eager_ms_2thread']:.0f} ms; export {d['export_s']:.0f} s vs {e['export_s']:.0f} s; gradients at "
        f"batch 17 after 32, worst relative difference from eager float32: default {d['parity_batch17']['worst']:.1e}, "
        f"elementwise {e['parity_batch17']['worst']:.1e}; from float64: default "
        f"{d['parity_batch17']['worst_vs_float64']:.1e}, elementwise {e['parity_batch17']['worst_vs_float64']:.1e}; "
        f"tensors further from float64 than 3x eager float32 (+1e-3): default {d['parity_batch17']['bad_vs_float64']}, "
        f"elementwise {e['parity_batch17']['bad_vs_float64']}"
    )
    print("wrote", write_results(args.name, rows))


if __name__ == "__main__":
    main()
