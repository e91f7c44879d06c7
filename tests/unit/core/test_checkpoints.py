"""--init PATH: a model's base from a checkpoint in the toolkit's, timm's or torchvision's layout.

The upstream layouts are built by the upstream libraries themselves (timm's ``mobilenetv1_100``,
torchvision's ``resnet34``, random weights: nothing is downloaded), and the loaded model must
compute what the upstream model computes.
"""

from __future__ import annotations

import pickle
from pathlib import Path

import numpy as np
import pytest
import timm
import torch
import torchvision
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from safetensors.torch import save_file
from torch import nn

from fedper.checkpoints import CheckpointError, init_base, read_checkpoint
from fedper.common import weights
from fedper.models import ModelConfig, build_model
from fedper.models.split import exchanged_state, split


def _save(state: dict[str, torch.Tensor], path: Path) -> Path:
    save_file({k: v.contiguous() for k, v in state.items()}, str(path))
    return path


@pytest.fixture(scope="module")
def timm_checkpoint(tmp_path_factory: pytest.TempPathFactory) -> tuple[nn.Module, Path]:
    torch.manual_seed(1)
    # ReLU instead of timm's default ReLU6, so that the two networks must compute the same thing.
    upstream = timm.create_model("mobilenetv1_100", pretrained=False, act_layer="relu").eval()
    with torch.no_grad():  # BatchNorm statistics that are not the identity, so a mix-up shows
        for m in upstream.modules():
            if isinstance(m, nn.BatchNorm2d):
                m.running_mean.uniform_(-0.2, 0.2)
                m.running_var.uniform_(0.5, 2.0)
    return upstream, _save(upstream.state_dict(), tmp_path_factory.mktemp("timm") / "mobilenetv1_100.safetensors")


def test_a_timm_mobilenetv1_checkpoint_gives_the_same_network(timm_checkpoint):
    upstream, path = timm_checkpoint
    model = build_model(ModelConfig(num_classes=1000, alpha=1.0, input_size=224), seed=0).eval()
    fresh_classifier = model.classifier.weight.detach().clone()
    source = init_base(model, read_checkpoint(path, "mobilenet_v1"), kp=1)
    assert source.layout == "timm-mobilenetv1"
    assert source.fresh == ("classifier.weight", "classifier.bias")  # the head stays fresh
    assert torch.equal(model.classifier.weight, fresh_classifier)
    with torch.no_grad():  # give both the same classifier, then they must agree
        model.classifier.weight.copy_(upstream.classifier.weight)
        model.classifier.bias.copy_(upstream.classifier.bias)
        x = torch.randn(2, 3, 224, 224)
        torch.testing.assert_close(model(x), upstream(x), rtol=1e-4, atol=1e-4)


def test_a_timm_checkpoint_also_starts_a_small_model_of_the_same_width(timm_checkpoint):
    """The stride-1 stem of inputs under 128 px has the same shapes: the weights load at 32 px."""
    _, path = timm_checkpoint
    model = build_model(ModelConfig(num_classes=5, alpha=1.0, input_size=32), seed=0)
    source = init_base(model, read_checkpoint(path, "mobilenet_v1"), kp=2)
    assert source.tensors == len(split(model, 2).base)
    assert "blocks.12.pw.conv.weight" in source.fresh


def test_a_torchvision_resnet34_checkpoint_gives_the_same_network(tmp_path):
    torch.manual_seed(2)
    upstream = torchvision.models.resnet34(weights=None).eval()
    path = _save(upstream.state_dict(), tmp_path / "resnet34.safetensors")
    model = build_model(ModelConfig(name="resnet34", num_classes=1000, input_size=224), seed=0).eval()
    source = init_base(model, read_checkpoint(path, "resnet34"), kp=1)
    assert source.layout == "torchvision-resnet34" and source.fresh == ("fc.weight", "fc.bias")
    with torch.no_grad():
        model.fc.load_state_dict(upstream.fc.state_dict())
        x = torch.randn(2, 3, 224, 224)
        torch.testing.assert_close(model(x), upstream(x), rtol=1e-4, atol=1e-4)
    small = build_model(ModelConfig(name="resnet34", num_classes=5, input_size=32), seed=0)
    with pytest.raises(CheckpointError, match=r"conv1\.weight: expected shape \(64, 3, 3, 3\).*\(64, 3, 7, 7\)"):
        init_base(small, read_checkpoint(path, "resnet34"), kp=1)


