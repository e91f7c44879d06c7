"""The simulation's tamper hook and the attacks of ``make poisoning`` (recipes/poisoning.py)."""

import numpy as np
import pytest

from fedper._recipes import poisoning
from fedper._recipes.simulation import SimulationConfig, run
from fedper.common.robust_aggregate import group_norms
from fedper.common.train_config import TrainConfig
from fedper.data import DataConfig

DATA = DataConfig(dataset="digits", num_clients=3, classes_per_client=4, seed=1)


def _sim(tmp_path, name):  # type: ignore[no-untyped-def]
    return SimulationConfig(algorithms=("fedper",), kp=1, rounds=2, training=TrainConfig(local_epochs=1), threads=1,
                            out=tmp_path / name)  # fmt: skip


@pytest.mark.slow
def test_an_honest_tamper_changes_nothing_and_a_refused_update_is_left_out(tmp_path):
    clean = run(_sim(tmp_path, "clean"), DATA)
    same = run(_sim(tmp_path, "same"), DATA, tamper=lambda c, u, n, b: (u, n))
    assert clean.final("fedper") == same.final("fedper")
    assert [r["updates"] for r in clean.aggregation["fedper"]] == [3, 3]
    assert all(r["capped"] == 0 for r in clean.aggregation["fedper"])  # 95-158 photos each

    def variance_attack(client, update, n, base):  # type: ignore[no-untyped-def]
        return (
            poisoning.ATTACKS["one BatchNorm variance -40 (finding 3)"](update, n, base) if client == 0 else (update, n)
        )

    refused = run(_sim(tmp_path, "refused"), DATA, tamper=variance_attack)
    assert [r["updates"] for r in refused.aggregation["fedper"]] == [2, 2]  # as the server's 422 leaves it out
    dropped = run(_sim(tmp_path, "dropped"), DATA, tamper=lambda c, u, n, b: None if c == 0 else (u, n))
    assert refused.final("fedper") == dropped.final("fedper")


def test_the_attacks_send_what_their_names_say():
    rng = np.random.default_rng(0)
    base = {"w": rng.normal(size=(4, 3)).astype(np.float32), "bn.running_var": np.ones(3, np.float32)}
    update = {"w": base["w"] + 0.1, "bn.running_var": np.full(3, 1.5, np.float32)}
    attacks = poisoning.ATTACKS
    assert attacks["none (clean run)"] is None
    sent, n = attacks["base + 1e30, n = 100,000 (finding 1)"](update, 50, base)  # type: ignore[misc]
    assert n == 100_000 and np.all(sent["w"] > 1e29)
    sent, n = attacks["-1000 x base (finding 1)"](update, 50, base)  # type: ignore[misc]
    assert n == 50 and np.allclose(sent["w"], -1000 * base["w"]) and np.all(sent["bn.running_var"] > 0)
    sent, n = attacks["ascent, 2.9 x its step, n = 100,000 (finding 2)"](update, 50, base)  # type: ignore[misc]
    sent_norm, own_norm = group_norms(sent, base)["parameters"], group_norms(update, base)["parameters"]
    assert n == 100_000 and sent_norm == pytest.approx(2.9 * own_norm, rel=1e-5)
    sent, _ = attacks["sign flip (-1 x its step)"](update, 50, base)  # type: ignore[misc]
    assert np.allclose(sent["w"], base["w"] - 0.1)
    sent, _ = attacks["scaled step (10 x)"](update, 50, base)  # type: ignore[misc]
    assert np.allclose(sent["w"], base["w"] + 1.0, atol=1e-5)
    sent, _ = attacks["one BatchNorm variance -40 (finding 3)"](update, 50, base)  # type: ignore[misc]
    assert sent["bn.running_var"][0] == -40 and update["bn.running_var"][0] == 1.5  # the honest copy kept


def test_the_table_has_a_row_per_attack_and_a_column_per_aggregation():
    results = {(a, g): [0.5, 0.7] for a in poisoning.ATTACKS for g in poisoning.AGGREGATIONS}
    text = poisoning.table(results)
    assert text.count("0.600 ± 0.100") == len(poisoning.ATTACKS) * len(poisoning.AGGREGATIONS)
    assert all(f"| {a} |" in text for a in poisoning.ATTACKS)
