"""``fedper pretrain``: teach a base to see from unrated photos, with no rating in it.

The base (MobileNet-V1 without its classifier) learns to tell what a photo shows: the regression
and category targets of :mod:`fedper.data.pretext` (photographic properties measured on the
pixels and the layout, the edits applied, the content category), from composites no user rated.
Writes, into ``--out``:

- ``base.safetensors``: every exchanged tensor but the classifier's: ``--init`` takes it for any kp;
- ``model_card.json``: data, targets, epochs, seed, held-out accuracy per target, time, commit,
  the base's sha256, the machine that computed it;
- ``pretrain-state.safetensors`` + ``pretrain-state.json``: the state after the last finished
  epoch (model, optimizer, history). A run that stops is resumed from there by the same command;
  on one machine and kernel set the result is the same as an uninterrupted run's.
"""

from __future__ import annotations

import hashlib
import json
import math
import subprocess
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Literal

import numpy as np
import torch
import torch.nn.functional as F
from safetensors.torch import load as st_load
from safetensors.torch import save as st_save

from fedper.common import weights
from fedper.common.atomic_write import atomic_write_bytes, atomic_write_text
from fedper.common.config_cli import nested, option
from fedper.common.errors import ConfigError
from fedper.data import pretext
from fedper.data.dataset import to_tensor
from fedper.data.registry import dataset_info
from fedper.environment import numeric_environment
from fedper.models import ModelConfig, StagedModel, build_model, exchanged_state, split
from fedper.results import config_json

STATE = "pretrain-state"
CARD = "model_card.json"
BASE = "base.safetensors"
CARD_FORMAT = "fedper-pretrain/1"
RENDER_CHUNK = 500  # composites rendered between progress updates
HELD_OUT = 0.1  # share of the examples kept out of training, to measure the pretext
WARMUP = 0.1  # share of the steps the learning rate rises over, before its cosine decay
# The loss: mean squared error of the standardized looks, half-weighted edits, cross-entropy of
# the category. Looks carry what raters respond to; edits only how the photo was made.
EDIT_WEIGHT = 0.5
# --targets: "all" as above; "edits" drops the looks (the edit-identification pretext of Sheng
# et al., AAAI 2020, plus the category), to measure what the looks add.
Targets = Literal["all", "edits"]

PRETEXT_OUTPUTS = len(pretext.REGRESSION_TARGETS) + len(pretext.CATEGORIES)  # the model's: one per target

# (done, total, what): called as the run goes.
ProgressFn = Callable[[int, int, str], None]


@dataclass(frozen=True)
class PretrainConfig:
    """One pretraining run; everything follows from these fields."""

    out: Path = option(Path("pretrained"), "where the base, its model card and the resumable state go")
    images: int = option(20_000, "unrated composites to render (a tenth is held out to measure the pretext)")
    epochs: int = option(8, "passes over the training composites")
    # MobileNet-V1 (or the --model given) with one output per pretext target: the model, its arguments,
    # the width and the input size (the generator renders at 64 pixels) are options.
    model: ModelConfig = nested(
        lambda: ModelConfig(num_classes=PRETEXT_OUTPUTS),
        skip=("num_classes", "base", "linear_base_kp", "head", "head_modules"),
    )
    batch_size: int = option(128, "examples per step")
    learning_rate: float = option(4e-3, "peak AdamW learning rate (warm-up, then cosine decay)", flags=("--lr",))
    seed: int = option(0, "seed of the composites, the initial weights and the example order")
    targets: Targets = option(
        "all", "what the base learns to tell: all (the photographic properties, the edits, the category) or "
        "edits (the edits and the category only, for comparison)",
    )  # fmt: skip
    threads: int = option(0, "torch threads (0 = all cores)")

    def __post_init__(self) -> None:
        if self.images < 20 or self.epochs < 1 or self.batch_size < 2:
            raise ConfigError(
                f"--images must be >= 20, --epochs >= 1 and --batch-size >= 2, got {self.images}, {self.epochs}, "
                f"{self.batch_size}"
            )
        if not 0 < self.learning_rate < math.inf:
            raise ConfigError(f"--lr must be a positive number, got {self.learning_rate}")

    @property
    def held_out(self) -> int:
        return max(1, int(self.images * HELD_OUT))


