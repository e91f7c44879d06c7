"""Robust aggregation (fedper/common/robust_aggregate.py): the defences against one hostile device."""

import math

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from fedper.common.aggregate import AggregationError, FedAvg
from fedper.common.errors import ConfigError
from fedper.common.robust_aggregate import (
    AggregationConfig,
    delta_norm,
    group_norms,
    lower_median,
    negative_variance,
    norm_group,
    robust_aggregate,
)

LAYOUT = [("w", (3, 4)), ("bn.running_var", (4,))]
OFF = AggregationConfig(clip_factor=0, weight_cap=0, coordinate_clip=0)
BOUNDS = AggregationConfig(coordinate_clip=0)  # revision 1.3's defaults: the norm bound and the weight cap


def _base() -> dict[str, np.ndarray]:
    return {"w": np.linspace(-1, 1, 12, dtype=np.float32).reshape(3, 4), "bn.running_var": np.ones(4, np.float32)}


def _honest(rng: np.random.Generator, k: int) -> list[tuple[dict[str, np.ndarray], int]]:
    base = _base()
    return [
        (
            {n: (v + rng.normal(0, 0.05, v.shape)).astype(np.float32) for n, v in base.items()},
            int(rng.integers(80, 160)),
        )
        for _ in range(k)
    ]


def _run(updates, config, group=1):  # type: ignore[no-untyped-def]
    return robust_aggregate(LAYOUT, _base(), lambda: iter(updates), config, group=group)


def test_honest_updates_give_plain_fedavgs_bytes():
    updates = _honest(np.random.default_rng(0), 9)
    fedavg = FedAvg(LAYOUT, group=1)
    for tensors, n in updates:
        fedavg.add(tensors, n)
    expected = fedavg.result()
    for config in (BOUNDS, OFF):
        result, report = _run(updates, config)
        assert all(result[n].tobytes() == expected[n].tobytes() for n in expected)
    assert report.clipped == 0 and report.capped == 0
    # The default's coordinate clip holds honest outliers too: what that costs is in SERVER.md.
    result, report = _run(updates, AggregationConfig())
    assert report.coordinates_clipped > 0 and any(result[n].tobytes() != expected[n].tobytes() for n in expected)


def test_a_huge_update_with_a_huge_count_is_clipped_and_capped():
    """Finding 1 and 2 of issue 28: base + 1e30 claiming 100,000 examples, beside 4 honest updates."""
    honest = _honest(np.random.default_rng(1), 4)
    attack = ({n: v + np.float32(1e30) for n, v in _base().items()}, 100_000)
    plain, _ = _run([*honest, attack], OFF)
    assert max(abs(float(v.max())) for v in plain.values()) > 1e29  # what FedAvg alone does
    result, report = _run([*honest, attack], AggregationConfig())
    assert report.clipped == 1 and report.capped == 1 and report.norm_bound is not None
    for group, bound in report.norm_bound.items():  # each group within 3x its largest honest norm
        assert bound <= 3 * max(group_norms(t, _base())[group] for t, _ in honest)
        assert group_norms(result, _base())[group] <= bound * (1 + 1e-6)
    assert report.weight_limit == 3 * sorted(n for _, n in [*honest, attack])[2]
    assert report.largest_weight_share < 0.5


def test_weights_and_batchnorm_statistics_are_clipped_apart():
    """Honest statistics deltas dwarf the weights' (a variance from 1 to the data's): one device
    whose variances moved far more than the others' is clipped there, its weights are not."""
    updates = _honest(np.random.default_rng(2), 5)
    far = dict(updates[0][0])
    far["bn.running_var"] = far["bn.running_var"] * 50
    updates[0] = (far, updates[0][1])
    result, report = _run(updates, AggregationConfig())
    assert norm_group("bn.running_var") == "batchnorm_statistics" and norm_group("w") == "parameters"
    assert report.clipped == 1 and report.norm_bound is not None
    assert group_norms(result, _base())["batchnorm_statistics"] <= report.norm_bound["batchnorm_statistics"]
    plain, _ = _run(updates, AggregationConfig(clip_factor=0))
    assert result["w"].tobytes() == plain["w"].tobytes()  # the weights aggregated as they came


