"""The one table of ONNX op semantics the importer knows: value, shape and layout replay per op.

Three parts of the importer evaluate ONNX ops without onnxruntime, and all three read this table:

- constant folding of weight chains (:class:`~oversmooth.importers.graph.index.GraphIndex`: int8 Cast→Mul,
  DequantizeLinear, QuantizeLinear, Transpose, Reshape of constants; the ops marked ``weights``);
- shape arithmetic (:class:`~oversmooth.importers.graph.shapes.ShapeContext`: an op's ``shape`` rule, else the
  shape of its ``value``);
- the numeric layout probe (:mod:`oversmooth.importers.match.layout`): a pure layout op (``layout`` set)
  replayed on a probe array through its ``value``.

Each entry's ``value`` reproduces the op exactly in NumPy, keeping the graph's dtype (so a folded
float32 product equals what the runtime computes); ``shape`` gives the output shape by arithmetic
alone (:mod:`oversmooth.importers.graph.shape_rules`). A value whose element count exceeds the size limit
``max_elements`` (:mod:`oversmooth.simulator.limits`) is never materialised: its ``value`` is unknown (None).

Public API
----------
OpSemantics, OPS
    The table.
FOLDERS
    The ops folded when reading weights, as ``(node, values) -> value``.
fold
    An op's value of one output, from its input values (None where unknown or too large).
"""

from __future__ import annotations

import math
from collections.abc import Callable, Sequence
from dataclasses import dataclass

import numpy as np

from oversmooth.importers.graph import folding as f
from oversmooth.importers.graph.node import Node
from oversmooth.importers.graph.shape_rules import (
    SHAPE_RULES,
    ShapeRule,
    broadcast_rule,
    same_shape_rule,
)
from oversmooth.simulator.limits import limit

__all__ = ["FOLDERS", "OPS", "OpSemantics", "ValueRule", "fold", "materialisable"]

#: ``(node, input values, output position) -> value`` (None: unknown).
ValueRule = Callable[[Node, list, int], "np.ndarray | None"]


@dataclass(frozen=True)
class OpSemantics:
    """What the importer knows of one op.

    Attributes
    ----------
    value : ValueRule or None
        Its exact NumPy value.
    shape : ShapeRule or None
        Its output shape from its inputs' shapes (None: taken from ``value``).
    layout : str or None
        For a pure layout op (moves, copies or selects elements), what must be evaluated to replay
        it on a probe: the name of its second operand, or "" when its attributes suffice.
    weights : bool
        Folded when a weight is stored as a chain of ops on constants.
    """

    value: ValueRule | None = None
    shape: ShapeRule | None = None
    layout: str | None = None
    weights: bool = False


def materialisable(shape: Sequence[int]) -> bool:
    """Whether an array of ``shape`` is within the ``max_elements`` limit."""
    return all(dim >= 0 for dim in shape) and math.prod(shape) <= limit("max_elements")


def _one(function: Callable[[Node, list], np.ndarray | None]) -> ValueRule:
    """A single-output value function as a :data:`ValueRule`."""
    return lambda node, values, _output: function(node, values)


def _bounded(shape_of: Callable[[Node, list], Sequence[int]], function: ValueRule) -> ValueRule:
    """``function``, but unknown (None) when the output it would build exceeds the size limit."""

    def rule(node: Node, values: list, output: int) -> np.ndarray | None:
        return function(node, values, output) if materialisable(shape_of(node, values)) else None

    return rule


def _expand_shape(_node: Node, values: list) -> tuple[int, ...]:
    return tuple(np.broadcast_shapes(values[0].shape, tuple(int(d) for d in np.ravel(values[1]))))


def _tile_shape(_node: Node, values: list) -> tuple[int, ...]:
    repeats = [int(r) for r in np.ravel(values[1])]
    return tuple(d * r for d, r in zip(values[0].shape, repeats, strict=True))


def _target_shape(_node: Node, values: list) -> tuple[int, ...]:
    return tuple(int(d) for d in np.ravel(values[0]))


def _range_shape(_node: Node, values: list) -> tuple[int, ...]:
    start, limit_, delta = (float(np.ravel(value)[0]) for value in values)
    return (max(0, math.ceil((limit_ - start) / delta)),) if delta else (-1,)


def _split(node: Node, values: list, output: int) -> np.ndarray:
    return f.apply_split(node, values[0], values[1] if len(values) > 1 else None, output)


_SAME_SHAPE = (
    "Cast Identity Erf Sqrt Relu Gelu Sigmoid Tanh Neg Reciprocal Softmax LogSoftmax IsNaN "
    "Abs Exp Log Not Clip LeakyRelu Softplus Round Floor Ceil LayerNormalization "
    "SimplifiedLayerNormalization RMSNormalization Dropout BatchNormalization HardSigmoid "
    "Elu Selu Sin Cos CumSum Sign Softsign HardSwish Mish Trilu QuantizeLinear DequantizeLinear "
    "FastGelu BiasGelu QuickGelu RotaryEmbedding ScatterND ScatterElements"
).split()
_BROADCAST = (
    "Add Sub Mul Div Pow Where Equal Greater Less GreaterOrEqual LessOrEqual And Or Xor Max Min "
    "Mod BitwiseAnd BitwiseOr"
).split()

