"""ResNet-34 from torchvision, with its basic blocks as FedPer layer groups."""

from __future__ import annotations

from collections.abc import Sequence

import torch
from torch import nn
from torchvision.models.resnet import BasicBlock, ResNet

from fedper.models.heads import classifier
from fedper.models.staged import Stage, StagedModel


class ResNet34(StagedModel, ResNet):
    """torchvision's ResNet-34; small inputs (< 128 px) get a 3x3 stride-1 stem and no max-pool."""

    conv1: nn.Conv2d
    bn1: nn.BatchNorm2d
    relu: nn.ReLU
    maxpool: nn.Module
    layer1: nn.Sequential
    layer2: nn.Sequential
    layer3: nn.Sequential
    layer4: nn.Sequential
    avgpool: nn.Module
    fc: nn.Module

    def __init__(self, num_classes: int = 10, input_size: int = 224, head: str = "softmax"):
        super().__init__(BasicBlock, [3, 4, 6, 3], num_classes=num_classes)
        if head != "softmax":
            self.fc = classifier(head, 512, num_classes)
        if input_size < 128:
            # Same state-key names as the ImageNet stem, so the split does not change.
            self.conv1 = nn.Conv2d(3, 64, kernel_size=3, stride=1, padding=1, bias=False)
            self.maxpool = nn.Identity()

    def _stem(self, x: torch.Tensor) -> torch.Tensor:
        return self.maxpool(self.relu(self.bn1(self.conv1(x))))

    def _top(self, x: torch.Tensor) -> torch.Tensor:
        return self.fc(torch.flatten(self.avgpool(x), 1))

    def stages(self) -> Sequence[Stage]:
        blocks = [b for stage in (self.layer1, self.layer2, self.layer3, self.layer4) for b in stage]
        return [self._stem, *blocks, self._top]

    def stage_groups(self) -> list[list[str]]:
        """Stem, the 16 basic blocks, fc."""
        groups: list[list[str]] = [["conv1", "bn1"]]
        for stage_name in ("layer1", "layer2", "layer3", "layer4"):
            stage = getattr(self, stage_name)
            groups.extend([f"{stage_name}.{i}"] for i in range(len(stage)))
        groups.append(["fc"])
        return groups
