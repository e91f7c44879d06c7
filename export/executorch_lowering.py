"""torch → ExecuTorch: the training program (joint forward+backward) and the inference program.

Both keep their weights in a separate ``.ptd`` file, keyed by the model's state
names, so a device can change weights without a new program.
"""

from __future__ import annotations

import contextlib
import logging
import time
import warnings
from collections.abc import Iterator, Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

import torch
from torch import nn
from torch.export import Dim, ExportedProgram, export
from torch.export.experimental import _export_forward_backward

if TYPE_CHECKING:
    from executorch.exir import EdgeCompileConfig, EdgeProgramManager
    from torch.fx.passes.infra.partitioner import Partition

from fedper.common.errors import FedperError
from fedper.export.delegation_lookups import graph_reordered, lookups_indexed
from fedper.export.fast_ops import DECOMPOSITIONS
from fedper.export.unchanging_passes import (
    in_contiguous_dim_order,
    spec_propagation_without_retrace,
    unchanging_passes_skipped,
)


class ExportError(FedperError, RuntimeError):
    """The export produced something that would not behave as the model does."""


class MissingKernelError(ExportError):
    """The training program would need an op the ExecuTorch runtime has no kernel for: it
    would fail to load on every device."""


# Kernels the runtime has but that compute wrong values in a training program (measured here:
# tests/unit/export/test_channel_major.py): a program using them is refused as if they were missing.
WRONG_KERNELS = {
    "aten::max_pool2d_with_indices_backward": "ExecuTorch 1.5.1's max-pooling backward leaves the positions that "
    "were no window's maximum unset (gradients 100-2000x off below the pooling): call max pooling through "
    "nn.MaxPool2d modules, not F.max_pool2d",
}
# Why a program may need a kernel the runtime lacks, and what to change.
MISSING_KERNEL_HINTS = {
    "aten::empty_permuted": "a full_like/empty_like of the batch's shape, e.g. from autograd's SiLU or GELU "
    "backward: use nn.SiLU/nn.GELU modules, or x * torch.sigmoid(x)",
    "aten::bernoulli": "an in-place random mask (F.dropout(..., inplace=True), tensor.bernoulli_(), torchvision's "
    "stochastic_depth called as a function): use nn.Dropout or torchvision.ops.StochasticDepth modules",
}


def missing_kernels(graph: torch.fx.Graph) -> list[str]:
    """The ops of an edge-dialect graph that ExecuTorch's kernel library (as linked into the
    runtime this process has, the one devices run) does not implement, or implements wrongly
    (:data:`WRONG_KERNELS`), as ``namespace::name``."""
    from executorch.exir.dialects.edge._ops import EdgeOpOverload
    from executorch.extension.pybindings import portable_lib

    registered = {name.split(".", 1)[0] for name in portable_lib._get_operator_names()}
    missing = set()
    for node in graph.nodes:
        if node.op == "call_function" and isinstance(node.target, EdgeOpOverload):
            namespace, name = node.target.__name__.split(".")[:2]
            op = f"{namespace}::{name}"
            if op not in registered:
                missing.add(f"{op} ({MISSING_KERNEL_HINTS[op]})" if op in MISSING_KERNEL_HINTS else op)
            elif op in WRONG_KERNELS:
                missing.add(f"{op} ({WRONG_KERNELS[op]})")
    return sorted(missing)


# Kept as one op: ExecuTorch's linear computes a @ b.T without copying b transposed.
PRESERVED_OPS = (torch.ops.aten.linear.default,)


def edge_compile_config() -> EdgeCompileConfig:
    """The export's edge-dialect settings, with a list of preserved ops of its own: ExecuTorch
    1.5.1 extends the list it is given in place, so a shared one doubled with every lowering
    in a process (2^n entries after n lowerings: minutes per ``to_edge`` in the test suite)."""
    from executorch.exir import EdgeCompileConfig

    return EdgeCompileConfig(_check_ir_validity=False, preserve_ops=list(PRESERVED_OPS))


@dataclass(frozen=True)
class LoweredProgram:
    program: bytes  # .pte
    weights: bytes  # .ptd


