import math

import numpy as np
import pytest
from hypothesis import example, given, settings
from hypothesis import strategies as st

from fedper.common.metrics import summarize


def _direct(values, weights):
    """The plain formulas (what summarize computed before it guarded against overflow)."""
    v, w = np.asarray(values, np.float64), np.asarray(weights, np.float64)
    return float(v.mean()), float((v * w).sum() / w.sum()), float(v.std())


@settings(max_examples=300, deadline=None)
@example(pairs=[(0.0, 1), (0.0, 22), (9.576485173304625e-308, 1)])  # subnormal products: once inexact
@given(
    st.lists(
        st.tuples(st.floats(-1e9, 1e9), st.integers(1, 100_000)),
        min_size=1,
        max_size=50,
    )
)
def test_ordinary_inputs_give_exactly_the_plain_formulas(pairs):
    values, weights = [v for v, _ in pairs], [n for _, n in pairs]
    s = summarize(values, weights)
    assert (s.mean, s.weighted_mean, s.std) == _direct(values, weights)
    assert s.count == len(values)


def test_extreme_values_and_weights_do_not_overflow():
    many = summarize([1e9, -1e9] * 50_000, [100_000, 1] * 50_000)
    assert many.mean == 0.0 and many.std == pytest.approx(1e9)
    assert many.weighted_mean == pytest.approx(1e9 * (100_000 - 1) / (100_000 + 1))
    huge = summarize([1.7e308, 1.7e308, -1.0], [1e308, 1e308, 1.0])
    assert all(math.isfinite(x) for x in (huge.mean, huge.weighted_mean, huge.std))
    assert huge.weighted_mean == pytest.approx(1.7e308)


def test_bad_inputs_are_refused():
    with pytest.raises(ValueError, match="no values"):
        summarize([])
    with pytest.raises(ValueError, match="2 values but 1 weights"):
        summarize([1.0, 2.0], [1.0])
    with pytest.raises(ValueError, match="positive sum"):
        summarize([1.0, 2.0], [0.0, 0.0])
    with pytest.raises(ValueError, match="non-negative"):
        summarize([1.0, 2.0], [2.0, -1.0])
