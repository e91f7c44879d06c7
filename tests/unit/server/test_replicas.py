"""Several server processes on one PostgreSQL database and one data directory (docs/SCALING.md),
as two :class:`ServerState` in this process with one injected clock: a round is closed by one of
them only, an update is recorded into the round its closer aggregates or refused, a closer that
lost its lease publishes nothing, and the limits, attestation nonces and tallies hold across
them. (Real processes behind a load balancer, killed with -9: tests/integration/test_replicas.py.)"""

from __future__ import annotations

import logging
from pathlib import Path
from typing import Any

import numpy as np
import pytest

from fedper.common.manifest import read_manifest
from fedper.server.attestation import NONCE_SECONDS, SharedNonces
from fedper.server.rate_limit import failed_attempt
from fedper.server.refusals import RateLimitedError, RoundClosingError, RoundNotOpenError, UnauthorizedError
from fedper.server.round_context import FencedError
from fedper.server.rounds import RoundManager
from fedper.server.state import ServerState, open_state
from fedper.server.upload_validation import Upload
from tests.support.server_support import FakeClock, base_like, serve_config

pytestmark = pytest.mark.usefixtures("server_secrets")


def _open(artifacts: Path, data: Path, clock: FakeClock, database: str = "", **options: object) -> ServerState:
    config = serve_config(artifacts, data, database=database, **{"round_timeout": 0, **options})
    return open_state(config, clock)


def _upload(artifacts: Path, seed: int, version: int = 0) -> Upload:
    return Upload(base_like(read_manifest(artifacts), seed=seed), 10 + seed, version, {"accuracy": 0.5})


def _send(rounds: RoundManager, device: str, number: int, upload: Upload) -> int:
    """As a device does: ask for the round's task (a cohort slot), then upload."""
    rounds.assign(number, device)
    staged = rounds.stage(device, number, upload)
    try:
        return rounds.commit(staged)
    finally:
        rounds.discard(staged)


def _devices(state: ServerState, count: int) -> list[str]:
    ids = [f"d-{i:04d}" for i in range(count)]
    for i in ids:
        state.db.devices.add(i, f"hash-{i}", "test")
    return ids


@pytest.fixture
def pair(server_artifacts: Path, tmp_path: Path, postgres_cluster: Any) -> Any:
    """Two processes' states on one database and data directory, and their clock."""
    url, clock, opened = postgres_cluster.database(), FakeClock(), []

    def make(**options: object) -> tuple[ServerState, ServerState, FakeClock]:
        for _ in range(2):
            opened.append(_open(server_artifacts, tmp_path / "data", clock, url, **options))
        return opened[0], opened[1], clock

    yield make
    for state in opened:
        state.db.close()


def test_updates_through_either_process_close_the_round_once_into_what_one_server_publishes(
    pair: Any, server_artifacts: Path, tmp_path: Path
) -> None:
    a, b, _ = pair(target_clients=4, min_clients=1)
    devices = _devices(a, 8)
    for i, device in enumerate(devices[:4]):
        _send((a, b)[i % 2].rounds, device, 1, _upload(server_artifacts, i))
    for state in (a, b):
        state.rounds.tick()
    assert a.db.versions.latest() == 1 and a.db.rounds.count_closed() == 1
    assert a.rounds.snapshot.round == b.rounds.snapshot.round == 2  # b read a's close on its tick
    # One server on SQLite, the same updates: the same bytes.
    one = _open(server_artifacts, tmp_path / "one", FakeClock(), target_clients=4, min_clients=1)
    for i, device in enumerate(_devices(one, 4)):
        _send(one.rounds, device, 1, _upload(server_artifacts, i))
    published = [s.rounds.version_file(1) for s in (a, one)]
    assert published[0] is not None and published[1] is not None
    assert published[0][0].read_bytes() == published[1][0].read_bytes()
    one.db.close()
    # Round 2 goes on through both.
    for i, device in enumerate(devices[4:]):
        _send((b, a)[i % 2].rounds, device, 2, _upload(server_artifacts, 10 + i, version=1))
    assert b.db.versions.latest() == 2


