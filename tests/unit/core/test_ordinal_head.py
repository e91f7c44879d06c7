"""The ordinal head: a cumulative-link model whose outputs are 5 log class-probabilities, so the
loss, the argmax, ONNX's ``logits``, the protocol and the phone stay what they are.

Its ops (softplus, cumsum, log-sigmoid, concatenation) are new to the programs: the ExecuTorch
training program's loss and gradients are held to eager float32 and float64, the inference
program and ONNX (fed as ONNX Runtime's Java API feeds it) to eager.
"""

from __future__ import annotations

import copy

import numpy as np
import onnxruntime as ort
import pytest
import torch
from torch import nn
from torch.nn import functional as F

from fedper.common.errors import ConfigError
from fedper.export.executorch_lowering import lower_inference_program, lower_training_program
from fedper.export.onnx_export import INPUT_NAME, export_onnx
from fedper.export.training_graph import TrainingStep, training_step
from fedper.models import ModelConfig, build_model, exchanged_names, exchanged_state, split
from fedper.models.heads import OrdinalHead, classifier
from fedper.models.mobilenet_v1 import ConvBN
from fedper.models.staged import Stage, StagedModel
from tests.unit.export.test_onnx_contract import java_run_check

F64 = {"rtol": 1e-7, "atol": 1e-7}


def _direct(head: OrdinalHead, x: torch.Tensor) -> torch.Tensor:
    """The textbook formula: differences of cumulative sigmoids (fine in float64)."""
    cuts = torch.cat([head.first, head.first + torch.cumsum(F.softplus(head.gaps), 0)])
    c = torch.sigmoid(cuts[None, :] - head.score(x))
    return torch.cat([c[:, :1], c[:, 1:] - c[:, :-1], 1 - c[:, -1:]], 1).log()


@pytest.mark.numeric
def test_outputs_are_the_cumulative_link_log_probabilities(claim):
    torch.manual_seed(0)
    head = OrdinalHead(8, 5).double()
    with torch.no_grad():
        head.gaps.copy_(torch.tensor([-3.0, 0.0, 2.0], dtype=torch.float64))
    x = torch.randn(200, 8, dtype=torch.float64) * 3
    with torch.no_grad():
        out, direct = head(x), _direct(head, x)
    claim.close("log-probabilities against the direct formula", out, direct, **F64)
    claim.close("probabilities sum to one", out.exp().sum(1), torch.ones(200, dtype=torch.float64), **F64)
    # Cross-entropy's log-softmax leaves normalized log-probabilities as they are: the loss is the NLL.
    y = torch.randint(0, 5, (200,))
    claim.close("cross-entropy is the negative log-likelihood", F.cross_entropy(out, y), F.nll_loss(out, y), **F64)


def test_the_prediction_rises_with_the_score_and_stays_finite_far_out():
    head = OrdinalHead(1, 5)
    with torch.no_grad():
        head.score.weight.fill_(1.0)
    x = torch.linspace(-60, 60, 241)[:, None]
    with torch.no_grad():
        out = head(x)
    assert torch.isfinite(out).all(), "log-probabilities overflow far from the cut points"
    predicted = out.argmax(1)
    assert (predicted[1:] >= predicted[:-1]).all() and predicted[0] == 0 and predicted[-1] == 4


def test_cut_points_stay_ordered_under_any_update():
    head = OrdinalHead(4, 5)
    with torch.no_grad():
        head.gaps.copy_(torch.tensor([-30.0, 5.0, -1.0]))
        head.first.fill_(7.0)
    out = head(torch.randn(16, 4))
    assert torch.isfinite(out).all()
    assert torch.allclose(out.exp().sum(1), torch.ones(16), atol=1e-5)


def test_the_head_is_the_classifier_everywhere_the_split_looks():
    model = build_model(ModelConfig(num_classes=5, head="ordinal"), seed=0)
    s = split(model, 1)
    assert s.head == ("classifier.first", "classifier.gaps", "classifier.score.weight")
    assert set(split(model, 2).head) > set(s.head)
    resnet = build_model(ModelConfig(name="resnet34", num_classes=5, head="ordinal"))
    assert split(resnet, 1).head == ("fc.first", "fc.gaps", "fc.score.weight")
    with pytest.raises(ConfigError, match="unknown head 'cumulative'"):
        ModelConfig(head="cumulative")
    with pytest.raises(ConfigError, match="unknown head"):
        classifier("probit", 4, 5)


def test_ordinal_head_gives_log_probabilities_with_finite_gradients_at_extreme_scores():
    torch.manual_seed(0)
    head = OrdinalHead(4, 5)
    x = torch.randn(6, 4) * torch.tensor([[1.0], [10.0], [100.0], [1e4], [-1e4], [0.0]])
    logp = head(x)
    assert logp.shape == (6, 5)
    assert torch.allclose(logp.exp().sum(1), torch.ones(6), atol=1e-5)
    torch.autograd.backward(torch.nn.functional.nll_loss(logp, torch.tensor([0, 1, 2, 3, 4, 2])))
    grads = [p.grad for p in head.parameters()]
    assert all(g is not None and torch.isfinite(g).all() for g in grads)


def test_ordinal_head_starts_with_equal_class_probabilities_at_score_zero():
    head = OrdinalHead(3, 5)
    with torch.no_grad():
        head.score.weight.zero_()
    assert torch.allclose(head(torch.ones(2, 3)).exp(), torch.full((2, 5), 0.2), atol=1e-5)


