"""The standard-ONNX pieces a fused attention operator is rewritten into (see :mod:`.defuse`).

Every piece is written the way the exporters write it, so that the Softmax-anchored matcher
(:mod:`oversmooth.importers.match`) walks the result like any export: projection ``MatMul`` (+ bias ``Add``),
head split ``Reshape`` [0, 0, n_heads, -1] → ``Transpose``, the scores ``MatMul(Q, Kᵀ)`` → scale
``Mul`` → additive biases ``Add`` → ``Softmax`` → ``MatMul(·, V)``, head merge ``Transpose`` →
``Reshape`` [0, 0, -1].

Public API
----------
Emitter
    Collects the new nodes and constants of one rewrite, with names derived from the fused node.
DeclinedError
    Raised by a rewrite that meets a feature it does not implement (one line naming it).
Facts
    What the rewrites ask of the original graph: constants, shapes (at batch 2, sequence 3),
    element types.
refuse, refuse_inputs, refuse_outputs, num_heads, attention_scale
    The checks every rewrite makes of its node (each raises :class:`DeclinedError`).
with_replaced_nodes
    A model with some nodes replaced by the subgraphs emitted for them.
"""

from __future__ import annotations

import math
from typing import Any

import numpy as np
import onnx
from numpy.typing import ArrayLike
from onnx import helper, numpy_helper

from oversmooth.importers.graph.index import GraphIndex
from oversmooth.importers.graph.node import Node
from oversmooth.importers.graph.shapes import ShapeContext, inferred_types

__all__ = [
    "BATCH",
    "DeclinedError",
    "Emitter",
    "Facts",
    "attention_scale",
    "num_heads",
    "refuse",
    "refuse_inputs",
    "refuse_outputs",
    "with_replaced_nodes",
]

#: Batch and sequence sizes at which mask and input shapes are evaluated to tell their form.
BATCH, SEQUENCE = 2, 3

#: Key-padding mask forms of onnxruntime's contrib attention operators, by the mask's shape.
MASK_FORMS = ("index", "keys", "queries_keys", "dummy")


class DeclinedError(Exception):
    """Internal: a fused operator uses a feature its rewrite does not implement (the message names
    it); :func:`oversmooth.importers.graph.defuse.defuse_attention` turns it into a :class:`Declined`."""


class Facts:
    """What the rewrites ask of the original graph: constants, shapes, element types."""

    def __init__(self, proto: onnx.ModelProto, index: GraphIndex) -> None:
        self.proto = proto
        self.index = index
        self.shapes = ShapeContext(index, batch=BATCH, sequence=SEQUENCE)
        self._types: dict[str, onnx.TypeProto] | None = None

    def constant(self, name: str) -> np.ndarray | None:
        return self.index.constant_value(name) if name else None

    def shape(self, name: str) -> tuple[int, ...] | None:
        try:
            return self.shapes.shape(name)
        except (ValueError, TypeError, IndexError, KeyError):
            return None

    def elem_type(self, name: str) -> int | None:
        """The ONNX element type of tensor ``name`` (declared, initializer, Cast or inferred)."""
        if name in self.index.initializers:
            return int(self.index.initializers[name].data_type)
        declared = self.index.graph_inputs.get(name)
        if declared is not None and declared.type.tensor_type.elem_type:
            return int(declared.type.tensor_type.elem_type)
        producer = self.index.producer(name)
        if producer is not None and producer.op_type == "Cast":
            return int(producer.attr("to"))
        if self._types is None:
            self._types = inferred_types(self.proto)
        found = self._types.get(name)
        return int(found.tensor_type.elem_type) if found is not None else None

    def float_dtype(self, name: str, what: str) -> np.dtype:
        kind = self.elem_type(name)
        dtype = None if kind is None else onnx.helper.tensor_dtype_to_np_dtype(kind)
        if dtype is None or dtype.kind != "f":
            raise DeclinedError(f"with {what} of unknown or non-float element type")
        return np.dtype(dtype)


