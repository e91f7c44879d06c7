"""DP-FedAvg against sybils and operators (issue 49): many devices drawn together move the base by
no more than the sampling the accountant assumes allows, a hostile count cannot zero or overflow
the adaptive clip, a stored clip that is not a positive number is refused, and a rollback never
spends past --target-epsilon. In process, on a test's clock, over the app's real routes."""

from __future__ import annotations

import math
from pathlib import Path

import numpy as np
import pytest

from fedper.common import weights
from fedper.common.dp.accountant import largest_cohort
from fedper.common.dp.config import DPConfig
from fedper.common.dp.mechanism import CLIP_RANGE, noised_mean
from fedper.common.manifest import read_manifest
from fedper.common.protocol import ErrorCode, Metadata
from tests.support.server_support import FakeClock, InProcessServer, admin, ask, enroll, round_info, update_body

pytestmark = pytest.mark.usefixtures("server_secrets")
WINDOW, TIMEOUT = 10, 60


def _base(server: InProcessServer, version: int) -> dict[str, np.ndarray]:
    r = server.http.get(f"/v1/models/{version}/base", headers=admin())
    assert r.status_code == 200, r.text
    return weights.decode(r.content, f"version {version}")


def _flat(tensors: dict[str, np.ndarray], names: list[str]) -> np.ndarray:
    return np.concatenate([tensors[n].astype(np.float64).ravel() for n in names])


def _with_delta(base: dict[str, np.ndarray], names: list[str], delta: np.ndarray) -> dict[str, np.ndarray]:
    out, at = {}, 0
    for n in names:
        size = base[n].size
        out[n] = (base[n].astype(np.float64) + delta[at : at + size].reshape(base[n].shape)).astype(np.float32)
        at += size
    return out


def test_sybils_drawn_beside_honest_devices_move_the_base_no_more_than_the_sampling_allows(
    server_artifacts: Path, tmp_path: Path
) -> None:
    """The finding: 40 sybils checking in beside 10 honest devices (q = 1, expected cohort 10)
    moved the base 3.98 along their direction, against an honest step of 0.52. The sum is now
    projected onto B x C with B = 10, what the assumed sampling draws: the step is at most C."""
    clock = FakeClock()
    names = [n for n, _ in read_manifest(server_artifacts).layout("base")]
    clip = 0.5
    options = {"dp": True, "checkin_window": WINDOW, "round_timeout": TIMEOUT, "cohort_size": 10, "target_clients": 10,
               "min_clients": 1, "dp_noise_multiplier": 0.0, "dp_clip": clip, "dp_clip_learning_rate": 0.0,
               "dp_sampling_probability": 1.0, "enroll_per_minute": 1000}  # fmt: skip
    with InProcessServer(server_artifacts, tmp_path / "data", clock=clock, **options) as server:
        devices = [enroll(server.http)[1] for _ in range(50)]
        for headers in devices:
            assert ask(server.http, headers).status_code == 204
        clock.now += WINDOW
        assert all(ask(server.http, h).status_code == 200 for h in devices)  # q = 1: everyone drawn
        base = _base(server, 0)
        flat = _flat(base, names)
        rng = np.random.default_rng(1)
        direction = rng.normal(size=flat.size)
        direction /= np.linalg.norm(direction)
        for i, headers in enumerate(devices):
            if i < 10:  # honest: 0.45 C in a direction of its own
                delta = rng.normal(size=flat.size)
                delta *= 0.45 * clip / np.linalg.norm(delta)
            else:  # sybils: all of the clip along one direction
                delta = 0.999 * clip * direction
            tensors = _with_delta(base, names, delta)
            body = update_body(tensors, base_version=0, extra_metadata={Metadata.UNCLIPPED: "1"})
            r = server.http.post("/v1/rounds/1/updates", content=body,
                                 headers={**headers, "Content-Type": "application/octet-stream"})  # fmt: skip
            assert r.status_code == 202, r.text
        clock.now += TIMEOUT
        assert server.state is not None
        server.state.rounds.tick()
        assert round_info(server.http, 1)["state"] == "closed"
        step = _flat(_base(server, 1), names) - flat
    along = float(step @ direction)
    print(f"step along the sybils' direction {along:.3f}, step norm {np.linalg.norm(step):.3f}, clip {clip}")
    assert np.linalg.norm(step) <= clip * (1 + 1e-5)  # B x C / expected cohort = C; without the projection 40 C / 10
    assert along > 0.9 * clip  # they still got what B devices can do (what the bound allows, no more)


