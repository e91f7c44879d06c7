"""MobileNet-V1 (Howard et al., 2017) with named layer groups for the FedPer split."""

from __future__ import annotations

from collections.abc import Sequence

import torch
from torch import nn

from fedper.common.errors import ConfigError
from fedper.models.heads import classifier
from fedper.models.staged import Stage, StagedModel

# (output channels, stride) of the 13 depthwise-separable blocks, at width 1.0.
BLOCKS: tuple[tuple[int, int], ...] = (
    (64, 1),
    (128, 2),
    (128, 1),
    (256, 2),
    (256, 1),
    (512, 2),
    (512, 1),
    (512, 1),
    (512, 1),
    (512, 1),
    (512, 1),
    (1024, 2),
    (1024, 1),
)
STEM_CHANNELS = 32


def scaled_channels(channels: int, alpha: float) -> int:
    """Width-multiplied channel count, never below 8 (as in the reference implementation)."""
    return max(8, int(channels * alpha))


class ConvBN(nn.Module):
    """Convolution, BatchNorm, ReLU: the unit every MobileNet-V1 layer is made of."""

    def __init__(self, in_ch: int, out_ch: int, kernel: int, stride: int, groups: int = 1):
        super().__init__()
        self.conv = nn.Conv2d(in_ch, out_ch, kernel, stride=stride, padding=kernel // 2, groups=groups, bias=False)
        self.bn = nn.BatchNorm2d(out_ch)
        self.relu = nn.ReLU(inplace=True)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.relu(self.bn(self.conv(x)))


class DepthwiseSeparable(nn.Module):
    """A 3x3 depthwise ConvBN followed by a 1x1 pointwise ConvBN."""

    def __init__(self, in_ch: int, out_ch: int, stride: int):
        super().__init__()
        self.dw = ConvBN(in_ch, in_ch, 3, stride, groups=in_ch)
        self.pw = ConvBN(in_ch, out_ch, 1, 1)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.pw(self.dw(x))


class MobileNetV1(StagedModel):
    """MobileNet-V1; ``input_size`` 32 uses a stride-1 stem (CIFAR-style), 224 the ImageNet stem."""

    def __init__(self, num_classes: int = 10, alpha: float = 1.0, input_size: int = 224, head: str = "softmax"):
        super().__init__()
        if alpha <= 0:
            raise ConfigError(f"width multiplier alpha must be positive, got {alpha}")
        if input_size < 32:
            raise ConfigError(f"input_size must be at least 32, got {input_size}")
        stem_stride = 1 if input_size < 128 else 2
        ch = scaled_channels(STEM_CHANNELS, alpha)
        self.stem = ConvBN(3, ch, 3, stem_stride)
        blocks = []
        for out, stride in BLOCKS:
            out_ch = scaled_channels(out, alpha)
            blocks.append(DepthwiseSeparable(ch, out_ch, stride))
            ch = out_ch
        self.blocks = nn.ModuleList(blocks)
        self.pool = nn.AdaptiveAvgPool2d(1)
        self.classifier = classifier(head, ch, num_classes)
        self.feature_channels = ch

    def _top(self, x: torch.Tensor) -> torch.Tensor:
        return self.classifier(torch.flatten(self.pool(x), 1))

    def stages(self) -> Sequence[Stage]:
        return [self.stem, *self.blocks, self._top]

    def stage_groups(self) -> list[list[str]]:
        return [["stem"]] + [[f"blocks.{i}"] for i in range(len(self.blocks))] + [["classifier"]]
