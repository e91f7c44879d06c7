"""Sample-weighted FedAvg, streaming: updates are folded into a float64 accumulator as
they are added, so memory stays flat however many clients report (by default at most
seven updates wait to be folded together with the next one).

The products n_i * w_i are exact in float64 (float16/32 weights, n_i < 2^29), but each
addition rounds, so the float32 result can depend on the order of :meth:`FedAvg.add` by a
rounding. A caller that needs the same bytes from the same updates adds them in an order
of its own: the server in ascending sha256 of its stored file of each (``server/rounds.py``),
the simulation by client index. Inside a group the terms are summed by one BLAS
matrix-vector product, in an order fixed by the numpy/BLAS build and the CPU; with
``group=1`` (the server) each update is added to the accumulator on its own, a strictly
sequential sum that does not depend on how BLAS groups terms.

This is the only FedAvg in the toolkit: the server and the in-process simulation
both use :class:`FedAvg`. It needs numpy only, so the server runs without torch.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence

import numpy as np

from fedper.common.errors import FedperError

_LARGE = 1 << 15  # elements; smaller tensors are batched into one operation
_GROUP = 8  # updates folded per pass over the accumulator, by default
_CHUNK = 1 << 15  # elements per step of a fold: its float64 rows stay in cache


class AggregationError(FedperError, ValueError):
    """An update that cannot be folded in (wrong names, shapes, dtype or weight)."""


class FedAvg:
    """base[t] = sum_i(n_i * w_i[t]) / sum_i(n_i), accumulated in float64."""

    def __init__(self, layout: Sequence[tuple[str, tuple[int, ...]]], group: int = _GROUP):
        """``group`` updates are folded per pass over the float64 accumulator: 8 reads and
        writes it once per 8 updates (the fastest), but keeps up to 7 updates' large tensors
        referenced; 1 folds each update within :meth:`add`, so nothing stays referenced."""
        if group < 1:
            raise AggregationError(f"group must be at least 1, got {group}")
        self._group = group
        self._shapes = {name: tuple(shape) for name, shape in layout}
        sizes = {n: int(np.prod(s, dtype=np.int64)) for n, s in self._shapes.items()}
        # Large tensors are folded in one by one; the many small ones (BatchNorm vectors) are
        # first gathered into one staging buffer, so each update costs a few large operations
        # rather than one per tensor.
        self._large = [n for n in self._shapes if sizes[n] >= _LARGE]
        self._small = [n for n in self._shapes if sizes[n] < _LARGE]
        self._flat = np.zeros(sum(sizes.values()), dtype=np.float64)
        self._views: dict[str, np.ndarray] = {}
        offset = 0
        for name in self._large + self._small:
            self._views[name] = self._flat[offset : offset + sizes[name]]
            offset += sizes[name]
        small_start = sum(sizes[n] for n in self._large)
        # What a fold walks: each large tensor's accumulator, then the small ones' as one segment.
        self._segments = [self._views[n] for n in self._large]
        if self._small:
            self._segments.append(self._flat[small_start:])
        # One float64 staging row per pending update (float16/32 convert exactly).
        self._staging = np.empty((group, offset - small_start), dtype=np.float64)
        # Updates wait in groups so that the float64 accumulator, the largest
        # thing touched, is read and written once per group instead of once per update.
        self._pending: list[tuple[list[np.ndarray], float]] = []
        self._rows = np.empty((group, _CHUNK), dtype=np.float64)
        self._total = np.empty(_CHUNK, dtype=np.float64)
        self.total_samples = 0
        self.count = 0

    @property
    def names(self) -> tuple[str, ...]:
        return tuple(self._shapes)

    def check(self, tensors: Mapping[str, np.ndarray]) -> None:
        """Raise AggregationError unless ``tensors`` has exactly this layout, in floating point."""
        if set(tensors) != set(self._shapes):
            missing = sorted(set(self._shapes) - set(tensors))
            extra = sorted(set(tensors) - set(self._shapes))
            raise AggregationError(f"update names differ: missing {missing[:3]}, extra {extra[:3]}")
        for name, shape in self._shapes.items():
            arr = tensors[name]
            if arr.shape != shape:
                raise AggregationError(f"tensor {name!r} has shape {list(arr.shape)}, expected {list(shape)}")
            if arr.dtype.kind != "f":
                raise AggregationError(f"tensor {name!r} has dtype {arr.dtype}, expected floating point")

    def add(self, tensors: Mapping[str, np.ndarray], num_samples: int) -> None:
        """Fold one client's update in, weighted by its number of training examples.

        The large tensors are read when the group is folded, not copied: the caller must not
        modify them until :meth:`result` (read-only views on an upload's bytes are fine).
        """
        if num_samples < 1:
            raise AggregationError(f"num_samples must be positive, got {num_samples}")
        self.check(tensors)
        sources = [tensors[name].reshape(-1) for name in self._large]
        if self._small:
            row = self._staging[len(self._pending)]
            np.concatenate([tensors[name].reshape(-1) for name in self._small], out=row)
            sources.append(row)
        self._pending.append((sources, float(num_samples)))
        if len(self._pending) == self._group:
            self._fold()
        self.total_samples += int(num_samples)
        self.count += 1

    def _fold(self) -> None:
        """acc += sum_i n_i * w_i over the pending updates, chunk by chunk.

        Each chunk of the pending updates is converted to float64 rows (exactly), and one
        matrix-vector product with the weights sums them; the accumulator is then read and
        written once per group. numpy has no fused convert-scale-add (torch's add_ with alpha);
        a multiply and an add per update and chunk measured ~1.5x slower than the product.
        A lone update is multiplied directly: BLAS's product with one row measured ~4x slower.
        """
        pending, self._pending = self._pending, []
        weights = np.array([weight for _, weight in pending])
        for index, acc in enumerate(self._segments):
            for start in range(0, acc.size, _CHUNK):
                end = min(acc.size, start + _CHUNK)
                total = self._total[: end - start]
                if len(pending) == 1:
                    np.multiply(pending[0][0][index][start:end], weights[0], out=total, dtype=np.float64)
                else:
                    rows = self._rows[: len(pending), : end - start]
                    for row, (sources, _) in zip(rows, pending, strict=True):
                        np.copyto(row, sources[index][start:end])
                    np.dot(weights, rows, out=total)
                np.add(acc[start:end], total, out=acc[start:end])

    def weighted_sum(self) -> dict[str, np.ndarray]:
        """sum_i(n_i * w_i) per tensor, float64 views on the accumulator (zeros before any
        :meth:`add`): what DP-FedAvg noises (:mod:`fedper.common.dp.mechanism`)."""
        if self._pending:
            self._fold()
        return {name: self._views[name].reshape(shape) for name, shape in self._shapes.items()}

    def result(self) -> dict[str, np.ndarray]:
        """The weighted mean as float32 tensors (what goes on the wire)."""
        if self.count == 0:
            raise AggregationError("no updates to aggregate")
        if self._pending:
            self._fold()
        total = float(self.total_samples)
        out: dict[str, np.ndarray] = {}
        for name, shape in self._shapes.items():
            mean = np.empty(shape, dtype=np.float32)
            np.divide(self._views[name].reshape(shape), total, out=mean, casting="same_kind")  # float64, rounded once
            out[name] = mean
        return out
