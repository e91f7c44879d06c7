"""Issue 28's findings 1-3, in process (real SQLite, real files): one hostile device among honest
ones cannot move the base far, cannot buy the round with a claimed sample count, and cannot send
a negative BatchNorm variance. Each test also runs the same round with the defences off, to show
what the attack did to plain FedAvg."""

from __future__ import annotations

import dataclasses
from pathlib import Path

import numpy as np
import pytest

from fedper.common import weights
from fedper.common.manifest import read_manifest
from fedper.common.robust_aggregate import AggregationConfig, delta_norm, group_norms, norm_group
from fedper.server.config import ServerConfig
from fedper.server.errors import answer
from fedper.server.refusals import UnacceptableError
from fedper.server.state import open_state
from fedper.server.upload_validation import Upload, validate
from tests.support.server_support import round_mode, update_body

PLAIN = AggregationConfig(clip_factor=0, weight_cap=0, coordinate_clip=0)
Tensors = dict[str, np.ndarray]

pytestmark = pytest.mark.usefixtures("server_secrets")


def _v0(artifacts: Path) -> Tensors:
    return weights.load(artifacts / "base.safetensors")


def _honest(v0: Tensors, seed: int, direction: Tensors | None = None) -> Tensors:
    """v0 plus a small step (along ``direction`` if given) and noise; variances stay positive."""
    rng = np.random.default_rng(seed)
    out = {}
    for name, v in v0.items():
        step = 0.01 * rng.standard_normal(v.shape) + (0.02 * direction[name] if direction is not None else 0)
        out[name] = (np.abs(v + step) if name.endswith(".running_var") else v + step).astype(np.float32)
    return out


def _round(artifacts: Path, data: Path, updates: list[tuple[Tensors, int]], aggregation: AggregationConfig) -> Tensors:
    """One round of these updates (one device each) on a fresh server; the base it publishes."""
    config = ServerConfig(artifacts=artifacts, data_dir=data, target_clients=len(updates), min_clients=1,
                          round_timeout=0, aggregation=aggregation)  # fmt: skip
    state = open_state(config)
    try:
        for i, (tensors, n) in enumerate(updates):
            state.db.devices.add(f"d-{i}", f"hash-{i}", "test")
            state.rounds.assign(1, f"d-{i}")
            state.rounds.commit(state.rounds.stage(f"d-{i}", 1, Upload(tensors, n, 0, {"accuracy": 0.5})))
        assert state.rounds.snapshot.model_version == 1
        v1 = weights.load(data / "models" / "v1.safetensors")
        # The next round goes on: an honest step from v1 is accepted.
        state.rounds.assign(2, "d-0")
        staged = state.rounds.stage("d-0", 2, Upload(_honest(v1, 99), 100, 1, {"accuracy": 0.5}))
        assert state.rounds.commit(staged) == 1
        return v1
    finally:
        state.db.close()


@pytest.mark.parametrize("attack", ["plus 1e30", "times -1000"])
def test_one_huge_update_claiming_the_largest_count_cannot_move_the_base(server_artifacts, tmp_path, attack):
    """Finding 1: 4 honest updates and base + 1e30 (or -1000 x base) claiming 100,000 examples."""
    v0 = _v0(server_artifacts)
    honest = [(_honest(v0, seed), 100) for seed in range(4)]
    hostile = {n: (v + np.float32(1e30) if attack == "plus 1e30" else v * np.float32(-1000)) for n, v in v0.items()}
    if attack == "times -1000":  # a variance below zero is refused on upload (finding 3); keep it positive
        hostile = {n: (np.abs(v) if n.endswith(".running_var") else v) for n, v in hostile.items()}
    updates = [*honest, (hostile, 100_000)]
    plain = _round(server_artifacts, tmp_path / "plain", updates, PLAIN)
    assert delta_norm(plain, v0) > 100 * max(delta_norm(t, v0) for t, _ in honest)  # plain FedAvg is ruined
    v1 = _round(server_artifacts, tmp_path / "robust", updates, AggregationConfig())
    assert all(np.isfinite(v).all() for v in v1.values())
    for group, norm in group_norms(v1, v0).items():  # each group within 3x the largest honest one
        assert norm <= 3 * max(group_norms(t, v0)[group] for t, _ in honest) * (1 + 1e-6)


