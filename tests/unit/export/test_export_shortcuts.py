"""The export's shortcuts give the same program bytes as ExecuTorch's own code.

``delegate_to_xnnpack(fast_partitioning=True)`` runs only the XNNPACK passes that rewrite an
op a partition holds (matrix products, ``add``/``sub``/``mul``/``maximum``, ``cat``, ``permute``,
``relu``, ``clamp``, ``ceil``, ``sigmoid``), and skips the re-sort after a partition of consecutive nodes;
``unchanging_passes_skipped`` skips three of ExecuTorch's edge and ``to_executorch`` passes on a
graph holding nothing they rewrite; ``spec_propagation_without_retrace`` makes the tensor specs
from the values the graph carries; ``lookups_indexed`` answers the delegation's per-partition
lookups from an index (checked against ExecuTorch's scans). The training graph's bytes are compared by
``bench.export_time`` (minutes); here, generated graphs of the same ops, mixed with ops XNNPACK
is not given, are lowered both ways, and each skip is shown to run where it has work.
"""

from __future__ import annotations

import contextlib
import warnings

import pytest
import torch
from hypothesis import example, given, settings
from hypothesis import strategies as st

from fedper.export.executorch_lowering import PRESERVED_OPS, delegate_to_xnnpack, edge_compile_config
from fedper.export.unchanging_passes import (
    has_plain_transpose,
    has_reduction_on_permuted_layout,
    has_view_op,
    spec_propagation_without_retrace,
    unchanging_passes_skipped,
)

SIZE = 4

pytestmark = pytest.mark.export  # each test lowers programs: seconds to a minute each


def _cat(*tensors: torch.Tensor) -> torch.Tensor:
    """A concatenation, cut back to [SIZE, SIZE] (the cut is not delegated)."""
    return torch.cat(tensors).narrow(0, SIZE, SIZE)


def _column_sums(x: torch.Tensor) -> torch.Tensor:
    """A reduction and an expand (two of ``LegalizePortableDimOrderPass``'s ops), back to [SIZE, SIZE]."""
    return x.sum(0, keepdim=True).expand(SIZE, SIZE)


# (name, arity): delegated to XNNPACK (mm, linear, add, sub, mul, maximum, cat, permute, relu, clamp,
# ceil, sigmoid)
# or kept out of it (neg, exp). A cat of six takes XNNPACK's DecomposeConcatenate, relu after an
# add its FuseActivationPass, mm its ConvertToLinearPass.
OPS = {
    "mm": (2, torch.mm),
    "linear": (2, torch.nn.functional.linear),
    "add": (2, torch.add),
    "sub": (2, torch.sub),
    "mul": (2, torch.mul),
    "cat2": (2, _cat),
    "cat6": (6, _cat),
    "t": (1, torch.t),
    "relu": (1, torch.relu),
    "clamp": (1, lambda x: torch.clamp(x, 0.0, 1.0)),
    "ceil": (1, torch.ceil),
    "maximum": (2, torch.maximum),
    "sigmoid": (1, torch.sigmoid),
    "sum": (1, _column_sums),
    "neg": (1, torch.neg),
    "exp": (1, torch.exp),
}


class Generated(torch.nn.Module):
    def __init__(self, program: list[tuple[str, tuple[int, ...]]], outputs: list[int]) -> None:
        super().__init__()
        self.program, self.outputs = program, outputs

    def forward(self, a: torch.Tensor, b: torch.Tensor, c: torch.Tensor) -> tuple[torch.Tensor, ...]:
        values = [a, b, c]
        for name, args in self.program:
            values.append(OPS[name][1](*(values[i] for i in args)))
        return tuple(values[i] for i in self.outputs)


@st.composite
def programs(draw: st.DrawFn) -> Generated:
    steps = []
    for position in range(3, 3 + draw(st.integers(4, 18))):
        name = draw(st.sampled_from(sorted(OPS)))
        arity = OPS[name][0]
        steps.append((name, tuple(draw(st.integers(0, position - 1)) for _ in range(arity))))
    last = 3 + len(steps) - 1
    outputs = sorted({last, *draw(st.lists(st.integers(3, last), max_size=3))})
    return Generated(steps, outputs)


