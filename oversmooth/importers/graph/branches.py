"""A merged decoder read through its no-cache branch.

optimum's older generation exports (and the ``decoder_model_merged.onnx`` files many published
models ship, transformers.js among them) join two decoders in one graph: a top-level ``If`` on a
boolean graph input (``use_cache_branch``) runs either the decoder without a key/value cache or the
one that concatenates the ``past_key_values.*`` inputs with the new keys and values. The branch
without the cache is the model without a cache, which the audit measures (see
:mod:`oversmooth.importers.graph.kv_cache` for the unmerged form), so :func:`read_no_cache_branch` inlines it in
place of the ``If``: the switch and the cache inputs only the other branch reads are no longer graph
inputs. Applied once, by :func:`oversmooth.importers.graph.model_from_proto`, before defusing.

Which branch is the no-cache one is found by structure: the ``If``'s condition is a boolean graph
input (a switch the caller sets), and one branch reads every graph input the other reads plus float
inputs of rank 3 or more (the caches) that nothing else in the graph reads. Names are never used.

Public API
----------
read_no_cache_branch
    Inline the no-cache branch of every such ``If``; returns the new model (or None) and what was
    done.
CacheBranch
    One ``If`` read through its no-cache branch.
"""

from __future__ import annotations

from collections.abc import Iterator
from dataclasses import dataclass

import onnx

from oversmooth.importers.graph.index import GraphIndex
from oversmooth.importers.graph.node import DEFAULT_DOMAINS, Node

__all__ = ["CacheBranch", "read_no_cache_branch"]


@dataclass(frozen=True)
class CacheBranch:
    """One ``If`` replaced by its no-cache branch: the node, its switch, the branch kept and the
    cache inputs only the other branch read (no longer graph inputs)."""

    node: str
    switch: str
    branch: str
    caches: tuple[str, ...]

    def note(self) -> str:
        """One line for the blocks' and the audit's notes."""
        named = ", ".join(map(repr, self.caches[:4]))
        named += f" and {len(self.caches) - 4} more" if len(self.caches) > 4 else ""
        return (
            f"merged decoder read through the no-cache branch ({self.branch}) of If "
            f"{self.node!r} on {self.switch!r}: the model without a cache (past length 0); the "
            f"KV cache input(s) {named}, read only by the other branch, are not fed"
        )


def _outer_reads(graph: onnx.GraphProto) -> set[str]:
    """Names a (sub)graph reads from outside itself, nested subgraphs included (iteratively: a
    hostile file's nesting depth cannot exhaust the stack)."""
    reads: set[str] = set()
    stack: list[tuple[onnx.GraphProto, frozenset[str]]] = [(graph, frozenset())]
    while stack:
        current, outer = stack.pop()
        defined = {value.name for value in current.input} | {t.name for t in current.initializer}
        defined |= {name for node in current.node for name in node.output if name}
        visible = outer | defined
        for node in current.node:
            reads.update(name for name in node.input if name and name not in visible)
            stack.extend((sub, visible) for sub in _subgraphs(node))
        reads.update(value.name for value in current.output if value.name not in visible)
    return reads


def _subgraphs(node: onnx.NodeProto) -> Iterator[onnx.GraphProto]:
    for attribute in node.attribute:
        if attribute.type == onnx.AttributeProto.GRAPH:
            yield attribute.g
        elif attribute.type == onnx.AttributeProto.GRAPHS:
            yield from attribute.graphs


def _is_switch(index: GraphIndex, name: str) -> bool:
    """A boolean graph input of one element (``use_cache_branch``), not an initializer."""
    value = index.graph_inputs.get(name)
    if value is None or name in index.initializers or not value.type.HasField("tensor_type"):
        return False
    tensor = value.type.tensor_type
    dims = tensor.shape.dim if tensor.HasField("shape") else []
    single = all(dim.HasField("dim_value") and dim.dim_value == 1 for dim in dims)
    return tensor.elem_type == onnx.TensorProto.BOOL and single


