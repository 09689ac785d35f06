"""The attention scores: every term added to the query-key product before the Softmax.

Walking back from the Softmax, the scores are a sum. ``Add``, ``Sub`` and ``Neg``, scalar factors
(a constant, or shape arithmetic: :meth:`~oversmooth.importers.match.walker.GraphWalker.scalar_factor`), views
that keep the (query, key) axes (Cast, Identity, Reshape, Squeeze, Unsqueeze, Flatten) and mask
fills (``Where`` replacing scores by a constant at or below ``MASK_FLOOR``) and floors (``Max`` with
such a constant, or a ``Clip`` with only such a minimum: XGLM's ``max(scores, finfo.min)``, which
changes no unmasked score) are passed, and so is a
``Tanh`` soft-cap (Gemma-2's ``cap · tanh(s / cap)``: noted, as the scores are then not bilinear and
the scale on the path is their slope at 0); every other
tensor reached, and every subtree with no product of two non-constant tensors in it (BERT's
``(1 - mask) * finfo.min`` is one term, not two), is one *term*. The *content* term is the
query-key product QKᵀ: a ``MatMul`` of two non-constant tensors; where several terms are such
products, the one whose operands are Q and K projections of one stream (the others are terms). The
block's score scale is the product of the scalar factors on its path.

Every other term is classified once Q, K and V are traced (:meth:`ScoreMatcher.score_bias`), by
what it depends on and by its values, never by names:

- A term that does not depend on the hidden states (its value ancestry, reads of ``Shape`` aside,
  reaches neither the tensor Q, K and V project nor a Softmax output) is evaluated with every
  integer graph input set to ones (:func:`~oversmooth.importers.match.score_values.neutral_value`). Masked
  entries (at or below ``MASK_FLOOR``) make it a mask; what remains is its bias: zero (a mask
  only), linear in the key position in every row (``alibi``), constant along the diagonals or
  gathered from a table (``relative``), or ``other``. A term whose value cannot be evaluated is a
  mask when it is a ``Where`` between zero and masking constants, a mask the caller supplies when
  it is a graph input, ``relative`` when it is gathered from a table, else ``other`` (with a note).
- A term that depends on the hidden states is accepted only as a disentangled position term
  (DeBERTa's content-to-position and position-to-content scores): through gathers and layout ops
  (``Gather``, ``GatherElements``, ``Transpose``, ...) it is a product of a Q or K projection of
  the block's stream with a tensor that does not depend on the hidden states (position embeddings,
  usually through their own projection). Anything else is declined, naming the term.

``causal``: the masked entries of the mask terms and fills, evaluated the same way, hide every key
after its query (j > i) and never the diagonal.

The views on the way are checked on shapes, which the shape context answers once and memoises;
:meth:`ScoreMatcher.scores_of` therefore walks every Softmax's scores before anything else is
matched (see there).
"""

from __future__ import annotations

from dataclasses import dataclass, field

import numpy as np

from oversmooth.importers.graph import Node, ShapeContext
from oversmooth.importers.match import score_values as values
from oversmooth.importers.match.codes import RejectCode
from oversmooth.importers.match.limits import (
    MAX_SCORE_NODES,
    POSITION_TERM_DEPTH,
    SCALE_SEARCH_DEPTH,
)
from oversmooth.importers.match.projections import ProjectionFinder, Trace
from oversmooth.importers.match.results import ScoreBiasKind
from oversmooth.importers.match.walker import GraphWalker, MatchBasis, RejectError

_VIEWS = frozenset({"Cast", "Identity", "Reshape", "Squeeze", "Unsqueeze", "Flatten"})
_KEEPS_VALUES = frozenset({"Cast", "Identity"})
#: Ops the score walk may pass on its way to a query-key product.
_SUM_OPS = frozenset({"Add", "Sub", "Mul", "Div", "Where", "Neg", "Tanh", "Max", "Clip"} | _VIEWS)
#: Ops between a disentangled position term and its query-key-position product.
_POSITION_PATH = frozenset(
    "Gather GatherElements Transpose Reshape Squeeze Unsqueeze Expand Tile Slice Cast Identity "
    "Neg".split()
)


