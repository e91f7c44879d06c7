"""ExecuTorch's lowering passes skipped on a graph they would not change.

``to_edge`` and ``to_executorch`` run a list of passes over the whole program; each one based on
``ExportPass`` re-traces every node on fake tensors (the training graph has ~4,400, and in
``to_executorch`` every delegate's original program runs again under each re-trace) even when it
rewrites none of them. Three of them never change the training graph: ``NormalizeTransposePass``
(``aten.t`` only, which the view-copy pass before it has already replaced),
``ReplaceBrokenOpsWithFunctionalOpsPass`` (view ops, likewise) and
``LegalizePortableDimOrderPass`` (a few reductions and pools on a tensor that is not in contiguous
dim order; every tensor of the step is contiguous). Together they were 31 s of a 209 s export
(docs/PERFORMANCE.md). Each is skipped only when the graph holds nothing it rewrites, so the
program's bytes are the same (``tests/unit/export/test_export_shortcuts.py``, ``bench.export_time``).
Likewise ``SpecPropPass``'s own re-trace, where every node already carries its value
(:func:`spec_propagation_without_retrace`).
"""

from __future__ import annotations

import contextlib
import operator
from collections.abc import Callable, Iterator
from typing import Any

import torch


def _nodes(graph_module: torch.fx.GraphModule) -> Iterator[torch.fx.Node]:
    for module in graph_module.modules():
        if isinstance(module, torch.fx.GraphModule):
            yield from module.graph.nodes


def has_plain_transpose(graph_module: torch.fx.GraphModule) -> bool:
    """What ``NormalizeTransposePass`` rewrites: ``aten.t`` into ``aten.t_copy``."""
    return any(node.target == torch.ops.aten.t.default for node in _nodes(graph_module))


def has_view_op(graph_module: torch.fx.GraphModule) -> bool:
    """What ``ReplaceBrokenOpsWithFunctionalOpsPass`` rewrites: an op that is a view, into its copy."""
    return any(node.op == "call_function" and getattr(node.target, "is_view", False) for node in _nodes(graph_module))


def has_reduction_on_permuted_layout(graph_module: torch.fx.GraphModule) -> bool:
    """What ``LegalizePortableDimOrderPass`` rewrites: one of its ops whose first input is not in
    contiguous dim order (or whose layout is unknown here: then the pass runs)."""
    from executorch.exir.passes.legalize_portable_dim_order_pass import LegalizePortableDimOrderPass

    targets = LegalizePortableDimOrderPass._target_ops
    for node in _nodes(graph_module):
        if node.op != "call_function" or node.target not in targets:
            continue
        first = node.args[0] if node.args else None
        value = first.meta.get("val") if isinstance(first, torch.fx.Node) else first
        if not in_contiguous_dim_order(value):
            return True
    return False


def in_contiguous_dim_order(value: object) -> bool:
    """A tensor whose dim order is the default one (not e.g. channels-last); False for anything
    else, so that a caller runs the pass it would skip."""
    return isinstance(value, torch.Tensor) and tuple(int(d) for d in value.dim_order()) == tuple(range(value.dim()))


def _passes() -> dict[type[Any], Callable[[torch.fx.GraphModule], bool]]:
    from executorch.exir.passes.legalize_portable_dim_order_pass import LegalizePortableDimOrderPass
    from executorch.exir.passes.normalize_transpose_pass import NormalizeTransposePass
    from executorch.exir.passes.replace_broken_ops_with_function_ops_pass import (
        ReplaceBrokenOpsWithFunctionalOpsPass,
    )

    return {
        NormalizeTransposePass: has_plain_transpose,
        ReplaceBrokenOpsWithFunctionalOpsPass: has_view_op,
        LegalizePortableDimOrderPass: has_reduction_on_permuted_layout,
    }


@contextlib.contextmanager
def unchanging_passes_skipped() -> Iterator[None]:
    """While open, each pass of :func:`_passes` runs only on a graph holding something it rewrites."""
    from torch.fx.passes.infra.pass_base import PassResult

    own = {}  # a class's own ``call``, or None where it inherits ``ExportPass.call``
    for cls, rewrites_something in _passes().items():
        own[cls] = cls.__dict__.get("call")
        original = cls.call

        def call(self: Any, graph_module: torch.fx.GraphModule, original: Any = original,
                 rewrites_something: Any = rewrites_something) -> PassResult:  # fmt: skip
            if not rewrites_something(graph_module):
                return PassResult(graph_module, False)
            return original(self, graph_module)

        cls.call = call
    try:
        yield
    finally:
        for cls, method in own.items():
            if method is None:
                del cls.call
            else:
                cls.call = method


def has_current_values(graph_module: torch.fx.GraphModule) -> bool:
    """Whether every placeholder and op of ``graph_module`` already carries its value's metadata
    (``meta["val"]``), which ``SpecPropPass`` would otherwise re-trace the graph to make."""
    return all(
        "val" in node.meta
        for node in _nodes(graph_module)
        if node.op == "placeholder" or (node.op == "call_function" and node.target is not operator.getitem)
    )


@contextlib.contextmanager
def spec_propagation_without_retrace() -> Iterator[None]:
    """While open, ``to_executorch``'s ``SpecPropPass`` makes the tensor specs from the values
    the graph carries instead of first re-tracing it on fake tensors, where every node carries
    one (:func:`has_current_values`). The re-trace runs every delegate's original program again
    (~2,000 of them for EfficientNet-B0 at 224 px: a sixth of its export) to recompute values the
    edge dialect's passes and the delegation have already set. The program's bytes are the same
    (``tests/unit/export/test_export_shortcuts.py``, ``bench.export_time``)."""
    from executorch.exir.passes import spec_prop_pass
    from torch.fx.passes.infra.pass_base import PassResult

    retrace = spec_prop_pass.ExportPass

    class RetraceWhereNeeded:
        def __call__(self, graph_module: torch.fx.GraphModule) -> PassResult | None:
            if has_current_values(graph_module):
                # A new module over the same graph, as the re-trace returns one: to_executorch
                # moves the result's submodules (the delegates) into the program's own module.
                module = torch.fx.GraphModule(graph_module, graph_module.graph)
                module.meta.update(graph_module.meta)
                return PassResult(module, False)
            return retrace()(graph_module)

    spec_prop_pass.ExportPass = RetraceWhereNeeded
    try:
        yield
    finally:
        spec_prop_pass.ExportPass = retrace
