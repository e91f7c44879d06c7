import csv
import json
from pathlib import Path

import numpy as np
import pytest

from fedper import weights
from fedper.cli import main
from fedper.data import DataConfig
from fedper.models import ModelConfig, build_model, split
from fedper.train_config import TrainConfig
from recipes.simulation import SimulationConfig, run


@pytest.fixture(scope="module")
def strongly_non_iid_run(tmp_path_factory) -> tuple[Path, dict]:
    out = tmp_path_factory.mktemp("sim")
    sim = SimulationConfig(
        algorithms=("fedper", "fedavg"), kp=2, rounds=5, training=TrainConfig(local_epochs=1), threads=1, out=out
    )
    data = DataConfig(dataset="digits", num_clients=10, classes_per_client=2, seed=0)
    run(sim, data)
    return out, json.loads((out / "results.json").read_text())


def test_fedper_beats_fedavg_when_clients_see_two_classes_each(strongly_non_iid_run):
    _, results = strongly_non_iid_run
    fedper = results["algorithms"]["fedper"]["final_mean_accuracy"]
    fedavg = results["algorithms"]["fedavg"]["final_mean_accuracy"]
    assert fedper > fedavg + 0.2, (fedper, fedavg)


def test_run_writes_metrics_plots_and_reusable_weights(strongly_non_iid_run):
    out, results = strongly_non_iid_run
    assert results["config"]["simulation"]["kp"] == 2
    # Digits have no generator features: only the majority baseline, one value per client.
    assert set(results["baselines"]) == {"majority"}
    assert len(results["baselines"]["majority"]["per_client"]) == 10
    assert results["algorithms"]["fedper"]["final_mean_accuracy"] > results["baselines"]["majority"]["mean_accuracy"]
    assert [r["round"] for r in results["rounds"]["fedper"]] == [1, 2, 3, 4, 5]
    first = results["rounds"]["fedper"][0]
    assert set(first) >= {"accuracy", "accuracy_after", "train_loss"}
    assert set(first["accuracy"]) == {"mean", "weighted_mean", "std", "count"}
    with (out / "metrics.csv").open() as f:
        rows = list(csv.DictReader(f))
    assert len(rows) == 2 * 5 * 10
    assert {r["algorithm"] for r in rows} == {"fedper", "fedavg"}
    last = [float(r["accuracy"]) for r in rows if r["algorithm"] == "fedper" and r["round"] == "5"]
    assert np.mean(last) == pytest.approx(results["algorithms"]["fedper"]["final_mean_accuracy"])
    for png in ("accuracy_per_round.png", "final_accuracy_per_client.png"):
        assert (out / png).read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    model = build_model(ModelConfig(num_classes=10, input_size=32))
    s = split(model, 2)
    base = weights.load(out / "fedper" / "final_base.safetensors")
    assert list(base) == sorted(s.base) or set(base) == set(s.base)
    head = weights.load(out / "fedper" / "heads" / "client_003.safetensors")
    assert set(head) == set(s.head)
    assert len(list((out / "fedper" / "heads").iterdir())) == 10
    # FedAvg shares everything: one global model, no personal tensors.
    assert set(weights.load(out / "fedavg" / "final_base.safetensors")) == set(s.names)
    assert not (out / "fedavg" / "heads").exists()


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


def test_same_command_line_same_numbers(tmp_path):
    a = _tiny(tmp_path / "a")
    b = _tiny(tmp_path / "b")
    assert a["algorithms"] == b["algorithms"]
    assert (tmp_path / "a" / "metrics.csv").read_text() == (tmp_path / "b" / "metrics.csv").read_text()


def test_local_bn_keeps_statistics_on_clients(tmp_path):
    _tiny(tmp_path, bn="local")
    base = weights.load(tmp_path / "fedper" / "final_base.safetensors")
    head = weights.load(tmp_path / "fedper" / "heads" / "client_000.safetensors")
    assert not any(n.endswith(("running_mean", "running_var")) for n in base)
    assert "stem.bn.running_mean" in head


def test_linear_base_ablation_aggregates_one_linear_layer(tmp_path):
    _tiny(tmp_path, base="linear")
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


def test_report_table_lists_the_baselines_under_the_algorithms(strongly_non_iid_run):
    from recipes.report_command import markdown_table

    out, results = strongly_non_iid_run
    rows = markdown_table([out]).splitlines()
    assert [r.split("|")[2].strip() for r in rows[2:]] == ["fedper", "fedavg", "baseline: majority"]
    assert f"{results['baselines']['majority']['mean_accuracy']:.3f}" in rows[-1]