@dataclass(frozen=True)
class ScoreTerm:
    """One term of the score sum: ``tensor`` times ``factor`` (the signs and scalar factors
    passed on the way from the Softmax)."""

    tensor: str
    factor: float


@dataclass(frozen=True)
class MaskFill:
    """A ``Where`` replacing scores by a constant: masked where ``condition`` is ``masked_when``."""

    node: Node
    condition: str
    masked_when: bool

    @property
    def scores(self) -> str:
        """The branch that carries the scores (the one that is not the fill)."""
        return self.node.input(2) if self.masked_when else self.node.input(1)


@dataclass
class ScoreSum:
    """The walk's result: candidate query-key products (node, scale, path), other terms, fills."""

    products: list[tuple[Node, float, tuple[Node, ...]]]
    terms: list[ScoreTerm]
    fills: list[MaskFill]
    capped: list[str] = field(default_factory=list)  # Tanh soft-caps passed (their labels)


#: The query-key product: (MatMul, score scale, the nodes passed from the Softmax).
Content = tuple[Node, float, list[str]]
#: Errors that reject one Softmax candidate (see :func:`oversmooth.importers.match.find_attention_blocks`).


@dataclass(frozen=True)
class ScoreBias:
    """What is added to QKᵀ: ``kind`` (none/alibi/relative/disentangled/other), ``causal``, the
    number of disentangled position terms, one description per term for the block's roles, and
    notes on terms classified by structure only or not recognised."""

    kind: ScoreBiasKind
    causal: bool
    position_terms: int
    described: tuple[str, ...]
    notes: tuple[str, ...] = ()


