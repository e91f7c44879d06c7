"""The ONNX scoring contract a phone's ONNX Runtime (Java) imposes, checked on the host.

``OrtSession.run(Map)`` in Java refuses a name that is not a required input ("Unknown input
name") and more entries than required inputs; overridable initializers are not required
inputs. So ``model.onnx`` must take every base/head weight as a true graph input, and a
device must feed exactly the graph's inputs: the tests below hold the export and the Python
device (which scores the same way) to that.
"""

from __future__ import annotations

import io
import json
from importlib.metadata import version
from pathlib import Path

import numpy as np
import onnx
import onnxruntime as ort
import pytest
import torch
from torch import nn

from fedper.common import weights
from fedper.common.manifest import read_manifest
from fedper.device_runtime.inference_runtime import OnnxContractError, OnnxInference
from fedper.device_runtime.training_program import TrainingProgram
from fedper.export.onnx_export import INPUT_NAME, ONNX_OPSET, weights_as_graph_inputs
from fedper.export.onnx_export import OnnxContractError as ExportContractError
from fedper.models import ModelConfig, build_model


def java_run_check(session: ort.InferenceSession, feeds: dict[str, np.ndarray]) -> None:
    """What ONNX Runtime Java checks before a run: no more inputs than the model requires,
    each one of its input names (OrtSession.run); the native session then needs them all."""
    required = [i.name for i in session.get_inputs()]
    if len(feeds) > len(required):
        raise AssertionError(f"Unexpected number of inputs, expected {len(required)}, got {len(feeds)}")
    unknown = sorted(set(feeds) - set(required))
    assert not unknown, f"Unknown input name {unknown[0]}"
    missing = sorted(set(required) - set(feeds))
    assert not missing, f"missing input {missing[0]}"


def _perturbed(artifacts: Path, seed: int) -> dict[str, torch.Tensor]:
    """The export's initial weights, moved well away from where they started."""
    manifest = read_manifest(artifacts)
    files = [artifacts / manifest.artifacts["initial_base"], artifacts / manifest.artifacts["initial_head"]]
    initial = weights.load_checked(files, manifest.layout("base") + manifest.layout("head"))
    rng = torch.Generator().manual_seed(seed)
    out = {}
    for name, value in initial.items():
        t = torch.from_numpy(np.array(value))
        if name.endswith("running_var"):
            out[name] = torch.rand(t.shape, generator=rng) + 0.5
        else:
            out[name] = t + 0.1 * torch.randn(t.shape, generator=rng)
    return out


def test_exported_onnx_takes_every_weight_as_a_true_graph_input(artifacts):
    manifest = read_manifest(artifacts)
    path = artifacts / manifest.artifacts["onnx_model"]
    session = ort.InferenceSession(str(path), providers=["CPUExecutionProvider"])
    assert session.get_overridable_initializers() == []
    inputs = [i.name for i in session.get_inputs()]
    assert inputs == [INPUT_NAME, *manifest.base_names, *manifest.head_names]  # state-dict order
    assert [o.name for o in session.get_outputs()] == ["logits"]
    image = session.get_inputs()[0]
    assert image.type == "tensor(float)" and image.shape[1:] == [3, 32, 32] and isinstance(image.shape[0], str)
    shapes = {i.name: i.shape for i in session.get_inputs()[1:]}
    for entry in manifest.tensors.base + manifest.tensors.head:
        assert shapes[entry.name] == entry.shape, entry.name
    graph = onnx.load(str(path)).graph
    assert not {t.name for t in graph.initializer} & set(inputs)  # no initializer shadows an input
    assert max(o.version for o in onnx.load(str(path)).opset_import if o.domain in ("", "ai.onnx")) == ONNX_OPSET


@pytest.mark.numeric
def test_python_device_feeds_exactly_the_model_inputs_and_matches_torch(artifacts, digits_batches, monkeypatch, claim):
    """The device's scoring path (TrainingProgram -> OnnxInference) with non-initial weights:
    its feeds pass Java's check and its logits are torch's eval-mode logits."""
    x, _ = digits_batches
    manifest = read_manifest(artifacts)
    fed: list[dict[str, np.ndarray]] = []
    original = OnnxInference.feeds

    def recording(self: OnnxInference, batch: torch.Tensor) -> dict[str, np.ndarray]:
        feeds = original(self, batch)
        fed.append(feeds)
        return feeds

    monkeypatch.setattr(OnnxInference, "feeds", recording)
    program = TrainingProgram(artifacts, evaluator="onnx")
    trained = _perturbed(artifacts, seed=7)
    program.set_tensors(trained)
    logits = program.predict(x[:16])

    session = ort.InferenceSession(
        str(artifacts / manifest.artifacts["onnx_model"]), providers=["CPUExecutionProvider"]
    )
    assert len(fed) == 1
    java_run_check(session, fed[0])
    assert set(fed[0]) == {INPUT_NAME, *manifest.base_names, *manifest.head_names}
    for name, value in trained.items():
        np.testing.assert_array_equal(fed[0][name], value.numpy())  # the current weights, not the initial ones

    model = build_model(ModelConfig(**manifest.model.model_dump()))
    model.load_state_dict(trained, strict=False)  # all but BN's integer batch counters
    with torch.no_grad():
        expected = model.eval()(x[:16])
    claim.close("logits, ONNX Runtime against torch", logits, expected, rtol=0, atol=1e-4)
    initial = TrainingProgram(artifacts, evaluator="onnx").predict(x[:16])
    claim.above("largest logit change from the fed weights", float((logits - initial).abs().max()), 0.1)


