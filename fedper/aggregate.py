"""Sample-weighted FedAvg, streaming: updates are folded into a float64 accumulator as
they arrive, so memory stays flat however many clients report (at most seven updates
wait to be folded together with the next one).

This is the only FedAvg in the toolkit: the server and the in-process simulation
both use :class:`FedAvg`.
"""

from __future__ import annotations

import warnings
from collections.abc import Mapping, Sequence

import numpy as np
import torch

_LARGE = 1 << 15  # elements; smaller tensors are batched into one operation
_GROUP = 8  # updates folded per pass over the accumulator
_CHUNK = 1 << 18  # elements per step of a fold: the float64 scratch stays in L2


class AggregationError(ValueError):
    """An update that cannot be folded in (wrong names, shapes or weight)."""


class FedAvg:
    """base[t] = sum_i(n_i * w_i[t]) / sum_i(n_i), accumulated in float64."""

    def __init__(self, layout: Sequence[tuple[str, tuple[int, ...]]]):
        self._shapes = {name: tuple(shape) for name, shape in layout}
        sizes = {n: int(np.prod(s, dtype=np.int64)) for n, s in self._shapes.items()}
        # Large tensors are folded in one by one; the many small ones (BatchNorm vectors) are
        # first gathered into one float32 staging buffer, so each update costs a few large
        # operations rather than one per tensor.
        self._large = [n for n in self._shapes if sizes[n] >= _LARGE]
        self._small = [n for n in self._shapes if sizes[n] < _LARGE]
        order = self._large + self._small
        # One preallocated float64 buffer; torch's in-place add with alpha converts, scales and
        # accumulates in a single vectorized, multi-threaded pass (numpy needs a temporary).
        self._flat = torch.zeros(sum(sizes.values()), dtype=torch.float64)
        self._views: dict[str, torch.Tensor] = {}
        offset = 0
        for name in order:
            self._views[name] = self._flat[offset : offset + sizes[name]]
            offset += sizes[name]
        small_start = sum(sizes[n] for n in self._large)
        self._small_acc = self._flat[small_start:]
        self._staging = np.empty(offset - small_start, dtype=np.float32)
        self._staging_views: dict[str, np.ndarray] = {}
        start = 0
        for name in self._small:
            self._staging_views[name] = self._staging[start : start + sizes[name]]
            start += sizes[name]
        self._staging_tensor = torch.from_numpy(self._staging)
        # Updates wait in groups of _GROUP so that the float64 accumulator, the largest
        # thing touched, is read and written once per group instead of once per update.
        self._pending: list[tuple[list[torch.Tensor], float]] = []
        self._scratch = torch.empty(_CHUNK, dtype=torch.float64)
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
                raise AggregationError(f"tensor {name!r} has shape {list(tensors[name].shape)}, expected {list(shape)}")

    def add(self, tensors: Mapping[str, np.ndarray], num_samples: int) -> None:
        """Fold one client's update in, weighted by its number of training examples."""
        if num_samples < 1:
            raise AggregationError(f"num_samples must be positive, got {num_samples}")
        self.check(tensors)
        weight = float(num_samples)
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")  # read-only buffers (e.g. an upload's bytes) are fine
            large = [torch.as_tensor(tensors[name]).reshape(-1) for name in self._large]
            if any(not t.is_floating_point() for t in large):
                raise AggregationError("update tensors must be floating point")
            for name in self._small:
                np.copyto(self._staging_views[name], np.asarray(tensors[name]).reshape(-1))
            if self._small:
                self._small_acc.add_(self._staging_tensor, alpha=weight)
        self._pending.append((large, weight))
        if len(self._pending) == _GROUP:
            self._fold()
        self.total_samples += int(num_samples)
        self.count += 1

    def _fold(self) -> None:
        """acc += sum_i n_i * w_i over the pending updates, chunk by chunk."""
        pending, self._pending = self._pending, []
        for index, name in enumerate(self._large):
            acc = self._views[name]
            for start in range(0, acc.numel(), _CHUNK):
                end = min(acc.numel(), start + _CHUNK)
                scratch = self._scratch[: end - start]
                scratch.zero_()
                for tensors, weight in pending:
                    # add_ with alpha promotes to float64 before scaling (torch.mul into a
                    # float64 out would scale in float32 first).
                    scratch.add_(tensors[index][start:end], alpha=weight)
                acc[start:end].add_(scratch)

    def result(self) -> dict[str, np.ndarray]:
        """The weighted mean as float32 tensors (what goes on the wire)."""
        if self.count == 0:
            raise AggregationError("no updates to aggregate")
        if self._pending:
            self._fold()
        inv = 1.0 / self.total_samples
        return {
            name: (view * inv).to(torch.float32).numpy().reshape(self._shapes[name])
            for name, view in self._views.items()
        }
