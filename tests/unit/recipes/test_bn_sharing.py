"""make bn-sharing's table: local paired with shared client by client, the docs block replaced."""

from __future__ import annotations

from pathlib import Path

import pytest

from fedper._recipes import bn_sharing
from fedper._recipes.bn_sharing import EXPERIMENTS, table, write_into
from fedper.common.errors import FedperError
from tests.support.run_files import write_run

DOCS = Path(__file__).resolve().parents[3] / "docs"


def _fake_run(path: Path, per_client: list[float], clipped: int = 0) -> Path:
    reports = [{"round": 1, "updates": len(per_client), "clipped": clipped}]
    return write_run(path, {"fedper": per_client}, aggregation={"fedper": reports})


def test_the_experiments_are_each_dataset_under_both_modes_local_paired_with_shared() -> None:
    assert [(e.name, e.reference) for e in EXPERIMENTS] == [
        ("synth-bn-shared", ""), ("synth-bn-local", "synth-bn-shared"),
        ("digits-k4-bn-shared", ""), ("digits-k4-bn-local", "digits-k4-bn-shared"),
    ]  # fmt: skip
    for e in EXPERIMENTS:
        assert e.options[-2:] == ("--bn", e.name.rsplit("-", 1)[1])
        assert "--threads" not in e.options and "--seed" not in e.options  # the runner adds them


def test_the_table_pairs_local_with_shared_per_client_and_pools_the_seeds(tmp_path: Path) -> None:
    shared = [[0.5, 0.6, 0.7], [0.4, 0.6, 0.8], [0.5, 0.5, 0.5]]
    # Per client local - shared: seed 0: +0.1, 0, -0.1; seed 1: +0.2, +0.1, 0; seed 2: +0.3, +0.3, +0.3.
    local = [[0.6, 0.6, 0.6], [0.6, 0.7, 0.8], [0.8, 0.8, 0.8]]
    runs: dict[str, list[Path]] = {}
    for e in EXPERIMENTS:
        values = local if e.reference else shared
        runs[e.name] = [_fake_run(tmp_path / f"{e.name}-seed{s}", v, clipped=s) for s, v in enumerate(values)]
    text = table(runs)
    # 9 pairs: mean 0.1333, sample std 0.15, SE 0.05; 6 won, 1 lost, two ties.
    assert "| aesthetic-synth | local | 0.700 ± 0.082 | +0.133 ± 0.050 (6 won / 1 lost of 9) |" in text
    # The clients' mean per seed: 0.6, 0.6, 0.5.
    assert "| aesthetic-synth | shared | 0.567 ± 0.047 | - |" in text
    assert "| digits, 4 classes per client | local | 0.700 ± 0.082 | +0.133 ± 0.050 (6 won / 1 lost of 9) |" in text
    assert "aesthetic-synth, shared: 3 of 9; aesthetic-synth, local: 3 of 9" in text


def test_a_client_missing_from_one_mode_is_left_out_of_the_pairs(tmp_path: Path) -> None:
    runs = {e.name: [_fake_run(tmp_path / e.name, [0.5, 0.5] if e.reference else [0.4, 0.5, 0.9])] for e in EXPERIMENTS}
    assert "+0.050 ± 0.050 (1 won / 0 lost of 2)" in table(runs)


def test_the_block_is_written_between_the_markers_of_results_md(tmp_path: Path) -> None:
    doc = tmp_path / "RESULTS.md"
    doc.write_text((DOCS / "RESULTS.md").read_text())
    write_into(doc, "| new | table |")
    before, rest = doc.read_text().split(bn_sharing.BEGIN)
    inside, after = rest.split(bn_sharing.END)
    assert inside == "\n| new | table |\n"
    assert "## BatchNorm statistics: shared and validated, or kept on the device (FedBN)" in before
    assert "<!-- results:begin" in before and "## New users" in after  # the other blocks untouched
    (tmp_path / "other.md").write_text("no markers")
    with pytest.raises(FedperError, match="no .* block"):
        write_into(tmp_path / "other.md", "x")
