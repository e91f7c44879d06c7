"""The generic fast training graph (export/channel_major.py) computes what the model computes:
loss, gradients and running statistics against the plain training step in float64, for the
named models and for a model of every construct it translates; what it cannot translate runs
as the model's own code and is named."""

from __future__ import annotations

import pytest
import torch
import torchvision
from torch import nn
from torch.nn import functional as F

from fedper.export.channel_major import ChannelMajorStep
from fedper.export.fast_convolution import convolution
from fedper.export.fast_ops import ACTIVATIONS, activation
from fedper.export.training_graph import TrainingStep
from fedper.models import ModelConfig, build_model

F64 = {"rtol": 1e-7, "atol": 1e-7}
REFERENCE = {"relu": F.relu, "relu6": F.relu6, "hardswish": F.hardswish, "hardsigmoid": F.hardsigmoid,
             "silu": F.silu, "sigmoid": torch.sigmoid, "gelu": F.gelu,
             "gelu_tanh": lambda x: F.gelu(x, approximate="tanh")}  # fmt: skip


def _cm(x: torch.Tensor) -> torch.Tensor:
    return x.permute(1, 0, 2, 3).contiguous()


@pytest.mark.parametrize("kind", ACTIVATIONS)
@pytest.mark.numeric
def test_each_activation_and_its_derivative_match_torch(kind, claim):
    x = (torch.randn(4000, dtype=torch.float64) * 4).requires_grad_()
    x.data[:8] = torch.tensor([-3.0, 3.0, 0.0, 6.0, -1.5, 1e-9, -1e-9, 2.5], dtype=torch.float64)
    g = torch.randn_like(x)
    (expected,) = torch.autograd.grad(REFERENCE[kind](x), x, g)
    (got,) = torch.autograd.grad(activation(x, kind), x, g)
    claim.close("value", activation(x, kind).detach(), REFERENCE[kind](x).detach(), **F64)
    claim.close("derivative", got, expected, **F64)


CONVOLUTIONS = [
    # (in, out, kernel, stride, padding, dilation, groups, bias, (h, w))
    (3, 5, 3, 1, 1, 1, 1, False, (8, 6)),  # the stem's shape on an activation (input gradient)
    (4, 6, 3, 1, 1, 1, 1, True, (1, 5)),  # one row: every tap above and below reads padding
    (4, 6, 3, 1, 1, 1, 1, False, (7, 1)),  # one column: every tap to the sides reads padding
    (4, 6, 3, 2, 1, 1, 1, True, (7, 9)),  # odd sides
    (4, 6, 7, 2, 3, 1, 1, False, (16, 16)),  # ResNet's ImageNet stem
    (6, 6, 5, 2, 2, 1, 6, False, (9, 8)),  # depthwise 5x5, stride 2 on an odd side: im2col
    (6, 6, 3, 1, 2, 2, 6, True, (7, 7)),  # dilated depthwise
    (6, 9, 3, 1, 1, 1, 3, False, (5, 6)),  # grouped
    (6, 12, 3, 1, 1, 1, 6, False, (5, 5)),  # depthwise with a channel multiplier: grouped
    (4, 8, 1, 2, 0, 1, 1, False, (6, 6)),  # ResNet's downsampling 1x1
    (4, 8, 1, 1, 0, 1, 2, True, (3, 5)),  # grouped 1x1
    (4, 3, (1, 3), 1, (0, 1), 1, 1, False, (4, 5)),  # rectangular kernel
    (4, 3, 3, 1, 0, 1, 1, False, (6, 5)),  # no padding
    (4, 4, 3, 1, 1, 1, 4, False, (6, 6)),  # the depthwise op, 3x3
    (4, 4, 3, 2, 1, 1, 4, False, (6, 6)),  # the stride-2 depthwise op, 3x3
    (6, 6, 5, 1, 2, 1, 6, True, (5, 7)),  # the depthwise op, 5x5 (MobileNet-V3, EfficientNet)
    (6, 6, 5, 2, 2, 1, 6, False, (8, 10)),  # the stride-2 depthwise op, 5x5
    # A 1x1 map to a 1x1 output: only the in-bounds tap's product (late layers at 32 px).
    (6, 5, 3, 1, 1, 1, 1, True, (1, 1)),  # ResNet's layer4 at 32 px
    (6, 6, 5, 1, 2, 1, 6, False, (1, 1)),  # depthwise 5x5
    (6, 6, 3, 2, 1, 1, 6, False, (1, 1)),  # stride 2 on a 1x1 map
    (6, 9, 3, 1, 2, 2, 3, False, (1, 1)),  # grouped, dilated
    (6, 4, (1, 3), 1, (0, 1), 1, 1, False, (1, 1)),  # rectangular, padded only at the sides
]