@settings(max_examples=60, deadline=None)
@given(
    seed=st.integers(0, 2**32 - 1),
    honest=st.integers(1, 8),
    hostile=st.data(),
    aggregate=st.sampled_from(["mean", "median", "trimmed-mean", "centered-clip"]),
)
def test_fewer_than_half_hostile_cannot_move_the_base_beyond_the_honest_bound(seed, honest, hostile, aggregate):
    rng = np.random.default_rng(seed)
    updates = _honest(rng, honest)
    m = hostile.draw(st.integers(0, honest - 1), label="hostile updates")  # fewer than half
    scale = hostile.draw(st.sampled_from([-1e30, -1000.0, 1e-3, 1.0, 1e6, 3e38]), label="scale")
    count = hostile.draw(st.sampled_from([1, 100_000]), label="claimed count")
    for _ in range(m):
        updates.append(({n: np.clip(v * np.float32(scale), -3e38, 3e38).astype(np.float32)
                         for n, v in _base().items()}, count))  # fmt: skip
    order = rng.permutation(len(updates))
    config = AggregationConfig(aggregate=aggregate)
    result, report = _run([updates[i] for i in order], config)
    assert all(np.isfinite(v).all() for v in result.values())
    assert report.norm_bound is not None and report.weight_limit is not None
    honest_norms = [group_norms(t, _base()) for t, _ in updates[:honest]]
    for group, bound in report.norm_bound.items():
        assert bound <= 3 * max(n[group] for n in honest_norms)
    assert report.weight_limit <= 3 * max(n for _, n in updates[:honest])
    cut = math.floor(0.1 * len(updates))
    if aggregate == "mean" or (aggregate == "trimmed-mean" and cut == 0):
        # A (weighted) mean of updates each within the bound is within it, group by group.
        for group, norm in group_norms(result, _base()).items():
            assert norm <= report.norm_bound[group] * (1 + 1e-5) + 1e-6
    if aggregate == "centered-clip":
        # Each of 3 iterations moves the step by a weighted mean of vectors no longer than the
        # radius, 3x the lower median distance from the start (here the base): an honest one.
        radius = 3 * max(delta_norm(t, _base()) for t, _ in updates[:honest])
        assert delta_norm(result, _base()) <= 3 * radius * (1 + 1e-5) + 1e-6
    if aggregate == "median" or (aggregate == "trimmed-mean" and cut >= m):
        # Each coordinate stays within the honest (clipped) updates' range at that coordinate.
        for name, b in _base().items():
            group = norm_group(name)
            clipped = []
            for t, _ in updates[:honest]:
                norm = group_norms(t, _base())[group]
                scale = min(1.0, report.norm_bound[group] / norm) if norm else 1.0
                clipped.append(b + (t[name].astype(np.float64) - b) * scale)
            lo, hi = np.min(clipped, axis=0), np.max(clipped, axis=0)
            assert np.all(result[name] >= lo - 1e-6) and np.all(result[name] <= hi + 1e-6)


def test_median_and_trimmed_mean_are_coordinatewise():
    base = {n: np.zeros(s, np.float32) for n, s in LAYOUT}
    values = [0.0, 1.0, 2.0, 10.0, -50.0]
    updates = [({n: np.full(s, v, np.float32) for n, s in LAYOUT}, 1) for v in values]

    def run(config):  # type: ignore[no-untyped-def]
        return robust_aggregate(LAYOUT, base, lambda: iter(updates), config)[0]["w"]

    assert np.all(run(AggregationConfig(aggregate="median", clip_factor=0, coordinate_clip=0)) == 1.0)
    # 5 updates, 20% trimmed: one cut from each end -> mean of 0, 1, 2.
    assert np.all(
        run(AggregationConfig(aggregate="trimmed-mean", trim_fraction=0.2, clip_factor=0, coordinate_clip=0)) == 1.0
    )
    assert np.allclose(
        run(AggregationConfig(aggregate="trimmed-mean", trim_fraction=0.0, clip_factor=0, coordinate_clip=0)), -37 / 5
    )


def test_lower_median_and_bad_input():
    assert lower_median([5.0, 1.0]) == 1.0 and lower_median([3.0, 1.0, 2.0]) == 2.0
    with pytest.raises(AggregationError, match="no updates"):
        _run([], AggregationConfig())
    with pytest.raises(AggregationError, match="shape"):
        _run([({"w": np.zeros((4, 3), np.float32), "bn.running_var": np.ones(4, np.float32)}, 1)], OFF)
    with pytest.raises(AggregationError, match="positive"):
        _run([(_base(), 0)], OFF)
    flaky = iter([[(_base(), 1), (_base(), 1)], [(_base(), 1)]])
    with pytest.raises(AggregationError, match="changed between passes"):
        robust_aggregate(LAYOUT, _base(), lambda: iter(next(flaky)), AggregationConfig())


