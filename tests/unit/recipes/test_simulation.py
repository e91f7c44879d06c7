import csv
import dataclasses
import json
from pathlib import Path

import numpy as np
import pytest
import torch

from fedper._recipes.simulation import SimulationConfig, run
from fedper.cli import main
from fedper.common import weights
from fedper.common.train_config import TrainConfig
from fedper.data import DataConfig, load_federated, to_tensor
from fedper.eager_trainer import EagerTrainer
from fedper.local_training import evaluate
from fedper.models import ModelConfig, build_model, split
from fedper.models.split import exchanged_names
from fedper.trainer import to_torch

# The learning run: five clients of the digits, two classes each. From random weights this
# MobileNet scores about its clients' majority class for the first rounds, then takes off:
# above 0.8 after 7-8 rounds and 0.957-0.996 after 12, over seeds 0-2 under the default and AVX2
# kernels (issue 25; the seed stands in for rounding, which perturbs training the same way).
# Twelve rounds put the final point well past the take-off; at 5 rounds of lr 0.01 FedPer sat
# at the majority baseline and rounding decided which side of it.
CLIENTS, ROUNDS = 5, 12
NON_IID = DataConfig(dataset="digits", num_clients=CLIENTS, classes_per_client=2, seed=0)


@pytest.fixture(scope="module")
def strongly_non_iid_run(tmp_path_factory) -> tuple[Path, dict]:
    out = tmp_path_factory.mktemp("sim")
    sim = SimulationConfig(algorithms=("fedper", "fedavg"), kp=2, rounds=ROUNDS,
                           training=TrainConfig(local_epochs=1, learning_rate=0.05), threads=1, out=out)  # fmt: skip
    run(sim, NON_IID)
    return out, json.loads((out / "results.json").read_text())


@pytest.mark.slow
@pytest.mark.numeric
def test_fedper_beats_fedavg_when_clients_see_two_classes_each(strongly_non_iid_run, claim):
    """FedAvg's one model cannot serve clients of different classes: 0.48-0.56 below FedPer over
    kernel sets and thread counts (make test-portable); the bound is 0.2."""
    _, results = strongly_non_iid_run
    fedper = results["algorithms"]["fedper"]["final_mean_accuracy"]
    fedavg = results["algorithms"]["fedavg"]["final_mean_accuracy"]
    claim.above("FedPer minus FedAvg, final mean accuracy", fedper - fedavg, 0.2)


@pytest.mark.slow
@pytest.mark.numeric
def test_fedper_learns_well_above_each_clients_majority_class(strongly_non_iid_run, claim):
    """The learning claim: 0.44-0.48 above the majority baseline (0.52) over kernel sets and
    thread counts (make test-portable); the bound is 0.2. Seed 0 is the one tested: over seeds
    0-2 the margin is 0.22-0.50 (seed 2's clients have a 0.76 majority)."""
    _, results = strongly_non_iid_run
    fedper = results["algorithms"]["fedper"]["final_mean_accuracy"]
    claim.above(
        "FedPer minus majority, final mean accuracy", fedper - results["baselines"]["majority"]["mean_accuracy"], 0.2
    )


