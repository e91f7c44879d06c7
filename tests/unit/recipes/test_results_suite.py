"""make results' tables: seeds aggregated, per-client paired differences, the docs block replaced."""

from __future__ import annotations

from pathlib import Path

import pytest

from fedper._recipes import results_suite
from fedper._recipes.results_suite import EXPERIMENTS, tables, write_into
from fedper.common.errors import FedperError
from tests.support.run_files import write_run


def _fake_run(path: Path, per_client: dict[str, list[float]], **parts: object) -> Path:
    return write_run(path, per_client, baselines={"majority": [0.25, 0.35]}, **parts)


def test_tables_pool_paired_differences_over_seeds(tmp_path: Path) -> None:
    runs: dict[str, list[Path]] = {}
    for e in EXPERIMENTS:
        runs[e.name] = [
            _fake_run(tmp_path / f"{e.name}-{s}", {"fedper": [0.6, 0.5 + s / 10], "fedavg": [0.4, 0.5]})
            for s in range(3)
        ]
    text = tables(runs)
    # fedper - fedavg per client: seed s gives 0.2 and s/10 -> diffs 0.2, 0, 0.2, 0.1, 0.2, 0.2.
    assert "vs fedavg: +0.150 ± 0.034 (5 won / 0 lost of 6)" in text
    # Means over seeds of the clients' mean: 0.55, 0.6, 0.65.
    assert "| synth | fedper | 2 | model | ordinal | pretrained | 0.600 ± 0.041 |" in text
    assert "baseline: majority | - | - | - | - | 0.300 ± 0.000" in text
    # A sweep row is paired with the reference experiment's FedPer on the same clients and seeds.
    assert (
        "| synth-kp2 | fedper | 2 | model | ordinal | pretrained | 0.600 ± 0.041 | 0.590 ± 0.041 | 0.033 | "
        "vs synth's fedper: +0.000" in text
    )


def test_write_into_replaces_only_the_marked_block(tmp_path: Path) -> None:
    doc = tmp_path / "RESULTS.md"
    doc.write_text(f"intro\n{results_suite.BEGIN}\nold\n{results_suite.END}\noutro\n")
    write_into(doc, "new table")
    assert doc.read_text() == f"intro\n{results_suite.BEGIN}\nnew table\n{results_suite.END}\noutro\n"
    (tmp_path / "other.md").write_text("no markers")
    with pytest.raises(FedperError, match="no .* block"):
        write_into(tmp_path / "other.md", "x")


def test_new_users_table_pools_users_over_seeds(tmp_path: Path) -> None:
    runs = []
    for seed, values in enumerate(([0.2, 0.4], [0.6, 0.8])):
        per_user = {str(u): v for u, v in enumerate(values)}
        majority = {"0": 0.3, "1": 0.5}  # the same users' majority of N: paired user by user, seed by seed

        def point(accuracies: dict[str, float]) -> dict[str, object]:
            return {"users": 2, "mean": 0.5, "std": 0.1, "se": 0.1, "per_user": accuracies}

        new_users = {"users": [0, 1], "pool_sizes": [50, 50], "test_sizes": [10, 10], "steps": 50, "sizes": [0, 100],
                     "curves": {"fedper: head": {"0": point(per_user), "100": {"users": 0}},
                                "majority of N": {"0": point(majority), "100": {"users": 0}}}}  # fmt: skip
        runs.append(_fake_run(tmp_path / f"synth-{seed}", {"fedper": [0.5]}, new_users=new_users))
    text = results_suite.new_users_table(runs)
    # 4 users: mean 0.5, sample std 0.258, SE 0.129; nobody has 100 photos.
    assert "| 0 | 4 | 0.500 ± 0.129 |" in text and "| 100 | 0 | - | - | - |" in text
    # Differences -0.1, -0.1, 0.3, 0.3: mean 0.1, SE 0.1155.
    assert "| 0.400 ± 0.058 | +0.100 ± 0.115 (2 won / 2 lost) |" in text


def test_probe_tables_pair_each_user_and_pool_the_seeds() -> None:
    features = {"look.brightness": 0.9}
    results = [
        {"seed": s, "size": 32, "majority": [0.3, 0.3], "random": [0.3, 0.4], "pretrained": [0.5, 0.4 + s / 10],
         "random_ordinal": [0.3, 0.3], "pretrained_ordinal": [0.4, 0.5], "generator_features": [0.6, 0.6],
         "generator_features_ordinal": [0.7, 0.7], "random_feature_r2": {"look.brightness": 0.1},
         "pretrained_feature_r2": features}
        for s in range(3)
    ]  # fmt: skip
    text = results_suite.probe_tables(results)
    assert "**frozen-base probe, 32 px** (the packaged base; 2 users per seed, seeds 0, 1, 2)" in text
    # pretrained - random per user: 0.2 and s/10 -> 0.2, 0, 0.2, 0.1, 0.2, 0.2.
    assert "| logistic | 0.300 | 0.350 | 0.500 | +0.150 ± 0.034 (5 won / 0 lost of 6) |" in text
    assert "| ordinal | 0.300 | 0.300 | 0.450 | +0.150 ± 0.022 (6 won / 0 lost of 6) |" in text
    assert "| look.brightness | 0.90 | 0.10 |" in text


def test_the_sizes_table_pairs_each_user_at_64_px_with_the_same_user_at_32_px() -> None:
    at32 = [{"majority": [0.3, 0.3], "pretrained": [0.4, 0.4], "pretrained_ordinal": [0.4, 0.5]} for _ in range(2)]
    at64 = [{"majority": [0.3, 0.3], "pretrained": [0.5, 0.4 + s / 10], "pretrained_ordinal": [0.4, 0.5]}
            for s in range(2)]  # fmt: skip
    text = results_suite.sizes_table(at32, at64)
    # 64 - 32 per user: 0.1, 0, 0.1, 0.1 -> mean 0.075, SE 0.025; against the majority 0.2, 0.1, 0.2, 0.2.
    assert "| logistic | 0.300 | 0.400 | 0.475 | +0.075 ± 0.025 (3 won / 0 lost of 4) | +0.175 ± 0.025" in text
    assert "| ordinal | 0.300 | 0.450 | 0.450 | +0.000 ± 0.000 (0 won / 0 lost of 4) |" in text
