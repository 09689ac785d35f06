"""Statically quantised activations read through: each activation's ``QuantizeLinear`` →
``DequantizeLinear`` pair is, for reading, the float tensor it rounds.

Static quantisation in QDQ form (``onnxruntime.quantization.quantize_static`` with
``QuantFormat.QDQ``, and quantisation-aware training exports) stores int8 weights behind a
``DequantizeLinear`` and puts a ``QuantizeLinear`` → ``DequantizeLinear`` pair on activations: the
scores before the Softmax, the attention probabilities after it, Q, K and V, the residual stream,
every norm's input. Each pair rounds its float input ``x`` to
``(saturate(round(x / s) + z) − z) · s``, within half a step ``s/2`` of ``x`` (inside the calibrated
range), and leaves its meaning unchanged: the next op reads ``x`` to 8 bits.

The matcher reads the graph with every such pair removed (:func:`read_through_activation_pairs`):
the consumers of the ``DequantizeLinear`` read the pair's float input. The structure it then sees
is the float model's, so every route the importer knows (exporter, optimizer, norm form) is read
in its quantised form too, with no pair handled anywhere else. onnxruntime runs the model as
shipped (:meth:`oversmooth.importers.graph.OnnxModel.session_model`, with the pairs), and every tensor the
audit asks for by name exists there: the pairs' float inputs (the Softmax output, the residual
sums) are the graph's own tensors, as the model computes them before each rounding.

A ``DequantizeLinear`` of a ``DynamicQuantizeLinear``'s codes with that node's own scale and zero
point (``quantize_dynamic`` of an optimizer-fused attention feeds ``QAttention`` so) is such a
pair too: it rounds its input to the scale computed at run time.

Weights are not read through: a pair on a constant (a float weight stored with its own
``QuantizeLinear``) folds through both nodes to the rounded weight the model multiplies by (the
op table's QuantizeLinear rule, :data:`oversmooth.importers.graph.ops.OPS`), and an int8 weight's
``DequantizeLinear`` folds as before. A pair is read through only where rounding is all it does:
the ``DequantizeLinear`` reads the ``QuantizeLinear``'s output with the same scale, zero point,
axis and block size (the same tensors, or constants of equal value), its input is not a constant,
and its output is not a graph output nor read inside a subgraph.

Public API
----------
ReadThrough
    How many activation pairs a model's reading removed.
read_through_activation_pairs
    The graph with its activation pairs removed (or None where it has none).
"""

from __future__ import annotations

from collections.abc import Iterator
from dataclasses import dataclass

import numpy as np
import onnx

from oversmooth.importers.graph.index import GraphIndex
from oversmooth.importers.graph.node import Node

__all__ = ["ReadThrough", "read_through_activation_pairs"]

#: Domains whose ``QuantizeLinear``/``DequantizeLinear`` mean the ONNX ops (onnxruntime's
#: ``com.microsoft`` ones are the same ops under its own domain, for 16-bit and older opsets).
_QUANTISER_DOMAINS = frozenset({"", "ai.onnx", "com.microsoft"})
#: Attributes that must agree between a pair's two nodes for it to round and nothing else, with
#: the value ONNX gives an absent one.
_PAIR_ATTRIBUTES = {"axis": 1, "block_size": 0}


@dataclass(frozen=True)
class ReadThrough:
    """The activation ``QuantizeLinear`` → ``DequantizeLinear`` pairs a model's reading removed,
    and the quantised or fused operators its loading expanded.

    Attributes
    ----------
    pairs : int
        How many ``DequantizeLinear`` nodes were read as their pair's float input.
    expanded : tuple of (str, int)
        Operators expanded at load into the standard ops they are defined as
        (:mod:`oversmooth.importers.graph.qoperators`: the QOperator form, onnxruntime's fused dynamic
        products, ``QAttention``, ``FusedMatMul``), by type, with counts.
    """

    pairs: int
    expanded: tuple[tuple[str, int], ...] = ()

    def note(self) -> str:
        """One line for the report: what was expanded and read through, and what the audit
        measures."""
        parts = []
        if self.expanded:
            expanded = ", ".join(f"{op} ×{count}" for op, count in self.expanded)
            parts.append(
                f"operators expanded at load into the standard ops they are defined as ({expanded}),"
                " which onnxruntime runs"
            )
        if self.pairs:
            parts.append(
                f"{self.pairs} activation QuantizeLinear→DequantizeLinear pairs read as the float "
                "tensors they round: the audit measures each tensor as the model computes it, "
                "before its rounding to the quantised type"
            )
        return "quantised or fused operators: " + "; ".join(parts)


