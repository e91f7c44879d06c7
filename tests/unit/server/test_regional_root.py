"""The root of a tree of servers (PROTOCOL.md, "Regional aggregation"): it takes one sum per region
and round, refuses what it cannot accept with nothing changed, and publishes the regions' sums
combined once every region's is in."""

from __future__ import annotations

import re
from dataclasses import replace
from pathlib import Path
from typing import Any

import numpy as np
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from fedper.common import hierarchical, weights
from fedper.common.manifest import Manifest
from tests.support.server_support import ENROLL, FakeClock, InProcessServer, admin, round_info


@pytest.fixture
def base0(server_artifacts: Path, server_manifest: Manifest) -> dict[str, np.ndarray]:
    """Version 0's base: what round 1 trains."""
    return weights.load(server_artifacts / server_manifest.artifacts["initial_base"])


TREE = {"regions": 2, "min_clients": 1, "round_timeout": 60, "clip_factor": 0, "weight_cap": 0, "coordinate_clip": 0,
        "max_update_norm": 5.0}  # fmt: skip


def token(data: Path, region: int) -> dict[str, str]:
    return {"Authorization": f"Bearer {(data / 'region_tokens' / f'region-{region}').read_text().strip()}"}


def region_sum(
    manifest: Manifest, base: dict[str, np.ndarray], region: int, devices: int, seed: int, base_version: int = 0
) -> bytes:
    """A region's sum of ``devices`` updates near version 0, as a regional server forwards it."""
    rng = np.random.default_rng(seed)
    layout = manifest.layout("base")
    updates = [({n: np.abs(base[n] + rng.normal(0, 0.01, s)).astype(np.float32) if n.endswith("running_var")
                 else (base[n] + rng.normal(0, 0.01, s)).astype(np.float32) for n, s in layout},
                int(rng.integers(1, 50))) for _ in range(devices)]  # fmt: skip
    return hierarchical.encode(hierarchical.regional_sum(layout, region, updates, base_version))


def post(http: Any, data: Path, number: int, region: int, body: bytes, as_region: int | None = None) -> Any:
    headers = token(data, region if as_region is None else as_region)
    return http.post(f"/v1/rounds/{number}/regions/{region}", content=body, headers=headers)


def test_the_root_publishes_its_regions_sums_combined_once_every_region_is_in(
    server_artifacts: Path, server_manifest: Manifest, base0: dict[str, np.ndarray], tmp_path: Path
) -> None:
    data = tmp_path / "root"
    with InProcessServer(server_artifacts, data, **TREE) as root:
        http = root.http
        sums = [region_sum(server_manifest, base0, r, 3 + r, seed=r) for r in (0, 1)]
        first = post(http, data, 1, 1, sums[1])
        assert first.status_code == 202 and first.json() == {"round": 1, "region": 1, "regions_in": 1}
        assert post(http, data, 1, 1, sums[1]).json() == first.json()  # a retry: the same answer
        view = http.get("/v1/regions/0", headers=token(data, 0)).json()
        assert view == {"region": 0, "regions": 2, "round": 1, "model_version": 0, "deadline": view["deadline"],
                        "forwarded": False, "finished": False, "dp_clip": None, "dp_sampling_probability": None}  # fmt: skip
        assert http.get("/v1/regions/1", headers=token(data, 1)).json()["forwarded"] is True
        assert round_info(http, 1)["state"] == "open" and round_info(http, 1)["received"] == 1
        assert post(http, data, 1, 0, sums[0]).status_code == 202
        info = round_info(http, 1)
        assert info["state"] == "closed" and info["result_version"] == 1 and info["target_clients"] == 2
        published = weights.decode(http.get("/v1/models/1/base", headers=token(data, 0)).content, "version 1")
        expected = hierarchical.combine(server_manifest.layout("base"),
                                        [hierarchical.decode(s, server_manifest.layout("base")) for s in sums])  # fmt: skip
        assert all(published[n].tobytes() == expected[n].tobytes() for n in server_manifest.base_names)
        assert http.get("/v1/regions/0", headers=token(data, 0)).json()["round"] == 2
        assert not list((data / "updates").rglob("*.safetensors"))  # the round's sums went with it