def _is_cache_like(index: GraphIndex, name: str) -> bool:
    """A float graph input of rank 3 or more that only the ``If`` reads."""
    value = index.graph_inputs[name]
    if name in index.initializers or not value.type.HasField("tensor_type"):
        return False
    tensor = value.type.tensor_type
    floats = {onnx.TensorProto.FLOAT, onnx.TensorProto.FLOAT16, onnx.TensorProto.BFLOAT16}
    rank = len(tensor.shape.dim) if tensor.HasField("shape") else 0
    return tensor.elem_type in floats and rank >= 3 and not index.consumers(name)


def _no_cache_branch(index: GraphIndex, node: Node) -> tuple[str, tuple[str, ...]] | None:
    """``(kept branch attribute, cache inputs dropped)`` for a cache-switching ``If``, else None."""
    if (
        node.op_type != "If"
        or node.domain not in DEFAULT_DOMAINS
        or not _is_switch(index, node.input(0))
    ):
        return None
    branches = {
        a.name: a.g for a in node.proto.attribute if a.name in ("then_branch", "else_branch")
    }
    if len(branches) != 2:
        return None
    inputs = set(index.graph_inputs) - set(index.initializers)
    reads = {name: _outer_reads(graph) & inputs for name, graph in branches.items()}
    for kept, other in (("else_branch", "then_branch"), ("then_branch", "else_branch")):
        extra = reads[other] - reads[kept]
        if reads[kept] <= reads[other] and extra and all(_is_cache_like(index, n) for n in extra):
            if _collides(index, node, branches[kept]):
                return None
            ordered = tuple(name for name in index.graph_inputs if name in extra)
            return kept, ordered
    return None


def _collides(index: GraphIndex, node: Node, branch: onnx.GraphProto) -> bool:
    """Whether a tensor the branch defines is already defined outside it (other than as an output
    of the ``If`` itself): inlined, the graph would define it twice."""
    defined = {t.name for t in branch.initializer}
    defined |= {name for inner in branch.node for name in inner.output if name}
    return any(index.is_defined(name) for name in defined - set(node.outputs))


def read_no_cache_branch(
    proto: onnx.ModelProto, index: GraphIndex
) -> tuple[onnx.ModelProto | None, tuple[CacheBranch, ...]]:
    """Replace every top-level ``If`` that switches a key/value cache by its no-cache branch.

    Returns the rewritten copy of ``proto`` (None when there is no such ``If``) and one
    :class:`CacheBranch` per ``If`` replaced. The branch's nodes take the ``If``'s place (its
    outputs renamed to the ``If``'s by ``Identity`` nodes where they differ), its initializers and
    value infos join the graph's; the switch and the dropped caches leave the graph inputs.
    """
    found = [(node, _no_cache_branch(index, node)) for node in index.nodes]
    chosen = [(node, kept) for node, kept in found if kept is not None]
    switches = [node.input(0) for node, _ in chosen]
    if not chosen or any(len(index.consumers(name)) != 1 for name in switches):
        return None, ()
    rewritten = onnx.ModelProto()
    rewritten.CopyFrom(proto)
    graph = rewritten.graph
    replaced = {node.position: kept for node, kept in chosen}
    nodes: list[onnx.NodeProto] = []
    done: list[CacheBranch] = []
    dropped: set[str] = set()
    for position, original in enumerate(proto.graph.node):
        if position not in replaced:
            nodes.append(original)
            continue
        branch_name, caches = replaced[position]
        branch = next(a.g for a in original.attribute if a.name == branch_name)
        nodes.extend(branch.node)
        for inner, outer in zip(branch.output, original.output, strict=False):
            if outer and inner.name != outer:
                nodes.append(onnx.helper.make_node("Identity", [inner.name], [outer]))
        graph.initializer.extend(branch.initializer)
        graph.value_info.extend(branch.value_info)
        dropped |= {original.input[0], *caches}
        label = original.name or f"If#{position}"
        done.append(
            CacheBranch(label, original.input[0], branch_name.removesuffix("_branch"), caches)
        )
    del graph.node[:]
    graph.node.extend(nodes)
    kept_inputs = [value for value in graph.input if value.name not in dropped]
    del graph.input[:]
    graph.input.extend(kept_inputs)
    return rewritten, tuple(done)
