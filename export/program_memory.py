"""How much memory a training program plans, against what any training step must hold.

``planned_memory`` reads what the runtime's ``MethodMeta`` reports as planned buffers (the
program's ``non_const_buffer_sizes``) through ExecuTorch's own flatbuffer reader, and the
program's liveness peak: the most bytes its planned tensors hold at one instruction, which no
memory planner can go below for that instruction order. ``step_lower_bound`` measures, in
eager PyTorch, what any execution of the same step must hold at once: the parameters, their
gradients, the tensors saved for the backward pass and the largest other tensor.
"""

from __future__ import annotations

from collections import defaultdict
from dataclasses import dataclass
from typing import Any

import torch
from torch import nn
from torch.utils._python_dispatch import TorchDispatchMode
from torch.utils._pytree import tree_flatten


@dataclass(frozen=True)
class PlannedMemory:
    buffers: tuple[int, ...]  # bytes of each planned buffer (MethodMeta's memory_planned_buffer_size)
    liveness_peak: int  # the most bytes of planned tensors alive at one instruction

    @property
    def total(self) -> int:
        return sum(self.buffers)


def planned_memory(program: bytes, method: str = "forward") -> PlannedMemory:
    """The planned buffers of ``method`` in a ``.pte`` and its liveness peak.

    A tensor is alive from the first instruction (or input) that names it to the last (or the
    output); tensors at the same offset with overlapping lives are views of one allocation and
    count once.
    """
    from executorch.exir import schema
    from executorch.exir._serialize._program import deserialize_pte_binary
    from executorch.exir.tensor import get_scalar_type, num_bytes_from_shape_and_dtype

    deserialized = deserialize_pte_binary(program)
    plan = next(p for p in getattr(deserialized, "program", deserialized).execution_plan if p.name == method)
    region: dict[int, tuple[int, int, int]] = {}  # value -> (memory id, offset, bytes)
    for index, value in enumerate(plan.values):
        tensor = value.val
        if isinstance(tensor, schema.Tensor) and tensor.allocation_info is not None:
            info = tensor.allocation_info
            offset = info.memory_offset_low + (info.memory_offset_high << 32)
            size = num_bytes_from_shape_and_dtype(torch.Size(tensor.sizes), get_scalar_type(tensor.scalar_type))
            region[index] = (info.memory_id, offset, size)
    lists = {i: v.val.items for i, v in enumerate(plan.values) if isinstance(v.val, schema.TensorList)}
    first: dict[int, int] = {}
    last: dict[int, int] = {}

    def touch(index: int, at: int) -> None:
        for i in (index, *lists.get(index, ())):
            if i in region:
                first.setdefault(i, at)
                last[i] = at

    instructions = plan.chains[0].instructions
    for index in plan.inputs:
        touch(index, -1)
    for at, instruction in enumerate(instructions):
        args = instruction.instr_args
        for index in getattr(args, "args", None) or [getattr(args, f) for f in ("move_from", "move_to", "value_index")
                                                       if hasattr(args, f)]:  # fmt: skip
            touch(index, at)
    for index in plan.outputs:
        touch(index, len(instructions))
    starts, ends = defaultdict(list), defaultdict(list)
    for index in first:
        starts[first[index]].append(index)
        ends[last[index]].append(index)
    alive: dict[int, tuple[int, int, int]] = {}
    peak = 0
    for at in range(-1, len(instructions) + 1):
        for index in starts.get(at, ()):
            alive[index] = region[index]
        allocations: dict[tuple[int, int], int] = {}
        for memory_id, offset, size in alive.values():
            allocations[(memory_id, offset)] = max(allocations.get((memory_id, offset), 0), size)
        peak = max(peak, sum(allocations.values()))
        for index in ends.get(at, ()):
            alive.pop(index, None)
    return PlannedMemory(buffers=tuple(plan.non_const_buffer_sizes[1:]), liveness_peak=peak)


@dataclass(frozen=True)
class LowerBound:
    parameters: int  # bytes of the trainable parameters
    gradients: int  # the same again: one gradient per parameter
    saved: int  # tensors saved for the backward pass (the input batch included), each storage once
    largest_transient: int  # the largest tensor made during the step that is none of the above

    @property
    def total(self) -> int:
        return self.parameters + self.gradients + self.saved + self.largest_transient


class _Outputs(TorchDispatchMode):
    """Every tensor an op returns: (storage address, storage bytes)."""

    def __init__(self) -> None:
        super().__init__()  # type: ignore[no-untyped-call]
        self.seen: list[tuple[int, int]] = []

    def __torch_dispatch__(self, func: Any, types: Any, args: Any = (), kwargs: Any = None) -> Any:
        out = func(*args, **(kwargs or {}))
        for t in tree_flatten(out)[0]:
            if isinstance(t, torch.Tensor):
                storage = t.untyped_storage()
                self.seen.append((storage.data_ptr(), storage.nbytes()))
        return out


def step_lower_bound(step: nn.Module, inputs: tuple[torch.Tensor, ...]) -> LowerBound:
    """Run ``step`` (the training graph: loss first) forward and backward in eager PyTorch and
    account for what it must hold at once (:class:`LowerBound`)."""
    saved: dict[int, int] = {}

    def pack(t: torch.Tensor) -> torch.Tensor:
        storage = t.untyped_storage()
        saved[storage.data_ptr()] = storage.nbytes()
        return t

    params = [p for p in step.parameters() if p.requires_grad]
    param_storages = {p.untyped_storage().data_ptr() for p in params}
    outputs = _Outputs()
    with outputs:
        with torch.autograd.graph.saved_tensors_hooks(pack, lambda t: t):
            loss = step(*inputs)[0]
        loss.backward()
    for p in params:
        p.grad = None
    parameter_bytes = sum(p.numel() * p.element_size() for p in params)
    kept = {ptr for ptr in saved if ptr not in param_storages}
    transient = max((n for ptr, n in outputs.seen if ptr not in saved and ptr not in param_storages), default=0)
    return LowerBound(
        parameters=parameter_bytes,
        gradients=parameter_bytes,
        saved=sum(saved[ptr] for ptr in kept),
        largest_transient=transient,
    )
