"""Projections of an attention block: from an attention operand back to its Q/K/V projection, and
from the attention output forward to W_O.

A projection is ``MatMul`` with a constant weight (+ bias ``Add``), ``Gemm``, ``FusedMatMul``, or
``DynamicQuantizeLinear``→``MatMulInteger``; the walk back passes head-split layout ops, scalar
scaling and rotary embeddings, recorded as :class:`Step` s of a :class:`Trace` for the layout
probe (:mod:`importers.match.layout`).

Rotary embeddings: ``Add(Mul(x, cos), Mul(rotate(x), sin))`` where ``rotate`` is rotate-half
(``Concat(-x2, x1)``) or GPT-J's interleaved rotate-every-two (``Concat(Unsqueeze(-x[1::2]),
Unsqueeze(x[::2]))`` flattened by a ``Reshape``) is a step from ``x``. A partial rotary embedding
(GPT-NeoX, Phi, Phi-3, GPT-J: only the first ``rotary_dim`` columns of each head are rotated) is a
``Concat`` of the rotated slice and the pass-through slice of the same head-split tensor; it is a
step from that tensor when re-assembling a probe of it through the Concat's pieces (the rotary
``Add`` taken as identity) gives the tensor back unchanged. Both steps are value-preserving for the
probe: W_Q and W_K are the weights before the rotary embedding.

Q/K normalisation (Qwen3's per-head RMSNorm, OLMo-2's over the whole projection): a
norm (:mod:`importers.match.norms`) between the projection and the scores of Q or K is a step from
its input. It moves no entry, so the layout probe passes it unchanged; but the scores are then no
longer bilinear in the stream, which the block's notes say (W_Q and W_K are read before it).

Clipping (OLMo's ``clip_qkv``: ``Clip`` of the Q, K and V projections to constant bounds) is a step
from its input too, recorded on the trace: on Q or K it changes only how A is computed (a note);
on V it makes the update ``X + A clip(X W_V) W_O``, equal to the linear one only while no value
reaches a bound (a departure of the block, :data:`~importers.match.results.DEPARTURES`).
"""

from __future__ import annotations

from dataclasses import dataclass, replace

import numpy as np

from importers.graph import Node
from importers.match.layout_ops import apply_layout
from importers.match.norms import NormMatcher
from importers.match.results import LinearMatch
from importers.match.walker import MAX_WALK, VALUE_PRESERVING, RejectError
from importers.nbits import NBITS

_LAYOUT_OPS = frozenset(
    "Transpose Reshape Squeeze Unsqueeze Flatten Expand Tile Split Slice Gather GatherND "
    "Identity Cast Dropout".split()
)
_MERGE_OPS = frozenset("Transpose Reshape Flatten Squeeze Unsqueeze Identity Cast Dropout".split())
_LINEAR_OPS = frozenset({"MatMul", "Gemm", "FusedMatMul"})
#: Ops followed back from the pieces of a partial rotary embedding's Concat.
_ROTARY_PATH_OPS = frozenset(
    "Slice Cast Identity Transpose Reshape Squeeze Unsqueeze Flatten".split()
)


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