def _split_files(manager: object) -> LoweredProgram:
    tensor_data = getattr(manager, "_tensor_data", None) or {}
    if len(tensor_data) != 1:
        raise ExportError(f"expected one external weights file, got {sorted(tensor_data)}")
    (cord,) = tensor_data.values()
    return LoweredProgram(program=bytes(manager.buffer), weights=bytes(cord))  # type: ignore[attr-defined]


def use_linear_for_transposed_matmul(graph_module: torch.fx.GraphModule) -> int:
    """Rewrite ``mm(a, permute(b, [1, 0]))`` as ``linear(a, b)``; returns how many.

    ExecuTorch's ``mm`` needs both operands contiguous, so the transpose is a full copy of
    ``b`` (an activation, in a weight gradient); ``linear`` computes ``a @ b.T`` directly.
    """
    aten = torch.ops.aten
    count = 0
    for node in list(graph_module.graph.nodes):
        if node.op != "call_function" or node.target != aten.mm.default:
            continue
        a, b = node.args
        if (
            isinstance(b, torch.fx.Node)
            and b.target in (aten.permute.default, aten.t.default)
            and (b.target == aten.t.default or list(b.args[1]) == [1, 0])  # type: ignore[arg-type]
        ):
            with graph_module.graph.inserting_before(node):
                linear = graph_module.graph.call_function(aten.linear.default, (a, b.args[0]))
            linear.meta = dict(node.meta)
            node.replace_all_uses_with(linear)
            graph_module.graph.erase_node(node)
            count += 1
    graph_module.graph.eliminate_dead_code()
    graph_module.recompile()
    return count


def drop_aliases(graph_module: torch.fx.GraphModule) -> int:
    """Remove ``alias`` nodes (autograd's saved-tensor bookkeeping): in a functional graph
    they are the identity, but ExecuTorch would run each as a full copy."""
    count = 0
    for node in list(graph_module.graph.nodes):
        if node.op == "call_function" and node.target in (
            torch.ops.aten.alias.default,
            torch.ops.aten.alias_copy.default,
        ):
            node.replace_all_uses_with(node.args[0])
            graph_module.graph.erase_node(node)
            count += 1
    graph_module.recompile()
    return count


# XNNPACK's configs the training program uses beside the matrix products: arithmetic that is
# exact per element (``add``, ``sub``, ``mul``, ``maximum``) and ops that only move or select
# values (``cat``, ``permute``, ``relu``, ``clamp``, ``ceil``), so the program computes the same
# bits as on ExecuTorch's kernels, on the thread pool; and ``sigmoid`` (SiLU's and
# squeeze-and-excitation's), XNNPACK's own approximation, within 2.1 float32 epsilons of the
# exact value (ExecuTorch's kernel: 1.2; ``tests/unit/export/test_export_shortcuts.py``) and
# ~10x faster. The others (``div``, ``sqrt``, ``rsqrt``, ...) compute right gradients but made
# the step no faster (docs/PERFORMANCE.md).
XNNPACK_CONFIGS = ("AddConfig", "SubConfig", "MulConfig", "MaximumConfig", "CatConfig", "PermuteConfig",
                   "ReLUConfig", "ClampConfig", "CeilConfig", "SigmoidConfig")  # fmt: skip