@pytest.mark.parametrize(
    ("field", "value", "message"),
    [("aggregate", "mode", "--aggregate must be one of"), ("clip_factor", 0.5, "--clip-factor"),
     ("clip_factor", math.inf, "--clip-factor"), ("weight_cap", -1.0, "--weight-cap"),
     ("trim_fraction", 0.5, "--trim-fraction")],
)  # fmt: skip
def test_bad_settings_are_refused(field, value, message):
    with pytest.raises(ConfigError, match=message):
        AggregationConfig(**{field: value})


def test_the_norm_has_the_same_bits_whatever_the_order_of_the_tensors():
    rng = np.random.default_rng(3)
    names = [f"t{i}" for i in range(40)]
    base = {n: rng.normal(size=int(rng.integers(1, 3000))).astype(np.float32) for n in names}
    update = {
        n: (v + rng.normal(size=v.shape) * 10.0 ** rng.integers(-8, 8)).astype(np.float32) for n, v in base.items()
    }
    norms = {delta_norm({n: update[n] for n in rng.permutation(names)}, {n: base[n] for n in rng.permutation(names)})
             for _ in range(20)}  # fmt: skip
    assert len(norms) == 1


def test_a_negative_batchnorm_variance_is_found_by_name_and_value():
    assert negative_variance("blocks.0.dw.bn.running_var", np.array([1.0, -40.0, 2.0], np.float32)) == -40.0
    assert negative_variance("blocks.0.dw.bn.running_var", np.array([0.0, 2.0], np.float32)) is None
    assert negative_variance("blocks.0.dw.bn.running_mean", np.array([-1.0], np.float32)) is None
    assert negative_variance("x.running_var", np.zeros(0, np.float32)) is None


def test_clipping_by_tensor_bounds_each_tensor_alone():
    """One tensor moved far inside the group bound (the group's norm is set by another tensor)
    is clipped to 3x that tensor's own median distance."""
    layout = [("w", (3, 4)), ("b", (4,))]
    base = {"w": np.zeros((3, 4), np.float32), "b": np.zeros(4, np.float32)}
    rng = np.random.default_rng(4)
    updates = [({"w": rng.normal(0, 1.0, (3, 4)).astype(np.float32), "b": rng.normal(0, 0.01, 4).astype(np.float32)},
                100) for _ in range(5)]  # fmt: skip
    hostile = {"w": updates[0][0]["w"], "b": np.full(4, 1.0, np.float32)}  # b 100x its honest size
    updates.append((hostile, 100))
    by_group, report = robust_aggregate(layout, base, lambda: iter(updates), BOUNDS)
    assert report.clipped == 0  # the group norm hides it
    by_tensor, report = robust_aggregate(
        layout, base, lambda: iter(updates), AggregationConfig(clip_by="tensor", coordinate_clip=0)
    )
    assert report.clipped == 1 and report.norm_bound is not None and set(report.norm_bound) == {"w", "b"}
    assert np.linalg.norm(by_tensor["b"]) < np.linalg.norm(by_group["b"]) / 5


def test_coordinate_clipping_holds_one_coordinate_to_its_honest_spread():
    """The whole norm budget on one of 1,000 weights moves it ~30x farther than honest devices
    move it by the mean; held to the round's median +- 3 MAD of that coordinate, it moves it
    about as far as an honest device would."""
    layout = [("w", (40, 25)), ("bn.running_var", (4,))]
    base = {n: np.zeros(s, np.float32) for n, s in layout}
    rng = np.random.default_rng(5)
    updates = [({n: rng.normal(0, 0.01, s).astype(np.float32) for n, s in layout}, 100) for _ in range(9)]
    budget = 2.99 * float(np.median([group_norms(t, base)["parameters"] for t, _ in updates]))
    one = {n: np.zeros(s, np.float32) for n, s in layout}
    one["w"][0, 0] = budget
    updates.append((one, 100))
    mean, report = robust_aggregate(layout, base, lambda: iter(updates), BOUNDS)
    assert report.clipped == 0  # inside the norm bound
    held, report = robust_aggregate(layout, base, lambda: iter(updates), AggregationConfig(coordinate_clip=3.0))
    honest = [t["w"][0, 0] for t, _ in updates[:9]]
    spread, honest_mean = float(np.std(honest)), float(np.mean(honest))
    assert abs(mean["w"][0, 0] - honest_mean) > 5 * spread
    assert abs(held["w"][0, 0] - honest_mean) < spread
    assert report.coordinates_clipped >= 1


