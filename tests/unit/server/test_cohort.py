"""Cohort selection and pace steering (PROTOCOL.md, revision 1.2): a real ``fedper serve`` over
real sockets for a burst of lightweight devices that speak the protocol (asyncio + httpx, tiny
valid uploads) and for a slot's report timeout, the app in process for a restart, and the round
state machine in process for the generated interleavings."""

from __future__ import annotations

import asyncio
import tempfile
from collections.abc import Awaitable, Callable
from pathlib import Path

import httpx
import numpy as np
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from fedper.common.manifest import Manifest
from fedper.common.protocol import Task
from fedper.device_runtime.client import NotInCohortError, ProtocolClient, RunFinishedError
from fedper.device_runtime.device import Device, DeviceOptions
from fedper.device_runtime.device_storage import DeviceStorage
from fedper.device_runtime.events import RoundReport
from fedper.server.config import ServerConfig
from fedper.server.errors import answer
from fedper.server.refusals import RefusalError
from fedper.server.state import open_state
from fedper.server.upload_validation import Upload
from tests.support.server_support import (
    ADMIN,
    ENROLL,
    FakeClock,
    InProcessServer,
    base_like,
    enroll,
    round_info,
    serve,
    update_body,
)

FLEET, COHORT = 200, 20


def _stored(data: Path) -> list[str]:
    """Every update file and temporary file the server holds."""
    return sorted(str(p.relative_to(data)) for d in ("updates", "tmp") for p in (data / d).rglob("*"))


async def _reconnecting(send: Callable[[], Awaitable[httpx.Response]], attempts: int = 3) -> httpx.Response:
    """``send()`` again when the server closed a pooled keep-alive connection just as it was reused.

    Closing an idle connection is the server's right (uvicorn's keep-alive timeout), and a stalled
    host can make a pooled connection look idle; a real device retries such a transport error
    (``device_runtime.retry``), so these devices do too rather than fail the round on it."""
    for attempt in range(1, attempts + 1):
        try:
            return await send()
        except httpx.RemoteProtocolError:
            if attempt == attempts:
                raise
    raise AssertionError("unreachable")


async def _enroll_all(url: str, count: int) -> list[dict[str, str]]:
    async with httpx.AsyncClient(base_url=url, timeout=60) as http:

        async def one() -> dict[str, str]:
            r = await _reconnecting(
                lambda: http.post("/v1/devices", json={"enrollment_key": ENROLL, "platform": "python"})
            )
            assert r.status_code == 201, r.text
            return {"Authorization": f"Bearer {r.json()['token']}"}

        return list(await asyncio.gather(*(one() for _ in range(count))))


async def _ask_all(url: str, devices: list[dict[str, str]]) -> list[httpx.Response]:
    limits = httpx.Limits(max_connections=50)
    async with httpx.AsyncClient(base_url=url, timeout=60, limits=limits) as http:

        async def ask(headers: dict[str, str]) -> httpx.Response:
            return await _reconnecting(lambda: http.get("/v1/task", headers=headers))

        return list(await asyncio.gather(*(ask(h) for h in devices)))


async def _upload_all(url: str, number: int, bodies: list[tuple[dict[str, str], bytes]]) -> list[httpx.Response]:
    async with httpx.AsyncClient(base_url=url, timeout=120) as http:
        return list(
            await asyncio.gather(*(http.post(f"/v1/rounds/{number}/updates", content=b, headers=h) for h, b in bodies))
        )


