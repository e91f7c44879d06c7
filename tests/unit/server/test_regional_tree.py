"""A tree of servers (docs/SCALING.md, "Hierarchical aggregation"): two regional servers and a
root publish what one server publishes from the same accepted updates (within one float32 unit
in the last place: only the order of the float64 additions differs), the regions train the
root's versions byte for byte, and a region that misses a round, or starts late, follows."""

from __future__ import annotations

import contextlib
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import numpy as np
import pytest

from fedper.common import hierarchical, weights
from fedper.common.manifest import Manifest
from fedper.server.root_link import RootLink
from tests.support.server_support import FakeClock, InProcessServer, admin, enroll, round_info, update_body

PLAIN = {"clip_factor": 0, "weight_cap": 0, "coordinate_clip": 0, "min_clients": 1, "round_timeout": 600,
         "max_update_norm": 50.0}  # fmt: skip
DEVICES = 8


def updates(manifest: Manifest, base: dict[str, np.ndarray], seed: int) -> list[tuple[dict[str, np.ndarray], int]]:
    rng = np.random.default_rng(seed)
    out = []
    for _ in range(DEVICES):
        tensors = {}
        for name, shape in manifest.layout("base"):
            moved = base[name] + rng.normal(0, 0.02, shape)
            tensors[name] = (np.abs(moved) if name.endswith("running_var") else moved).astype(np.float32)
        out.append((tensors, int(rng.integers(1, 200))))
    return out


def upload(http: Any, number: int, tensors: dict[str, np.ndarray], samples: int, version: int) -> None:
    _, headers = enroll(http)
    task = http.get("/v1/task", headers=headers)
    assert task.status_code == 200 and task.json()["round"] == number, task.text
    body = update_body(tensors, samples, base_version=version)
    answer = http.post(f"/v1/rounds/{number}/updates", content=body, headers=headers)
    assert answer.status_code == 202, answer.text


def version(http: Any, v: int) -> bytes:
    answer = http.get(f"/v1/models/{v}/base", headers=admin())
    assert answer.status_code == 200, answer.text
    return answer.content


@contextlib.contextmanager
def tree(
    artifacts: Path,
    tmp_path: Path,
    monkeypatch: pytest.MonkeyPatch,
    clock: FakeClock,
    sizes: tuple[int, int],
    secure: dict[str, object] | None = None,
) -> Iterator[tuple[InProcessServer, list[InProcessServer]]]:
    """A root and two regions in this process on one clock; the regions reach the root through
    its test client (tests/integration/test_tree.py runs them as processes on sockets)."""
    with InProcessServer(artifacts, tmp_path / "root", clock=clock, regions=2, **PLAIN) as root:

        def link(cls: type[RootLink], url: str, region: int, token_file: Path) -> RootLink:
            return cls(url, region, token_file.read_text().strip(), client=root.http)

        monkeypatch.setattr(RootLink, "from_token_file", classmethod(link))
        with contextlib.ExitStack() as stack:
            options = [{**PLAIN, "target_clients": n} for n in sizes]
            if secure is not None:  # region 0 runs secure rounds
                options[0] = {**PLAIN, **secure, "max_update_norm": 0}
            regions = [stack.enter_context(InProcessServer(
                artifacts, tmp_path / f"region-{k}", clock=clock, root="http://testserver", region=k,
                region_token_file=str(tmp_path / "root" / "region_tokens" / f"region-{k}"),
                **options[k])) for k in (0, 1)]  # fmt: skip
            yield root, regions


def tick(*servers: InProcessServer) -> None:
    for server in servers:
        assert server.state is not None
        server.state.rounds.tick()


