"""The one table of ONNX op semantics the importer knows, and its one evaluator (:func:`fold`).

Three parts of the importer evaluate ONNX ops without onnxruntime, and all three read this table:

- constant folding of weight chains (:class:`~oversmooth.importers.graph.index.GraphIndex`: int8 Cast→Mul,
  DequantizeLinear, QuantizeLinear, Transpose, Reshape of constants; the ops marked ``weights``);
- shape arithmetic (:class:`~oversmooth.importers.graph.shapes.ShapeContext`: an op's ``shape`` rule, else the
  shape of its value, for the ops marked ``value``);
- the numeric layout probe (:mod:`oversmooth.importers.match.layout`): a pure layout op (``layout`` set)
  replayed on a probe array;

and the score-term evaluation (:mod:`oversmooth.importers.match.score_values`) runs any default-domain
op through :func:`fold`, node by node.

An op's value is ONNX's own implementation of it (``onnx.reference``, at the opset the model
imports: :mod:`oversmooth.importers.graph.reference`), except for the few rules written here by hand,
each with the reason the reference does not serve. ``shape`` gives the output shape by arithmetic
alone (:mod:`oversmooth.importers.graph.shape_rules`), and doubles as the size guard: an op whose output
may hold more elements than its inputs has its output shape computed first, and a value beyond the
size limit ``max_elements`` (:mod:`oversmooth.simulator.limits`) is never materialised: it is unknown
(None).

Adding an op: its name in :data:`_REFERENCE` (or a hand-written rule in :data:`_HAND_WRITTEN`, saying
why), in :data:`_WEIGHTS` if weights may be stored through it, in :data:`_LAYOUT` if it only moves
elements; its shape in ``_SAME_SHAPE``, ``_BROADCAST`` or :data:`~.shape_rules.SHAPE_RULES`; in
:data:`_GROWS` if its output may outgrow its inputs.

Public API
----------
OpSemantics, OPS
    The table.
FOLDERS
    The ops folded when reading weights, as ``(node, values) -> value``.
fold
    An op's value of one output, from its input values (None where unknown or too large).
materialisable
    Whether an array of a shape is within the size limit.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Sequence
from dataclasses import dataclass

import numpy as np
import onnx

from oversmooth.importers.graph.node import DEFAULT_DOMAINS, Node
from oversmooth.importers.graph.reference import reference_outputs
from oversmooth.importers.graph.shape_rules import (
    SHAPE_RULES,
    Shape,
    ShapeRule,
    broadcast_rule,
    reshape_target,
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
        Its exact value (``onnx.reference``'s or a hand-written one); None: shape arithmetic and
        weight folding do not evaluate it (:func:`fold` still does, for the score terms).
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


def _reference(node: Node, values: list, output: int) -> np.ndarray | None:
    """The op's value by ``onnx.reference`` at the node's opset (None: it has no implementation)."""
    outputs = reference_outputs(node, values)
    return None if outputs is None else outputs[output]


# -- the value rules onnx.reference does not serve, each with its reason -------------------------
def _reshape(node: Node, values: list, _output: int) -> np.ndarray:
    """Reshape refuses what onnxruntime refuses (the reference takes a -2 as a -1): its target is
    :func:`~.shape_rules.reshape_target`, the arithmetic the shape rule uses too."""
    target = reshape_target(values[0].shape, values[1], allowzero=bool(node.attr("allowzero", 0)))
    return values[0].reshape(target)


def _per_axis(node: Node, x: np.ndarray, *params: np.ndarray | None) -> list[np.ndarray | None]:
    """A (de)quantiser's scale and zero point shaped to broadcast over ``x``: a 1-D parameter of
    more than one element lies along ``axis`` (default 1), a scalar or one-element one everywhere."""
    scale = params[0]
    if scale is None or not (scale.ndim == 1 and scale.size > 1):
        return list(params)
    shape = [1] * x.ndim
    shape[int(node.attr("axis", 1)) % x.ndim] = scale.size
    return [None if value is None else value.reshape(shape) for value in params]


def _dequantize(node: Node, values: list, output: int) -> np.ndarray | None:
    """``DequantizeLinear`` below opset 19, which the reference does not implement (int8 exports
    of opsets 10 to 18 store weights and bias tables so): ``(x − zero_point) · scale`` in the
    scale's dtype, per tensor or per axis (blocked quantisation is not folded)."""
    if node.opset is None or node.opset >= 19:
        return _reference(node, values, output)
    if node.attr("block_size", 0):
        return None
    x = values[0]
    zero_point = values[2] if len(values) > 2 and values[2] is not None else None
    scale, zero_point = _per_axis(node, x, values[1], zero_point)
    assert scale is not None  # a fold has every input value
    shifted = x.astype(np.int32)
    if zero_point is not None:
        shifted = shifted - zero_point.astype(np.int32)
    with np.errstate(over="ignore"):  # a mask's scale: ±inf, as the runtime's float32 gives
        return shifted.astype(scale.dtype) * scale