def _lowered(module: torch.nn.Module, fast: bool, inputs: tuple[torch.Tensor, ...] | None = None) -> bytes:
    from executorch.exir import to_edge

    inputs = inputs or tuple(torch.randn(SIZE, SIZE) for _ in range(3))
    config = edge_compile_config()  # as the export's
    with warnings.catch_warnings(), contextlib.ExitStack() as shortcuts:
        warnings.simplefilter("ignore")
        if fast:
            shortcuts.enter_context(unchanging_passes_skipped())
            shortcuts.enter_context(spec_propagation_without_retrace())
        edge = to_edge(torch.export.export(module, inputs, strict=False), compile_config=config)
        return bytes(delegate_to_xnnpack(edge, fast_partitioning=fast).to_executorch().buffer)


@settings(max_examples=12, deadline=None)
@given(programs())
# The passes the shortcut keeps, each on an op it rewrites: an add's relu fused into it, a cat of six.
@pytest.mark.slow
@example(Generated([("add", (0, 1)), ("relu", (3,)), ("mul", (4, 2)), ("clamp", (5,)), ("ceil", (6,))], [7]))
@example(Generated([("cat6", (0, 1, 2, 0, 1, 2)), ("t", (3,)), ("cat2", (4, 0)), ("mm", (5, 1))], [6]))
def test_the_shortcuts_give_the_same_program(module):
    assert _lowered(module, fast=True) == _lowered(module, fast=False)


def test_a_partition_with_other_ops_gets_every_xnnpack_pass(monkeypatch):
    """The pass shortcut applies to partitions of the ops it knows; anything else (a partitioner
    config that delegates e.g. ``neg``) keeps all of XNNPACK's passes."""
    from executorch.backends.xnnpack._passes import XNNPACKPassManager
    from executorch.backends.xnnpack.partition.config.generic_node_configs import NegConfig

    counts: list[int] = []
    original = XNNPACKPassManager.transform

    def counting(self: XNNPACKPassManager) -> object:
        counts.append(len(self.passes))
        return original(self)

    monkeypatch.setattr(XNNPACKPassManager, "transform", counting)
    from executorch.exir import to_edge

    module = Generated([("mm", (0, 1)), ("exp", (3,)), ("neg", (4,)), ("exp", (5,)), ("add", (6, 0))], [7])
    inputs = tuple(torch.randn(SIZE, SIZE) for _ in range(3))
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        edge = to_edge(torch.export.export(module, inputs, strict=False))
        delegate_to_xnnpack(edge)
        arithmetic_only = list(counts)
        counts.clear()
        delegate_to_xnnpack(edge, extra_configs=[NegConfig])
    assert arithmetic_only == [1]  # the mm's partition: ConvertToLinearPass; the add's: none
    assert max(counts) > 1  # the neg's partition: every pass


def test_lowerings_in_one_process_do_not_grow_the_preserved_ops():
    """ExecuTorch's ``to_edge`` extends the config's ``preserve_ops`` in place: a list shared by
    every lowering doubled each time (2^n after n lowerings, minutes per ``to_edge``)."""
    module = Generated([("mm", (0, 1)), ("add", (3, 2))], [4])
    for _ in range(3):
        _lowered(module, fast=True)
    assert list(PRESERVED_OPS) == [torch.ops.aten.linear.default]
    assert edge_compile_config().preserve_ops == [torch.ops.aten.linear.default]


class _Transposed(torch.nn.Module):
    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return x.t() + 1


class _SpatialSums(torch.nn.Module):
    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return (x * 2).sum(dim=[2, 3])


def test_each_skipped_pass_runs_where_it_has_work():
    """The skips are conditions, not removals: a graph with ``aten.t`` (a view op) before the
    view-copy pass, and a reduction of a channels-last tensor, are seen as work."""
    from executorch.exir import to_edge

    x = torch.randn(SIZE, SIZE)
    aten = torch.export.export(_Transposed(), (x,), strict=False).graph_module
    assert has_plain_transpose(aten) and has_view_op(aten)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        edge = to_edge(torch.export.export(_Transposed(), (x,), strict=False)).exported_program().graph_module
    assert not has_plain_transpose(edge) and not has_view_op(edge)  # the view-copy pass replaced them

    images = torch.randn(2, 3, SIZE, SIZE)
    for layout, expected in ((torch.contiguous_format, False), (torch.channels_last, True)):
        inputs = (images.contiguous(memory_format=layout),)
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            graph = to_edge(torch.export.export(_SpatialSums(), inputs, strict=False)).exported_program().graph_module
        assert has_reduction_on_permuted_layout(graph) is expected, layout


