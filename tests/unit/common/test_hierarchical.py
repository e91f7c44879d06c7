"""Hierarchical FedAvg (fedper/common/hierarchical.py): the fixed region rule's known answers, the
root's result against the flat FedAvg of the same updates, the same bytes whatever the order the
updates and regions arrive in, and the forwarded sum's encoding refusing what it cannot accept."""

from __future__ import annotations

import contextlib
import hashlib

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from fedper.common import weights
from fedper.common.aggregate import AggregationError, FedAvg
from fedper.common.hierarchical import (
    MalformedSumError,
    RegionalSum,
    combine,
    decode,
    encode,
    region_of,
    regional_sum,
)

LAYOUT = [("conv.weight", (64, 32, 3, 3)), ("bn.bias", (64,)), ("fc.weight", (10, 64))]


def _updates(n: int, seed: int = 0) -> list[tuple[str, dict[str, np.ndarray], int]]:
    rng = np.random.default_rng(seed)
    return [(f"d-{i:016x}", {name: rng.standard_normal(shape).astype(np.float32) for name, shape in LAYOUT},
             int(rng.integers(1, 500))) for i in range(n)]  # fmt: skip


def _digest(tensors: dict[str, np.ndarray]) -> str:
    """The canonical order's key (the server orders by its stored file's sha256)."""
    return hashlib.sha256(weights.encode(tensors)).hexdigest()


def _hierarchical(updates: list[tuple[str, dict[str, np.ndarray], int]], regions: int) -> dict[str, np.ndarray]:
    by_region: dict[int, list[tuple[str, dict[str, np.ndarray], int]]] = {}
    for update in updates:
        by_region.setdefault(region_of(update[0], regions), []).append(update)
    sums = [regional_sum(LAYOUT, r, [(t, n) for _, t, n in sorted(members, key=lambda u: _digest(u[1]))])
            for r, members in by_region.items()]  # fmt: skip
    return combine(LAYOUT, [decode(encode(s), LAYOUT) for s in sums])  # as forwarded over the wire


def _flat(updates: list[tuple[str, dict[str, np.ndarray], int]]) -> dict[str, np.ndarray]:
    fedavg = FedAvg(LAYOUT, group=1)
    for _, tensors, n in sorted(updates, key=lambda u: _digest(u[1])):
        fedavg.add(tensors, n)
    return fedavg.result()


def test_the_region_rule_has_known_answers() -> None:
    """sha256 of the id's UTF-8 bytes, its first 8 bytes big-endian, modulo the regions (the
    digests checked with coreutils' sha256sum)."""
    assert [region_of(d, 10) for d in ("d-0000000000000000", "d-00000000deadbeef", "device-42")] == [4, 3, 2]
    assert region_of("d-0000000000000000", 1000) == 0x48D0BF383B8939AE % 1000 == 574
    assert region_of("anything", 1) == 0
    with pytest.raises(ValueError):
        region_of("d", 0)


def test_one_region_is_the_flat_fedavg_to_the_bit() -> None:
    updates = _updates(40)
    one, flat = _hierarchical(updates, 1), _flat(updates)
    assert all(one[name].tobytes() == flat[name].tobytes() for name, _ in LAYOUT)


@pytest.mark.parametrize("regions", [3, 10, 64])
def test_regions_give_the_flat_mean_within_one_float32_rounding(regions: int) -> None:
    updates = _updates(200, seed=regions)
    tree, flat = _hierarchical(updates, regions), _flat(updates)
    for name, _ in LAYOUT:
        ulps = np.abs(tree[name].view(np.int32).astype(np.int64) - flat[name].view(np.int32).astype(np.int64))
        assert ulps.max() <= 1, name  # only the order of the float64 additions differs


def test_the_same_updates_give_the_same_bytes_in_any_arrival_order() -> None:
    updates = _updates(120, seed=5)
    first = _hierarchical(updates, 7)
    for seed in range(3):
        shuffled = [updates[i] for i in np.random.default_rng(seed).permutation(len(updates))]
        again = _hierarchical(shuffled, 7)
        assert all(again[name].tobytes() == first[name].tobytes() for name, _ in LAYOUT)


def test_a_forwarded_sum_that_cannot_be_accepted_is_refused_with_its_reason() -> None:
    summed = regional_sum(LAYOUT, 2, [(t, n) for _, t, n in _updates(3)])
    assert decode(encode(summed), LAYOUT).weight == summed.weight
    as_float32 = weights.encode(summed.weighted_sum, {"sum_region": "2", "sum_weight": "5", "sum_count": "1"})
    with pytest.raises(weights.WeightsError, match="float64"):
        decode(as_float32, LAYOUT)
    with pytest.raises(weights.WeightsError, match="sum_region, sum_weight, sum_count, base_version"):
        decode(weights.encode(summed.weighted_sum, {"sum_region": "2"}, dtype=np.float64), LAYOUT)
    for spelling in ("-1", "+5", " 5", "5.0", "1e3", "", "٥"):  # one spelling per number
        bad = {"sum_region": "2", "sum_weight": spelling, "sum_count": "1", "base_version": "0"}
        with pytest.raises(weights.WeightsError, match="decimal integers"):
            decode(weights.encode(summed.weighted_sum, bad, dtype=np.float64), LAYOUT)
    with pytest.raises(weights.WeightsError, match="weight and count must be >= 1"):
        decode(encode(RegionalSum(2, summed.weighted_sum, 0, 1)), LAYOUT)
    with pytest.raises(weights.WeightsError, match="count at most weight"):
        decode(encode(RegionalSum(2, summed.weighted_sum, 3, 4)), LAYOUT)
    with pytest.raises(MalformedSumError):
        decode(b"not safetensors", LAYOUT)
    nan = {**summed.weighted_sum, "bn.bias": np.full(64, np.nan)}
    with pytest.raises(weights.WeightsError, match="NaN"):
        decode(encode(RegionalSum(2, nan, 5, 1)), LAYOUT)
    with pytest.raises(weights.WeightsError, match="missing"):
        decode(encode(RegionalSum(2, {"bn.bias": np.zeros(64)}, 5, 1)), LAYOUT)
    with pytest.raises(AggregationError, match="two sums"):
        combine(LAYOUT, [summed, summed])
    with pytest.raises(AggregationError, match="no region"):
        combine(LAYOUT, [])


@settings(max_examples=200, deadline=None)
@given(st.binary(max_size=4096))
def test_any_bytes_decode_to_a_regional_sum_or_a_weights_error(data: bytes) -> None:
    with contextlib.suppress(weights.WeightsError):
        decode(data, LAYOUT)