def test_an_update_for_a_round_another_process_is_closing_is_refused_and_not_recorded(
    pair: Any, server_artifacts: Path
) -> None:
    a, b, _ = pair(target_clients=10, min_clients=1, round_timeout=100)
    first, late = _devices(a, 2)
    _send(a.rounds, first, 1, _upload(server_artifacts, 0))
    b.rounds.assign(1, late)
    staged = b.rounds.stage(late, 1, _upload(server_artifacts, 1))  # checked and written before the seal
    token = a.rounds.ctx.seal(1)
    assert token == 1 and b.rounds.ctx.seal(1) is None  # one closer
    with pytest.raises(RoundClosingError) as refused:
        b.rounds.commit(staged)
    assert isinstance(refused.value, RoundNotOpenError)  # 409 round_not_open on the wire
    assert not a.db.rounds.has_update(1, late) and a.db.rounds.count_updates(1) == 1
    b.rounds.discard(staged)


def test_a_closer_that_lost_its_lease_publishes_nothing_and_the_one_that_took_over_publishes(
    pair: Any, server_artifacts: Path, monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture
) -> None:
    a, b, clock = pair(target_clients=10, min_clients=1, round_timeout=100, close_lease=30)
    for i, device in enumerate(_devices(a, 3)):
        _send(a.rounds, device, 1, _upload(server_artifacts, i))
    clock.now += 101  # the deadline passed: a closes round 1 on its tick ...
    staged = a.rounds.ctx.models.staged

    def stalled(tensors: Any) -> Any:
        """... and stalls with the aggregate made, longer than its lease: b takes the round over."""
        clock.now += 31
        b.rounds.tick()
        return staged(tensors)

    monkeypatch.setattr(a.rounds.ctx.models, "staged", stalled)
    with caplog.at_level(logging.WARNING, logger="fedper.server"):
        a.rounds.tick()
    assert "round_close_fenced" in caplog.text
    assert a.db.versions.latest() == 1 and a.db.rounds.count_closed() == 1
    closed = a.db.rounds.get(1)
    assert closed is not None and closed.state == "closed" and closed.result_version == 1
    found = b.rounds.version_file(1)
    assert found is not None
    from fedper.common.manifest import sha256_file

    assert sha256_file(found[0]) == found[1]  # b's file, as b recorded it: a never replaced it
    assert sorted(p.name for p in (a.config.data_dir / "models").iterdir()) == ["v0.safetensors", "v1.safetensors"]
    assert list((a.config.data_dir / "tmp").iterdir()) == []
    with pytest.raises(FencedError), a.db.transaction():  # and a stale token can end nothing
        a.rounds.ctx.fence(1, 1)


def test_a_dead_closers_seal_is_taken_over_once_its_lease_runs_out(pair: Any, server_artifacts: Path) -> None:
    a, b, clock = pair(target_clients=2, min_clients=1, close_lease=30)
    d1, d2 = _devices(a, 2)
    _send(a.rounds, d1, 1, _upload(server_artifacts, 0))
    assert a.rounds.ctx.seal(1) == 1  # a seals round 1, then dies before closing it
    b.rounds.assign(1, d2)
    with pytest.raises(RoundNotOpenError):
        b.rounds.commit(b.rounds.stage(d2, 1, _upload(server_artifacts, 1)))
    b.rounds.tick()
    assert b.db.rounds.count_closed() == 0  # the lease runs: nobody else closes it yet
    clock.now += 31  # the round holds 1 of 2 updates: what a's close decided, b carries out
    b.rounds.closing.try_close(1, "taken over")
    assert b.db.versions.latest() == 1 and b.db.rounds.get(1).state == "closed"  # type: ignore[union-attr]


def test_an_attestation_nonce_issued_by_one_process_is_taken_once_at_another(pair: Any) -> None:
    a, b, _ = pair()
    now = [1000.0]
    issuing, taking = SharedNonces(a.db, lambda: now[0]), SharedNonces(b.db, lambda: now[0])
    nonce, late = issuing.issue(), issuing.issue()
    assert taking.take(nonce) and not issuing.take(nonce) and not taking.take("never issued")
    now[0] += NONCE_SECONDS
    assert not taking.take(late)  # expired


