"""Proof for every named model (issue 52): torchvision's constructors through ``fedper export``
(the fast lowering), at each input size of ``FEDPER_ZOO`` (``make test-zoo``: 32 and 224 px):

- the training program's loss, BatchNorm statistics and gradients against eager PyTorch and
  float64 (``tests/support/program_check.py``), at its smallest and largest batch (at 32 px, the
  smallest batch's gradients are beyond float32: see the test);
- the inference program's logits against eager;
- a device round through the Python runtime: a 2-device fleet running the exported program
  against a real ``fedper serve`` over HTTP, and ``fedper simulate``'s first round on the same
  clients, batches and initial weights, compared round 1 by round 1.

An export is 1.5-5 minutes and a round at 224 px minutes more, so these run only when
``FEDPER_ZOO`` names the sizes (about an hour for both sizes on 2 cores): ``make test`` skips
them; ``tests/unit/export/test_reference_export.py`` runs a user's model (every construct) and
ResNet-18 on every push. Each model is built without dropout (``--model-arg dropout=0.0``, and
no stochastic depth for EfficientNet) so that program and eager draw no masks.
"""

from __future__ import annotations

import os
from pathlib import Path

import numpy as np
import pytest

from fedper._recipes.simulation import SimulationConfig
from fedper._recipes.simulation import run as simulate
from fedper.cli import main
from fedper.common.manifest import read_manifest
from fedper.common.train_config import TrainConfig
from fedper.data import DataConfig
from fedper.device_runtime.fleet import run_fleet
from fedper.device_runtime.fleet_config import FleetConfig
from fedper.device_runtime.runtime_config import RuntimeConfig
from fedper.models import ModelConfig
from tests.support.program_check import inference_matches_eager, step_matches_eager
from tests.support.server_support import ENROLL, serve

SIZES = [int(s) for s in os.environ.get("FEDPER_ZOO", "").split(",") if s.strip()]
pytestmark = [
    pytest.mark.zoo,
    pytest.mark.skipif(not SIZES, reason="the model zoo's proof runs with FEDPER_ZOO=32,224 (make test-zoo)"),
]
MAX_BATCH = 8
# name -> (keyword arguments that turn off random masks, the classifier's module path: the head)
MODELS: dict[str, tuple[tuple[str, ...], str]] = {
    "mobilenet_v2": (("dropout=0.0",), "classifier"),
    "mobilenet_v3_small": (("dropout=0.0",), "classifier"),
    "mobilenet_v3_large": (("dropout=0.0",), "classifier"),
    "resnet18": ((), "fc"),
    "resnet34": ((), "fc"),
    "efficientnet_b0": (("dropout=0.0", "stochastic_depth_prob=0.0"), "classifier"),
}
CASES = [(name, size) for size in SIZES for name in MODELS]


@pytest.fixture(scope="module", params=CASES, ids=[f"{n}-{s}px" for n, s in CASES])
def zoo_export(request: pytest.FixtureRequest, tmp_path_factory: pytest.TempPathFactory) -> Path:
    name, size = request.param
    model_args, head = MODELS[name]
    out = tmp_path_factory.mktemp(f"{name}-{size}") / "artifacts"
    argv = ["export", "--model", f"torchvision:{name}", *(a for v in model_args for a in ("--model-arg", v)),
            "--head-modules", head, "--dataset", "digits", "--input-size", str(size), "--max-batch", str(MAX_BATCH),
            "--batch-size", str(MAX_BATCH), "--out", str(out), "--bypass-cache"]  # fmt: skip
    assert main(argv) == 0, f"fedper {' '.join(argv)} failed"
    return out


