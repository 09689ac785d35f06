"""Quantised and fused operators expanded into what their definitions say they compute.

``onnxruntime.quantization.quantize_static`` with ``QuantFormat.QOperator`` (and older static
quantisers) writes every quantised product, sum and Softmax as one integer operator —
``QLinearMatMul``, ``QLinearConv`` (ONNX), ``QLinearAdd``, ``QLinearMul``, ``QLinearSoftmax``,
``QGemm``, ``QLinearSigmoid``, ``QLinearLeakyRelu``, ``QLinearConcat``, ``QLinearAveragePool``,
``QLinearGlobalAveragePool`` (onnxruntime's ``com.microsoft`` domain) — and moves the integer
codes between them through ``Reshape``/``Transpose``. No float tensor of the residual stream or
of the attention probabilities exists in such a graph, and the matcher knows none of these
operators: each becomes ``DequantizeLinear`` of each integer input → the float operator →
``QuantizeLinear`` of the result.

The same table holds three more forms. onnxruntime's optimizer, saving a dynamically quantised
graph, fuses its products into ``DynamicQuantizeMatMul`` and ``MatMulIntegerToFloat``: expanded
back into the ``DynamicQuantizeLinear`` → ``MatMulInteger`` → ``Cast`` → ``Mul`` (→ bias
``Add``) chain they fuse, the form the matcher reads. ``quantize_dynamic`` of an optimizer-fused
graph writes ``QAttention``: expanded into the ``Attention`` of the dequantised input and weights,
which :mod:`oversmooth.importers.graph.defuse` then rewrites. And that session optimizer writes Q·Kᵀ with its
scale as ``FusedMatMul``: a product of two activations is expanded into ``Transpose`` →
``MatMul`` → ``Mul`` (a projection by a constant weight stays the ``FusedMatMul`` the matcher
reads).

Each one is rewritten (:func:`expand_quantized_operators`) into the standard ONNX its definition
states: each integer input dequantised with its own scale and zero point (per tensor, or per
output channel for a weight), the float operator with the node's attributes, and the result
quantised to the node's output scale and zero point under the node's own output name, so every
integer consumer is unchanged. onnxruntime runs the rewritten graph (as it runs a defused
attention operator, :mod:`oversmooth.importers.graph.defuse`): the graph then is in QDQ form, which the
matcher reads through (:mod:`oversmooth.importers.graph.quantized`), and the audit fetches the float sums and
probabilities the rewrite names. Against the integer kernels the rewrite is exact up to the
rounding of the float product before requantisation (onnxruntime requantises an exact integer
accumulator; the rewrite a float32 product), which moves a few codes by one step.

A node whose output scale or weight scale is not a constant, whose per-axis scale lies where the
definition does not put one, or whose channels are last (onnxruntime's ``channels_last``) is left
as it is, and the matcher reports what it meets there; an input scale computed at run time (a
``DynamicQuantizeLinear``'s) is the one scale it is.

Public API
----------
Expansion
    The rewritten model and the count of operators expanded, by type.
expand_quantized_operators
    Rewrite every quantised or fused operator of a model.
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import numpy as np
import onnx

from oversmooth.importers.graph.defuse_parts import (
    DeclinedError,
    Emitter,
    Facts,
    refuse,
    with_replaced_nodes,
)
from oversmooth.importers.graph.index import GraphIndex
from oversmooth.importers.graph.node import DEFAULT_DOMAINS, Node

__all__ = ["Expansion", "expand_quantized_operators"]

#: An operator's rewrite: (node, facts, emitter) → nothing (the emitter holds the nodes).
_Rewrite = Callable[[Node, Facts, Emitter], None]


@dataclass(frozen=True)
class Expansion:
    """The model with its quantised and fused operators expanded (None: it has none that expand),
    and how many of each type were expanded, as ``(op type, count)`` in first-seen order."""

    proto: onnx.ModelProto | None
    expanded: tuple[tuple[str, int], ...] = ()


def expand_quantized_operators(proto: onnx.ModelProto, index: GraphIndex) -> Expansion:
    """Rewrite every quantised or fused operator of ``proto``'s top-level graph into the standard
    ops it is defined as (see the module docstring).

    Parameters
    ----------
    proto : onnx.ModelProto
        Left unchanged.
    index : GraphIndex
        The index of ``proto.graph``.

    Returns
    -------
    Expansion
    """
    if not any(_key(node) in _REWRITES for node in index.nodes):
        return Expansion(None)
    facts = Facts(proto, index)
    replaced: dict[int, Emitter] = {}
    counts: Counter[str] = Counter()
    for node in index.nodes:
        rewrite = _REWRITES.get(_key(node))
        if rewrite is None:
            continue
        emitter = Emitter(f"{node.label}/expanded", np.dtype(np.float32))
        try:
            rewrite(node, facts, emitter)
        except DeclinedError:
            continue
        replaced[node.position] = emitter
        counts[node.op_type] += 1
    if not replaced:
        return Expansion(None)
    return Expansion(with_replaced_nodes(proto, index, replaced), tuple(counts.items()))


def _key(node: Node) -> tuple[str, str]:
    return ("" if node.domain in DEFAULT_DOMAINS else node.domain, node.op_type)


# -- the pieces --------------------------------------------------------------------------------
def _scale(facts: Facts, name: str, what: str) -> np.ndarray:
    value = facts.constant(name)
    refuse(value is None, f"with a {what} scale that is not a constant")
    assert value is not None
    return value


def _dequantized(
    node: Node,
    facts: Facts,
    em: Emitter,
    first: int,
    *,
    axis: int | None = None,
) -> str:
    """``DequantizeLinear`` of the node's input ``first`` with the scale and zero point after it
    (:func:`_dequantized_names`)."""
    return _dequantized_names(
        facts, em, node.input(first), node.input(first + 1), node.input(first + 2), axis=axis
    )


def _dequantized_names(
    facts: Facts, em: Emitter, codes: str, scale: str, zero: str, *, axis: int | None = None
) -> str:
    """``DequantizeLinear(codes, scale, zero)``; a constant scale of more than one element only
    where ``axis`` says where it lies, a scale computed at run time (a ``DynamicQuantizeLinear``'s)
    taken as the one scale it is."""
    value = facts.constant(scale)  # computed at run time (a dynamic quantiser's): one scale
    per_axis = value is not None and value.size > 1
    refuse(per_axis and axis is None, "with a per-axis scale where one scale is defined")
    saturated = _saturated_constant(facts, codes, scale, zero, axis if per_axis else None)
    if saturated is not None:
        return em.const("dequantized", saturated)
    inputs = [codes, scale, *([zero] if zero else [])]
    attributes: dict[str, Any] = {"axis": axis} if per_axis else {}
    return em.op("DequantizeLinear", inputs, **attributes)


def _saturated_constant(
    facts: Facts, codes: str, scale: str, zero: str, axis: int | None
) -> np.ndarray | None:
    """A constant operand whose float32 dequantisation overflows, dequantised exactly (float64)
    and saturated to the largest float32; None for every other operand.

    The integer kernels never form the dequantised operand. A quantiser covering a mask's
    ``finfo.min`` rounds its scale so that ``−127 · scale`` lies a hair past the float32 range:
    dequantised in float32 it is −inf, and ``0 · −inf`` = NaN on every kept token, which
    ``QuantizeLinear`` writes as the lowest code — a mask on every token. Saturated, it is
    ``finfo.min`` and the kept tokens stay 0, as in the kernel.
    """
    values = [facts.constant(name) if name else None for name in (codes, scale, zero)]
    if values[0] is None or values[1] is None:
        return None
    quantised, step = values[0].astype(np.float64), values[1].astype(np.float64)
    offset = np.zeros(()) if values[2] is None else values[2].astype(np.float64)
    if axis is not None:
        shape = [1] * quantised.ndim
        shape[axis] = step.size
        step, offset = step.reshape(shape), offset.reshape(shape)
    exact = (quantised - offset) * step
    largest = float(np.finfo(np.float32).max)
    if np.all(np.abs(exact) <= largest):
        return None
    return np.clip(exact, -largest, largest).astype(np.float32)


def _quantized(node: Node, facts: Facts, em: Emitter, value: str, first: int, like: str) -> None:
    """``QuantizeLinear`` of ``value`` with the node's output scale and zero point (inputs
    ``first``, ``first + 1``) into the node's output; an absent zero point is 0 of ``like``'s
    integer type (the output has its input's type)."""
    scale, zero = node.input(first), node.input(first + 1)
    refuse(_scale(facts, scale, "output").size != 1, "with a per-axis output scale")
    if not zero:
        kind = facts.elem_type(like)
        refuse(kind is None, "with an output zero point of unknown type")
        assert kind is not None
        zero = em.const("zero_point", np.zeros((), onnx.helper.tensor_dtype_to_np_dtype(kind)))
    em.op("QuantizeLinear", [value, scale, zero], output=node.outputs[0])


def _attributes(node: Node, *dropped: str) -> dict[str, Any]:
    return {
        attribute.name: onnx.helper.get_attribute_value(attribute)
        for attribute in node.proto.attribute
        if attribute.name not in dropped
    }


def _bias(node: Node, facts: Facts, em: Emitter, position: int, scales: tuple[int, int]) -> str:
    """An int32 bias at ``position`` dequantised with the product of the two input scales (its
    definition's scale, zero point 0); "" when absent."""
    bias = node.input(position)
    if not bias:
        return ""
    product = em.op("Mul", [node.input(scales[0]), node.input(scales[1])])
    return em.op("DequantizeLinear", [bias, product], axis=0)


# -- the operators -----------------------------------------------------------------------------
def _qlinear_matmul(node: Node, facts: Facts, em: Emitter) -> None:
    """``QLinearMatMul(a, a_s, a_zp, b, b_s, b_zp, y_s, y_zp)``: b's scale per column (last
    axis) or one."""
    a = _dequantized(node, facts, em, 0)
    b = _dequantized(node, facts, em, 3, axis=-1)
    _quantized(node, facts, em, em.op("MatMul", [a, b]), 6, node.input(0))


def _qlinear_binary(op_type: str) -> _Rewrite:
    """``QLinear<op>(A, A_s, A_zp, B, B_s, B_zp, C_s, C_zp)`` (Add, Mul)."""

    def rewrite(node: Node, facts: Facts, em: Emitter) -> None:
        a, b = _dequantized(node, facts, em, 0), _dequantized(node, facts, em, 3)
        _quantized(node, facts, em, em.op(op_type, [a, b]), 6, node.input(0))

    return rewrite


def _qlinear_unary(op_type: str, *dropped: str) -> _Rewrite:
    """``QLinear<op>(X, X_s, X_zp, Y_s, Y_zp)`` with the float op's attributes (Sigmoid,
    LeakyRelu, AveragePool, GlobalAveragePool, Softmax)."""

    def rewrite(node: Node, facts: Facts, em: Emitter) -> None:
        refuse(node.attr("channels_last", 0), "with channels last")
        x = _dequantized(node, facts, em, 0)
        attributes = _attributes(node, "channels_last", *dropped)
        _quantized(node, facts, em, em.op(op_type, [x], **attributes), 3, node.input(0))

    return rewrite


def _qlinear_softmax(node: Node, facts: Facts, em: Emitter) -> None:
    """``QLinearSoftmax(X, X_s, X_zp, Y_s, Y_zp)``, attributes ``axis`` and ``opset`` (the
    Softmax definition it follows: before 13 one softmax over all axes from ``axis`` on, which
    equals the later one only on the last axis)."""
    axis = int(node.attr("axis", -1))
    refuse(int(node.attr("opset", 13)) < 13 and axis != -1, "with a pre-13 Softmax axis")
    _qlinear_unary("Softmax", "opset")(node, facts, em)


def _qlinear_concat(node: Node, facts: Facts, em: Emitter) -> None:
    """``QLinearConcat(Y_s, Y_zp, (X_i, X_i_s, X_i_zp)...)``, attribute ``axis``."""
    parts = [_dequantized(node, facts, em, first) for first in range(2, len(node.inputs), 3)]
    joined = em.op("Concat", parts, axis=int(node.attr("axis")))
    _quantized(node, facts, em, joined, 0, node.input(2))


def _qgemm(node: Node, facts: Facts, em: Emitter) -> None:
    """``QGemm(A, a_s, a_zp, B, b_s, b_zp, C, y_s, y_zp)``: ``alpha``, ``transA``, ``transB``;
    b's scale per output column or one; without ``y_s`` the output is float. The int32 bias C
    joins the integer accumulator, so ``alpha`` scales it too: ``Y = alpha · (A'B' + a_s b_s C)``,
    a ``Gemm`` with ``beta = alpha`` of C dequantised at scale ``a_s · b_s``."""
    a = _dequantized(node, facts, em, 0)
    b = _dequantized(node, facts, em, 3, axis=0 if node.attr("transB", 0) else 1)
    bias = _bias(node, facts, em, 6, (1, 4))
    attributes = _attributes(node) | {"beta": float(node.attr("alpha", 1.0))}
    if not node.input(7):
        em.op("Gemm", [a, b, *([bias] if bias else [])], output=node.outputs[0], **attributes)
        return
    product = em.op("Gemm", [a, b, *([bias] if bias else [])], **attributes)
    _quantized(node, facts, em, product, 7, node.input(0))


def _qlinear_conv(node: Node, facts: Facts, em: Emitter) -> None:
    """``QLinearConv(x, x_s, x_zp, w, w_s, w_zp, y_s, y_zp, B)``: w's scale per output channel
    (axis 0) or one; an int32 bias B at scale ``x_s · w_s``."""
    x = _dequantized(node, facts, em, 0)
    w = _dequantized(node, facts, em, 3, axis=0)
    bias = _bias(node, facts, em, 8, (1, 4))
    conv = em.op("Conv", [x, w, *([bias] if bias else [])], **_attributes(node))
    _quantized(node, facts, em, conv, 6, node.input(0))


def _integer_product(
    node: Node, em: Emitter, codes: tuple[str, str, str], weight: tuple[str, str, str], bias: str
) -> None:
    """``Mul(Cast(MatMulInteger(A, B, a_zp, b_zp)), Mul(a_s, b_s))`` (+ bias) into the node's
    output: the float product of quantised activations and weights as ``quantize_dynamic``
    writes it. ``codes`` and ``weight`` are (codes, scale, zero point; "" when absent)."""
    (a, a_scale, a_zero), (b, b_scale, b_zero) = codes, weight
    zeros = [a_zero, b_zero] if b_zero else ([a_zero] if a_zero else [])
    integer = em.op("MatMulInteger", [a, b, *zeros])
    product = em.op("Cast", [integer], to=onnx.TensorProto.FLOAT)
    scaled = em.op(
        "Mul", [product, em.op("Mul", [a_scale, b_scale])], output="" if bias else node.outputs[0]
    )
    if bias:
        em.op("Add", [scaled, bias], output=node.outputs[0])


def _dynamic_quantize_matmul(node: Node, facts: Facts, em: Emitter) -> None:
    """``DynamicQuantizeMatMul(A, B, b_s, b_zp, bias)``: A quantised per tensor at run time
    (``DynamicQuantizeLinear``), then the integer product, scaled, plus the bias."""
    _scale(facts, node.input(2), "weight")
    quantize = em.fresh("DynamicQuantizeLinear")
    codes = (f"{quantize}_codes", f"{quantize}_scale", f"{quantize}_zero_point")
    em.nodes.append(
        onnx.helper.make_node("DynamicQuantizeLinear", [node.input(0)], list(codes), name=quantize)
    )
    weight = (node.input(1), node.input(2), node.input(3))
    _integer_product(node, em, codes, weight, node.input(4))


def _matmul_integer_to_float(node: Node, facts: Facts, em: Emitter) -> None:
    """``MatMulIntegerToFloat(A, B, a_s, b_s, a_zp, b_zp, bias)``: the integer product of two
    quantised operands, scaled by ``a_s · b_s``, plus the bias."""
    _scale(facts, node.input(3), "weight")
    codes = (node.input(0), node.input(2), node.input(4))
    weight = (node.input(1), node.input(3), node.input(5))
    _integer_product(node, em, codes, weight, node.input(6))


def _qattention(node: Node, facts: Facts, em: Emitter) -> None:
    """``QAttention(input, weight, bias, input_scale, weight_scale, mask_index, input_zp,
    weight_zp, past)``: onnxruntime's ``Attention`` of the dequantised input and packed weights
    (a weight scale per column or one), its attributes and outputs unchanged — which
    :mod:`oversmooth.importers.graph.defuse` then rewrites like any ``Attention``."""
    x = _dequantized_names(facts, em, node.input(0), node.input(3), node.input(6))
    weight = _dequantized_names(facts, em, node.input(1), node.input(4), node.input(7), axis=1)
    inputs = [x, weight, node.input(2), node.input(5), node.input(8)]
    while inputs and not inputs[-1]:
        inputs.pop()
    em.nodes.append(
        onnx.helper.make_node(
            "Attention",
            inputs,
            node.outputs,
            name=em.fresh("Attention"),
            domain="com.microsoft",
            **_attributes(node),
        )
    )


def _fused_matmul(node: Node, facts: Facts, em: Emitter) -> None:
    """``FusedMatMul(A, B)`` of two activations: ``alpha · op(A) op(B)``, each operand's last two
    axes swapped where ``transA``/``transB`` say (onnxruntime's session optimizer writes Q·Kᵀ so,
    the scale in ``alpha``); a product with a constant weight (a projection, which the matcher
    reads as it is) and the batch-axis transposes are left fused."""
    refuse(node.attr("transBatchA", 0) or node.attr("transBatchB", 0), "with batch transposes")
    refuse(  # a projection: the matcher reads FusedMatMul with a constant weight as it is
        any(facts.constant(node.input(k)) is not None for k in (0, 1)), "with a constant operand"
    )
    operands = []
    for position, flag in ((0, "transA"), (1, "transB")):
        name = node.input(position)
        if node.attr(flag, 0):
            shape = facts.shape(name)
            refuse(shape is None or len(shape) < 2, "with an operand of unknown rank")
            assert shape is not None
            perm = [*range(len(shape) - 2), len(shape) - 1, len(shape) - 2]
            name = em.op("Transpose", [name], perm=perm)
        operands.append(name)
    alpha = float(node.attr("alpha", 1.0))
    if alpha == 1.0:
        em.op("MatMul", operands, output=node.outputs[0])
        return
    product = em.op("MatMul", operands)
    em.op(
        "Mul", [product, em.const("alpha", np.asarray(alpha, np.float32))], output=node.outputs[0]
    )


_MS = "com.microsoft"
_REWRITES: dict[tuple[str, str], _Rewrite] = {
    ("", "QLinearMatMul"): _qlinear_matmul,
    ("", "QLinearConv"): _qlinear_conv,
    (_MS, "QLinearAdd"): _qlinear_binary("Add"),
    (_MS, "QLinearMul"): _qlinear_binary("Mul"),
    (_MS, "QLinearSoftmax"): _qlinear_softmax,
    (_MS, "QLinearSigmoid"): _qlinear_unary("Sigmoid"),
    (_MS, "QLinearLeakyRelu"): _qlinear_unary("LeakyRelu"),
    (_MS, "QLinearAveragePool"): _qlinear_unary("AveragePool"),
    (_MS, "QLinearGlobalAveragePool"): _qlinear_unary("GlobalAveragePool"),
    (_MS, "QLinearConcat"): _qlinear_concat,
    (_MS, "QGemm"): _qgemm,
    (_MS, "DynamicQuantizeMatMul"): _dynamic_quantize_matmul,
    (_MS, "MatMulIntegerToFloat"): _matmul_integer_to_float,
    (_MS, "QAttention"): _qattention,
    (_MS, "FusedMatMul"): _fused_matmul,
}
