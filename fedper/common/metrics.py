"""Summaries of client metrics across clients (the numbers FedPer is judged by).

numpy only: the aggregation server summarizes the metrics devices report, without torch.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import asdict, dataclass

import numpy as np


@dataclass(frozen=True)
class Summary:
    """Across clients: unweighted mean (the headline), sample-weighted mean, population std."""

    mean: float
    weighted_mean: float
    std: float
    count: int

    def to_dict(self) -> dict[str, float | int]:
        return asdict(self)


_SAFE = 2.0**400  # below it, sums of up to 2**200 squares or products cannot overflow


def _scaled(x: np.ndarray) -> tuple[np.ndarray, int]:
    """x / 2**e with every |value| at most 1, and e; (x, 0) if every |value| is under 2**400.

    Scaling by a power of two is exact (unless it pushes a value into the subnormal range,
    hence only values that need it are scaled), and so commutes with every rounding in a mean
    or a std: the statistics of the scaled values, scaled back, are bit-identical to the
    direct ones, but their sums, products and squares cannot overflow to inf.
    """
    peak = float(np.max(np.abs(x), initial=0.0))
    if peak <= _SAFE or not math.isfinite(peak):
        return x, 0
    exponent = math.frexp(peak)[1]
    return np.ldexp(x, -exponent), exponent


def summarize(values: Sequence[float], weights: Sequence[float] | None = None) -> Summary:
    if len(values) == 0:
        raise ValueError("no values to summarize")
    raw = np.asarray(values, dtype=np.float64)
    raw_w = np.ones_like(raw) if weights is None else np.asarray(weights, dtype=np.float64)
    if raw_w.shape != raw.shape:
        raise ValueError(f"{len(values)} values but {len(raw_w)} weights")
    v, e = _scaled(raw)
    w, _ = _scaled(raw_w)  # the weighted mean does not depend on the weights' scale
    if (w < 0).any() or not w.sum() > 0:
        raise ValueError("weights must be non-negative with a positive sum")
    return Summary(
        mean=math.ldexp(float(v.mean()), e),
        weighted_mean=math.ldexp(float((v * w).sum() / w.sum()), e),
        std=math.ldexp(float(v.std()), e),
        count=len(v),
    )
