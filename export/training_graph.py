"""The module that becomes the on-device training program.

``forward(x, y, *running_stats) -> (loss, *new_running_stats)``: BatchNorm runs in
train mode on batch statistics and its running statistics are explicit inputs
and outputs, because the stock Android ``TrainingModule`` can read and write
parameters and gradients but not buffers. Parameter names are the model's own
state keys, so the program serves any kp.
"""

from __future__ import annotations

import copy
from typing import Literal, get_args

import torch
from torch import nn

from fedper.common.errors import ConfigError
from fedper.export.channel_major import ChannelMajorStep
from fedper.models import StagedModel, exchanged_names
from fedper.models.split import running_stat_names
from fedper.models.staged import replace_submodule

Variant = Literal["fast", "plain"]
VariantChoice = Literal["auto", "fast", "plain"]
VARIANTS: tuple[VariantChoice, ...] = get_args(VariantChoice)


def resolve_variant(requested: str, model: nn.Module, input_size: int) -> Variant:
    """``auto`` is ``fast``: the generic fast graph serves every model (an op it has no fast
    form of runs as the model computes it, named by :func:`fast_graph_fallbacks`)."""
    if requested not in VARIANTS:
        raise ConfigError(f"unknown training-graph variant {requested!r}; choose from {VARIANTS}")
    return "plain" if requested == "plain" else "fast"


class StatsInputBatchNorm(nn.Module):
    """Train-mode BatchNorm2d whose running statistics come in and go out as tensors.

    Numerically the same as ``nn.BatchNorm2d`` in train mode: normalizes with the
    biased batch variance and updates the running variance with the unbiased one.
    """

    def __init__(self, bn: nn.BatchNorm2d):
        super().__init__()
        if bn.weight is None or bn.bias is None:
            raise ValueError("BatchNorm without affine parameters is not supported")
        self.weight = bn.weight
        self.bias = bn.bias
        self.eps = float(bn.eps)
        self.momentum = 0.1 if bn.momentum is None else float(bn.momentum)
        self.running: tuple[torch.Tensor, torch.Tensor] | None = None
        self.updated: tuple[torch.Tensor, torch.Tensor] | None = None

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        if self.running is None:
            raise RuntimeError("running statistics were not provided")
        running_mean, running_var = self.running
        # Reduce over H, W first, then over the batch: shorter fp32 accumulation chains in
        # the runtime's kernels (one long sum loses ~100x more precision than eager's).
        mean = x.mean(dim=(2, 3)).mean(dim=0)
        centered = x - mean[None, :, None, None]
        var = (centered * centered).mean(dim=(2, 3)).mean(dim=0)
        count = x.numel() // x.shape[1]
        scale = self.weight * torch.rsqrt(var + self.eps)
        shift = self.bias - mean * scale
        y = x * scale[None, :, None, None] + shift[None, :, None, None]
        m = self.momentum
        unbiased = var.detach() * (count / (count - 1))
        self.updated = (
            (1 - m) * running_mean + m * mean.detach(),
            (1 - m) * running_var + m * unbiased,
        )
        return y


class TrainingStep(nn.Module):
    """The model plus its loss, with BN statistics threaded through inputs and outputs."""

    def __init__(self, model: StagedModel):
        super().__init__()
        model = copy.deepcopy(model).train()
        self.bn_paths: list[str] = []
        self._bns: list[StatsInputBatchNorm] = []
        for path, module in list(model.named_modules()):
            if isinstance(module, nn.BatchNorm2d):
                replacement = StatsInputBatchNorm(module)
                replace_submodule(model, path, replacement)
                self.bn_paths.append(path)
                self._bns.append(replacement)
        # The model's children become this module's children, so every parameter keeps
        # its original name (no "model." prefix) in the exported program.
        for name, child in model.named_children():
            self.add_module(name, child)
        self._model_forward = model.forward
        self._loss = nn.CrossEntropyLoss()
        if any(True for _ in self.buffers()):
            raise ValueError("the training graph must not keep buffers; all state is explicit")

    @property
    def stat_names(self) -> list[str]:
        """Running statistics in input/output order: mean, var of each BN layer."""
        return running_stat_names(self.bn_paths)

    def kernel_hint(self) -> str:
        return ("The stock program (--variant plain) differentiates every module with autograd (its SiLU and "
                "GELU backward needs aten::empty_permuted); --variant fast writes the backward of the "
                "convolutions, BatchNorm and activations itself.")  # fmt: skip

    def forward(self, x: torch.Tensor, y: torch.Tensor, *stats: torch.Tensor) -> tuple[torch.Tensor, ...]:
        if len(stats) != 2 * len(self._bns):
            raise ValueError(f"expected {2 * len(self._bns)} running statistics, got {len(stats)}")
        for i, bn in enumerate(self._bns):
            bn.running = (stats[2 * i], stats[2 * i + 1])
        loss = self._loss(self._model_forward(x), y)
        outputs = [loss]
        for bn in self._bns:
            assert bn.updated is not None
            outputs.extend(bn.updated)
            bn.running = bn.updated = None
        return tuple(outputs)


def training_step(model: StagedModel, variant: Variant = "plain") -> TrainingStep | ChannelMajorStep:
    """The training module for ``model``; the exchanged names are checked to be preserved.

    ``plain`` keeps ``nn.Conv2d`` and autograd's backward (ExecuTorch's stock program); ``fast``
    is :class:`export.channel_major.ChannelMajorStep`, the same computation in ops that
    ExecuTorch runs fast.
    """
    step: TrainingStep | ChannelMajorStep
    if variant == "plain":
        step = TrainingStep(model)
    elif variant == "fast":
        step = ChannelMajorStep(model)
    else:
        raise ValueError(f"unknown training-graph variant {variant!r}")
    names = [n for n, _ in step.named_parameters()] + step.stat_names
    if sorted(names) != sorted(exchanged_names(model)):
        raise AssertionError("the training graph does not carry exactly the model's exchanged tensors")
    return step
