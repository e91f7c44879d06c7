"""The fast training graph of any CNN: the model's own computation (its ``torch.fx`` graph)
re-run on channel-major activations with the ops of :mod:`export.fast_ops` and
:mod:`export.fast_convolution`.

Activations between convolutions are ``[C, B, H, W]``: a convolution is then a matrix product
of the weights with the (im2col'd) input, and BatchNorm's per-channel reductions run along
contiguous rows. Each node of the traced graph is translated by what it is (a module by its
type, a function by its target); a value that is not channel-major (the pooled features, the
classifier's logits) runs through the model's own code unchanged, and so does any op the
translation does not know, on the activation turned back to ``[B, C, H, W]``, with a warning
that names it (:attr:`ChannelMajorStep.fallbacks`). ``forward(x, y, *running_stats) -> (loss,
*new_running_stats)``: the signature, inputs, outputs and parameter names of the plain graph.
"""

from __future__ import annotations

import copy
import operator
import time
from collections.abc import Callable
from dataclasses import dataclass, replace
from typing import Any

import torch
import torch.nn.functional as F
from torch import fx, nn

from fedper.export.batchnorm_check import check_batchnorm
from fedper.export.fast_convolution import UnsupportedConvolutionError, convolution, pad2d
from fedper.export.fast_ops import activation, batch_norm_relu, max_pool, same_odd_window
from fedper.export.random_masks import dropout, stochastic_depth
from fedper.models.split import running_stat_names

Tensor = torch.Tensor


@dataclass
class ChannelMajor:
    """An activation held as ``[C, B, H, W]`` (the model sees ``[B, C, H, W]``)."""

    t: Tensor

    def plain(self) -> Tensor:
        return self.t.permute(1, 0, 2, 3)


@dataclass(frozen=True)
class Fallback:
    """A node computed by the model's own code on ``[B, C, H, W]`` (the stock program's ops)."""

    path: str  # the module path, or the function's name
    op: str
    why: str
    seconds: float = 0.0  # in eager PyTorch, on [B, C, H, W]
    share: float = 0.0  # of the whole forward's time (ChannelMajorStep.fallbacks_at)

    def warning(self) -> str:
        cost = f", {self.share:.0%} of an eager forward" if self.share else ""
        because = f" ({self.why})" if self.why else ""
        return (f"{self.path}: {self.op} has no fast form{because}: it runs on ExecuTorch's stock kernels"
                f"{cost}")  # fmt: skip


ACTIVATION_MODULES: dict[type[nn.Module], str] = {
    nn.ReLU: "relu", nn.ReLU6: "relu6", nn.Hardswish: "hardswish", nn.Hardsigmoid: "hardsigmoid",
    nn.SiLU: "silu", nn.Sigmoid: "sigmoid",
}  # fmt: skip
ACTIVATION_FUNCTIONS: dict[Any, str] = {
    F.relu: "relu", torch.relu: "relu", F.relu6: "relu6", F.hardswish: "hardswish",
    F.hardsigmoid: "hardsigmoid", F.silu: "silu", torch.sigmoid: "sigmoid", F.sigmoid: "sigmoid",
    "relu": "relu", "sigmoid": "sigmoid",
}  # fmt: skip
ELEMENTWISE: dict[Any, Callable[..., Tensor]] = {
    operator.add: torch.add, operator.iadd: torch.add, torch.add: torch.add, "add": torch.add, "add_": torch.add,
    operator.mul: torch.mul, operator.imul: torch.mul, torch.mul: torch.mul, "mul": torch.mul, "mul_": torch.mul,
    operator.sub: torch.sub, torch.sub: torch.sub,
}  # fmt: skip


def _activation_kind(module: nn.Module) -> str | None:
    if isinstance(module, nn.GELU):
        return "gelu" if module.approximate == "none" else "gelu_tanh"
    return ACTIVATION_MODULES.get(type(module))


class _Tracer(fx.Tracer):
    """torch's modules are leaves (as fx's default), and so is torchvision's stochastic depth."""

    def is_leaf_module(self, m: nn.Module, module_qualified_name: str) -> bool:
        if type(m).__name__ == "StochasticDepth":
            return True
        return super().is_leaf_module(m, module_qualified_name)


