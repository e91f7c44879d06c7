"""The operator's dashboard (issue 54): ``/dashboard/data`` and ``/metrics`` give each ended
round's cohort, refusals and fill time and what devices reported per model version as the
run's records say; both pages need the admin token, asked for by HTTP Basic; the page is
self-contained under a policy that lets it load nothing from elsewhere."""

from __future__ import annotations

import base64
import re
from pathlib import Path

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from fedper.common.manifest import read_manifest
from fedper.server import process as server_process
from fedper.server.dashboard_data import DASHBOARD_DATA_PATH, DASHBOARD_PATH
from fedper.server.run_history import KEPT_VERSIONS, RunHistory
from fedper.server.storage import Database, RoundEnding, RoundState, StoredUpdate
from tests.support.server_support import ADMIN, InProcessServer, admin, ask, base_like, enroll, round_info, update_body

pytestmark = pytest.mark.usefixtures("server_secrets")


def _basic(user: str, password: str) -> dict[str, str]:
    return {"Authorization": "Basic " + base64.b64encode(f"{user}:{password}".encode()).decode()}


def test_the_data_and_metrics_give_each_rounds_cohort_refusals_and_reports_as_recorded(
    server_artifacts: Path, tmp_path: Path
) -> None:
    manifest = read_manifest(server_artifacts)
    with InProcessServer(server_artifacts, tmp_path / "data", target_clients=2, min_clients=2, rounds=3) as s:
        devices = [enroll(s.http)[1] for _ in range(3)]
        for headers in devices:
            ask(s.http, headers)
        bad = s.http.post("/v1/rounds/1/updates", headers=devices[2], content=b"not an update")
        stray = s.http.post("/v1/rounds/1/updates", headers=enroll(s.http)[1], content=b"x")  # holds no slot
        for k, headers in enumerate(devices[:2]):
            body = update_body(base_like(manifest, seed=k), metrics={"accuracy": 0.25 + 0.5 * k, "train_loss": 1.0})
            assert s.http.post("/v1/rounds/1/updates", headers=headers, content=body).status_code == 202
        late = s.http.post("/v1/rounds/1/updates", headers=devices[2], content=b"x")  # round 1 closed
        data = s.http.get(DASHBOARD_DATA_PATH, headers=admin()).json()
        text = s.http.get("/metrics").text
        info = round_info(s.http, 1)
    codes = [r.json()["code"] for r in (bad, stray, late)]
    assert codes[:2] == ["malformed_safetensors", "not_in_cohort"] and codes[2] == "round_not_open", codes
    ended, open_round = data["rounds"]
    assert ended["round"] == 1 and ended["state"] == "closed" and info["state"] == "closed"
    assert (ended["reported"], ended["drawn"], ended["checked_in"]) == (2, 3, 0)
    assert ended["refused"] == {"malformed_safetensors": 1, "not_in_cohort": 1}  # the third came after round 1 ended
    assert (ended["clipped"], ended["capped"]) == (0, 0)  # robust aggregation's report: nothing to clip
    assert ended["fill_seconds"] is not None and 0 <= ended["fill_seconds"] <= ended["seconds"]
    assert open_round["round"] == 2 and open_round["state"] == "open" and open_round["refused"] == {"round_not_open": 1}
    accuracy = next(v for v in data["versions"] if v["metric"] == "accuracy")
    assert (accuracy["version"], accuracy["count"], accuracy["mean"]) == (0, 2, info["metrics"]["accuracy"]["mean"])
    assert accuracy["p10"] == pytest.approx(0.3) and accuracy["p50"] == 0.5 and accuracy["p90"] == pytest.approx(0.7)
    assert data["run"]["rounds_closed"] == 1 and data["run"]["model_version"] == 1
    assert data["process"]["refused"] == {"malformed_safetensors": 1, "not_in_cohort": 1, "round_not_open": 1}
    assert data["process"]["accepted"] == 2 and data["process"]["answers"]["2xx"] >= 6
    sample = server_process.metric_sample
    assert sample(text, "fedper_last_round_refused", code="malformed_safetensors") == 1
    assert sample(text, "fedper_last_round_refused", code="not_in_cohort") == 1
    assert sample(text, "fedper_reported_model_version") == 0
    assert sample(text, "fedper_reported", metric="accuracy", stat="mean") == 0.5
    assert sample(text, "fedper_reported", metric="accuracy", stat="p90") == pytest.approx(0.7)
    assert sample(text, "fedper_reported_count", metric="train_loss") == 2
    assert sample(text, "fedper_cohort_fill_seconds_count") == 1
    assert 'fedper_last_round_aggregation{what="clipped"} 0.0' in text