def _lr(config: PretrainConfig, step: int, total: int) -> float:
    warm = max(1, int(total * WARMUP))
    if step < warm:
        return config.learning_rate * (step + 1) / warm
    return config.learning_rate * 0.5 * (1 + math.cos(math.pi * (step - warm) / max(1, total - warm)))


def _loss(out: torch.Tensor, targets: torch.Tensor, categories: torch.Tensor, with_looks: bool) -> torch.Tensor:
    looks = pretext.LOOK_COUNT
    regressions = len(pretext.REGRESSION_TARGETS)
    return (
        (F.mse_loss(out[:, :looks], targets[:, :looks]) if with_looks else 0.0)
        + EDIT_WEIGHT * F.mse_loss(out[:, looks:regressions], targets[:, looks:regressions])
        + F.cross_entropy(out[:, regressions:], categories)
    )


def measure(
    model: torch.nn.Module, x: torch.Tensor, targets: torch.Tensor, categories: torch.Tensor
) -> dict[str, float]:
    """Held-out R² of each regression target and the category accuracy (eval mode)."""
    model.eval()
    with torch.no_grad():
        out = torch.cat([model(x[i : i + 512]) for i in range(0, len(x), 512)])
    regressions = len(pretext.REGRESSION_TARGETS)
    err = ((out[:, :regressions] - targets) ** 2).mean(0)
    r2 = 1 - err / targets.var(0, unbiased=False).clamp_min(1e-12)
    scores = {name: round(float(v), 4) for name, v in zip(pretext.REGRESSION_TARGETS, r2, strict=True)}
    scores["category_accuracy"] = round(float((out[:, regressions:].argmax(1) == categories).float().mean()), 4)
    return scores


def _save_state(out: Path, model: torch.nn.Module, opt: torch.optim.Optimizer, meta: dict[str, Any]) -> None:
    tensors = {f"model.{k}": v.detach().clone().contiguous() for k, v in model.state_dict().items()}
    for i, state in opt.state_dict()["state"].items():
        for key, value in state.items():
            tensors[f"optimizer.{i}.{key}"] = torch.as_tensor(value).clone().contiguous()
    atomic_write_bytes(out / f"{STATE}.safetensors", st_save(tensors))
    atomic_write_text(out / f"{STATE}.json", json.dumps(meta, indent=2))


def _load_state(
    out: Path, model: torch.nn.Module, opt: torch.optim.Optimizer, config: PretrainConfig
) -> dict[str, Any]:
    """The saved state if there is one of this very config, else a fresh start (an empty history)."""
    meta_path, tensors_path = out / f"{STATE}.json", out / f"{STATE}.safetensors"
    if not (meta_path.exists() and tensors_path.exists()):
        return {"epochs_done": 0, "history": [], "seconds": 0.0}
    meta = json.loads(meta_path.read_text())

    def what_it_computes(settings: dict[str, Any]) -> dict[str, Any]:
        return {k: v for k, v in settings.items() if k not in ("out", "threads")}

    if what_it_computes(meta.get("config", {})) != what_it_computes(config_json(config)):
        raise ConfigError(
            f"{out} holds an unfinished pretraining with other settings ({meta_path}); use another --out, or "
            "delete its pretrain-state files to start over"
        )
    tensors = st_load(tensors_path.read_bytes())
    model.load_state_dict({k.removeprefix("model."): v for k, v in tensors.items() if k.startswith("model.")})
    state = opt.state_dict()
    for name, value in tensors.items():
        if name.startswith("optimizer."):
            _, index, key = name.split(".", 2)
            state["state"].setdefault(int(index), {})[key] = value
    opt.load_state_dict(state)
    return dict(meta)


def _commit() -> str | None:
    try:
        run = subprocess.run(["git", "rev-parse", "HEAD"], capture_output=True, text=True, timeout=10,
                             cwd=Path(__file__).resolve().parent)  # fmt: skip
    except (OSError, subprocess.SubprocessError):
        return None
    return run.stdout.strip() or None


