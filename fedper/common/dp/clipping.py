"""The clipping a device applies to its base delta, and the norm the server checks it with
(docs/PROTOCOL.md, "Clipping the base delta").

Both are defined to the bit, in float64 operations any language has, so that a device written
in another language (the Java core's ``DeltaClipping``) uploads the same float32 tensors from
the same inputs, and the server's check, :func:`distance` on what arrived, never refuses an
honest device: the device keeps shrinking its scale until that very computation is within the
bound. Rounding the clipped delta back to float32 can push its norm a little above the bound
(the base's own rounding, not the delta's), which is why it checks rather than trusts
``C / norm``.
"""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from dataclasses import dataclass

import numpy as np

from fedper.common.aggregate import AggregationError

MARGIN_STEPS = 24  # tries after the exact scale: margins 2^-23, 2^-22, ..., 2^-1, then 1 (scale 0)
Tensors = Mapping[str, np.ndarray]


class ClippingError(AggregationError):
    """A delta that cannot be clipped (a non-finite value, or tensors of other shapes)."""


def deltas(tensors: Tensors, base: Tensors, names: Sequence[str]) -> dict[str, np.ndarray]:
    """``tensors - base`` for each of ``names``, every element converted to float64 first."""
    out = {}
    for name in names:
        t, b = np.asarray(tensors[name]), np.asarray(base[name])
        if t.shape != b.shape:
            raise ClippingError(f"tensor {name!r} has shape {list(t.shape)}, its base {list(b.shape)}")
        out[name] = t.astype(np.float64) - b.astype(np.float64)
    return out


def norm(deltas: Tensors, names: Sequence[str]) -> float:
    """The L2 norm of float64 ``deltas``: each element squared and added to one running float64
    sum, tensor by tensor in ``names``' order, element by element in row-major order; then a
    correctly rounded square root. (numpy's cumulative sum adds left to right, as a plain loop
    does; ``np.sum`` would add pairwise, an order another language would have to copy. Robust
    aggregation's norms, :func:`fedper.common.robust_aggregate.group_norms`, are per group and
    independent of the tensors' order instead: they are the server's own, never recomputed by a
    device.)"""
    total = 0.0
    for name in names:
        d = deltas[name]
        if d.size:
            total = float(np.cumsum(np.concatenate(([total], np.square(d.ravel()))))[-1])
    return math.sqrt(total)


def distance(tensors: Tensors, base: Tensors, names: Sequence[str]) -> float:
    """The contract's norm of ``tensors - base`` (PROTOCOL.md, "Clipping the base delta")."""
    return norm(deltas(tensors, base, names), names)


@dataclass(frozen=True)
class Clipped:
    """What a device uploads under DP, and what it learned on the way."""

    tensors: dict[str, np.ndarray]  # float32: received + scale x (trained - received)
    norm: float  # of the delta before clipping
    unclipped: bool  # norm <= the bound: the bit adaptive clipping counts
    scale: float  # 1.0 when unclipped


def shrink(trained: np.ndarray, received: np.ndarray, scale: float) -> np.ndarray:
    """float32(received + scale x (trained - received)), each operation in float64."""
    r = received.astype(np.float64)
    return (r + scale * (trained.astype(np.float64) - r)).astype(np.float32)


def clip_delta(trained: Tensors, received: Tensors, names: Sequence[str], bound: float) -> Clipped:
    """``trained`` with its delta from ``received`` clipped to L2 norm ``bound`` (as
    :func:`distance` measures it): unchanged when within; else scaled by ``bound / norm``,
    then by that times 1 - 2^-23, 1 - 2^-22, ... until the float32 result is within (at the
    latest with scale 0: the received base itself)."""
    if not (0 < bound < math.inf):
        raise ClippingError(f"the clip norm must be a finite number > 0, got {bound}")
    norm = distance(trained, received, names)
    if not math.isfinite(norm):
        raise ClippingError("the trained base has a non-finite value, or its distance from the received one overflows")
    t32 = {n: np.asarray(trained[n]) for n in names}
    if norm <= bound:
        return Clipped({n: t.astype(np.float32, copy=False) for n, t in t32.items()}, norm, True, 1.0)
    for step in range(MARGIN_STEPS + 1):
        margin = 0.0 if step == 0 else 2.0 ** (step - MARGIN_STEPS)
        scale = (bound / norm) * (1.0 - margin)
        out = {n: shrink(t32[n], np.asarray(received[n]), scale) for n in names}
        if distance(out, received, names) <= bound:
            return Clipped(out, norm, False, scale)
    raise AssertionError("unreachable: scale 0 gives the received base, at distance 0")