def test_the_pages_need_the_admin_token_and_a_browser_is_asked_for_it(server_artifacts: Path, tmp_path: Path) -> None:
    with InProcessServer(server_artifacts, tmp_path / "data") as s:
        device = enroll(s.http)[1]
        for path in (DASHBOARD_PATH, DASHBOARD_DATA_PATH):
            for headers in ({}, _basic("admin", "wrong-token-0123456789012345678901"), device, _basic("", "")):
                r = s.http.get(path, headers=headers)
                assert r.status_code == 401, (path, headers, r.text)
                assert r.headers["www-authenticate"].startswith("Basic realm=")
                assert r.json()["code"] == "unauthorized"
        page = s.http.get(DASHBOARD_PATH, headers=_basic("anyone", ADMIN))
        assert page.status_code == 200 and page.headers["content-type"].startswith("text/html")
        policy = page.headers["content-security-policy"]
        assert "default-src 'none'" in policy and "connect-src 'self'" in policy and "unsafe" not in policy
        urls = set(re.findall(r"https?://[^\s\"']+", page.text))
        assert urls == {"http://www.w3.org/2000/svg"}, urls  # SVG's namespace name, never fetched
        assert s.http.get(DASHBOARD_DATA_PATH, headers=_basic("", ADMIN)).status_code == 200
        assert s.http.get(DASHBOARD_DATA_PATH, headers=admin()).status_code == 200


_HEADER_TEXT = st.text(alphabet=st.characters(min_codepoint=32, max_codepoint=255, exclude_characters="\x7f"),
                       max_size=60)  # fmt: skip


@settings(max_examples=60, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(header=st.one_of(
    _HEADER_TEXT,
    st.builds(lambda s: "Basic " + s, _HEADER_TEXT),
    st.builds(lambda b: "Basic " + base64.b64encode(b).decode(), st.binary(max_size=60)),
    st.builds(lambda s: "Bearer " + s, st.text(alphabet=st.characters(min_codepoint=33, max_codepoint=126),
                                              max_size=60)),
))  # fmt: skip
def test_no_authorization_header_but_the_admin_token_opens_the_dashboard(
    dashboard_server: InProcessServer, header: str
) -> None:
    r = dashboard_server.http.get(DASHBOARD_DATA_PATH, headers={"Authorization": header.encode("latin-1")})
    assert r.status_code in (401, 429), (header, r.status_code, r.text)


@pytest.fixture(scope="module")
def dashboard_server(server_artifacts: Path, tmp_path_factory: pytest.TempPathFactory):  # type: ignore[no-untyped-def]
    from tests.support.server_support import secrets_env

    mp = pytest.MonkeyPatch()
    for name, value in secrets_env().items():
        mp.setenv(name, value)
    with InProcessServer(server_artifacts, tmp_path_factory.mktemp("dash"), auth_failures_per_minute=10**6) as s:
        yield s
    mp.undo()


def _end_round(db: Database, number: int, version: int, metrics: list[dict[str, float]]) -> None:
    with db.transaction() as tx:
        db.rounds.open(tx, number, version, float(number), None)
        for k, m in enumerate(metrics):
            db.rounds.insert_update(tx, StoredUpdate(number, f"d{k}", 10, version, None, m), float(number))
        ending = RoundEnding({"bad_update": number}, fill_rank=1)
        db.rounds.end(tx, number, RoundState.CLOSED, number + 0.5, version + 1, ending=ending)


def test_the_history_reads_each_ended_round_once_and_keeps_the_newest_versions(tmp_path: Path) -> None:
    db = Database(tmp_path / "state.db")
    history = RunHistory(db)
    assert history.ended() == [] and history.versions() == []
    for n in range(1, KEPT_VERSIONS + 6):
        _end_round(db, n, n - 1, [{"accuracy": 0.1 * k, "other": 5.0} for k in range(1, 6)])
    reports = history.versions()
    assert [r.version for r in reports] == list(range(5, KEPT_VERSIONS + 5))  # the newest, accuracy only
    assert {r.metric for r in reports} == {"accuracy"} and reports[0].count == 5
    assert reports[0].mean == pytest.approx(0.3) and reports[0].p50 == pytest.approx(0.3)
    ended = history.ended()
    assert [r.round for r in ended] == list(range(1, KEPT_VERSIONS + 6))
    assert ended[2].refused == {"bad_update": 3} and ended[2].fill_seconds is None  # no slot was ever given
    _end_round(db, KEPT_VERSIONS + 6, KEPT_VERSIONS + 5, [{"accuracy": 1.0}])
    assert history.ended()[-1].round == KEPT_VERSIONS + 6 and history.versions()[-1].mean == 1.0
    db.close()