@pytest.mark.slow
def test_200_devices_cohort_20_exactly_the_cohort_trains_and_the_rest_are_paced(
    server_artifacts: Path, server_manifest: Manifest, tmp_path: Path
) -> None:
    data = tmp_path / "data"
    options = dict(target_clients=COHORT, min_clients=1, cohort_size=COHORT, over_selection=1.0, rounds=2,
                   round_timeout=0, retry_after=30, enroll_per_minute=10_000, max_inflight_uploads=64,
                   max_requests_per_address=0)  # fmt: skip  # 200 devices on one loopback address
    with serve(server_artifacts, data, **options) as s:
        devices = asyncio.run(_enroll_all(s.url, FLEET))
        for number in (1, 2):
            answers = asyncio.run(_ask_all(s.url, devices))
            chosen = [h for h, r in zip(devices, answers, strict=True) if r.status_code == 200]
            assert len(chosen) == COHORT, [r.status_code for r in answers]
            assert {(r.json()["round"], r.json()["model_version"]) for r in answers if r.status_code == 200} == {
                (number, number - 1)
            }
            paced = [r for r in answers if r.status_code != 200]
            assert {r.status_code for r in paced} == {204}
            waits = [int(r.headers["retry-after"]) for r in paced]
            # Spread over [R, R + max(R, D)] = [30, 60] (D, the last round's length, is short here).
            assert min(waits) >= 30 and max(waits) <= 60, sorted(waits)
            assert max(waits) - min(waits) >= 20 and len(set(waits)) >= 15, sorted(waits)
            # Asking again changes nothing: the cohort keeps its tasks, the others still wait.
            again = asyncio.run(_ask_all(s.url, devices))
            assert [r.status_code for r in again] == [r.status_code for r in answers]
            # The cohort trains and uploads at once: every one of its updates is counted.
            body = update_body(base_like(server_manifest, value=0.5), 10, number - 1)
            uploads = asyncio.run(_upload_all(s.url, number, [(h, body) for h in chosen]))
            assert sorted(r.status_code for r in uploads) == [202] * COHORT, [r.text for r in uploads]
            closed = round_info(s.http, number)
            assert closed["state"] == "closed" and closed["received"] == COHORT
        assert s.metric("fedper_updates_accepted_total") == 2 * COHORT
        assert s.http.get("/v1/status").json()["state"] == "finished"


def test_an_expired_slot_goes_to_the_next_device_and_a_non_member_changes_nothing(
    server_artifacts: Path, server_manifest: Manifest, tmp_path: Path
) -> None:
    data, clock = tmp_path / "data", FakeClock()
    with InProcessServer(server_artifacts, data, clock=clock, target_clients=3, min_clients=1, cohort_size=3,
                         over_selection=1.0, report_timeout=2, round_timeout=0, rounds=2, retry_after=3) as s:  # fmt: skip
        a, b, c, d, e = (enroll(s.http)[1] for _ in range(5))
        tasks = [s.http.get("/v1/task", headers=h) for h in (a, b, c)]
        assert [t.status_code for t in tasks] == [200] * 3
        report_by = tasks[2].json()["report_by"]
        assert report_by is not None and report_by.endswith("Z")
        assert s.http.get("/v1/task", headers=d).status_code == 204
        body = update_body(base_like(server_manifest, value=0.25))
        for h in (a, b):
            assert s.http.post("/v1/rounds/1/updates", content=body, headers=h).status_code == 202
        # A device that never asked, while every slot is held: 409 not_in_cohort, nothing stored.
        before = (round_info(s.http, 1), _stored(data))
        refused = s.http.post("/v1/rounds/1/updates", content=body, headers=e)
        assert (refused.status_code, refused.json()["code"]) == (409, "not_in_cohort")
        assert int(refused.headers["retry-after"]) >= 3
        assert (round_info(s.http, 1), _stored(data)) == before
        assert s.http.get("/v1/task", headers=e).status_code == 204
        # c does not report within its report timeout: its slot is free, but only a task gives it:
        # an upload from a device that holds none is refused even now, and changes nothing.
        clock.now += 2.3
        uninvited = s.http.post("/v1/rounds/1/updates", content=body, headers=e)
        assert (uninvited.status_code, uninvited.json()["code"]) == (409, "not_in_cohort")
        assert (round_info(s.http, 1)["received"], _stored(data)) == (2, before[1])
        # The free slot goes to the next device that asks.
        given_d = s.http.get("/v1/task", headers=d)
        assert given_d.status_code == 200 and given_d.json()["round"] == 1
        assert s.http.get("/v1/task", headers=c).status_code == 204  # c lost it, e still waits
        assert s.http.get("/v1/task", headers=e).status_code == 204
        late = s.http.post("/v1/rounds/1/updates", content=body, headers=c)
        assert (late.status_code, late.json()["code"]) == (409, "not_in_cohort")
        client = ProtocolClient(str(s.http.base_url), token=c["Authorization"].removeprefix("Bearer "))
        client._http.close()
        client._http = s.http  # the device's own client, its requests sent to the app in process
        with pytest.raises(NotInCohortError) as told:  # the Python device's reading of it
            client.upload(1, body)
        assert told.value.retry_after >= 3
        assert round_info(s.http, 1)["received"] == 2 and _stored(data) == before[1]
        assert s.http.post("/v1/rounds/1/updates", content=body, headers=d).status_code == 202
        assert round_info(s.http, 1)["state"] == "closed"
        # A new round, a new cohort: c may take part again.
        assert s.http.get("/v1/task", headers=c).json()["round"] == 2


