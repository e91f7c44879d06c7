"""A user's own model, given by reference (``--model tests.support.custom_model:TinyNet``): small
(about 6,500 parameters at 10 classes) and built of every construct a CNN the toolkit trains may
use, so a test through it covers them all: dense, grouped, depthwise (kernel 5, dilation 2) and
strided convolutions, BatchNorm followed by each common activation, a residual addition,
squeeze-and-excitation gates (1x1 convolutions with hardsigmoid, linears with sigmoid), max and
adaptive average pooling, flatten, dropout and a final linear classifier."""

from __future__ import annotations

import torch
from torch import nn


class ConvBNAct(nn.Module):
    """A convolution, its BatchNorm and an activation: one layer group."""

    def __init__(self, cin: int, cout: int, kernel: int, act: nn.Module, stride: int = 1, groups: int = 1,
                 dilation: int = 1) -> None:  # fmt: skip
        super().__init__()
        padding = dilation * (kernel - 1) // 2
        self.conv = nn.Conv2d(cin, cout, kernel, stride, padding, dilation=dilation, groups=groups, bias=False)
        self.bn = nn.BatchNorm2d(cout)
        self.act = act

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.act(self.bn(self.conv(x)))


class ConvGate(nn.Module):
    """Squeeze-and-excitation with 1x1 convolutions: a hardsigmoid gate on each channel."""

    def __init__(self, channels: int, squeezed: int) -> None:
        super().__init__()
        self.pool = nn.AdaptiveAvgPool2d(1)
        self.reduce = nn.Conv2d(channels, squeezed, 1)
        self.act = nn.ReLU()
        self.expand = nn.Conv2d(squeezed, channels, 1)
        self.gate = nn.Hardsigmoid()

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return x * self.gate(self.expand(self.act(self.reduce(self.pool(x)))))


class LinearGate(nn.Module):
    """Squeeze-and-excitation with linear layers: a sigmoid gate on each channel."""

    def __init__(self, channels: int, squeezed: int) -> None:
        super().__init__()
        self.pool = nn.AdaptiveAvgPool2d(1)
        self.reduce = nn.Linear(channels, squeezed)
        self.expand = nn.Linear(squeezed, channels)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        s = torch.flatten(self.pool(x), 1)
        gate = torch.sigmoid(self.expand(torch.relu(self.reduce(s))))
        return x * gate[:, :, None, None]


class InvertedResidual(nn.Module):
    """Depthwise 5x5 (dilation 2), pointwise, a gate, and the block's input added back."""

    def __init__(self, channels: int) -> None:
        super().__init__()
        self.depthwise = ConvBNAct(channels, channels, 5, nn.Hardswish(), groups=channels, dilation=2)
        self.pointwise = ConvBNAct(channels, channels, 1, nn.SiLU(inplace=True))
        self.gate = ConvGate(channels, channels // 4)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return x + self.gate(self.pointwise(self.depthwise(x)))


class TinyNet(nn.Module):
    """Layer groups: features.0 (with features.1, its BatchNorm), features.3, .4, .6, .7, .8, .9,
    classifier.2."""

    def __init__(self, num_classes: int = 10, dropout: float = 0.2, width: int = 8) -> None:
        super().__init__()
        c = width
        self.features = nn.Sequential(
            nn.Conv2d(3, c, 3, padding=1, bias=False),  # dense
            nn.BatchNorm2d(c),
            nn.ReLU(inplace=True),
            ConvBNAct(c, 2 * c, 3, nn.ReLU6(inplace=True), groups=2),  # grouped, 1 < groups < channels
            InvertedResidual(2 * c),
            nn.MaxPool2d(2),
            ConvBNAct(2 * c, 3 * c, 3, nn.GELU(), stride=2),  # strided
            LinearGate(3 * c, c),
            ConvBNAct(3 * c, 3 * c, 1, nn.Hardsigmoid(inplace=True)),
            ConvBNAct(3 * c, 4 * c, 1, nn.Sigmoid()),
        )
        self.pool = nn.AdaptiveAvgPool2d(1)
        self.classifier = nn.Sequential(nn.Flatten(), nn.Dropout(dropout, inplace=True), nn.Linear(4 * c, num_classes))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.classifier(self.pool(self.features(x)))


class ShapeBranchNet(nn.Module):
    """Branches on its activation's size: ``torch.export`` follows that, ``torch.fx``'s symbolic
    trace cannot, so the fast graph cannot be built and the export falls back to the stock one."""

    def __init__(self, num_classes: int = 10) -> None:
        super().__init__()
        self.conv = nn.Conv2d(3, 4, 3, padding=1)
        self.fc = nn.Linear(4, num_classes)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        x = self.conv(x)
        if x.shape[-1] > 16:
            x = x[:, :, ::2, ::2]
        return self.fc(x.mean((2, 3)))


def tiny_net_without_classes(dropout: float = 0.0) -> nn.Module:
    """A callable that takes no ``num_classes``: its classifier has 10 outputs, whatever is asked."""
    return TinyNet(10, dropout)


def not_a_module() -> str:
    """A callable that returns something else than an nn.Module."""
    return "a string"