def test_the_toolkits_own_base_loads_and_the_head_stays_fresh(tmp_path):
    config = ModelConfig(num_classes=5, input_size=32)
    pretrained = build_model(config, seed=7)
    parts = split(pretrained, 2)
    state = exchanged_state(pretrained)
    path = tmp_path / "base.safetensors"
    weights.save(path, {n: state[n] for n in parts.base})
    model = build_model(config, seed=0)
    before = exchanged_state(model)
    source = init_base(model, read_checkpoint(path, "mobilenet_v1"), kp=2)
    after = exchanged_state(model)
    assert source.layout == "fedper" and source.tensors == len(parts.base)
    assert all(torch.equal(after[n], state[n]) for n in parts.base)
    assert all(torch.equal(after[n], before[n]) for n in parts.head)
    # A checkpoint of everything but the classifier (what `fedper pretrain` writes) starts any
    # kp; at kp=0 (FedAvg) the classifier is in the base, and it stays fresh.
    body = tmp_path / "body.safetensors"
    weights.save(body, {n: state[n] for n in split(pretrained, 1).base})
    fedavg = build_model(config, seed=0)
    assert init_base(fedavg, read_checkpoint(body, "mobilenet_v1"), kp=0).fresh == (
        "classifier.weight",
        "classifier.bias",
    )
    with pytest.raises(CheckpointError, match="kp=1: 10 missing"):  # a kp=2 base lacks blocks.12
        init_base(build_model(config, seed=0), read_checkpoint(path, "mobilenet_v1"), kp=1)


def test_a_mismatch_names_the_file_the_tensors_and_the_expected_shapes(tmp_path, timm_checkpoint):
    _, path = timm_checkpoint
    model = build_model(ModelConfig(num_classes=5, alpha=0.25, input_size=32), seed=0)
    with pytest.raises(CheckpointError) as err:
        init_base(model, read_checkpoint(path, "mobilenet_v1"), kp=1)
    message = str(err.value)
    assert str(path) in message and "timm-mobilenetv1" in message
    assert "stem.conv.weight: expected shape (8, 3, 3, 3), the checkpoint has (32, 3, 3, 3)" in message


def test_a_pickled_checkpoint_is_refused_without_unpickling_it(tmp_path):
    marker = tmp_path / "ran"

    class Payload:
        def __reduce__(self) -> tuple[object, tuple[str]]:
            return (Path.touch, (str(marker),))  # what unpickling would run

    path = tmp_path / "evil.pth"
    path.write_bytes(pickle.dumps(Payload()))
    with pytest.raises(CheckpointError, match=r"not loaded.*safetensors"):
        read_checkpoint(path, "mobilenet_v1")
    assert not marker.exists()
    garbage = tmp_path / "garbage.safetensors"
    garbage.write_bytes(b"\x10\x00\x00\x00\x00\x00\x00\x00{not json")
    with pytest.raises(CheckpointError, match="garbage.safetensors"):
        read_checkpoint(garbage, "mobilenet_v1")