def refuse(condition: object, feature: str) -> None:
    """Raise :class:`DeclinedError` naming ``feature`` when ``condition`` holds."""
    if condition:
        raise DeclinedError(feature)


def refuse_inputs(node: Node, positions: dict[int, str]) -> None:
    """Decline a node that is given any of the optional inputs at ``positions`` (their features)."""
    for position, feature in positions.items():
        refuse(node.input(position), feature)


def refuse_outputs(node: Node, positions: dict[int, str]) -> None:
    """Decline a node that emits any of the optional outputs at ``positions`` (their features)."""
    for position, feature in positions.items():
        refuse(len(node.outputs) > position and node.outputs[position], feature)


def num_heads(node: Node, name: str = "num_heads") -> int:
    """The node's positive head count attribute ``name``."""
    heads = int(node.attr(name, 0))
    refuse(heads <= 0, f"without a positive {name} attribute")
    return heads


def attention_scale(node: Node, head_size: int) -> float:
    """The ``scale`` attribute, or ``1/sqrt(head_size)`` where it is absent or 0."""
    scale = node.attr("scale")
    return float(scale) if scale else 1.0 / math.sqrt(head_size)


class Emitter:
    """The nodes and constants replacing one fused node; names are ``<prefix>/<what>_<k>``.

    Parameters
    ----------
    prefix : str
        The fused node's label (keeps the new names unique and traceable).
    dtype : numpy.dtype
        The float type of the attention computation (scale, mask and bias constants).
    """

    def __init__(self, prefix: str, dtype: np.dtype) -> None:
        self.prefix = prefix
        self.dtype = np.dtype(dtype)
        self.nodes: list[onnx.NodeProto] = []
        self.initializers: list[onnx.TensorProto] = []
        #: Graph inputs the fused node read that the rewrite does without; dropped from the graph
        #: when nothing else reads them (so nobody has to feed them).
        self.unneeded_inputs: set[str] = set()
        self._count = 0

    def fresh(self, what: str) -> str:
        self._count += 1
        return f"{self.prefix}/{what}_{self._count}"

    def const(self, what: str, value: ArrayLike) -> str:
        """A new initializer holding ``value`` (its dtype kept)."""
        name = self.fresh(what)
        self.initializers.append(numpy_helper.from_array(np.asarray(value), name))
        return name

    def scalar(self, what: str, value: float) -> str:
        """A 0-d constant of the computation's float type."""
        with np.errstate(over="ignore"):  # float16: a filter value like -3.4e38 becomes -inf
            return self.const(what, np.asarray(value, dtype=self.dtype))

    def ints(self, what: str, values: list[int] | int) -> str:
        return self.const(what, np.asarray(values, dtype=np.int64))

    def op(self, op_type: str, inputs: list[str], *, output: str = "", **attrs: Any) -> str:
        """Append one default-domain node; returns its (only) output's name."""
        name = self.fresh(op_type)
        out = output or f"{name}_output"
        self.nodes.append(helper.make_node(op_type, inputs, [out], name=name, **attrs))
        return out

    # -- projections and the head layout ---------------------------------------------------------
    def project(self, x: str, weight: np.ndarray, bias: np.ndarray | None, what: str) -> str:
        """``x @ weight (+ bias)`` with both as new constants."""
        y = self.op("MatMul", [x, self.const(f"W_{what}", weight)])
        return y if bias is None else self.op("Add", [y, self.const(f"b_{what}", bias)])

    def add_bias(self, x: str, bias: np.ndarray | None, what: str) -> str:
        return x if bias is None else self.op("Add", [x, self.const(f"b_{what}", bias)])

    def split_heads(self, x: str, n_heads: int, perm: tuple[int, ...]) -> str:
        """(B, T, n_heads·d) → Reshape (B, T, n_heads, d) → Transpose ``perm``."""
        shaped = self.op("Reshape", [x, self.ints("heads", [0, 0, n_heads, -1])])
        return self.op("Transpose", [shaped], perm=list(perm))

    def merge_heads(self, context: str, output: str) -> str:
        """(B, n_heads, S, d) → Transpose (B, S, n_heads, d) → Reshape (B, S, n_heads·d)."""
        merged = self.op("Transpose", [context], perm=[0, 2, 1, 3])
        return self.op("Reshape", [merged, self.ints("merged", [0, 0, -1])], output=output)

    def repeat_heads(self, x: str, group: int) -> str:
        """(B, H_kv, T, d) → (B, H_kv·group, T, d), each key/value head repeated ``group`` times."""
        if group == 1:
            return x
        shape = self.op("Shape", [x])
        grown = self.op(
            "Expand",
            [
                self.op("Unsqueeze", [x, self.ints("axis", [2])]),
                self.ints("repeat", [1, 1, group, 1, 1]),
            ],
        )
        heads = self.op("Mul", [self.gather(shape, [1]), self.ints("group", [group])])
        target = self.op(
            "Concat", [self.gather(shape, [0]), heads, self.gather(shape, [2, 3])], axis=0
        )
        return self.op("Reshape", [grown, target])

    def gather(self, x: str, indices: list[int] | int, axis: int = 0) -> str:
        return self.op("Gather", [x, self.ints("index", indices)], axis=axis)

    def attend(
        self,
        q: str,
        k_t: str,
        v: str,
        scale: float,
        biases: list[str],
        softmax: str,
        softcap: float = 0.0,
    ) -> str:
        """``Softmax(scale · Q Kᵀ + Σ biases) V`` on head-split tensors; the Softmax is named.

        With ``softcap`` c > 0 the scaled scores are capped first: ``c · tanh(s / c)``.
        """
        scores = self.op("Mul", [self.op("MatMul", [q, k_t]), self.scalar("scale", scale)])
        if softcap > 0.0:
            capped = self.op("Tanh", [self.op("Div", [scores, self.scalar("softcap", softcap)])])
            scores = self.op("Mul", [capped, self.scalar("softcap", softcap)])
        for bias in biases:
            scores = self.op("Add", [scores, bias])
        probabilities = f"{softmax}_output_0"
        self.nodes.append(
            helper.make_node("Softmax", [scores], [probabilities], name=softmax, axis=-1)
        )
        return self.op("MatMul", [probabilities, v])

    # -- masks as additive score biases ----------------------------------------------------------
    def positions(self, x: str, axis: int) -> str:
        """``Range(0, x.shape[axis])`` as int64."""
        size = self.op("Gather", [self.op("Shape", [x]), self.ints("axis", axis)], axis=0)
        return self.op("Range", [self.ints("zero", 0), size, self.ints("one", 1)])

    def where_bias(self, condition: str, value: float) -> str:
        """``value`` where ``condition`` holds, else 0 (the computation's float type)."""
        return self.op("Where", [condition, self.scalar("masked", value), self.scalar("kept", 0.0)])

    def causal_bias(
        self,
        queries: tuple[str, int],
        keys: tuple[str, int],
        value: float,
        *,
        bottom_right: bool = False,
    ) -> str:
        """(S, T) bias: ``value`` where key position j > query position i (upper-left causal), or
        with ``bottom_right`` where j > i + T − S (query i at position P + i after a past of
        P = T − S keys; the same mask at past length 0).

        ``queries`` and ``keys`` are (tensor, its sequence axis).
        """
        key_positions = self.op("Unsqueeze", [self.positions(*keys), self.ints("axis", [0])])
        query_positions = self.positions(*queries)
        if bottom_right:
            past = self.op(
                "Sub",
                [
                    self.gather(self.op("Shape", [keys[0]]), [keys[1]]),
                    self.gather(self.op("Shape", [queries[0]]), [queries[1]]),
                ],
            )
            query_positions = self.op("Add", [query_positions, past])
        later = self.op(
            "Greater",
            [key_positions, self.op("Unsqueeze", [query_positions, self.ints("axis", [1])])],
        )
        return self.where_bias(later, value)

    def present(self, past: str, new: str, output: str) -> str:
        """Keys or values (B, N, P + S, H) after a past: ``Concat(past, new)`` along the sequence
        (``new`` without a past), written to ``output`` when it is not ""."""
        if past:
            return self.op("Concat", [past, new], axis=2, output=output)
        return self.op("Identity", [new], output=output) if output else new

    def key_mask_bias(
        self, mask: str, form: str, keys: str, value: float, key_axis: int = 1
    ) -> str:
        """The additive bias of an onnxruntime key mask (``value`` at masked keys, else 0).

        ``form`` (:data:`MASK_FORMS`): ``index`` (B,) key lengths — keys at or after the length
        are masked — or (2B,) end positions then start positions — keys before the start masked
        too (told apart at run time: the start is read from the mask padded with B zeros);
        ``keys`` (B, T) and ``queries_keys`` (B, S, T) — entries ≤ 0 are masked. Returns shape
        (B, 1, 1, T) or (B, 1, S, T). ``keys``: a tensor of the keys, batch first, its sequence
        axis ``key_axis``.
        """
        index = self.op("Cast", [mask], to=onnx.TensorProto.INT64)
        if form in ("keys", "queries_keys"):
            masked = self.op("LessOrEqual", [index, self.ints("zero", 0)])
            axes = [1, 2] if form == "keys" else [1]
            return self.op("Unsqueeze", [self.where_bias(masked, value), self.ints("axes", axes)])
        batch = self.gather(self.op("Shape", [keys]), [0])
        zeros = self.op(
            "ConstantOfShape", [batch], value=numpy_helper.from_array(np.zeros(1, np.int64))
        )
        padded = self.op("Concat", [index, zeros], axis=0)
        twice = self.op("Mul", [batch, self.ints("two", [2])])
        end = self.op("Slice", [padded, self.ints("start", [0]), batch])
        start = self.op("Slice", [padded, batch, twice])
        position = self.op("Unsqueeze", [self.positions(keys, key_axis), self.ints("axis", [0])])
        masked = self.op(
            "Or",
            [
                self.op(
                    "GreaterOrEqual",
                    [position, self.op("Unsqueeze", [end, self.ints("axis", [1])])],
                ),
                self.op("Less", [position, self.op("Unsqueeze", [start, self.ints("axis", [1])])]),
            ],
        )
        return self.op("Unsqueeze", [self.where_bias(masked, value), self.ints("axes", [1, 2])])

    def bool_mask_bias(self, mask: str) -> str:
        """ONNX Attention's boolean mask: True takes part (0), False is masked (−inf)."""
        return self.op("Where", [mask, self.scalar("kept", 0.0), self.scalar("masked", -np.inf)])

    # -- T5's relative position bias -------------------------------------------------------------
    def relative_position_bias(
        self,
        table: str,
        query_length: str,
        key_length: str,
        max_distance: int,
        bidirectional: bool,
        n_buckets: int,
    ) -> str:
        """onnxruntime's ``RelativePositionBias``: (1, n_heads, q, k) from T5's bucketed table.

        With r = j − i (key minus query position): bidirectional, half the buckets are for r > 0
        (offset n/2) and r ← |r|; unidirectional, r ← max(−r, 0). With m = n/2 exact buckets
        (of those left), bucket = r if r < m else min(n − 1, m + ⌊log(r/m) / log(max_distance/m)
        · (n − m)⌋); the bias of head h is ``table[bucket, h]``.
        """
        lengths = [
            self.op(
                "Reshape",
                [self.op("Cast", [name], to=onnx.TensorProto.INT64), self.ints("scalar", [])],
            )
            for name in (query_length, key_length)
        ]
        one = self.ints("one", 1)
        queries = self.op("Range", [self.ints("zero", 0), lengths[0], one])
        keys = self.op("Range", [self.ints("zero", 0), lengths[1], one])
        relative = self.op(
            "Sub",
            [
                self.op("Unsqueeze", [keys, self.ints("axis", [0])]),
                self.op("Unsqueeze", [queries, self.ints("axis", [1])]),
            ],
        )
        offset = None
        if bidirectional:
            n_buckets //= 2
            ahead = self.op("Greater", [relative, self.ints("zero", 0)])
            offset = self.op(
                "Mul",
                [self.op("Cast", [ahead], to=onnx.TensorProto.INT64), self.ints("half", n_buckets)],
            )
            distance = self.op("Abs", [relative])
        else:
            distance = self.op("Max", [self.op("Neg", [relative]), self.ints("zero", 0)])
        exact = n_buckets // 2
        ratio = self.op(
            "Div",
            [
                self.op("Cast", [distance], to=onnx.TensorProto.FLOAT),
                self.const("exact", np.float32(exact)),
            ],
        )
        grown = self.op(
            "Mul",
            [
                self.op(
                    "Div",
                    [
                        self.op("Log", [ratio]),
                        self.const("log_range", np.float32(np.log(max_distance / exact))),
                    ],
                ),
                self.const("spread", np.float32(n_buckets - exact)),
            ],
        )
        large = self.op(
            "Add", [self.op("Cast", [grown], to=onnx.TensorProto.INT64), self.ints("exact", exact)]
        )
        large = self.op("Min", [large, self.ints("last", n_buckets - 1)])
        small = self.op("Less", [distance, self.ints("exact", exact)])
        bucket = self.op("Where", [small, distance, large])
        if offset is not None:
            bucket = self.op("Add", [bucket, offset])
        per_head = self.op("Gather", [table, bucket], axis=0)  # (q, k, heads)
        transposed = self.op("Transpose", [per_head], perm=[2, 0, 1])
        return self.op("Unsqueeze", [transposed, self.ints("axis", [0])])