def test_onnx_inference_names_a_missing_unknown_or_misshapen_weight(artifacts):
    manifest = read_manifest(artifacts)
    inference = OnnxInference(artifacts / manifest.artifacts["onnx_model"])
    good = _perturbed(artifacts, seed=1)
    with pytest.raises(RuntimeError, match="set_weights"):
        inference.feeds(torch.zeros(1, 3, 32, 32))
    with pytest.raises(OnnxContractError, match="no tensor given for the ONNX weight input 'classifier.bias'"):
        inference.set_weights({n: t for n, t in good.items() if n != "classifier.bias"})
    with pytest.raises(OnnxContractError, match="no weight input named 'stem.bn.num_batches_tracked'"):
        inference.set_weights({**good, "stem.bn.num_batches_tracked": torch.zeros(())})
    with pytest.raises(OnnxContractError, match=r"'classifier.weight' has shape \[10, 256\], given \[3, 256\]"):
        inference.set_weights({**good, "classifier.weight": torch.zeros(3, 256)})
    inference.set_weights(good)
    assert set(inference.feeds(torch.zeros(2, 3, 32, 32))) == inference.input_names


class _Tiny(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.conv = nn.Conv2d(3, 4, 3)
        self.bn = nn.BatchNorm2d(4)
        self.fc = nn.Linear(4, 2)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.fc(self.bn(self.conv(x)).mean(dim=(2, 3)))


def _old_style_onnx() -> onnx.ModelProto:
    """What exports wrote before the contract: weights as initializers that are also inputs."""
    buf = io.BytesIO()
    torch.onnx.export(_Tiny().eval(), (torch.zeros(1, 3, 8, 8),), buf, input_names=[INPUT_NAME],
                      output_names=["logits"], opset_version=ONNX_OPSET, do_constant_folding=False,
                      keep_initializers_as_inputs=True, dynamic_axes={INPUT_NAME: {0: "batch"}},
                      dynamo=False)  # fmt: skip
    return onnx.load_from_string(buf.getvalue())


def test_a_model_with_overridable_initializers_is_refused_by_name(tmp_path):
    path = tmp_path / "old.onnx"
    path.write_bytes(_old_style_onnx().SerializeToString())
    with pytest.raises(OnnxContractError, match=r"old.onnx: weights such as 'conv.weight' are initializers.*re-export"):
        OnnxInference(path)


@pytest.mark.numeric
def test_weights_as_graph_inputs_rewrites_exactly_the_named_weights(tmp_path, claim):
    model = _Tiny().eval()
    names = [n for n, t in model.state_dict().items() if t.is_floating_point()]
    converted = weights_as_graph_inputs(_old_style_onnx(), names)
    assert [i.name for i in converted.graph.input] == [INPUT_NAME, *names]
    assert not {t.name for t in converted.graph.initializer} & set(names)
    path = tmp_path / "new.onnx"
    path.write_bytes(converted.SerializeToString())
    inference = OnnxInference(path)
    state = {n: t + 0.5 for n, t in model.state_dict().items() if n in names}
    state["bn.running_var"] = state["bn.running_var"].abs() + 0.5
    inference.set_weights(state)
    model.load_state_dict(state, strict=False)
    x = torch.randn(3, 3, 8, 8)
    with torch.no_grad():
        claim.close("logits, rewritten ONNX model against torch", inference.predict(x), model(x), rtol=0, atol=1e-5)
    with pytest.raises(ExportContractError, match="no weight 'nope.weight'"):
        weights_as_graph_inputs(_old_style_onnx(), [*names, "nope.weight"])


def test_manifest_runtime_is_recorded_and_optional(server_artifacts, tmp_path):
    manifest = read_manifest(server_artifacts)
    assert manifest.runtime is not None
    assert manifest.runtime.executorch == version("executorch") and manifest.runtime.onnx_opset == ONNX_OPSET
    data = json.loads((server_artifacts / "manifest.json").read_text())
    assert data["runtime"] == {"executorch": version("executorch"), "onnx_opset": ONNX_OPSET}
    # A manifest written before the field existed still loads, and is written back without it.
    del data["runtime"]
    old = tmp_path / "old"
    old.mkdir()
    (old / "manifest.json").write_text(json.dumps(data))
    loaded = read_manifest(old, verify_files=False)
    assert loaded.runtime is None and "runtime" not in json.loads(loaded.to_json())
    data["runtime"] = {"executorch": "1.5.1"}
    (old / "manifest.json").write_text(json.dumps(data))
    with pytest.raises(ValueError, match="onnx_opset"):
        read_manifest(old, verify_files=False)
