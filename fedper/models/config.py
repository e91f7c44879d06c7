"""The model configuration every part of the toolkit builds models from."""

from __future__ import annotations

from dataclasses import asdict, dataclass
from typing import Any, Literal, get_args

import torch

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
    """What defines a model's architecture (and therefore its tensor names and shapes)."""

    name: ModelName = "mobilenet_v1"
    num_classes: int = 10
    alpha: float = 0.25
    input_size: int = 32
    # "linear": the paper's ablation; the layers below the top ``linear_base_kp`` become one
    # linear layer. It changes the architecture, so it is part of the model config.
    base: BaseKind = "model"
    linear_base_kp: int = 0
    # "ordinal": a cumulative-link head for ordered ratings (fedper.models.heads).
    head: HeadKind = "softmax"

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