def with_replaced_nodes(
    proto: onnx.ModelProto, index: GraphIndex, replaced: dict[int, Emitter]
) -> onnx.ModelProto:
    """A copy of ``proto`` with each node at a position of ``replaced`` replaced in place by that
    emitter's nodes (which write the same output names), the emitters' constants added, and the
    initializers and graph inputs only the replaced nodes read dropped (constants always; graph
    inputs where the emitter names them :attr:`Emitter.unneeded_inputs`)."""
    copy = onnx.ModelProto()
    copy.CopyFrom(proto)
    nodes: list[onnx.NodeProto] = []
    for node in index.nodes:
        nodes.extend(replaced[node.position].nodes if node.position in replaced else [node.proto])
    del copy.graph.node[:]
    copy.graph.node.extend(nodes)
    read = _names_read(nodes) | {value.name for value in copy.graph.output}
    gone = {name for position in replaced for name in index.nodes[position].inputs} - read
    gone &= set(index.initializers) | {
        name for emitter in replaced.values() for name in emitter.unneeded_inputs
    }
    for container in (copy.graph.initializer, copy.graph.input):
        kept = [item for item in container if item.name not in gone]
        del container[:]
        container.extend(kept)
    for emitter in replaced.values():
        copy.graph.initializer.extend(emitter.initializers)
    return copy


def _names_read(nodes: list[onnx.NodeProto]) -> set[str]:
    """The tensors ``nodes`` read, their subgraphs' (If, Loop, Scan) included."""
    names: set[str] = set()
    for node in nodes:
        names.update(node.input)
        for attribute in node.attribute:
            graphs = [attribute.g] if attribute.HasField("g") else list(attribute.graphs)
            for graph in graphs:
                names |= _names_read(list(graph.node))
    return names