@pytest.mark.numeric
def test_the_fast_training_graph_equals_the_plain_one_with_the_ordinal_head(claim):
    model = build_model(ModelConfig(num_classes=5, head="ordinal"), seed=1).double()
    plain, fast = training_step(model, "plain"), training_step(model, "fast")
    x = torch.randn(3, 3, 32, 32, dtype=torch.float64)
    y = torch.tensor([0, 4, 2])
    stats = [torch.rand(model.state_dict()[n].shape, dtype=torch.float64) + 0.5 for n in plain.stat_names]
    a, b = plain(x, y, *stats), fast(x, y, *stats)
    claim.close("loss", b[0].detach(), a[0].detach(), **F64)
    a[0].backward()
    b[0].backward()
    fast_params = dict(fast.named_parameters())
    for name in ("classifier.first", "classifier.gaps", "classifier.score.weight"):
        plain_grad = dict(plain.named_parameters())[name].grad
        claim.close(f"{name} gradient", fast_params[name].grad, plain_grad, rtol=1e-9, atol=1e-12)


class _TinyModel(StagedModel):
    """One ConvBN layer, pooling and the ordinal head: every new op in a training program that
    lowers in seconds (a whole model's export takes minutes; test_export runs it)."""

    def __init__(self, head: OrdinalHead):
        super().__init__()
        self.stem = ConvBN(3, 6, 3, 1)
        self.classifier = head

    def _top(self, x: torch.Tensor) -> torch.Tensor:
        return self.classifier(x.mean(dim=(2, 3)))

    def stages(self) -> list[Stage]:
        return [self.stem, self._top]

    def stage_groups(self) -> list[list[str]]:
        return [["stem"], ["classifier"]]


@pytest.mark.export
@pytest.mark.numeric
def test_the_executorch_training_program_gets_eager_loss_and_gradients(tmp_path, claim):
    from executorch.extension.pybindings.portable_lib import _load_for_executorch
    from executorch.extension.training import TrainingModule

    torch.manual_seed(3)
    head = OrdinalHead(6, 5)
    with torch.no_grad():
        head.score.weight.mul_(8)  # scores several units apart: every class probable somewhere
        head.gaps.copy_(torch.tensor([-2.0, 0.5, 3.0]))
    model = _TinyModel(head)
    step = TrainingStep(model)
    lowered = lower_training_program(step, input_size=8, max_batch=16)
    (tmp_path / "tiny.pte").write_bytes(lowered.program)
    (tmp_path / "tiny.ptd").write_bytes(lowered.weights)
    module = TrainingModule(_load_for_executorch(str(tmp_path / "tiny.pte"), data_path=str(tmp_path / "tiny.ptd")))
    x, y = torch.randn(13, 3, 8, 8), torch.randint(0, 5, (13,))
    stats = [torch.zeros(6), torch.ones(6)]
    loss = module.forward_backward("forward", (x, y, *stats))[0]
    gradients = module.named_gradients()

    eager = copy.deepcopy(model).train()
    eager_loss = F.cross_entropy(eager(x), y)
    eager_loss.backward()
    exact = copy.deepcopy(model).double().train()
    F.cross_entropy(exact(x.double()), y).backward()
    claim.below("relative |program - eager| loss", abs(float(loss) / float(eager_loss) - 1), 1e-5)
    assert set(gradients) == {n for n, _ in eager.named_parameters()}
    for name, p in exact.named_parameters():  # the stem's too: the head's gradient flows into it
        assert p.grad is not None
        scale = float(p.grad.abs().max())
        program_error = float((gradients[name].double() - p.grad).abs().max()) / scale
        eager_error = float((dict(eager.named_parameters())[name].grad.double() - p.grad).abs().max()) / scale
        claim.below(f"{name} gradient error beyond 3x eager float32's", program_error - 3 * eager_error, 1e-5)


def _ordinal_model() -> nn.Module:
    model = build_model(ModelConfig(num_classes=5, head="ordinal"), seed=2).eval()
    with torch.no_grad():
        model.classifier.score.weight.mul_(20)  # type: ignore[union-attr]  # spread the classes
    return model


@pytest.mark.export
@pytest.mark.numeric
def test_the_executorch_inference_program_scores_as_eager(tmp_path, claim):
    from executorch.extension.pybindings.portable_lib import _load_for_executorch

    model = _ordinal_model()
    lowered = lower_inference_program(model, 32)
    (tmp_path / "infer.pte").write_bytes(lowered.program)
    (tmp_path / "infer.ptd").write_bytes(lowered.weights)
    program = _load_for_executorch(str(tmp_path / "infer.pte"), data_path=str(tmp_path / "infer.ptd"))
    x = torch.randn(1, 3, 32, 32)
    with torch.no_grad():
        expected = model(x)
    claim.close("log-probabilities, program against eager", program.forward((x,))[0], expected, rtol=1e-4, atol=1e-4)


@pytest.mark.numeric
def test_onnx_logits_are_the_log_probabilities_with_weights_fed_as_java_feeds_them(claim):
    model = _ordinal_model()
    names = exchanged_names(model)
    session = ort.InferenceSession(export_onnx(model, 32, names), providers=["CPUExecutionProvider"])
    x = torch.randn(4, 3, 32, 32)
    feeds = {INPUT_NAME: x.numpy(), **{n: v.numpy() for n, v in exchanged_state(model).items()}}
    java_run_check(session, feeds)
    (logits,) = session.run(None, feeds)
    with torch.no_grad():
        expected = model(x)
    claim.close("ONNX logits against eager", torch.from_numpy(logits), expected, rtol=1e-4, atol=1e-4)
    assert np.allclose(np.exp(logits).sum(1), 1, atol=1e-5)
