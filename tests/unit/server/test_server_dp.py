"""``fedper serve --dp`` (protocol revision 1.5, docs/PRIVACY.md): the task's clip, the server's
check of every upload's clipping, the Poisson draw of the cohort, the noise on the published
base, and epsilon in /v1/status and /metrics. In process, on a test's clock, over the app's
real routes."""

from __future__ import annotations

import math
import tempfile
from pathlib import Path

import numpy as np
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from scipy import stats

from fedper.common import weights
from fedper.common.dp.accountant import epsilon
from fedper.common.dp.clipping import clip_delta, distance
from fedper.common.errors import ConfigError
from fedper.common.manifest import read_manifest
from fedper.common.protocol import ErrorCode, Metadata
from fedper.server.refusals import UnacceptableError
from fedper.server.upload_validation import validate
from tests.support.server_support import (
    FakeClock,
    InProcessServer,
    admin,
    ask,
    enroll,
    round_mode,
    serve_config,
    update_body,
)

pytestmark = pytest.mark.usefixtures("server_secrets")
WINDOW, TIMEOUT = 10, 60
ALPHA = 1e-6  # each statistical test's false-failure rate


def _dp(**options: object) -> dict[str, object]:
    return {"dp": True, "checkin_window": WINDOW, "round_timeout": TIMEOUT, "cohort_size": 4, "target_clients": 4,
            "min_clients": 1, **options}  # fmt: skip


def _base(server: InProcessServer, version: int) -> dict[str, np.ndarray]:
    r = server.http.get(f"/v1/models/{version}/base", headers=admin())
    assert r.status_code == 200, r.text
    return weights.decode(r.content, f"version {version}")


def _drawn(server: InProcessServer, clock: FakeClock, devices: list[dict[str, str]]) -> list[dict]:
    """Every device checks in during the window; after it, each asks again: the drawn get a task."""
    for headers in devices:
        assert ask(server.http, headers).status_code == 204
    clock.now += WINDOW
    tasks = []
    for headers in devices:
        r = ask(server.http, headers)
        tasks.append(r.json() if r.status_code == 200 else None)
    return tasks


def _upload(server: InProcessServer, headers: dict[str, str], number: int, tensors, bit: str | None, version=0):  # type: ignore[no-untyped-def]
    extra = {} if bit is None else {Metadata.UNCLIPPED: bit}
    body = update_body(tensors, base_version=version, extra_metadata=extra)
    return server.http.post(f"/v1/rounds/{number}/updates", content=body,
                            headers={**headers, "Content-Type": "application/octet-stream"})  # fmt: skip


def test_the_task_carries_the_clip_and_the_server_refuses_an_unclipped_delta(server_artifacts, tmp_path):
    clock = FakeClock()
    manifest = read_manifest(server_artifacts)
    names = [n for n, _ in manifest.layout("base")]
    options = _dp(dp_noise_multiplier=0, dp_clip=0.5, dp_clip_learning_rate=0, dp_sampling_probability=1)
    with InProcessServer(server_artifacts, tmp_path / "data", clock=clock, **options) as server:
        devices = [enroll(server.http)[1] for _ in range(2)]
        tasks = _drawn(server, clock, devices)
        assert all(t is not None and t["dp"] == {"clip_norm": 0.5} for t in tasks)
        base = _base(server, 0)
        rng = np.random.default_rng(0)
        trained = {n: (v + 0.01 * rng.standard_normal(v.shape)).astype(np.float32) for n, v in base.items()}
        assert distance(trained, base, names) > 0.5
        refused = _upload(server, devices[0], 1, trained, "0")
        assert refused.status_code == 422 and refused.json()["code"] == ErrorCode.DELTA_ABOVE_CLIP
        assert "above this round's clip_norm 0.5" in refused.json()["message"]
        clipped = clip_delta(trained, base, names, 0.5)
        for bit, code in ((None, ErrorCode.BAD_METADATA), ("2", ErrorCode.BAD_METADATA)):
            r = _upload(server, devices[0], 1, clipped.tensors, bit)
            assert r.status_code == 422 and r.json()["code"] == code, r.text
        assert server.http.get("/v1/status").json()["round"] == 1
        assert _upload(server, devices[0], 1, clipped.tensors, "0").status_code == 202
        assert _upload(server, devices[1], 1, base, "1").status_code == 202  # the base itself: delta 0
        clock.now += TIMEOUT
        server.state.rounds.tick()
        new = _base(server, 1)
        # z = 0: base + (clipped delta + 0) / the expected cohort (4), not / the 2 that reported
        for n in names:
            expected = base[n].astype(np.float64) + (clipped.tensors[n].astype(np.float64) - base[n]) / 4
            np.testing.assert_allclose(new[n], expected, rtol=0, atol=1e-6)


