"""Projections of an attention block: from an attention operand back to its Q/K/V projection, and
from the attention output forward to W_O.

A projection is ``MatMul`` with a constant weight (+ bias ``Add``), ``Gemm``, ``FusedMatMul``,
``DynamicQuantizeLinear``→``MatMulInteger``, or the same product in another form
(:mod:`oversmooth.importers.match.linear_forms`: ``Einsum``, a 1×1 ``Conv`` of a channel-first stream); the walk back passes head-split layout ops, scalar
scaling and rotary embeddings, recorded as :class:`Step` s of a :class:`Trace` for the layout
probe (:mod:`oversmooth.importers.match.layout`).

Rotary embeddings, full, partial or interleaved (:mod:`oversmooth.importers.match.rotary`), are steps from
the tensor they rotate, value-preserving for the probe: W_Q and W_K are the weights before them.

Q/K normalisation (Qwen3's per-head RMSNorm, OLMo-2's over the whole projection): a
norm (:mod:`oversmooth.importers.match.norms`) between the projection and the scores of Q or K is a step from
its input. It moves no entry, so the layout probe passes it unchanged; but the scores are then no
longer bilinear in the stream, which the block's notes say (W_Q and W_K are read before it).

Per-head Q/K norms (StableLM's ``qk_layernorm``): the heads split apart by a ``Split``, each
normalised with its own γ and joined again by a ``Concat`` in order
(:meth:`~oversmooth.importers.match.norms.NormMatcher.split_norms`), are one step from the ``Split`` input,
passed and noted like a norm.

Clipping (OLMo's ``clip_qkv``: ``Clip`` of the Q, K and V projections to constant bounds) is a step
from its input too, recorded on the trace: on Q or K it changes only how A is computed (a note);
on V it makes the update ``X + A clip(X W_V) W_O``, equal to the linear one only while no value
reaches a bound (a departure of the block, :data:`~oversmooth.importers.match.results.DEPARTURES`).

A key/value cache (a decoder exported for generation): K and V are the ``Concat`` of a cache input
(:mod:`oversmooth.importers.graph.kv_cache`) with the new keys or values along the cache's past axis. The
audit runs such a graph at past length 0, where that ``Concat`` is the identity on the new keys:
it is a step from them, checked to be the identity at the probe's sizes (the cache operands empty
along the axis), and recorded on the trace for the block's notes.
"""

from __future__ import annotations

from dataclasses import dataclass, replace

import numpy as np

from oversmooth.importers.graph import Node, ShapeContext
from oversmooth.importers.graph.kv_cache import cache_view
from oversmooth.importers.match.codes import RejectCode, projection_code
from oversmooth.importers.match.limits import MAX_WALK
from oversmooth.importers.match.linear_forms import conv_linear, einsum_linear
from oversmooth.importers.match.norms import NormMatcher
from oversmooth.importers.match.results import LinearMatch
from oversmooth.importers.match.rotary import RotaryMatcher
from oversmooth.importers.match.walker import VALUE_PRESERVING, MatchBasis, RejectError
from oversmooth.importers.nbits import NBITS

_LAYOUT_OPS = frozenset(
    "Transpose Reshape Squeeze Unsqueeze Flatten Expand Tile Split Slice Gather GatherND "
    "Identity Cast Dropout".split()
)
_MERGE_OPS = frozenset("Transpose Reshape Flatten Squeeze Unsqueeze Identity Cast Dropout".split())
_LINEAR_OPS = frozenset({"MatMul", "Gemm", "FusedMatMul"})
#: Projections of other linear forms (:mod:`oversmooth.importers.match.linear_forms`).
_OTHER_FORMS = {"Einsum": einsum_linear, "Conv": conv_linear}


@dataclass(frozen=True)
class Step:
    """One op on the path between a projection and an attention MatMul operand."""

    node: Node
    source: str
    output: str
    skip: bool  # value-preserving for the probe (Cast, scalar scaling, rotary embedding)


