"""Values of the terms added to attention scores, and what they look like (mask, ALiBi, relative).

A score term that does not depend on the hidden states (a mask, a position bias) is computed from
constants, shapes and the integer graph inputs (an attention mask, position ids). :func:`neutral_value`
evaluates it with every integer or boolean graph input set to ones: an attention mask that keeps
every token. The subgraph is cut where a value is already known without running the graph
(constants, shape arithmetic: :meth:`oversmooth.importers.graph.ShapeContext.value`) and evaluated
node by node through the importer's one evaluator, :func:`oversmooth.importers.graph.ops.fold`
(``onnx.reference``'s ops at the model's opset, or the op table's hand-written rules). The
structure tests (a table gathered by an index, a ``Where`` between masking constants, a graph
input) and the value tests below are the classification of :mod:`oversmooth.importers.match.scores`:

- entries at or below :data:`MASK_FLOOR` are *masked* (finfo.min, -10000, -inf);
- the rest is *linear in the key position* in every row (ALiBi: ``m_h * j`` plus a per-row
  constant, which the Softmax ignores), or *relative*: constant along the diagonals (a function of
  j - i) or taking few distinct values per head (a table gathered by relative position, as in
  BEiT's 2-D one), or neither.
"""

from __future__ import annotations

import math
import warnings

import numpy as np
from onnx import helper

from oversmooth.importers.graph import Node
from oversmooth.importers.graph.ops import fold
from oversmooth.importers.match.limits import MAX_LAYOUT_STEPS, MAX_TERM_ELEMENTS, MAX_TERM_NODES
from oversmooth.importers.match.walker import GraphWalker

#: A score term entry at or below this is masking, not a bias (finfo.min, -10000, -inf).
MASK_FLOOR = -1e4
#: Relative tolerance of the linear-in-key-position (ALiBi) and equal-diagonal tests.
BIAS_RTOL = 1e-4
#: A bias whose heads take at most this fraction of distinct values is gathered from a table.
TABLE_FRACTION = 0.5
_OPAQUE = frozenset({"If", "Loop", "Scan"})
#: Ops a position table or a mask is laid out with (they keep its set of values).
_LAYOUT = frozenset("Transpose Reshape Squeeze Unsqueeze Expand Tile Slice Cast Identity".split())


def neutral_value(walker: GraphWalker, name: str) -> np.ndarray | None:
    """The value of ``name`` with every integer or boolean graph input set to ones, or None.

    None when the value depends on a float graph input, on an op outside the default ONNX domain
    or with a subgraph, on more than :data:`MAX_TERM_NODES` nodes, on a tensor of more than
    :data:`MAX_TERM_ELEMENTS` elements at the probe's sizes, or when the evaluation fails.
    """
    known = _known(walker, name)
    if known is not None:
        return known
    feeds: dict[str, np.ndarray] = {}
    nodes: dict[int, Node] = {}
    stack = [name]
    while stack:
        tensor = stack.pop()
        if not tensor or tensor in feeds:
            continue
        value = _known(walker, tensor)
        if value is None and tensor in walker.index.graph_inputs:
            value = _ones_input(walker, tensor)
            if value is None:
                return None
        if value is not None:
            feeds[tensor] = value
            continue
        node = walker.producer(tensor)
        if node is None or node.domain not in ("", "ai.onnx") or node.op_type in _OPAQUE:
            return None
        if node.position in nodes:
            continue
        nodes[node.position] = node
        if len(nodes) > MAX_TERM_NODES:
            return None
        stack.extend(node.inputs)
    ordered = [nodes[key] for key in sorted(nodes)]
    if _too_large(walker, ordered, feeds):
        return None
    return _evaluate(ordered, feeds, name)


def _too_large(walker: GraphWalker, nodes: list[Node], feeds: dict[str, np.ndarray]) -> bool:
    """Whether a feed, or an output whose shape the probe knows, exceeds MAX_TERM_ELEMENTS."""
    if any(np.size(value) > MAX_TERM_ELEMENTS for value in feeds.values()):
        return True
    shapes = (walker.context.shape(output) for node in nodes for output in node.outputs if output)
    return any(shape is not None and math.prod(shape) > MAX_TERM_ELEMENTS for shape in shapes)


def _known(walker: GraphWalker, name: str) -> np.ndarray | None:
    value = walker.const(name)
    return walker.context.value(name) if value is None else value


def _ones_input(walker: GraphWalker, name: str) -> np.ndarray | None:
    """Ones for an integer or boolean graph input at the context's sizes (None for floats)."""
    value_type = walker.index.graph_inputs[name].type
    dtype = helper.tensor_dtype_to_np_dtype(value_type.tensor_type.elem_type)
    shape = walker.context.shape(name)
    if shape is None or not (np.issubdtype(dtype, np.integer) or dtype == np.bool_):
        return None
    return np.ones(shape, dtype=dtype)


def _evaluate(nodes: list[Node], feeds: dict[str, np.ndarray], output: str) -> np.ndarray | None:
    """``output`` of the cut subgraph ``nodes`` (in graph order) from ``feeds``, node by node
    through the op table's evaluator (:func:`oversmooth.importers.graph.ops.fold`); None when any
    value on the way is unknown or refused."""
    needed = {output} | {tensor for node in nodes for tensor in node.inputs}
    values = dict(feeds)
    try:
        with warnings.catch_warnings(), np.errstate(all="ignore"):
            warnings.simplefilter("ignore")  # log(0) in T5's bucket arithmetic, masked later
            for node in nodes:
                inputs = [values[name] if name else None for name in node.inputs]
                for position, name in enumerate(node.outputs):
                    if name in needed:
                        values[name] = _known_or_fail(fold(node, inputs, position))
    except Exception:  # any failure of the evaluation means "value unknown"
        return None
    return values[output]