def trace(model: nn.Module) -> fx.Graph:
    return _Tracer().trace(model)


def trace_failure(model: nn.Module) -> str | None:
    """Why ``torch.fx`` cannot trace ``model`` (the fast graph is built from its trace), or None.

    Symbolic tracing fails on Python control flow over tensor values or shapes (``if
    x.shape[-1] > 8``), which ``torch.export`` (the stock program's path) follows."""
    try:
        trace(copy.deepcopy(model))
    except Exception as e:  # any trace error means the same: no fast graph
        first = str(e).strip().splitlines()[0] if str(e).strip() else ""
        return f"{type(e).__name__}: {first}"
    return None


class ChannelMajorStep(nn.Module):
    def __init__(self, model: nn.Module):
        super().__init__()
        model = copy.deepcopy(model).train()
        self.graph = trace(model)
        for name, child in model.named_children():
            self.add_module(name, child)
        for name, param in model.named_parameters(recurse=False):
            self.register_parameter(name, param)
        for path, module in model.named_modules():
            if isinstance(module, nn.modules.batchnorm._BatchNorm):
                check_batchnorm(path, module)
        self.bn_paths = [
            str(n.target)
            for n in self.graph.nodes
            if n.op == "call_module" and isinstance(self.get_submodule(str(n.target)), nn.BatchNorm2d)
        ]
        if len(set(self.bn_paths)) != len(self.bn_paths):
            raise ValueError("a BatchNorm layer is called more than once: its running statistics are ambiguous")
        self.fallbacks: list[Fallback] = []
        self._loss = nn.CrossEntropyLoss()

    @property
    def stat_names(self) -> list[str]:
        return running_stat_names(self.bn_paths)

    def kernel_hint(self) -> str:
        if not self.fallbacks:
            return "Every node has a fast form: a bug of the fast lowering (please report it with the model)."
        nodes = "; ".join(f"{f.path} ({f.op}{': ' + f.why if f.why else ''})" for f in self.fallbacks)
        return (f"These nodes run as the model computes them, with autograd's backward: {nodes}. Replace them with "
                "what the fast lowering translates (docs/EXPORT.md, 'The fast training graph').")  # fmt: skip

    def fallbacks_at(self, input_size: int, batch: int = 2) -> list[Fallback]:
        """What runs as the model's own code, found by one forward of zeros (before the
        minutes of lowering), each with its measured share of that forward's time."""
        x = torch.zeros(batch, 3, input_size, input_size)
        y = torch.zeros(batch, dtype=torch.long)
        stats = [torch.zeros_like(self.get_parameter(f"{n.rsplit('.', 1)[0]}.weight")) for n in self.stat_names]
        with torch.no_grad():
            start = time.perf_counter()
            self(x, y, *stats)
            total = time.perf_counter() - start
        return [replace(f, share=f.seconds / total if total > 0 else 0.0) for f in self.fallbacks]

    def forward(self, x: Tensor, y: Tensor, *stats: Tensor) -> tuple[Tensor, ...]:
        if len(stats) != 2 * len(self.bn_paths):
            raise ValueError(f"expected {2 * len(self.bn_paths)} running statistics, got {len(stats)}")
        run = _Run(self, dict(zip(self.bn_paths, zip(stats[::2], stats[1::2], strict=True), strict=True)))
        logits = run.interpret(x)
        self.fallbacks = run.fallbacks
        return (self._loss(logits, y), *[s for path in self.bn_paths for s in run.updated[path]])


