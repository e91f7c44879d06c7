"""Does a pretrained base see what raters respond to? Linear probes on its frozen features.

On aesthetic-synth's users (the clients, splits and seeds of ``fedper simulate``), the base is
frozen and its pooled features (the classifier's input, eval mode) are probed two ways, beside
the same probes on a random base (``build_model``'s initial weights for the data seed):

- **per user**: a logistic regression of the user's ratings on the features, its regularization
  chosen on a validation quarter of the user's training photos (never on the test photos), then
  refit on all of them; scored on the user's test photos. Shown beside the majority of the user's
  training ratings and the same probe on the generator's own features (the ceiling: what the
  ratings are a function of).
- **per user, ordinal**: the same features, a ridge regression of the rating cut into 5 classes
  where the user's training ratings put them (what an ordinal head learns), the ridge penalty
  chosen on the same validation quarter; beside the same probe on the generator's features.
- **per generator feature**: a ridge regression of each feature the raters' scores are linear in
  (the looks, bad exposure, the content categories), fitted on every user's training photos and
  scored (R²) on their test photos: which cues the base carries and which it does not.

Usage: .venv/bin/python -m fedper._recipes.pretrain_probe --base pretrained/base.safetensors
       [--size 32] [--seeds 0 1 2] [--out probe.json]
"""

from __future__ import annotations

import argparse
import json
from pathlib import Path
from typing import Any

import numpy as np
import torch
from sklearn.linear_model import LogisticRegression, Ridge
from sklearn.metrics import r2_score
from sklearn.preprocessing import StandardScaler

from fedper.baselines import per_client_accuracy
from fedper.checkpoints import init_base, read_checkpoint
from fedper.data import DataConfig, ImageDataset, load_federated, to_tensor
from fedper.data.aesthetic_synth import FEATURES
from fedper.models import ModelConfig, StagedModel, build_model

USERS = 30
C_GRID = (0.003, 0.01, 0.03, 0.1, 0.3, 1.0)
RIDGE_GRID = (1.0, 10.0, 100.0, 1000.0)


def frozen_features(model: StagedModel, part: ImageDataset, like: ImageDataset) -> np.ndarray:
    """Pooled features below the classifier, eval mode (BatchNorm uses its running statistics)."""
    model.eval()
    x = to_tensor(part.images, like.mean, like.std)
    with torch.no_grad():
        out = []
        for i in range(0, len(x), 256):
            h = x[i : i + 256]
            for stage in model.stages()[:-1]:
                h = stage(h)
            out.append(torch.flatten(torch.nn.functional.adaptive_avg_pool2d(h, 1), 1))
    return torch.cat(out).numpy().astype(np.float64)