def test_slots_survive_a_restart(server_artifacts: Path, server_manifest: Manifest, tmp_path: Path) -> None:
    data = tmp_path / "data"
    options = dict(target_clients=2, min_clients=1, cohort_size=2, over_selection=1.0, report_timeout=600,
                   round_timeout=0, rounds=1)  # fmt: skip
    with InProcessServer(server_artifacts, data, **options) as s:
        a, b, c = (enroll(s.http)[1] for _ in range(3))
        tasks = [s.http.get("/v1/task", headers=h).json() for h in (a, b)]
        assert s.http.get("/v1/task", headers=c).status_code == 204
    with InProcessServer(server_artifacts, data, **options) as s2:
        assert [s2.http.get("/v1/task", headers=h).json() for h in (a, b)] == tasks  # same report_by
        assert s2.http.get("/v1/task", headers=c).status_code == 204
        refused = s2.http.post("/v1/rounds/1/updates", content=update_body(base_like(server_manifest)), headers=c)
        assert refused.json()["code"] == "not_in_cohort"
        for h in (a, b):
            body = update_body(base_like(server_manifest, value=1.0))
            assert s2.http.post("/v1/rounds/1/updates", content=body, headers=h).status_code == 202
        assert round_info(s2.http, 1)["state"] == "closed"


def test_too_few_slots_for_the_target_is_refused_at_start(server_artifacts: Path) -> None:
    with pytest.raises(ValueError, match="no round could ever fill"):
        ServerConfig(artifacts=server_artifacts, target_clients=10, cohort_size=5, over_selection=1.5)
    assert ServerConfig(target_clients=10, over_selection=1.3).slots == 13
    assert ServerConfig(target_clients=10, cohort_size=7, over_selection=1.5).slots == 11  # ceil(10.5)


def test_a_device_not_in_the_cohort_backs_off_and_asks_again_without_failing(tmp_path: Path) -> None:
    """409 not_in_cohort is not a failure: the device waits Retry-After (capped) and asks again."""
    task = Task(round=1, model_version=0, deadline=None, base_url="/v1/models/0/base",
                manifest_url="/v1/artifacts/manifest.json", manifest_sha256="0" * 64)  # fmt: skip
    done = RoundReport(1, 0, 10, 0.5, 0.6, 1.0, True, 1)

    class Client:
        token: str | None = None

        def __init__(self) -> None:
            self.answers: list[Task | Exception] = [task, task, RunFinishedError()]

        def task(self) -> Task:
            answer = self.answers.pop(0)
            if isinstance(answer, Exception):
                raise answer
            return answer

    rounds: list[RoundReport | Exception] = [NotInCohortError(3.0, "every slot is held"), done]

    def run_round(_task: Task) -> RoundReport:
        outcome = rounds.pop(0)
        if isinstance(outcome, Exception):
            raise outcome
        return outcome

    storage = DeviceStorage(tmp_path / "device")
    storage.save_credentials("d-1", "token")
    slept: list[float] = []
    device = Device(Client(), storage, lambda _m: None, DeviceOptions(), ENROLL, sleep=slept.append)  # type: ignore[arg-type, return-value]
    device.run_round = run_round  # type: ignore[method-assign, assignment]
    assert device.run() == [done]  # the refused round is not a report, and nothing was raised
    assert slept == [3.0] and rounds == []


