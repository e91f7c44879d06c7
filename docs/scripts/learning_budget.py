"""When FedPer takes off in tests/unit/recipes/test_simulation.py's learning run: docs/TESTING.md.

The test's setting (digits, 5 clients of 2 classes each, kp=2, lr 0.05, one local epoch a round,
one thread) for each seed given, with more rounds than the test's 12: FedPer's mean accuracy at
every evaluation point, the majority baseline, and FedPer's and FedAvg's accuracy after round 12
(the test's final point). Run it under each kernel set to see the spread the test's bounds allow.

Usage: [ATEN_CPU_CAPABILITY=default|avx2] .venv/bin/python docs/scripts/learning_budget.py
       [--seeds 0,1,2] [--rounds 15] [--at 12] [--clients 5] [--lr 0.05]   (about 100 s per seed)

The setting docs/TESTING.md ("What it measured") starts from: --clients 10 --lr 0.01 --rounds 5
--at 5 --seeds 0.
"""

from __future__ import annotations

import argparse
import json
import tempfile
from pathlib import Path

import torch

from fedper._recipes.simulation import SimulationConfig, run
from fedper.common.train_config import TrainConfig
from fedper.data import DataConfig
from fedper.results import RunRecorder


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--seeds", default="0,1,2")
    parser.add_argument("--rounds", type=int, default=15)
    parser.add_argument("--at", type=int, default=12, help="the test's final point: after this round")
    parser.add_argument("--clients", type=int, default=5)
    parser.add_argument("--lr", type=float, default=0.05)
    args = parser.parse_args()
    print(f"kernel set {torch.backends.cpu.get_cpu_capability()}\n")
    print(
        f"| seed | majority | FedPer after round {args.at} | FedAvg after round {args.at} | first above 0.8 "
        "| FedPer each round |"
    )
    print("|---|---|---|---|---|---|")
    for seed in map(int, args.seeds.split(",")):
        out = Path(tempfile.mkdtemp())
        training = TrainConfig(local_epochs=1, learning_rate=args.lr)
        sim = SimulationConfig(algorithms=("fedper", "fedavg"), kp=2, rounds=args.rounds, training=training, threads=1,
                               out=out)  # fmt: skip
        recorder = run(sim, DataConfig(dataset="digits", num_clients=args.clients, classes_per_client=2, seed=seed))
        results = json.loads((out / "results.json").read_text())
        curve = [r["accuracy"]["mean"] for r in results["rounds"]["fedper"]]  # curve[k]: after k rounds
        after = {a: _mean_after(recorder, a, args.at) for a in ("fedper", "fedavg")}
        above = next((k for k, a in enumerate(curve) if a > 0.8), None)
        majority = results["baselines"]["majority"]["mean_accuracy"]
        print(f"| {seed} | {majority:.3f} | {after['fedper']:.3f} | {after['fedavg']:.3f} | {above} "
              f"| {' '.join(f'{a:.2f}' for a in curve)} |")  # fmt: skip


def _mean_after(recorder: RunRecorder, algorithm: str, rounds: int) -> float:
    """The clients' mean accuracy after ``rounds`` rounds (the start of the next one)."""
    chosen = [r.accuracy for r in recorder.records(algorithm) if r.round == rounds + 1]
    return sum(chosen) / len(chosen)


if __name__ == "__main__":
    main()
