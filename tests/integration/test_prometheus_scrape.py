"""A real Prometheus (Debian's package) scrapes a real ``fedper serve`` through two rounds, and
PromQL through its HTTP API gives what the run's own records say (issue 54)."""

from __future__ import annotations

import shutil
import subprocess
import time
from pathlib import Path

import httpx
import pytest

from fedper.common.manifest import read_manifest
from fedper.server import process as server_process
from tests.support.server_support import ENROLL, admin, base_like, serve, update_body

PROMETHEUS = shutil.which("prometheus")
UPLOAD_ROUTE = "/v1/rounds/{round_number}/updates"


def _query(url: str, expr: str) -> float | None:
    r = httpx.get(f"{url}/api/v1/query", params={"query": expr}, timeout=10)
    assert r.status_code == 200, r.text
    result = r.json()["data"]["result"]
    return float(result[0]["value"][1]) if result else None


@pytest.mark.slow
@pytest.mark.skipif(PROMETHEUS is None, reason="no prometheus binary (make monitoring-check installs Debian's)")
def test_prometheus_scrapes_a_run_and_its_queries_give_the_runs_records(server_artifacts: Path, tmp_path: Path) -> None:
    manifest = read_manifest(server_artifacts)
    with serve(server_artifacts, tmp_path / "server", rounds=2, target_clients=2, min_clients=2) as server:
        port = server_process.free_port()
        target = server.url.removeprefix("http://")
        (tmp_path / "prometheus.yml").write_text(
            "global: {scrape_interval: 1s, evaluation_interval: 1s}\n"
            f"scrape_configs:\n  - job_name: fedper\n    static_configs: [{{targets: ['{target}']}}]\n"
        )
        log = (tmp_path / "prometheus.log").open("w")
        assert PROMETHEUS is not None
        prometheus = subprocess.Popen(
            [PROMETHEUS, f"--config.file={tmp_path / 'prometheus.yml'}", f"--storage.tsdb.path={tmp_path / 'tsdb'}",
             f"--web.listen-address=127.0.0.1:{port}"], stdout=log, stderr=subprocess.STDOUT,
        )  # fmt: skip
        url = f"http://127.0.0.1:{port}"
        try:
            http = httpx.Client(base_url=server.url)
            tokens = []
            for _ in range(3):
                r = http.post("/v1/devices", json={"enrollment_key": ENROLL, "platform": "python"})
                tokens.append({"Authorization": f"Bearer {r.json()['token']}"})
            for number in (1, 2):
                for headers in tokens:  # each gets a slot (3 with over-selection); the third never reports
                    assert http.get("/v1/task", headers=headers).status_code == 200
                for k, headers in enumerate(tokens[:2]):
                    body = update_body(base_like(manifest, seed=10 * number + k), base_version=number - 1)
                    r = http.post(f"/v1/rounds/{number}/updates", headers=headers, content=body)
                    assert r.status_code == 202, r.text
            rounds = [http.get(f"/v1/rounds/{n}", headers=admin()).json() for n in (1, 2)]
            status = http.get("/v1/status").json()
            uploads = 4
            # Until Prometheus has scraped the run's end (every second).
            for _ in range(120):
                try:
                    if _query(url, 'fedper_rounds_ended_total{state="closed"}') == 2:
                        break
                except httpx.HTTPError:
                    pass
                time.sleep(0.5)
            assert [r["state"] for r in rounds] == ["closed", "closed"] and status["rounds_closed"] == 2
            assert _query(url, 'fedper_rounds_ended_total{state="closed"}') == 2
            assert _query(url, "fedper_last_round") == 2
            assert _query(url, "fedper_last_round_reported") == rounds[1]["received"] == 2
            assert _query(url, "fedper_last_round_drawn") == 3
            assert _query(url, "fedper_last_round_dropped") == 1
            assert _query(url, "fedper_round_duration_seconds_count") == 2
            assert _query(url, "fedper_updates_accepted_total") == uploads
            count = f'sum(fedper_request_duration_seconds_count{{route="{UPLOAD_ROUTE}",answer="2xx"}})'
            assert _query(url, count) == uploads
            assert _query(url, 'sum(fedper_request_duration_seconds_count{route="/v1/devices"})') == 3
        finally:
            prometheus.terminate()
            prometheus.wait(timeout=30)
            log.close()