def read_through_activation_pairs(
    proto: onnx.ModelProto, index: GraphIndex
) -> tuple[onnx.ModelProto | None, ReadThrough | None]:
    """``proto`` with every activation quantise/dequantise pair removed, for reading.

    Parameters
    ----------
    proto : onnx.ModelProto
        The model as it runs; not changed.
    index : GraphIndex
        Its index.

    Returns
    -------
    read : onnx.ModelProto or None
        A copy in which each paired ``DequantizeLinear`` is gone and its consumers read the pair's
        float input; a ``QuantizeLinear`` left with no reader is gone too. None where no pair
        qualifies (see the module docstring).
    read_through : ReadThrough or None
        How many pairs were removed (None with ``read``).
    """
    hoisted = _dequantised_before_layout(proto, index)
    if hoisted is not None:
        index = GraphIndex(hoisted.graph, index.base_dir, hoisted.opset_import, index.model_path)
        proto = hoisted
    inner = _names_read_in_subgraphs(proto.graph)
    outputs = set(index.graph_outputs)
    replaced: dict[str, str] = {}
    for dequantize in index.nodes:
        quantize = _paired_quantizer(index, dequantize)
        if quantize is None:
            continue
        name = dequantize.outputs[0]
        if name in outputs or name in inner or index.is_constant(quantize.inputs[0]):
            continue
        replaced[name] = quantize.inputs[0]
    if not replaced:
        return hoisted, None if hoisted is None else ReadThrough(pairs=0)
    for name, source in replaced.items():  # a pair reading another pair's output (Q→DQ→Q→DQ)
        while source in replaced:
            source = replaced[source]
        replaced[name] = source
    read = onnx.ModelProto()
    read.CopyFrom(proto)
    _rewire(read.graph, replaced, _unread_quantizers(index, replaced, outputs | inner))
    return read, ReadThrough(pairs=len(replaced))


def _dequantised_before_layout(proto: onnx.ModelProto, index: GraphIndex) -> onnx.ModelProto | None:
    """A copy of ``proto`` in which every per-tensor ``DequantizeLinear`` of integer codes that a
    layout op moved (``Reshape``, ``Transpose``, ... of the codes; the QOperator form moves the
    codes of Q, K and V so) dequantises before that op instead, and the op moves the float
    values; None where there is none.

    Dequantising each element with one scale and zero point commutes with any op that only moves
    or copies elements, so the rewrite is exact, and each ``DequantizeLinear`` climbs until it
    reads its ``QuantizeLinear`` (a pair, read through after) or something else. The moved op
    writes the ``DequantizeLinear``'s output name (the float tensor the graph has); the new
    dequantised input gets a fresh name, which the graph onnxruntime runs does not have and
    nothing asks it for.
    """
    if not any(_climbs_in(index, node) for node in index.nodes):  # checked without copying
        return None
    nodes = [onnx.NodeProto() for _ in proto.graph.node]
    for copy, node in zip(nodes, proto.graph.node, strict=True):
        copy.CopyFrom(node)
    producers = {out: copy for copy in nodes for out in copy.output if out}
    moved = 0
    for position, copy in enumerate(nodes):
        while _climbs(copy, producers.get(copy.input[0]) if copy.input else None, index):
            layout = producers[copy.input[0]]
            fresh = f"{copy.output[0]}/dequantised_{moved}"
            below, above = onnx.NodeProto(), onnx.NodeProto()
            below.CopyFrom(copy)  # the DequantizeLinear, now of the layout op's input
            below.input[0], below.output[0] = layout.input[0], fresh
            above.CopyFrom(layout)  # the layout op, now of the float values
            above.input[0], above.output[0] = fresh, copy.output[0]
            nodes[position] = copy = below
            nodes.insert(position + 1, above)
            producers[fresh], producers[above.output[0]] = below, above
            moved += 1
    if not moved:
        return None
    read = onnx.ModelProto()
    read.CopyFrom(proto)
    del read.graph.node[:]
    read.graph.node.extend(_without_unread_moves(nodes, set(index.graph_outputs)))
    return read


def _climbs_in(index: GraphIndex, node: Node) -> bool:
    """Whether ``node`` is a ``DequantizeLinear`` that climbs (:func:`_climbs`) in the graph."""
    if node.op_type != "DequantizeLinear":
        return False
    layout = index.producer(node.input(0))
    return layout is not None and _climbs(node.proto, layout.proto, index)


def _without_unread_moves(nodes: list[onnx.NodeProto], outputs: set[str]) -> list[onnx.NodeProto]:
    """``nodes`` less the element moves that nothing reads any more (the integer codes' moves
    whose ``DequantizeLinear`` now reads before them), repeatedly."""
    while True:
        read = {name for node in nodes for name in node.input} | outputs
        dead = [
            node
            for node in nodes
            if node.op_type in _MOVES_ELEMENTS and not any(out in read for out in node.output)
        ]
        if not dead:
            return nodes
        gone = {id(node) for node in dead}
        nodes = [node for node in nodes if id(node) not in gone]


#: Ops that only move or copy the elements of their first input (the other inputs are shapes,
#: permutations, indices), so that dequantising per tensor commutes with them.
_MOVES_ELEMENTS = frozenset(
    "Reshape Transpose Squeeze Unsqueeze Flatten Identity Slice Gather Expand Tile".split()
)


#: Element moves followed back from a ``DequantizeLinear`` to the ``QuantizeLinear`` whose codes
#: they move (the QOperator form has two or three: head split, transpose).
_MAX_MOVES = 16