@pytest.mark.slow
def test_run_writes_metrics_plots_and_reusable_weights(strongly_non_iid_run):
    out, results = strongly_non_iid_run
    assert results["config"]["simulation"]["kp"] == 2
    assert results["environment"]["torch"] == torch.__version__
    assert results["environment"]["cpu_capability"] == torch.backends.cpu.get_cpu_capability()
    assert results["environment"]["torch_threads"] == 1
    # Digits have no generator features: only the majority baseline, one value per client.
    assert set(results["baselines"]) == {"majority"}
    assert len(results["baselines"]["majority"]["per_client"]) == CLIENTS
    # Rounds 1-12 at their start, then the final point after round 12's aggregation.
    final = ROUNDS + 1
    assert [r["round"] for r in results["rounds"]["fedper"]] == list(range(1, final + 1))
    assert [r.get("final", False) for r in results["rounds"]["fedper"]] == [False] * ROUNDS + [True]
    assert results["rounds"]["fedper"][-1]["after_round"] == ROUNDS
    assert "accuracy_after" not in results["rounds"]["fedper"][-1]
    assert results["algorithms"]["fedper"]["final_round"] == final
    assert results["algorithms"]["fedper"]["final_point"] == f"after round {ROUNDS}"
    assert results["algorithms"]["fedper"]["last5_rounds"] == list(range(final - 4, final + 1))
    first = results["rounds"]["fedper"][0]
    assert set(first) >= {"accuracy", "accuracy_after", "train_loss"}
    assert set(first["accuracy"]) == {"mean", "weighted_mean", "std", "count"}
    with (out / "metrics.csv").open() as f:
        rows = list(csv.DictReader(f))
    assert len(rows) == 2 * final * CLIENTS
    assert {r["algorithm"] for r in rows} == {"fedper", "fedavg"}
    last = [float(r["accuracy"]) for r in rows if r["algorithm"] == "fedper" and r["round"] == str(final)]
    assert {r["final"] for r in rows if r["round"] == str(final)} == {"True"}
    assert {r["final"] for r in rows if r["round"] != str(final)} == {"False"}
    assert np.mean(last) == pytest.approx(results["algorithms"]["fedper"]["final_mean_accuracy"])
    for png in ("accuracy_per_round.png", "final_accuracy_per_client.png"):
        assert (out / png).read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    model = build_model(ModelConfig(num_classes=10, input_size=32))
    s = split(model, 2)
    base = weights.load(out / "fedper" / "final_base.safetensors")
    assert list(base) == sorted(s.base) or set(base) == set(s.base)
    head = weights.load(out / "fedper" / "heads" / "client_003.safetensors")
    assert set(head) == set(s.head)
    assert len(list((out / "fedper" / "heads").iterdir())) == CLIENTS
    # FedAvg shares everything: one global model, no personal tensors.
    assert set(weights.load(out / "fedavg" / "final_base.safetensors")) == set(s.names)
    assert not (out / "fedavg" / "heads").exists()


def _reevaluate(out: Path, results: dict, data: DataConfig, algorithm: str) -> dict[str, float]:
    """Each client's accuracy with the files the run saved for ``algorithm`` (final base + its
    head), loaded into a freshly built model: independent of the simulation's own trainer."""
    fed = load_federated(data)
    model = build_model(ModelConfig(**results["config"]["model"]))
    trainer = EagerTrainer(model)
    base_file = out / algorithm / "final_base.safetensors"
    base = weights.load(base_file) if base_file.exists() else {}
    accuracies = {}
    for cid in range(len(fed.clients)):
        head_file = out / algorithm / "heads" / f"client_{cid:03d}.safetensors"
        head = weights.load(head_file) if head_file.exists() else {}
        assert set(base) | set(head) == set(exchanged_names(model))
        trainer.set_tensors(to_torch({**base, **head}))
        test = fed.client_test(cid)
        x = to_tensor(test.images, fed.dataset.mean, fed.dataset.std)
        accuracies[str(cid)] = evaluate(trainer, x, torch.from_numpy(test.labels))
    return accuracies


@pytest.mark.slow
@pytest.mark.numeric
def test_final_point_is_the_saved_final_model_after_the_last_round(tmp_path):
    """The headline is measured after round 2's aggregation, with exactly the weights saved.
    Proved by weights and events, not by accuracies differing (a near-chance model may score
    the same before and after a round: issue 25): the 2-round run's round 2 starts from what
    the 1-round run saved, and its final point scores what it saved itself, which differs."""
    sim = SimulationConfig(algorithms=("fedper", "fedavg", "local"), rounds=2, model=ModelConfig(alpha=0.25),
                           training=TrainConfig(local_epochs=1), threads=1, out=tmp_path / "two")  # fmt: skip
    data = DataConfig(dataset="digits", num_clients=3, classes_per_client=2, seed=0)
    recorder = run(sim, data)
    one_round = dataclasses.replace(sim, rounds=1, out=tmp_path / "one")
    after_round_1 = run(one_round, data)
    results = json.loads((sim.out / "results.json").read_text())
    for algorithm in sim.algorithms:
        records = recorder.records(algorithm)
        finals = [r for r in records if r.final]
        assert sorted((r.round, r.client) for r in finals) == [(3, c) for c in range(3)]
        assert all(r.accuracy_after is None and r.train_loss is None for r in finals)
        headline = results["algorithms"][algorithm]
        assert headline["final_per_client"] == _reevaluate(sim.out, results, data, algorithm)
        assert headline["final_per_client"] == {str(r.client): r.accuracy for r in finals}
        assert (headline["final_round"], headline["final_after_round"]) == (3, 2)
        assert results["rounds"][algorithm][-1]["accuracy"]["mean"] == headline["final_mean_accuracy"]
        # Round 2 starts from the weights saved after round 1 (same floats, same machine) ...
        round_2 = {r.client: r.accuracy for r in records if r.round == 2}
        assert round_2 == {r.client: r.accuracy for r in after_round_1.records(algorithm) if r.final}
        # ... and the final point scores the weights saved after round 2, which round 2 changed.
        saved_1, saved_2 = _saved(one_round.out / algorithm), _saved(sim.out / algorithm)
        assert saved_1.keys() == saved_2.keys()
        assert [n for n in saved_2 if not np.array_equal(saved_1[n], saved_2[n])]
    # Local training's final model is the one each client had just after training in round 2.
    local = recorder.records("local")
    after_2 = {str(r.client): r.accuracy_after for r in local if r.round == 2}
    assert results["algorithms"]["local"]["final_per_client"] == after_2


