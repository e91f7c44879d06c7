"""Sample-weighted FedAvg, streaming: one update at a time into a float64 accumulator.

This is the only FedAvg in the toolkit: the server and the in-process simulation
both fold updates in through :class:`FedAvg`, so memory stays flat however many
clients report.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence

import numpy as np

# Elements per multiply-add step: small enough that the float64 scratch stays in cache.
_CHUNK = 1 << 15


class AggregationError(ValueError):
    """An update that cannot be folded in (wrong names, shapes or weight)."""


class FedAvg:
    """base[t] = sum_i(n_i * w_i[t]) / sum_i(n_i), accumulated in float64."""

    def __init__(self, layout: Sequence[tuple[str, tuple[int, ...]]]):
        self._shapes = {name: tuple(shape) for name, shape in layout}
        sizes = [int(np.prod(s, dtype=np.int64)) for s in self._shapes.values()]
        self._flat = np.zeros(sum(sizes), dtype=np.float64)
        self._views: dict[str, np.ndarray] = {}
        offset = 0
        for name, size in zip(self._shapes, sizes, strict=True):
            self._views[name] = self._flat[offset : offset + size]
            offset += size
        self._scratch = np.empty(min(_CHUNK, max(1, offset)), dtype=np.float64)
        self.total_samples = 0
        self.count = 0

    @property
    def names(self) -> tuple[str, ...]:
        return tuple(self._shapes)

    def check(self, tensors: Mapping[str, np.ndarray]) -> None:
        """Raise AggregationError unless ``tensors`` has exactly this layout."""
        if set(tensors) != set(self._shapes):
            missing = sorted(set(self._shapes) - set(tensors))
            extra = sorted(set(tensors) - set(self._shapes))
            raise AggregationError(f"update names differ: missing {missing[:3]}, extra {extra[:3]}")
        for name, shape in self._shapes.items():
            if tuple(tensors[name].shape) != shape:
                raise AggregationError(
                    f"tensor {name!r} has shape {list(tensors[name].shape)}, expected {list(shape)}"
                )

    def add(self, tensors: Mapping[str, np.ndarray], num_samples: int) -> None:
        """Fold one client's update in, weighted by its number of training examples."""
        if num_samples < 1:
            raise AggregationError(f"num_samples must be positive, got {num_samples}")
        self.check(tensors)
        weight = np.float64(num_samples)
        scratch = self._scratch
        for name, acc in self._views.items():
            src = np.asarray(tensors[name]).reshape(-1)
            for start in range(0, src.size, _CHUNK):
                seg = src[start : start + _CHUNK]
                tmp = scratch[: seg.size]
                np.multiply(seg, weight, out=tmp)
                dst = acc[start : start + seg.size]
                np.add(dst, tmp, out=dst)
        self.total_samples += int(num_samples)
        self.count += 1

    def result(self) -> dict[str, np.ndarray]:
        """The weighted mean as float32 tensors (what goes on the wire)."""
        if self.count == 0:
            raise AggregationError("no updates to aggregate")
        inv = 1.0 / self.total_samples
        return {
            name: (view * inv).astype(np.float32).reshape(self._shapes[name])
            for name, view in self._views.items()
        }
