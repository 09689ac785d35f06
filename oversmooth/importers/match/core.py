"""The Softmax-anchored attention walk: from one Softmax to a whole :class:`AttentionBlock`.

Back from the Softmax to the QKᵀ ``MatMul``, forward to the ·V ``MatMul``, then the projections
(:mod:`oversmooth.importers.match.projections`), the head layout (:mod:`oversmooth.importers.match.layout`) and the residual
stream and norm (:mod:`oversmooth.importers.match.norms`); :func:`oversmooth.importers.match.find_attention_blocks` runs it
over every Softmax.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import numpy as np

from oversmooth.importers.graph import Node
from oversmooth.importers.match.codes import RejectCode
from oversmooth.importers.match.layout import Layout, LayoutProbe
from oversmooth.importers.match.limits import VALUE_MATMUL_STEPS
from oversmooth.importers.match.projections import ProjectionFinder, Trace, describe_linear
from oversmooth.importers.match.results import AttentionBlock, LinearMatch, RotaryForm
from oversmooth.importers.match.scores import ScoreBias, ScoreMatcher
from oversmooth.importers.match.stream import StreamMatcher
from oversmooth.importers.match.walker import VALUE_PRESERVING, GraphWalker, MatchBasis, RejectError

#: Relative mismatch tolerated between the score scale found and 1/sqrt(d_head).
SCALE_RTOL = 1e-3
_PROBABILITY_VIEWS = frozenset({"Reshape", "Squeeze", "Unsqueeze", "Flatten"})


@dataclass(frozen=True)
class ValuePath:
    """The walk forward from a Softmax to the ·V MatMul.

    ``passed`` describes each step on the way (guards, views, the gated mix); ``attention`` is A,
    the tensor that weights V: the Softmax output, or a gated mix of it (:meth:`Matcher.gated_mix`),
    whose description is ``mix``.
    """

    matmul: Node
    passed: tuple[str, ...]
    attention: str
    mix: str | None


class Matcher(GraphWalker):
    """One match attempt: one Softmax candidate at one pair of probe sizes.

    ``basis`` is shared by every attempt over the graph at its probe sizes (the sizes assumed for
    symbolic dimensions); the shape context, with every shape the attempt pins, is this attempt's
    own and is dropped with it. The parts of the walk are components over that basis and context:
    the score sum (:attr:`scores`), the projections and norms behind the operands
    (:attr:`projections`, with its :attr:`rotary` forms), the head-layout probe (:attr:`layout`)
    and the residual stream (:attr:`stream`).
    """

    def __init__(self, basis: MatchBasis) -> None:
        context = basis.shapes.context()
        super().__init__(basis, context)
        self.projections = ProjectionFinder(basis, context)
        self.rotary = self.projections.rotary
        self.scores = ScoreMatcher(basis, context, self.projections)
        self.layout = LayoutProbe(basis, context)
        self.stream = StreamMatcher(basis, context)

    # -- the whole block --------------------------------------------------------------------------
    def match(self, softmax: Node, index: int) -> AttentionBlock:
        score_sum, (scores, score_scale, score_nodes) = self.scores.scores_of(softmax)
        value_path = self.value_matmul(softmax)
        value_matmul, guard = value_path.matmul, value_path.passed
        q = self.projections.trace(scores.input(0), "Q")
        k = self.projections.trace(scores.input(1), "K")
        v = self.projections.trace(value_matmul.input(1), "V")
        shift_notes, rotated_input = self.check_self_attention(q, k, v)
        layout = self.layout.probe_heads(q, k, v)
        self.check_whole_sequence(
            softmax, self.projections.stream_tensor(v.linear.x), layout.time_major
        )
        self.check_per_input(softmax, layout)
        self.check_softmax_axis(softmax, len(layout.lead) + 2)
        columns = self.layout.head_columns(layout.q, layout.k, layout.v)
        n_heads, d_head = layout.q.columns.shape
        o, o_rows = self.output_projection(value_matmul, layout)
        d_model = q.linear.d_in
        if o.d_out != d_model or k.linear.d_in != d_model or v.linear.d_in != d_model:
            raise RejectError(
                RejectCode.WIDTH_MISMATCH,
                f"widths disagree: Q/K/V read {q.linear.d_in}/{k.linear.d_in}/{v.linear.d_in} "
                f"features but W_O writes {o.d_out}",
                (o.nodes[-1],),
            )
        bias = self.scores.score_bias(softmax, scores, score_sum, q, k, v)
        scale = score_scale * q.scale * k.scale
        notes = (
            self.scale_notes(scale, d_head, bias)
            + self.rotary_notes(q, k)
            + self.qk_norm_notes(q, k)
            + self.clip_notes(q, k, v)
            + self.cache_notes(k, v)
            + self.soft_cap_notes(score_sum.capped)
            + bias.notes
            + shift_notes
            + self.mix_notes(value_path.mix)
        )
        rotary, rotary_width = self.rotary_form(q, k, d_head)
        if rotated_input and rotary == "none":
            rotary, rotary_width = "full", d_head
        stream = self.stream.block_stream(v.linear.x, o)
        notes += stream.notes
        if layout.time_major:
            notes += (
                "the residual stream is time-major, (tokens, batch, features) (PyTorch's "
                "nn.TransformerEncoder without batch_first): the audit transposes its layers to "
                "batch-first before their statistics",
            )
        departures = stream.departures + (("value-clip",) if v.clipped else ())
        roles = {
            "scores": f"MatMul {scores.label!r}"
            + (f" via {', '.join(score_nodes)}" if score_nodes else ""),
            "value": f"MatMul {value_matmul.label!r}"
            + (f" after {', '.join(guard)}" if guard else ""),
            "Q": describe_linear(q),
            "K": describe_linear(k),
            "V": describe_linear(v),
            "O": f"{o.kind} {', '.join(o.nodes)} (weight {o.weight!r})",
            **({"score terms": "; ".join(bias.described)} if bias.described else {}),
            **stream.roles,
        }
        return AttentionBlock(
            index=index,
            softmax=softmax.label,
            n_heads=n_heads,
            n_kv_heads=columns["n_kv_heads"],
            d_model=d_model,
            d_head=d_head,
            scale=scale,
            attention_name=value_path.attention,
            q=q.linear,
            k=k.linear,
            v=v.linear,
            o=o,
            q_columns=columns["q"],
            k_columns=columns["k"],
            v_columns=columns["v"],
            o_rows=o_rows,
            notes=notes,
            roles=roles,
            score_bias=bias.kind,
            causal=bias.causal,
            rotary=rotary,
            rotary_width=rotary_width,
            departures=departures,
            time_major=layout.time_major,
            norm=stream.norm,
            norm_kind=stream.norm_kind,
            norm_match=stream.norm_match,
            has_layer_scale=stream.has_layer_scale,
            layer_scale_name=stream.layer_scale_name,
            input_name=stream.input_name,
            input_base=stream.input_base,
            residual_name=stream.residual_name,
            norm_output_name=stream.norm_output_name,
            output_name=stream.output_name,
            parallel=stream.parallel,
            stream_error=stream.stream_error,
            further_sums=stream.further_sums,
        )

    def check_self_attention(self, q: Trace, k: Trace, v: Trace) -> tuple[tuple[str, ...], bool]:
        """Q, K and V project one stream; returns the notes of a Q/K input that departs from it
        and whether that input is the stream rotated.

        DETR adds position embeddings to the Q and K inputs and not to V's: Q and K then read the
        stream V reads plus terms that do not depend on the graph inputs' values
        (:meth:`~oversmooth.importers.match.stream.StreamMatcher.before_constant_terms`).
        wav2vec2-conformer applies its rotary embedding to the stream before the Q and K
        projections (:meth:`~oversmooth.importers.match.rotary.RotaryMatcher.rotated_copy`). Either way A is
        still the Softmax the graph computes and the update ``X + A X W_V W_O``; W_Q and W_K are
        read on the stream, and a note says where the positions enter.
        """
        readers: dict[str, list[str]] = {}
        for trace in (q, k, v):
            readers.setdefault(self.projections.stream_tensor(trace.linear.x), []).append(
                trace.role
            )
        rotated = self.rotated_inputs(q, k, v) if len(readers) != 1 else ""
        if rotated:
            return (
                f"rotary embedding ({rotated}) applied to the Q/K input before the projections, "
                f"where the block rotates the stream {self.projections.stream_tensor(v.linear.x)!r} (V "
                f"projects it unrotated): A is measured as the graph computes it, W_Q and W_K "
                f"are read on the stream, as the weights the rotated stream is projected by",
            ), True
        shifted = self.position_shifted(q, k, v) if len(readers) != 1 else ()
        if shifted:
            return (
                f"Q and K project {', '.join(map(repr, shifted))}: the stream "
                f"{self.projections.stream_tensor(v.linear.x)!r} plus terms that do not depend on the inputs "
                f"(position embeddings added to the Q/K input only, as DETR does; V reads the "
                f"stream): A is measured as the graph computes it and W_Q, W_K are read on the "
                f"stream, but the scores are not X W_Q W_Kᵀ Xᵀ alone",
            ), False
        if len(readers) != 1:
            described = "; ".join(
                f"{' and '.join(roles)} {'reads' if len(roles) == 1 else 'read'} {source!r}"
                for source, roles in readers.items()
            )
            if self.reads_another_sequence(readers):
                raise RejectError(
                    RejectCode.CROSS_ATTENTION,
                    f"cross-attention ({described}, which is not computed from the stream Q "
                    f"reads): A mixes another sequence's values into the stream, outside the "
                    f"theory of self-attention X + A X W_V W_O",
                )
            raise RejectError(
                RejectCode.NOT_SELF_ATTENTION,
                f"Q, K and V project different tensors ({described}): cross-attention, or keys "
                f"and values from another sequence (SegFormer's spatially reduced one); only "
                f"self-attention, one square A over one stream, is supported",
            )
        return (), False

    def reads_another_sequence(self, readers: dict[str, list[str]]) -> bool:
        """Whether the projections' ``readers`` (tensor -> roles) are a cross-attention's: Q
        projects one tensor, K and V another that is not computed from it (a decoder's keys and
        values from the encoder's output). Keys and values computed from the queries' stream
        (SegFormer's spatially reduced sequence) or Q and K on one tensor (MobileBERT's
        bottleneck) are not."""
        roles = {tuple(found): source for source, found in readers.items()}
        if set(roles) != {("Q",), ("K", "V")}:
            return False
        return not self.computed_from(roles["K", "V"], {roles["Q",]})

    def rotated_inputs(self, q: Trace, k: Trace, v: Trace) -> str:
        """The rotary style when Q and K both project V's stream rotated in place (one tensor
        or two), else ""."""
        stream = self.projections.stream_tensor(v.linear.x)
        styles = {self.rotary.rotated_copy(trace.linear.x, stream) for trace in (q, k)}
        return styles.pop() if len(styles) == 1 and "" not in styles else ""

    def position_shifted(self, q: Trace, k: Trace, v: Trace) -> tuple[str, ...]:
        """The tensors Q and K project when each is V's stream plus input-independent terms and at
        least one carries such terms; else ()."""
        stream = self.projections.stream_tensor(v.linear.x)
        sources = tuple(self.projections.stream_tensor(trace.linear.x) for trace in (q, k))
        bases = {self.stream.before_constant_terms(source) for source in sources}
        if bases != {stream} or set(sources) == {stream}:
            return ()
        return tuple(dict.fromkeys(source for source in sources if source != stream))

    def check_whole_sequence(self, softmax: Node, x: str, time_major: bool = False) -> None:
        """Decline windowed attention: the projected tokens were folded into the batch axis.

        Q, K and V project a (B·n, t, D) tensor (a time-major stream: (t, B·n, D)) while the graph
        runs B inputs when the tokens of each input were cut into n windows of t (Swin): each
        input then has one t×t matrix per window and head, not the token-mixing matrix A of all
        its tokens that the theory is about.
        """
        shape, batch = self.context.shape(x), self._input_batch()
        if shape is None or batch is None or len(shape) != 3:
            return
        items, tokens = (shape[1], shape[0]) if time_major else (shape[0], shape[1])
        if items <= batch or items % batch:
            return
        raise RejectError(
            RejectCode.WINDOWED_ATTENTION,
            f"windowed attention: each input's tokens attend within {items // batch} windows "
            f"of {tokens} tokens (folded into the batch axis, Swin-style), so no single "
            f"attention matrix over all its tokens exists",
            (softmax.label,),
        )

    def check_per_input(self, softmax: Node, layout: Layout) -> None:
        """Decline attention computed per window: windows folded into the batch inside the block.

        The projections may read the whole (B, T, D) stream while the head split reshapes each
        input's tokens into n windows of t (``[-1, t, heads, d_head]``): the scores are then
        (n·B, heads, t, t), their leading axes ``layout.lead`` holding n·B·heads matrices at the
        probe sizes, n times one per input and head. Each input has n·heads t×t matrices, not the
        token-mixing matrix A of all its tokens (and the audit would read windows as inputs).
        """
        batch, n_heads = self._input_batch(), layout.q.columns.shape[0]
        items = math.prod(layout.lead) // n_heads
        if batch is None or items <= batch or items % batch:
            return
        raise RejectError(
            RejectCode.WINDOWED_ATTENTION,
            f"windowed attention: each input's tokens attend within {items // batch} windows "
            f"of {layout.tokens} tokens (the block folds them into the leading axis of its "
            f"attention, {items // batch}·batch), so no single attention matrix over all its "
            f"tokens exists",
            (softmax.label,),
        )

    def _input_batch(self) -> int | None:
        """The batch size the probe runs: the leading size of the first graph input of rank >= 2."""
        for name in self.index.graph_inputs:
            if name in self.index.initializers:
                continue
            shape = self.context.shape(name)
            if shape is not None and len(shape) >= 2:
                return int(shape[0])
        return None

    def check_softmax_axis(self, softmax: Node, rank: int) -> None:
        raw = softmax.attr("axis", -1)
        if isinstance(raw, bool) or not isinstance(raw, int | np.integer):
            raise RejectError(
                RejectCode.MALFORMED,
                f"Softmax axis attribute is {raw!r}; expected an integer axis",
                (softmax.label,),
            )
        axis = int(raw)
        if axis not in (-1, rank - 1):
            raise RejectError(
                RejectCode.SOFTMAX_AXIS,
                f"Softmax axis is {axis}; expected the last axis (-1) of the rank-{rank} scores",
                (softmax.label,),
            )

    @staticmethod
    def rotary_notes(q: Trace, k: Trace) -> tuple[str, ...]:
        """A note for a rotary embedding other than Llama's full rotate-half (W_Q, W_K are the
        weights before it)."""
        styles = sorted({trace.rotary for trace in (q, k) if trace.rotary})
        unusual = [style for style in styles if style != "full rotate-half"]
        if not unusual:
            return ()
        return (f"rotary embedding on Q/K: {'; '.join(styles)}; W_Q and W_K are read before it",)

    @staticmethod
    def soft_cap_notes(capped: list[str]) -> tuple[str, ...]:
        """A note for scores passed through a Tanh soft-cap before the Softmax."""
        if not capped:
            return ()
        return (
            f"scores soft-capped by {', '.join(map(repr, capped))} (cap · tanh(s / cap)): A is "
            f"measured as the graph computes it, but the scores are not bilinear in the stream "
            f"and the score scale is their slope at 0",
        )

    @staticmethod
    def qk_norm_notes(q: Trace, k: Trace) -> tuple[str, ...]:
        """A note for Q or K normalised before the scores (W_Q, W_K are the weights before it)."""
        normed = [f"{trace.role}: {trace.norm}" for trace in (q, k) if trace.norm]
        if not normed:
            return ()
        return (
            f"Q/K normalised before the scores ({'; '.join(normed)}): A is measured as the graph "
            f"computes it, but the scores are not bilinear in the stream and W_Q^h W_K^hᵀ is "
            f"read before the norm",
        )

    @staticmethod
    def clip_notes(q: Trace, k: Trace, v: Trace) -> tuple[str, ...]:
        """A note for projections clipped before the attention (OLMo's ``clip_qkv``)."""
        clipped = [f"{trace.role}: {trace.clipped}" for trace in (q, k, v) if trace.clipped]
        if not clipped:
            return ()
        return (
            f"projections clipped before the attention ({'; '.join(clipped)}): a clipped Q or K "
            f"changes only how A is computed (A is measured); clipped values make the update "
            f"X + A clip(X W_V) W_O, the linear one only while no value reaches a bound",
        )

    @staticmethod
    def cache_notes(k: Trace, v: Trace) -> tuple[str, ...]:
        """A note for keys and values concatenated with a key/value cache (a decoder exported for
        generation): the block is read, and the audit runs it, at past length 0."""
        caches = [name for trace in (k, v) for name in trace.cache]
        if not caches:
            return ()
        return (
            f"keys and values are concatenated with the KV cache input(s) "
            f"{', '.join(map(repr, caches))}: audited at past length 0, those inputs fed empty, "
            f"where the concatenation is the identity (the model without a cache)",
        )

    @staticmethod
    def rotary_form(q: Trace, k: Trace, d_head: int) -> tuple[RotaryForm, int]:
        """("none" | "full" | "partial", columns rotated per head) of the rotary embedding."""
        traces = [trace for trace in (q, k) if trace.rope]
        if not traces:
            return "none", 0
        widths = [trace.rotary_width for trace in traces if trace.rotary_width is not None]
        return ("partial", max(widths)) if widths else ("full", d_head)

    @staticmethod
    def scale_notes(scale: float, d_head: int, bias: ScoreBias) -> tuple[str, ...]:
        """A note when the score scale is not 1/sqrt(d_head); one of 1/sqrt(d_head * n), integer
        n, is named (disentangled attention divides by sqrt(d_head * (1 + position terms)))."""
        expected = 1.0 / math.sqrt(d_head)
        if abs(scale / expected - 1.0) <= SCALE_RTOL:
            return ()
        note = (
            f"score scale {scale:.6g} differs from 1/sqrt(d_head) = {expected:.6g} "
            f"(d_head {d_head} taken from the head-split Reshape)"
        )
        factor = 1.0 / (scale * scale * d_head) if scale > 0 else 0.0
        if round(factor) >= 2 and abs(factor / round(factor) - 1.0) <= 2 * SCALE_RTOL:
            note += f"; it is 1/sqrt(d_head * {round(factor)})"
            if bias.kind == "disentangled" and round(factor) == 1 + bias.position_terms:
                note += (
                    f", the scale of disentangled attention with {bias.position_terms} "
                    "position terms (1/sqrt(d_head * (1 + position terms)))"
                )
        return (note,)

    # -- 2. value MatMul ---------------------------------------------------------------------------
    def value_matmul(self, softmax: Node) -> ValuePath:
        """Walk forward from the Softmax to the MatMul with V (see :class:`ValuePath`)."""
        name = attention = softmax.outputs[0]
        passed: list[str] = []
        mixed: str | None = None
        for _ in range(VALUE_MATMUL_STEPS):
            users = self.consumers(name)
            matmuls = [node for node in users if node.op_type == "MatMul" and node.input(0) == name]
            if len(matmuls) == 1:
                return ValuePath(matmuls[0], tuple(passed), attention, mixed)
            mix = self.gated_mix(name, users) if mixed is None else None
            if mix is not None:
                name = attention = mix[0]
                mixed = mix[1]
                passed.append(mixed)
                continue
            guard = self.nan_guard(name, users)
            if guard is not None:
                passed.append(f"IsNaN/Where guard {guard.label!r}")
                name = guard.outputs[0]
                continue
            if (
                len(users) == 1
                and users[0].input(0) == name
                and (
                    users[0].op_type in VALUE_PRESERVING
                    or (
                        users[0].op_type in _PROBABILITY_VIEWS
                        and self.scores.keeps_score_axes(users[0])
                    )
                )
            ):
                passed.append(f"{users[0].op_type} {users[0].label!r}")
                name = users[0].outputs[0]
                continue
            break
        where = ", ".join(f"{node.op_type} {node.label!r}" for node in users) or (
            "a graph output only" if name in self.index.graph_outputs else "nothing"
        )
        raise RejectError(
            RejectCode.VALUE_MATMUL_MISSING,
            f"value MatMul not found: the Softmax output goes to {where}",
            tuple(node.label for node in users),
        )

    def gated_mix(self, name: str, users: list[Node]) -> tuple[str, str] | None:
        """``(mix, description)`` for ConViT's gated positional attention on the probabilities
        ``name``: ``Mul(name, gate)``, ``Add`` of a term, both computed without reading the graph
        inputs' values (the gate ``1 − σ(g_h)``, the term ``σ(g_h) · softmax(positional scores)``),
        then divided by its own sum over the keys (``ReduceSum`` on the last axis); else None.

        The mix is row-stochastic and weights V: it is the block's A, measured there, and the
        update is ``X + A X W_V W_O`` with W_Q W_Kᵀ the content part's projections.
        """
        mul = users[0] if len(users) == 1 and users[0].op_type == "Mul" else None
        gate = next((operand for operand in mul.inputs if operand != name), "") if mul else ""
        adds = self.consumers(mul.outputs[0]) if mul is not None else []
        if mul is None or not self.input_free(gate) or len(adds) != 1 or adds[0].op_type != "Add":
            return None
        summed = adds[0].outputs[0]
        term = next((operand for operand in adds[0].inputs if operand != mul.outputs[0]), "")
        divide = self.renormalised(summed)
        if not term or not self.input_free(term) or divide is None:
            return None
        return divide.outputs[0], (
            f"gated mix Mul {mul.label!r} (gate {gate!r}), Add {adds[0].label!r} (term {term!r}), "
            f"renormalised by Div {divide.label!r}"
        )

    def renormalised(self, name: str) -> Node | None:
        """The ``Div`` of ``name`` by its own sum over the last axis (a ``ReduceSum`` kept, or
        unsqueezed, to broadcast), when that sum and the Div are its only readers; else None."""
        users = self.consumers(name)
        divides = [node for node in users if node.op_type == "Div" and node.input(0) == name]
        sums = [node for node in users if node.op_type == "ReduceSum"]
        if (
            len(users) != 2
            or len(divides) != 1
            or len(sums) != 1
            or not self.projections.last_axis(sums[0])
        ):
            return None
        denominator = self.producer(divides[0].input(1))
        if denominator is not None and denominator.op_type == "Unsqueeze":
            denominator = self.producer(denominator.input(0))
        return divides[0] if denominator is sums[0] else None

    @staticmethod
    def mix_notes(mix: str | None) -> tuple[str, ...]:
        """A note for a gated mix on the way to V (ConViT's gated positional attention)."""
        if mix is None:
            return ()
        return (
            f"gated positional self-attention: the Softmax is mixed with a term that does not "
            f"depend on the inputs and renormalised ({mix}); A is that mix, the matrix "
            f"that weights V, measured there, and W_Q W_Kᵀ describes its content part only",
        )

    def nan_guard(self, name: str, users: list[Node]) -> Node | None:
        """The Where of an ``IsNaN(p) → Where(isnan, 0, p)`` guard on ``name``, if that is all."""
        wheres = [node for node in users if node.op_type == "Where" and name in node.inputs[1:]]
        isnans = [node for node in users if node.op_type == "IsNaN"]
        if len(wheres) == 1 and len(isnans) == 1 and len(users) == 2:
            condition = self.producer(wheres[0].input(0))
            if condition is isnans[0]:
                return wheres[0]
        return None

    # -- 5. output projection ----------------------------------------------------------------------
    def output_projection(
        self, value_matmul: Node, layout: Layout
    ) -> tuple[LinearMatch, np.ndarray]:
        """Forward from the ·V MatMul through the head merge to W_O; returns (W_O, canonical rows)."""
        name = value_matmul.outputs[0]
        linear, steps = self.projections.find_output_linear(name)
        return linear, self.layout.merge_rows(name, steps, linear, layout)
