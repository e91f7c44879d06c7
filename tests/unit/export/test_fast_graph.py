"""The fast training graph computes exactly what nn.Conv2d / nn.BatchNorm2d compute.

Compared in float64 with torch's float64 tolerances (rtol = atol = 1e-7, F64 below): rounding
is ~1e-15 there, so the bound keeps its room on every kernel set; a wrong formula is off by
far more. ``make test-portable`` shows the margins.
"""

import pytest
import torch
from torch.nn import functional as F

from fedper.common.errors import ConfigError
from fedper.export.executorch_lowering import drop_aliases, use_linear_for_transposed_matmul
from fedper.export.fast_ops import batch_norm_relu, depthwise, depthwise_s2, max_pool, stem_conv
from fedper.export.training_graph import resolve_variant, training_step
from fedper.models import ModelConfig, build_model
from tests.support.custom_model import ShapeBranchNet

torch.manual_seed(0)
F64 = {"rtol": 1e-7, "atol": 1e-7}


def _cm(x):
    """NCHW -> channel-major [C, B, H, W]."""
    return x.permute(1, 0, 2, 3).contiguous()


@pytest.mark.parametrize(
    ("k", "stride", "shape"),
    [(3, 1, (2, 5, 6, 7)), (3, 1, (3, 4, 2, 2)), (3, 1, (1, 8, 1, 5)), (3, 1, (2, 3, 9, 1)),
     (3, 2, (2, 5, 8, 6)), (3, 2, (3, 2, 2, 2)), (3, 2, (1, 4, 14, 14)),
     (5, 1, (2, 3, 7, 6)), (5, 1, (1, 4, 2, 3)), (5, 1, (2, 2, 1, 9)), (7, 1, (2, 3, 8, 5)),
     (5, 2, (2, 3, 8, 10)), (5, 2, (1, 4, 2, 2)), (5, 2, (2, 2, 4, 6)), (7, 2, (2, 3, 10, 8)),
     (7, 2, (1, 2, 2, 4)), (9, 2, (1, 2, 12, 6))],
)  # fmt: skip
@pytest.mark.numeric
def test_depthwise_matches_conv2d(k, stride, shape, claim):
    b, c, h, w = shape
    x = torch.randn(b, c, h, w, dtype=torch.float64, requires_grad=True)
    weight = torch.randn(c, 1, k, k, dtype=torch.float64, requires_grad=True)
    ref = F.conv2d(x, weight, stride=stride, padding=k // 2, groups=c)
    out, _ = (depthwise if stride == 1 else depthwise_s2)(_cm(x), weight)
    claim.close("output", out.detach(), _cm(ref).detach(), **F64)
    g = torch.randn_like(ref)
    gx, gw = torch.autograd.grad(ref, (x, weight), g)
    fx, fw = torch.autograd.grad(out, (x, weight), _cm(g))
    claim.close("input gradient", fx, gx, **F64)
    claim.close("weight gradient", fw, gw, **F64)


@pytest.mark.parametrize(
    ("k", "stride", "shape"),
    [(3, 2, (2, 3, 8, 6)), (3, 2, (1, 2, 2, 2)), (3, 1, (2, 3, 7, 5)), (3, 1, (1, 2, 1, 4)),
     (5, 1, (2, 2, 6, 7)), (5, 2, (2, 2, 8, 10)), (7, 2, (1, 2, 10, 6))],
)  # fmt: skip
@pytest.mark.parametrize("ties", [False, True])
@pytest.mark.numeric
def test_max_pool_matches_max_pool2d_and_sends_a_tie_to_the_first_maximum(k, stride, shape, ties, claim):
    """With ``ties``, small integers (many equal values in a window): max_pool2d's gradient goes
    to the first maximum in the window's row-major order, and so must ours."""
    b, c, h, w = shape
    x = torch.randint(-2, 3, shape).double() if ties else torch.randn(b, c, h, w, dtype=torch.float64)
    x.requires_grad_(True)
    ref = F.max_pool2d(x, k, stride, k // 2)
    out, _ = max_pool(_cm(x), k, stride)
    claim.close("output", out.detach(), _cm(ref).detach(), **F64)
    g = torch.randn_like(ref)
    (expected,) = torch.autograd.grad(ref, (x,), g)
    (got,) = torch.autograd.grad(out, (x,), _cm(g))
    claim.close("input gradient", got, expected, **F64)


@pytest.mark.parametrize("stride", [1, 2])
@pytest.mark.numeric
def test_stem_convolution_matches_conv2d(stride, claim):
    x = torch.randn(2, 3, 8, 6, dtype=torch.float64)
    weight = torch.randn(5, 3, 3, 3, dtype=torch.float64, requires_grad=True)
    ref = F.conv2d(x, weight, stride=stride, padding=1)
    out, _ = stem_conv(_cm(x), weight, stride)
    cout, b, ho, wo = ref.shape[1], ref.shape[0], ref.shape[2], ref.shape[3]
    claim.close("output", out.view(cout, b, ho, wo).detach(), _cm(ref).detach(), **F64)
    g = torch.randn_like(ref)
    (gw,) = torch.autograd.grad(ref, (weight,), g)
    (fw,) = torch.autograd.grad(out, (weight,), _cm(g).reshape(cout, -1))
    claim.close("weight gradient", fw, gw, **F64)


@pytest.mark.parametrize("relu", [True, False])
@pytest.mark.numeric
def test_batch_norm_relu_matches_batchnorm2d(relu, claim):
    b, c, h, w = 4, 6, 3, 5
    x = torch.randn(b, c, h, w, dtype=torch.float64, requires_grad=True) * 3 + 1
    weight = torch.rand(c, dtype=torch.float64, requires_grad=True)
    bias = torch.randn(c, dtype=torch.float64, requires_grad=True)
    running_mean, running_var = (
        torch.zeros(c, dtype=torch.float64),
        torch.ones(c, dtype=torch.float64),
    )
    ref = F.batch_norm(x, running_mean, running_var, weight, bias, training=True, momentum=1.0, eps=1e-5)
    if relu:
        ref = torch.relu(ref)
    y, mean, var, _, _ = batch_norm_relu(_cm(x).view(c, -1), weight, bias, 1e-5, relu, b)
    claim.close("output", y.view(c, b, h, w).detach(), _cm(ref).detach(), **F64)
    claim.close("running mean", mean.detach(), running_mean, **F64)  # momentum 1: the batch statistics
    claim.close("running variance", var.detach(), running_var, **F64)  # unbiased, as nn.BatchNorm2d keeps it
    g = torch.randn_like(ref)
    expected = torch.autograd.grad(ref, (x, weight, bias), g)
    got = torch.autograd.grad(y, (x, weight, bias), _cm(g).view(c, -1))
    for name, e, a in zip(("input", "weight", "bias"), expected, got, strict=True):
        claim.close(f"{name} gradient", a, e, **F64)


@pytest.mark.parametrize("input_size", [32, 224])
@pytest.mark.numeric
def test_fast_step_equals_plain_step_in_float64(input_size, claim):
    model = build_model(ModelConfig(alpha=0.25, input_size=input_size), seed=1).double()
    plain, fast = training_step(model, "plain"), training_step(model, "fast")
    assert [n for n, _ in plain.named_parameters()] == [n for n, _ in fast.named_parameters()]
    assert plain.stat_names == fast.stat_names
    x = torch.randn(3, 3, input_size, input_size, dtype=torch.float64)
    y = torch.randint(0, 10, (3,))
    stats = [torch.rand(model.state_dict()[n].shape, dtype=torch.float64) + 0.5 for n in plain.stat_names]
    a, b = plain(x, y, *stats), fast(x, y, *stats)
    claim.close("loss and statistics", torch.cat([u.detach().flatten() for u in b]),
                torch.cat([v.detach().flatten() for v in a]), **F64)  # fmt: skip
    a[0].backward()
    b[0].backward()
    fast_params = dict(fast.named_parameters())
    claim.close("gradients", torch.cat([fast_params[n].grad.flatten() for n, _ in plain.named_parameters()]),
                torch.cat([p.grad.flatten() for _, p in plain.named_parameters()]), rtol=1e-9, atol=1e-12)  # fmt: skip


def test_a_model_torch_fx_cannot_trace_gets_the_stock_program_with_a_warning_and_fast_is_refused():
    model, warnings = ShapeBranchNet(), []
    assert resolve_variant("auto", model, warn=warnings.append) == "plain"
    assert len(warnings) == 1
    assert "torch.fx trace, which failed (TraceError:" in warnings[0] and "--variant plain" in warnings[0]
    with pytest.raises(ConfigError, match="--variant fast: the fast training graph .* Make the model's forward"):
        resolve_variant("fast", model)
    assert resolve_variant("plain", model, warn=warnings.append) == "plain" and len(warnings) == 1
    x, y = torch.randn(2, 3, 32, 32), torch.zeros(2, dtype=torch.long)
    torch.testing.assert_close(training_step(model, "plain")(x, y)[0], F.cross_entropy(model(x), y))


def test_variant_choice():
    """One lowering for every model: auto is the fast graph, whatever the model or input size."""
    mobilenet = build_model(ModelConfig())
    assert resolve_variant("auto", mobilenet) == "fast"
    assert resolve_variant("plain", mobilenet) == "plain"
    resnet = build_model(ModelConfig(name="resnet34"))
    assert resolve_variant("auto", resnet) == resolve_variant("fast", resnet) == "fast"
    with pytest.raises(ValueError, match="unknown training-graph variant"):
        resolve_variant("quick", resnet)
    ablation = build_model(ModelConfig(base="linear", linear_base_kp=2))
    step = training_step(ablation, "fast")
    assert step.fallbacks_at(32) == []
    step = training_step(mobilenet, "fast")
    x, y = torch.randn(2, 3, 40, 40), torch.zeros(2, dtype=torch.long)
    stats = [torch.zeros(n) if i % 2 == 0 else torch.ones(n)
             for i, n in enumerate(mobilenet.state_dict()[k].numel() for k in step.stat_names)]  # fmt: skip
    torch.testing.assert_close(step(x, y, *stats)[0], training_step(mobilenet, "plain")(x, y, *stats)[0])


@pytest.mark.numeric
def test_graph_passes_keep_values(claim):
    class Net(torch.nn.Module):
        def forward(self, a, b):
            aten = torch.ops.aten
            c = aten.alias.default(a)
            return aten.mm.default(c, aten.t.default(b)) + aten.mm.default(c, aten.permute.default(b, [1, 0]))

    gm = torch.fx.symbolic_trace(Net())
    a, b = torch.randn(3, 4), torch.randn(5, 4)
    expected = gm(a, b)
    assert drop_aliases(gm) == 1
    assert use_linear_for_transposed_matmul(gm) == 2
    targets = [n.target for n in gm.graph.nodes if n.op == "call_function"]
    assert torch.ops.aten.linear.default in targets
    assert torch.ops.aten.mm.default not in targets
    # float32: linear and mm may sum in another order; torch's float32 tolerances.
    claim.close("values after the passes", gm(a, b), expected, rtol=1.3e-6, atol=1e-5)
