"""A numeric test's claims: a measured value against its bound, asserted and recorded.

Each claim is written into the JUnit report as a property (``claim:<name>``), so ``make
test-portable`` (tests/support/portable.py) can show, for every kernel set and thread count, how far the
run cleared each bound: the margin a threshold was set with is measured, not remembered.
"""

from __future__ import annotations

import json
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import numpy as np

PROPERTY_PREFIX = "claim:"


@dataclass(frozen=True)
class NumericClaims:
    """``record`` is pytest's ``record_property`` for the running test."""

    record: Callable[[str, object], None]

    def above(self, name: str, value: float, bound: float, detail: str = "") -> None:
        """``name`` stays the same from run to run (it keys the claim); ``detail`` goes into the
        failure message only."""
        self._record(name, value, bound, ">")
        assert value > bound, f"{name}: {value:.6g} is not above {bound:.6g} {detail}".rstrip()

    def below(self, name: str, value: float, bound: float, detail: str = "") -> None:
        self._record(name, value, bound, "<")
        assert value < bound, f"{name}: {value:.6g} is not below {bound:.6g} {detail}".rstrip()

    def close(self, name: str, actual: Any, expected: Any, rtol: float, atol: float) -> None:
        """``torch.testing.assert_close``'s criterion, |actual - expected| <= atol + rtol |expected|
        elementwise, as one number: the worst element's share of its allowance (below 1 passes)."""
        a, e = np.asarray(actual, np.float64), np.asarray(expected, np.float64)
        assert a.shape == e.shape, f"{name}: shape {a.shape}, expected {e.shape}"
        self.below(
            f"{name} (share of atol {atol:g} + rtol {rtol:g})",
            float((np.abs(a - e) / (atol + rtol * np.abs(e))).max()),
            1.0,
        )

    def _record(self, name: str, value: float, bound: float, sense: str) -> None:
        self.record(PROPERTY_PREFIX + name, json.dumps({"value": float(value), "bound": float(bound), "sense": sense}))