def test_a_round_of_zero_deltas_publishes_noise_of_std_z_c_over_n(server_artifacts, tmp_path):
    """Three rounds in which the one drawn device sends the base back: each new version minus the
    last is the server's noise over the expected cohort alone. Its sample variance over the
    weights (BatchNorm variances are cut at zero) passes a two-sided chi-square test at ALPHA."""
    clock = FakeClock()
    z, clip, cohort = 1.3, 0.7, 4
    options = _dp(dp_noise_multiplier=z, dp_clip=clip, dp_clip_learning_rate=0, dp_sampling_probability=1)
    samples = []
    with InProcessServer(server_artifacts, tmp_path / "data", clock=clock, **options) as server:
        _, headers = enroll(server.http)
        for number in (1, 2, 3):
            base = _base(server, number - 1)
            (task,) = _drawn(server, clock, [headers])
            assert task is not None and task["round"] == number
            assert _upload(server, headers, number, base, "1", task["model_version"]).status_code == 202
            clock.now += TIMEOUT
            server.state.rounds.tick()
            new = _base(server, number)
            samples += [new[n].astype(np.float64) - base[n] for n in base if not n.endswith("running_var")]
    x = np.concatenate([s.ravel() for s in samples])
    std = z * clip / cohort
    statistic = (x.size - 1) * x.var(ddof=1) / std**2
    lo, hi = stats.chi2.ppf(ALPHA / 2, x.size - 1), stats.chi2.ppf(1 - ALPHA / 2, x.size - 1)
    assert lo < statistic < hi, f"sample std {x.std(ddof=1):.6g}, expected {std:.6g}"


def test_the_cohort_is_drawn_on_coins_and_epsilon_is_reported(server_artifacts, tmp_path):
    """40 devices check in, q = 0.3: the number drawn is Binomial(40, 0.3) (two-sided at ALPHA);
    a device that did not check in gets no task; /v1/status and /metrics report epsilon after
    the round as the accountant computes it, and the run stops before --target-epsilon."""
    clock = FakeClock()
    z, q = 1.0, 0.3
    target = (epsilon(z, q, 1, 1e-5) + epsilon(z, q, 2, 1e-5)) / 2
    options = _dp(dp_noise_multiplier=z, dp_sampling_probability=q, dp_delta=1e-5, target_epsilon=target,
                  dp_count_stddev=2.0, enroll_per_minute=100)  # fmt: skip
    with InProcessServer(server_artifacts, tmp_path / "data", clock=clock, **options) as server:
        devices = [enroll(server.http)[1] for _ in range(41)]
        tasks = _drawn(server, clock, devices[:40])
        drawn = sum(t is not None for t in tasks)
        assert stats.binom.cdf(drawn, 40, q) > ALPHA / 2 and stats.binom.sf(drawn - 1, 40, q) > ALPHA / 2
        assert ask(server.http, devices[40]).status_code == 204  # never checked in: no coin, no task
        status = server.http.get("/v1/status").json()
        assert status["privacy"]["rounds"] == 0 and status["privacy"]["epsilon"] == 0
        clock.now += TIMEOUT
        server.state.rounds.tick()  # published even if nobody reported
        status = server.http.get("/v1/status").json()
        spent = status["privacy"]
        assert spent["rounds"] == 1 and spent["epsilon"] == pytest.approx(epsilon(z, q, 1, 1e-5))
        assert spent["delta"] == 1e-5 and spent["sampling_probability"] == q and spent["target_epsilon"] == target
        assert spent["clip_norm"] != 1.0  # adaptive: moved by the noised count
        assert status["state"] == "finished"  # a second round would exceed the target
        assert server.metric("fedper_dp_epsilon") == pytest.approx(spent["epsilon"])
        assert server.metric("fedper_dp_rounds_total") == 1


