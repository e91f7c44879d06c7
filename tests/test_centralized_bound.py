"""The centralized upper bound's ordinal head and its training loop."""

from __future__ import annotations

import torch

from fedper.data import DataConfig
from recipes.centralized_bound import OrdinalHead, summary, train_pooled


def test_ordinal_head_gives_log_probabilities_with_finite_gradients_at_extreme_scores() -> None:
    torch.manual_seed(0)
    head = OrdinalHead(4, 5)
    x = torch.randn(6, 4) * torch.tensor([[1.0], [10.0], [100.0], [1e4], [-1e4], [0.0]])
    logp = head(x)
    assert logp.shape == (6, 5)
    assert torch.allclose(logp.exp().sum(1), torch.ones(6), atol=1e-5)
    torch.autograd.backward(torch.nn.functional.nll_loss(logp, torch.tensor([0, 1, 2, 3, 4, 2])))
    grads = [p.grad for p in head.parameters()]
    assert all(g is not None and torch.isfinite(g).all() for g in grads)


def test_ordinal_head_starts_with_equal_class_probabilities_at_score_zero() -> None:
    head = OrdinalHead(3, 5)
    with torch.no_grad():
        head.score.weight.zero_()
    assert torch.allclose(head(torch.ones(2, 3)).exp(), torch.full((2, 5), 0.2), atol=1e-5)


def test_pooled_training_scores_every_client_and_reports_majority() -> None:
    config = DataConfig(dataset="aesthetic-synth", num_clients=2, users=3, images_per_user=(20, 20), seed=1)
    result = train_pooled(config, "ordinal", epochs=2, lr=0.05)
    assert len(result["curve"]) == 2 and len(result["final"]) == 2 and len(result["majority"]) == 2
    assert all(0.0 <= a <= 1.0 for a in result["final"])
    table = summary({"ordinal": {"1": result}}, 2)
    assert "| ordinal |" in table and "(n = 2)" in table and "baseline: ordinal_features" in table
    assert len(result["ordinal_features"]) == 2 and all(0.0 <= a <= 1.0 for a in result["ordinal_features"])
