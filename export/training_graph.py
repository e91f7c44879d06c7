"""The module that becomes the on-device training program.

``forward(x, y, *running_stats) -> (loss, *new_running_stats)``: BatchNorm runs in
train mode on batch statistics and its running statistics are explicit inputs
and outputs, because the stock Android ``TrainingModule`` can read and write
parameters and gradients but not buffers. Parameter names are the model's own
state keys, so the program serves any kp.
"""

from __future__ import annotations

import copy
from collections.abc import Callable
from typing import Literal, get_args

import torch
import torch.nn.functional as F
from torch import nn

from fedper.common.errors import ConfigError
from fedper.export.batchnorm_check import check_batchnorm
from fedper.export.channel_major import ChannelMajorStep, trace_failure
from fedper.export.random_masks import stochastic_depth
from fedper.models import StagedModel, exchanged_names
from fedper.models.split import running_stat_names
from fedper.models.staged import replace_submodule

Variant = Literal["fast", "plain"]
VariantChoice = Literal["auto", "fast", "plain"]
VARIANTS: tuple[VariantChoice, ...] = get_args(VariantChoice)


def resolve_variant(requested: str, model: nn.Module, warn: Callable[[str], None] | None = None) -> Variant:
    """``auto`` is ``fast``: the generic fast graph serves every model ``torch.fx`` can trace
    (an op it has no fast form of runs as the model computes it, named by
    ``ChannelMajorStep.fallbacks_at``). A model it cannot trace gets the stock program, with a
    warning through ``warn``; ``fast`` asked for explicitly is then refused."""
    if requested not in VARIANTS:
        raise ConfigError(f"unknown training-graph variant {requested!r}; choose from {VARIANTS}")
    if requested == "plain":
        return "plain"
    failure = trace_failure(model)
    if failure is None:
        return "fast"
    why = (f"the fast training graph is built from the model's torch.fx trace, which failed ({failure}); "
           "torch.fx cannot follow Python control flow over tensor values or shapes")  # fmt: skip
    if requested == "fast":
        raise ConfigError(f"--variant fast: {why}. Make the model's forward traceable, or export --variant plain")
    if warn is not None:
        warn(f"{why}. The export falls back to ExecuTorch's stock program (--variant plain), many times slower "
             "per step than the fast graph (docs/PERFORMANCE.md, 'Any model', measures it); make the model's "
             "forward traceable by torch.fx to get the fast graph.")  # fmt: skip
    return "plain"


class StatsInputBatchNorm(nn.Module):
    """Train-mode BatchNorm2d whose running statistics come in and go out as tensors.

    Numerically the same as ``nn.BatchNorm2d`` in train mode: normalizes with the
    biased batch variance and updates the running variance with the unbiased one.
    """

    def __init__(self, bn: nn.BatchNorm2d):
        super().__init__()
        if bn.weight is None or bn.bias is None:
            raise ConfigError("BatchNorm without affine parameters is not supported")
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


class RowDrop(nn.Module):
    """torchvision's ``StochasticDepth`` in training (:func:`export.random_masks.stochastic_depth`):
    torchvision draws its mask with an in-place ``bernoulli_``, which ExecuTorch has no kernel for."""

    def __init__(self, p: float, mode: str):
        super().__init__()
        self.p, self.mode = float(p), mode

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        if not self.training:
            return x
        return stochastic_depth(x, self.p, self.mode, batch_dim=0)


class GatherMaxPool(nn.Module):
    """``nn.MaxPool2d`` as a gather at the maxima's indices: ExecuTorch 1.5.1's
    ``max_pool2d_with_indices_backward`` kernel leaves the input positions that were no window's
    maximum unset (their gradients are whatever its buffer held), while a gather's backward
    scatters into zeros. The same values and, ties aside, the same gradients."""

    def __init__(self, pool: nn.MaxPool2d):
        super().__init__()
        self.kernel_size, self.stride, self.padding = pool.kernel_size, pool.stride, pool.padding
        self.dilation, self.ceil_mode = pool.dilation, pool.ceil_mode

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        _, indices = F.max_pool2d(x.detach(), self.kernel_size, self.stride, self.padding, self.dilation,
                                  ceil_mode=self.ceil_mode, return_indices=True)  # fmt: skip
        return x.flatten(2).gather(2, indices.flatten(2)).view(indices.shape)


class ProductSiLU(nn.Module):
    """SiLU as ``x * sigmoid(x)``: autograd's ``silu_backward`` decomposes to a ``full_like`` of
    dynamic shape, i.e. ``empty_permuted``, which ExecuTorch 1.5.1 has no kernel for; the
    product's backward is a ``sigmoid_backward`` and products, which it runs."""

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return x * torch.sigmoid(x)


def trainable_copy(model: nn.Module) -> nn.Module:
    """A train-mode copy of ``model`` whose modules the stock program can train: in-place dropout
    becomes dropout (its in-place form traces to ``bernoulli_``), torchvision's ``StochasticDepth``
    becomes :class:`RowDrop`, SiLU :class:`ProductSiLU`, max pooling :class:`GatherMaxPool`, in-place
    activations compute out of place; a BatchNorm the program
    cannot carry is refused with its module path and what to change (:func:`check_batchnorm`)."""
    from torchvision.ops import StochasticDepth

    model = copy.deepcopy(model).train()
    for path, module in list(model.named_modules()):
        if isinstance(module, nn.modules.batchnorm._BatchNorm):
            check_batchnorm(path, module)
        elif isinstance(module, nn.modules.dropout._DropoutNd) and module.inplace:
            module.inplace = False
        elif isinstance(module, StochasticDepth):
            replace_submodule(model, path, RowDrop(module.p, module.mode))
        elif isinstance(module, nn.SiLU):
            replace_submodule(model, path, ProductSiLU())
        elif isinstance(module, nn.MaxPool2d):
            if module.return_indices:
                raise ConfigError(f"the MaxPool2d at {path} returns its indices: the training program supports "
                                  "max pooling that returns the pooled values only")  # fmt: skip
            replace_submodule(model, path, GatherMaxPool(module))
        elif getattr(module, "inplace", False) is True and isinstance(module, INPLACE_ACTIVATIONS):
            module.inplace = False
    return model


# Activations with an ``inplace`` flag: out of place in the program (a functional graph copies anyway).
INPLACE_ACTIVATIONS = (nn.ReLU, nn.ReLU6, nn.Hardswish, nn.Hardsigmoid, nn.SiLU, nn.Hardtanh, nn.LeakyReLU, nn.ELU,
                       nn.SELU, nn.CELU, nn.Mish, nn.Threshold, nn.RReLU)  # fmt: skip


class TrainingStep(nn.Module):
    """The model plus its loss, with BN statistics threaded through inputs and outputs."""

    def __init__(self, staged: StagedModel):
        super().__init__()
        model = trainable_copy(staged)
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
        kept = [(name, type(self.get_submodule(name.rpartition(".")[0])).__name__) for name, _ in self.named_buffers()]
        if kept:
            raise ConfigError(
                f"the training program keeps no buffers (all its state is its inputs, outputs and parameters), but "
                f"{kept[0][0]} is one (of a {kept[0][1]}); make it a parameter, or compute it in forward"
            )

    @property
    def stat_names(self) -> list[str]:
        """Running statistics in input/output order: mean, var of each BN layer."""
        return running_stat_names(self.bn_paths)

    def kernel_hint(self) -> str:
        return (
            "The stock program (--variant plain) differentiates the model's functions with autograd; "
            "--variant fast writes the backward of the convolutions, BatchNorm and activations itself."
        )

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
