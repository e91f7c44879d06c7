"""Models given by reference through the stock training program (issue 52): a user's own model
(``tests.support.custom_model:TinyNet``, every construct a CNN may use) and a torchvision model
exported by ``fedper export``, run through the ExecuTorch runtime as a device runs them, against
eager PyTorch and float64; what the program rewrites (in-place dropout, StochasticDepth, SiLU, max
pooling) and what it refuses, with the module path; a simulation of the user's model."""

from __future__ import annotations

from dataclasses import replace
from pathlib import Path

import pytest
import torch
from torch import nn
from torchvision.ops import StochasticDepth

from fedper.cli import main
from fedper.common import weights
from fedper.common.errors import ConfigError
from fedper.common.manifest import read_manifest
from fedper.data import DataConfig
from fedper.export.training_graph import GatherMaxPool, ProductSiLU, RowDrop, TrainingStep, trainable_copy
from fedper.models import ModelConfig, build_model, exchanged_state, split
from fedper.models.reference import as_staged
from tests.support.custom_model import TinyNet
from tests.support.program_check import digits, inference_matches_eager, step_matches_eager

TINY = "tests.support.custom_model:TinyNet"
MAX_BATCH = 16


def _export(out: Path, *options: str) -> Path:
    argv = ["export", "--dataset", "digits", "--max-batch", str(MAX_BATCH), "--batch-size", str(MAX_BATCH),
            "--out", str(out), "--bypass-cache", *options]  # fmt: skip
    assert main(argv) == 0, f"fedper {' '.join(argv)} failed"
    return out


@pytest.fixture(scope="module")
def checkpoint(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, dict[str, torch.Tensor]]:
    """A user's TinyNet (seed 1, dropout 0) saved as a torch state dict: the export's --init."""
    torch.manual_seed(1)
    state = TinyNet(10, dropout=0.0).state_dict()
    path = tmp_path_factory.mktemp("checkpoint") / "tiny.pt"
    torch.save(state, path)
    return path, state


@pytest.fixture(scope="module")
def tiny_export(tmp_path_factory: pytest.TempPathFactory, checkpoint: tuple[Path, dict[str, torch.Tensor]]) -> Path:
    """TinyNet without dropout (so that the program and eager draw no masks), kp 2, from --init."""
    out = tmp_path_factory.mktemp("tiny") / "artifacts"
    return _export(out, "--model", TINY, "--model-arg", "dropout=0.0", "--kp", "2", "--init", str(checkpoint[0]))


@pytest.mark.export
def test_the_users_model_exports_with_its_reference_arguments_and_initial_weights(tiny_export, checkpoint):
    manifest = read_manifest(tiny_export)
    assert manifest.model.name == TINY and manifest.model.model_args == [("dropout", 0.0)]
    assert manifest.training_program.variant == "fast" and manifest.kp == 2  # the default for any model
    model = build_model(ModelConfig(**manifest.model.model_dump()))  # what a device rebuilds
    parts = split(model, 2)
    assert manifest.base_names == list(parts.base) and manifest.head_names == list(parts.head)
    assert {n.rsplit(".", 1)[0] for n in parts.head} >= {"features.9.conv", "classifier.2"}
    # --init: the user's weights, every tensor (10 classes: the classifier too).
    tensors = weights.load_checked([tiny_export / "base.safetensors", tiny_export / "head.safetensors"],
                                   manifest.layout("base") + manifest.layout("head"))  # fmt: skip
    source = checkpoint[1]
    assert all(torch.equal(torch.as_tensor(v), source[n]) for n, v in tensors.items())


@pytest.mark.export
@pytest.mark.numeric
@pytest.mark.parametrize("batch", [2, MAX_BATCH])
def test_the_users_model_trains_as_eager_pytorch_does(tiny_export, batch, claim):
    step_matches_eager(tiny_export, batch, MAX_BATCH, claim)


@pytest.mark.export
@pytest.mark.numeric
def test_the_users_model_infers_as_eager_pytorch_does(tiny_export, claim):
    inference_matches_eager(tiny_export, claim)


