"""Client metrics and their summaries across clients (the numbers FedPer is judged by)."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import asdict, dataclass

import numpy as np
import torch


def accuracy(logits: torch.Tensor, labels: torch.Tensor) -> float:
    """Fraction of correct top-1 predictions."""
    if labels.numel() == 0:
        raise ValueError("accuracy of an empty set is undefined")
    return float((logits.argmax(dim=1) == labels).float().mean().item())


@dataclass(frozen=True)
class Summary:
    """Across clients: unweighted mean (the headline), sample-weighted mean, population std."""

    mean: float
    weighted_mean: float
    std: float
    count: int

    def to_dict(self) -> dict[str, float | int]:
        return asdict(self)


def summarize(values: Sequence[float], weights: Sequence[float] | None = None) -> Summary:
    if len(values) == 0:
        raise ValueError("no values to summarize")
    v = np.asarray(values, dtype=np.float64)
    w = np.ones_like(v) if weights is None else np.asarray(weights, dtype=np.float64)
    if w.shape != v.shape:
        raise ValueError(f"{len(values)} values but {len(w)} weights")
    if (w < 0).any() or w.sum() <= 0:
        raise ValueError("weights must be non-negative with a positive sum")
    return Summary(
        mean=float(v.mean()),
        weighted_mean=float((v * w).sum() / w.sum()),
        std=float(v.std()),
        count=len(v),
    )
