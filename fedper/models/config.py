"""The model configuration every part of the toolkit builds models from."""

from __future__ import annotations

import json
from dataclasses import asdict, dataclass
from typing import Any, Literal, get_args

import torch

from fedper.common.config_cli import option
from fedper.common.errors import ConfigError
from fedper.models.heads import HEADS, HeadKind
from fedper.models.mobilenet_v1 import MobileNetV1
from fedper.models.reference import (
    MODEL_ARG_METAVAR,
    MODEL_HELP,
    ModelArgs,
    build_reference,
    parse_model_args,
    parse_reference,
)
from fedper.models.resnet import ResNet34
from fedper.models.staged import StagedModel

ModelName = Literal["mobilenet_v1", "resnet34"]
BaseKind = Literal["model", "linear"]
MODEL_NAMES: tuple[ModelName, ...] = get_args(ModelName)


@dataclass(frozen=True)
class ModelConfig:
    """What defines a model's architecture (and therefore its tensor names and shapes): every
    command that builds a model nests this one config (leaving out, with ``nested(skip=...)``,
    the fields it sets itself, e.g. the simulation's classes and input size from its data)."""

    # A named model (MODEL_NAMES), torchvision:NAME or PACKAGE.MODULE:CALLABLE (fedper.models.reference).
    name: str = option("mobilenet_v1", MODEL_HELP, name="model", metavar="MODEL")
    num_classes: int = option(10, "number of output classes")
    alpha: float = option(0.25, "MobileNet-V1 width multiplier")
    input_size: int = option(32, "input image side in pixels (32: CIFAR-style stem, 224: ImageNet)")
    # "linear": the paper's ablation. It changes the architecture, so it is part of the model config.
    base: BaseKind = option("model", "'linear' replaces the base with one linear layer (the paper's ablation)")
    # With base "linear": the layers below the top ``linear_base_kp`` become the linear layer. No
    # option: a command sets it from its own kp.
    linear_base_kp: int = 0
    # "ordinal": a cumulative-link head for ordered ratings (fedper.models.heads).
    head: HeadKind = option(
        "softmax", "the classifier: softmax (a linear layer) or ordinal (one score and ordered cut points, for "
        "ratings); both output one log-score per class",
    )  # fmt: skip
    # Keyword arguments of a model given by reference, as (key, value) pairs. The command line gives
    # KEY=VALUE strings (repeatable, comma-separated), parsed here: each value a JSON literal, else text.
    model_args: ModelArgs = option(
        (), "keyword arguments for a --model given by reference (each VALUE a JSON literal, else a string; "
        "repeatable)", name="model_arg", metavar=MODEL_ARG_METAVAR, repeatable=True,
    )  # fmt: skip
    # Module paths that are the personal head, instead of the top kp layer groups.
    head_modules: tuple[str, ...] = option(
        (), "module paths that are the personal head (e.g. fc, or classifier): kp then only chooses FedAvg "
        "(0) or FedPer (any other kp); fedper export --list-layers shows the paths",
        metavar="PATH[,PATH...]",
    )  # fmt: skip

    def __post_init__(self) -> None:
        reference = parse_reference(self.name, MODEL_NAMES)
        if self.num_classes < 2:
            raise ConfigError(f"num_classes must be at least 2, got {self.num_classes}")
        if self.input_size < 32:
            raise ConfigError(f"input_size must be at least 32, got {self.input_size}")
        if self.base not in ("model", "linear"):
            raise ConfigError(f"base must be 'model' or 'linear', got {self.base!r}")
        if self.head not in HEADS:
            raise ConfigError(f"unknown head {self.head!r}; choose one of: {', '.join(HEADS)}")
        # Normalized once, so that equal settings compare (and hash) equal however they were given.
        object.__setattr__(self, "model_args", parse_model_args(self.model_args))
        object.__setattr__(self, "head_modules", _paths(self.head_modules))
        if self.model_args and reference.kind == "named":
            raise ConfigError(
                f"--model-arg is for a model given by reference; {self.name} takes its own options "
                "(--alpha, --input-size, --head)"
            )
        if self.base == "linear" and reference.kind != "named":
            raise ConfigError(
                f"--base linear (the paper's ablation) needs a named model ({', '.join(MODEL_NAMES)}): it replaces "
                f"the layers below the head by running them stage by stage, which {self.name} does not declare"
            )
        if self.base == "linear" and self.head_modules:
            raise ConfigError("--base linear counts its personal layers by kp: it cannot take --head-modules")

    def __hash__(self) -> int:
        # A model argument may be a JSON list or object (unhashable): hash the settings' JSON.
        return hash(json.dumps(self.to_dict(), sort_keys=True))

    def to_dict(self) -> dict[str, Any]:
        out = asdict(self)
        out["model_args"] = [[key, value] for key, value in self.model_args]
        out["head_modules"] = list(self.head_modules)
        return out


def _paths(value: object) -> tuple[str, ...]:
    """``head_modules`` as a tuple of module paths (from the command line, code or a manifest)."""
    items = value.split(",") if isinstance(value, str) else value
    if not isinstance(items, tuple | list) or not all(isinstance(p, str) for p in items):
        raise ConfigError(f"--head-modules must be module paths, got {value!r}")
    paths = tuple(p.strip() for p in items if p.strip())
    bad = [p for p in paths if not all(part.isidentifier() or part.isdigit() for part in p.split("."))]
    if bad:
        raise ConfigError(
            f"--head-modules: {bad[0]!r} is not a module path (names and indices joined by dots, e.g. fc or "
            "classifier.3)"
        )
    if len(set(paths)) != len(paths):
        raise ConfigError(f"--head-modules names a module twice: {', '.join(paths)}")
    return paths


def build_model(config: ModelConfig, seed: int | None = None) -> StagedModel:
    """Build the model; with a seed, its initial weights are reproducible."""
    if seed is not None:
        torch.manual_seed(seed)
    model: StagedModel
    if config.name == "mobilenet_v1":
        model = MobileNetV1(config.num_classes, config.alpha, config.input_size, config.head)
    elif config.name == "resnet34":
        model = ResNet34(config.num_classes, config.input_size, config.head)
    else:
        model = build_reference(config.name, config.num_classes, config.head, config.model_args)
    if config.head_modules:
        model.name_head(config.head_modules)
    if config.base == "linear":
        model.use_linear_base(config.linear_base_kp, config.input_size)
    return model
