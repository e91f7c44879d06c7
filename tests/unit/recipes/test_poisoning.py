"""The simulation's tamper hook and the attacks of ``make poisoning`` (recipes/poisoning.py)."""

import numpy as np
import pytest

from fedper._recipes import poisoning
from fedper._recipes.simulation import SimulationConfig, run
from fedper.common.robust_aggregate import BATCHNORM_VARIANCE, group_norms
from fedper.common.train_config import TrainConfig
from fedper.data import DataConfig
from tests.support.run_files import write_run

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
        if client != 0:
            return update, n
        name = sorted(k for k in update if k.endswith(BATCHNORM_VARIANCE))[0]
        return {**update, name: np.full_like(update[name], -40.0)}, n

    refused = run(_sim(tmp_path, "refused"), DATA, tamper=variance_attack)
    assert [r["updates"] for r in refused.aggregation["fedper"]] == [2, 2]  # as the server's 422 leaves it out
    dropped = run(_sim(tmp_path, "dropped"), DATA, tamper=lambda c, u, n, b: None if c == 0 else (u, n))
    assert refused.final("fedper") == dropped.final("fedper")


def _round(attack, seed=0):  # type: ignore[no-untyped-def]
    """One round of 10 clients, the last hostile: the adversary, the base, the attacker's own update."""
    rng = np.random.default_rng(seed)
    base = {"a.weight": rng.normal(size=(4, 3)).astype(np.float32), "a.bias": np.zeros(3, np.float32),
            "bn.running_mean": np.zeros(3, np.float32), "bn.running_var": np.ones(3, np.float32)}  # fmt: skip
    updates = [{k: (v + rng.normal(scale=0.1, size=v.shape)).astype(np.float32) for k, v in base.items()}
               for _ in range(poisoning.CLIENTS)]  # fmt: skip
    adversary = poisoning.Adversary(attack, 1, seed)
    sent = [adversary.tamper(c, u, 100, base) for c, u in enumerate(updates)]
    return adversary, base, updates[-1], sent[-1]


def _delta(tensors, base, names):  # type: ignore[no-untyped-def]
    return np.concatenate([(tensors[n].astype(np.float64) - base[n]).ravel() for n in names])


WEIGHTS = ["a.bias", "a.weight"]


def _step(adversary, base):  # type: ignore[no-untyped-def]
    """The round's honest step over the weights."""
    step = adversary.honest_step(adversary.rounds[-1][1], base)
    return np.concatenate([step[n].ravel() for n in WEIGHTS])


@pytest.mark.parametrize("attack", list(poisoning.ATTACKS))
def test_every_attack_stays_inside_the_default_bound_and_claims_its_honest_count(attack):
    _, base, own, (sent, n) = _round(attack)
    assert n == 100
    own_norms, sent_norms = group_norms(own, base), group_norms(sent, base)
    for group, norm in sent_norms.items():
        assert norm <= poisoning.BUDGET * own_norms[group] * (1 + 1e-5)
    assert np.all(sent["bn.running_var"] > 0)  # what the server would refuse, it keeps out of


def test_the_attacks_send_what_their_names_say():
    adversary, base, _, (sent, _) = _round("sign-flip")
    honest = _step(adversary, base)
    assert np.dot(_delta(sent, base, WEIGHTS), honest) == pytest.approx(
        -np.linalg.norm(_delta(sent, base, WEIGHTS)) * np.linalg.norm(honest), rel=1e-4
    )  # exactly backwards
    adversary, base, _, (sent, _) = _round("orthogonal")
    honest = _step(adversary, base)
    assert abs(np.dot(_delta(sent, base, WEIGHTS), honest)) < 1e-6 * np.linalg.norm(honest)
    _, base, own, (sent, _) = _round("one-weight")
    assert np.count_nonzero(_delta(sent, base, WEIGHTS)) == 1
    assert np.array_equal(sent["bn.running_mean"], own["bn.running_mean"])  # the statistics honest
    _, base, own, (sent, _) = _round("one-bn-mean")
    assert np.count_nonzero(sent["bn.running_mean"] - base["bn.running_mean"]) == 1
    assert np.array_equal(sent["a.weight"], own["a.weight"])


def test_progress_and_drift_measure_the_published_step_against_the_honest_one():
    adversary, base, _, _ = _round("sign-flip")
    step = adversary.honest_step(adversary.rounds[-1][1], base)
    as_honest = {k: base[k] + step[k] for k in base}
    assert adversary.measure(as_honest)["progress"] == [pytest.approx(1.0)]
    assert adversary.measure(as_honest)["drift"] == [pytest.approx(0.0, abs=1e-6)]
    backwards = {k: base[k] - 2 * step[k] for k in base}
    assert adversary.measure(backwards)["progress"] == [pytest.approx(-2.0)]
    assert adversary.measure(base)["progress"] == [pytest.approx(0.0)]


def test_the_table_has_a_row_per_scenario_and_a_column_per_aggregation():
    one = {"progress": [0.5, 1.0], "drift": [0.25], "honest_accuracy": 0.6}
    results = {(s.label, a): [one] * 3 for s in poisoning.SCENARIOS for a in poisoning.AGGREGATIONS}
    text = poisoning.table(results)
    assert text.count("0.75 ± 0.00") == len(poisoning.SCENARIOS) * len(poisoning.AGGREGATIONS)
    assert text.count("0.60 ± 0.00") == len(poisoning.SCENARIOS) * len(poisoning.AGGREGATIONS)
    assert all(f"| {s.label} |" in text for s in poisoning.SCENARIOS)
    assert text.count("(default)**") == 4  # in each table's header, and its row of the summary
    # The summary pairs each option with the defaults before: identical runs differ by 0 in every pair.
    assert text.count("+0.00 ± 0.00 (0 won / 0 lost of 45)") == 2 * (len(poisoning.AGGREGATIONS) - 1)


def test_the_honest_cost_table_pairs_the_default_with_before_per_client(tmp_path):
    runs = {}
    for e in poisoning.HONEST_EXPERIMENTS:
        shift = 0.1 if e.name.endswith("default") else 0.0
        runs[e.name] = [write_run(tmp_path / f"{e.name}-{seed}", {"fedper": [0.4 + shift, 0.5 + shift + seed / 100]})
                        for seed in range(3)]  # fmt: skip
    text = poisoning.honest_cost_table(runs)
    assert text.count("| 0.455 ± 0.004 | 0.555 ± 0.004 | +0.100 ± 0.000 (6 won / 0 lost of 6) |") == 2
    assert "| aesthetic-synth |" in text and "| digits, 4 classes per client |" in text
    assert "--coordinate-clip 0" in " ".join(poisoning.HONEST_EXPERIMENTS[0].options)