@pytest.mark.parametrize("spec", CONVOLUTIONS, ids=str)
@pytest.mark.numeric
def test_every_convolution_shape_matches_conv2d(spec, claim):
    cin, cout, k, s, p, d, g, bias, (h, w) = spec
    conv = nn.Conv2d(cin, cout, k, stride=s, padding=p, dilation=d, groups=g, bias=bias).double()
    x = torch.randn(2, cin, h, w, dtype=torch.float64, requires_grad=True)
    ref = conv(x)
    out = convolution(_cm(x), conv)
    claim.close("output", out.detach(), _cm(ref).detach(), **F64)
    grad = torch.randn_like(ref)
    params = [x, *conv.parameters()]
    expected = torch.autograd.grad(ref, params, grad)
    got = torch.autograd.grad(out, params, _cm(grad))
    for name, e, a in zip(("input", "weight", "bias"), expected, got, strict=False):
        claim.close(f"{name} gradient", a, e, **F64)


class EveryConstruct(nn.Module):
    """Every construct the lowering translates: convolutions of each kind, BatchNorm with each
    activation, squeeze-and-excitation, residuals, max and average pooling, dropout."""

    def __init__(self, num_classes: int = 10) -> None:
        super().__init__()
        self.stem = nn.Sequential(nn.Conv2d(3, 8, 3, 1, 1, bias=False), nn.BatchNorm2d(8), nn.ReLU(inplace=True))
        self.pool = nn.MaxPool2d(3, 2, 1)
        self.grouped = nn.Sequential(nn.Conv2d(8, 12, 3, 1, 1, groups=4, bias=False), nn.BatchNorm2d(12),
                                     nn.Hardswish())  # fmt: skip
        self.depthwise = nn.Sequential(nn.Conv2d(12, 12, 5, 2, 4, dilation=2, groups=12, bias=False),
                                       nn.BatchNorm2d(12), nn.SiLU())  # fmt: skip
        self.se_reduce, self.se_expand = nn.Conv2d(12, 4, 1), nn.Conv2d(4, 12, 1)
        self.project = nn.Sequential(nn.Conv2d(12, 12, 1, bias=False), nn.BatchNorm2d(12))
        self.tail = nn.Sequential(nn.Conv2d(12, 16, 3, 1, 1), nn.BatchNorm2d(16), nn.ReLU6(), nn.Dropout(0.0))
        self.gelu, self.sigmoid = nn.GELU(), nn.Sigmoid()
        self.classifier = nn.Linear(16, num_classes)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        x = self.pool(self.stem(x))
        x = self.depthwise(self.grouped(x))
        scale = F.adaptive_avg_pool2d(x, 1)
        scale = F.hardsigmoid(self.se_expand(self.gelu(self.se_reduce(scale))))
        x = x * scale
        x = x + self.project(x)
        x = self.tail(x)
        x = self.sigmoid(x) + F.relu(x.mean((2, 3), keepdim=True))
        return self.classifier(torch.flatten(F.adaptive_avg_pool2d(x, (1, 1)), 1))


def _models(size: int) -> list[tuple[str, nn.Module]]:
    models: list[tuple[str, nn.Module]] = [
        ("mobilenet_v1", build_model(ModelConfig(alpha=0.25, input_size=size), seed=1)),
        ("resnet34", build_model(ModelConfig(name="resnet34", input_size=size), seed=1)),
        ("every_construct", EveryConstruct()),
    ]
    for name in ("resnet18", "mobilenet_v2", "mobilenet_v3_small", "efficientnet_b0"):
        torch.manual_seed(1)
        models.append((name, getattr(torchvision.models, name)(num_classes=10)))
    return models


