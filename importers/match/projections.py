"""Projections of an attention block: from an attention operand back to its Q/K/V projection, and
from the attention output forward to W_O.

A projection is ``MatMul`` with a constant weight (+ bias ``Add``), ``Gemm``, ``FusedMatMul``, or
``DynamicQuantizeLinear``→``MatMulInteger``; the walk back passes head-split layout ops, scalar
scaling and rotary embeddings, recorded as :class:`Step` s of a :class:`Trace` for the layout
probe (:mod:`importers.match.layout`).
"""

from __future__ import annotations

from dataclasses import dataclass, replace

from importers.graph import Node
from importers.match.results import LinearMatch
from importers.match.walker import MAX_WALK, VALUE_PRESERVING, GraphWalker, RejectError

_LAYOUT_OPS = frozenset(
    "Transpose Reshape Squeeze Unsqueeze Flatten Expand Tile Split Slice Gather "
    "Identity Cast Dropout".split()
)
_MERGE_OPS = frozenset("Transpose Reshape Flatten Squeeze Unsqueeze Identity Cast Dropout".split())
_LINEAR_OPS = frozenset({"MatMul", "Gemm", "FusedMatMul"})


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


class ProjectionFinder(GraphWalker):
    """Find the Q/K/V projections behind the attention operands and W_O after the head merge."""

    # -- Q, K, V: back from the attention operands ------------------------------------------------
    def trace(self, name: str, role: str) -> Trace:
        """Walk back from an attention operand to its projection."""
        steps: list[Step] = []
        scale, rope, start = 1.0, False, name
        for _ in range(MAX_WALK):
            linear = self.linear_ending_at(name, role)
            if linear is not None:
                return Trace(role, linear, tuple(reversed(steps)), scale, rope)
            node = self.producer(name)
            if node is None:
                raise RejectError(
                    f"{role.lower()}_projection_missing",
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
            source = self.rope_source(node) if op == "Add" else None
            if source is not None:
                rope = True
                steps.append(Step(node, source, name, skip=True))
                name = source
                continue
            raise RejectError(
                f"{role.lower()}_projection_missing",
                f"{role} projection not found: walking back from {start!r} reached {op} "
                f"{node.label!r} (expected a MatMul/Gemm with a constant weight)",
                (node.label,),
            )
        raise RejectError(
            f"{role.lower()}_projection_missing", f"{role} projection not found: path too long"
        )

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
                f"{role.lower()}_weight_not_constant",
                f"{role} projection weight is not a constant: {node.op_type} {node.label!r} "
                f"reads its weight from {self.origin(weight_name)}",
                (node.label,),
            )
        transpose_a = bool(node.attr("transA", 0))
        transpose = bool(node.attr("transB", 0)) if node.op_type != "MatMul" else False
        if weight.ndim != 2 or transpose_a:
            raise RejectError(
                f"{role.lower()}_projection_unsupported",
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
            quantize = self.producer(integer.input(0))
            weight = self.const(integer.input(1))
            scales = self.producer(node.input(1 - product_pos))
            if quantize is None or quantize.op_type != "DynamicQuantizeLinear" or weight is None:
                continue
            if (
                scales is None
                or scales.op_type != "Mul"
                or quantize.outputs[1] not in scales.inputs
            ):
                continue
            weight_scale = next(
                operand for operand in scales.inputs if operand != quantize.outputs[1]
            )
            if self.const(weight_scale) is None or weight.ndim != 2:
                continue
            return LinearMatch(
                kind="matmul_integer",
                x=quantize.input(0),
                weight=integer.input(1),
                output=name,
                d_in=int(weight.shape[0]),
                d_out=int(weight.shape[1]),
                weight_scale=weight_scale,
                weight_zero_point=integer.input(3) or None,
                nodes=(quantize.label, integer.label, cast.label, scales.label, node.label),
            )
        return None

    def rope_source(self, node: Node) -> str | None:
        """x for ``Add(Mul(x, cos), Mul(rotate_half(x), sin))`` (rotary embedding), else None."""
        muls = [self.producer(operand) for operand in node.inputs]
        pair = [mul for mul in muls if mul is not None and mul.op_type == "Mul"]
        if len(muls) != 2 or len(pair) != 2:
            return None
        for plain, rotated in (pair, pair[::-1]):
            for x in plain.inputs:
                if any(self.is_rotate_half(operand, x) for operand in rotated.inputs):
                    return x
        return None

    def is_rotate_half(self, name: str, x: str) -> bool:
        node = self.producer(self.strip_casts(name))
        if node is None or node.op_type != "Concat" or len(node.inputs) != 2:
            return False
        negated = False
        for part in node.inputs:
            current = self.producer(part)
            while current is not None and current.op_type in (
                "Neg",
                "Slice",
                "Split",
                "Cast",
                "Identity",
            ):
                negated |= current.op_type == "Neg"
                part = current.input(0)
                current = self.producer(part)
            if part != x:
                return False
        return negated

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
                    "no_output_projection",
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
                "no_output_projection",
                f"output projection not found: the attention output reaches {user.op_type} "
                f"{user.label!r}, not a MatMul with a constant weight",
                (user.label,),
            )
        raise RejectError("no_output_projection", "output projection not found: path too long")

    def output_linear_at(self, user: Node, name: str) -> LinearMatch | None:
        """W_O when ``user`` starts a projection of ``name`` (else None)."""
        end: str | None
        if user.op_type in _LINEAR_OPS and user.input(0) == name:
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
            raise RejectError("no_output_projection", reject.reason, reject.nodes) from None
        if linear is None or linear.x != name:
            raise RejectError(
                "no_output_projection",
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
        extra.append("rotary embedding")
    layout = [f"{step.node.op_type}" for step in trace.steps if not step.skip]
    if layout:
        extra.append("layout " + "/".join(layout))
    tail = f"; {', '.join(extra)}" if extra else ""
    return f"{linear.kind} {', '.join(linear.nodes)} (weight {linear.weight!r}{tail})"


def path_text(trace: Trace) -> str:
    steps = [f"{step.node.op_type} {step.node.label!r}" for step in trace.steps if not step.skip]
    return " -> ".join([f"projection {trace.linear.nodes[-1]!r}", *steps])