def run_pretrain(config: PretrainConfig, progress: ProgressFn | None = None) -> dict[str, Any]:
    """Pretrain (or resume), write the base and its model card; returns the card."""
    say = progress or (lambda _done, _total, _what: None)
    if config.threads:
        torch.set_num_threads(config.threads)
    config.out.mkdir(parents=True, exist_ok=True)
    start = time.perf_counter()
    info = dataset_info("aesthetic-synth")  # the normalization simulations and exports use
    chunks = []
    size = config.model.input_size
    for first in range(0, config.images, RENDER_CHUNK):
        chunks.append(pretext.render(config.seed, first, min(RENDER_CHUNK, config.images - first), size))
        say(first + len(chunks[-1].categories), config.images, "rendering")
    x = to_tensor(np.concatenate([b.images for b in chunks]), info.mean, info.std)
    y = torch.from_numpy(np.concatenate([b.targets for b in chunks]))
    c = torch.from_numpy(np.concatenate([b.categories for b in chunks]))
    held = config.held_out
    mcfg = config.model
    model = build_model(mcfg, seed=config.seed)
    opt = torch.optim.AdamW(model.parameters(), lr=config.learning_rate, weight_decay=1e-4)
    meta = _load_state(config.out, model, opt, config)
    steps_per_epoch = (len(x) - held) // config.batch_size
    total = steps_per_epoch * config.epochs
    for epoch in range(int(meta["epochs_done"]), config.epochs):
        t = time.perf_counter()
        model.train()
        order = torch.randperm(len(x) - held, generator=torch.Generator().manual_seed(config.seed * 1000 + epoch))
        losses = []
        for s in range(steps_per_epoch):
            for group in opt.param_groups:
                group["lr"] = _lr(config, epoch * steps_per_epoch + s, total)
            idx = order[s * config.batch_size : (s + 1) * config.batch_size] + held
            loss = _loss(model(x[idx]), y[idx], c[idx], config.targets == "all")
            opt.zero_grad(set_to_none=True)
            loss.backward()  # type: ignore[no-untyped-call]
            opt.step()
            losses.append(float(loss.detach()))
            say(epoch * steps_per_epoch + s + 1, total, f"epoch {epoch + 1}/{config.epochs}")
        scores = measure(model, x[:held], y[:held], c[:held])
        meta = {
            "config": config_json(config),
            "epochs_done": epoch + 1,
            "history": [*meta["history"], {"epoch": epoch + 1, "loss": round(float(np.mean(losses)), 5), **scores}],
            "seconds": float(meta["seconds"]) + time.perf_counter() - t,
        }
        _save_state(config.out, model, opt, meta)
    return _write_base_and_card(config, mcfg, model, meta, time.perf_counter() - start)


def _write_base_and_card(
    config: PretrainConfig, mcfg: ModelConfig, model: StagedModel, meta: dict[str, Any], seconds: float
) -> dict[str, Any]:
    state = exchanged_state(model)
    names = split(model, 1).base  # everything but the classifier, which answers the pretext only
    encoded = weights.encode({n: state[n] for n in names})
    atomic_write_bytes(config.out / BASE, encoded)
    digest = hashlib.sha256(encoded).hexdigest()
    last = meta["history"][-1] if meta["history"] else {}
    card = {
        "format": CARD_FORMAT,
        "base": {
            "file": BASE,
            "sha256": digest,
            "tensors": len(names),
            "model": mcfg.to_dict() | {"num_classes": None},
        },
        "data": {
            "generator": "aesthetic-synth composites of the packaged public photographs (fedper/data/pretext.py)",
            "seed_stream": f"[seed, {pretext.PRETEXT_STREAM}, example]: apart from every user's photos",
            "images": config.images,
            "held_out": config.held_out,
            "image_size": config.model.input_size,
            "raters": "none: no rating, taste vector, user content mix or per-user feature enters pretraining",
        },
        "pretext": {
            "targets": config.targets,
            "regression_targets": list(pretext.REGRESSION_TARGETS),
            "category_targets": list(pretext.CATEGORIES),
            "loss": ("MSE(looks) + " if config.targets == "all" else "")
            + f"{EDIT_WEIGHT} MSE(edits) + cross-entropy(category)",
            "held_out_scores": {k: v for k, v in last.items() if k not in ("epoch", "loss")},
        },
        "training": {
            "epochs": config.epochs,
            "batch_size": config.batch_size,
            "optimizer": "AdamW",
            "peak_learning_rate": config.learning_rate,
            "seed": config.seed,
        },
        "history": meta["history"],
        "seconds": {"training": round(float(meta["seconds"]), 1), "this_run": round(seconds, 1)},
        "commit": _commit(),
        "environment": numeric_environment(),
        "config": config_json(config),
    }
    atomic_write_text(config.out / CARD, json.dumps(card, indent=2))
    return card
