"""make dp-results: each epsilon's noise multiplier from the accountant, the table's pairing, the block."""

from __future__ import annotations

import math
from pathlib import Path

import pytest

from fedper._recipes import dp_suite
from fedper._recipes.doc_block import write_block
from fedper._recipes.dp_suite import COHORT, ROUNDS, TARGETS, USERS, delta, experiments, noise_for, table
from fedper.common.dp.accountant import epsilon
from fedper.common.errors import FedperError
from tests.support.run_files import write_run

DOCS = Path(__file__).resolve().parents[3] / "docs"


def test_each_noise_multiplier_is_the_smallest_to_a_hundredth_within_its_epsilon() -> None:
    q = COHORT / USERS
    for target in TARGETS:
        z = noise_for(target)
        if math.isinf(target):
            assert z == 0.0
            continue
        assert epsilon(z, q, ROUNDS, delta()) <= target < epsilon(z - 0.01, q, ROUNDS, delta())


def test_the_experiments_are_one_dp_run_of_both_algorithms_per_epsilon_at_the_issues_scale() -> None:
    runs = experiments()
    assert [e.name for e in runs] == ["dp-eps-inf", "dp-eps-8", "dp-eps-4", "dp-eps-2"]
    for e, target in zip(runs, TARGETS, strict=True):
        options = dict(zip(e.options[::2], e.options[1::2], strict=False))
        assert "--dp" in e.options and e.options[-2:] == ("--dp-noise-multiplier", f"{noise_for(target):g}")
        assert int(options["--users"]) >= 1000 and options["--clients"] == options["--users"]
        assert float(options["--fraction"]) * int(options["--users"]) == 100  # the issue's cohort of 100
        assert options["--algorithms"] == "fedper,fedavg"
        assert "--threads" not in e.options and "--seed" not in e.options  # the runner adds them


def _fake_run(path: Path, fedper: list[float], fedavg: list[float], eps: float | None) -> Path:
    def spent() -> dict[str, object]:
        return {"epsilon": eps, "delta": delta(), "rounds": ROUNDS, "noise_multiplier": 1.0,
                "sampling_probability": COHORT / USERS}  # fmt: skip

    return write_run(
        path, {"fedper": fedper, "fedavg": fedavg},
        baselines={"majority": [0.3, 0.3], "per_client_features": [0.4, 0.4]},
        aggregation={"fedper": [{"round": 1, "clip": 0.5}], "fedavg": [{"round": 1, "clip": 2.0}]},
        privacy={"fedper": spent(), "fedavg": spent()},
    )  # fmt: skip


def test_the_table_pairs_clients_across_algorithms_and_against_the_noiseless_run(tmp_path: Path) -> None:
    runs: dict[str, list[Path]] = {}
    for i, e in enumerate(experiments()):
        # Without noise FedPer 0.6 and FedAvg 0.4 on both clients; every noise level takes 0.1
        # from FedPer and 0.2 from FedAvg on client 0, nothing on client 1 (seed s adds s/100 to FedPer).
        cost = 0.0 if i == 0 else 1.0
        eps = None if i == 0 else 8.0 / i
        fedavg = [0.4 - 0.2 * cost, 0.4]
        runs[e.name] = [
            _fake_run(tmp_path / f"{e.name}-seed{s}", [0.6 - 0.1 * cost + s / 100, 0.6 + s / 100], fedavg, eps)
            for s in range(3)
        ]
    text = table(runs)
    lines = {line.split(" | ")[0]: line for line in text.splitlines() if line.startswith("| ")}
    # Noiseless: FedPer - FedAvg per client is 0.2 + s/100: mean 0.21, 6 pairs, sample std 0.0089.
    assert lines["| ∞"].startswith("| ∞ | 0 | ∞ | 0.5 / 2 | 0.610 ± 0.008 | 0.400 ± 0.000 | +0.210 ± 0.004")
    assert lines["| ∞"].endswith("| - |")
    # eps 8: FedPer keeps 0.1 more than FedAvg on client 0 and the same on client 1: +0.05 ± 0.022.
    row = lines["| 8"]
    assert f"| 8 | {noise_for(8.0):g} | 8.00 | 0.5 / 2 | 0.560 ± 0.008 | 0.300 ± 0.000 |" in row
    assert row.endswith("| +0.050 ± 0.022 (per seed +0.050, +0.050, +0.050) |")
    assert "majority rating 0.300 ± 0.000" in text and "(the ceiling) 0.400 ± 0.000" in text


def test_the_block_is_written_between_the_markers_of_results_md(tmp_path: Path) -> None:
    doc = tmp_path / "RESULTS.md"
    doc.write_text((DOCS / "RESULTS.md").read_text())
    write_block(doc, dp_suite.BEGIN, dp_suite.END, "| new | table |\n")
    before, rest = doc.read_text().split(dp_suite.BEGIN)
    inside, after = rest.split(dp_suite.END)
    assert "## New users" in after
    assert inside.strip() == "| new | table |"
    assert "## User-level differential privacy" in before
    assert "<!-- results:begin" in before and "<!-- bn-sharing:begin" in before  # the other blocks untouched
    (tmp_path / "other.md").write_text("no markers")
    with pytest.raises(FedperError, match="no .* block"):
        write_block(tmp_path / "other.md", dp_suite.BEGIN, dp_suite.END, "x")
