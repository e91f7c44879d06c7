"""The other end-of-run writers (``fedper simulate``'s tables, ``fedper report``'s markdown,
``make results``' tables) render whatever a run can hold, and show its numbers."""

from __future__ import annotations

import re
from pathlib import Path

import pytest
from hypothesis import given, settings
from rich.console import Console

from fedper._recipes.report_command import table_rows
from fedper._recipes.results_suite import mean_std, new_users_table, paired_difference
from fedper._recipes.simulate_command import new_users_table as simulate_new_users_table
from fedper._recipes.simulate_command import run_table
from fedper.common.errors import FedperError
from fedper.run_results import RunResults, load_results, parse_results
from tests.support.run_files import write_run
from tests.support.schema_strategies import from_schema

RUNS = from_schema(RunResults.model_json_schema()).map(lambda doc: parse_results(doc, "generated"))


def _printed(renderable: object) -> str:
    console = Console(record=True, width=400, color_system=None)
    console.print(renderable)
    return console.export_text()


@settings(max_examples=150, deadline=None)
@given(results=RUNS)
def test_simulates_tables_render_any_run_with_its_numbers(results: RunResults) -> None:
    text = _printed(run_table(results, "run"))
    for summary in results.algorithms.values():
        assert f"{summary.final_mean_accuracy:.4f}" in text
        if summary.last5_mean_accuracy is not None:
            assert f"{summary.last5_mean_accuracy:.4f}" in text
    for baseline in results.baselines.values():
        assert f"{baseline.mean_accuracy:.4f}" in text
    for algorithm, spent in results.privacy.items():
        if algorithm in results.algorithms:
            assert f"(delta {spent.delta:.2g}" in text
    if results.new_users is not None:
        text = _printed(simulate_new_users_table(results.new_users))
        for curve in results.new_users.curves.values():
            for point in curve.values():
                if point.mean is not None:
                    assert f"{point.mean:.3f}" in text
                    assert (f"±{point.se:.3f}" if point.se is not None else "(one user)") in text


@settings(max_examples=150, deadline=None)
@given(results=RUNS)
def test_the_markdown_table_has_a_row_per_algorithm_and_baseline_of_any_run(results: RunResults) -> None:
    rows = table_rows("run", results, (10, 20))
    assert len(rows) == len(results.algorithms) + len(results.baselines)
    width = {row.count(" | ") for row in rows}
    assert len(width) <= 1  # every row has the header's columns
    for row, summary in zip(rows, results.algorithms.values(), strict=False):
        assert f" {summary.final_mean_accuracy:.3f} |" in row


def test_make_results_tables_say_which_run_lacks_what(tmp_path: Path) -> None:
    with_both = load_results(write_run(tmp_path / "a", {"fedper": [0.6, 0.5], "fedavg": [0.4, 0.5]}))
    fedper_only = load_results(write_run(tmp_path / "b", {"fedper": [0.6, 0.5]}))
    assert paired_difference([with_both], "fedper", "fedavg") == "+0.100 ± 0.100 (1 won / 0 lost of 2)"
    with pytest.raises(FedperError, match="has no 'fedavg' results"):
        paired_difference([fedper_only], "fedper", "fedavg")
    assert mean_std([0.5, None]) == "-" and mean_std([]) == "-"  # a run written before the number existed


def test_make_results_new_users_table_takes_one_user_points_and_missing_variants(tmp_path: Path) -> None:
    alone = {"users": 1, "mean": 0.25, "std": 0.0, "se": None, "per_user": {"3": 0.25}}
    new_users = {"users": [3], "pool_sizes": [7], "test_sizes": [5], "steps": 50, "sizes": [0, 5, 10],
                 "curves": {"fedper: head": {"0": alone, "5": alone, "10": {"users": 0}}}}  # fmt: skip
    run = write_run(tmp_path / "synth", {"fedper": [0.5]}, new_users=new_users)
    text = new_users_table([run])
    assert "| 5 | 1 | 0.250 (one user) | - |" in text and "| 10 | 0 | - | - |" in text
    assert re.search(r"^\*\*new users\*\* \(`--holdout-clients`, 1 per seed", text)