def delegate_to_xnnpack(
    edge: EdgeProgramManager, extra_configs: Sequence[Any] = (), fast_partitioning: bool = True
) -> EdgeProgramManager:
    """The matrix products (``mm``, ``linear``, ``addmm``) and the ops of :data:`XNNPACK_CONFIGS`
    to XNNPACK, the weights left as the program's runtime tensors (a training step changes them):
    XNNPACK uses the CPU's vector units (AVX2/FMA, NEON) and ExecuTorch's thread pool, where the
    optimized kernel library's kernels are single-threaded (docs/PERFORMANCE.md). The stock
    runtimes (the Python wheel, the Android AAR) link the XNNPACK backend. One delegate per run
    of consecutive ops (``per_op_mode``, then :func:`merge_adjacent`): XNNPACK's own merging
    joins ops far apart, and a delegate runs where its last op is, so what its first ops make
    stays alive until then; per run, the program plans a third of the memory, steps faster and
    computes bit-identical results (docs/PERFORMANCE.md). ``extra_configs``:
    more of XNNPACK's partitioner configs (``bench/xnnpack_elementwise.py`` tries others).
    ``fast_partitioning``: with :func:`_only_the_xnnpack_passes_needed`,
    :func:`_consecutive_nodes_stay_in_place` and :func:`export.delegation_lookups.lookups_indexed`,
    which give the same bytes in a fraction of the time
    (``bench.export_time`` and ``tests/unit/export/test_export_shortcuts.py`` compare)."""
    from executorch.backends.xnnpack.partition.config import generic_node_configs
    from executorch.backends.xnnpack.partition.config.gemm_configs import AddmmConfig, LinearConfig, MMConfig
    from executorch.backends.xnnpack.partition.xnnpack_partitioner import XnnpackPartitioner

    others = [runtime_inputs_only(getattr(generic_node_configs, name)) for name in XNNPACK_CONFIGS]
    partitioner = XnnpackPartitioner(
        configs=[LinearConfig, MMConfig, AddmmConfig, *others, *extra_configs],
        per_op_mode=True,
        force_non_static_weights_for_f32_linear=True,
    )
    per_op = partitioner.generate_partitions
    partitioner.generate_partitions = lambda ep: merge_adjacent(per_op(ep), ep.graph)
    # It warns that to_backend is deprecated for to_edge_transform_and_lower, which would also
    # re-run the decompositions this pipeline does once (lower_training_program).
    logging.getLogger(XnnpackPartitioner.__module__).setLevel(logging.ERROR)
    with contextlib.ExitStack() as shortcuts:
        shortcuts.enter_context(_sorting_in_place())
        if fast_partitioning:
            shortcuts.enter_context(_only_the_xnnpack_passes_needed())
            shortcuts.enter_context(_consecutive_nodes_stay_in_place())
            shortcuts.enter_context(lookups_indexed())
        return edge.to_backend(partitioner)


def merge_adjacent(partitions: list[Partition], graph: torch.fx.Graph) -> list[Partition]:
    """Join partitions that follow one another in the graph's order into one.

    A delegate runs where its last node was: a partition of nodes far apart keeps what its
    first nodes make alive until then (XNNPACK's own merging made the program plan 2.5 times
    the memory of one partition per op). Nodes that are consecutive in the order run
    consecutively anyway, and a run of consecutive nodes cannot form a cycle with the rest of
    the graph: no other node lies between them. Partitions that are not one consecutive run
    are left as they are.
    """
    from torch.fx.passes.infra.partitioner import Partition

    position = {node: i for i, node in enumerate(graph.nodes)}
    spans = sorted(((min(position[n] for n in p.nodes), max(position[n] for n in p.nodes), p) for p in partitions),
                   key=lambda span: span[0])  # fmt: skip
    runs: list[tuple[int, int, list[torch.fx.Node]]] = []
    for first, last, partition in spans:
        nodes = list(partition.nodes)
        consecutive = last - first + 1 == len(nodes)
        if consecutive and runs and runs[-1][1] + 1 == first and runs[-1][0] >= 0:
            start, _, joined = runs[-1]
            runs[-1] = (start, last, joined + nodes)
        else:
            runs.append((first if consecutive else -1, last, nodes))
    return [Partition(id=i, nodes=nodes) for i, (_, _, nodes) in enumerate(runs)]


def runtime_inputs_only(config: type[Any]) -> type[Any]:
    """XNNPACK partitioner ``config``, refusing nodes with a parameter input: XNNPACK would bake
    the parameter into the delegate as a constant, and the program would never see its updates.
    (A subclass: the partitioner takes config classes.)"""
    from executorch.backends.xnnpack.utils.utils import is_param_node

    class RuntimeInputsOnly(config):
        def check_constraints(self, node: torch.fx.Node, ep: Any) -> bool:
            if any(is_param_node(ep, arg) for arg in node.all_input_nodes):
                return False
            return bool(super().check_constraints(node, ep))

    RuntimeInputsOnly.__name__ = f"RuntimeInputsOnly{config.__name__}"
    return RuntimeInputsOnly