def test_a_channels_last_reduction_is_legalized_with_the_shortcuts():
    """Where ``LegalizePortableDimOrderPass`` has work, the program is the same with the skips on."""
    inputs = (torch.randn(2, 3, SIZE, SIZE).contiguous(memory_format=torch.channels_last),)
    assert _lowered(_SpatialSums(), fast=True, inputs=inputs) == _lowered(_SpatialSums(), fast=False, inputs=inputs)


def test_the_delegated_sigmoid_is_within_a_few_epsilons_of_the_exact_value():
    """``sigmoid`` is the one delegated op that is not exact: XNNPACK's approximation measured
    2.1 float32 epsilons (relative) off the float64 value at worst over [-30, 30] (ExecuTorch's
    own kernel: 1.2); 4 leaves room for XNNPACK's other microkernels (another ISA)."""
    from executorch.exir import to_edge
    from executorch.extension.pybindings.portable_lib import _load_for_executorch_from_buffer

    x = torch.linspace(-30, 30, 200_001)
    module = Generated([("sigmoid", (0,))], [3])
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        edge = to_edge(torch.export.export(module, (x, x, x), strict=False), compile_config=edge_compile_config())
        program = delegate_to_xnnpack(edge).to_executorch()
    assert any(d.id == "XnnpackBackend" for d in program.executorch_program.execution_plan[0].delegates)
    (y,) = _load_for_executorch_from_buffer(program.buffer).forward((x, x, x))
    exact = torch.sigmoid(x.double())
    relative = ((y.double() - exact).abs() / exact).max().item() / torch.finfo(torch.float32).eps
    assert relative < 4.0, f"{relative:.2f} epsilons"


def _delegate_handles(module: torch.nn.Module, fast: bool) -> tuple[list[int], bytes]:
    """The debug handle of each delegate call, in the graph's order, and the program's bytes."""
    from executorch.exir import to_edge

    inputs = tuple(torch.randn(SIZE, SIZE) for _ in range(3))
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        edge = to_edge(torch.export.export(module, inputs, strict=False), compile_config=edge_compile_config())
        lowered = delegate_to_xnnpack(edge, fast_partitioning=fast)
        handles = [
            node.meta["debug_handle"]
            for node in lowered.exported_program().graph.nodes
            if node.op == "call_function" and "call_delegate" in str(node.target)
        ]
        return handles, bytes(lowered.to_executorch().buffer)


def test_indexed_lookups_give_the_same_delegates_handles_and_bytes(monkeypatch):
    """``lookups_indexed`` (a partition's nodes from an index, debug handles counted): with many
    partitions between ops XNNPACK is not given, and a partition that is not one run of the
    graph (a transpose used by a later matrix product: the graph is re-sorted, the index
    rebuilt), each lookup answers as ExecuTorch's scan does, and the delegates, their debug
    handles and the program are the same."""
    import fedper.export.delegation_lookups as lookups
    import fedper.export.executorch_lowering as lowering

    monkeypatch.setattr(lookups, "CHECKED", True)  # each indexed answer against ExecuTorch's scan
    reorders: list[object] = []
    original = lowering.graph_reordered
    monkeypatch.setattr(lowering, "graph_reordered", lambda graph: (reorders.append(graph), original(graph)))
    steps = [("t", (0,)), ("exp", (1,)), ("mm", (3, 2))]
    for k in range(12):
        last = 3 + len(steps) - 1
        steps += [("add", (last, k % 3)), ("exp", (last + 1,)), ("mul", (last + 2, last)), ("neg", (last + 3,))]
    module = Generated(steps, [3 + len(steps) - 1])
    fast_handles, fast_bytes = _delegate_handles(module, fast=True)
    slow_handles, slow_bytes = _delegate_handles(module, fast=False)
    assert len(fast_handles) >= 12 and reorders
    assert fast_handles == slow_handles and len(set(fast_handles)) == len(fast_handles)
    assert fast_bytes == slow_bytes


def test_the_spec_propagation_retraces_a_graph_without_values():
    """The re-trace is skipped only where every node carries its value: a graph fresh from
    ``torch.fx`` carries none, one from ``torch.export`` all."""
    from fedper.export.unchanging_passes import has_current_values

    module = Generated([("mm", (0, 1)), ("add", (3, 2))], [4])
    inputs = tuple(torch.randn(SIZE, SIZE) for _ in range(3))
    assert not has_current_values(torch.fx.symbolic_trace(module))
    assert has_current_values(torch.export.export(module, inputs, strict=False).graph_module)