def test_the_stock_program_rewrites_what_executorch_cannot_train_and_keeps_the_names() -> None:
    class Stochastic(nn.Module):
        def __init__(self) -> None:
            super().__init__()
            self.conv = nn.Conv2d(3, 4, 3)
            self.bn = nn.BatchNorm2d(4)
            self.act = nn.SiLU(inplace=True)
            self.pool = nn.MaxPool2d(2)
            self.drop = StochasticDepth(0.5, "row")
            self.dropout = nn.Dropout(0.3, inplace=True)
            self.fc = nn.Linear(4, 10)

        def forward(self, x: torch.Tensor) -> torch.Tensor:
            h = self.drop(self.pool(self.act(self.bn(self.conv(x)))))
            return self.fc(self.dropout(h.mean((2, 3))))

    model = as_staged(Stochastic(), "stochastic", 10)
    copy_ = trainable_copy(model)
    assert isinstance(copy_.act, ProductSiLU) and isinstance(copy_.pool, GatherMaxPool)
    assert isinstance(copy_.drop, RowDrop) and not copy_.dropout.inplace
    assert model.dropout.inplace and isinstance(model.act, nn.SiLU)  # the model itself is left as it was
    step = TrainingStep(model)
    assert sorted(n for n, _ in step.named_parameters()) == sorted(n for n, _ in model.named_parameters())
    # RowDrop: each row kept whole (scaled by 1/(1-p)) or dropped, about half of them.
    x = torch.ones(4000, 2, 3, 3)
    rows = RowDrop(0.5, "row").train()(x).flatten(1)
    assert set(rows.unique().tolist()) <= {0.0, 2.0} and bool((rows == rows[:, :1]).all())
    assert 0.45 < float((rows[:, 0] > 0).float().mean()) < 0.55
    assert torch.equal(RowDrop(0.5, "row").eval()(x), x)
    # Max pooling as a gather: eager's values and gradients.
    a = torch.randn(2, 3, 9, 9, requires_grad=True)
    b = a.detach().clone().requires_grad_()
    pool = nn.MaxPool2d(3, 2, 1)
    pool(a).square().sum().backward()
    GatherMaxPool(pool)(b).square().sum().backward()
    assert torch.equal(pool(a), GatherMaxPool(pool)(b)) and torch.equal(a.grad, b.grad)


@pytest.mark.parametrize(
    ("norm", "message"),
    [
        (nn.BatchNorm2d(4, momentum=None), r"features.1 \(BatchNorm2d\) has momentum=None .* momentum=0.1"),
        (nn.BatchNorm2d(4, affine=False), r"features.1 \(BatchNorm2d\) has affine=False"),
        (nn.BatchNorm2d(4, track_running_stats=False), r"features.1 \(BatchNorm2d\) has track_running_stats=False"),
        (
            nn.Sequential(nn.Flatten(2), nn.BatchNorm1d(4), nn.Unflatten(2, (30, 30))),
            r"features.1.1 \(BatchNorm1d\): the training program supports nn.BatchNorm2d only",
        ),
    ],
)
def test_a_batchnorm_the_program_cannot_carry_is_refused_with_its_path(norm: nn.Module, message: str) -> None:
    model = nn.Sequential()
    model.add_module("features", nn.Sequential(nn.Conv2d(3, 4, 3), norm, nn.AdaptiveAvgPool2d(1), nn.Flatten()))
    model.add_module("fc", nn.Linear(4, 10))
    with pytest.raises(ConfigError, match=message):
        TrainingStep(as_staged(model, "m", 10))


@pytest.mark.export
def test_a_model_torch_fx_cannot_trace_exports_as_the_stock_program_with_the_warning_printed(tmp_path, capsys, claim):
    out = _export(tmp_path / "artifacts", "--model", "tests.support.custom_model:ShapeBranchNet", "--kp", "1")
    captured = capsys.readouterr()
    printed = " ".join((captured.out + captured.err).split())  # messages wrap at the terminal's width
    assert "warning: the fast training graph is built from the model's torch.fx trace, which failed" in printed
    assert "falls back to ExecuTorch's stock program (--variant plain)" in printed
    assert read_manifest(out).training_program.variant == "plain"
    step_matches_eager(out, MAX_BATCH, MAX_BATCH, claim)


def test_a_simulation_of_the_users_model_runs(tmp_path: Path) -> None:
    from fedper._recipes.simulation import SimulationConfig, run

    sim = SimulationConfig(algorithms=("fedper", "fedavg"), rounds=2, threads=1, out=tmp_path / "run",
                           model=replace(ModelConfig(), name=TINY, model_args=(("width", 4),)))  # fmt: skip
    recorder = run(sim, DataConfig(dataset="digits", num_clients=2))
    results = recorder.results()
    assert recorder.config["model"]["name"] == TINY and recorder.config["model"]["model_args"] == [["width", 4]]
    for algorithm in ("fedper", "fedavg"):
        assert 0.0 <= results.algorithms[algorithm].final_mean_accuracy <= 1.0  # type: ignore[operator]
    final = weights.load(tmp_path / "run" / "fedper" / "final_base.safetensors")
    model = build_model(ModelConfig(name=TINY, model_args=(("width", 4),)))
    assert set(final) == set(split(model, 2).base) and set(final) <= set(exchanged_state(model))