class ScoreMatcher(GraphWalker):
    """The score sum behind a Softmax: its query-key product and what else is added to it.

    The Q and K operands are traced back to their projections by :attr:`projections`, a
    component over the same basis and shape context.
    """

    def __init__(
        self, basis: MatchBasis, context: ShapeContext, projections: ProjectionFinder
    ) -> None:
        super().__init__(basis, context)
        self.projections = projections

    def scores_of(self, softmax: Node) -> tuple[ScoreSum, Content]:
        """The score sum behind ``softmax`` and its content product (MatMul, scale, nodes passed).

        The first walk of an attempt, before anything else asks its shape context for shapes:
        :meth:`check_score_views` pins shapes the context cannot infer, and a shape asked for
        earlier would stay unknown in this attempt's memo.
        """
        found = self.score_sum(softmax)
        return found, self.content_product(softmax, found)

    # -- the walk -----------------------------------------------------------------------------
    def score_sum(self, softmax: Node) -> ScoreSum:
        """Walk back from the Softmax through the score sum (see the module docstring)."""
        found = ScoreSum([], [], [])
        stack: list[tuple[str, float, tuple[Node, ...]]] = [(softmax.input(0), 1.0, ())]
        for _ in range(MAX_SCORE_NODES):
            if not stack:
                return found
            name, factor, path = stack.pop()
            node = self.producer(name)
            if node is None or self.const(name) is not None or not self.reaches_product(name):
                found.terms.append(ScoreTerm(name, factor))  # no product inside: one term
                continue
            if node.op_type == "MatMul" and all(self.const(x) is None for x in node.inputs):
                found.products.append((node, factor, path))
                continue
            if node.op_type == "Tanh":  # soft-capping (Gemma-2): cap · tanh(scores / cap)
                found.capped.append(node.label)
                stack.append((node.input(0), factor, (*path, node)))
                continue
            fill = self.mask_fill(node) if node.op_type == "Where" else None
            if fill is not None:
                found.fills.append(fill)
                stack.append((fill.scores, factor, (*path, node)))
                continue
            passed = self.passed_operands(node, factor)
            if passed is None:
                found.terms.append(ScoreTerm(name, factor))
                continue
            stack.extend((operand, scaled, (*path, node)) for operand, scaled in reversed(passed))
        raise RejectError(
            RejectCode.NO_QK_MATMUL, "QK^T MatMul not found: the score sum is too large"
        )

    def passed_operands(self, node: Node, factor: float) -> list[tuple[str, float]] | None:
        """The operands the score walk continues with (and their factors), None for a term."""
        op = node.op_type
        if op in ("Mul", "Div"):
            scalar, data = self.scalar_factor(node)
            return None if scalar is None else [(data, factor * scalar)]
        if op in ("Add", "Sub"):
            return [(node.input(0), factor), (node.input(1), -factor if op == "Sub" else factor)]
        if op == "Neg":
            return [(node.input(0), -factor)]
        if op in _VIEWS:
            return [(node.input(0), factor)]
        if op in ("Max", "Clip"):
            scores = self.floored_scores(node)
            return None if scores is None else [(scores, factor)]
        return None

    def floored_scores(self, node: Node) -> str | None:
        """The scores under a floor at a masking level, else None: ``Max(scores, c)`` (either
        order) or ``Clip(scores, c)`` without a maximum, with a constant ``c ≤ MASK_FLOOR``. Such a
        floor changes no score above the masking level, so A is that of the scores below it."""
        inputs = node.inputs
        if node.op_type == "Clip":
            unbounded = len(inputs) == 2 or (len(inputs) == 3 and not inputs[2])
            floors = [1] if unbounded and inputs[1] else []
        else:
            floors = [0, 1] if len(inputs) == 2 else []
        for position in floors:
            value = self.const(self.strip_casts(node.input(position)))
            if value is not None and value.size > 0 and float(np.max(value)) <= values.MASK_FLOOR:
                other = node.input(1 - position)
                return None if self.const(other) is not None else other
        return None

    def mask_fill(self, node: Node) -> MaskFill | None:
        """``Where(c, fill, scores)`` or ``Where(c, scores, fill)`` with a constant fill at or
        below MASK_FLOOR, else None. Only constants are read here: evaluating the scores branch
        would resolve shapes that :meth:`check_score_views` may still have to pin."""
        fills = [
            position
            for position in (1, 2)
            if (value := self.const(self.strip_casts(node.input(position)))) is not None
            and value.size > 0
            and float(np.max(value)) <= values.MASK_FLOOR
        ]
        if len(fills) != 1 or self.const(node.input(3 - fills[0])) is not None:
            return None
        return MaskFill(node, node.input(0), masked_when=fills[0] == 1)

    def keeps_score_axes(self, node: Node) -> bool:
        """Whether a view keeps the last two axes (queries, keys) of the scores."""
        if node.op_type in _KEEPS_VALUES:
            return True
        before, after = self.context.shape(node.input(0)), self.context.shape(node.outputs[0])
        return _same_score_axes(before, after)

    def check_score_views(self, product: Node, path: tuple[Node, ...]) -> None:
        """Check that the views between the query-key product and the Softmax keep its (query,
        key) axes (BLOOM and DeBERTa reshape (B*H, T, T) scores to (B, H, T, T)).

        Going up from the product, a sum whose shape the shape context does not know (DeBERTa's
        position terms are gathered by indices computed in an ``If``) gets the product's shape
        pinned when the product has no axis of size 1, so that any term broadcast to it: then
        the Reshape targets computed from the sum's shape are known.
        """
        if all(node.op_type not in _VIEWS or node.op_type in _KEEPS_VALUES for node in path):
            return  # nothing to check: no shape is asked for (the context answers once)
        name, current = product.outputs[0], self.context.shape(product.outputs[0])
        for node in reversed(path):
            output = node.outputs[0]
            if node.op_type in _VIEWS and node.op_type not in _KEEPS_VALUES:
                after = self.context.shape(output)
                if not _same_score_axes(current, after):
                    raise RejectError(
                        RejectCode.SCORE_VIEW,
                        f"the scores' (query, key) axes are not kept: {node.op_type} "
                        f"{node.label!r} between the query-key product and the Softmax turns "
                        f"shape {current} into {after}",
                        (node.label,),
                    )
                current = after
            elif current is not None:
                others = [self.context.shape(x) for x in node.inputs if x and x != name]
                if all(shape is not None for shape in others):
                    current = _broadcast(current, *(shape for shape in others if shape))
                elif 1 in current:
                    current = None
                if current is not None and self.context.shape(output) is None:
                    self.context.set_shape(output, current)
            name = output

    # -- the content product ------------------------------------------------------------------
    def content_product(self, softmax: Node, found: ScoreSum) -> Content:
        """The query-key product among the score terms: (MatMul, scale, nodes passed)."""
        products = found.products
        if len(products) > 1:
            products = [entry for entry in products if self.projects_one_stream(entry[0])]
        if len(products) == 1:
            node, scale, path = products[0]
            self.check_score_views(node, path)
            return node, scale, [f"{step.op_type} {step.label!r}" for step in path]
        if not products and not found.products:
            raise self.no_product(softmax, found)
        labels = ", ".join(repr(node.label) for node, _, _ in found.products)
        fitting = f"{len(products)} of them multiply" if products else "none of them multiplies"
        raise RejectError(
            RejectCode.NO_QK_MATMUL,
            f"QK^T MatMul not found: the scores add {len(found.products)} products of two "
            f"non-constant tensors ({labels}) and {fitting} Q and K projections of one stream "
            "(expected one content product QK^T)",
            tuple(node.label for node, _, _ in found.products),
        )

    def projects_one_stream(self, node: Node) -> bool:
        try:
            q, k = (
                self.projections.trace(node.input(0), "Q"),
                self.projections.trace(node.input(1), "K"),
            )
        except RejectError:
            return False
        return self.projections.stream_tensor(q.linear.x) == self.projections.stream_tensor(
            k.linear.x
        )

    def no_product(self, softmax: Node, found: ScoreSum) -> RejectError:
        """Why no term is a query-key product (the first telling term)."""
        for term in found.terms:
            node = self.producer(term.tensor)
            if node is None or self.const(term.tensor) is not None:
                continue
            node = self.constant_product(term.tensor) or node
            if node.op_type == "MatMul":
                constant = next(x for x in node.inputs if self.const(x) is not None)
                return RejectError(
                    RejectCode.NO_QK_MATMUL,
                    f"QK^T MatMul not found: MatMul {node.label!r} multiplies by the constant "
                    f"{constant!r}, not a query-key product",
                    (node.label,),
                )
            if node.op_type in ("Mul", "Div") and any(
                self.reaches_qk(x, depth=SCALE_SEARCH_DEPTH) for x in node.inputs
            ):
                return RejectError(
                    RejectCode.SCORE_SCALE_NOT_CONSTANT,
                    f"the scores are scaled by a non-constant factor: {node.op_type} "
                    f"{node.label!r} reads {self.origin(self.scale_operand(node))}",
                    (node.label,),
                )
            return RejectError(
                RejectCode.NO_QK_MATMUL,
                f"QK^T MatMul not found: walking back from the Softmax reached {node.op_type} "
                f"{node.label!r}",
                (node.label,),
            )
        return RejectError(
            RejectCode.NO_QK_MATMUL,
            f"QK^T MatMul not found: the Softmax input comes from {self.origin(softmax.input(0))}",
        )

    def constant_product(self, name: str) -> Node | None:
        """A MatMul by a constant within the score-sum ops behind ``name`` (a classifier's
        logits), else None."""
        frontier = [name]
        for _ in range(MAX_SCORE_NODES):
            if not frontier:
                break
            node = self.producer(frontier.pop(0))
            if node is None:
                continue
            if node.op_type == "MatMul" and any(self.const(x) is not None for x in node.inputs):
                return node
            if node.op_type in _SUM_OPS:
                frontier.extend(x for x in node.inputs if x and self.const(x) is None)
        return None

    def scale_operand(self, node: Node) -> str:
        """The operand of a score Mul/Div that is not the scores."""
        if node.op_type == "Div" or self.reaches_qk(node.input(0), depth=SCALE_SEARCH_DEPTH):
            return node.input(1)
        return node.input(0)

    def reaches_product(self, name: str) -> bool:
        """Whether a product of two non-constant tensors lies behind ``name``, through score-sum
        ops and the gathers and layout ops of a position term (a sum without one is one term)."""
        return self.reaches_qk(name, depth=POSITION_TERM_DEPTH, through=_SUM_OPS | _POSITION_PATH)

    def reaches_qk(self, name: str, depth: int, through: frozenset[str] = _SUM_OPS) -> bool:
        """Whether a product of two non-constant tensors lies within ``depth`` ops ``through``."""
        frontier, seen = [name], set()
        for _ in range(depth):
            next_frontier: list[str] = []
            for tensor in frontier:
                node = self.producer(tensor)
                if node is None or node.position in seen:
                    continue
                seen.add(node.position)
                if node.op_type == "MatMul":
                    if all(self.const(operand) is None for operand in node.inputs):
                        return True
                elif node.op_type in through:
                    next_frontier.extend(operand for operand in node.inputs if operand)
            frontier = next_frontier
        return False

    # -- the other terms ----------------------------------------------------------------------
    def score_bias(
        self, softmax: Node, product: Node, found: ScoreSum, q: Trace, k: Trace, v: Trace
    ) -> ScoreBias:
        """Classify every term besides QKᵀ (module docstring); raise for a declined one."""
        hidden = {self.strip_casts(trace.linear.x) for trace in (q, k, v)}
        hidden |= {trace.linear.x for trace in (q, k, v)}
        hidden |= {self.projections.stream_tensor(trace.linear.x) for trace in (q, k, v)}
        masks = [self.fill_mask(fill) for fill in found.fills]
        kinds: list[ScoreBiasKind] = []
        described: list[str] = []
        notes: list[str] = []
        others = [ScoreTerm(node.outputs[0], scale) for node, scale, _ in found.products]
        for term in found.terms + [term for term in others if term.tensor != product.outputs[0]]:
            label = self.term_label(term)
            if self.depends_on(term.tensor, hidden):
                kinds.append(self.position_term(term, hidden))
                described.append(f"disentangled position term {label}")
                continue
            kind, mask, note = self.independent_term(term)
            masks.append(mask)
            notes += [note] if note else []
            if kind != "none":
                kinds.append(kind)
                described.append(f"{kind} bias {label}")
            elif mask is not None and mask.any():
                described.append(f"mask {label}")
        described += [f"mask fill {fill.node.op_type} {fill.node.label!r}" for fill in found.fills]
        shape = self.context.shape(product.outputs[0]) or self.context.shape(softmax.input(0))
        causal = (
            shape is not None
            and len(shape) >= 2
            and values.causal_pattern(
                [mask for mask in masks if mask is not None], shape[-2], shape[-1]
            )
        )
        distinct = sorted(set(kinds))
        if len(distinct) > 1:
            notes.append(f"score terms of several kinds ({', '.join(distinct)}): score bias other")
        overall: ScoreBiasKind = (
            distinct[0] if len(distinct) == 1 else ("other" if distinct else "none")
        )
        return ScoreBias(
            overall, causal, kinds.count("disentangled"), tuple(described), tuple(notes)
        )

    def term_label(self, term: ScoreTerm) -> str:
        node = self.producer(term.tensor)
        return f"{term.tensor!r}" if node is None else f"{node.op_type} {node.label!r}"

    def neutral_value(self, name: str) -> np.ndarray | None:
        """:func:`~oversmooth.importers.match.score_values.neutral_value`, once per tensor (the blocks of a
        decoder share one mask)."""
        return self.basis.remembered("neutral", name, lambda: values.neutral_value(self, name))

    def fill_mask(self, fill: MaskFill) -> np.ndarray | None:
        condition = self.neutral_value(fill.condition)
        return None if condition is None else np.asarray(condition, dtype=bool) == fill.masked_when

    def independent_term(
        self, term: ScoreTerm
    ) -> tuple[ScoreBiasKind, np.ndarray | None, str | None]:
        """(kind, masked entries or None, note or None) for a term that does not depend on the
        hidden states (module docstring)."""
        label = self.term_label(term)
        value = self.neutral_value(term.tensor)
        if value is None:
            if values.fills_constants(self, term.tensor):
                return "none", None, None
            fed = values.fed_by_input(self, term.tensor)
            if fed is not None:
                return (
                    "none",
                    None,
                    (
                        f"score term {label} is fed by graph input {fed!r}: taken as a mask the "
                        "caller supplies (not evaluated; no causal mask is reported from it)"
                    ),
                )
            guess: ScoreBiasKind = (
                "relative" if values.gathered_from_table(self, term.tensor) else "other"
            )
            return (
                guess,
                None,
                (
                    f"score term {label} could not be evaluated with an all-ones attention mask; "
                    f"taken as {guess} from its structure"
                    + ("" if guess == "relative" else " (not a gather from a position table)")
                ),
            )
        value = np.asarray(value, dtype=np.float64) * term.factor
        bias, masked = values.bias_part(value), values.masked_entries(value)
        table = values.gathered_from_table(self, term.tensor) or values.constant_table(
            self, term.tensor
        )
        if values.is_zero(bias) and (not table or masked.any()):
            return "none", masked, None
        if not np.all(np.isfinite(np.ma.compressed(bias))):  # +inf or NaN: no shape to test
            return (
                "other",
                masked,
                f"score term {label} holds +inf or NaN outside its masked entries; A is the "
                "Softmax of QK^T plus it",
            )
        if values.is_linear_in_key(bias):
            return "alibi", masked, None
        if values.is_relative(bias) or values.gathered_from_table(self, term.tensor):
            return "relative", masked, None
        return (
            "other",
            masked,
            (
                f"score term {label} does not depend on the hidden states but is neither a mask, "
                "ALiBi (linear in the key position) nor a relative position bias; A is the Softmax "
                "of QK^T plus it"
            ),
        )

    def position_term(self, term: ScoreTerm, hidden: set[str]) -> ScoreBiasKind:
        """``"disentangled"`` for a product of a Q or K projection of the block's stream with a
        tensor independent of the hidden states; raise for any other hidden-state term."""
        name = term.tensor
        for _ in range(MAX_SCORE_NODES):
            node = self.producer(name)
            if node is None:
                break
            if node.op_type == "MatMul":
                operands = [x for x in node.inputs if self.depends_on(x, hidden)]
                if len(operands) == 1 and self.projects_stream(operands[0], hidden):
                    return "disentangled"
                break
            factor, data = (
                self.scalar_factor(node) if node.op_type in ("Mul", "Div") else (None, "")
            )
            if factor is not None:
                name = data
            elif node.op_type in _POSITION_PATH:
                name = node.input(0)
            else:
                break
        raise RejectError(
            RejectCode.SCORE_BIAS_HIDDEN,
            f"score bias depending on the hidden states other than a disentangled position term: "
            f"{self.term_label(term)} is added to the scores (a disentangled term multiplies a Q "
            f"or K projection of the block's input by position embeddings)",
            (self.term_label(term),),
        )

    def projects_stream(self, name: str, hidden: set[str]) -> bool:
        """Whether ``name`` is a projection (Q or K) of the block's stream."""
        try:
            trace = self.projections.trace(name, "Q")
        except RejectError:
            return False
        x = trace.linear.x
        return (
            x in hidden
            or self.strip_casts(x) in hidden
            or self.projections.stream_tensor(x) in hidden
        )


def _same_score_axes(before: tuple[int, ...] | None, after: tuple[int, ...] | None) -> bool:
    return (
        before is not None
        and after is not None
        and min(len(before), len(after)) >= 2
        and before[-2:] == after[-2:]
    )


def _broadcast(*shapes: tuple[int, ...]) -> tuple[int, ...] | None:
    try:
        return tuple(int(dim) for dim in np.broadcast_shapes(*shapes))
    except ValueError:
        return None