def _climbs(dequantize: onnx.NodeProto, layout: onnx.NodeProto | None, index: GraphIndex) -> bool:
    """Whether ``dequantize`` dequantises per tensor the single-output element move ``layout``
    makes of codes a ``QuantizeLinear`` wrote (codes of other origins, such as
    ``DynamicQuantizeLinear``'s, stay as the matcher reads them)."""
    if (
        layout is None
        or dequantize.op_type != "DequantizeLinear"
        or dequantize.domain not in _QUANTISER_DOMAINS
        or layout.op_type not in _MOVES_ELEMENTS
        or layout.domain not in _QUANTISER_DOMAINS
        or len([out for out in layout.output if out]) != 1
    ):
        return False
    scale = index.constant_value(dequantize.input[1])
    if scale is None or scale.size != 1:
        return False
    codes = index.producer(layout.input[0])
    for _ in range(_MAX_MOVES):  # the codes a QuantizeLinear wrote, moved only
        if codes is None or codes.op_type not in _MOVES_ELEMENTS:
            break
        codes = index.producer(codes.input(0))
    return codes is not None and codes.op_type == "QuantizeLinear"


def _paired_quantizer(index: GraphIndex, node: Node) -> Node | None:
    """The quantiser whose integer encoding ``node`` (a ``DequantizeLinear``) exactly undoes, else
    None: a ``QuantizeLinear`` with the same scale, zero point and axis, or a
    ``DynamicQuantizeLinear`` whose own scale and zero point (its outputs 1 and 2) it reads."""
    if node.op_type != "DequantizeLinear" or node.domain not in _QUANTISER_DOMAINS:
        return None
    quantize = index.producer(node.input(0))
    if quantize is None or quantize.domain not in _QUANTISER_DOMAINS:
        return None
    if quantize.op_type == "DynamicQuantizeLinear":
        return quantize if node.inputs[1:3] == quantize.outputs[1:3] else None
    if quantize.op_type != "QuantizeLinear" or any(
        quantize.attr(key, default) != node.attr(key, default)
        for key, default in _PAIR_ATTRIBUTES.items()
    ):
        return None
    for position in (1, 2):
        if not _same_parameter(index, quantize.input(position), node.input(position)):
            return None
    return quantize


def _same_parameter(index: GraphIndex, first: str, second: str) -> bool:
    """Whether two scale (or zero point) inputs are the same tensor or equal constants; two
    absent zero points are the same (both mean 0 of the default type)."""
    if first == second:
        return True
    if not first or not second:
        return False
    a, b = index.constant_value(first), index.constant_value(second)
    return (
        a is not None
        and b is not None
        and a.dtype == b.dtype
        and a.shape == b.shape
        and bool(np.array_equal(a, b))
    )


def _unread_quantizers(index: GraphIndex, replaced: dict[str, str], kept: set[str]) -> set[str]:
    """First outputs of the quantisers every output of which only removed ``DequantizeLinear``
    nodes read (and none of which is kept: a graph output, read in a subgraph): those nodes go
    too. A ``DynamicQuantizeLinear`` whose scale something else reads stays."""
    gone = set()
    for name in replaced:
        dequantize = index.producer(name)
        assert dequantize is not None  # replaced holds node outputs only
        quantize = index.producer(dequantize.input(0))
        assert quantize is not None  # a pair's codes have their quantiser
        outputs = [output for output in quantize.outputs if output]
        readers = [reader for output in outputs for reader in index.consumers(output)]
        if not set(outputs) & kept and all(reader.outputs[0] in replaced for reader in readers):
            gone.add(quantize.outputs[0])
    return gone


def _rewire(graph: onnx.GraphProto, replaced: dict[str, str], gone: set[str]) -> None:
    """Drop the paired ``DequantizeLinear`` nodes (outputs in ``replaced``) and the quantisers
    whose outputs are in ``gone``; every remaining input named in ``replaced`` reads its float
    tensor. Value infos of dropped tensors are dropped with them."""
    dropped = set(replaced) | gone
    kept = [node for node in graph.node if not (node.output and node.output[0] in dropped)]
    for node in kept:
        for position, name in enumerate(node.input):
            if name in replaced:
                node.input[position] = replaced[name]
    del graph.node[:]
    graph.node.extend(kept)
    infos = [info for info in graph.value_info if info.name not in dropped]
    del graph.value_info[:]
    graph.value_info.extend(infos)


def _names_read_in_subgraphs(graph: onnx.GraphProto) -> set[str]:
    """Every tensor name a node inside a subgraph (If, Loop, Scan bodies) reads, at any depth;
    an outer tensor read there keeps its pair (the rewiring is of the top level only)."""
    return {name for subgraph in _subgraphs(graph) for node in subgraph.node for name in node.input}


def _subgraphs(graph: onnx.GraphProto) -> Iterator[onnx.GraphProto]:
    for node in graph.node:
        for attribute in node.attribute:
            nested = [attribute.g] if attribute.HasField("g") else []
            for subgraph in (*nested, *attribute.graphs):
                yield subgraph
                yield from _subgraphs(subgraph)
