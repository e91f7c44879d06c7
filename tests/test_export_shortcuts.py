"""The export's partitioning shortcuts give the same program bytes as ExecuTorch's own code.

``delegate_to_xnnpack(fast_partitioning=True)`` skips XNNPACK passes that cannot change a
partition of matrix products and ``add``/``sub``/``mul``, and the re-sort after a one-node
partition. The training graph's bytes are compared by ``bench.export_time`` (minutes); here,
generated graphs of the same ops, mixed with ops XNNPACK is not given, are lowered both ways.
"""

from __future__ import annotations

import warnings

import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from export.executorch_lowering import PRESERVED_OPS, delegate_to_xnnpack

SIZE = 4
# (name, arity): delegated to XNNPACK (mm, linear, add, sub, mul) or kept out of it (relu, neg, exp).
OPS = {
    "mm": (2, torch.mm),
    "linear": (2, torch.nn.functional.linear),
    "add": (2, torch.add),
    "sub": (2, torch.sub),
    "mul": (2, torch.mul),
    "relu": (1, torch.relu),
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


def _lowered(module: Generated, fast: bool) -> bytes:
    from executorch.exir import EdgeCompileConfig, to_edge

    inputs = tuple(torch.randn(SIZE, SIZE) for _ in range(3))
    config = EdgeCompileConfig(_check_ir_validity=False, preserve_ops=PRESERVED_OPS)  # as the export's
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        edge = to_edge(torch.export.export(module, inputs, strict=False), compile_config=config)
        return bytes(delegate_to_xnnpack(edge, fast_partitioning=fast).to_executorch().buffer)


@settings(max_examples=8, deadline=None)
@given(programs())
def test_fast_partitioning_gives_the_same_program(module):
    assert _lowered(module, fast=True) == _lowered(module, fast=False)


def test_a_partition_with_other_ops_gets_every_xnnpack_pass(monkeypatch):
    """The pass shortcut applies to arithmetic partitions only (one per op); anything else (a
    partitioner config that delegates e.g. ``relu``) keeps all of XNNPACK's passes."""
    from executorch.backends.xnnpack._passes import XNNPACKPassManager
    from executorch.backends.xnnpack.partition.config.generic_node_configs import ReLUConfig

    counts: list[int] = []
    original = XNNPACKPassManager.transform

    def counting(self: XNNPACKPassManager) -> object:
        counts.append(len(self.passes))
        return original(self)

    monkeypatch.setattr(XNNPACKPassManager, "transform", counting)
    from executorch.exir import to_edge

    module = Generated([("mm", (0, 1)), ("add", (3, 2)), ("relu", (4,)), ("mul", (5, 5)), ("add", (6, 0))], [7])
    inputs = tuple(torch.randn(SIZE, SIZE) for _ in range(3))
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        edge = to_edge(torch.export.export(module, inputs, strict=False))
        delegate_to_xnnpack(edge)
        arithmetic_only = list(counts)
        counts.clear()
        delegate_to_xnnpack(edge, extra_configs=[ReLUConfig])
    assert arithmetic_only == [1]  # the mm's partition: ConvertToLinearPass; add, mul: none
    assert max(counts) > 1  # the relu's partition: every pass
