"""How well can this model learn the raters' tastes with no federation at all?

A diagnostic upper bound for a federated run on a user-partitioned dataset: the same clients,
splits and model as ``fedper simulate``, but every client's training photos in one place. One
base is trained on all of them, with a personal head per client (FedPer's split at kp=1 with
perfect communication): a batch of one client's photos goes through the shared base and that
client's head. Two heads are compared:

- ``softmax``: the model's classifier (a linear layer to the 5 ratings), as every run uses;
- ``ordinal``: a cumulative-link head for ratings that are ordered: one linear score per
  photo and 4 ordered cut points per client, P(rating <= k) = sigmoid(cut_k - score). It has
  ``d + 4`` parameters per client instead of ``5 d + 5``.

If even this stays at the majority baseline, the limit is the model and the data, not the
federated algorithm. Each client is scored on its own test split after every epoch, in eval
mode; the baselines of ``fedper.baselines`` are computed on the same splits.

Usage: .venv/bin/python -m fedper._recipes.centralized_bound [--seeds 0 1 2] [--epochs 20] [--out FILE]
"""

from __future__ import annotations

import argparse
import json
from collections.abc import Sequence
from pathlib import Path

import numpy as np
import torch
import torch.nn.functional as F
from rich.console import Console
from rich.progress import Progress
from sklearn.linear_model import Ridge
from sklearn.preprocessing import StandardScaler
from torch import nn

from fedper.baselines import per_client_accuracy
from fedper.data import DataConfig, ImageDataset, load_federated, to_tensor
from fedper.local_training import accuracy
from fedper.models import ModelConfig, build_model
from fedper.models.heads import HEADS, OrdinalHead


def train_pooled(config: DataConfig, head: str, epochs: int, lr: float, batch_size: int = 32) -> dict[str, list[float]]:
    """Per-epoch mean client accuracy, and each client's final accuracy."""
    fed = load_federated(config)
    ds = fed.dataset
    clients = range(len(fed.clients))
    parts = [(fed.client_train(c), fed.client_test(c)) for c in clients]
    train = [(to_tensor(t.images, ds.mean, ds.std), torch.from_numpy(t.labels)) for t, _ in parts]
    test = [(to_tensor(t.images, ds.mean, ds.std), torch.from_numpy(t.labels)) for _, t in parts]
    model = build_model(ModelConfig(num_classes=ds.num_classes, input_size=config.image_size), seed=config.seed)
    classifier = model.classifier
    assert isinstance(classifier, nn.Linear)
    width = classifier.in_features
    model.classifier = nn.Identity()
    heads = nn.ModuleList(
        [OrdinalHead(width, ds.num_classes) if head == "ordinal" else nn.Linear(width, ds.num_classes) for _ in clients]
    )
    params = [*model.parameters(), *heads.parameters()]
    optimizer = torch.optim.SGD(params, lr=lr, momentum=0.9)
    rng = np.random.default_rng([config.seed, 40])

    def scores() -> list[float]:
        model.eval()
        with torch.no_grad():
            out = [accuracy(heads[c](model(x)), y) for c, (x, y) in zip(clients, test, strict=True)]
        model.train()
        return out

    curve = []
    for _ in range(epochs):
        work = [
            (c, order[i : i + batch_size])
            for c, (_, y) in enumerate(train)
            for order in [rng.permutation(len(y))]
            for i in range(0, len(y), batch_size)
        ]
        for j in rng.permutation(len(work)):
            c, idx = work[j]
            if len(idx) < 2:  # BatchNorm needs two samples
                continue
            x, y = train[c]
            loss = F.cross_entropy(heads[c](model(x[idx])), y[idx])
            optimizer.zero_grad()
            torch.autograd.backward(loss)
            optimizer.step()
        curve.append(float(np.mean(scores())))
    baselines = per_client_accuracy(fed, config.seed)
    return {
        "curve": curve,
        "final": scores(),
        "majority": baselines["majority"],
        "per_client_features": baselines["per_client_features"],
        "ordinal_features": [ordinal_on_features(train_part, test_part) for train_part, test_part in parts],
    }


def ordinal_on_features(train: ImageDataset, test: ImageDataset) -> float:
    """A per-client ordinal model on the generator's own features: a ridge regression of the
    rating, cut where the training ratings' frequencies put them. A stronger feature ceiling
    than ``per_client_features`` (5 x 18 logistic weights from 80-160 photos)."""
    assert train.features is not None and test.features is not None
    scaler = StandardScaler().fit(train.features)
    model = Ridge(alpha=1.0).fit(scaler.transform(train.features), train.labels)
    fitted = model.predict(scaler.transform(train.features))
    counts = np.bincount(train.labels, minlength=train.num_classes)
    cuts = np.quantile(fitted, np.cumsum(counts)[:-1] / len(train.labels))
    predicted = np.searchsorted(cuts, model.predict(scaler.transform(test.features)))
    return float(np.mean(predicted == test.labels))


def main(argv: Sequence[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--seeds", type=int, nargs="+", default=[0, 1, 2])
    parser.add_argument("--epochs", type=int, default=20)
    parser.add_argument("--lr", type=float, default=0.05)
    parser.add_argument("--clients", type=int, default=10)
    parser.add_argument("--out", type=Path, default=Path("runs/centralized_bound.json"))
    args = parser.parse_args(argv)
    torch.set_num_threads(1)
    runs: dict[str, dict[str, dict[str, list[float]]]] = {h: {} for h in HEADS}
    with Progress(console=Console(stderr=True)) as progress:
        task = progress.add_task("centralized bound", total=len(args.seeds) * len(HEADS))
        for seed in args.seeds:
            config = DataConfig(dataset="aesthetic-synth", num_clients=args.clients, seed=seed)
            for head in HEADS:
                runs[head][str(seed)] = train_pooled(config, head, args.epochs, args.lr)
                progress.advance(task)
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text(json.dumps({"args": {k: str(v) for k, v in vars(args).items()}, "runs": runs}, indent=1))
    print(summary(runs, args.epochs))


def summary(runs: dict[str, dict[str, dict[str, list[float]]]], epochs: int) -> str:
    """A markdown table: final and best-epoch accuracy (mean ± std over seeds) and the paired gain."""
    rows = [
        "| head | final mean acc | best epoch's mean acc | majority | final minus majority, per client (mean ± SE) |",
        "|---|---|---|---|---|",
    ]
    for head, by_seed in runs.items():
        finals = [float(np.mean(r["final"])) for r in by_seed.values()]
        best = [max(r["curve"]) for r in by_seed.values()]
        majority = [float(np.mean(r["majority"])) for r in by_seed.values()]
        diff = np.concatenate([np.subtract(r["final"], r["majority"]) for r in by_seed.values()])
        se = float(diff.std(ddof=1) / np.sqrt(len(diff))) if len(diff) > 1 else float("nan")
        rows.append(
            f"| {head} | {np.mean(finals):.3f} ± {np.std(finals):.3f} | {np.mean(best):.3f} ± {np.std(best):.3f} "
            f"| {np.mean(majority):.3f} ± {np.std(majority):.3f} | {diff.mean():+.3f} ± {se:.3f} (n = {len(diff)}) |"
        )
    first = next(iter(runs.values())).values()
    for name in ("per_client_features", "ordinal_features"):
        means = [float(np.mean(r[name])) for r in first]
        rows.append(f"| baseline: {name} | {np.mean(means):.3f} ± {np.std(means):.3f} | - | - | - |")
    return f"{epochs} epochs, seeds {', '.join(next(iter(runs.values())))}\n\n" + "\n".join(rows)


if __name__ == "__main__":
    main()
