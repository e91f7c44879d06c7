"""The centralized upper bound's training loop (its ordinal head: tests/unit/core/test_ordinal_head.py)."""

from __future__ import annotations

from fedper._recipes.centralized_bound import summary, train_pooled
from fedper.data import DataConfig


def test_pooled_training_scores_every_client_and_reports_majority() -> None:
    config = DataConfig(dataset="aesthetic-synth", num_clients=2, users=3, images_per_user=(20, 20), seed=1)
    result = train_pooled(config, "ordinal", epochs=2, lr=0.05)
    assert len(result["curve"]) == 2 and len(result["final"]) == 2 and len(result["majority"]) == 2
    assert all(0.0 <= a <= 1.0 for a in result["final"])
    table = summary({"ordinal": {"1": result}}, 2)
    assert "| ordinal |" in table and "(n = 2)" in table and "baseline: ordinal_features" in table
    assert len(result["ordinal_features"]) == 2 and all(0.0 <= a <= 1.0 for a in result["ordinal_features"])