def test_rate_limits_and_refusal_tallies_hold_across_processes(pair: Any, server_artifacts: Path) -> None:
    a, b, _ = pair(target_clients=2, min_clients=1, enroll_per_minute=2, auth_failures_per_minute=3)
    assert a.enrollment.per_address.allow("10.0.0.1") == (True, 0)
    assert b.enrollment.per_address.allow("10.0.0.1") == (True, 0)
    allowed, wait = a.enrollment.per_address.allow("10.0.0.1")
    assert not allowed and 1 <= wait <= 61
    assert b.enrollment.per_address.blocked("10.0.0.1") > 0 and b.enrollment.per_address.blocked("10.0.0.2") == 0
    assert a.enrollment.per_address.blocked_locally("10.0.0.1") > 0  # the early 429, without a read
    for state in (a, b, a):  # wrong tokens: counted wherever they come in
        assert isinstance(failed_attempt(state.auth_failures, "10.0.0.3", "wrong token"), UnauthorizedError)
    assert isinstance(failed_attempt(b.auth_failures, "10.0.0.3", "wrong token"), RateLimitedError)
    # Refusals counted by b reach the round's record, which a writes when it closes the round.
    b.rounds.refused_upload("not_in_cohort")
    b.rounds.refused_upload("not_in_cohort")
    b.rounds.tick()
    a.rounds.refused_upload("malformed_update")
    assert a.rounds.refused_in(1) == {"not_in_cohort": 2, "malformed_update": 1}
    for i, device in enumerate(_devices(a, 2)):
        _send(a.rounds, device, 1, _upload(server_artifacts, i))
    ended = a.history.ended()
    assert ended[-1].round == 1 and ended[-1].refused == {"malformed_update": 1, "not_in_cohort": 2}