class _Run:
    """One pass of the traced graph over channel-major values."""

    def __init__(self, step: ChannelMajorStep, running: dict[str, tuple[Tensor, Tensor]]) -> None:
        self.step, self.running = step, running
        self.updated: dict[str, tuple[Tensor, Tensor]] = {}
        self.fallbacks: list[Fallback] = []
        self.env: dict[fx.Node, Any] = {}
        self.fused: set[fx.Node] = set()  # activations computed with the BatchNorm before them

    def interpret(self, x: Tensor) -> Tensor:
        for node in self.step.graph.nodes:
            if node in self.fused:
                continue
            if node.op == "placeholder":
                self.env[node] = ChannelMajor(x.permute(1, 0, 2, 3).contiguous())
            elif node.op == "output":
                out = self._plain(self._load(node.args[0]))
                if not isinstance(out, Tensor):
                    raise ValueError("the model must return one tensor of logits")
                return out
            else:
                self.env[node] = self._node(node)
        raise ValueError("the traced graph has no output")

    # --- values ---------------------------------------------------------------------------

    def _load(self, arg: Any) -> Any:
        return fx.node.map_arg(arg, lambda n: self.env[n])

    @staticmethod
    def _plain(value: Any) -> Any:
        return value.plain() if isinstance(value, ChannelMajor) else value

    def _plain_args(self, node: fx.Node) -> tuple[tuple[Any, ...], dict[str, Any]]:
        args = tuple(self._deep_plain(a) for a in self._load(node.args))
        kwargs = {k: self._deep_plain(v) for k, v in self._load(node.kwargs).items()}
        return args, kwargs

    def _deep_plain(self, value: Any) -> Any:
        if isinstance(value, (list, tuple)):
            return type(value)(self._deep_plain(v) for v in value)
        return self._plain(value)

    def _channel_major(self, value: Any) -> ChannelMajor | None:
        if isinstance(value, ChannelMajor):
            return value
        if isinstance(value, Tensor) and value.dim() == 4:
            return ChannelMajor(value.permute(1, 0, 2, 3).contiguous())
        return None

    # --- nodes ----------------------------------------------------------------------------

    def _node(self, node: fx.Node) -> Any:
        if node.op == "get_attr":
            return _attribute(self.step, str(node.target))
        if node.op == "call_module":
            return self._module(node, self.step.get_submodule(str(node.target)))
        if node.op in ("call_function", "call_method"):
            return self._function(node)
        raise ValueError(f"unexpected graph node {node.op}")

    def _fallback(self, node: fx.Node, why: str) -> Any:
        """The node on plain values, as the model computes it."""
        args, kwargs = self._plain_args(node)
        start = time.perf_counter()
        if node.op == "call_module":
            result = self.step.get_submodule(str(node.target))(*args, **kwargs)
        elif node.op == "call_method":
            self_arg, *rest = args
            result = getattr(self_arg, str(node.target))(*rest, **kwargs)
        else:
            result = node.target(*args, **kwargs)  # type: ignore[operator]
        if any(isinstance(v, ChannelMajor) for v in self._load(node.args)):
            path = str(node.target) if node.op == "call_module" else node.name
            self.fallbacks.append(Fallback(path, _op_name(node), why, time.perf_counter() - start))
        # back to channel-major, so what follows stays fast
        return self._channel_major(result) or result if isinstance(result, Tensor) and result.dim() == 4 else result

    def _module(self, node: fx.Node, module: nn.Module) -> Any:
        (value,) = self._load(node.args) if not node.kwargs else (None,)
        cm = value if isinstance(value, ChannelMajor) else None
        if isinstance(module, nn.Conv2d):
            cm = self._channel_major(value)
            if cm is not None:
                try:
                    return ChannelMajor(convolution(cm.t, module))
                except UnsupportedConvolutionError as e:
                    return self._fallback(node, str(e))
        if isinstance(module, nn.BatchNorm2d):
            cm = self._channel_major(value)
            if cm is not None:
                return self._batch_norm(node, module, cm)
        kind = _activation_kind(module)
        if kind is not None and cm is not None:
            return ChannelMajor(activation(cm.t, kind))
        if isinstance(module, nn.Identity):
            return value
        if (
            isinstance(module, nn.Flatten)
            and cm is not None
            and (module.start_dim, module.end_dim) in ((1, -1), (1, 3))
        ):
            return _flatten(cm)
        if type(module) is nn.Dropout and cm is not None:
            return ChannelMajor(dropout(cm.t, module.p))
        if type(module) is nn.Dropout and isinstance(value, Tensor):
            return dropout(value, module.p)
        if isinstance(module, nn.MaxPool2d) and cm is not None:
            pooled = _max_pool(cm.t, module)
            if pooled is not None:
                return ChannelMajor(pooled)
        if isinstance(module, nn.AdaptiveAvgPool2d) and cm is not None and _is_one(module.output_size):
            return ChannelMajor(_global_mean(cm.t))
        if type(module).__name__ == "StochasticDepth" and cm is not None:
            return ChannelMajor(stochastic_depth(cm.t, float(module.p), str(module.mode), batch_dim=1))  # type: ignore[arg-type]
        if cm is None:
            return self._fallback(node, "")
        return self._fallback(node, f"no fast form of {type(module).__name__}")

    def _batch_norm(self, node: fx.Node, bn: nn.BatchNorm2d, x: ChannelMajor) -> ChannelMajor:
        if bn.weight is None or bn.bias is None or bn.running_mean is None or bn.momentum is None:
            raise ValueError(f"{node.target}: BatchNorm needs affine parameters, running statistics and a momentum")
        c, b, h, w = x.t.shape
        users = list(node.users)
        relu = False
        if len(users) == 1 and _is_relu(self.step, users[0]):
            relu = True
            self.fused.add(users[0])
        out, mean, var, _, _ = batch_norm_relu(x.t.reshape(c, b * h * w), bn.weight.clone(), bn.bias.clone(),
                                               bn.eps, relu, b)  # fmt: skip
        m = float(bn.momentum)
        running_mean, running_var = self.running[str(node.target)]
        self.updated[str(node.target)] = ((1 - m) * running_mean + m * mean.detach(),
                                          (1 - m) * running_var + m * var.detach())  # fmt: skip
        result = ChannelMajor(out.view(c, b, h, w))
        if relu:
            self.env[users[0]] = result
        return result

    def _function(self, node: fx.Node) -> Any:
        target = node.target if node.op == "call_function" else str(node.target)
        args = self._load(node.args)
        first = args[0] if args else None
        cm = first if isinstance(first, ChannelMajor) else None
        kind = ACTIVATION_FUNCTIONS.get(target) if not isinstance(target, str) or node.op == "call_method" else None
        if kind is not None and cm is not None and len(args) == 1:
            return ChannelMajor(activation(cm.t, kind))
        if target in ELEMENTWISE and len(args) == 2 and not node.kwargs:
            a, b = args
            if isinstance(a, ChannelMajor) or isinstance(b, ChannelMajor):
                ta, tb = (self._channel_major(v) or v for v in (a, b))
                if all(isinstance(v, ChannelMajor | int | float) for v in (ta, tb)):
                    ta, tb = (v.t if isinstance(v, ChannelMajor) else v for v in (ta, tb))
                    return ChannelMajor(ELEMENTWISE[target](ta, tb))
        if target in (torch.flatten, "flatten") and cm is not None and _flatten_from_one(args, node.kwargs):
            return _flatten(cm)
        if target is F.dropout and (cm is not None or isinstance(first, Tensor)):
            p, training = _dropout_arguments(args, node.kwargs)
            if not training:
                return first
            if cm is not None:
                return ChannelMajor(dropout(cm.t, p))
            assert isinstance(first, Tensor)
            return dropout(first, p)
        if target in (F.max_pool2d, torch.max_pool2d) and cm is not None:
            pooled = _max_pool(cm.t, nn.MaxPool2d(*args[1:], **dict(node.kwargs)))  # type: ignore[arg-type]
            if pooled is not None:
                return ChannelMajor(pooled)
        if target in (F.adaptive_avg_pool2d,) and cm is not None and _is_one(args[1] if len(args) > 1 else None):
            return ChannelMajor(_global_mean(cm.t))
        if target == "mean" and cm is not None and _spatial_mean(args, node.kwargs):
            return ChannelMajor(_global_mean(cm.t))
        if target == "size" and cm is not None:
            return cm.plain().size(*args[1:])
        if target == getattr and cm is not None and args[1] == "shape":
            return cm.plain().shape
        return self._fallback(node, "" if cm is None else f"no fast form of {_op_name(node)}")


