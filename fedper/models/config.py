"""The model configuration every part of the toolkit builds models from."""

from __future__ import annotations

from dataclasses import asdict, dataclass
from typing import Any, Literal, get_args

import torch

from fedper.common.config_cli import option
from fedper.common.errors import ConfigError
from fedper.models.heads import HEADS, HeadKind
from fedper.models.mobilenet_v1 import MobileNetV1
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

    name: ModelName = option("mobilenet_v1", "model architecture", name="model")
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

    def __post_init__(self) -> None:
        if self.name not in MODEL_NAMES:
            raise ConfigError(f"unknown model {self.name!r}; choose one of: {', '.join(MODEL_NAMES)}")
        if self.num_classes < 2:
            raise ConfigError(f"num_classes must be at least 2, got {self.num_classes}")
        if self.input_size < 32:
            raise ConfigError(f"input_size must be at least 32, got {self.input_size}")
        if self.base not in ("model", "linear"):
            raise ConfigError(f"base must be 'model' or 'linear', got {self.base!r}")
        if self.head not in HEADS:
            raise ConfigError(f"unknown head {self.head!r}; choose one of: {', '.join(HEADS)}")

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)


def build_model(config: ModelConfig, seed: int | None = None) -> StagedModel:
    """Build the model; with a seed, its initial weights are reproducible."""
    if seed is not None:
        torch.manual_seed(seed)
    model: StagedModel
    if config.name == "mobilenet_v1":
        model = MobileNetV1(config.num_classes, config.alpha, config.input_size, config.head)
    else:
        model = ResNet34(config.num_classes, config.input_size, config.head)
    if config.base == "linear":
        model.use_linear_base(config.linear_base_kp, config.input_size)
    return model