@pytest.mark.slow
def test_fedper_simulate_runs_the_users_model(tmp_path: Path) -> None:
    assert main(["simulate", "--model", TINY, "--model-arg", "width=4", "--dataset", "digits", "--rounds", "1",
                 "--num-clients", "2", "--threads", "1", "--out", str(tmp_path / "run")]) == 0  # fmt: skip
    assert (tmp_path / "run" / "results.json").is_file()


@pytest.fixture(scope="module")
def resnet_export(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """torchvision's ResNet-18 at 64 px (its last BatchNorms see 2x2 maps), the head named by module."""
    return _export(tmp_path_factory.mktemp("resnet") / "artifacts", "--model", "torchvision:resnet18",
                   "--input-size", "64", "--head-modules", "layer4,fc")  # fmt: skip


@pytest.mark.slow
@pytest.mark.export
@pytest.mark.numeric
@pytest.mark.parametrize("batch", [2, MAX_BATCH])
def test_a_torchvision_model_trains_as_eager_pytorch_does(resnet_export, batch, claim):
    manifest = read_manifest(resnet_export)
    assert manifest.kp == 1 and manifest.model.head_modules == ["layer4", "fc"]
    assert all(n.startswith(("layer4.", "fc.")) for n in manifest.head_names)
    step_matches_eager(resnet_export, batch, MAX_BATCH, claim, yardstick="kinks")


@pytest.mark.slow
@pytest.mark.export
def test_the_users_model_trains_with_dropout(tmp_path: Path) -> None:
    """TinyNet's dropout (in place in the model, p=0.2) draws a new mask at every step of the program."""
    from executorch.extension.pybindings.portable_lib import _load_for_executorch
    from executorch.extension.training import TrainingModule

    artifacts = _export(tmp_path / "artifacts", "--model", TINY)
    manifest = read_manifest(artifacts)
    spec = manifest.training_program
    module = TrainingModule(_load_for_executorch(str(artifacts / manifest.artifacts["training_program"]),
                                                 data_path=str(artifacts / manifest.artifacts["training_weights"])))  # fmt: skip
    shapes = {t.name: t.shape for t in manifest.tensors.base + manifest.tensors.head}
    stats = [torch.ones(shapes[n]) for n in spec.bn_statistics]
    x, y = digits(8, 32)
    losses = {float(module.forward_backward(spec.method, (x, y, *stats))[0]) for _ in range(4)}
    assert len(losses) == 4 and all(torch.isfinite(torch.tensor(sorted(losses))))


class PooledGate(nn.Module):
    """A 1x1 convolution of a pooled (1x1) map, as squeeze-and-excitation has: while tracing, ATen's
    choice of its backend compares the batch with 16, a guard that would plan the program for 15."""

    def __init__(self) -> None:
        super().__init__()
        self.conv = nn.Conv2d(3, 8, 3, padding=1)
        self.pool = nn.AdaptiveAvgPool2d(1)
        self.gate = nn.Conv2d(8, 8, 1)
        self.fc = nn.Linear(8, 10)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.fc(torch.flatten(self.gate(self.pool(self.conv(x))), 1))


@pytest.mark.export
def test_the_stock_program_is_planned_for_its_largest_batch_and_a_guarded_one_is_refused(monkeypatch):
    import contextlib

    from fedper.export import executorch_lowering
    from fedper.export.executorch_lowering import ExportError, lower_training_program, planned_batch

    step = TrainingStep(as_staged(PooledGate(), "pooled-gate", 10))
    lowered = lower_training_program(step, 8, 32, refuse_missing_kernels=False)
    assert planned_batch(lowered.program) == 32
    # Without the backend's guard kept out (every pass of the lowering re-traces), the check refuses.
    monkeypatch.setattr(executorch_lowering, "conv_backend_without_batch_guards", contextlib.nullcontext)
    with pytest.raises(ExportError, match="planned for batches of at most 15 images, not --max-batch 32"):
        lower_training_program(step, 8, 32, refuse_missing_kernels=False)