#: Value semantics: the weight-folding ops first (their set is what weights may be stored as).
_WEIGHT_VALUES: dict[str, ValueRule] = {
    "Constant": _one(f.fold_constant),
    "Identity": _one(lambda _node, values: values[0]),
    "Cast": _one(f.fold_cast),
    "Transpose": _one(f.fold_transpose),
    "Reshape": _one(f.fold_reshape),
    "Unsqueeze": _one(f.fold_unsqueeze),
    "Squeeze": _one(f.fold_squeeze),
    "Flatten": _one(f.fold_flatten),
    "Concat": _one(f.fold_concat),
    "Gather": _one(f.fold_gather),
    "GatherND": _one(f.fold_gather_nd),
    "Neg": _one(lambda _node, values: np.negative(values[0])),
    "Sqrt": _one(lambda _node, values: np.sqrt(values[0])),
    "Reciprocal": _one(lambda _node, values: np.reciprocal(values[0])),
    "Add": _one(f.binary_fold(np.add)),
    "Sub": _one(f.binary_fold(np.subtract)),
    "Mul": _one(f.binary_fold(np.multiply)),
    "Div": _one(f.binary_fold(f.onnx_divide)),
    "DequantizeLinear": _one(f.fold_dequantize),
    "QuantizeLinear": _one(f.fold_quantize),
}
#: Value semantics used by shape arithmetic and the layout probe only.
_OTHER_VALUES: dict[str, ValueRule] = {
    "Slice": _one(lambda _node, values: f.apply_slice(values[0], *values[1:5])),
    "Split": _split,
    "Equal": _one(f.binary_fold(np.equal)),
    "Where": _one(lambda _node, values: np.where(values[0], values[1], values[2])),
    "Max": _one(lambda _node, values: np.maximum.reduce(values)),
    "Min": _one(lambda _node, values: np.minimum.reduce(values)),
    "Not": _one(lambda _node, values: np.logical_not(values[0])),
    "Abs": _one(lambda _node, values: np.abs(values[0])),
    "Range": _bounded(_range_shape, _one(f.fold_range)),
    "Pow": _one(f.binary_fold(lambda a, b: np.power(a, b).astype(a.dtype))),
    "Floor": _one(lambda _node, values: np.floor(values[0])),
    "Ceil": _one(lambda _node, values: np.ceil(values[0])),
    "Round": _one(lambda _node, values: np.round(values[0])),
    "Greater": _one(f.binary_fold(np.greater)),
    "Less": _one(f.binary_fold(np.less)),
    "GreaterOrEqual": _one(f.binary_fold(np.greater_equal)),
    "LessOrEqual": _one(f.binary_fold(np.less_equal)),
    "And": _one(f.binary_fold(np.logical_and)),
    "Or": _one(f.binary_fold(np.logical_or)),
    "Mod": _one(lambda node, values: (np.fmod if node.attr("fmod", 0) else np.mod)(*values)),
    "ReduceProd": _one(lambda _node, values: np.asarray(np.prod(values[0]), dtype=values[0].dtype)),
    "Expand": _bounded(
        _expand_shape,
        _one(lambda node, values: np.broadcast_to(values[0], _expand_shape(node, values))),
    ),
    "Tile": _bounded(
        _tile_shape,
        _one(lambda _node, values: np.tile(values[0], [int(r) for r in np.ravel(values[1])])),
    ),
    "ConstantOfShape": _bounded(_target_shape, _one(f.fold_constant_of_shape)),
}
#: Layout ops and the operand their replay must evaluate ("" when the attributes suffice).
_LAYOUT = {
    "Transpose": "",
    "Flatten": "",
    "Squeeze": "",
    "Unsqueeze": "",
    "Split": "",
    "Slice": "",
    "Reshape": "Reshape target shape",
    "Expand": "Expand target shape",
    "Tile": "Tile repeats",
    "Gather": "Gather indices",
    "GatherND": "GatherND indices",
}


def _table() -> dict[str, OpSemantics]:
    names = {*_WEIGHT_VALUES, *_OTHER_VALUES, *SHAPE_RULES, *_SAME_SHAPE, *_BROADCAST}
    table = {}
    for op in sorted(names):
        shape = SHAPE_RULES.get(op)
        if shape is None and op in _BROADCAST:
            shape = broadcast_rule
        elif shape is None and op in _SAME_SHAPE:
            shape = same_shape_rule
        table[op] = OpSemantics(
            value=_WEIGHT_VALUES.get(op) or _OTHER_VALUES.get(op),
            shape=shape,
            layout=_LAYOUT.get(op),
            weights=op in _WEIGHT_VALUES,
        )
    return table


OPS: dict[str, OpSemantics] = _table()

FOLDERS: dict[str, Callable[[Node, list], np.ndarray | None]] = {
    op: (lambda rule: lambda node, values: rule(node, values, 0))(semantics.value)
    for op, semantics in OPS.items()
    if semantics.weights and semantics.value is not None
}


def fold(node: Node, values: list, output: int = 0) -> np.ndarray | None:
    """Output ``output`` of ``node`` from its input values (None: no value rule, or too large)."""
    semantics = OPS.get(node.op_type)
    if semantics is None or semantics.value is None:
        return None
    return semantics.value(node, values, output)