def test_a_region_whose_round_is_short_of_sums_closes_at_the_deadline_with_those_in(
    server_artifacts: Path, server_manifest: Manifest, base0: dict[str, np.ndarray], tmp_path: Path
) -> None:
    clock, data = FakeClock(), tmp_path / "root"
    with InProcessServer(server_artifacts, data, clock=clock, **TREE) as root:
        assert post(root.http, data, 1, 0, region_sum(server_manifest, base0, 0, 2, seed=3)).status_code == 202
        assert root.state is not None
        root.state.rounds.tick()
        assert round_info(root.http, 1)["state"] == "open"
        clock.now += 61
        root.state.rounds.tick()
        assert round_info(root.http, 1)["result_version"] == 1
        clock.now += 61
        root.state.rounds.tick()  # round 2 had no sum: abandoned, and round 3 opens
        assert round_info(root.http, 2)["state"] == "abandoned"
        assert round_info(root.http, 3)["state"] == "open"


def test_what_a_root_cannot_accept_is_refused_with_its_reason_and_changes_nothing(
    server_artifacts: Path, server_manifest: Manifest, base0: dict[str, np.ndarray], tmp_path: Path
) -> None:
    data = tmp_path / "root"
    layout = server_manifest.layout("base")
    with InProcessServer(server_artifacts, data, **TREE) as root:
        http = root.http
        good = region_sum(server_manifest, base0, 0, 2, seed=1)
        summed = hierarchical.decode(good, layout)

        def variant(**change: Any) -> bytes:
            fields = {"region": 0, "weighted_sum": summed.weighted_sum, "weight": summed.weight,
                      "count": summed.count, "base_version": 0, **change}  # fmt: skip
            return hierarchical.encode(hierarchical.RegionalSum(**fields))

        far = {n: v * 3.0 for n, v in summed.weighted_sum.items()}
        cases = [
            (post(http, data, 1, 0, good, as_region=1), 403, "forbidden"),
            (
                http.post("/v1/rounds/1/regions/0", content=good, headers={"Authorization": "Bearer nope"}),
                401,
                "unauthorized",
            ),
            (http.post("/v1/rounds/1/regions/0", content=good, headers=admin()), 403, "forbidden"),
            (post(http, data, 1, 0, b"not safetensors"), 400, "malformed_safetensors"),
            (post(http, data, 1, 0, weights.encode(summed.weighted_sum)), 422, "bad_regional_sum"),
            (post(http, data, 1, 0, variant(region=1)), 422, "bad_regional_sum"),
            (post(http, data, 1, 0, variant(weight=summed.count * 100_001)), 422, "bad_regional_sum"),
            (post(http, data, 1, 0, variant(base_version=3)), 409, "stale_base_version"),
            (post(http, data, 1, 0, variant(weighted_sum=far)), 422, "update_out_of_bounds"),
            (post(http, data, 2, 0, good), 409, "round_not_open"),
            (http.post("/v1/devices", json={"enrollment_key": ENROLL}), 403, "forbidden"),
            (http.get("/v1/regions/1", headers=token(data, 0)), 403, "forbidden"),
        ]
        for answer, status, code in cases:
            assert (answer.status_code, answer.json()["code"]) == (status, code), answer.text
        assert round_info(http, 1)["received"] == 0 and not list((data / "updates").rglob("*.safetensors"))
        assert post(http, data, 1, 0, good).status_code == 202
        other = post(http, data, 1, 0, region_sum(server_manifest, base0, 0, 2, seed=2))
        assert (other.status_code, other.json()["code"]) == (409, "duplicate_update")
        assert round_info(http, 1)["received"] == 1


def test_any_body_to_the_root_gets_a_4xx_and_changes_nothing(server_artifacts: Path, tmp_path: Path) -> None:
    data = tmp_path / "root"
    with InProcessServer(server_artifacts, data, **TREE) as root:

        @settings(max_examples=150, deadline=None, suppress_health_check=[HealthCheck.too_slow])
        @given(body=st.binary(max_size=2048), region=st.integers(-2, 3), number=st.integers(-1, 3),
               as_region=st.integers(0, 1))  # fmt: skip
        def one(body: bytes, region: int, number: int, as_region: int) -> None:
            answer = root.http.post(f"/v1/rounds/{number}/regions/{region}", content=body,
                                    headers=token(data, as_region))  # fmt: skip
            assert 400 <= answer.status_code < 500, answer.text
            assert answer.json()["code"] and round_info(root.http, 1)["received"] == 0

        one()
        assert not list((data / "updates").rglob("*.safetensors")) and not list((data / "tmp").iterdir())


