"""Dropout and stochastic depth as ExecuTorch can train them: the mask from ``torch.rand`` of a
shape and a comparison. PyTorch's and torchvision's forms draw with an in-place ``bernoulli_``
(no ExecuTorch kernel) and ``rand_like`` allocates with ``empty_permuted`` (none either). Used
by the stock program's rewrites and by the fast graph alike."""

from __future__ import annotations

import torch

Tensor = torch.Tensor


def _masked(t: Tensor, p: float, mask_shape: list[int]) -> Tensor:
    if p == 0:
        return t
    keep = (torch.rand(mask_shape, dtype=t.dtype) >= p).to(t.dtype)
    return t * keep if p >= 1 else t * keep * (1.0 / (1.0 - p))


def dropout(t: Tensor, p: float) -> Tensor:
    """Every value dropped with probability ``p``, the kept ones scaled by 1 / (1 - p)."""
    return _masked(t, p, list(t.shape))


def stochastic_depth(t: Tensor, p: float, mode: str, batch_dim: int) -> Tensor:
    """torchvision's ``stochastic_depth`` in training: each example's whole residual (``mode=
    "row"``; ``"batch"``: the whole batch's) dropped with probability ``p``, kept ones scaled by
    1 / (1 - p). ``batch_dim``: 0 for ``[B, C, H, W]``, 1 for channel-major ``[C, B, H, W]``."""
    if mode not in ("row", "batch"):
        raise ValueError(f"stochastic depth mode must be 'row' or 'batch', got {mode!r}")
    shape = [1] * t.dim()
    if mode == "row":
        shape[batch_dim] = t.shape[batch_dim]
    return _masked(t, p, shape)