def test_centered_clipping_starts_from_the_last_step_and_bounds_each_device():
    """Karimireddy et al.: honest updates around the last step barely move it; a device far away
    moves the result by at most its weight share of the radius per iteration (3 iterations)."""
    layout = [("w", (50,))]
    base = {"w": np.zeros(50, np.float32)}
    last = {"w": np.full(50, 0.1)}
    rng = np.random.default_rng(6)
    honest = [({"w": (last["w"] + rng.normal(0, 0.01, 50)).astype(np.float32)}, 100) for _ in range(9)]
    far = ({"w": np.full(50, -1000.0, np.float32)}, 100)
    config = AggregationConfig(aggregate="centered-clip", clip_factor=1.0, coordinate_clip=0)
    clean, _ = robust_aggregate(layout, base, lambda: iter(honest), config, center=last)
    attacked, report = robust_aggregate(layout, base, lambda: iter([*honest, far]), config, center=last)
    radius = 1.0 * sorted(float(np.linalg.norm(t["w"] - last["w"])) for t, _ in [*honest, far])[4]
    assert np.linalg.norm(attacked["w"] - clean["w"]) <= 3 * radius / 10 + 0.02
    assert report.clipped >= 1
    assert np.allclose(clean["w"], np.mean([t["w"] for t, _ in honest], axis=0), atol=1e-3)
    without_center, _ = robust_aggregate(layout, base, lambda: iter(honest), config)
    assert np.allclose(without_center["w"], clean["w"], atol=2e-3)  # from the base it gets there too, slower


def test_new_settings_are_refused_when_bad():
    with pytest.raises(ConfigError, match="--clip-by"):
        AggregationConfig(clip_by="layer")  # type: ignore[arg-type]
    with pytest.raises(ConfigError, match="--coordinate-clip"):
        AggregationConfig(coordinate_clip=0.5)
    with pytest.raises(ConfigError, match="centered-clip"):
        AggregationConfig(aggregate="centered-clip", clip_factor=0)


@settings(max_examples=40, deadline=None)
@given(seed=st.integers(0, 2**32 - 1), k=st.integers(1, 12), chunk=st.sampled_from([8, 40, 1 << 10, 1 << 24]))
def test_the_servers_spilled_coordinate_clip_gives_the_in_memory_bytes(seed, k, chunk, tmp_path_factory):
    """The server folds one update at a time and spills the coordinate clip's updates to a file,
    worked through in chunks of coordinates (chunks here as small as 1 coordinate per update, so
    they cut across tensors); the simulation holds them in memory. Same updates, same bytes, with
    some updates norm-clipped (float64 rows) and some far off in single coordinates."""
    from fedper.common import coordinate_clip

    rng = np.random.default_rng(seed)
    layout = [("a.weight", (3, 5, 2)), ("a.bn.running_mean", (5,)), ("a.bn.running_var", (5,)), ("b", (7,))]
    base = {n: rng.standard_normal(s).astype(np.float32) for n, s in layout}
    base["a.bn.running_var"] = np.abs(base["a.bn.running_var"]) + 0.5
    updates = []
    for i in range(k):
        tensors = {n: (v + rng.normal(0, 0.1, v.shape) * (20 if i % 4 == 3 else 1)).astype(np.float32)
                   for n, v in base.items()}  # fmt: skip
        tensors["a.bn.running_var"] = np.abs(tensors["a.bn.running_var"])
        if i % 3 == 2:
            tensors["b"][int(rng.integers(7))] += np.float32(50)
        updates.append((tensors, int(rng.integers(1, 300))))
    config = AggregationConfig()
    spill = tmp_path_factory.mktemp("spill")
    held, report = robust_aggregate(layout, base, lambda: iter(updates), config, group=1)
    old = coordinate_clip.CHUNK_BYTES
    coordinate_clip.CHUNK_BYTES = 8 * k * chunk
    try:
        spilled, spilled_report = robust_aggregate(layout, base, lambda: iter(updates), config, group=1, spill=spill)
    finally:
        coordinate_clip.CHUNK_BYTES = old
    assert all(spilled[n].tobytes() == held[n].tobytes() and spilled[n].shape == held[n].shape for n, _ in layout)
    assert spilled_report == report
    assert list(spill.iterdir()) == []  # the file was never named, and is gone