def _no_randomness(model: nn.Module) -> nn.Module:
    """Dropout and stochastic depth off: the two steps draw their masks differently."""
    for module in model.modules():
        if isinstance(module, nn.Dropout) or type(module).__name__ == "StochasticDepth":
            module.p = 0.0  # type: ignore[assignment]
    return model


@pytest.mark.parametrize("index", range(7), ids=[n for n, _ in _models(32)])
@pytest.mark.numeric
def test_the_fast_step_of_each_model_equals_its_plain_step_in_float64(index, claim):
    _, model = _models(32)[index]
    model = _no_randomness(model).double()
    plain, fast = TrainingStep(model), ChannelMajorStep(model)
    assert [n for n, _ in plain.named_parameters()] == [n for n, _ in fast.named_parameters()]
    assert plain.stat_names == fast.stat_names
    x = torch.randn(3, 3, 32, 32, dtype=torch.float64)
    y = torch.tensor([1, 2, 3])
    state = model.state_dict()
    stats = [torch.rand(state[n].shape, dtype=torch.float64) + 0.5 for n in plain.stat_names]
    a, b = plain(x, y, *stats), fast(x, y, *stats)
    assert fast.fallbacks == []
    claim.close("loss and statistics", torch.cat([u.detach().flatten() for u in b]),
                torch.cat([v.detach().flatten() for v in a]), **F64)  # fmt: skip
    a[0].backward()
    b[0].backward()
    # relative to the largest gradient: a BatchNorm bias before another BatchNorm has a true
    # gradient of 0, and both compute rounding noise for it
    expected = torch.cat([p.grad.flatten() for _, p in plain.named_parameters()])
    fast_params = dict(fast.named_parameters())
    got = torch.cat([fast_params[n].grad.flatten() for n, _ in plain.named_parameters()])
    claim.close("gradients", got, expected, rtol=0, atol=1e-9 * float(expected.abs().max()))


def test_an_op_without_a_fast_form_runs_as_the_model_computes_it_and_is_named():
    class Odd(nn.Module):
        def __init__(self) -> None:
            super().__init__()
            self.conv = nn.Conv2d(3, 4, 3, padding=1, padding_mode="reflect")
            self.bn = nn.BatchNorm2d(4)
            self.pool = nn.AvgPool2d(2)
            self.fc = nn.Linear(4 * 4 * 4, 10)

        def forward(self, x: torch.Tensor) -> torch.Tensor:
            return self.fc(torch.flatten(self.pool(torch.tanh(self.bn(self.conv(x)))), 1))

    model = Odd().double()
    plain, fast = TrainingStep(model), ChannelMajorStep(model)
    x, y = torch.randn(2, 3, 8, 8, dtype=torch.float64), torch.tensor([0, 1])
    stats = [torch.zeros(4, dtype=torch.float64), torch.ones(4, dtype=torch.float64)]
    torch.testing.assert_close(fast(x, y, *stats)[0], plain(x, y, *stats)[0])
    assert [(f.path, f.op) for f in fast.fallbacks] == [("conv", "module"), ("tanh", "tanh"), ("pool", "module")]
    assert "reflect" in fast.fallbacks[0].why