class ProjectionFinder(NormMatcher):
    """Find the Q/K/V projections behind the attention operands and W_O after the head merge."""

    # -- Q, K, V: back from the attention operands ------------------------------------------------
    def trace(self, name: str, role: str) -> Trace:
        """Walk back from an attention operand to its projection."""
        steps: list[Step] = []
        scale, rope, start, rotary, norm_text, clipped = 1.0, False, name, "", "", ""
        width: int | None = None
        for _ in range(MAX_WALK):
            linear = self.linear_ending_at(name, role)
            if linear is not None:
                steps_back = tuple(reversed(steps))
                return Trace(
                    role, linear, steps_back, scale, rope, rotary, width, norm_text, clipped
                )
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
            match = self.rope_match(node) if op == "Add" else None
            if match is not None:
                rope, rotary = True, rotary or f"full {match[1]}"
                steps.append(Step(node, match[0], name, skip=True))
                name = match[0]
                continue
            if op == "RotaryEmbedding":  # ONNX opset 23 / com.microsoft: rotates x in place
                rope, rotary, width = True, *self.rotary_op(node)
                steps.append(Step(node, node.input(0), name, skip=True))
                name = node.input(0)
                continue
            partial = self.partial_rotary(node) if op == "Concat" else None
            if partial is not None:
                rope, (source, rotary, width) = True, partial
                steps.append(Step(node, source, name, skip=True))
                name = source
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
                f"{role.lower()}_projection_missing",
                f"{role} projection not found: walking back from {start!r} reached {op} "
                f"{node.label!r} (expected a MatMul/Gemm with a constant weight)",
                (node.label,),
            )
        raise RejectError(
            f"{role.lower()}_projection_missing", f"{role} projection not found: path too long"
        )

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
                f"{role.lower()}_projection_unsupported",
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

    def rope_match(self, node: Node) -> tuple[str, str] | None:
        """(x, style) for ``Add(Mul(x, cos), Mul(rotate(x), sin))``, else None; style is
        ``"rotate-half"`` or ``"interleaved"`` (GPT-J's rotate-every-two)."""
        if node.op_type != "Add":
            return None
        muls = [self.producer(operand) for operand in node.inputs]
        pair = [mul for mul in muls if mul is not None and mul.op_type == "Mul"]
        if len(muls) != 2 or len(pair) != 2:
            return None
        for plain, rotated in (pair, pair[::-1]):
            for x in plain.inputs:
                for operand in rotated.inputs:
                    style = self.rotation_style(operand, x)
                    if style:
                        return x, style
        return None

    def rotation_style(self, name: str, x: str) -> str:
        """How ``name`` rotates ``x``: ``"rotate-half"`` (``Concat(-x2, x1)``), ``"interleaved"``
        (``Reshape(Concat(Unsqueeze(-x[1::2]), Unsqueeze(x[::2])))``), or "" for neither.

        Where ``x = Transpose(y)`` and the rotation is ``Transpose(rotate(y))`` with the same
        permutation, keeping the last axis (onnxruntime's transpose optimizer moves the head
        transpose past the rotation: ESM), it rotates ``x`` too.
        """
        node = self.producer(self.strip_casts(name))
        if node is not None and node.op_type == "Transpose":
            perm = node.attr("perm")
            before = self.producer(x)
            if (
                perm is None
                or list(perm)[-1] != len(perm) - 1
                or before is None
                or before.op_type != "Transpose"
                or list(before.attr("perm") or []) != list(perm)
            ):
                return ""
            node, x = self.producer(self.strip_casts(node.input(0))), before.input(0)
        style = "rotate-half"
        if node is not None and node.op_type in ("Reshape", "Flatten"):
            node, style = self.producer(self.strip_casts(node.input(0))), "interleaved"
        if node is None or node.op_type != "Concat" or len(node.inputs) != 2:
            return ""
        negated = False
        for part in node.inputs:
            current = self.producer(part)
            while (
                part != x
                and current is not None
                and current.op_type
                in (
                    "Neg",
                    "Slice",
                    "Split",
                    "Cast",
                    "Identity",
                    "Unsqueeze",
                )
            ):
                negated |= current.op_type == "Neg"
                part = current.input(0)
                current = self.producer(part)
            if part != x:
                return ""
        return style if negated else ""

    def rotary_op(self, node: Node) -> tuple[str, int | None]:
        """(style, rotated width or None for all columns) of a ``RotaryEmbedding`` operator.

        ONNX's (opset 23) and onnxruntime's operator rotate the first ``rotary_embedding_dim``
        columns of each head (all when 0) by position, rotate-half or ``interleaved``; either way
        a value-preserving step for the layout probe, so W_Q and W_K are read before it.
        """
        if float(node.attr("scale", 1.0)) != 1.0:
            raise RejectError(
                "rotary_scale",
                f"RotaryEmbedding {node.label!r} also scales by {node.attr('scale')}; expected a "
                f"plain rotation",
                (node.label,),
            )
        style = "interleaved" if int(node.attr("interleaved", 0)) else "rotate-half"
        width = int(node.attr("rotary_embedding_dim", 0))
        if width:
            return f"partial {style} on the first {width} columns of each head (operator)", width
        return f"full {style} (operator)", None

    def partial_rotary(self, node: Node) -> tuple[str, str, int | None] | None:
        """(x, description, columns rotated per head) when the Concat ``node`` re-assembles ``x``
        from slices of it, some passed through a rotary embedding (a partial rotary embedding),
        else None; the width is None when every column is rotated.

        The pieces are followed back through value-preserving layout ops and rotary ``Add`` s to
        their nearest common ancestor; with a probe in its place (the rotary ``Add`` s taken as
        identity), ``x`` is the tensor on the rotated piece's path, nearest the Concat, whose
        probe value is the Concat's (an optimiser may move a Transpose onto one piece only).
        """
        if len(node.inputs) < 2:
            return None
        chains: list[list[tuple[str, bool]]] = []
        for part in node.inputs:
            chain, rotated, name = [], False, part
            for _ in range(MAX_WALK):
                chain.append((name, rotated))
                producer = self.producer(name)
                if producer is None:
                    break
                if producer.op_type in _ROTARY_PATH_OPS and producer.input(0):
                    name = producer.input(0)
                    continue
                match = self.rope_match(producer)
                if match is None:
                    break
                rotated, name = True, match[0]
            chains.append(chain)
        common = [
            name
            for name, _ in chains[0]
            if all(any(name == other for other, _ in chain) for chain in chains[1:])
        ]
        if not common:
            return None
        ancestor = common[0]
        rotated_parts = [
            (part, chain)
            for part, chain in zip(node.inputs, chains, strict=True)
            if dict(chain)[ancestor]
        ]
        if not rotated_parts or len(rotated_parts) == len(node.inputs):
            return None
        shape = self.context.shape(ancestor)
        if not shape:
            return None
        probe = np.arange(int(np.prod(shape)), dtype=np.float64).reshape(shape)
        memo: dict[str, np.ndarray | None] = {}
        try:
            assembled = self.reassemble(node.outputs[0], ancestor, probe, memo)
            if assembled is None:
                return None
            x = ""
            for name, rotated in rotated_parts[0][1]:
                if rotated:
                    value = self.reassemble(name, ancestor, probe, memo)
                    if value is not None and value.shape == assembled.shape:
                        if (value == assembled).all():
                            x = name
                            break
        except (ValueError, TypeError, IndexError):
            return None
        if not x:
            return None
        axis = int(node.attr("axis", 0)) % assembled.ndim
        widths = [memo.get(part) for part, _ in rotated_parts]
        if axis != assembled.ndim - 1 or any(w is None for w in widths):
            return None
        width = sum(int(w.shape[axis]) for w in widths if w is not None)
        styles = {
            match[1]
            for _, chain in rotated_parts
            for name, _ in chain
            if (producer := self.producer(name)) is not None
            and (match := self.rope_match(producer)) is not None
        }
        if width == assembled.shape[-1]:  # Phi-3: the pass-through slice is empty
            return x, f"full {'/'.join(sorted(styles))}", None
        return (
            x,
            f"partial {'/'.join(sorted(styles))} on the first {width} of "
            f"{assembled.shape[-1]} columns of each head",
            width,
        )

    def reassemble(
        self, name: str, x: str, probe: np.ndarray, memo: dict[str, np.ndarray | None]
    ) -> np.ndarray | None:
        """The value of ``name`` when ``x`` is ``probe``, through value-preserving layout ops and
        Concat, a rotary ``Add`` taken as identity; None for any other op."""
        if name == x:
            return probe
        if name in memo:
            return memo[name]
        node = self.producer(name)
        result: np.ndarray | None = None
        if node is not None:
            if node.op_type in ("Cast", "Identity"):
                result = self.reassemble(node.input(0), x, probe, memo)
            elif node.op_type in _ROTARY_PATH_OPS:
                data = self.reassemble(node.input(0), x, probe, memo)
                values = [
                    self.context.value(operand) if operand else None for operand in node.inputs[1:]
                ]
                if data is not None:
                    result = apply_layout(node, data, values, node.outputs.index(name))
            elif node.op_type == "Concat":
                parts = [self.reassemble(part, x, probe, memo) for part in node.inputs]
                if all(part is not None for part in parts):
                    result = np.concatenate(
                        [part for part in parts if part is not None],
                        axis=int(node.attr("axis", 0)),
                    )
            else:
                match = self.rope_match(node)
                if match is not None:
                    result = self.reassemble(match[0], x, probe, memo)
        memo[name] = result
        return result

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
        if user.op_type in (*_LINEAR_OPS, "MatMulNBits") and user.input(0) == name:
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
        extra.append(f"rotary embedding ({trace.rotary})" if trace.rotary else "rotary embedding")
    layout = [f"{step.node.op_type}" for step in trace.steps if not step.skip]
    if layout:
        extra.append("layout " + "/".join(layout))
    tail = f"; {', '.join(extra)}" if extra else ""
    return f"{linear.kind} {', '.join(linear.nodes)} (weight {linear.weight!r}{tail})"


def path_text(trace: Trace) -> str:
    steps = [f"{step.node.op_type} {step.node.label!r}" for step in trace.steps if not step.skip]
    return " -> ".join([f"projection {trace.linear.nodes[-1]!r}", *steps])