@dataclass(frozen=True)
class Trace:
    role: str
    linear: LinearMatch
    steps: tuple[Step, ...]
    scale: float
    rope: bool
    rotary: str = ""  # how the rotary embedding was applied (for notes), "" when there is none
    rotary_width: int | None = None  # columns rotated per head by a partial one; None: all
    norm: str = ""  # the Q/K norm passed (kind and nodes, for notes); "" when there is none
    clipped: str = ""  # the Clip passed (node and bounds, for notes); "" when there is none
    cache: tuple[str, ...] = ()  # the key/value cache inputs concatenated (empty at past length 0)


class ProjectionFinder(NormMatcher):
    """Find the Q/K/V projections behind the attention operands and W_O after the head merge.

    The rotary forms on the way back are recognised by :attr:`rotary`, a component over the same
    index and shape context.
    """

    def __init__(self, basis: MatchBasis, context: ShapeContext) -> None:
        super().__init__(basis, context)
        self.rotary = RotaryMatcher(basis, context)

    # -- Q, K, V: back from the attention operands ------------------------------------------------
    def trace(self, name: str, role: str) -> Trace:
        """Walk back from an attention operand to its projection."""
        steps: list[Step] = []
        scale, rope, start, rotary, norm_text, clipped = 1.0, False, name, "", "", ""
        width: int | None = None
        cache: tuple[str, ...] = ()
        for _ in range(MAX_WALK):
            linear = self.linear_ending_at(name, role)
            if linear is not None:
                steps_back = tuple(reversed(steps))
                return Trace(
                    role, linear, steps_back, scale, rope, rotary, width, norm_text, clipped, cache
                )
            node = self.producer(name)
            if node is None:
                raise RejectError(
                    projection_code(role, "projection_missing"),
                    f"{role} projection not found: walking back from the attention reached "
                    f"{self.origin(name)}",
                )
            op = node.op_type
            if op in _LAYOUT_OPS and node.input(0):
                steps.append(Step(node, node.input(0), name, skip=op in VALUE_PRESERVING))
                name = node.input(0)
                continue
            factor, data = self.scalar_factor(node) if op in ("Mul", "Div") else (None, "")
            if factor is not None:
                scale *= factor
                steps.append(Step(node, data, name, skip=True))
                name = data
                continue
            match = self.rotary.rope_match(node) if op == "Add" else None
            if match is not None:
                rope, rotary = True, rotary or f"full {match[1]}"
                steps.append(Step(node, match[0], name, skip=True))
                name = match[0]
                continue
            if op == "RotaryEmbedding":  # ONNX opset 23 / com.microsoft: rotates x in place
                rope, rotary, width = True, *self.rotary.rotary_op(node)
                steps.append(Step(node, node.input(0), name, skip=True))
                name = node.input(0)
                continue
            cached = self.cache_concat(node) if op == "Concat" and not cache else None
            if cached is not None:
                name, cache = cached
                steps.append(Step(node, name, node.outputs[0], skip=True))
                continue
            partial = self.rotary.partial_rotary(node) if op == "Concat" else None
            if partial is not None:
                rope, (source, rotary, width) = True, partial
                steps.append(Step(node, source, name, skip=True))
                name = source
                continue
            qk_concat = op == "Concat" and role in ("Q", "K") and not norm_text
            per_head = self.split_norms(node) if qk_concat else None
            if per_head is not None:
                norm_text = f"per-head {per_head[1].kind} {node.label!r}"
                steps.append(Step(node, per_head[0], name, skip=True))
                name = per_head[0]
                continue
            bounds = self.clip_bounds(node) if op == "Clip" and not clipped else None
            if bounds is not None:
                clipped = f"Clip {node.label!r} to [{bounds[0]:.6g}, {bounds[1]:.6g}]"
                steps.append(Step(node, node.input(0), name, skip=True))
                name = node.input(0)
                continue
            norm = self.norm_ending_at(name) if role in ("Q", "K") and not norm_text else None
            if norm is not None:
                norm_text = f"{norm.kind} {', '.join(map(repr, norm.nodes))}"
                steps.append(Step(node, norm.input, name, skip=True))
                name = norm.input
                continue
            raise RejectError(
                projection_code(role, "projection_missing"),
                f"{role} projection not found: walking back from {start!r} reached {op} "
                f"{node.label!r} (expected a MatMul/Gemm with a constant weight)",
                (node.label,),
            )
        raise RejectError(
            projection_code(role, "projection_missing"),
            f"{role} projection not found: path too long",
        )

    def cache_concat(self, node: Node) -> tuple[str, tuple[str, ...]] | None:
        """``(new keys or values, cache inputs)`` for a ``Concat`` of key/value cache inputs
        (:func:`~oversmooth.importers.graph.kv_cache.cache_inputs`, along their past axis) with one computed
        tensor, when the caches are empty along the axis at the probe's sizes (past length 0: the
        ``Concat`` is the identity on that tensor); else None."""
        axis = node.attr("axis")
        operands = [operand for operand in node.inputs if operand]
        if not isinstance(axis, int) or len(operands) < 2:
            return None
        caches: list[str] = []
        data: list[str] = []
        for operand in operands:
            view = cache_view(self.index, operand, axis)
            if view is None or self.context.cache_axes.get(view[0]) != view[1]:
                data.append(operand)
                continue
            shape = self.context.shape(operand)
            if shape is None or not -len(shape) <= axis < len(shape) or shape[axis] != 0:
                return None
            caches.append(view[0])
        if len(data) != 1 or not caches:
            return None
        return data[0], tuple(caches)

    def clip_bounds(self, node: Node) -> tuple[float, float] | None:
        """``(low, high)`` of a ``Clip`` whose bounds are constants (an absent one is infinite;
        attributes before opset 11), else None."""
        if len(node.inputs) < 2 and node.attr("min") is None and node.attr("max") is None:
            return None
        bounds = []
        for position, attribute, default in ((1, "min", -np.inf), (2, "max", np.inf)):
            name = node.input(position) if len(node.inputs) > position else ""
            if not name:
                bounds.append(float(node.attr(attribute, default)))
                continue
            value = self.const(name)
            if value is None or value.size != 1:
                return None
            bounds.append(float(value.reshape(())))
        return bounds[0], bounds[1]

    def linear_ending_at(self, name: str, role: str) -> LinearMatch | None:
        """The projection (with its bias Add) whose output is ``name``, if any."""
        node = self.producer(name)
        if node is None:
            return None
        if node.op_type != "Add":
            return self.linear_core(name, role)
        for bias_pos in (1, 0):
            bias, other = node.input(bias_pos), node.input(1 - bias_pos)
            bias_value = self.const(bias)
            if bias_value is None or self.const(other) is not None:
                continue
            core = self.linear_core(other, role)
            if core is not None and core.bias is None and bias_value.size == core.d_out:
                return replace(core, bias=bias, output=name, nodes=(*core.nodes, node.label))
        return None

    def linear_core(self, name: str, role: str) -> LinearMatch | None:
        """MatMul/Gemm/FusedMatMul with a constant weight, or a dynamic-quantisation chain."""
        node = self.producer(name)
        if node is None:
            return None
        if node.op_type in _LINEAR_OPS:
            return self.linear_from_matmul(node, name, role)
        if node.op_type in _OTHER_FORMS:
            weight = self.const(node.input(1))
            if weight is None or self.const(node.input(0)) is not None:
                return None
            return _OTHER_FORMS[node.op_type](node, weight, name)
        if node.op_type == "MatMulNBits":
            return self.linear_from_nbits(node, name, role)
        if node.op_type == "Mul":
            return self.linear_from_integer_matmul(node, name)
        return None

    def linear_from_matmul(self, node: Node, name: str, role: str) -> LinearMatch | None:
        x, weight_name = node.input(0), node.input(1)
        weight = self.const(weight_name)
        if self.const(x) is not None:
            return None
        if weight is None:
            raise RejectError(
                projection_code(role, "weight_not_constant"),
                f"{role} projection weight is not a constant: {node.op_type} {node.label!r} "
                f"reads its weight from {self.origin(weight_name)}",
                (node.label,),
            )
        transpose_a = bool(node.attr("transA", 0))
        transpose = bool(node.attr("transB", 0)) if node.op_type != "MatMul" else False
        if weight.ndim != 2 or transpose_a:
            raise RejectError(
                projection_code(role, "projection_unsupported"),
                f"{role} projection {node.op_type} {node.label!r} has a weight of shape "
                f"{weight.shape}{' and transA=1' if transpose_a else ''}; expected a 2-D weight",
                (node.label,),
            )
        d_in, d_out = (weight.shape[1], weight.shape[0]) if transpose else weight.shape
        bias, beta = None, 1.0
        if node.op_type == "Gemm" and node.input(2):
            bias, beta = node.input(2), float(node.attr("beta", 1.0))
        return LinearMatch(
            kind={"MatMul": "matmul", "Gemm": "gemm", "FusedMatMul": "fused_matmul"}[node.op_type],
            x=x,
            weight=weight_name,
            output=name,
            d_in=int(d_in),
            d_out=int(d_out),
            bias=bias,
            transpose=transpose,
            alpha=float(node.attr("alpha", 1.0)),
            beta=beta,
            nodes=(node.label,),
        )

    def linear_from_nbits(self, node: Node, name: str, role: str) -> LinearMatch | None:
        """onnxruntime's block-quantised ``MatMulNBits(x, B, scales, zero_points?, g_idx?, bias?)``."""
        x = node.input(0)
        if self.const(x) is not None:
            return None
        constants = [operand for operand in node.inputs[1:] if operand]
        missing = next((operand for operand in constants if self.const(operand) is None), None)
        problem = (
            f"reads {self.origin(missing)} instead of a constant"
            if missing
            else "has a g_idx input (act-order quantisation), which is not read"
            if node.input(4)
            else f"has {node.attr('bits', 4)}-bit codes; expected one of {NBITS}"
            if int(node.attr("bits", 4)) not in NBITS
            else ""
        )
        if problem:
            raise RejectError(
                projection_code(role, "projection_unsupported"),
                f"{role} projection MatMulNBits {node.label!r} {problem}",
                (node.label,),
            )
        return LinearMatch(
            kind="matmul_nbits",
            x=x,
            weight=node.input(1),
            output=name,
            d_in=int(node.attr("K")),
            d_out=int(node.attr("N")),
            bias=node.input(5) or None,
            weight_scale=node.input(2),
            weight_zero_point=node.input(3) or None,
            bits=int(node.attr("bits", 4)),
            block_size=int(node.attr("block_size")),
            nodes=(node.label,),
        )

    def linear_from_integer_matmul(self, node: Node, name: str) -> LinearMatch | None:
        """``Mul(Cast(MatMulInteger(DQL(x), W_q, x_zp, w_zp)), Mul(x_scale, w_scale))``."""
        for product_pos in (0, 1):
            cast = self.producer(node.input(product_pos))
            integer = (
                self.producer(cast.input(0))
                if cast is not None and cast.op_type == "Cast"
                else None
            )
            if cast is None or integer is None or integer.op_type != "MatMulInteger":
                continue
            source = self.quantized_source(integer)
            weight = self.const(integer.input(1))
            scales = self.producer(node.input(1 - product_pos))
            if source is None or weight is None:
                continue
            x, x_scale, quantize = source
            if scales is None or scales.op_type != "Mul" or x_scale not in scales.inputs:
                continue
            weight_scale = next(operand for operand in scales.inputs if operand != x_scale)
            if self.const(weight_scale) is None or weight.ndim != 2:
                continue
            return LinearMatch(
                kind="matmul_integer",
                x=x,
                weight=integer.input(1),
                output=name,
                d_in=int(weight.shape[0]),
                d_out=int(weight.shape[1]),
                weight_scale=weight_scale,
                weight_zero_point=integer.input(3) or None,
                nodes=(quantize.label, integer.label, cast.label, scales.label, node.label),
            )
        return None

    def quantized_source(self, integer: Node) -> tuple[str, str, Node] | None:
        """(float x, its scale, the node relating them) for the quantised activation of a
        ``MatMulInteger``, else None.

        Usually ``DynamicQuantizeLinear(x)`` quantises it; where the quantiser also quantised
        the embedding table (OLMo-2's first block reads the embeddings without a norm), the
        gathered codes feed the ``MatMulInteger`` directly and the float stream is their
        ``DequantizeLinear`` with the same zero point and a one-element scale.
        """
        codes = integer.input(0)
        quantize = self.producer(codes)
        if quantize is not None and quantize.op_type == "DynamicQuantizeLinear":
            return quantize.input(0), quantize.outputs[1], quantize
        zero_point = integer.input(2)
        for user in self.consumers(codes):
            if user.op_type != "DequantizeLinear" or user.input(0) != codes:
                continue
            scale = self.const(user.input(1))
            if user.input(2) == zero_point and scale is not None and scale.size == 1:
                return user.outputs[0], user.input(1), user
        return None

    # -- W_O: forward from the attention output ----------------------------------------------------
    def find_output_linear(self, name: str) -> tuple[LinearMatch, tuple[Step, ...]]:
        steps: list[Step] = []
        for _ in range(MAX_WALK):
            users = self.consumers(name)
            if len(users) != 1:
                where = (
                    ", ".join(f"{node.op_type} {node.label!r}" for node in users)
                    if users
                    else ("a graph output" if name in self.index.graph_outputs else "no node")
                )
                raise RejectError(
                    RejectCode.NO_OUTPUT_PROJECTION,
                    f"output projection not found: the attention output {name!r} goes to {where}",
                    tuple(node.label for node in users),
                )
            user = users[0]
            linear = self.output_linear_at(user, name)
            if linear is not None:
                return linear, tuple(steps)
            if user.op_type in _MERGE_OPS and user.input(0) == name:
                steps.append(
                    Step(user, name, user.outputs[0], skip=user.op_type in VALUE_PRESERVING)
                )
                name = user.outputs[0]
                continue
            raise RejectError(
                RejectCode.NO_OUTPUT_PROJECTION,
                f"output projection not found: the attention output reaches {user.op_type} "
                f"{user.label!r}, not a MatMul with a constant weight",
                (user.label,),
            )
        raise RejectError(
            RejectCode.NO_OUTPUT_PROJECTION, "output projection not found: path too long"
        )

    def output_linear_at(self, user: Node, name: str) -> LinearMatch | None:
        """W_O when ``user`` starts a projection of ``name`` (else None)."""
        end: str | None
        if user.op_type in (*_LINEAR_OPS, *_OTHER_FORMS, "MatMulNBits") and user.input(0) == name:
            end = user.outputs[0]
        elif user.op_type == "DynamicQuantizeLinear" and user.input(0) == name:
            end = self.integer_matmul_end(user)
            if end is None:
                return None
        else:
            return None
        try:
            linear = self.linear_ending_at(self.bias_after(end), "output")
        except RejectError as reject:
            raise RejectError(
                RejectCode.NO_OUTPUT_PROJECTION, reject.reason, reject.nodes
            ) from None
        if linear is None or linear.x != name:
            raise RejectError(
                RejectCode.NO_OUTPUT_PROJECTION,
                f"output projection not found: {user.op_type} {user.label!r} does not multiply "
                f"the attention output by a constant weight",
                (user.label,),
            )
        return linear

    def integer_matmul_end(self, quantize: Node) -> str | None:
        chain = [("MatMulInteger", quantize.outputs[0]), ("Cast", None), ("Mul", None)]
        name = quantize.outputs[0]
        for op, _ in chain:
            users = [node for node in self.consumers(name) if node.op_type == op]
            if len(users) != 1:
                return None
            name = users[0].outputs[0]
        return name

    def bias_after(self, name: str) -> str:
        users = self.consumers(name)
        if len(users) == 1 and users[0].op_type == "Add":
            other = next((operand for operand in users[0].inputs if operand != name), "")
            if self.const(other) is not None:
                return users[0].outputs[0]
        return name


def describe_linear(trace: Trace) -> str:
    linear = trace.linear
    extra = []
    if trace.scale != 1.0:
        extra.append(f"scaled by {trace.scale:.6g}")
    if trace.rope:
        extra.append(f"rotary embedding ({trace.rotary})" if trace.rotary else "rotary embedding")
    layout = [f"{step.node.op_type}" for step in trace.steps if not step.skip]
    if layout:
        extra.append("layout " + "/".join(layout))
    if trace.cache:
        extra.append(f"concatenated after the empty KV cache {', '.join(map(repr, trace.cache))}")
    tail = f"; {', '.join(extra)}" if extra else ""
    return f"{linear.kind} {', '.join(linear.nodes)} (weight {linear.weight!r}{tail})"


def path_text(trace: Trace) -> str:
    steps = [f"{step.node.op_type} {step.node.label!r}" for step in trace.steps if not step.skip]
    return " -> ".join([f"projection {trace.linear.nodes[-1]!r}", *steps])