def test_the_claimed_count_cannot_buy_the_round(server_artifacts, tmp_path):
    """Finding 2: one device in five sends a step against the honest direction, within any norm
    bound, claiming 100,000 examples; the honest devices claim 100."""
    v0 = _v0(server_artifacts)
    rng = np.random.default_rng(5)
    direction = {n: rng.standard_normal(v.shape).astype(np.float32) for n, v in v0.items()}
    direction = {n: (np.zeros_like(d) if n.endswith(".running_var") else d) for n, d in direction.items()}
    honest = [(_honest(v0, seed, direction), 100) for seed in range(4)]
    ascent = {n: (v - 0.02 * direction[n]).astype(np.float32) for n, v in v0.items()}  # as far, the other way
    updates = [*honest, (ascent, 100_000)]

    def along(v1: Tensors) -> float:
        return sum(float(np.dot((v1[n] - v0[n]).ravel(), direction[n].ravel())) for n in v0)

    assert along(_round(server_artifacts, tmp_path / "plain", updates, PLAIN)) < 0  # the attacker wins
    no_cap = dataclasses.replace(AggregationConfig(), weight_cap=0, coordinate_clip=0)
    assert along(_round(server_artifacts, tmp_path / "clip-only", updates, no_cap)) < 0  # the norm clip alone: too
    coordinates = dataclasses.replace(AggregationConfig(), weight_cap=0)  # the coordinate clip alone holds
    assert along(_round(server_artifacts, tmp_path / "coordinates", updates, coordinates)) > 0
    assert along(_round(server_artifacts, tmp_path / "robust", updates, AggregationConfig())) > 0


def test_a_negative_batchnorm_variance_is_refused_on_upload(server_artifacts, tmp_path):
    """Finding 3: one channel of a BatchNorm running variance at -40 (a small L2 distance)."""
    manifest = read_manifest(server_artifacts)
    v0 = _v0(server_artifacts)
    poisoned = dict(v0)
    poisoned["blocks.0.dw.bn.running_var"] = v0["blocks.0.dw.bn.running_var"].copy()
    poisoned["blocks.0.dw.bn.running_var"][0] = -40
    body = tmp_path / "update.safetensors"
    body.write_bytes(update_body(poisoned, 100))
    with pytest.raises(UnacceptableError) as refused:
        validate(body, manifest, 100_000, round_mode())
    assert (answer(refused.value).status, refused.value.code) == (422, "update_out_of_bounds")
    assert "blocks.0.dw.bn.running_var" in refused.value.message and ">= 0" in refused.value.message
    body.write_bytes(update_body(v0, 100))  # the same update with the variance as it was passes
    assert validate(body, manifest, 100_000, round_mode()).num_samples == 100


def _farthest(a: Tensors, b: Tensors) -> float:
    return max(float(np.max(np.abs(a[n].astype(np.float64) - b[n]))) for n in b)


def test_centered_clipping_on_the_server_starts_from_the_step_that_made_the_round_base(server_artifacts, tmp_path):
    """The server clips round 2 around v1 - v0, as the simulation does (its last published step);
    round 1 has no step before it and clips around v0. /metrics counts what was clipped."""
    from fastapi.testclient import TestClient

    from fedper.common.robust_aggregate import robust_aggregate
    from fedper.server.app import create_app

    aggregation = AggregationConfig(aggregate="centered-clip", clip_factor=1.0, coordinate_clip=0)
    config = ServerConfig(artifacts=server_artifacts, data_dir=tmp_path, target_clients=4, min_clients=1,
                          round_timeout=0, aggregation=aggregation)  # fmt: skip
    v0 = _v0(server_artifacts)
    state = open_state(config)
    layout = [(n, tuple(v.shape)) for n, v in sorted(v0.items())]
    try:
        published = [v0]
        for rnd in (1, 2):
            base = published[-1]
            updates = [(_honest(base, 10 * rnd + i), 100 + i) for i in range(3)]
            far = _honest(base, 10 * rnd + 3)
            updates.append(({n: (np.abs(v) if n.endswith(".running_var") else v) for n, v in
                             ((n, base[n] + 50 * (far[n] - base[n])) for n in base)}, 100))  # fmt: skip
            for i, (tensors, n) in enumerate(updates):
                device = f"d-{rnd}-{i}"
                state.db.devices.add(device, f"hash-{device}", "test")
                state.rounds.assign(rnd, device)
                state.rounds.commit(state.rounds.stage(device, rnd, Upload(tensors, n, rnd - 1, {"accuracy": 0.5})))
            published.append(weights.load(tmp_path / "models" / f"v{rnd}.safetensors"))
            center = None if rnd == 1 else {n: published[1][n].astype(np.float64) - v0[n] for n in v0}
            b64 = {n: v.astype(np.float64) for n, v in base.items()}
            expected, _ = robust_aggregate(layout, b64, lambda u=updates: iter(u), aggregation, 1, center)
            # The server folds its stored files in the order of their sha256: the last bit may differ.
            assert _farthest(published[-1], expected) < 1e-8, rnd
            if center is not None:
                from_base, _ = robust_aggregate(layout, b64, lambda u=updates: iter(u), aggregation, 1, None)
                assert _farthest(published[-1], from_base) > 1e-5  # not where clipping around the base goes
        with TestClient(create_app(config, state=state)) as client:
            text = client.get("/metrics").text
        assert "fedper_coordinates_clipped_total 0.0" in text and "fedper_updates_clipped_total" in text
    finally:
        state.db.close()


