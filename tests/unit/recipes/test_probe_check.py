"""``fedper probe-check``, the publish check that judges a candidate base on a probe set."""

from __future__ import annotations

import json

import numpy as np

from fedper import cli
from fedper._recipes.probe_check import probe_accuracy
from fedper.common import weights
from fedper.data import DataConfig

DATA = ["--dataset", "digits", "--clients", "3", "--classes-per-client", "4", "--seed", "5"]


def test_a_base_that_lost_its_features_is_refused(server_artifacts, tmp_path, capsys):
    initial = server_artifacts / "base.safetensors"
    zeros = tmp_path / "zeros.safetensors"
    weights.save(zeros, {k: np.zeros_like(v) for k, v in weights.load(initial).items()})
    data = DataConfig(dataset="digits", num_clients=3, classes_per_client=4, seed=5)
    good, broken = (
        np.mean(probe_accuracy(server_artifacts, initial, data)),
        np.mean(probe_accuracy(server_artifacts, zeros, data)),
    )
    assert broken < good - 0.2, (good, broken)  # constant features: the majority class at best
    bar = str(round((good + broken) / 2, 3))
    assert cli.main(["probe-check", "--artifacts", str(server_artifacts), "--min-accuracy", bar, *DATA,
                     str(initial)]) == 0  # fmt: skip
    said = json.loads(capsys.readouterr().out)
    assert said["passed"] and said["probe_accuracy"] == round(good, 4) and said["clients"] == 3
    assert cli.main(["probe-check", "--artifacts", str(server_artifacts), "--min-accuracy", bar, *DATA,
                     str(zeros)]) == 1  # fmt: skip
    assert json.loads(capsys.readouterr().out)["passed"] is False


def test_a_candidate_the_loader_refuses_is_a_clear_error(server_artifacts, tmp_path, capsys):
    partial = tmp_path / "partial.safetensors"
    tensors = weights.load(server_artifacts / "base.safetensors")
    weights.save(partial, dict(list(tensors.items())[1:]))
    assert cli.main(["probe-check", "--artifacts", str(server_artifacts), *DATA, str(partial)]) == 2
    said = capsys.readouterr().err
    assert "partial.safetensors" in said and "missing 1 tensor" in said
