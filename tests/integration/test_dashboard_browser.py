"""The operator's dashboard in a real headless browser (Debian's chromium, Playwright) on a real
``fedper serve`` (issue 54): without the admin token it shows nothing; with it, the page loads
nothing from outside the server, shows each round as it closes with what the server records,
and its JavaScript reports no error, on a laptop's and on a phone's screen."""

from __future__ import annotations

from pathlib import Path

import httpx
import pytest
from playwright.sync_api import Error as PlaywrightError

from fedper.common.manifest import read_manifest
from tests.support.browser import CHROMIUM, PHONE, chromium, watched_page
from tests.support.server_support import ADMIN, ask, base_like, enroll, round_info, serve, update_body

pytestmark = [
    pytest.mark.slow,
    pytest.mark.skipif(
        CHROMIUM is None,
        reason="no chromium (server/monitoring/ensure-debian-package.sh chromium chromium installs it)",
    ),
]


def _row(page, number: int) -> dict[str, str]:  # type: ignore[no-untyped-def]
    headers = page.locator("#rounds-table thead th").all_inner_texts()
    cells = page.locator(f'#rounds-table tr[data-round="{number}"] td').all_inner_texts()
    return dict(zip(headers, cells, strict=True))


def _play_round(
    http: httpx.Client, manifest, number: int, devices: list[dict[str, str]], accuracy: list[float]
) -> None:  # type: ignore[no-untyped-def]
    for headers in devices:
        ask(http, headers)
    for k, (headers, acc) in enumerate(zip(devices, accuracy, strict=False)):
        body = update_body(base_like(manifest, seed=k), base_version=number - 1, metrics={"accuracy": acc})
        r = http.post(f"/v1/rounds/{number}/updates", headers=headers, content=body)
        assert r.status_code == 202, r.text


def test_the_dashboard_shows_a_live_run_as_it_closes_rounds_and_needs_the_token(
    server_artifacts: Path, tmp_path: Path
) -> None:
    manifest = read_manifest(server_artifacts)
    with serve(server_artifacts, tmp_path / "server", rounds=3, target_clients=2, min_clients=2) as server, \
            chromium() as browser:  # fmt: skip
        http = server.http
        # Asked to log in (401, Basic), a headless browser with nothing to give gives up; a wrong
        # token is refused again, and the page is not there.
        with pytest.raises(PlaywrightError, match="ERR_INVALID_AUTH_CREDENTIALS"):
            watched_page(browser, None).page.goto(f"{server.url}/dashboard")
        stranger = watched_page(browser, "not-the-admin-token-0123456789abcdef")
        answer = stranger.page.goto(f"{server.url}/dashboard")
        assert answer is not None and answer.status == 401
        assert stranger.page.locator("#rounds-table").count() == 0

        operator = watched_page(browser, ADMIN)
        page = operator.page
        answer = page.goto(f"{server.url}/dashboard")
        assert answer is not None and answer.status == 200
        page.wait_for_function("document.getElementById('run-state').textContent === 'running'")
        assert page.locator("#round").inner_text() == "1"

        devices = [enroll(http)[1] for _ in range(3)]
        _play_round(http, manifest, 1, devices[:2], [0.25, 0.75])
        page.wait_for_selector('#rounds-table tr[data-round="1"] td.closed', timeout=15_000)  # no reload
        info = round_info(http, 1)
        row = _row(page, 1)
        assert row["state"] == info["state"] == "closed"
        assert row["reported"] == str(info["received"]) == "2" and row["drawn"] == "2"
        assert row["accuracy"] == f"{info['metrics']['accuracy']['mean']:.3f} (2)"
        assert page.locator("#rounds-closed").inner_text() == "1"

        refused = http.post("/v1/rounds/2/updates", headers=devices[2], content=b"x")  # asked for no slot
        assert refused.status_code == 409 and refused.json()["code"] == "not_in_cohort"
        _play_round(http, manifest, 2, devices[1:], [0.5, 0.5])
        page.wait_for_selector('#rounds-table tr[data-round="2"] td.closed', timeout=15_000)
        assert _row(page, 2)["refused"] == "not_in_cohort 1"
        refusal = page.locator('#refusals tr[data-code="not_in_cohort"] td').all_inner_texts()
        assert refusal == ["not_in_cohort", "1", "1"]
        assert page.locator("#cohort-chart rect[data-round]").count() == 3  # two closed rounds and the open one
        assert page.locator("#version-chart circle").count() == 2  # versions 0 and 1 have reports
        page.wait_for_function("document.getElementById('log').textContent.includes('round_closed')")

        phone = watched_page(browser, ADMIN, viewport=PHONE)
        phone.page.goto(f"{server.url}/dashboard")
        phone.page.wait_for_selector('#rounds-table tr[data-round="2"]')
        width = phone.page.evaluate("document.documentElement.scrollWidth")
        assert width <= PHONE["width"], f"the page is {width} px wide on a {PHONE['width']} px screen"

    for watched in (operator, phone):
        outside = [u for u in watched.requests if not u.startswith(server.url)]
        assert not outside, outside
        assert watched.errors == [], watched.errors
    assert {u.removeprefix(server.url) for u in operator.requests} == {"/dashboard", "/dashboard/data"}
