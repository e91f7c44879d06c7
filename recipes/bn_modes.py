"""Which BatchNorm statistics evaluation uses, and what Flower's choice would report instead.

fedper evaluates in eval mode: BatchNorm normalizes with running statistics (the base's
averaged by FedAvg with ``--bn shared``, the head's the client's own). Flower's FedPer
baseline evaluates without ``model.eval()``, i.e. in training mode: each test batch is
normalized with its own statistics. This scores every client's final model (a finished
``fedper simulate`` run's final_base + heads) both ways on the client's test split.

Usage: .venv/bin/python -m fedper._recipes.bn_modes RUN_DIR [RUN_DIR ...]  (make results runs it on the synth runs)
"""

from __future__ import annotations

import json
import sys
from pathlib import Path
from typing import Any

import numpy as np
import torch

from fedper.common import weights
from fedper.data import DataConfig, load_federated, to_tensor
from fedper.local_training import accuracy
from fedper.models import ModelConfig, build_model

BATCH = 32  # Flower's test loaders batch the test split; train-mode statistics depend on it


def scores(run: Path) -> dict[str, tuple[float, float]]:
    """algorithm -> (eval-mode, train-mode) mean client accuracy of the run's final models."""
    config = json.loads((run / "results.json").read_text())["config"]
    data: dict[str, Any] = {k: tuple(v) if isinstance(v, list) else v for k, v in config["data"].items()}
    data["data_root"] = Path(data["data_root"]) if data["data_root"] else None
    fed = load_federated(DataConfig(**data))
    ds = fed.dataset
    out = {}
    for algorithm in ("fedper", "fedavg", "local"):
        if not (run / algorithm).is_dir():
            continue
        modes: dict[str, list[float]] = {"eval": [], "train": []}
        for cid in range(len(fed.clients)):
            model = build_model(ModelConfig(**config["model"]), seed=0)
            state = {}
            if (run / algorithm / "final_base.safetensors").exists():
                state.update(weights.load(run / algorithm / "final_base.safetensors"))
            head = run / algorithm / "heads" / f"client_{cid:03d}.safetensors"
            if head.exists():
                state.update(weights.load(head))
            model.load_state_dict({k: torch.as_tensor(v) for k, v in state.items()}, strict=False)
            test = fed.client_test(cid)
            x, y = to_tensor(test.images, ds.mean, ds.std), torch.from_numpy(test.labels)
            with torch.no_grad():
                model.eval()
                modes["eval"].append(accuracy(model(x), y))
                model.train()  # batch statistics; the running ones it updates are thrown away
                logits = torch.cat([model(x[i : i + BATCH]) for i in range(0, len(y), BATCH)])
                modes["train"].append(accuracy(logits, y))
        out[algorithm] = (float(np.mean(modes["eval"])), float(np.mean(modes["train"])))
    return out


def table(runs: list[Path]) -> str:
    """Per algorithm: both scores as mean ± std over the runs (e.g. seeds), and their difference."""
    by_algorithm: dict[str, list[tuple[float, float]]] = {}
    for run in runs:
        for algorithm, pair in scores(run).items():
            by_algorithm.setdefault(algorithm, []).append(pair)
    lines = [
        "| algorithm | eval mode (running statistics; fedper's choice) | train mode (batch statistics; Flower's) "
        "| train minus eval |",
        "|---|---|---|---|",
    ]
    for algorithm, pairs in by_algorithm.items():
        ev, tr = np.array(pairs).T
        lines.append(
            f"| {algorithm} | {ev.mean():.3f} ± {ev.std():.3f} | {tr.mean():.3f} ± {tr.std():.3f} | "
            f"{(tr - ev).mean():+.3f} ± {(tr - ev).std():.3f} |"
        )
    return "\n".join(lines)


if __name__ == "__main__":
    print(table([Path(a) for a in sys.argv[1:]]))
