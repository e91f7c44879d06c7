"""The coordinate clip of :mod:`fedper.common.robust_aggregate`, in memory or spilled to a file.

Each update is held, coordinate by coordinate, to the round's median there plus or minus
``factor`` median absolute deviations; an update's tensor with no coordinate outside is passed
on as it came. That needs every update of a round at once: the simulation has them in memory
already; the server, which folds one update at a time, writes them (float64) to an unlinked
temporary file and works through the coordinates in chunks, so its memory is one update plus a
chunk across the round's updates, whatever the cohort. The spilled form gives the in-memory
form's bytes (for the server's one-at-a-time fold, ``group=1``): the same float64 operations on
each coordinate in the same order (``tests/unit/common/test_robust_aggregate.py`` holds it to that).
"""

from __future__ import annotations

import math
import os
import tempfile
from collections.abc import Iterable, Mapping, Sequence
from pathlib import Path

import numpy as np

Tensors = Mapping[str, np.ndarray]
CHUNK_BYTES = 1 << 24  # one chunk of coordinates across a round's updates, float64 (each of its arrays)


def _bounds(deltas: np.ndarray, factor: float) -> tuple[np.ndarray, np.ndarray]:
    """Per coordinate (axis 1 on), the round's median delta minus and plus ``factor`` MADs."""
    middle = np.median(deltas, axis=0)
    spread = factor * np.median(np.abs(deltas - middle), axis=0)
    return middle - spread, middle + spread


def clipped_in_memory(held: Sequence[Tensors], base: Tensors, factor: float) -> tuple[list[Tensors], int]:
    """Each update held to the round's spread; how many coordinate values were held."""
    out: list[dict[str, np.ndarray]] = [dict(u) for u in held]
    clipped = 0
    for name, b in base.items():
        b64 = np.asarray(b, dtype=np.float64)
        stacked = np.stack([np.asarray(u[name], dtype=np.float64) - b64 for u in held])
        low, high = _bounds(stacked, factor)
        for i in range(len(held)):
            outside = (stacked[i] < low) | (stacked[i] > high)
            if outside.any():
                clipped += int(np.count_nonzero(outside))
                out[i][name] = b64 + np.clip(stacked[i], low, high)
    result: list[Tensors] = list(out)
    return result, clipped


class SpilledRound:
    """A round's updates (after the norm clip) in one unlinked float64 file, one row each."""

    def __init__(self, layout: Sequence[tuple[str, tuple[int, ...]]], base: Tensors, directory: Path):
        self._names = [name for name, _ in layout]
        self._shapes = [tuple(shape) for _, shape in layout]
        sizes = [math.prod(shape) for _, shape in layout]
        self._offsets = np.cumsum([0, *sizes])
        self._width = int(self._offsets[-1])
        self._base = np.concatenate([np.asarray(base[n], dtype=np.float64).ravel() for n in self._names])
        # Unlinked, so nothing stays after a crash; closed by __exit__ (the object is the context).
        self._file = tempfile.TemporaryFile(dir=directory)  # noqa: SIM115
        self.rows = 0

    def __enter__(self) -> SpilledRound:
        return self

    def __exit__(self, *exc: object) -> None:
        self._file.close()

    def append(self, tensors: Tensors) -> None:
        for name in self._names:
            self._file.write(np.ascontiguousarray(tensors[name], dtype=np.float64).tobytes())
        self.rows += 1

    def _chunk(self, start: int, stop: int) -> np.ndarray:
        out = np.empty((self.rows, stop - start), dtype=np.float64)
        fd = self._file.fileno()
        for i in range(self.rows):
            data = os.pread(fd, 8 * (stop - start), 8 * (i * self._width + start))
            if len(data) != 8 * (stop - start):
                raise OSError(f"the spilled round's file gave {len(data)} bytes of {8 * (stop - start)}")
            out[i] = np.frombuffer(data, dtype=np.float64)
        return out

    def _chunks(self) -> Iterable[tuple[int, int]]:
        step = max(1, CHUNK_BYTES // (8 * max(1, self.rows)))
        for start in range(0, self._width, step):
            yield start, min(self._width, start + step)

    def _tensors_in(self, start: int, stop: int) -> Iterable[tuple[int, int, int]]:
        """(tensor index, its first and last+1 column in the chunk) for each tensor the chunk covers."""
        first = int(np.searchsorted(self._offsets, start, side="right")) - 1
        for t in range(first, len(self._names)):
            lo, hi = max(start, int(self._offsets[t])), min(stop, int(self._offsets[t + 1]))
            if lo >= stop:
                break
            if lo < hi:
                yield t, lo - start, hi - start

    def clipped_mean(self, weights: Sequence[int], factor: float) -> tuple[dict[str, np.ndarray], int]:
        """The weighted mean of the clipped rows (float32 tensors) and the values held: first which
        update's tensors have a coordinate outside the spread, then the fold, chunk by chunk."""
        self._file.flush()  # written through the buffer, read with pread
        flagged = np.zeros((self.rows, len(self._names)), dtype=bool)
        clipped = 0
        low, high = np.empty(self._width), np.empty(self._width)  # kept for the fold: medians once
        for start, stop in self._chunks():
            deltas = self._chunk(start, stop) - self._base[start:stop]
            low[start:stop], high[start:stop] = _bounds(deltas, factor)
            outside = (deltas < low[start:stop]) | (deltas > high[start:stop])
            clipped += int(np.count_nonzero(outside))
            for t, lo, hi in self._tensors_in(start, stop):
                flagged[:, t] |= outside[:, lo:hi].any(axis=1)
        acc = np.zeros(self._width, dtype=np.float64)
        for start, stop in self._chunks():
            rows = self._chunk(start, stop)
            base = self._base[start:stop]
            deltas = rows - base
            chunk_low, chunk_high = low[start:stop], high[start:stop]
            for i, weight in enumerate(weights):
                values = rows[i]
                for t, lo, hi in self._tensors_in(start, stop):
                    if flagged[i, t]:
                        values[lo:hi] = base[lo:hi] + np.clip(deltas[i, lo:hi], chunk_low[lo:hi], chunk_high[lo:hi])
                total = np.multiply(values, float(weight), dtype=np.float64)
                np.add(acc[start:stop], total, out=acc[start:stop])
        total_weight = float(sum(weights))
        out: dict[str, np.ndarray] = {}
        for t, (name, shape) in enumerate(zip(self._names, self._shapes, strict=True)):
            mean = np.empty(shape, dtype=np.float32)
            part = acc[self._offsets[t] : self._offsets[t + 1]].reshape(shape)
            np.divide(part, total_weight, out=mean, casting="same_kind")  # float64, rounded once
            out[name] = mean
        return out, clipped
