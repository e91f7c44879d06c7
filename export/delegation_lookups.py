"""ExecuTorch's delegation, without its whole-graph scans per partition.

For each partition, ExecuTorch 1.5.1's ``to_backend`` scans the whole program's graph three
times: for the nodes of the partition's tag (``_get_node_list_with_same_tag``), for the largest
debug handle (``generate_debug_handle``, inside ``_insert_lowered_submodule``) and, while
formatting a debug message whether or not it is logged, for the text of the graph module with
every submodule made so far (``str(tagged_graph_module)``). A training graph of ~15,000 nodes
cut into ~2,000 partitions (EfficientNet-B0 at 224 px) spends tens of seconds there. While
:func:`lookups_indexed` is open, the same answers come from an index built once per graph (and
rebuilt after the graph is re-sorted: :func:`graph_reordered`), a running count of debug handles,
and a short text for the unlogged message. The program is byte-identical, its debug handles the
same (``tests/unit/export/test_export_shortcuts.py``).
"""

from __future__ import annotations

import contextlib
import logging
import weakref
from collections.abc import Iterator
from types import SimpleNamespace
from typing import Any

import torch

# Tests set this: every indexed answer is then compared with ExecuTorch's own scan.
CHECKED = False
# graph -> {tag: its nodes in the graph's order}; dropped when the graph is re-sorted.
_TAGGED: weakref.WeakKeyDictionary[torch.fx.Graph, dict[str, list[torch.fx.Node]]] = weakref.WeakKeyDictionary()


def graph_reordered(graph: torch.fx.Graph) -> None:
    """Forget ``graph``'s index of tagged nodes (called by whatever re-sorts it while delegating)."""
    _TAGGED.pop(graph, None)


def _tag_index(graph: torch.fx.Graph) -> dict[str, list[torch.fx.Node]]:
    index = _TAGGED.get(graph)
    if index is None:
        index = {}
        for node in graph.nodes:
            tag = node.meta.get("delegation_tag", "")
            if tag:
                index.setdefault(tag, []).append(node)
        _TAGGED[graph] = index
    return index


def _nodes_with_tag(original: Any) -> Any:
    """``_get_node_list_with_same_tag`` from the index: a tag's nodes leave the graph only when
    its own partition is made, and the others keep their order unless the graph is re-sorted."""

    def nodes_with_tag(tagged_graph_module: torch.fx.GraphModule, tag: str, owning_program: Any) -> list[torch.fx.Node]:
        if not tag:
            return original(tagged_graph_module, tag, owning_program)
        graph = tagged_graph_module.graph
        nodes = [
            node
            for node in _tag_index(graph).pop(tag, [])
            if node.graph is graph and not getattr(node, "_erased", False)
        ]
        if any(node.op in ("output", "placeholder") for node in nodes):
            # ExecuTorch's own checks and errors for these.
            return original(tagged_graph_module, tag, owning_program)
        if CHECKED:
            scanned = original(tagged_graph_module, tag, owning_program)
            assert nodes == scanned, f"tag {tag}: indexed {nodes}, scanned {scanned}"
        return nodes

    return nodes_with_tag


class _LargestHandleOnly:
    """What ``generate_debug_handle`` reads of a program (its graph's nodes), answered with one
    node holding the largest debug handle; nothing else of the program is read where it is used."""

    def __init__(self, largest: int) -> None:
        node = SimpleNamespace(meta={"debug_handle": largest})
        self.graph_module = SimpleNamespace(graph=SimpleNamespace(nodes=[node]))


def _counted_debug_handles(original: Any) -> Any:
    """``_insert_lowered_submodule`` with the largest debug handle counted, not scanned for.

    Its delegate call gets the graph's largest handle + 1, and between two such calls the graph
    only gains that call (the new largest) and loses the partition's call_module node (whose
    handle, if any, is an older one's: smaller). Where
    the program is used for more (a nested submodule, constants moved out of the program's
    signature), the original runs on the real program and the count is taken again after."""
    largest: dict[int, int] = {}

    def insert(submodule_program: Any, owning_program: Any, call_submodule_node: torch.fx.Node, *rest: Any) -> Any:
        is_submodule, inputs_to_delete, outputs_to_delete = rest[2], rest[3], rest[4]
        key = id(owning_program)
        if is_submodule or inputs_to_delete or outputs_to_delete:
            largest.pop(key, None)
            return original(submodule_program, owning_program, call_submodule_node, *rest)
        if key not in largest:
            largest[key] = max((node.meta.get("debug_handle", 0) for node in owning_program.graph_module.graph.nodes),
                               default=0)  # fmt: skip
        if CHECKED:
            scanned = max(node.meta.get("debug_handle", 0) for node in owning_program.graph_module.graph.nodes)
            assert largest[key] == scanned, f"counted debug handle {largest[key]}, scanned {scanned}"
        result = original(submodule_program, _LargestHandleOnly(largest[key]), call_submodule_node, *rest)
        largest[key] += 1
        return result

    insert.reset = largest.clear  # type: ignore[attr-defined]
    return insert


@contextlib.contextmanager
def _graph_text_unformatted() -> Iterator[None]:
    """``str(graph_module)`` as a short name while ExecuTorch formats debug messages nobody logs
    (the whole module's text, with every delegate made so far, once per partition)."""
    original = torch.fx.GraphModule.__str__

    def short(self: torch.fx.GraphModule) -> str:
        if logging.getLogger().isEnabledFor(logging.DEBUG):
            return original(self)
        return f"<GraphModule {type(self).__name__} of {len(self.graph.nodes)} nodes>"

    torch.fx.GraphModule.__str__ = short  # type: ignore[method-assign]
    try:
        yield
    finally:
        torch.fx.GraphModule.__str__ = original  # type: ignore[method-assign]


@contextlib.contextmanager
def lookups_indexed() -> Iterator[None]:
    """While open, ``to_backend`` finds a partition's nodes, the next debug handle and the text of
    its unlogged messages without scanning the whole graph (module docstring)."""
    import executorch.exir.backend.backend_api as backend_api

    originals = {
        "_get_node_list_with_same_tag": backend_api._get_node_list_with_same_tag,
        "_insert_lowered_submodule": backend_api._insert_lowered_submodule,
        "_create_partitions_in_graph_module": backend_api._create_partitions_in_graph_module,
    }
    insert = _counted_debug_handles(originals["_insert_lowered_submodule"])

    def create_partitions(*args: Any, **kwargs: Any) -> Any:
        with _graph_text_unformatted():
            return originals["_create_partitions_in_graph_module"](*args, **kwargs)

    backend_api._get_node_list_with_same_tag = _nodes_with_tag(originals["_get_node_list_with_same_tag"])
    backend_api._insert_lowered_submodule = insert
    backend_api._create_partitions_in_graph_module = create_partitions
    try:
        yield
    finally:
        for name, function in originals.items():
            setattr(backend_api, name, function)
        insert.reset()
        _TAGGED.clear()