# One step of a device: ask for a task, upload (whether it asked or not), or let time pass.
STEPS = st.lists(
    st.one_of(
        st.tuples(st.just("ask"), st.integers(0, 5)),
        st.tuples(st.just("upload"), st.integers(0, 5)),
        st.tuples(st.just("wait"), st.sampled_from([0.5, 1.5, 4.0])),
    ),
    min_size=1,
    max_size=30,
)


@settings(max_examples=40, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(steps=STEPS, over_selection=st.sampled_from([1.0, 1.5]))
def test_no_arrival_order_over_assigns_slots_or_refuses_a_slot_holder(
    server_artifacts: Path, server_manifest: Manifest, steps: list[tuple[str, float]], over_selection: float
) -> None:
    """Whatever order 6 devices ask, upload and wait in (report timeout 3 s): at most ceil(2 x F)
    slots are held at any moment, no round takes more than target_clients updates, a device that
    uploads before its slot expires is never refused for not being in the cohort, and an upload
    from a device without an unexpired slot is never accepted."""
    clock = FakeClock()
    tensors = base_like(server_manifest, value=0.125)
    with tempfile.TemporaryDirectory() as tmp, pytest.MonkeyPatch.context() as mp:
        mp.setenv("FEDPER_ADMIN_TOKEN", ADMIN)
        mp.setenv("FEDPER_ENROLLMENT_KEY", ENROLL)
        config = ServerConfig(artifacts=server_artifacts, data_dir=Path(tmp), target_clients=2, min_clients=1,
                              cohort_size=2, over_selection=over_selection, report_timeout=3, round_timeout=0,
                              rounds=100)  # fmt: skip
        state = open_state(config, clock)
        rounds, db = state.rounds, state.db
        ids = [f"d-{i}" for i in range(6)]
        for i in ids:
            db.devices.add(i, f"hash-{i}", "test")
        expiry: dict[tuple[int, str], float | None] = {}  # the slots handed out by tasks
        try:
            for kind, value in steps:
                number = rounds.snapshot.round
                if kind == "wait":
                    clock.now += float(value)
                    continue
                device = ids[int(value)]
                if kind == "ask":
                    slot = None if db.rounds.has_update(number, device) else rounds.assign(number, device)
                    if slot is not None:
                        expiry[(number, device)] = slot.expires_at
                else:
                    upload = Upload(tensors, 10, rounds.snapshot.model_version, {})
                    held = (number, device) in expiry and (expiry[(number, device)] or np.inf) > clock.now
                    try:
                        rounds.commit(rounds.stage(device, number, upload))
                    except RefusalError as refusal:
                        exc = answer(refusal)
                        assert exc.code != "not_in_cohort" or not held, (device, exc.code)
                        assert held or exc.code in ("not_in_cohort", "duplicate_update"), (device, exc.code)
                    else:
                        assert held, f"{device} uploaded without a slot and was accepted"
                for n in range(1, rounds.snapshot.round + 1):
                    assert db.rounds.count_updates(n) <= config.target_clients
                assert db.cohort.count_held(rounds.snapshot.round, clock.now) <= config.slots
        finally:
            db.close()
