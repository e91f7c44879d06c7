"""The run-time estimate: its arithmetic, and the step timing it rests on."""

from __future__ import annotations

import pytest
import torch

from fedper._recipes.run_estimate import RunEstimate, duration, measure_step, steps_per_round
from fedper.common.train_config import TrainConfig
from fedper.models import ModelConfig


def test_steps_per_round_counts_each_clients_batches_over_its_epochs():
    training = TrainConfig(local_epochs=4, batch_size=4)
    # 10 samples: batches of 4, 4 and 2; 9 samples: 4, 4 and a last batch of 1 that is dropped.
    assert steps_per_round([10, 9], training, clients_per_round=2) == 4 * (3 + 2)
    assert steps_per_round([10, 9], training, clients_per_round=1) == 4 * (3 + 2) / 2  # the mean client


def test_estimate_multiplies_step_time_by_steps_rounds_and_algorithms():
    estimate = RunEstimate(step_seconds=1.9, steps_per_round=750, rounds=35, algorithms=3)
    assert estimate.seconds == pytest.approx(1.9 * 750 * 35 * 3)
    assert str(estimate).startswith("about 41.6 h on this machine (1.90 s per step x 750 steps per round x 35 rounds")
    assert "0.012" not in str(RunEstimate(0.012, 20, 1, 1)) and "12 ms per step" in str(RunEstimate(0.012, 20, 1, 1))
    assert [duration(s) for s in (5, 600, 3 * 3600, 5 * 86400)] == ["5 s", "10 min", "3.0 h", "5.0 days"]


def test_measured_step_leaves_the_random_state_alone():
    torch.manual_seed(7)
    expected = torch.rand(3)
    torch.manual_seed(7)
    seconds = measure_step(ModelConfig(num_classes=5, alpha=0.25, input_size=32), TrainConfig(batch_size=4), steps=2)
    assert seconds > 0
    assert torch.equal(torch.rand(3), expected)