@contextlib.contextmanager
def _sorting_in_place() -> Iterator[None]:
    """While partitioning, re-sort the graph in place instead of by ``legalize_graph``.

    ExecuTorch 1.5.1's ``create_submodule_from_nodes`` calls ``legalize_graph`` once per
    partition, which copies the whole ~4,400-node graph into a new one and regenerates its
    Python code: ~170 partitions made that most of the delegation's minutes. torch's
    ``stable_topological_sort`` moves the nodes that need it within the same graph (and keeps
    the original order where it can). Nothing reads the graph's Python code before
    ``to_executorch``, which emits the program from the nodes.
    """
    import executorch.exir.lowered_backend_module as lowered_backend_module
    from torch._inductor.pattern_matcher import stable_topological_sort

    def sort_in_place(graph_module: torch.fx.GraphModule) -> torch.fx.GraphModule:
        stable_topological_sort(graph_module.graph)
        graph_reordered(graph_module.graph)
        return graph_module

    original = lowered_backend_module.legalize_graph
    lowered_backend_module.legalize_graph = sort_in_place
    try:
        yield
    finally:
        lowered_backend_module.legalize_graph = original


@contextlib.contextmanager
def _consecutive_nodes_stay_in_place() -> Iterator[None]:
    """While delegating, do not re-sort the graph after a partition of consecutive nodes is
    replaced.

    A partition's call is inserted right after its last node (torch's ``insert_subgm``), so
    replacing a single node, or a run of consecutive nodes (:func:`merge_adjacent`), keeps the
    graph in order; :func:`_sorting_in_place` still sorts after any other partition. With a
    partition per op or per run (hundreds), the sorts were most of the delegation's time.
    """
    import executorch.exir.backend.backend_api as backend_api

    original = backend_api.create_submodule_from_nodes

    def create_submodule(
        gm: torch.fx.GraphModule, node_list: list[torch.fx.Node], tag: str, skip_legalize_graph: bool = False
    ) -> tuple[torch.fx.GraphModule, torch.fx.Node]:
        return original(gm, node_list, tag, skip_legalize_graph=skip_legalize_graph or _consecutive(node_list))

    backend_api.create_submodule_from_nodes = create_submodule
    try:
        yield
    finally:
        backend_api.create_submodule_from_nodes = original


def _consecutive(nodes: list[torch.fx.Node]) -> bool:
    """Whether ``nodes`` are one run of the graph's order, with no other node between them."""
    members = set(nodes)
    starts = [node for node in members if node.prev not in members]
    if len(starts) != 1:
        return False
    node = starts[0]
    for _ in range(len(members) - 1):
        node = node.next
        if node not in members:
            return False
    return True


class _NoPasses:
    """A pass manager that leaves the program as it is."""

    def __init__(self, exported_program: ExportedProgram) -> None:
        self.exported_program = exported_program

    def transform(self) -> ExportedProgram:
        return self.exported_program


# What the delegated partitions may hold for :func:`_only_the_xnnpack_passes_needed` to choose
# XNNPACK's passes, and the one pass that rewrites each (the others leave these ops alone).
_PASS_FREE_OPS = frozenset(
    {"aten.linear.default", "aten.add.Tensor", "aten.sub.Tensor", "aten.mul.Tensor", "aten.maximum.default",
     "aten.permute_copy.default", "aten.clamp.default", "aten.ceil.default", "aten.sigmoid.default"}
)  # fmt: skip
_PASS_FOR_OP = {
    "aten.mm.default": "ConvertToLinearPass",  # a matrix product from a linear layer becomes linear
    "aten.addmm.default": "ConvertToLinearPass",
    "aten.relu.default": "FuseActivationPass",  # into the add/sub/mul/linear before it
    "aten.cat.default": "DecomposeConcatenate",  # XNNPACK concatenates at most 5 tensors at once
}
# XNNPACK's own order of those passes.
_PASS_ORDER = ("ConvertToLinearPass", "FuseActivationPass", "DecomposeConcatenate")


