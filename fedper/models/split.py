"""The FedPer split: which exchanged tensors are shared (base) and which stay personal (head)."""

from __future__ import annotations

from dataclasses import dataclass

import torch

from fedper.common.errors import ConfigError
from fedper.models.staged import StagedModel, under


@dataclass(frozen=True)
class ModelSplit:
    """An ordered partition of the exchanged state's names; the names never depend on kp."""

    kp: int
    base: tuple[str, ...]
    head: tuple[str, ...]

    @property
    def names(self) -> tuple[str, ...]:
        return self.base + self.head


def exchanged_names(model: torch.nn.Module) -> tuple[str, ...]:
    """State keys of every floating-point tensor (BN's integer counters are not exchanged)."""
    return tuple(k for k, v in model.state_dict().items() if v.is_floating_point())


def exchanged_state(model: torch.nn.Module) -> dict[str, torch.Tensor]:
    """The model's exchanged tensors, detached copies, in state-dict order."""
    return {k: v.detach().clone() for k, v in model.state_dict().items() if v.is_floating_point()}


def max_kp(model: StagedModel) -> int:
    """The largest kp that still leaves a non-empty base (1 when the head is named by module)."""
    return 1 if model.head_modules else len(model.layer_groups()) - 1


def effective_kp(model: StagedModel, kp: int) -> int:
    """``kp`` as the split uses it: with head modules named (``--head-modules``), any kp >= 1 is
    that head (the top layer group), kp=0 still FedAvg."""
    return min(kp, 1) if model.head_modules and kp >= 0 else kp


def split(model: StagedModel, kp: int) -> ModelSplit:
    """Partition the exchanged names: the top ``kp`` layer groups are the personal head.

    kp=0 is plain FedAvg (empty head); kp=1 is the classifier; kp=2 adds the last block. With
    head modules named, the head is those modules for any kp >= 1 (:func:`effective_kp`).
    """
    groups = model.layer_groups()
    kp = effective_kp(model, kp)
    if not 0 <= kp <= len(groups) - 1:
        raise ConfigError(
            f"kp must be between 0 and {len(groups) - 1} for this model "
            f"({len(groups)} layers: {groups[0][0]} ... {groups[-1][0]}), got {kp}"
        )
    head_prefixes = [p for group in groups[len(groups) - kp :] for p in group] if kp else []
    names = exchanged_names(model)
    head = tuple(n for n in names if any(under(n, p) for p in head_prefixes))
    base = tuple(n for n in names if n not in set(head))
    return ModelSplit(kp=kp, base=base, head=head)


def group_parameters(model: StagedModel) -> list[list[str]]:
    """The parameter names of each layer group, bottom to top; a name under several groups'
    paths belongs to the topmost (as :func:`split` gives it to the head)."""
    groups = model.layer_groups()
    out: list[list[str]] = [[] for _ in groups]
    for name, _ in model.named_parameters():
        owner = max((i for i, group in enumerate(groups) if any(under(name, p) for p in group)), default=None)
        if owner is not None:
            out[owner].append(name)
    return out


def running_stat_names(bn_paths: list[str]) -> list[str]:
    """The running statistics of BatchNorm layers at ``bn_paths``: mean, var of each, in order."""
    return [f"{p}.{s}" for p in bn_paths for s in ("running_mean", "running_var")]


def batchnorm_stat_names(names: tuple[str, ...]) -> tuple[str, ...]:
    """The BatchNorm running statistics among ``names`` (kept on-device with ``--bn local``)."""
    return tuple(n for n in names if n.endswith((".running_mean", ".running_var")))