@pytest.mark.slow
@pytest.mark.export
@pytest.mark.numeric
def test_the_lowered_program_of_every_construct_trains_as_eager_at_every_batch_size(tmp_path, claim):
    """Through ExecuTorch's runtime (the TrainingModule a device calls), at batch 2, the largest
    batch and one between, in that order: no size is fixed at the traced one (an ``F.pad`` in
    the graph once fixed it silently). Each gradient within 3x eager float32's distance from
    float64, plus 1e-4 of the tensor's largest."""
    from executorch.extension.pybindings.portable_lib import _load_for_executorch
    from executorch.extension.training import TrainingModule

    from fedper.export.executorch_lowering import lower_training_program

    torch.manual_seed(4)
    model = _no_randomness(EveryConstruct())
    step = ChannelMajorStep(model)
    lowered = lower_training_program(step, input_size=16, max_batch=12)
    (tmp_path / "every.pte").write_bytes(lowered.program)
    (tmp_path / "every.ptd").write_bytes(lowered.weights)
    module = TrainingModule(_load_for_executorch(str(tmp_path / "every.pte"), data_path=str(tmp_path / "every.ptd")))
    state = model.state_dict()
    stats = [torch.rand(state[n].shape) + 0.5 for n in step.stat_names]
    for batch in (2, 12, 7):
        x, y = torch.randn(batch, 3, 16, 16), torch.randint(0, 10, (batch,))
        outputs = module.forward_backward("forward", (x, y, *stats))
        gradients = module.named_gradients()
        eager, exact = TrainingStep(model), TrainingStep(model).double()
        eager_outputs = eager(x, y, *stats)
        eager_outputs[0].backward()
        exact(x.double(), y, *[s.double() for s in stats])[0].backward()
        claim.below(f"batch {batch}: relative |program - eager| loss", abs(float(outputs[0] / eager_outputs[0]) - 1),
                    1e-5)  # fmt: skip
        claim.close(f"batch {batch}: running statistics", torch.cat([o.flatten() for o in outputs[1:]]),
                    torch.cat([o.detach().flatten() for o in eager_outputs[1:]]), rtol=1e-4, atol=1e-5)  # fmt: skip
        eager_params = dict(eager.named_parameters())
        for name, p in exact.named_parameters():
            assert p.grad is not None
            scale = float(p.grad.abs().max()) or 1.0
            program_error = float((gradients[name].double() - p.grad).abs().max()) / scale
            grad = eager_params[name].grad
            assert grad is not None
            eager_error = float((grad.double() - p.grad).abs().max()) / scale
            claim.below(
                f"batch {batch}: {name} gradient error beyond 3x eager's", program_error - 3 * eager_error, 1e-4
            )


def test_a_program_that_needs_an_op_executorch_lacks_is_refused_before_it_is_lowered():
    """The stock program of ``F.silu`` (a function: the stock program rewrites only ``nn.SiLU``
    modules) differentiates it with autograd, whose backward allocates with ``aten::empty_permuted``: ExecuTorch 1.5.1 has no kernel for it, so no device could load the
    program. Refused after tracing, before the delegation and emission (most of the minutes),
    saying what to do; the fast graph of the same model has its own SiLU backward."""
    from fedper.export.executorch_lowering import MissingKernelError, lower_training_program

    class Net(nn.Module):
        def __init__(self) -> None:
            super().__init__()
            self.conv, self.bn, self.act, self.fc = (
                nn.Conv2d(3, 4, 3, padding=1),
                nn.BatchNorm2d(4),
                nn.SiLU(),
                nn.Linear(4, 10),
            )

        def forward(self, x: torch.Tensor) -> torch.Tensor:
            return self.fc(torch.flatten(F.adaptive_avg_pool2d(F.silu(self.bn(self.conv(x))), 1), 1))

    with pytest.raises(MissingKernelError, match=r"no \(right\) kernel for aten::empty_permuted.*--variant fast"):
        lower_training_program(TrainingStep(Net()), input_size=8, max_batch=4, xnnpack=False)
    step = ChannelMajorStep(Net())
    assert step.fallbacks_at(8) == []
    assert "bug" in step.kernel_hint()
    odd = ChannelMajorStep(nn.Sequential(nn.Conv2d(3, 4, 3, padding=1, padding_mode="reflect"), nn.Flatten(),
                                         nn.Linear(4 * 8 * 8, 10)))  # fmt: skip
    assert [f.path for f in odd.fallbacks_at(8)] == ["0"]
    assert "0 (module: padding_mode='reflect'" in odd.kernel_hint()