def _attribute(root: nn.Module, dotted: str) -> Any:
    value: Any = root
    for part in dotted.split("."):
        value = getattr(value, part)
    return value


def _op_name(node: fx.Node) -> str:
    if node.op == "call_module":
        return "module"
    return getattr(node.target, "__name__", str(node.target))


def _is_relu(step: nn.Module, node: fx.Node) -> bool:
    if node.op == "call_module":
        return isinstance(step.get_submodule(str(node.target)), nn.ReLU)
    return (
        node.op in ("call_function", "call_method")
        and node.target in (F.relu, torch.relu, "relu")
        and (len(node.args) == 1)
    )


def _is_one(size: Any) -> bool:
    return size == 1 or size == (1, 1) or size == [1, 1]


def _flatten_from_one(args: tuple[Any, ...], kwargs: dict[str, Any]) -> bool:
    start = args[1] if len(args) > 1 else kwargs.get("start_dim", 0)
    end = args[2] if len(args) > 2 else kwargs.get("end_dim", -1)
    return start == 1 and end in (-1, 3)


def _spatial_mean(args: tuple[Any, ...], kwargs: dict[str, Any]) -> bool:
    dims = args[1] if len(args) > 1 else kwargs.get("dim")
    keep = args[2] if len(args) > 2 else kwargs.get("keepdim", False)
    return keep is True and isinstance(dims, (list, tuple)) and sorted(d % 4 for d in dims) == [2, 3]