def test_a_tree_publishes_what_one_server_publishes_and_its_regions_train_the_roots_versions(
    server_artifacts: Path, server_manifest: Manifest, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    base0 = weights.load(server_artifacts / server_manifest.artifacts["initial_base"])
    accepted = updates(server_manifest, base0, seed=5)
    homes = [hierarchical.region_of(f"device-{i}", 2) for i in range(DEVICES)]  # the fleet's routing rule
    sizes = (homes.count(0), homes.count(1))
    clock = FakeClock()
    with InProcessServer(server_artifacts, tmp_path / "flat", clock=clock, target_clients=DEVICES, **PLAIN) as flat:
        for tensors, samples in accepted:
            upload(flat.http, 1, tensors, samples, 0)
        assert round_info(flat.http, 1)["result_version"] == 1
        flat_v1 = weights.decode(version(flat.http, 1), "the flat server's version 1")
    with tree(server_artifacts, tmp_path, monkeypatch, clock, sizes) as (root, regions):
        for (tensors, samples), home in zip(accepted, homes, strict=True):
            upload(regions[home].http, 1, tensors, samples, 0)
        tick(*regions)  # each forwards its sum: the root closes once both are in
        assert round_info(root.http, 1)["state"] == "closed"
        tick(*regions)  # each ends its round as the root did, and opens the root's round 2
        tree_v1 = version(root.http, 1)
        for region in regions:
            assert version(region.http, 1) == tree_v1  # the root's bytes, under the same number
            info = round_info(region.http, 1)
            assert (info["state"], info["result_version"]) == ("closed", 1)
            assert round_info(region.http, 2)["model_version"] == 1
        published = weights.decode(tree_v1, "the root's version 1")
        for name in server_manifest.base_names:
            ulps = np.abs(published[name].view(np.int32).astype(np.int64) - flat_v1[name].view(np.int32))
            assert ulps.max() <= 1, name  # the order of the float64 additions, no more


def test_a_region_that_misses_a_round_ends_it_as_the_root_did_and_trains_the_new_version(
    server_artifacts: Path, server_manifest: Manifest, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    base0 = weights.load(server_artifacts / server_manifest.artifacts["initial_base"])
    accepted = updates(server_manifest, base0, seed=6)
    clock = FakeClock()
    with tree(server_artifacts, tmp_path, monkeypatch, clock, (2, 2)) as (root, regions):
        for tensors, samples in accepted[:2]:
            upload(regions[1].http, 1, tensors, samples, 0)
        tick(*regions)
        assert round_info(root.http, 1)["received"] == 1  # region 0 has nothing to send
        clock.now += 601
        tick(root)  # the root's deadline: it closes with region 1's sum alone
        tick(*regions)
        zero = round_info(regions[0].http, 1)
        assert zero["state"] == "abandoned" and "without this region's sum" in zero["reason"]
        assert round_info(regions[1].http, 1)["result_version"] == 1
        for region in regions:
            assert version(region.http, 1) == version(root.http, 1)
            assert round_info(region.http, 2)["model_version"] == 1
        tensors, samples = accepted[2]
        upload(regions[0].http, 2, tensors, samples, 1)  # round 2 trains version 1 there


def test_a_region_that_starts_after_its_root_moved_on_joins_the_roots_open_round(
    server_artifacts: Path, server_manifest: Manifest, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    clock = FakeClock()
    with tree(server_artifacts, tmp_path, monkeypatch, clock, (1, 1)) as (root, regions):
        clock.now += 601
        tick(root)  # round 1 abandoned at the root: nobody sent a sum
        clock.now += 601
        tick(root)
        assert root.http.get("/v1/regions/0", headers=_token(tmp_path, 0)).json()["round"] == 3
        tick(*regions)
        for region in regions:
            first = round_info(region.http, 1)
            assert first["state"] == "abandoned" and "root abandoned round 1" in first["reason"]
            assert round_info(region.http, 3)["state"] == "open"
            assert region.http.get("/v1/rounds/2", headers=admin()).status_code == 404  # never this region's


def test_a_secure_region_forwards_its_unmasked_sum_and_the_root_adds_it_to_a_plain_regions(
    server_artifacts: Path, server_manifest: Manifest, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Secure aggregation composes per region: the root sees region 0's sum, never an update."""
    from tests.support import secure_round_driver as secure

    base0 = weights.load(server_artifacts / server_manifest.artifacts["initial_base"])
    names = server_manifest.base_names
    flat0 = np.concatenate([base0[n].astype(np.float64).ravel() for n in names])
    plain = updates(server_manifest, base0, seed=8)[:2]
    clock = FakeClock()
    with tree(server_artifacts, tmp_path, monkeypatch, clock, (0, 2), secure=secure.options()) as (root, regions):
        devices = [enroll(regions[0].http) for _ in range(secure.N)]
        rng = np.random.default_rng(9)
        deltas = {d: (lambda v: v * (0.5 / np.linalg.norm(v)))(rng.normal(size=flat0.size)) for d, _ in devices}
        samples = {d: int(rng.integers(20, 200)) for d, _ in devices}
        driver = secure.SecureRoundDriver(regions[0].http, clock, devices, secure.WINDOW, floats=flat0.size)
        driver.begin()
        driver.honest_round([d for d, _ in devices], deltas, samples)
        driver.wait_out("unmask")
        for tensors, n in plain:
            upload(regions[1].http, 1, tensors, n, 0)
        tick(*regions)
        assert round_info(root.http, 1)["state"] == "closed"
        tick(*regions)
        assert [round_info(r.http, 1)["result_version"] for r in regions] == [1, 1]
        moved = sum(samples[d] * deltas[d] for d, _ in devices)
        for tensors, n in plain:
            moved = moved + n * (np.concatenate([tensors[k].astype(np.float64).ravel() for k in names]) - flat0)
        expected = flat0 + moved / (sum(samples.values()) + sum(n for _, n in plain))
        published = weights.decode(version(root.http, 1), "the root's version 1")
        got = np.concatenate([published[n].astype(np.float64).ravel() for n in names])
        assert np.max(np.abs(got - expected)) <= 1e-6


def _token(tmp_path: Path, region: int) -> dict[str, str]:
    return {"Authorization": f"Bearer {(tmp_path / 'root' / 'region_tokens' / f'region-{region}').read_text().strip()}"}


DP = {"dp": True, "dp_clip": 0.5, "dp_clip_learning_rate": 0, "dp_sampling_probability": 1.0}
WINDOW = 10


def _checked_in(server: InProcessServer, count: int) -> list[dict[str, str]]:
    """``count`` devices enrolled that checked in during the round's window."""
    devices = [enroll(server.http)[1] for _ in range(count)]
    for headers in devices:
        assert server.http.get("/v1/task", headers=headers).status_code == 204
    return devices


def _drawn_upload(
    server: InProcessServer,
    devices: list[dict[str, str]],
    moves: list[np.ndarray],
    base0: dict[str, np.ndarray],
    names: list[str],
) -> None:
    """After the window: each drawn device (probability 1) uploads the base moved by its delta
    (within the clip: its bit is 1)."""
    for headers, move in zip(devices, moves, strict=True):
        task = server.http.get("/v1/task", headers=headers)
        assert task.status_code == 200 and task.json()["dp"] == {"clip_norm": 0.5}, task.text
        tensors, at = {}, 0
        for name in names:
            size = base0[name].size
            tensors[name] = (base0[name] + move[at : at + size].reshape(base0[name].shape)).astype(np.float32)
            at += size
        body = update_body(tensors, 7, base_version=0, extra_metadata={"dp_unclipped": "1"})
        answer = server.http.post(f"/v1/rounds/{task.json()['round']}/updates", content=body, headers=headers)
        assert answer.status_code == 202, answer.text


@pytest.mark.parametrize("z", [0.0, 1.0])
def test_under_dp_the_regions_forward_clipped_sums_and_the_root_adds_the_noise_once(
    server_artifacts: Path, server_manifest: Manifest, tmp_path: Path, monkeypatch: pytest.MonkeyPatch, z: float
) -> None:
    """With no noise the tree publishes what one DP server publishes (within 1 ulp); with noise the
    published step minus the devices' sum, times the expected cohort, has the standard deviation
    of one noise draw, z x clip: the regions added none, the root added it once."""
    names = server_manifest.base_names
    base0 = weights.load(server_artifacts / server_manifest.artifacts["initial_base"])
    size = sum(base0[n].size for n in names)
    rng = np.random.default_rng(11)
    moves = [(lambda v: v * (0.3 / np.linalg.norm(v)))(rng.normal(size=size)) for _ in range(4)]
    region = {**PLAIN, **DP, "dp_noise_multiplier": z, "checkin_window": WINDOW, "round_timeout": 300,
              "cohort_size": 2, "target_clients": 2, "max_update_norm": 0}  # fmt: skip
    clock = FakeClock()
    with InProcessServer(server_artifacts, tmp_path / "root", clock=clock, regions=2, **{
            **PLAIN, **DP, "dp_noise_multiplier": z, "dp_delta": 1e-5, "cohort_size": 4, "target_clients": 4,
            "max_update_norm": 0}) as root:  # fmt: skip

        def link(cls: type[RootLink], url: str, k: int, token_file: Path) -> RootLink:
            return cls(url, k, token_file.read_text().strip(), client=root.http)

        monkeypatch.setattr(RootLink, "from_token_file", classmethod(link))
        tokens = tmp_path / "root" / "region_tokens"
        with (
            InProcessServer(server_artifacts, tmp_path / "r0", clock=clock, root="http://testserver", region=0,
                            region_token_file=str(tokens / "region-0"), **region) as r0,
            InProcessServer(server_artifacts, tmp_path / "r1", clock=clock, root="http://testserver", region=1,
                            region_token_file=str(tokens / "region-1"), **region) as r1,
        ):  # fmt: skip
            devices = [_checked_in(r0, 2), _checked_in(r1, 2)]
            clock.now += WINDOW
            _drawn_upload(r0, devices[0], moves[:2], base0, names)
            _drawn_upload(r1, devices[1], moves[2:], base0, names)
            clock.now += 300
            tick(r0, r1)  # the regions' deadlines: each forwards its sum, un-noised
            assert root.http.get("/v1/regions/1", headers=_token(tmp_path, 1)).json()["forwarded"] is True
            assert round_info(root.http, 1)["state"] == "open"  # a DP round is published at its deadline
            clock.now += 300
            tick(root)
            tick(r0, r1)
            assert [round_info(r.http, 1)["result_version"] for r in (r0, r1)] == [1, 1]
            assert root.http.get("/v1/status", headers=admin()).json()["privacy"]["rounds"] == 1
            tree = weights.decode(version(root.http, 1), "the root's version 1")
    flat0 = np.concatenate([base0[n].astype(np.float64).ravel() for n in names])
    stepped = np.concatenate([tree[n].astype(np.float64).ravel() for n in names]) - flat0
    noise = stepped * 4 - sum(moves)  # the expected cohort is the fixed denominator
    if z == 0:
        with InProcessServer(server_artifacts, tmp_path / "flat", clock=clock, **{
                **PLAIN, **DP, "dp_noise_multiplier": 0.0, "checkin_window": WINDOW, "round_timeout": 300,
                "cohort_size": 4, "target_clients": 4, "max_update_norm": 0}) as flat:  # fmt: skip
            devices = _checked_in(flat, 4)
            clock.now += WINDOW
            _drawn_upload(flat, devices, moves, base0, names)
            clock.now += 300
            tick(flat)
            one = weights.decode(version(flat.http, 1), "the flat server's version 1")
        for name in names:
            ulps = np.abs(tree[name].view(np.int32).astype(np.int64) - one[name].view(np.int32))
            assert ulps.max() <= 1, name
    else:
        assert abs(float(np.std(noise)) / (z * 0.5) - 1) < 0.02  # one draw of N(0, (z C)^2), not two


def test_a_region_restarted_before_the_root_had_its_sum_takes_nothing_more_and_sends_the_same_bytes(
    server_artifacts: Path, server_manifest: Manifest, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    from fedper.server.root_link import RootUnreachableError

    base0 = weights.load(server_artifacts / server_manifest.artifacts["initial_base"])
    accepted = updates(server_manifest, base0, seed=12)
    clock = FakeClock()
    with tree(server_artifacts, tmp_path, monkeypatch, clock, (2, 1)) as (root, regions):
        upload(regions[1].http, 1, *accepted[0], 0)
        tick(regions[1])
        for tensors, samples in accepted[1:3]:
            upload(regions[0].http, 1, tensors, samples, 0)
        sent: list[bytes] = []

        def unreachable(link: RootLink, number: int, body: bytes) -> None:
            sent.append(body)
            raise RootUnreachableError("the root did not answer")

        with monkeypatch.context() as lost:
            lost.setattr(RootLink, "forward", unreachable)
            tick(regions[0])  # sealed, its sum made and kept: the root has nothing
        assert len(sent) == 1 and round_info(root.http, 1)["received"] == 1
        kept = tmp_path / "region-0" / "updates" / "r1" / "forward.sum"
        assert kept.read_bytes() == sent[0]
        regions[0].__exit__(None, None, None)  # a restart (SQLite: every closer's seal is released)
        again = InProcessServer(server_artifacts, tmp_path / "region-0", clock=clock, root="http://testserver",
                                region=0, region_token_file=str(tmp_path / "root" / "region_tokens" / "region-0"),
                                **{**PLAIN, "target_clients": 2})  # fmt: skip
        with again:
            _, headers = enroll(again.http)
            refused = again.http.post("/v1/rounds/1/updates", content=update_body(*accepted[3], 0), headers=headers)
            assert refused.status_code == 409  # the round's sum is made: nothing more comes in
            tick(again)  # the same bytes go to the root, which closes with both sums
            assert round_info(root.http, 1)["state"] == "closed"
            tick(again, regions[1])
            assert round_info(again.http, 1)["result_version"] == 1
            assert round_info(regions[1].http, 1)["result_version"] == 1