def user_probe(train_x: np.ndarray, train_y: np.ndarray, test_x: np.ndarray, test_y: np.ndarray, seed: int) -> float:
    """Test accuracy of a logistic regression whose C is chosen on a validation quarter of train."""
    rng = np.random.default_rng(seed)
    order = rng.permutation(len(train_y))
    val, fit = order[: len(order) // 4], order[len(order) // 4 :]

    def model(c: float, rows: np.ndarray) -> tuple[StandardScaler, LogisticRegression]:
        scaler = StandardScaler().fit(train_x[rows])
        return scaler, LogisticRegression(C=c, max_iter=3000).fit(scaler.transform(train_x[rows]), train_y[rows])

    def score(c: float) -> float:
        if len(set(train_y[fit])) < 2:
            return 0.0
        scaler, clf = model(c, fit)
        return float((clf.predict(scaler.transform(train_x[val])) == train_y[val]).mean())

    best = max(C_GRID, key=score)
    if len(set(train_y)) < 2:
        return float((test_y == train_y[0]).mean())
    scaler, clf = model(best, np.arange(len(train_y)))
    return float((clf.predict(scaler.transform(test_x)) == test_y).mean())


def _ordinal(train_x: np.ndarray, train_y: np.ndarray, test_x: np.ndarray, penalty: float) -> np.ndarray:
    scaler = StandardScaler().fit(train_x)
    ridge = Ridge(alpha=penalty).fit(scaler.transform(train_x), train_y)
    fitted = ridge.predict(scaler.transform(train_x))
    counts = np.bincount(train_y, minlength=int(train_y.max()) + 1)
    cuts = np.quantile(fitted, np.cumsum(counts)[:-1] / len(train_y))
    return np.searchsorted(cuts, ridge.predict(scaler.transform(test_x)))


def ordinal_probe(train_x: np.ndarray, train_y: np.ndarray, test_x: np.ndarray, test_y: np.ndarray, seed: int) -> float:
    """Test accuracy of an ordinal ridge probe whose penalty is chosen on a validation quarter of train."""
    order = np.random.default_rng(seed).permutation(len(train_y))
    val, fit = order[: len(order) // 4], order[len(order) // 4 :]
    best = max(
        RIDGE_GRID, key=lambda a: float((_ordinal(train_x[fit], train_y[fit], train_x[val], a) == train_y[val]).mean())
    )
    return float((_ordinal(train_x, train_y, test_x, best) == test_y).mean())


def probe_seed(
    base: Path | None, size: int, seed: int, users: int = USERS, images_per_user: tuple[int, int] = (100, 200)
) -> dict[str, Any]:
    data = DataConfig(dataset="aesthetic-synth", partition="user", users=users, num_clients=users,
                      image_size=size, seed=seed, images_per_user=images_per_user)  # fmt: skip
    fed = load_federated(data)
    ds = fed.dataset
    models = {"random": build_model(ModelConfig(num_classes=5, input_size=size), seed=seed)}
    if base is not None:
        models["pretrained"] = build_model(ModelConfig(num_classes=5, input_size=size), seed=seed)
        init_base(models["pretrained"], read_checkpoint(base, "mobilenet_v1"), kp=1)
    parts = [(fed.client_train(c), fed.client_test(c)) for c in range(len(fed.clients))]
    result: dict[str, Any] = {"seed": seed, "size": size}
    baselines = per_client_accuracy(fed, seed)
    result["majority"] = list(map(float, baselines["majority"]))
    result["generator_features"] = list(map(float, baselines["per_client_features"]))
    result["generator_features_ordinal"] = [
        ordinal_probe(tr.features, tr.labels, te.features, te.labels, seed * 1000 + c)
        for c, (tr, te) in enumerate(parts)
        if tr.features is not None and te.features is not None
    ]
    for name, model in models.items():
        feats = [(frozen_features(model, tr, ds), frozen_features(model, te, ds)) for tr, te in parts]
        result[name] = [
            user_probe(ftr, tr.labels, fte, te.labels, seed * 1000 + c)
            for c, ((ftr, fte), (tr, te)) in enumerate(zip(feats, parts, strict=True))
        ]
        result[f"{name}_ordinal"] = [
            ordinal_probe(ftr, tr.labels, fte, te.labels, seed * 1000 + c)
            for c, ((ftr, fte), (tr, te)) in enumerate(zip(feats, parts, strict=True))
        ]
        xtr = np.concatenate([f for f, _ in feats])
        xte = np.concatenate([f for _, f in feats])
        ytr = np.concatenate([tr.features for tr, _ in parts if tr.features is not None])
        yte = np.concatenate([te.features for _, te in parts if te.features is not None])
        scaler = StandardScaler().fit(xtr)
        pred = Ridge(alpha=10.0).fit(scaler.transform(xtr), ytr).predict(scaler.transform(xte))
        result[f"{name}_feature_r2"] = {f: round(float(r2_score(yte[:, k], pred[:, k])), 4)
                                        for k, f in enumerate(FEATURES)}  # fmt: skip
    return result


def summary(results: list[dict[str, Any]]) -> str:
    lines = [
        "| seed | majority | random base | pretrained base | pretrained − random (paired, ± SE) | generator features |",
        "|---|---|---|---|---|---|",
    ]
    for r in results:
        d = np.array(r.get("pretrained", r["random"])) - np.array(r["random"])
        lines.append(
            f"| {r['seed']} | {np.mean(r['majority']):.3f} | {np.mean(r['random']):.3f} | "
            f"{np.mean(r.get('pretrained', [np.nan])):.3f} | {d.mean():+.3f} ± {d.std(ddof=1) / np.sqrt(len(d)):.3f} | "
            f"{np.mean(r['generator_features']):.3f} |"
        )
    lines += [
        "",
        "| seed | ordinal: random base | pretrained base | pretrained − random (paired, ± SE) | generator features |",
        "|---|---|---|---|---|",
    ]
    for r in results:
        d = np.array(r.get("pretrained_ordinal", r["random_ordinal"])) - np.array(r["random_ordinal"])
        pretrained = np.mean(r.get("pretrained_ordinal", [np.nan]))
        se = d.std(ddof=1) / np.sqrt(len(d))
        lines.append(
            f"| {r['seed']} | {np.mean(r['random_ordinal']):.3f} | {pretrained:.3f} | {d.mean():+.3f} ± {se:.3f} | "
            f"{np.mean(r['generator_features_ordinal']):.3f} |"
        )
    return "\n".join(lines)


def main() -> None:
    parser = argparse.ArgumentParser(description=(__doc__ or "").split("\n\n")[0])
    parser.add_argument("--base", type=Path, default=None, help="fedper pretrain's base.safetensors")
    parser.add_argument("--size", type=int, default=32)
    parser.add_argument("--seeds", type=int, nargs="+", default=[0, 1, 2])
    parser.add_argument("--out", type=Path, default=None)
    args = parser.parse_args()
    results = [probe_seed(args.base, args.size, s) for s in args.seeds]
    print(summary(results))
    for r in results:
        keys = [f for f in FEATURES if not f.startswith("content_")]
        print(f"seed {r['seed']} feature R², pretrained/random: " + ", ".join(
            f"{f} {r.get('pretrained_feature_r2', {}).get(f, float('nan')):.2f}/{r['random_feature_r2'][f]:.2f}"
            for f in keys))  # fmt: skip
    if args.out is not None:
        args.out.write_text(json.dumps(results, indent=2))


if __name__ == "__main__":
    main()
