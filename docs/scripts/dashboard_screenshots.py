"""Draws docs/img/dashboard.png and docs/img/dashboard_phone.png: the operator's dashboard (docs/
SERVER.md, "Monitoring") in Debian's chromium, on a scripted run of a real ``fedper serve``.

The run is scripted, not trained: 16 enrolled devices; in each round every device asks for a task
and those given a slot upload a random base update (seeded) that reports an accuracy drawn around
a rising curve; one device sends a body that is not an update and one uploads without a slot, in
every round. Round 9 gets too few updates and is abandoned at its deadline; the run ends when 12
rounds have closed. The numbers on the screenshots are that script's, not a model's.

Run from the repository's root: ``.venv/bin/python -m docs.scripts.dashboard_screenshots``
(needs chromium: ``server/monitoring/ensure-debian-package.sh chromium chromium``).
"""

from __future__ import annotations

import tempfile
import time
from pathlib import Path

import httpx
import numpy as np

from fedper.common.manifest import read_manifest
from fedper.export.pipeline import write_server_only_export
from tests.support.browser import LAPTOP, PHONE, chromium, watched_page
from tests.support.server_support import ADMIN, base_like, enroll, serve, update_body

ROOT = Path(__file__).resolve().parents[2]
ROUNDS, DEVICES, SEED, ABANDONED = 12, 16, 0, 9


def scripted_run(http: httpx.Client, artifacts: Path) -> None:
    manifest = read_manifest(artifacts)
    rng = np.random.default_rng(SEED)
    devices = [enroll(http)[1] for _ in range(DEVICES)]
    number = 0
    while http.get("/v1/status").json()["state"] == "running":
        number += 1
        with_slot = [h for h in devices if http.get("/v1/task", headers=h).status_code == 200]
        http.post(f"/v1/rounds/{number}/updates", headers=with_slot[0], content=b"not an update")
        without = [h for h in devices if h not in with_slot]
        if without:
            http.post(f"/v1/rounds/{number}/updates", headers=without[0], content=b"x")
        reporting = with_slot[:2] if number == ABANDONED else with_slot
        for k, headers in enumerate(reporting):
            accuracy = float(np.clip(0.35 + 0.3 * (1 - np.exp(-number / 4)) + rng.normal(0, 0.06), 0, 1))
            metrics = {"accuracy": round(accuracy, 4), "train_loss": round(1.2 - accuracy, 4)}
            version = http.get("/v1/status").json()["model_version"]
            tensors = base_like(manifest, seed=int(rng.integers(1 << 30)) + k)
            body = update_body(tensors, num_samples=20 + k, base_version=version, metrics=metrics)
            http.post(f"/v1/rounds/{number}/updates", headers=headers, content=body)
        status = http.get("/v1/status").json()
        while status["round"] == number and status["state"] == "running":
            time.sleep(0.2)  # round 9 waits for its deadline
            status = http.get("/v1/status").json()


def main() -> None:
    with tempfile.TemporaryDirectory() as tmp:
        artifacts = write_server_only_export(Path(tmp) / "artifacts", alpha=0.25)
        options = {"rounds": ROUNDS, "target_clients": 6, "min_clients": 4, "over_selection": 1.3,
                   "round_timeout": 4, "report_timeout": 3}  # fmt: skip
        with serve(artifacts, Path(tmp) / "server", **options) as server, chromium() as browser:
            scripted_run(server.http, artifacts)
            for name, viewport in (("dashboard.png", LAPTOP), ("dashboard_phone.png", PHONE)):
                watched = watched_page(browser, ADMIN, viewport=viewport)
                watched.page.goto(f"{server.url}/dashboard")
                watched.page.wait_for_selector(f'#rounds-table tr[data-round="{ROUNDS + 1}"]')
                watched.page.screenshot(path=str(ROOT / "docs" / "img" / name), full_page=True)
                assert watched.errors == [], watched.errors
                print(f"wrote docs/img/{name}")


if __name__ == "__main__":
    main()
