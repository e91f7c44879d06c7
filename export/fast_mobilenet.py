"""The fast training graph of MobileNet-V1: the same parameters and the same computation as
:class:`export.training_graph.TrainingStep`, built from :mod:`export.fast_ops`.

Activations are channel-major (``[C, B, H, W]``, or ``[C, B*H*W]`` around matrix products
and BatchNorm). ``forward(x, y, *running_stats) -> (loss, *new_running_stats)`` has the
same signature, inputs, outputs and parameter names as the plain graph.
"""

from __future__ import annotations

import copy
from typing import cast

import torch
from torch import nn

from fedper.export.fast_ops import batch_norm_relu, depthwise3x3, depthwise3x3_s2, stem_conv
from fedper.models.mobilenet_v1 import ConvBN, DepthwiseSeparable, MobileNetV1
from fedper.models.split import running_stat_names


def downsampling(model: MobileNetV1) -> int:
    """The factor the image sides must be divisible by (every stride-2 layer halves them)."""
    convs = [model.stem.conv] + [cast(DepthwiseSeparable, b).dw.conv for b in model.blocks]
    return int(2 ** sum(conv.stride[0] > 1 for conv in convs))


class FastMobileNetStep(nn.Module):
    def __init__(self, model: nn.Module):
        super().__init__()
        if not isinstance(model, MobileNetV1) or "linear_base" in model._modules:
            raise ValueError("the fast training graph supports MobileNet-V1; use --variant plain")
        self.size_multiple = downsampling(model)
        model = copy.deepcopy(model).train()
        for name, child in model.named_children():
            self.add_module(name, child)
        self.stem: ConvBN
        self.blocks: nn.ModuleList
        self.classifier: nn.Module
        self.bn_paths = ["stem.bn"] + [
            f"blocks.{i}.{part}.bn" for i in range(len(self.blocks)) for part in ("dw", "pw")
        ]
        self._loss = nn.CrossEntropyLoss()

    @property
    def stat_names(self) -> list[str]:
        return running_stat_names(self.bn_paths)

    def forward(self, x: torch.Tensor, y: torch.Tensor, *stats: torch.Tensor) -> tuple[torch.Tensor, ...]:
        if len(stats) != 2 * len(self.bn_paths):
            raise ValueError(f"expected {2 * len(self.bn_paths)} running statistics, got {len(stats)}")
        batch = x.shape[0]
        if x.shape[2] % self.size_multiple or x.shape[3] % self.size_multiple:
            raise ValueError(
                f"the fast training graph needs image sides divisible by {self.size_multiple}, "
                f"got {tuple(x.shape[2:])}; export with --variant plain"
            )
        updated: list[torch.Tensor] = []

        def batch_norm(h: torch.Tensor, bn: nn.BatchNorm2d, relu: bool = True) -> torch.Tensor:
            i = len(updated)
            out, mean, var, _, _ = batch_norm_relu(h, bn.weight.clone(), bn.bias.clone(), bn.eps, relu, batch)
            m = 0.1 if bn.momentum is None else bn.momentum
            updated.append((1 - m) * stats[i] + m * mean.detach())
            updated.append((1 - m) * stats[i + 1] + m * var.detach())
            return out

        stride = self.stem.conv.stride[0]
        h, _ = stem_conv(x.permute(1, 0, 2, 3).contiguous(), self.stem.conv.weight.clone(), stride)
        height, width = x.shape[2] // stride, x.shape[3] // stride
        h = batch_norm(h, self.stem.bn)
        for block in (cast(DepthwiseSeparable, b) for b in self.blocks):
            channels = block.dw.conv.weight.shape[0]
            weight = block.dw.conv.weight.clone()
            if block.dw.conv.stride[0] > 1:
                d, _ = depthwise3x3_s2(h.view(channels, batch, height, width), weight)
                height, width = height // 2, width // 2
            else:
                d, _ = depthwise3x3(h.view(channels, batch, height, width), weight)
            h = batch_norm(d.reshape(channels, -1), block.dw.bn)
            pw = block.pw.conv.weight
            h = torch.mm(pw.clone().view(pw.shape[0], pw.shape[1]), h)
            h = batch_norm(h, block.pw.bn)
        channels = h.shape[0]
        pooled = h.view(channels, batch, height * width).mean(dim=2)
        logits = self.classifier(pooled.t())
        return (self._loss(logits, y), *updated)
