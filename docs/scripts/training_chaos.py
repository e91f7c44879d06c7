"""How fast rounding differences grow in training: docs/TESTING.md, "Why whole-model trajectories
are not compared".

The test model (MobileNet-V1 width 0.25, 32 px, digits, seed 0) trained on the first 128 digits
in batches of 32, as tests/unit/export/test_export.py does. For the whole model and for the head alone (kp=2):
how far eager float32 ends from eager float64, as a share of the distance the weights moved;
and, in float64 only, how far two runs end apart whose weights differed by 1e-9 at the start
(the median over tensors of each tensor's difference over its movement).

Usage: [ATEN_CPU_CAPABILITY=default|avx2] .venv/bin/python docs/scripts/training_chaos.py
       [--lr 0.05] [--momentum 0.9] [--steps 20]   (one thread; ~1 minute)
"""

from __future__ import annotations

import argparse
import copy

import numpy as np
import torch

from fedper.data import DataConfig, load_dataset, to_tensor
from fedper.eager_trainer import EagerTrainer
from fedper.models import ModelConfig, build_model, split

REPORTED = (1, 2, 3, 5, 10, 20)


def _batches(steps: int, double: bool = False) -> list[tuple[torch.Tensor, torch.Tensor]]:
    ds = load_dataset(DataConfig(dataset="digits"))
    x, y = to_tensor(ds.images[:128], ds.mean, ds.std), torch.from_numpy(ds.labels[:128])
    x = x.double() if double else x
    return [(x[32 * (i % 4) : 32 * (i % 4 + 1)], y[32 * (i % 4) : 32 * (i % 4 + 1)]) for i in range(steps)]


def _distance(p: dict[str, torch.Tensor], q: dict[str, torch.Tensor], names: list[str]) -> float:
    return float(sum(float(((p[n].double() - q[n].double()) ** 2).sum()) for n in names) ** 0.5)


def fp32_drift(trainable: list[str] | None, args: argparse.Namespace) -> dict[int, float]:
    """Step -> distance(eager fp32, eager fp64) / distance(eager fp32, start), over the trained tensors."""
    model = build_model(ModelConfig(num_classes=10, input_size=32), seed=0)
    fp32 = EagerTrainer(model, trainable)
    fp64 = EagerTrainer(copy.deepcopy(model).double(), trainable)
    names = list(trainable or fp32.names)
    start = fp32.get_tensors(names)
    for t in (fp32, fp64):
        t.start_round(args.lr, args.momentum)
    out = {}
    for step, (xb, yb) in enumerate(_batches(args.steps), start=1):
        fp32.train_step(xb, yb)
        fp64.train_step(xb.double(), yb)
        if step in REPORTED:
            a, b = fp32.get_tensors(names), fp64.get_tensors(names)
            out[step] = _distance(a, b, names) / _distance(a, start, names)
    return out


def perturbed_fp64(args: argparse.Namespace) -> dict[int, float]:
    """Step -> median over parameters of |run A - run B| / |run A - start|, two float64 runs
    whose weights differed by a relative 1e-9 at the start."""
    a_model = build_model(ModelConfig(num_classes=10, input_size=32), seed=0).double()
    b_model = copy.deepcopy(a_model)
    g = torch.Generator().manual_seed(1)
    with torch.no_grad():
        for p in b_model.parameters():
            p.mul_(1 + 1e-9 * torch.randn(p.shape, generator=g, dtype=torch.float64))
    a, b = EagerTrainer(a_model), EagerTrainer(b_model)
    names = [n for n, _ in a_model.named_parameters()]
    start = a.get_tensors(names)
    for t in (a, b):
        t.start_round(args.lr, args.momentum)
    out = {}
    for step, (xb, yb) in enumerate(_batches(args.steps, double=True), start=1):
        a.train_step(xb, yb)
        b.train_step(xb, yb)
        if step in REPORTED:
            ta, tb = a.get_tensors(names), b.get_tensors(names)
            out[step] = float(np.median([float((ta[n] - tb[n]).norm() / (ta[n] - start[n]).norm()) for n in names]))
    return out


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--lr", type=float, default=0.05)
    parser.add_argument("--momentum", type=float, default=0.9)
    parser.add_argument("--steps", type=int, default=20)
    args = parser.parse_args()
    torch.set_num_threads(1)
    head = list(split(build_model(ModelConfig(num_classes=10, input_size=32)), 2).head)
    rows = {
        "whole model: fp32 from fp64 / moved": fp32_drift(None, args),
        "head alone: fp32 from fp64 / moved": fp32_drift(head, args),
        "whole model, fp64: runs 1e-9 apart (median tensor)": perturbed_fp64(args),
    }
    steps = [s for s in REPORTED if s <= args.steps]
    print(f"kernel set {torch.backends.cpu.get_cpu_capability()}, lr {args.lr}, momentum {args.momentum}, 1 thread\n")
    print("| after step | " + " | ".join(map(str, steps)) + " |")
    print("|---|" + "---|" * len(steps))
    for name, values in rows.items():
        print(f"| {name} | " + " | ".join(f"{values[s]:.2g}" for s in steps) + " |")


if __name__ == "__main__":
    main()