def _saved(directory: Path) -> dict[str, np.ndarray]:
    """Every tensor a run saved for one algorithm: its final base and each client's head."""
    files = sorted(directory.glob("*.safetensors")) + sorted(directory.glob("heads/*.safetensors"))
    return {f"{f.name}:{n}": t for f in files for n, t in weights.load(f).items()}


def _tiny(out: Path, **kw) -> dict:
    sim = SimulationConfig(
        algorithms=kw.pop("algorithms", ("fedper",)),
        rounds=1,
        training=TrainConfig(local_epochs=1),
        threads=1,
        out=out,
        **kw,
    )
    run(
        sim,
        DataConfig(dataset="digits", num_clients=3, classes_per_client=3, seed=kw.get("seed", 1)),
    )
    return json.loads((out / "results.json").read_text())


@pytest.mark.slow
@pytest.mark.numeric
def test_same_command_line_same_numbers(tmp_path):
    """Bit for bit on one machine and kernel set (another CPU's kernels round differently)."""
    a = _tiny(tmp_path / "a")
    b = _tiny(tmp_path / "b")
    assert a["algorithms"] == b["algorithms"]
    assert (tmp_path / "a" / "metrics.csv").read_text() == (tmp_path / "b" / "metrics.csv").read_text()


@pytest.mark.slow
def test_local_bn_keeps_statistics_on_clients(tmp_path):
    _tiny(tmp_path, bn="local")
    base = weights.load(tmp_path / "fedper" / "final_base.safetensors")
    head = weights.load(tmp_path / "fedper" / "heads" / "client_000.safetensors")
    assert not any(n.endswith(("running_mean", "running_var")) for n in base)
    assert "stem.bn.running_mean" in head


def test_linear_base_ablation_aggregates_one_linear_layer(tmp_path):
    _tiny(tmp_path, model=ModelConfig(base="linear"))
    base = weights.load(tmp_path / "fedper" / "final_base.safetensors")
    assert set(base) == {"linear_base.weight", "linear_base.bias"}


def test_cli_reports_bad_options_without_a_traceback(tmp_path, capsys):
    assert main(["simulate", "--algorithms", "fedsgd", "--out", str(tmp_path / "x")]) == 2
    assert "unknown algorithm(s) ['fedsgd']" in capsys.readouterr().err
    assert main(["simulate", "--dataset", "cifar10", "--out", str(tmp_path / "x")]) == 2
    assert "--data-root" in capsys.readouterr().err
    # A preset does not stand in for the data: FLICKR-AES still needs its files.
    assert main(["simulate", "--dataset", "flickr-aes", "--out", str(tmp_path / "x")]) == 2
    assert "dataset 'flickr-aes' reads local files: pass --data-root DIR" in capsys.readouterr().err
    assert not (tmp_path / "x").exists()


@pytest.mark.slow
def test_report_table_lists_the_baselines_under_the_algorithms(strongly_non_iid_run):
    from fedper._recipes.report_command import markdown_table

    out, results = strongly_non_iid_run
    rows = markdown_table([out]).splitlines()
    assert [r.split("|")[2].strip() for r in rows[2:]] == ["fedper", "fedavg", "baseline: majority"]
    assert f"{results['baselines']['majority']['mean_accuracy']:.3f}" in rows[-1]