def test_processes_starting_together_on_a_new_database_make_one_run(
    server_artifacts: Path, tmp_path: Path, postgres_cluster: Any, monkeypatch: pytest.MonkeyPatch
) -> None:
    import threading

    monkeypatch.delenv("FEDPER_ADMIN_TOKEN")
    monkeypatch.delenv("FEDPER_ENROLLMENT_KEY")
    url, clock = postgres_cluster.database(), FakeClock()
    states: list[ServerState] = []
    errors: list[BaseException] = []

    # Each process parses its own command line and fills its own lazy caches: here, once, first
    # (tyro's parser is not thread-safe: a KeyError from it failed this test once in CI).
    config = serve_config(server_artifacts, tmp_path / "data", database=url, round_timeout=0)
    _open(server_artifacts, tmp_path / "warm", FakeClock()).db.close()

    def start() -> None:
        try:
            states.append(open_state(config, clock))
        except BaseException as exc:  # pragma: no cover - reported below
            errors.append(exc)

    threads = [threading.Thread(target=start) for _ in range(3)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert errors == [] and len(states) == 3
    assert len({s.secrets.admin_token for s in states}) == 1  # one generated token, shared
    assert len({s.secrets.enrollment_key for s in states}) == 1
    assert states[0].db.versions.latest() == 0 and states[0].db.rounds.latest().round == 1  # type: ignore[union-attr]
    for s in states:
        s.db.close()


class _Alternating:
    """Requests spread over two processes' clients in turn, as a load balancer does."""

    def __init__(self, *clients: Any) -> None:
        self._clients, self._next = clients, 0

    def _pick(self) -> Any:
        self._next += 1
        return self._clients[self._next % len(self._clients)]

    def get(self, *args: Any, **kwargs: Any) -> Any:
        return self._pick().get(*args, **kwargs)

    def post(self, *args: Any, **kwargs: Any) -> Any:
        return self._pick().post(*args, **kwargs)


def test_a_secure_round_whose_messages_reach_either_process_publishes_the_honest_sum(
    server_artifacts: Path, server_manifest: Any, tmp_path: Path, postgres_cluster: Any
) -> None:
    from tests.support import secure_round_driver as secure
    from tests.support.server_support import InProcessServer, admin, enroll

    url, clock = postgres_cluster.database(), FakeClock()
    options = {**secure.options(), "database": url}
    with (
        InProcessServer(server_artifacts, tmp_path / "data", clock=clock, **options) as a,
        InProcessServer(server_artifacts, tmp_path / "data", clock=clock, **options) as b,
    ):
        http = _Alternating(a.http, b.http)
        read: dict[str, int] = {"a": 0, "b": 0}
        for name, server in (("a", a), ("b", b)):
            assert server.state is not None
            records = server.state.db.secagg
            records.messages_after = _counted(records.messages_after, read, name)  # type: ignore[method-assign]
        devices = [enroll(a.http) for _ in range(secure.N)]
        words = sum(int(np.prod(shape)) for _, shape in server_manifest.layout("base"))
        rng = np.random.default_rng(7)
        deltas = {d: (lambda v: v * (0.5 / np.linalg.norm(v)))(rng.normal(size=words)) for d, _ in devices}
        samples = {d: int(rng.integers(20, 200)) for d, _ in devices}
        driver = secure.SecureRoundDriver(http, clock, devices, secure.WINDOW, floats=words)
        driver.begin()
        driver.honest_round([d for d, _ in devices], deltas, samples)
        driver.wait_out("unmask")
        stored = len(stored_messages(a, driver.number))
        # a process catching up reads only what was stored since it last read: each message once
        assert 0 < read["a"] <= stored and 0 < read["b"] <= stored, (read, stored)
        for server in (a, b, a):
            assert server.state is not None
            server.state.rounds.tick()
        info = b.http.get(f"/v1/rounds/{driver.number}", headers=admin()).json()
        assert info["state"] == "closed", info

        def base(version: int) -> Any:
            from fedper.common import weights

            r = http.get(f"/v1/models/{version}/base", headers=admin())
            tensors = weights.decode(r.content, f"version {version}")
            return np.concatenate([tensors[n].astype(np.float64).ravel() for n in server_manifest.base_names])

        total = sum(samples.values())
        expected = base(0) + sum(samples[d] * deltas[d] for d, _ in devices) / total
        assert np.max(np.abs(base(1) - expected)) <= 1e-6


def _counted(read: Any, tally: dict[str, int], name: str) -> Any:
    def counting(number: int, after: int) -> Any:
        rows = read(number, after)
        tally[name] += len(rows)
        return rows

    return counting


def stored_messages(server: Any, number: int) -> list[Any]:
    """The round's stored messages, read past the counting wrapper."""
    records = server.state.db.secagg
    return list(type(records).messages_after(records, number, 0))


def test_a_dp_round_through_either_process_is_noised_and_counted_once(pair: Any, server_artifacts: Path) -> None:
    a, b, clock = pair(dp=True, checkin_window=5, round_timeout=60, cohort_size=4, target_clients=4, min_clients=1,
                       dp_noise_multiplier=1.0, dp_clip=0.5, dp_clip_learning_rate=0,
                       dp_sampling_probability=1)  # fmt: skip
    devices, base = _devices(a, 4), a.rounds.round_base(1)
    for i, device in enumerate(devices):  # check in during the window, through either process
        assert (a, b)[i % 2].rounds.assign(1, device) is None
    clock.now += 5
    for i, device in enumerate(devices):
        rounds = (b, a)[i % 2].rounds
        assert rounds.assign(1, device) is not None  # drawn once, whoever draws
        rng = np.random.default_rng(i)  # a step of norm about 0.05, inside the clip
        near = {k: (v + 1e-4 * rng.standard_normal(v.shape)).astype(np.float32) for k, v in base.items()}
        upload = Upload(near, 10, 0, {}, unclipped=True)
        staged = rounds.stage(device, 1, upload)
        rounds.commit(staged)
        rounds.discard(staged)
    clock.now += 60  # a DP round closes at its deadline
    for state in (a, b, a):
        state.rounds.tick()
    assert a.db.versions.latest() == 1 and a.db.dp_state().rounds == 1
    assert b.rounds.privacy is not None and b.rounds.privacy.spent().rounds == 1


def test_a_round_the_clock_would_abandon_is_kept_when_another_process_records_an_update_meanwhile(
    pair: Any, server_artifacts: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    a, b, clock = pair(target_clients=10, min_clients=2, round_timeout=100)
    first, second = _devices(a, 2)
    _send(a.rounds, first, 1, _upload(server_artifacts, 0))
    b.rounds.assign(1, second)
    staged = b.rounds.stage(second, 1, _upload(server_artifacts, 1))
    clock.now += 101  # due with 1 of the 2 updates it needs: a's clock decides to abandon ...
    abandon = a.rounds.closing.abandon

    def meanwhile(*args: Any, **kwargs: Any) -> bool:
        clock.now -= 2  # ... while b, whose clock is 2 s behind a's, records the second
        b.rounds.commit(staged)
        clock.now += 2
        return abandon(*args, **kwargs)

    monkeypatch.setattr(a.rounds.closing, "abandon", meanwhile)
    a.rounds.tick()
    assert a.db.rounds.get(1).state == "open" and a.db.rounds.count_updates(1) == 2  # type: ignore[union-attr]
    monkeypatch.setattr(a.rounds.closing, "abandon", abandon)
    a.rounds.tick()  # decided again: 2 updates at the deadline close the round
    assert a.db.rounds.get(1).state == "closed" and a.db.versions.latest() == 1  # type: ignore[union-attr]
