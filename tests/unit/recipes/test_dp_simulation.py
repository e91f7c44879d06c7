"""``fedper simulate --dp``: Poisson-sampled clients, clipped deltas, the noised mean, the
epsilon spent round by round and the stop at --target-epsilon."""

import json

import numpy as np
import pytest

from fedper._recipes.simulation import SimulationConfig, run
from fedper.cli import main
from fedper.common import weights
from fedper.common.dp.accountant import epsilon
from fedper.common.dp.config import DPConfig
from fedper.common.train_config import TrainConfig
from fedper.data import DataConfig

DATA = DataConfig(dataset="digits", num_clients=5, classes_per_client=3, seed=1)


def _run(out, algorithms=("fedper", "fedavg", "local"), **privacy):  # type: ignore[no-untyped-def]
    sim = SimulationConfig(
        algorithms=algorithms, rounds=4, fraction=0.6, training=TrainConfig(local_epochs=1),
        threads=1, out=out, privacy=DPConfig(dp=True, **privacy),
    )  # fmt: skip
    run(sim, DATA)
    return json.loads((out / "results.json").read_text())


@pytest.mark.slow
def test_a_dp_run_accounts_every_round_and_stops_before_its_target(tmp_path):
    # q = 3/5, z = 2, delta = 5^-1.1: epsilon 2.06 after 2 rounds, 2.57 after 3
    z, q, delta = 2.0, 3 / 5, 5**-1.1
    target = (epsilon(z, q, 2, delta) + epsilon(z, q, 3, delta)) / 2
    results = _run(tmp_path / "a", dp_noise_multiplier=z, dp_count_stddev=2.0, target_epsilon=target)
    assert set(results["privacy"]) == {"fedper", "fedavg"}  # local shares nothing
    for algorithm in ("fedper", "fedavg"):
        spent = results["privacy"][algorithm]
        assert spent["rounds"] == 2 and spent["stopped_before_round"] == 3
        assert spent["epsilon"] == epsilon(z, q, 2, delta) <= target
        assert spent["delta"] == delta and spent["sampling_probability"] == q
        reports = results["aggregation"][algorithm]
        assert [r["round"] for r in reports] == [1, 2]
        assert [r["epsilon"] for r in reports] == [epsilon(z, q, r, delta) for r in (1, 2)]
        assert reports[0]["clip"] == 1.0 and reports[1]["clip"] == reports[0]["next_clip"] != 1.0  # adaptive
        assert all(r["expected_cohort"] == 3 for r in reports)
        assert results["algorithms"][algorithm]["final_round"] == 3  # the final point, after round 2
    assert results["algorithms"]["local"]["final_round"] == 5  # no budget to spend: every round
    # Seeded noise: the same command gives the same bases (research runs must reproduce).
    again = _run(tmp_path / "b", ("fedavg",), dp_noise_multiplier=z, dp_count_stddev=2.0, target_epsilon=target)
    assert again["algorithms"]["fedavg"] == results["algorithms"]["fedavg"]
    a = weights.load(tmp_path / "a" / "fedavg" / "final_base.safetensors")
    b = weights.load(tmp_path / "b" / "fedavg" / "final_base.safetensors")
    assert all(np.array_equal(a[n], b[n]) for n in a)


def test_dp_with_a_robust_mean_or_a_too_small_count_noise_is_refused(tmp_path, capsys):
    assert main(["simulate", "--dataset", "digits", "--dp", "--aggregate", "median", "--out", str(tmp_path)]) == 2
    assert "--aggregate median has no bounded sensitivity" in capsys.readouterr().err
    # 3 clients a round: the count's default noise (0.15) is below z/2 = 0.5
    argv = ["simulate", "--dataset", "digits", "--clients", "3", "--dp", "--rounds", "1", "--out", str(tmp_path / "x")]
    assert main(argv) == 2
    assert "--dp-count-stddev" in capsys.readouterr().err
    assert not (tmp_path / "x" / "results.json").exists()