@pytest.mark.numeric
@pytest.mark.parametrize("batch", [2, MAX_BATCH])
def test_the_program_trains_as_eager_pytorch_does(zoo_export, batch, claim):
    manifest = read_manifest(zoo_export)
    assert manifest.training_program.variant == "fast"
    head = MODELS[manifest.model.name.removeprefix("torchvision:")][1]
    assert manifest.kp == 1 and manifest.model.head_modules == [head]
    assert manifest.head_names and all(n.startswith(f"{head}.") for n in manifest.head_names)
    assert not any(n.startswith(f"{head}.") for n in manifest.base_names)
    # Every named model ends on 1x1 maps at 32 px: at a batch of 2 (or 4) its late BatchNorms
    # normalize 2 (4) values per channel, eager float32's own forward is up to 5e-3 off float64's
    # at MobileNetV2's last BatchNorm (batch 4), a ReLU6 input there within 4e-4 of zero goes
    # either way, and one such flip moves every gradient below it by 10% (measured 2026-12-05;
    # docs/EXPORT.md). There the small batch checks the loss and statistics (the forward and the
    # resize); the gradients are checked at the largest batch, and at both at 224 px.
    ill_conditioned = batch < MAX_BATCH and manifest.model.input_size <= 32
    step_matches_eager(zoo_export, batch, MAX_BATCH, claim, yardstick="kinks", gradients=not ill_conditioned)


@pytest.mark.numeric
def test_the_inference_program_scores_as_eager_pytorch_does(zoo_export, claim):
    inference_matches_eager(zoo_export, claim)


@pytest.mark.numeric
def test_a_fleet_round_matches_the_simulations_first_round(zoo_export, tmp_path, claim):
    """Two devices (clients 0 and 1 of digits, two classes each) train one round with the
    exported program against a real server; the simulation trains the same clients from the same
    initial weights on the same batches in eager PyTorch."""
    manifest = read_manifest(zoo_export)
    model = ModelConfig(**manifest.model.model_dump())
    data = DataConfig(dataset="digits", partition="classes", num_clients=2, classes_per_client=2, seed=0,
                      image_size=model.input_size)  # fmt: skip
    options = {"rounds": 1, "target_clients": 2, "min_clients": 2, "local_epochs": 1, "retry_after": 1}
    with serve(zoo_export, tmp_path / "server", **options) as server:  # type: ignore[arg-type]
        fleet = FleetConfig(runtime=RuntimeConfig(server=server.url, threads=1), devices=2, workers=2,
                            storage=tmp_path / "fleet", out=tmp_path / "fleet" / "results", max_idle_wait=0.5)  # fmt: skip
        fleet_records = {(r.round, r.client): r for r in run_fleet(fleet, data, ENROLL, show=False).records("fedper")}
    training = TrainConfig(local_epochs=1, batch_size=MAX_BATCH)
    sim = SimulationConfig(algorithms=("fedper",), rounds=1, training=training, model=model, threads=1,
                           out=tmp_path / "simulation")  # fmt: skip
    sim_records = {(r.round, r.client): r for r in simulate(sim, data).records("fedper")}
    first = [(1, c) for c in range(2)]
    assert set(first) <= set(fleet_records) and set(first) <= set(sim_records)
    # Round 1 scores the exported initial weights on both sides: rounding only.
    accuracy = max(abs(fleet_records[k].accuracy - sim_records[k].accuracy) for k in first)
    claim.below("round 1: largest |fleet - simulation| accuracy before training", accuracy, 0.03)
    # Training parts the engines by rounding that grows over the round (docs/TESTING.md), far faster
    # than MobileNet-V1's (its fleet test bounds this at 0.08): at 32 px a batch's late BatchNorms
    # see 1x1 maps, where float32 is percents off float64 (the program check's batch-2 figures).
    # Measured at 32 px (one run, 2026-12-05): 0.13 to 0.57 apart. The bound, 1.0, catches a program
    # that does not train (its loss stays near ln 10 while the simulation's falls), not a subtle error:
    # the program check above is the exact one.
    loss = max(abs(fleet_records[k].train_loss / sim_records[k].train_loss - 1) for k in first)
    claim.below("round 1: largest relative |fleet - simulation| training loss", loss, 1.0)
    assert all(np.isfinite(fleet_records[k].accuracy_after) for k in first)