@contextlib.contextmanager
def _only_the_xnnpack_passes_needed() -> Iterator[None]:
    """While delegating, run on each partition only those of XNNPACK's passes that rewrite an
    op it holds (:data:`_PASS_FOR_OP`), when all its ops are known (:data:`_PASS_FREE_OPS`).

    XNNPACK's preprocessing runs 17 passes on every partition (hundreds here), most of which
    re-trace it on fake tensors to rewrite ops these partitions cannot contain (upsampling,
    SDPA, BatchNorm, conv1d, PReLU, clones, dim-order copies, channels-last layouts): most of
    the delegation's time. A partition with any other op (e.g. ``bench.xnnpack_elementwise``'s
    extra ops), or any tensor not in contiguous dim order (channels-last), gets all the passes. The
    program is byte-identical (``tests/unit/export/test_export_shortcuts.py``, ``bench.export_time``).
    """
    import executorch.backends.xnnpack.xnnpack_preprocess as xnnpack_preprocess
    from executorch.backends.xnnpack import _passes
    from executorch.backends.xnnpack._passes import XNNPACKPassManager

    def pass_manager(exported_program: ExportedProgram, passes: Any = None) -> XNNPACKPassManager | _NoPasses:
        ops = {
            getattr(node.target, "__name__", str(node.target))
            for node in exported_program.graph.nodes
            if node.op == "call_function"
        }
        contiguous = all(
            in_contiguous_dim_order(node.meta.get("val"))
            for node in exported_program.graph.nodes
            if isinstance(node.meta.get("val"), torch.Tensor)
        )
        if passes is None and contiguous and ops <= _PASS_FREE_OPS | _PASS_FOR_OP.keys():
            needed = {_PASS_FOR_OP[op] for op in ops & _PASS_FOR_OP.keys()}
            if not needed:
                return _NoPasses(exported_program)
            passes = [getattr(_passes, name) for name in _PASS_ORDER if name in needed]
        return XNNPACKPassManager(exported_program, passes=passes)

    original = xnnpack_preprocess.XNNPACKPassManager
    xnnpack_preprocess.XNNPACKPassManager = pass_manager
    try:
        yield
    finally:
        xnnpack_preprocess.XNNPACKPassManager = original