#: ``QuantizeLinear``'s integer output types by ONNX element type (``output_dtype``; without it
#: and without a zero point the output is uint8).
_QUANTISED_TYPES: dict[int, type] = {
    onnx.TensorProto.UINT8: np.uint8,
    onnx.TensorProto.INT8: np.int8,
    onnx.TensorProto.UINT16: np.uint16,
    onnx.TensorProto.INT16: np.int16,
}


def _quantize(node: Node, values: list, _output: int) -> np.ndarray | None:
    """``QuantizeLinear`` saturates as onnxruntime does; the reference casts to int32 before it
    clips, so +inf and codes beyond 2^31 wrap to the wrong end. ``saturate(round(x / scale) +
    zero_point)``, rounding half to even, per tensor or per axis, to the zero point's integer type
    (8 or 16 bits); None for blocked, 4-bit or float8 outputs, which are not folded.

    A float weight stored with a ``QuantizeLinear``→``DequantizeLinear`` pair (quantisation-aware
    training exports) folds through both to the rounded weight the model multiplies by.
    """
    if node.attr("block_size", 0):
        return None
    x = values[0]
    zero_point = values[2] if len(values) > 2 and values[2] is not None else None
    if zero_point is not None:
        dtype = zero_point.dtype.type
    else:
        dtype = _QUANTISED_TYPES.get(int(node.attr("output_dtype", onnx.TensorProto.UINT8)))
    if dtype not in _QUANTISED_TYPES.values() or not np.issubdtype(x.dtype, np.floating):
        return None
    scale, zero_point = _per_axis(node, x, values[1], zero_point)
    assert scale is not None  # a fold has every input value
    rounded = np.rint(x / scale.astype(x.dtype)).astype(np.float64)
    if zero_point is not None:
        rounded = rounded + zero_point.astype(np.float64)
    limits = np.iinfo(dtype)
    return np.clip(rounded, limits.min, limits.max).astype(dtype)


_HAND_WRITTEN: dict[str, ValueRule] = {
    "Reshape": _reshape,
    "DequantizeLinear": _dequantize,
    "QuantizeLinear": _quantize,
}


# -- the size guard --------------------------------------------------------------------------------
class _Given:
    """The shapes and values of a node's inputs, for its shape rule
    (a :class:`~oversmooth.importers.graph.shape_rules.ShapeLookup`)."""

    def __init__(self, node: Node, values: list) -> None:
        self._values = dict(zip(node.inputs, values, strict=False))

    def need_shape(self, name: str) -> Shape | None:
        value = self._values.get(name)
        return None if value is None else tuple(np.shape(value))

    def need_value(self, name: str) -> np.ndarray | None:
        return self._values.get(name)


def _range_shape(_node: Node, values: list) -> Shape:
    start, limit_, delta = (float(np.ravel(value)[0]) for value in values)
    return (max(0, math.ceil((limit_ - start) / delta)),) if delta else (-1,)