def _flatten(cm: ChannelMajor) -> Tensor:
    """``torch.flatten(x, 1)`` of the model's ``[B, C, H, W]``: ``[B, C*H*W]``, (c, h, w) order."""
    c, b, h, w = cm.t.shape
    return cm.t.view(c, b).t() if h == w == 1 else cm.plain().reshape(b, c * h * w)


def _global_mean(t: Tensor) -> Tensor:
    """[C, B, H, W] -> [C, B, 1, 1], the mean over each image's positions."""
    c, b, h, w = t.shape
    return t.view(c, b, h * w).mean(dim=2).view(c, b, 1, 1)


def _dropout_arguments(args: tuple[Any, ...], kwargs: dict[str, Any]) -> tuple[float, bool]:
    p = args[1] if len(args) > 1 else kwargs.get("p", 0.5)
    training = args[2] if len(args) > 2 else kwargs.get("training", True)
    return float(p), bool(training)


def _max_pool(t: Tensor, pool: nn.MaxPool2d) -> Tensor | None:
    """Max pooling as the maximum of the window's strided reads (-inf padding): an odd window
    padded to keep the size, at stride 1 or 2, with :func:`export.fast_ops.max_pool`'s
    hand-written backward; any other with autograd's. Not ExecuTorch's
    ``max_pool2d_with_indices``: its backward kernel gave gradients off by orders of magnitude
    in the lowered program (1.5.1, measured here). None for ceil mode or returned indices (the
    model's own op computes those)."""
    if pool.return_indices or pool.ceil_mode:
        return None
    (kh, kw), (sh, sw), (ph, pw), (dh, dw) = (_pair(v) for v in (pool.kernel_size, pool.stride, pool.padding,
                                                                  pool.dilation))  # fmt: skip
    h, w = t.shape[2:]
    if same_odd_window((kh, kw), (ph, pw), (dh, dw), (sh, sw)) and (sh == 1 or (sh == 2 and h % 2 == 0 and w % 2 == 0)):
        return max_pool(t, kh, sh)[0]
    ho, wo = (h + 2 * ph - dh * (kh - 1) - 1) // sh + 1, (w + 2 * pw - dw * (kw - 1) - 1) // sw + 1
    padded = pad2d(t, ph, pw, float("-inf"))
    out: Tensor | None = None
    for i in range(kh):
        for j in range(kw):
            read = padded[:, :, i * dh : i * dh + sh * (ho - 1) + 1 : sh, j * dw : j * dw + sw * (wo - 1) + 1 : sw]
            out = read if out is None else torch.maximum(out, read)
    return out


def _pair(value: Any) -> tuple[int, int]:
    return (int(value), int(value)) if isinstance(value, int) else (int(value[0]), int(value[1]))