def _in_bound_round(artifacts: Path, data: Path, attack: str, aggregation: AggregationConfig) -> dict[str, float]:
    """Issue 50's findings, on the server: 9 honest devices whose updates share a small step
    under much larger noise (non-IID training), and one hostile device that sends ``attack``
    at 2.99x the honest median distance per group, claiming an honest count, so that neither
    the norm bound nor the weight cap fires. What the published step did, against the honest
    step (the honest devices' mean): its progress along it, its drift off it (in honest
    steps), and how far the attacked weight and BatchNorm mean moved (in honest moves)."""
    v0 = _v0(artifacts)
    rng = np.random.default_rng(50)
    direction = {n: rng.standard_normal(v.shape) for n, v in v0.items()}
    honest = []
    for seed in range(9):
        noise = np.random.default_rng(seed)
        honest.append({n: v + 0.005 * direction[n] + 0.04 * noise.standard_normal(v.shape) for n, v in v0.items()})
    honest = [{n: (np.abs(v) if n.endswith(".running_var") else v).astype(np.float32) for n, v in h.items()}
              for h in honest]  # fmt: skip
    step = {n: np.mean([h[n].astype(np.float64) - v0[n] for h in honest], axis=0) for n in v0}
    groups: dict[str, list[str]] = {}
    for name in sorted(v0):
        groups.setdefault(norm_group(name), []).append(name)
    weight = next(n for n in groups["parameters"] if v0[n].size > 1)
    bn_mean = next(n for n in groups["batchnorm_statistics"] if n.endswith(".running_mean"))
    hostile = {n: v.astype(np.float64) for n, v in v0.items()}
    for group, names in groups.items():
        budget = 2.99 * sorted(group_norms(h, v0)[group] for h in honest)[4]  # inside the 3x bound

        def unit(vectors: dict[str, np.ndarray], names: list[str] = names) -> dict[str, np.ndarray]:
            size = np.sqrt(sum(float(np.sum(vectors[n] ** 2)) for n in names))
            return {n: vectors[n] / size for n in names}

        if attack == "sign flip":
            hostile.update({n: v0[n] - budget * u for n, u in unit(step).items()})
        elif attack == "orthogonal drift":
            r = np.random.default_rng(7)
            other = {n: r.standard_normal(v0[n].shape) for n in names}
            along = sum(float(np.sum(other[n] * step[n])) for n in names) / sum(
                float(np.sum(step[n] ** 2)) for n in names
            )
            hostile.update(
                {n: v0[n] + budget * u for n, u in unit({n: other[n] - along * step[n] for n in names}).items()}
            )
        else:
            target = weight if attack == "one weight" else bn_mean
            if target in names:
                hostile[target].reshape(-1)[0] += budget
            else:
                hostile.update({n: honest[0][n] for n in names})
    hostile = {n: (np.abs(v) if n.endswith(".running_var") else v).astype(np.float32) for n, v in hostile.items()}
    v1 = _round(artifacts, data, [*((h, 100) for h in honest), (hostile, 100)], aggregation)
    published = {n: v1[n].astype(np.float64) - v0[n] for n in v0}
    squared = sum(float(np.sum(s**2)) for s in step.values())
    progress = sum(float(np.sum(published[n] * step[n])) for n in v0) / squared
    drift = np.sqrt(sum(float(np.sum((published[n] - progress * step[n]) ** 2)) for n in v0) / squared)
    typical = {t: float(np.sqrt(np.mean(step[t] ** 2))) for t in (weight, bn_mean)}  # honest moves in its tensor
    moved = {t: abs(float(published[t].reshape(-1)[0])) / typical[t] for t in (weight, bn_mean)}
    return {"progress": progress, "drift": float(drift), "weight": moved[weight], "bn mean": moved[bn_mean]}


BEFORE = AggregationConfig(coordinate_clip=0)  # the defaults before revision 1.8


@pytest.mark.parametrize("attack", ["sign flip", "orthogonal drift", "one weight", "one BatchNorm mean"])
def test_one_device_inside_the_bounds_cannot_reverse_steer_or_single_out_a_weight(server_artifacts, tmp_path, attack):
    """Issue 50: what one hostile device in ten did to the published step under the defaults
    before revision 1.8 (first line of each case), and what the default holds it to now."""
    before = _in_bound_round(server_artifacts, tmp_path / "before", attack, BEFORE)
    now = _in_bound_round(server_artifacts, tmp_path / "now", attack, AggregationConfig())
    if attack == "sign flip":
        assert before["progress"] < 0.2  # the round's progress all but undone
        assert now["progress"] > 0.45
    elif attack == "orthogonal drift":
        assert before["drift"] > 0.75  # three quarters of an honest step, off it, every round
        assert now["drift"] < 0.75 * before["drift"]
    elif attack == "one weight":
        assert before["weight"] > 100  # one weight moved >100x its tensor's honest moves
        assert now["weight"] < 5
    else:
        assert before["bn mean"] > 20  # a running mean moved >20x its tensor's honest moves
        assert now["bn mean"] < 5
