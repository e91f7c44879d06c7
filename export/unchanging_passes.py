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
"""

from __future__ import annotations

import contextlib
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