def lower_training_program(
    step: nn.Module,
    input_size: int,
    max_batch: int,
    xnnpack: bool = True,
    phases: dict[str, float] | None = None,
    shortcuts: bool = True,
    refuse_missing_kernels: bool = True,
) -> LoweredProgram:
    """Export ``step`` with a dynamic batch (2..max_batch) and its weights in a .ptd; with
    ``xnnpack``, its matrix products and exact element-wise and data-moving ops delegated to XNNPACK
    (:func:`delegate_to_xnnpack`).

    The joint graph (~4,300 nodes) is decomposed while it is traced, with our decompositions
    and core ATen's together (:func:`trace_joint`), and then converted to the edge dialect
    without ``to_edge``'s own ``run_decompositions``: each extra pass re-traces the whole graph
    to change nothing (docs/PERFORMANCE.md). ``_generate_edge_program`` is the rest of
    ``to_edge``'s body in the pinned executorch 1.5.1. ``phases``, when given, receives each
    phase's seconds (where an export's minutes go: docs/PERFORMANCE.md). ``shortcuts``: the
    delegation's (``delegate_to_xnnpack(fast_partitioning=True)``) and ExecuTorch's passes skipped
    where they would change nothing (:func:`export.unchanging_passes.unchanging_passes_skipped`):
    the same bytes, faster (``bench.export_time`` compares). A program that needs a kernel the
    runtime lacks or computes wrongly (:func:`missing_kernels`) is refused after the trace
    (``refuse_missing_kernels=False``: a benchmark timing the stock program anyway).
    """
    from executorch.exir import ExecutorchBackendConfig
    from executorch.exir.program._program import (
        EdgeProgramManager,
        _default_decomposition_table,
        _generate_edge_program,
    )

    with warnings.catch_warnings(), contextlib.ExitStack() as skipping:
        warnings.simplefilter("ignore")
        logging.getLogger("torch").setLevel(logging.ERROR)
        if shortcuts:
            skipping.enter_context(unchanging_passes_skipped())
            skipping.enter_context(spec_propagation_without_retrace())
        # Every pass re-traces the graph on fake tensors, asking for convolution backends again.
        skipping.enter_context(conv_backend_without_batch_guards())
        table = {**_default_decomposition_table(), **DECOMPOSITIONS}
        for op in PRESERVED_OPS:
            table.pop(op, None)
        clock = _PhaseClock(phases if phases is not None else {})
        joint = trace_joint(step, input_size, max_batch, table)
        drop_aliases(joint.graph_module)
        use_linear_for_transposed_matmul(joint.graph_module)
        clock.lap("trace and decompose")
        config = edge_compile_config()
        edge_program = _generate_edge_program(config, joint, preserve_ops=config.preserve_ops)
        missing = missing_kernels(edge_program.graph) if refuse_missing_kernels else []
        if missing:
            from executorch import version as executorch_version

            kernel_hint = getattr(step, "kernel_hint", None)
            hint = str(kernel_hint()) if callable(kernel_hint) else ""
            raise MissingKernelError(
                f"ExecuTorch {executorch_version.__version__} has no (right) kernel for {', '.join(missing)}, "
                f"which this model's training program needs. {hint}".rstrip()
            )
        edge = EdgeProgramManager({"forward": edge_program}, None, config)
        clock.lap("edge dialect")
        if xnnpack:
            edge = delegate_to_xnnpack(edge, fast_partitioning=shortcuts)
            clock.lap("XNNPACK delegation")
        manager = edge.to_executorch(ExecutorchBackendConfig(external_constants=True, external_mutable_weights=True))
        lowered = _split_files(manager)
        clock.lap("to_executorch")
    check_planned_batch(lowered.program, max_batch)
    return lowered


def planned_batch(program: bytes) -> int:
    """The largest batch a training program's first input (the images) is planned for."""
    from executorch.exir._serialize._program import deserialize_pte_binary

    pte = deserialize_pte_binary(program)
    plans = getattr(pte, "program", pte).execution_plan
    return int(plans[0].values[plans[0].inputs[0]].val.sizes[0])


def check_planned_batch(program: bytes, max_batch: int) -> None:
    """Refuse a training program whose tensors are planned for fewer images than ``max_batch``
    (a guard on the batch size added while lowering): the runtime would refuse a device's larger
    batches with an error code."""
    planned = planned_batch(program)
    if planned != max_batch:
        raise ExportError(
            f"the training program was planned for batches of at most {planned} images, not --max-batch "
            f"{max_batch} (a guard on the batch size was added while lowering)"
        )


@contextlib.contextmanager
def conv_backend_without_batch_guards() -> Iterator[None]:
    """While lowering, choose the convolution backend of a batch-dynamic input from its example
    batch, without a guard on the batch.

    Tracing a convolution on fake tensors asks ATen which backend it would run
    (``torch._C._select_conv_backend``), only to know its output's memory format; ATen's
    heuristics compare the batch with 16 (for some 1x1 convolutions), which adds the guard
    ``batch < 16`` to the trace: the program then plans its tensors for at most 15 images and
    refuses a larger batch at run time, whatever ``--max-batch`` says. Which backend eager
    would pick does not change the program (a contiguous NCHW output either way)."""
    from torch._subclasses.fake_tensor import unset_fake_temporarily

    original = torch._C._select_conv_backend

    def select(input_: torch.Tensor, weight: torch.Tensor, *args: Any, **kwargs: Any) -> Any:
        if any(isinstance(d, torch.SymInt) for d in input_.shape):
            shape = [_hint(d) for d in input_.shape]
            if all(isinstance(d, int) for d in shape):
                with unset_fake_temporarily():
                    input_ = torch.empty(1, dtype=input_.dtype).expand(shape)
        return original(input_, weight, *args, **kwargs)

    torch._C._select_conv_backend = select
    try:
        yield
    finally:
        torch._C._select_conv_backend = original


