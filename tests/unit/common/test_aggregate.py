import weakref

import numpy as np
import pytest

from fedper.common.aggregate import AggregationError, FedAvg

LAYOUT = [("a", (3, 4)), ("b.weight", (70000,)), ("c", ())]


def _update(rng, dtype=np.float32):
    return {n: rng.standard_normal(s).astype(dtype) for n, s in LAYOUT}


def test_weighted_mean_equals_float64_reference():
    rng = np.random.default_rng(0)
    updates = [(_update(rng), int(n)) for n in rng.integers(1, 1000, size=7)]
    agg = FedAvg(LAYOUT)
    for u, n in updates:
        agg.add(u, n)
    out = agg.result()
    total = sum(n for _, n in updates)
    for name, shape in LAYOUT:
        ref = sum(n * u[name].astype(np.float64) for u, n in updates) / total
        assert out[name].dtype == np.float32
        assert out[name].shape == shape
        # float64 accumulation, then one rounding to float32: within one float32 ulp.
        np.testing.assert_allclose(out[name], ref, rtol=1.2e-7, atol=1e-30)
    assert agg.total_samples == total and agg.count == 7


def test_another_order_changes_at_most_the_last_rounding_and_equals_batch():
    rng = np.random.default_rng(1)
    updates = [(_update(rng), int(n)) for n in (3, 100, 7, 55)]
    forward, backward = FedAvg(LAYOUT), FedAvg(LAYOUT)
    for u, n in updates:
        forward.add(u, n)
    for u, n in reversed(updates):
        backward.add(u, n)
    batch = {
        name: np.average(
            np.stack([u[name] for u, _ in updates]).astype(np.float64),
            axis=0,
            weights=[n for _, n in updates],
        )
        for name, _ in LAYOUT
    }
    f, b = forward.result(), backward.result()
    for name, _ in LAYOUT:
        np.testing.assert_allclose(f[name], b[name], rtol=1.2e-7, atol=1e-30)
        np.testing.assert_allclose(f[name], batch[name], rtol=1.2e-7, atol=1e-30)


def test_float16_updates_are_accumulated_exactly():
    rng = np.random.default_rng(2)
    u16 = _update(rng, np.float16)
    u32 = _update(rng)
    agg = FedAvg(LAYOUT)
    agg.add(u16, 3)
    agg.add(u32, 1)
    out = agg.result()
    ref = (3 * u16["a"].astype(np.float64) + u32["a"].astype(np.float64)) / 4
    np.testing.assert_allclose(out["a"], ref, rtol=1.2e-7, atol=1e-30)


def test_read_only_float16_and_float32_views_on_bytes_are_accepted():
    rng = np.random.default_rng(6)
    u16, u32 = _update(rng, np.float16), _update(rng)
    # As the server holds an upload: read-only arrays over the received bytes.
    r16 = {n: np.frombuffer(a.tobytes(), np.float16).reshape(a.shape) for n, a in u16.items()}
    r32 = {n: np.frombuffer(a.tobytes(), np.float32).reshape(a.shape) for n, a in u32.items()}
    assert not r16["b.weight"].flags.writeable
    agg = FedAvg(LAYOUT)
    agg.add(r16, 5)
    agg.add(r32, 2)
    out = agg.result()
    for name, _ in LAYOUT:
        ref = (5 * u16[name].astype(np.float64) + 2 * u32[name].astype(np.float64)) / 7
        np.testing.assert_allclose(out[name], ref, rtol=1.2e-7, atol=1e-30)
    np.testing.assert_array_equal(r16["b.weight"], u16["b.weight"])  # inputs untouched


def test_many_updates_fold_in_groups_and_memory_stays_fixed():
    rng = np.random.default_rng(5)
    pool = [_update(rng) for _ in range(3)]
    agg = FedAvg(LAYOUT)
    buffers = agg._flat.ctypes.data, agg._flat.size
    weights = [int(n) for n in rng.integers(1, 50, size=19)]  # not a multiple of the group
    for i, n in enumerate(weights):
        agg.add(pool[i % 3], n)
    assert len(agg._pending) < 8  # at most a group's worth waits to be folded
    out = agg.result()
    ref = sum(n * pool[i % 3]["b.weight"].astype(np.float64) for i, n in enumerate(weights))
    np.testing.assert_allclose(out["b.weight"], ref / sum(weights), rtol=1.2e-7, atol=1e-30)
    assert (agg._flat.ctypes.data, agg._flat.size) == buffers


def test_equal_updates_give_back_the_same_tensor():
    rng = np.random.default_rng(3)
    u = _update(rng)
    agg = FedAvg(LAYOUT)
    for n in (1, 2, 99999):
        agg.add(u, n)
    np.testing.assert_array_equal(agg.result()["b.weight"], u["b.weight"])


def test_bad_updates_are_refused():
    agg = FedAvg(LAYOUT)
    rng = np.random.default_rng(4)
    good = _update(rng)
    with pytest.raises(AggregationError, match="num_samples"):
        agg.add(good, 0)
    with pytest.raises(AggregationError, match="missing"):
        agg.add({k: v for k, v in good.items() if k != "a"}, 1)
    with pytest.raises(AggregationError, match="shape"):
        agg.add({**good, "a": np.zeros((4, 3), np.float32)}, 1)
    with pytest.raises(AggregationError, match="floating point"):
        agg.add({**good, "b.weight": np.zeros(70000, np.int32)}, 1)
    with pytest.raises(AggregationError, match="floating point"):
        agg.add({**good, "a": np.zeros((3, 4), np.int64)}, 1)
    with pytest.raises(AggregationError, match="no updates"):
        agg.result()
    assert agg.count == 0


def test_a_group_of_one_folds_within_add_in_strict_sequence():
    rng = np.random.default_rng(4)
    updates = [(_update(rng), int(n)) for n in (3, 100, 7, 55, 2)]
    agg = FedAvg(LAYOUT, group=1)
    for u, n in updates:
        agg.add(u, n)
    acc = {name: np.zeros(shape) for name, shape in LAYOUT}
    for u, n in updates:
        for name, _ in LAYOUT:
            acc[name] = acc[name] + n * u[name].astype(np.float64)  # each product exact
    out = agg.result()
    for name, _ in LAYOUT:
        np.testing.assert_array_equal(out[name], (acc[name] / 167).astype(np.float32))
    with pytest.raises(AggregationError, match="group"):
        FedAvg(LAYOUT, group=0)


@pytest.mark.parametrize(("group", "kept"), [(1, False), (8, True)])
def test_only_a_group_of_one_lets_go_of_an_update_in_add(group, kept):
    update = _update(np.random.default_rng(5))
    large = weakref.ref(update["b.weight"])
    agg = FedAvg(LAYOUT, group=group)
    agg.add(update, 1)
    del update
    assert (large() is not None) == kept