def _known_or_fail(value: np.ndarray | None) -> np.ndarray:
    if value is None:
        raise ValueError("a value on the way is unknown")
    return value


# -- what a term's structure says ------------------------------------------------------------------
def layout_source(walker: GraphWalker, name: str) -> tuple[str, Node | None]:
    """``name`` followed back through layout ops (which keep a term's set of values): the tensor
    reached and its producer (None for a graph input or an initializer)."""
    for _ in range(MAX_LAYOUT_STEPS):
        node = walker.producer(name)
        if node is None or node.op_type not in _LAYOUT:
            return name, node
        name = node.input(0)
    return name, walker.producer(name)


def gathered_from_table(walker: GraphWalker, name: str) -> bool:
    """Whether the term is entries of a table gathered by an index (the caller knows it does not
    depend on the hidden states: a position table)."""
    _, node = layout_source(walker, name)
    return node is not None and node.op_type in ("Gather", "GatherElements")


def constant_table(walker: GraphWalker, name: str) -> bool:
    """Whether the term is a constant with a (query, key) extent: a learned bias even when its
    values are all zero (BEiT initialises its relative position table to zero)."""
    value = walker.const(name)
    return value is not None and value.ndim >= 2 and min(value.shape[-2:]) >= 2


def fills_constants(walker: GraphWalker, name: str) -> bool:
    """Whether the term is a ``Where`` choosing between constants that are all zero or masking: a
    mask whatever its condition (a defused ``Attention``'s mask index)."""
    _, node = layout_source(walker, name)
    if node is None or node.op_type != "Where":
        return False
    branches = [walker.const(node.input(position)) for position in (1, 2)]
    return all(
        branch is not None and bool(np.all((branch == 0) | (branch <= MASK_FLOOR)))
        for branch in branches
    )


def fed_by_input(walker: GraphWalker, name: str) -> str | None:
    """The graph input the term is laid out from, else None."""
    source, _ = layout_source(walker, name)
    return source if source in walker.index.graph_inputs else None


# -- what a term's values look like ----------------------------------------------------------------
def masked_entries(value: np.ndarray) -> np.ndarray:
    """Boolean array: the entries that mask (at or below :data:`MASK_FLOOR`, -inf included)."""
    return np.asarray(value, dtype=np.float64) <= MASK_FLOOR


def bias_part(value: np.ndarray) -> np.ma.MaskedArray:
    """The term's bias: its values with the masked entries left out (float64)."""
    data = np.asarray(value, dtype=np.float64)
    return np.ma.masked_array(np.where(masked_entries(data), 0.0, data), masked_entries(data))


def is_zero(bias: np.ma.MaskedArray) -> bool:
    return bool(np.ma.allequal(bias, 0.0))


def is_linear_in_key(bias: np.ma.MaskedArray) -> bool:
    """Every row is ``m * j + c`` over its unmasked key positions j, and some slope m is nonzero
    (ALiBi); rows need three unmasked keys for the test to say anything, and one must have them."""
    if bias.ndim < 1 or bias.shape[-1] < 3:
        return False
    rows = bias.reshape(-1, bias.shape[-1])
    scale = max(float(np.ma.max(np.ma.abs(rows))), 1e-30)
    informative, sloped = False, False
    keys = np.arange(rows.shape[1], dtype=np.float64)
    for row in rows:
        kept = ~np.ma.getmaskarray(row)
        if kept.sum() < 2:
            continue
        j, values = keys[kept], np.ma.getdata(row)[kept]
        slope = (values[1] - values[0]) / (j[1] - j[0])
        if np.max(np.abs(values - values[0] - slope * (j - j[0]))) > BIAS_RTOL * scale:
            return False
        informative |= kept.sum() >= 3
        sloped |= abs(slope) > BIAS_RTOL * scale
    return informative and sloped


def is_relative(bias: np.ma.MaskedArray) -> bool:
    """Constant along the diagonals of every (query, key) matrix (a function of j - i), or, per
    matrix, at most :data:`TABLE_FRACTION` as many distinct values as entries (a table gathered by
    relative position, e.g. BEiT's 2-D one with its CLS entries); needs two queries and keys."""
    if bias.ndim < 2 or min(bias.shape[-2:]) < 2:
        return False
    scale = max(float(np.ma.max(np.ma.abs(bias))), 1e-30)
    step = bias[..., 1:, 1:] - bias[..., :-1, :-1]
    if np.ma.max(np.ma.abs(step), fill_value=0.0) <= BIAS_RTOL * scale:
        return True
    matrices = bias.reshape(-1, *bias.shape[-2:])
    for matrix in matrices:
        kept = np.ma.compressed(matrix)
        if kept.size < 4 or np.unique(kept).size > TABLE_FRACTION * matrix.size:
            return False
    return True


def causal_pattern(masks: list[np.ndarray], queries: int, keys: int) -> bool:
    """Whether the masked entries (boolean arrays broadcastable to ``(..., queries, keys)``, one
    per mask) together hide every key after its query (j > i) and never the diagonal."""
    if queries < 2 or queries != keys or not masks:
        return False
    hidden = np.zeros((queries, keys), dtype=bool)
    for mask in masks:
        try:
            full = np.broadcast_to(mask, (*mask.shape[:-2], queries, keys))
        except ValueError:
            continue
        hidden |= full.reshape(-1, queries, keys).all(axis=0)
    upper = np.triu(np.ones((queries, keys), dtype=bool), k=1)
    return bool(hidden[upper].all() and not hidden[np.eye(queries, dtype=bool)].any())
