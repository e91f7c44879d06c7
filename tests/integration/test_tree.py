"""A tree of ``fedper serve`` processes on sockets (docs/SCALING.md, "Hierarchical aggregation"): a
root (``--regions 2``) and two regional servers (``--root URL --region K``), devices taking part
through the device runtime's protocol client at the region the fleet's rule gives them. Region
0 is killed with -9 once its updates are in, and started again. In each of two rounds the root
publishes what one server publishes from the same accepted updates (within one float32 unit in
the last place), and both regions serve the root's bytes and train them in the next round."""

from __future__ import annotations

import time
from pathlib import Path
from typing import Any

import numpy as np

from fedper.common import hierarchical, weights
from fedper.common.manifest import Manifest
from fedper.device_runtime.client import NoTask, ProtocolClient
from fedper.device_runtime.retry import Backoff
from tests.support.server_support import (
    ENROLL,
    FakeClock,
    InProcessServer,
    ServerUnderTest,
    admin,
    base_like,
    serve,
    update_body,
)

DEVICES = 6
PLAIN: dict[str, object] = {"clip_factor": 0, "weight_cap": 0, "coordinate_clip": 0, "min_clients": 1,
                            "round_timeout": 60, "max_update_norm": 0}  # fmt: skip


def _update(manifest: Manifest, device: int, number: int) -> tuple[dict[str, np.ndarray], int]:
    return base_like(manifest, seed=100 * number + device), 3 + device


def _take_part(url: str, device: int, number: int, manifest: Manifest) -> None:
    """One device's round at its region: enrolled there, its task, its update (202)."""
    client = ProtocolClient(url, backoff=Backoff(base=0.05, cap=0.5, attempts=60))
    try:
        client.enroll(ENROLL)
        for _ in range(200):
            task = client.task()
            if not isinstance(task, NoTask):
                break
            time.sleep(min(0.2, task.retry_after))
        assert not isinstance(task, NoTask) and task.round == number, task
        tensors, samples = _update(manifest, device, number)
        assert client.upload(number, update_body(tensors, samples, task.model_version)) is not None
    finally:
        client.close()


def _wait(check: Any, what: str, timeout: float = 60) -> Any:
    end = time.monotonic() + timeout
    while time.monotonic() < end:
        found = check()
        if found:
            return found
        time.sleep(0.1)
    raise AssertionError(f"timed out waiting for {what}")


def _round(server: ServerUnderTest, number: int) -> dict[str, Any]:
    answer = server.http.get(f"/v1/rounds/{number}", headers=admin())
    return answer.json() if answer.status_code == 200 else {}


def _version(server: Any, v: int) -> bytes:
    answer = server.http.get(f"/v1/models/{v}/base", headers=admin())
    assert answer.status_code == 200, answer.text
    return bytes(answer.content)


def test_a_tree_of_processes_publishes_what_one_server_does_through_a_killed_region(
    server_artifacts: Path, server_manifest: Manifest, tmp_path: Path
) -> None:
    homes = [hierarchical.region_of(f"device-{d}", 2) for d in range(DEVICES)]
    sizes = [homes.count(k) for k in (0, 1)]
    assert all(sizes), sizes
    with serve(server_artifacts, tmp_path / "root", regions=2, **PLAIN) as root:
        tokens = [tmp_path / "root" / "region_tokens" / f"region-{k}" for k in (0, 1)]
        regions = [serve(server_artifacts, tmp_path / f"region-{k}", root=root.url, region=k,
                         region_token_file=str(tokens[k]), target_clients=sizes[k], **PLAIN) for k in (0, 1)]  # fmt: skip
        for region in regions:
            region.start()
        try:
            for number in (1, 2):
                for device, home in enumerate(homes):
                    _take_part(regions[home].url, device, number, server_manifest)
                if number == 1:
                    regions[0].kill()  # its updates are in; its sum may or may not have gone
                    regions[0].start()
                _wait(lambda n=number: _round(root, n).get("state") == "closed", f"the root's round {number}")
                for region in regions:
                    _wait(lambda r=region, n=number: _round(r, n + 1), f"round {number + 1} at {region.url}")
                    assert _round(region, number)["result_version"] == number
                    assert _round(region, number + 1)["model_version"] == number
                    assert _version(region, number) == _version(root, number)
        finally:
            for region in regions:
                region.stop()
        published = [weights.decode(_version(root, v), f"the root's version {v}") for v in (1, 2)]
    clock = FakeClock()
    with InProcessServer(server_artifacts, tmp_path / "flat", clock=clock, target_clients=DEVICES, **PLAIN) as flat:
        for number in (1, 2):
            for device in range(DEVICES):
                _take_part_in_process(flat, device, number, server_manifest)
            one = weights.decode(_version(flat, number), f"the flat server's version {number}")
            for name in server_manifest.base_names:
                ulps = np.abs(published[number - 1][name].view(np.int32).astype(np.int64) - one[name].view(np.int32))
                assert ulps.max() <= 1, (number, name)


def _take_part_in_process(server: InProcessServer, device: int, number: int, manifest: Manifest) -> None:
    enrolled = server.http.post("/v1/devices", json={"enrollment_key": ENROLL})
    headers = {"Authorization": f"Bearer {enrolled.json()['token']}"}
    task = server.http.get("/v1/task", headers=headers).json()
    tensors, samples = _update(manifest, device, number)
    body = update_body(tensors, samples, base_version=task["model_version"])
    assert server.http.post(f"/v1/rounds/{number}/updates", content=body, headers=headers).status_code == 202
