"""The root's rounds as a state machine (hypothesis): regions send honest sums, a hostile region
sends what it can (garbage, another region's number, a stale version, a NaN, a sum beyond
float32, a weight no devices could have, a second sum), and the clock runs out. Whatever the order, every refusal changes
nothing, every round ends published as the honest sums combined (the bytes the protocol's
arithmetic gives) or abandoned with its reason, and the next round takes sums again."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import numpy as np
from hypothesis import HealthCheck, settings
from hypothesis import strategies as st
from hypothesis.stateful import RuleBasedStateMachine, invariant, rule

from fedper.common import hierarchical, weights
from fedper.common.manifest import Manifest
from tests.support.server_support import FakeClock, InProcessServer, admin, base_like, round_info

TREE = {"regions": 2, "min_clients": 1, "round_timeout": 60, "clip_factor": 0, "weight_cap": 0, "coordinate_clip": 0}


def _honest(manifest: Manifest, number: int, region: int, version: int) -> bytes:
    layout = manifest.layout("base")
    updates = [(base_like(manifest, seed=1000 * number + 10 * region + i), 3 + i) for i in range(2)]
    return hierarchical.encode(hierarchical.regional_sum(layout, region, updates, version))


def _hostile(manifest: Manifest, honest: bytes, kind: str, version: int) -> bytes:
    layout = manifest.layout("base")
    summed = hierarchical.decode(honest, layout)
    if kind == "garbage":
        return honest[: len(honest) // 2]
    if kind == "other region":
        return hierarchical.encode(hierarchical.RegionalSum(1 - summed.region, summed.weighted_sum, summed.weight,
                                                            summed.count, version))  # fmt: skip
    if kind == "stale":
        return hierarchical.encode(hierarchical.RegionalSum(summed.region, summed.weighted_sum, summed.weight,
                                                            summed.count, version + 1))  # fmt: skip
    if kind == "huge":  # finite in float64, beyond float32 once divided
        tensors = {name: values * 1e300 for name, values in summed.weighted_sum.items()}
        return hierarchical.encode(hierarchical.RegionalSum(summed.region, tensors, summed.weight, summed.count,
                                                            version))  # fmt: skip
    if kind == "nan":
        tensors = {**summed.weighted_sum}
        name = next(iter(tensors))
        tensors[name] = tensors[name].copy()
        tensors[name].flat[0] = np.nan
        return hierarchical.encode(hierarchical.RegionalSum(summed.region, tensors, summed.weight, summed.count,
                                                            version))  # fmt: skip
    # a weight no `count` devices could claim
    return hierarchical.encode(hierarchical.RegionalSum(summed.region, summed.weighted_sum, 10**12, summed.count,
                                                        version))  # fmt: skip


def run_machine(artifacts: Path, manifest: Manifest, work: Path) -> None:
    counter = iter(range(10**6))

    class RootRounds(RuleBasedStateMachine):
        def __init__(self) -> None:
            super().__init__()
            self.clock = FakeClock()
            self.data = work / f"root-{next(counter)}"
            self.server = InProcessServer(artifacts, self.data, clock=self.clock, **TREE).__enter__()
            self.round, self.version = 1, 0
            self.sums: dict[int, bytes] = {}
            self.tokens = [{"Authorization": f"Bearer {(self.data / 'region_tokens' / f'region-{k}').read_text().strip()}"}
                           for k in (0, 1)]  # fmt: skip

        def teardown(self) -> None:
            self.server.__exit__(None, None, None)

        def _post(self, region: int, body: bytes, number: int | None = None) -> Any:
            path = f"/v1/rounds/{self.round if number is None else number}/regions/{region}"
            return self.server.http.post(path, content=body, headers=self.tokens[region])

        def _closed(self, reason: str) -> None:
            info = round_info(self.server.http, self.round)
            if self.sums:
                layout = manifest.layout("base")
                expected = hierarchical.combine(layout, [hierarchical.decode(b, layout) for b in self.sums.values()])
                assert info["state"] == "closed", info
                self.version = info["result_version"]
                published = self.server.http.get(f"/v1/models/{self.version}/base", headers=admin()).content
                got = weights.decode(published, "the root's version")
                assert all(got[n].tobytes() == expected[n].tobytes() for n in expected), reason
            else:
                assert info["state"] == "abandoned" and info["reason"], info
            self.round, self.sums = self.round + 1, {}

        @rule(region=st.integers(0, 1))
        def honest(self, region: int) -> None:
            body = _honest(manifest, self.round, region, self.version)
            answer = self._post(region, body)
            if region in self.sums and self.sums[region] != body:
                assert answer.status_code == 409
                return
            assert answer.status_code == 202, answer.text
            self.sums[region] = body
            if len(self.sums) == 2:
                self._closed("every region's sum in")

        @rule(
            region=st.integers(0, 1),
            kind=st.sampled_from(["garbage", "other region", "stale", "nan", "huge", "weight"]),
        )
        def hostile(self, region: int, kind: str) -> None:
            honest = _honest(manifest, self.round, region, self.version)
            answer = self._post(region, _hostile(manifest, honest, kind, self.version))
            assert 400 <= answer.status_code < 500, answer.text

        @rule(region=st.integers(0, 1))
        def second_sum(self, region: int) -> None:
            if region not in self.sums:
                return
            answer = self._post(region, _honest(manifest, self.round + 7, region, self.version))
            assert (answer.status_code, answer.json()["code"]) == (409, "duplicate_update")

        @rule(region=st.integers(0, 1))
        def old_round(self, region: int) -> None:
            if self.round == 1:
                return
            answer = self._post(region, _honest(manifest, self.round - 1, region, self.version), self.round - 1)
            assert (answer.status_code, answer.json()["code"]) == (409, "round_not_open")

        @rule()
        def deadline(self) -> None:
            self.clock.now += 61
            assert self.server.state is not None
            self.server.state.rounds.tick()
            self._closed("the deadline")

        @invariant()
        def the_root_holds_what_the_model_holds(self) -> None:
            view = self.server.http.get("/v1/regions/0", headers=self.tokens[0]).json()
            assert (view["round"], view["model_version"]) == (self.round, self.version)
            assert round_info(self.server.http, self.round)["received"] == len(self.sums)

    RootRounds.TestCase.settings = settings(max_examples=12, stateful_step_count=12, deadline=None,
                                            suppress_health_check=[HealthCheck.too_slow])  # fmt: skip
    RootRounds.TestCase().runTest()


def test_the_roots_rounds_hold_whatever_the_regions_send_and_when(
    server_artifacts: Path, server_manifest: Manifest, tmp_path: Path
) -> None:
    run_machine(server_artifacts, server_manifest, tmp_path)