@settings(max_examples=25, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(seed=st.integers(0, 2**32 - 1), ratio=st.floats(0.5, 2.0))
def test_any_delta_is_accepted_exactly_when_its_norm_is_within_the_clip(server_artifacts, seed, ratio):
    """Generated deltas around the clip, checked by the upload's validation: accepted iff the
    contract's norm of what arrived is within the clip, else 422 delta_above_clip."""
    manifest = read_manifest(server_artifacts)
    names = [n for n, _ in manifest.layout("base")]
    rng = np.random.default_rng(seed)
    base = {n: rng.standard_normal(s).astype(np.float32) for n, s in manifest.layout("base")}
    base = {n: np.abs(v) if n.endswith("running_var") else v for n, v in base.items()}
    direction = {n: rng.standard_normal(v.shape) for n, v in base.items()}
    norm = math.sqrt(sum(float(np.sum(d * d)) for d in direction.values()))
    clip = 0.3
    sent = {n: (base[n] + direction[n] * (ratio * clip / norm)).astype(np.float32) for n in names}
    sent = {n: np.abs(v) if n.endswith("running_var") else v for n, v in sent.items()}
    with tempfile.TemporaryDirectory() as tmp:
        body = Path(tmp) / "u.safetensors"
        body.write_bytes(update_body(sent, extra_metadata={Metadata.UNCLIPPED: "0"}))
        within = distance(sent, base, names) <= clip
        try:
            upload = validate(
                body, manifest, 100_000, round_mode(clip), {n: v.astype(np.float64) for n, v in base.items()}
            )
        except UnacceptableError as exc:
            assert not within and exc.code == ErrorCode.DELTA_ABOVE_CLIP
        else:
            assert within and upload.unclipped is False


def test_dp_needs_a_checkin_window_a_deadline_and_a_mean(server_artifacts, tmp_path):
    for options, message in [
        ({"dp": True, "round_timeout": 60}, "--checkin-window > 0"),
        ({**_dp(), "aggregate": "median"}, "--aggregate median"),
        ({**_dp(), "dp_sampling_probability": 0}, "--dp-sampling-probability"),
        ({**_dp(), "cohort_size": 3}, "--dp-count-stddev"),  # 0.05 x 3 < z/2
    ]:
        with pytest.raises(ConfigError, match=message):
            serve_config(server_artifacts, tmp_path / "d", **options)


def test_a_non_dp_round_refuses_the_dp_bit(server_artifacts, tmp_path):
    with InProcessServer(server_artifacts, tmp_path / "data", target_clients=2) as server:
        _, headers = enroll(server.http)
        task = ask(server.http, headers).json()
        assert task["dp"] is None
        r = _upload(server, headers, 1, _base(server, 0), "1")
        assert r.status_code == 422 and r.json()["code"] == ErrorCode.BAD_METADATA


@settings(max_examples=40, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(bit=st.one_of(st.none(), st.text(max_size=8), st.sampled_from(["0", "1", " 1", "1.0", "true", "01"])))
def test_the_dp_bit_is_exactly_0_or_1_in_a_dp_round_and_absent_elsewhere(server_artifacts, bit):
    manifest = read_manifest(server_artifacts)
    base = {n: np.ones(s, np.float32) for n, s in manifest.layout("base")}
    with tempfile.TemporaryDirectory() as tmp:
        body = Path(tmp) / "u.safetensors"
        body.write_bytes(update_body(base, extra_metadata={} if bit is None else {Metadata.UNCLIPPED: bit}))
        round_base = {n: v.astype(np.float64) for n, v in base.items()}
        for clip in (0.5, None):  # a DP round, then any other
            allowed = bit in ("0", "1") if clip is not None else bit is None
            try:
                upload = validate(body, manifest, 100_000, round_mode(clip), round_base)
            except UnacceptableError as exc:
                assert not allowed and exc.code == ErrorCode.BAD_METADATA
            else:
                assert allowed and upload.unclipped == (None if clip is None else bit == "1")


def test_round_one_waits_for_start_devices_before_its_clock_runs(server_artifacts, tmp_path):
    """--start-devices 3: with two devices enrolled the round has no deadline and every ask is a
    check-in; the third enrollment starts its window and deadline; then it runs as any DP round."""
    clock = FakeClock()
    options = _dp(dp_noise_multiplier=0, dp_clip_learning_rate=0, start_devices=3, dp_sampling_probability=1)
    with InProcessServer(server_artifacts, tmp_path / "data", clock=clock, **options) as server:
        early = [enroll(server.http)[1] for _ in range(2)]
        clock.now += 10 * TIMEOUT  # a day without devices burns no round
        server.state.rounds.tick()
        assert all(ask(server.http, h).status_code == 204 for h in early)
        status = server.http.get("/v1/status").json()
        assert status["round"] == 1 and status["privacy"]["rounds"] == 0
        assert server.state.db.rounds.get(1).deadline is None  # type: ignore[union-attr]
        late = enroll(server.http)[1]
        started = server.state.db.rounds.get(1)
        assert started is not None and started.opened_at == clock.now and started.deadline == clock.now + TIMEOUT
        tasks = _drawn(server, clock, [*early, late])
        assert all(t is not None and t["round"] == 1 for t in tasks)
        clock.now += TIMEOUT
        server.state.rounds.tick()
        assert server.http.get("/v1/status").json()["privacy"]["rounds"] == 1


def test_a_dp_round_whose_stored_update_cannot_be_loaded_defers_then_closes_without_it(
    server_artifacts, tmp_path, caplog
):
    """As without DP: a stored file the loader refuses at close is quarantined and the close is
    decided again; a DP round then closes at the next tick (its deadline has passed) without it."""
    clock = FakeClock()
    data = tmp_path / "data"
    options = _dp(dp_noise_multiplier=0, dp_clip_learning_rate=0, dp_sampling_probability=1)
    with InProcessServer(server_artifacts, data, clock=clock, **options) as server:
        devices = [enroll(server.http) for _ in range(2)]
        _drawn(server, clock, [h for _, h in devices])
        base = _base(server, 0)
        for _, headers in devices:
            assert _upload(server, headers, 1, base, "1").status_code == 202
        (data / "updates" / "r1" / f"{devices[0][0]}.safetensors").write_bytes(b"\x08" + b"\x00" * 7 + b"{}      ")
        clock.now += TIMEOUT
        with caplog.at_level("INFO", logger="fedper.server"):
            server.state.rounds.tick()  # the close finds one update gone: deferred, nothing published
        assert server.http.get("/v1/status").json()["round"] == 1
        assert '"event": "round_close_deferred", "round": 1, "dropped": 1' in caplog.text
        assert "round_close_failed" not in caplog.text
        assert [p.name.split(".")[0] for p in (data / "quarantine").iterdir()] == [f"r1-{devices[0][0]}"]
        server.state.rounds.tick()
        status = server.http.get("/v1/status").json()
        assert status["round"] == 2 and status["privacy"]["rounds"] == 1