@pytest.mark.export
@pytest.mark.numeric
def test_max_pooling_trains_right_in_the_fast_program_and_the_stock_one_is_refused(tmp_path, claim):
    """ExecuTorch 1.5.1's ``max_pool2d_with_indices_backward`` kernel gave gradients 100-2000x
    off (measured: a 3x3 stride-2 pool after a convolution, batches 2 and 5). The fast graph
    pools with the maximum of strided reads instead (the module and the function); the stock
    program, which rewrites the module but would use the kernel for the function, is refused."""
    from executorch.extension.pybindings.portable_lib import _load_for_executorch
    from executorch.extension.training import TrainingModule

    from fedper.export.executorch_lowering import MissingKernelError, lower_training_program

    class Pooled(nn.Module):
        def __init__(self) -> None:
            super().__init__()
            self.stem = nn.Sequential(nn.Conv2d(3, 4, 3, 1, 1, bias=False), nn.BatchNorm2d(4), nn.ReLU())
            self.pool, self.conv, self.fc = nn.MaxPool2d(3, 2, 1), nn.Conv2d(4, 4, 1), nn.Linear(4, 10)

        def forward(self, x: torch.Tensor) -> torch.Tensor:
            x = self.conv(F.max_pool2d(self.pool(self.stem(x)), 2, 1))  # the stock program rewrites only the module
            return self.fc(torch.flatten(F.adaptive_avg_pool2d(x, 1), 1))

    torch.manual_seed(0)
    model = Pooled()
    with pytest.raises(MissingKernelError, match="max_pool2d_with_indices_backward"):
        lower_training_program(TrainingStep(model), input_size=8, max_batch=8, xnnpack=False)
    lowered = lower_training_program(ChannelMajorStep(model), input_size=8, max_batch=8)
    (tmp_path / "p.pte").write_bytes(lowered.program)
    (tmp_path / "p.ptd").write_bytes(lowered.weights)
    module = TrainingModule(_load_for_executorch(str(tmp_path / "p.pte"), data_path=str(tmp_path / "p.ptd")))
    stats = [torch.zeros(4), torch.ones(4)]
    for batch in (2, 5):
        x, y = torch.randn(batch, 3, 8, 8), torch.randint(0, 10, (batch,))
        module.forward_backward("forward", (x, y, *stats))
        gradients = module.named_gradients()
        eager = TrainingStep(model)
        eager(x, y, *stats)[0].backward()
        for name, p in eager.named_parameters():
            assert p.grad is not None
            claim.below(f"batch {batch}: {name} gradient, relative to its largest",
                        float((gradients[name] - p.grad).abs().max() / p.grad.abs().max()), 1e-4)  # fmt: skip


def test_dropout_draws_a_mask_from_rand_in_place_or_not_on_either_layout():
    """In-place dropout after the pooled features (plain [B, C]) and on channel-major maps draws
    its mask with ``rand`` (ExecuTorch has no ``bernoulli_``, and ``rand_like`` needs
    ``empty_permuted``): every value dropped or scaled by 1/(1-p), about p dropped."""
    model = nn.Sequential(nn.Conv2d(3, 64, 1), nn.Dropout(0.5), nn.AdaptiveAvgPool2d(1), nn.Flatten(),
                          nn.Dropout(0.5, inplace=True), nn.Linear(64, 10))  # fmt: skip
    step = ChannelMajorStep(model)
    assert step.fallbacks_at(8) == []
    from fedper.export.random_masks import dropout

    x = torch.ones(64, 4, 8, 8)
    dropped = dropout(x, 0.25)
    assert set(dropped.unique().tolist()) == {0.0, float(torch.tensor(4.0 / 3.0))}
    assert 0.2 < float((dropped == 0).float().mean()) < 0.3


@pytest.mark.parametrize("mode", ["row", "batch"])
def test_stochastic_depth_drops_whole_examples_or_the_whole_batch_on_either_layout(mode):
    from torchvision.ops import StochasticDepth

    from fedper.export.random_masks import stochastic_depth

    torch.manual_seed(0)
    for batch_dim in (0, 1):  # [B, C, H, W] (the stock program's rewrite) and channel-major
        shape = [5, 5, 3, 3]
        shape[batch_dim] = 200
        kept = stochastic_depth(torch.ones(shape), 0.5, mode, batch_dim).movedim(batch_dim, 0).flatten(1)
        assert set(kept.unique().tolist()) <= {0.0, 2.0}
        per_example = kept[:, 0]
        assert torch.equal(kept, per_example[:, None].expand_as(kept))  # whole examples
        if mode == "batch":
            assert per_example.unique().numel() == 1
        else:
            assert 0.35 < float((per_example == 0).float().mean()) < 0.65
    # The fast graph translates torchvision's module in either mode: no fallback.
    model = nn.Sequential(nn.Conv2d(3, 4, 1), StochasticDepth(0.2, mode), nn.AdaptiveAvgPool2d(1), nn.Flatten(),
                          nn.Linear(4, 10))  # fmt: skip
    assert ChannelMajorStep(model).fallbacks_at(8) == []
    with pytest.raises(ValueError, match="mode must be 'row' or 'batch'"):
        stochastic_depth(torch.ones(2, 2), 0.5, "column", 0)