@pytest.mark.parametrize(
    ("options", "aggregation", "says"),
    [
        ({"regions": 2, "root": "http://x:1", "region_token_file": "t"}, {}, "exclude each other"),
        ({"regions": 2, "min_clients": 3, "target_clients": 3}, {}, "counts regions' sums"),
        ({"regions": 2, "checkin_window": 5.0}, {}, "takes no devices"),
        ({"root": "ftp://x", "region_token_file": "t"}, {}, "http:// or https://"),
        ({"root": "http://x:1"}, {}, "--region-token-file"),
        ({"regions": 2, "region": -1}, {}, ">= 0"),
        ({"regions": 2}, {"coordinate_clip": 3.0}, "--coordinate-clip 0"),  # the default clip is on
        ({"root": "http://x:1", "region_token_file": "t"}, {"aggregate": "median"}, "adds plain sums"),
    ],
)
def test_a_tree_setting_that_cannot_work_is_refused_at_start(
    options: dict[str, Any], aggregation: dict[str, Any], says: str
) -> None:
    from fedper.common.errors import ConfigError
    from fedper.common.robust_aggregate import AggregationConfig
    from fedper.server.config import ServerConfig

    plain = AggregationConfig(**{"clip_factor": 0.0, "weight_cap": 0.0, "coordinate_clip": 0.0, **aggregation})
    with pytest.raises(ConfigError, match=re.escape(says)):
        ServerConfig(aggregation=plain, **{"min_clients": 1, **options})


def test_a_region_without_its_token_file_does_not_start(server_artifacts: Path, tmp_path: Path) -> None:
    from fedper.server.state import StartupError

    with pytest.raises(StartupError, match="cannot read the region token"):
        InProcessServer(server_artifacts, tmp_path / "region", clock=FakeClock(), root="http://127.0.0.1:9",
                        region_token_file=str(tmp_path / "missing"), **{k: v for k, v in TREE.items() if k != "regions"}
                        ).__enter__()  # fmt: skip


def test_a_dp_root_takes_only_sums_of_clipped_deltas_of_weight_one_and_a_plain_root_no_bits(
    server_artifacts: Path, server_manifest: Manifest, base0: dict[str, np.ndarray], tmp_path: Path
) -> None:
    layout = server_manifest.layout("base")
    rng = np.random.default_rng(4)

    def moved(length: float) -> dict[str, np.ndarray]:
        step = {n: rng.normal(size=s) for n, s in layout}
        scale = length / np.sqrt(sum(float(np.sum(v * v)) for v in step.values()))
        return {n: (base0[n] + step[n] * scale).astype(np.float32) for n, _ in layout}

    def body(updates: list[dict[str, np.ndarray]], weight: int, unclipped: int | None) -> bytes:
        summed = hierarchical.regional_sum(layout, 0, [(u, weight) for u in updates])
        return hierarchical.encode(replace(summed, unclipped=unclipped))

    dp = {**TREE, "dp": True, "dp_clip": 0.5, "dp_clip_learning_rate": 0, "dp_delta": 1e-5, "dp_sampling_probability": 1.0, "cohort_size": 4,
          "max_update_norm": 0}  # fmt: skip
    with InProcessServer(server_artifacts, tmp_path / "dp-root", **dp) as root:
        data = tmp_path / "dp-root"
        cases = [
            (body([moved(0.4), moved(0.3)], 1, None), "bad_regional_sum"),  # no bit count
            (body([moved(0.4), moved(0.3)], 3, 2), "bad_regional_sum"),  # weights are 1 under DP
            (body([moved(0.9), moved(0.8)], 1, 0), "update_out_of_bounds"),  # beyond the clip
        ]
        for sent, code in cases:
            assert post(root.http, data, 1, 0, sent).json()["code"] == code
        view = root.http.get("/v1/regions/0", headers=token(data, 0)).json()
        assert (view["dp_clip"], view["dp_sampling_probability"]) == (0.5, 1.0)
        assert post(root.http, data, 1, 0, body([moved(0.4), moved(0.3)], 1, 2)).status_code == 202
    with InProcessServer(server_artifacts, tmp_path / "root", **TREE) as plain:
        answer = post(plain.http, tmp_path / "root", 1, 0, body([moved(0.4)], 5, 1))
        assert (answer.status_code, answer.json()["code"]) == (422, "bad_regional_sum")