@settings(max_examples=25, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(data=st.data())
def test_any_damaged_checkpoint_is_refused_cleanly_and_changes_nothing(tmp_path, data):
    """Dropped tensors, changed shapes, extra tensors: a CheckpointError (or, with only extras,
    success), and the model is untouched when refused."""
    config = ModelConfig(num_classes=5, input_size=32)
    state = exchanged_state(build_model(config, seed=3))
    names = sorted(state)
    dropped = data.draw(st.sets(st.sampled_from(names), max_size=3))
    reshaped = data.draw(st.sets(st.sampled_from(names), max_size=3))
    extra = data.draw(st.booleans())
    ckpt = {n: v for n, v in state.items() if n not in dropped}
    for n in reshaped - dropped:
        ckpt[n] = torch.zeros(*state[n].shape, 2)
    if extra:
        ckpt["something.else"] = torch.ones(3)
    path = _save(ckpt, tmp_path / f"ckpt-{abs(hash((tuple(dropped), tuple(reshaped), extra)))}.safetensors")
    model = build_model(config, seed=0)
    before = exchanged_state(model)
    base = set(split(model, 1).base) - {"classifier.weight", "classifier.bias"}
    if (dropped | reshaped) & base:
        with pytest.raises(CheckpointError):
            init_base(model, read_checkpoint(path, "mobilenet_v1"), kp=1)
        after = exchanged_state(model)
        assert all(torch.equal(after[n], before[n]) for n in names)
    else:
        init_base(model, read_checkpoint(path, "mobilenet_v1"), kp=1)
        assert all(np.array_equal(exchanged_state(model)[n].numpy(), state[n].numpy()) for n in base)


@pytest.mark.slow
def test_simulate_init_starts_every_algorithm_from_the_checkpoint(tmp_path):
    """At a learning rate of 1e-9 the weights stay where they started: the final convolutions are
    the checkpoint's (FedPer's and FedAvg's alike), and results.json says where they came from."""
    from fedper._recipes.simulation import SimulationConfig, run
    from fedper.common.train_config import TrainConfig
    from fedper.data import DataConfig

    config = ModelConfig(num_classes=10, input_size=32)
    pretrained = exchanged_state(build_model(config, seed=7))
    path = tmp_path / "pretrained.safetensors"
    weights.save(path, {n: v for n, v in pretrained.items() if not n.startswith("classifier.")})
    out = tmp_path / "run"
    sim = SimulationConfig(algorithms=("fedper", "fedavg"), kp=2, rounds=1, threads=1, out=out, init=path,
                           training=TrainConfig(local_epochs=1, learning_rate=1e-9, momentum=0.0))  # fmt: skip
    run(sim, DataConfig(dataset="digits", num_clients=2, classes_per_client=2, seed=0))
    import json

    recorded = json.loads((out / "results.json").read_text())["config"]["init"]
    assert recorded["layout"] == "fedper" and recorded["sha256"] == __import__("hashlib").sha256(
        path.read_bytes()).hexdigest()  # fmt: skip
    for algorithm in ("fedper", "fedavg"):
        final = weights.load(out / algorithm / "final_base.safetensors")
        conv = "blocks.3.pw.conv.weight"
        np.testing.assert_allclose(final[conv], pretrained[conv].numpy(), atol=1e-6)


def test_simulate_with_a_checkpoint_of_another_model_fails_before_training(tmp_path, capsys):
    from fedper.cli import main

    wide = exchanged_state(build_model(ModelConfig(num_classes=10, alpha=0.5, input_size=32), seed=0))
    path = tmp_path / "wide.safetensors"
    weights.save(path, wide)
    code = main(["simulate", "--dataset", "digits", "--rounds", "1", "--init", str(path), "--out", str(tmp_path / "r")])
    assert code != 0
    err = capsys.readouterr().err
    assert "wide.safetensors" in err and "expected shape (8, 3, 3, 3)" in err
    assert not (tmp_path / "r" / "results.json").exists()
    # A kp=2 base has no last block, which FedAvg's base (kp=0) needs: refused before FedPer trains.
    model = build_model(ModelConfig(num_classes=10, input_size=32), seed=0)
    state = exchanged_state(model)
    kp2 = tmp_path / "kp2.safetensors"
    weights.save(kp2, {n: state[n] for n in split(model, 2).base})
    assert main(["simulate", "--dataset", "digits", "--rounds", "1", "--init", str(kp2), "--out", str(tmp_path / "r")])
    assert "kp=0: 10 missing" in capsys.readouterr().err
    assert not (tmp_path / "r" / "results.json").exists()


def test_export_init_writes_the_checkpoints_base_and_a_fresh_head(tmp_path):
    """What `fedper export --init` exports as initial weights (the server's version 0): the
    checkpoint's base, the seed's head. (The lowering that follows is the same as without --init.)"""
    from fedper.export.pipeline import ExportConfig, ExportConfigError, load_initial_weights

    config = ModelConfig(num_classes=5, input_size=32)
    pretrained = exchanged_state(build_model(config, seed=7))
    path = tmp_path / "pretrained.safetensors"
    weights.save(path, {n: v for n, v in pretrained.items() if not n.startswith("classifier.")})
    model = build_model(config, seed=0)
    fresh = exchanged_state(model)
    load_initial_weights(
        model, ExportConfig(model=ModelConfig(num_classes=5), kp=2, init=path, out=tmp_path / "out"), None
    )
    parts, now = split(model, 2), exchanged_state(model)
    assert all(torch.equal(now[n], pretrained[n]) for n in parts.base)
    assert all(torch.equal(now[n], fresh[n]) for n in parts.head)
    with pytest.raises(ExportConfigError, match="--init"):
        load_initial_weights(model, ExportConfig(init=path, weights=(path,), out=tmp_path / "out"), None)
