"""What ``GET /metrics`` tells an operator about requests and rounds (issue 54): each request's
latency by route template, method and answer class; the ended rounds' outcomes and durations,
and the last one's cohort, equal to the server's own records."""

from __future__ import annotations

import json
import os
import re
import shutil
import subprocess
import sys
from pathlib import Path

import httpx
import pytest
from prometheus_client.parser import text_string_to_metric_families

from fedper.common.manifest import read_manifest
from tests.support.server_support import (
    ADMIN,
    InProcessServer,
    admin,
    ask,
    base_like,
    enroll,
    round_info,
    serve,
    update_body,
)

pytestmark = pytest.mark.usefixtures("server_secrets")
SERVER = Path(__file__).resolve().parents[3] / "server"


def _exported() -> set[str]:
    """The metric families the server's code names (what a rule or a dashboard may read)."""
    return {name for module in ("metrics_registry.py", "request_metrics.py")
            for name in re.findall(r'"(fedper_\w+)"', (SERVER / module).read_text())}  # fmt: skip


def _samples(text: str) -> dict[tuple[str, tuple[tuple[str, str], ...]], float]:
    return {(s.name, tuple(sorted(s.labels.items()))): s.value
            for family in text_string_to_metric_families(text) for s in family.samples}  # fmt: skip


def test_requests_are_timed_by_route_and_answer_and_rounds_counted_as_the_records_say(
    server_artifacts: Path, tmp_path: Path
) -> None:
    manifest = read_manifest(server_artifacts)
    with InProcessServer(server_artifacts, tmp_path / "data", target_clients=2, min_clients=2, rounds=2) as s:
        devices = [enroll(s.http)[1] for _ in range(3)]
        for headers in devices:
            ask(s.http, headers)
        for k, headers in enumerate(devices[:2]):  # two report, the third held a slot and did not
            r = s.http.post("/v1/rounds/1/updates", headers=headers, content=update_body(base_like(manifest, seed=k)))
            assert r.status_code == 202, r.text
        assert s.http.get("/v1/rounds/1/nothing-here", headers=admin()).status_code == 404
        assert s.http.post("/v1/rounds/1/updates", headers=devices[0], content=b"x").status_code >= 400
        info = round_info(s.http, 1)
        samples = _samples(s.http.get("/metrics").text)

    def value(name: str, **labels: str) -> float:
        return samples[(name, tuple(sorted(labels.items())))]

    upload = "/v1/rounds/{round_number}/updates"
    assert value("fedper_request_duration_seconds_count", route=upload, method="POST", answer="2xx") == 2
    assert value("fedper_request_duration_seconds_count", route=upload, method="POST", answer="4xx") == 1
    assert value("fedper_request_duration_seconds_count", route="/v1/devices", method="POST", answer="2xx") == 3
    assert value("fedper_request_duration_seconds_count", route="other", method="GET", answer="4xx") == 1
    assert value("fedper_request_duration_seconds_sum", route=upload, method="POST", answer="2xx") > 0
    # Round 1 closed on its two updates; its cohort as the database recorded it when it ended.
    assert info["state"] == "closed" and info["received"] == 2
    assert value("fedper_rounds_ended_total", state="closed") == 1
    assert value("fedper_rounds_ended_total", state="abandoned") == 0
    assert value("fedper_round_duration_seconds_count") == 1
    assert value("fedper_last_round") == 1
    assert value("fedper_last_round_reported") == 2
    assert value("fedper_last_round_drawn") == 3
    assert value("fedper_last_round_dropped") == 1
    assert value("fedper_last_round_checked_in") == 0  # no check-in window: slots first come, first served
    assert value("fedper_round_duration_seconds_bucket", le="+Inf") == 1
    assert value("fedper_round_duration_seconds_bucket", le="86400.0") == 1  # an in-process round: seconds


def test_every_series_the_alert_rules_read_is_one_the_server_exports() -> None:
    """A renamed metric would silence its alert without a word: the rules (server/monitoring/
    alerts.yml, checked by promtool in `make test`) name only families the server writes."""
    exported = _exported()
    read = set(re.findall(r"\b(fedper_\w+)", (SERVER / "monitoring" / "alerts.yml").read_text()))
    families = {re.sub(r"_(total|bucket|sum|count)$", "", name) for name in read}
    assert families and families <= exported, sorted(families - exported)