def _hint(size: int | torch.SymInt) -> int | torch.SymInt:
    """A symbolic size's example value (the size itself where it has none)."""
    if isinstance(size, torch.SymInt) and size.node.hint is not None:
        return int(size.node.hint)
    return size


class _PhaseClock:
    """Seconds since the previous lap, recorded under each lap's name."""

    def __init__(self, into: dict[str, float]) -> None:
        self._into, self._last = into, time.perf_counter()

    def lap(self, name: str) -> None:
        now = time.perf_counter()
        self._into[name] = now - self._last
        self._last = now


def trace_joint(
    step: nn.Module, input_size: int, max_batch: int, decompositions: dict[Any, Any] | None = None
) -> ExportedProgram:
    """The step's forward + backward graph in ATen, traced with a dynamic batch (2..max_batch).

    With ``decompositions``, they are applied while the joint graph is traced (core ATen's
    table otherwise): one trace of the ~4,300-node graph instead of a second
    ``run_decompositions`` pass over it. This is ``_export_forward_backward``'s body in the
    pinned torch 2.14.1 with the table as a parameter.
    """
    x, y, *stats = example_inputs(step, input_size, 2)
    batch = Dim("batch", min=2, max=max_batch)
    # A model without BatchNorm has no statistics: no third entry for the empty *stats.
    dynamic = ({0: batch}, {0: batch}, *((tuple(None for _ in stats),) if stats else ()))
    exported = export(step, (x, y, *stats), dynamic_shapes=dynamic, strict=False)
    if decompositions is None:
        return _export_forward_backward(exported, joint_loss_index=0)
    from torch.export.experimental import _copy_graph_module_and_signature, _remove_detach_pass
    from torch.export.exported_program import _decompose_exported_program

    joint = _decompose_exported_program(
        exported, cia_to_decomp={}, python_decomp_table=decompositions, joint_loss_index=0,
        decompose_custom_triton_ops=False,
    )  # fmt: skip
    gm, signature = _copy_graph_module_and_signature(joint)
    _remove_detach_pass(gm, signature)
    return joint._update(gm, signature)


def lower_inference_program(model: nn.Module, input_size: int) -> LoweredProgram:
    """Export the eval-mode model for one image; all weights and BN statistics go to the .ptd."""
    from executorch.exir import ExecutorchBackendConfig, to_edge

    model = without_batch_counters(model).eval()
    x = torch.zeros(1, 3, input_size, input_size)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        exported = export(model, (x,), strict=False)
        manager = to_edge(exported).to_executorch(ExecutorchBackendConfig(external_constants=True))
    return _split_files(manager)


def example_inputs(step: nn.Module, input_size: int, batch: int) -> tuple[torch.Tensor, ...]:
    """Zero inputs of the training step's signature: images, labels, then each BatchNorm
    statistic (what the program is traced with, and what its memory is measured on)."""
    x = torch.zeros(batch, 3, input_size, input_size)
    y = torch.zeros(batch, dtype=torch.long)
    stats = [torch.zeros(_num_features(step, n)) for n in step.stat_names]  # type: ignore[union-attr]
    return (x, y, *stats)


def _num_features(step: nn.Module, stat_name: str) -> int:
    bn_path = stat_name.rsplit(".", 1)[0]
    weight = step.get_parameter(f"{bn_path}.weight")
    return int(weight.shape[0])


def without_batch_counters(model: nn.Module) -> nn.Module:
    """A copy without BN's integer ``num_batches_tracked`` (eval mode never reads it), so the
    weights file holds exactly the exchanged tensors."""
    import copy

    model = copy.deepcopy(model)
    for module in model.modules():
        if isinstance(module, nn.modules.batchnorm._BatchNorm):
            module.num_batches_tracked = None
    return model