def test_the_projection_never_binds_in_a_run_of_the_sampling_it_assumes() -> None:
    """B is the 1 - 1e-9 quantile of the Poisson draw's count: an honest round's sum (at most B
    devices of norm C) is left as it is, to the bit."""
    assert largest_cohort(1000, 0.1) == 161 and largest_cohort(10, 1.0) == 10
    layout = [("w", (40,))]
    rng = np.random.default_rng(2)
    config = DPConfig(dp=True, dp_noise_multiplier=0.0, dp_clip_learning_rate=0.0)
    base = {"w": np.zeros(40, np.float32)}
    sums = {"w": rng.normal(size=40) * 0.3}
    plain, report = noised_mean(layout, base, sums, 5, 0.0, 1.0, config, 5.0, rng, max_devices=5)
    assert report.sum_projected is None and "sum_projected" not in report.to_dict()
    unbounded, _ = noised_mean(layout, base, sums, 5, 0.0, 1.0, config, 5.0, rng)
    assert np.array_equal(plain["w"], unbounded["w"])
    big = {"w": np.ones(40) * 10}
    projected, report = noised_mean(layout, base, big, 5, 0.0, 1.0, config, 5.0, rng, max_devices=2)
    assert report.sum_projected == pytest.approx(math.sqrt(40) * 10)
    assert np.linalg.norm(projected["w"].astype(np.float64) * 5) == pytest.approx(2.0, rel=1e-6)


@pytest.mark.parametrize("count", [1e12, -1e12, 2**31 - 1])
def test_a_hostile_count_moves_the_clip_one_bounded_step(count: float) -> None:
    """The finding: a count of 2^31 - 1 took the next clip to 0.0 (and a larger one overflowed
    exp). The noised share is held to [-1, 2] and the clip to 2^+-20 times the first."""
    config = DPConfig(dp=True, dp_noise_multiplier=0.0, dp_clip=1.0)
    layout = [("w", (3,))]
    rng = np.random.default_rng(0)
    _, report = noised_mean(layout, {"w": np.zeros(3, np.float32)}, {"w": np.zeros(3)}, 6, count, 1.0, config, 6.0,
                            rng)  # fmt: skip
    assert math.isfinite(report.next_clip) and report.next_clip > 0
    assert math.exp(-0.2 * 1.5) - 1e-12 <= report.next_clip <= math.exp(0.2 * 1.5) + 1e-12  # share held to [-1, 2]
    clip = 1.0
    for _ in range(300):  # round after round at the edge of the share: the clip stops at its bound
        _, report = noised_mean(layout, {"w": np.zeros(3, np.float32)}, {"w": np.zeros(3)}, 6, -1e12, clip, config,
                                6.0, rng)  # fmt: skip
        clip = report.next_clip
    assert clip == pytest.approx(CLIP_RANGE)


def test_a_rollback_never_spends_past_the_target_epsilon(server_artifacts: Path, tmp_path: Path) -> None:
    """The finding: after --target-epsilon finished a run at epsilon 4.73 (target 5.90), a
    rollback let the next round publish at 7.08. Now the rollback is refused and says why."""
    clock = FakeClock()
    options = {"dp": True, "checkin_window": WINDOW, "round_timeout": TIMEOUT, "cohort_size": 2, "target_clients": 2,
               "min_clients": 1, "dp_noise_multiplier": 1.0, "dp_count_stddev": 1.0, "dp_sampling_probability": 1.0,
               "target_epsilon": 6.0, "dp_delta": 1e-5}  # fmt: skip
    with InProcessServer(server_artifacts, tmp_path / "data", clock=clock, **options) as server:
        devices = [enroll(server.http)[1] for _ in range(2)]
        assert server.state is not None
        rounds = 0
        while server.http.get("/v1/status").json()["state"] == "running":
            for headers in devices:
                ask(server.http, headers)
            clock.now += TIMEOUT
            server.state.rounds.tick()  # noise alone: every DP round is published
            rounds += 1
            assert rounds < 20
        spent = server.http.get("/v1/status").json()["privacy"]
        assert spent["epsilon"] <= 6.0
        r = server.http.post("/v1/admin/rollback/0", headers=admin())
        assert r.status_code == 409 and r.json()["code"] == ErrorCode.PRIVACY_BUDGET_SPENT, r.text
        assert "one more would exceed --target-epsilon 6.0" in r.json()["message"]
        after = server.http.get("/v1/status").json()
        assert after["state"] == "finished" and after["privacy"] == spent