def test_the_grafana_dashboard_reads_only_exported_series_in_valid_promql(tmp_path: Path) -> None:
    """server/monitoring/grafana-dashboard.json: every panel's query names series the server
    writes, and (with Grafana's variables given values) parses as PromQL: promtool checks it as a
    recording rule."""
    exported = _exported()
    dashboard = json.loads((SERVER / "monitoring" / "grafana-dashboard.json").read_text())
    queries = [t["expr"] for p in dashboard["panels"] for t in p["targets"]]
    assert queries
    names = {re.sub(r"_(total|bucket|sum|count)$", "", n) for q in queries for n in re.findall(r"\b(fedper_\w+)", q)}
    assert names <= exported, sorted(names - exported)
    promtool = shutil.which("promtool")
    if promtool is None:
        pytest.skip("no promtool to parse the queries with (make monitoring-check installs Debian's prometheus)")
    rules = [{"record": f"fedper:panel_{k}", "expr": q.replace("$__rate_interval", "5m").replace("$instance", ".*")}
             for k, q in enumerate(queries)]  # fmt: skip
    (tmp_path / "queries.yml").write_text(json.dumps({"groups": [{"name": "dashboard", "rules": rules}]}))
    done = subprocess.run([promtool, "check", "rules", str(tmp_path / "queries.yml")], capture_output=True, text=True)
    assert done.returncode == 0, done.stdout + done.stderr


@pytest.mark.slow
def test_admin_watch_shows_the_runs_rounds_accuracy_and_refusals_as_the_server_records_them(
    server_artifacts: Path, tmp_path: Path
) -> None:
    """``fedper admin watch --once`` against a real server process after a round: the round as
    /v1/rounds/1 records it (closed, 2 of 2, the accuracy the devices reported), the refusal by
    its code; without the admin token it says so and shows nothing."""
    manifest = read_manifest(server_artifacts)
    with serve(server_artifacts, tmp_path / "server", target_clients=2, min_clients=2, rounds=3) as server:
        http = httpx.Client(base_url=server.url)
        devices = [enroll(http)[1] for _ in range(2)]
        for headers in devices:
            ask(http, headers)
        for k, headers in enumerate(devices):
            body = update_body(base_like(manifest, seed=k), metrics={"accuracy": 0.25 + 0.5 * k})
            assert http.post("/v1/rounds/1/updates", headers=headers, content=body).status_code == 202
        r = http.post("/v1/rounds/2/updates", headers=devices[0], content=b"x")  # no slot asked for: refused
        assert r.status_code == 409 and r.json()["code"] == "not_in_cohort", r.text
        info = round_info(http, 1)
        env = {**os.environ, "COLUMNS": "160", "FEDPER_ADMIN_TOKEN": ADMIN}
        watch = [sys.executable, "-m", "fedper.cli", "admin", "watch", "--server", server.url, "--once"]
        done = subprocess.run(watch, capture_output=True, text=True, env=env, timeout=120)
        env["FEDPER_ADMIN_TOKEN"] = "not-the-token-0123456789012345678"
        refused = subprocess.run(watch, capture_output=True, text=True, env=env, timeout=120)
    assert done.returncode == 0, done.stderr
    out = done.stdout
    accuracy = info["metrics"]["accuracy"]
    assert accuracy["mean"] == 0.5 and accuracy["count"] == 2
    row = next(line for line in out.splitlines() if line.strip("│ ").startswith("1 "))
    # reported/drawn; the reports' mean, 10th-90th percentiles (of 0.25 and 0.75) and count
    assert "closed" in row and "2/2" in row and f"{accuracy['mean']:.3f}, 0.300-0.700, 2" in row, out
    assert "round 2 of 3, 1 closed, model version 1, 2 devices" in out, out
    refusal = next(line for line in out.splitlines() if "not_in_cohort" in line)  # the 409 above: no slot in round 2
    assert refusal.strip("│ ").split()[-1] == "1", out
    assert refused.returncode == 2 and "answered 401" in refused.stderr and "rounds" not in refused.stdout