def _output_shape(node: Node, values: list, output: int) -> Shape | None:
    """The output's shape by arithmetic alone, before anything is built (None: it cannot tell).

    Raises
    ------
    ValueError
        The inputs do not fit the op (the shape rule's own refusal, whatever its kind).
    """
    rule = OPS[node.op_type].shape
    try:
        if node.op_type == "Range":  # no shape rule: the shape context takes it from the value
            return _range_shape(node, values)
        return None if rule is None else rule(_Given(node, values), node, output)
    except (TypeError, IndexError, ArithmeticError) as err:  # e.g. a Gather of a scalar
        raise ValueError(f"{node.op_type} {node.label!r}: {err}") from err


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
#: Ops whose output may hold more elements than their inputs together: refused beyond the size
#: limit from their output shape (:func:`_output_shape`), before anything is allocated.
_GROWS = frozenset(
    {"Expand", "Tile", "ConstantOfShape", "Range", "Gather", "GatherND", "MatMul", "Pad", "Resize"}
    | set(_BROADCAST)
)
#: The ops weights may be stored through (folded when a weight is a chain of ops on constants).
_WEIGHTS = frozenset(
    "Constant Identity Cast Transpose Reshape Unsqueeze Squeeze Flatten Concat Gather GatherND "
    "Neg Sqrt Reciprocal Add Sub Mul Div DequantizeLinear QuantizeLinear".split()
)
#: The ops whose value shape arithmetic and the layout probe use: ``onnx.reference``'s unless
#: hand-written (:data:`_HAND_WRITTEN`).
_REFERENCE = frozenset(
    "Constant Identity Cast Transpose Unsqueeze Squeeze Flatten Concat Gather GatherND Neg Sqrt "
    "Reciprocal Add Sub Mul Div Slice Split Equal Where Max Min Not Abs Range Pow Floor Ceil "
    "Round Greater Less GreaterOrEqual LessOrEqual And Or Mod ReduceProd Expand Tile "
    "ConstantOfShape".split()
)
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
    names = {*_REFERENCE, *_HAND_WRITTEN, *SHAPE_RULES, *_SAME_SHAPE, *_BROADCAST}
    table = {}
    for op in sorted(names):
        shape = SHAPE_RULES.get(op)
        if shape is None and op in _BROADCAST:
            shape = broadcast_rule
        elif shape is None and op in _SAME_SHAPE:
            shape = same_shape_rule
        table[op] = OpSemantics(
            value=_HAND_WRITTEN.get(op) or (_reference if op in _REFERENCE else None),
            shape=shape,
            layout=_LAYOUT.get(op),
            weights=op in _WEIGHTS,
        )
    return table


OPS: dict[str, OpSemantics] = _table()


def fold(node: Node, values: list, output: int = 0) -> np.ndarray | None:
    """Output ``output`` of ``node`` from its input values: the table's rule, else (a default-domain
    node) ``onnx.reference``'s, at ``node.opset``.

    Parameters
    ----------
    node : Node
    values : list of ndarray or None
        One per input, in order (None for an omitted optional input).
    output : int
        Which output.

    Returns
    -------
    ndarray or None
        None where no rule or reference implementation gives it, or where an op that may outgrow
        its inputs (:data:`_GROWS`) would build more than ``max_elements`` elements, or its
        output shape cannot be told: that is decided from the output shape before anything is
        allocated.

    Raises
    ------
    ValueError, TypeError, IndexError
        The op refuses its inputs.
    """
    semantics = OPS.get(node.op_type)
    rule = semantics.value if semantics is not None else None
    if rule is None and node.domain not in DEFAULT_DOMAINS:
        return None
    if node.op_type in _GROWS:
        shape = _output_shape(node, values, output)
        if shape is None or not materialisable(shape):  # unknown size: never built unchecked
            return None
    return (rule or _reference)(node, values, output)


def _fold_weight(node: Node, values: list) -> np.ndarray | None:
    """A weight chain's op: its only output, by :func:`fold`."""
    return fold(node, values)


FOLDERS: dict[str, Callable[[Node, list], np.ndarray | None]] = dict.fromkeys(
    sorted(_WEIGHTS), _fold_weight
)
