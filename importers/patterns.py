"""Find self-attention blocks in an ONNX graph by structure, starting from every Softmax.

Public API
----------
find_attention_blocks
    Match every Softmax; returns a :class:`MatchReport` (blocks in depth order plus the reason each
    rejected Softmax failed), or raises :class:`~importers.errors.NoAttentionBlocksError`.
AttentionBlock, MatchReport, MatchFailure, LinearMatch, NormMatch
    The results (structure only; :mod:`importers.weights` reads the numbers).

How a block is matched (names are never used, only op types, constants and shapes):

1. Back from the Softmax through a mask ``Add``/``Where``, scalar ``Mul``/``Div`` scaling and ``Cast``
   to the QKᵀ ``MatMul`` (two non-constant operands).
2. Forward from the Softmax (through an ``IsNaN``→``Where`` guard, ``Cast``, ``Dropout``) to the ·V
   ``MatMul``.
3. Back from Q, K and V through head-split layout ops (Reshape, Transpose, Squeeze, Unsqueeze, Expand,
   Tile, and Split/Slice/Gather of a fused QKV), scalar scaling and rotary embeddings to a projection:
   ``MatMul`` with a constant weight (+ bias ``Add``), ``Gemm``, ``FusedMatMul``, or
   ``DynamicQuantizeLinear``→``MatMulInteger``. Weight constants may be folded chains (see
   :meth:`importers.graph.GraphIndex.constant_value`).
4. A numeric *probe* runs those layout ops on a tensor whose entries encode (token, column): what
   reaches the QKᵀ and ·V MatMuls tells the number of heads, the head size, the key/value head
   grouping (GQA) and exactly which weight column feeds which head, whatever the export's layout.
   The head count therefore comes from the graph's Reshape shape constants; the score scale is only
   a cross-check (a mismatch is recorded in ``notes``). Symbolic batch and sequence sizes are
   probed as 2 and 3 (or as the sizes a static export's head-split Reshape spells out).
5. Forward from the ·V MatMul through the head merge to the output projection W_O (probed the same
   way for its row order), an optional LayerScale ``Mul`` by a constant, and the residual ``Add``.
6. The norm: pre-LN when the attention input is a norm's output whose input also enters the
   residual Add; post-LN when the residual Add is the attention input plus the branch and feeds a
   norm. Norms are fused ``LayerNormalization``, the decomposed LayerNorm chain, RMSNorm
   (Pow/ReduceMean/Add/Sqrt/Reciprocal-or-Div/Mul/Mul), ``SimplifiedLayerNormalization`` or
   ``RMSNormalization``.
"""

from __future__ import annotations

import math
from collections.abc import Iterable
from dataclasses import dataclass, field, replace

import numpy as np

from importers.errors import NoAttentionBlocksError
from importers.graph import (
    GraphIndex,
    Node,
    OnnxModel,
    ShapeContext,
    apply_slice,
    apply_split,
    flatten,
    reshape_target,
    unsqueeze,
)

__all__ = [
    "AttentionBlock",
    "LinearMatch",
    "MatchFailure",
    "MatchReport",
    "NormMatch",
    "find_attention_blocks",
]

#: Sizes assumed for symbolic batch and sequence dimensions while probing layouts.
PROBE_BATCH = 2
PROBE_SEQUENCE = 3
#: Relative mismatch tolerated between the score scale found and 1/sqrt(d_head).
SCALE_RTOL = 1e-3

_MAX_WALK = 64
_LAYOUT_OPS = frozenset(
    "Transpose Reshape Squeeze Unsqueeze Flatten Expand Tile Split Slice Gather "
    "Identity Cast Dropout".split()
)
_MERGE_OPS = frozenset("Transpose Reshape Flatten Squeeze Unsqueeze Identity Cast Dropout".split())
_VALUE_PRESERVING = frozenset({"Identity", "Cast", "Dropout"})
_SCORE_PASS = frozenset({"Cast", "Identity"})
_LINEAR_OPS = frozenset({"MatMul", "Gemm", "FusedMatMul"})
_FUSED_ATTENTION = frozenset(
    {"Attention", "MultiHeadAttention", "GroupQueryAttention", "PackedAttention"}
)


@dataclass(frozen=True)
class MatchFailure:
    """Why one Softmax was not matched as an attention block.

    Attributes
    ----------
    softmax : str
        The Softmax node's name (or ``"Softmax#<position>"``).
    reason : str
        One line, naming the part that was not found or did not fit.
    nodes : tuple of str
        Nodes involved in the rejection.
    code : str
        A stable short tag for the kind of failure (e.g. ``"value_matmul_missing"``).
    """

    softmax: str
    reason: str
    nodes: tuple[str, ...] = ()
    code: str = "other"


@dataclass(frozen=True)
class LinearMatch:
    """A projection ``y = x @ W + b`` found in the graph (weights not read yet).

    ``kind`` is ``"matmul"``, ``"gemm"``, ``"fused_matmul"`` or ``"matmul_integer"`` (onnxruntime
    dynamic quantisation; ``weight_scale``/``weight_zero_point`` name the dequantisation constants).
    ``transpose`` says the stored weight is (out, in); ``alpha``/``beta`` are Gemm's factors.
    """

    kind: str
    x: str
    weight: str
    output: str
    d_in: int
    d_out: int
    bias: str | None = None
    transpose: bool = False
    alpha: float = 1.0
    beta: float = 1.0
    weight_scale: str | None = None
    weight_zero_point: str | None = None
    nodes: tuple[str, ...] = ()


@dataclass(frozen=True)
class NormMatch:
    """A normalisation found by structure: ``kind`` is ``"layernorm"`` or ``"rmsnorm"``."""

    kind: str
    input: str
    output: str
    gamma: str | None
    beta: str | None
    eps: float | None
    nodes: tuple[str, ...]


@dataclass(frozen=True, eq=False)
class AttentionBlock:
    """One matched self-attention sub-block (structure; weights via :mod:`importers.weights`).

    Attributes
    ----------
    index : int
        Depth order (0 = closest to the input).
    softmax : str
        Name of the Softmax node.
    n_heads, n_kv_heads, d_model, d_head : int
    norm : {"pre", "post", "none"}
    norm_kind : {"layernorm", "rmsnorm"} or None
    has_layer_scale : bool
    scale : float
        Product of the scalar factors found on Q, K and the scores (1/sqrt(d_head) normally).
    input_name : str
        Residual stream entering the block (pre-LN: the norm's input; post-LN: the attention input).
    residual_name : str or None
        Output of the attention residual Add.
    norm_output_name : str or None
        Post-LN only: output of the norm after the residual Add.
    output_name : str
        Block output after the MLP sub-block when found (else the attention sub-block's output).
    attention_name : str
        The Softmax output (attention probabilities, shape (..., n_heads, T, T)).
    q, k, v, o : LinearMatch
        The projections (Q, K, V may be one fused projection).
    q_columns, k_columns, v_columns : ndarray of int
        Columns of the projection weight, in canonical order (head-major, contiguous heads;
        K and V hold the ``n_kv_heads`` distinct heads).
    o_rows : ndarray of int
        Rows of the W_O weight in canonical order (row ``h*d_head + j`` is head h, feature j).
    norm_match : NormMatch or None
    layer_scale : str or None
        The constant of the LayerScale Mul.
    notes : tuple of str
        Non-fatal observations (e.g. a score scale differing from 1/sqrt(d_head)).
    roles : dict of str to str
        Node names by role, for reports.
    """

    index: int
    softmax: str
    n_heads: int
    n_kv_heads: int
    d_model: int
    d_head: int
    norm: str
    norm_kind: str | None
    has_layer_scale: bool
    scale: float
    input_name: str
    residual_name: str | None
    norm_output_name: str | None
    output_name: str
    attention_name: str
    q: LinearMatch = field(repr=False)
    k: LinearMatch = field(repr=False)
    v: LinearMatch = field(repr=False)
    o: LinearMatch = field(repr=False)
    q_columns: np.ndarray = field(repr=False)
    k_columns: np.ndarray = field(repr=False)
    v_columns: np.ndarray = field(repr=False)
    o_rows: np.ndarray = field(repr=False)
    norm_match: NormMatch | None = field(repr=False)
    layer_scale: str | None = field(repr=False)
    notes: tuple[str, ...] = ()
    roles: dict[str, str] = field(default_factory=dict, repr=False)

    @property
    def sources(self) -> dict[str, str]:
        """Graph tensors the weights come from (``W_Q``, ``b_Q``, ..., ``gamma``, ``layer_scale``)."""
        found = {"softmax": self.softmax}
        for key, linear in (("Q", self.q), ("K", self.k), ("V", self.v), ("O", self.o)):
            found[f"W_{key}"] = linear.weight
            if linear.bias is not None:
                found[f"b_{key}"] = linear.bias
        if self.norm_match is not None:
            if self.norm_match.gamma is not None:
                found["gamma"] = self.norm_match.gamma
            if self.norm_match.beta is not None:
                found["beta"] = self.norm_match.beta
        if self.layer_scale is not None:
            found["layer_scale"] = self.layer_scale
        return found

    def summary(self) -> str:
        """One line: heads, sizes, norm, LayerScale."""
        norm = self.norm if self.norm_kind is None else f"{self.norm}-LN {self.norm_kind}"
        scale = ", LayerScale" if self.has_layer_scale else ""
        return (
            f"{self.n_heads} heads ({self.n_kv_heads} kv) x {self.d_head}, "
            f"d_model {self.d_model}, norm {norm}{scale}"
        )


@dataclass(frozen=True)
class MatchReport:
    """Result of :func:`find_attention_blocks`.

    Attributes
    ----------
    blocks : list of AttentionBlock
        In depth (graph) order.
    failures : list of MatchFailure
        One per Softmax that was not matched.
    n_softmax : int
        Number of Softmax nodes examined.
    """

    blocks: list[AttentionBlock]
    failures: list[MatchFailure]
    n_softmax: int

    def explain(self) -> str:
        """Multi-line text: for each Softmax, what matched or why it was rejected."""
        lines = [
            f"{self.n_softmax} Softmax node(s): {len(self.blocks)} attention block(s) matched, "
            f"{len(self.failures)} rejected"
        ]
        for block in self.blocks:
            lines.append(f"Softmax {block.softmax!r}: block {block.index}: {block.summary()}")
            lines.extend(f"  {role}: {what}" for role, what in block.roles.items())
            lines.extend(f"  note: {note}" for note in block.notes)
        for failure in self.failures:
            lines.append(
                f"Softmax {failure.softmax!r}: rejected [{failure.code}]: {failure.reason}"
            )
            if failure.nodes:
                lines.append(f"  nodes: {', '.join(failure.nodes)}")
        return "\n".join(lines)


class _RejectError(Exception):
    """Internal: abandon the current Softmax candidate with a reason."""

    def __init__(
        self,
        code: str,
        reason: str,
        nodes: Iterable[str] = (),
        probe_sizes: tuple[int, int] | None = None,
    ) -> None:
        super().__init__(reason)
        self.code = code
        self.reason = reason
        self.nodes = tuple(nodes)
        self.probe_sizes = probe_sizes  # (batch, sequence) a static Reshape asks for


@dataclass(frozen=True)
class _Step:
    """One op on the path between a projection and an attention MatMul operand."""

    node: Node
    source: str
    output: str
    skip: bool  # value-preserving for the probe (Cast, scalar scaling, rotary embedding)


@dataclass(frozen=True)
class _Trace:
    role: str
    linear: LinearMatch
    steps: tuple[_Step, ...]
    scale: float
    rope: bool


@dataclass(frozen=True)
class _Heads:
    """Decoded head layout at one attention operand."""

    columns: np.ndarray  # (n_heads, d_head) projection columns feeding each query head
    head_of: np.ndarray  # (N,) head index of each flattened leading position
    batch_of: np.ndarray  # (N,) batch index of each flattened leading position


@dataclass(frozen=True)
class _Layout:
    """The probe's findings at the two attention MatMuls."""

    q: _Heads
    k: _Heads
    v: _Heads
    lead: tuple[int, ...]  # broadcast leading axes of the scores, e.g. (batch, heads)
    tokens: int


def find_attention_blocks(model: OnnxModel) -> MatchReport:
    """Match every Softmax of ``model`` as a self-attention block.

    Parameters
    ----------
    model : OnnxModel
        From :func:`importers.graph.load_model`.

    Returns
    -------
    MatchReport
        ``blocks`` in depth order, ``failures`` for the Softmax nodes that did not match.

    Raises
    ------
    NoAttentionBlocksError
        No Softmax node at all, or none matched (exit status 1; carries the failures).
    """
    index = model.index
    softmaxes = index.nodes_of_type("Softmax")
    if not softmaxes:
        fused = [node.op_type for node in index.nodes if node.op_type in _FUSED_ATTENTION]
        raise NoAttentionBlocksError.from_failures([], fused=fused)
    matchers = {(PROBE_BATCH, PROBE_SEQUENCE): _Matcher(index, PROBE_BATCH, PROBE_SEQUENCE)}
    blocks: list[AttentionBlock] = []
    failures: list[MatchFailure] = []
    for softmax in softmaxes:
        try:
            blocks.append(_match_with_retry(matchers, index, softmax, len(blocks)))
        except _RejectError as reject:
            failures.append(MatchFailure(softmax.label, reject.reason, reject.nodes, reject.code))
    if not blocks:
        raise NoAttentionBlocksError.from_failures(failures)
    return MatchReport(blocks=blocks, failures=failures, n_softmax=len(softmaxes))


def _match_with_retry(
    matchers: dict[tuple[int, int], _Matcher], index: GraphIndex, softmax: Node, position: int
) -> AttentionBlock:
    """Match with the default probe sizes; if a static head-split Reshape needs other batch and
    sequence sizes (an export with fixed shapes), match once more with those."""
    try:
        return matchers[(PROBE_BATCH, PROBE_SEQUENCE)].match(softmax, position)
    except _RejectError as reject:
        sizes = reject.probe_sizes
        if sizes is None or sizes == (PROBE_BATCH, PROBE_SEQUENCE):
            raise
    if sizes not in matchers:
        matchers[sizes] = _Matcher(index, *sizes)
    return matchers[sizes].match(softmax, position)


class _Matcher:
    """Pattern matching over one graph (one shape context, shared across candidates).

    ``batch`` and ``sequence`` are the sizes assumed for symbolic dimensions while probing.
    """

    def __init__(self, index: GraphIndex, batch: int, sequence: int) -> None:
        self.index = index
        self.context = ShapeContext(index, batch=batch, sequence=sequence)

    # -- helpers ----------------------------------------------------------------------------------
    def const(self, name: str) -> np.ndarray | None:
        return self.index.constant_value(name) if name else None

    def producer(self, name: str) -> Node | None:
        return self.index.producer(name) if name else None

    def consumers(self, name: str) -> list[Node]:
        """Consumers other than Shape (shape arithmetic reads tensors without using values)."""
        return [
            node for node in self.index.consumers(name) if node.op_type not in ("Shape", "Size")
        ]

    def strip_casts(self, name: str) -> str:
        node = self.producer(name)
        while node is not None and node.op_type in ("Cast", "Identity"):
            name = node.input(0)
            node = self.producer(name)
        return name

    def scalar_factor(self, node: Node) -> tuple[float | None, str]:
        """(factor, data input) for a Mul/Div by a one-element constant, else (None, "")."""
        if node.op_type == "Mul":
            for const_pos in (1, 0):
                value = self.const(node.input(const_pos))
                if (
                    value is not None
                    and value.size == 1
                    and self.const(node.input(1 - const_pos)) is None
                ):
                    return float(value.ravel()[0]), node.input(1 - const_pos)
        if node.op_type == "Div":
            value = self.const(node.input(1))
            if value is not None and value.size == 1 and float(value.ravel()[0]) != 0.0:
                return 1.0 / float(value.ravel()[0]), node.input(0)
        return None, ""

    # -- the whole block --------------------------------------------------------------------------
    def match(self, softmax: Node, index: int) -> AttentionBlock:
        scores, score_scale, score_nodes = self.scores_matmul(softmax)
        value_matmul, guard = self.value_matmul(softmax)
        q = self.trace(scores.input(0), "Q")
        k = self.trace(scores.input(1), "K")
        v = self.trace(value_matmul.input(1), "V")
        self.check_self_attention(q, k, v)
        layout = self.probe_heads(q, k, v)
        self.check_softmax_axis(softmax, len(layout.lead) + 2)
        columns = self.head_columns(layout.q, layout.k, layout.v)
        n_heads, d_head = layout.q.columns.shape
        o, o_rows = self.output_projection(value_matmul, layout)
        d_model = q.linear.d_in
        if o.d_out != d_model or k.linear.d_in != d_model or v.linear.d_in != d_model:
            raise _RejectError(
                "width_mismatch",
                f"widths disagree: Q/K/V read {q.linear.d_in}/{k.linear.d_in}/{v.linear.d_in} "
                f"features but W_O writes {o.d_out}",
                (o.nodes[-1],),
            )
        scale = score_scale * q.scale * k.scale
        notes = self.scale_notes(scale, d_head)
        stream = self.block_stream(q.linear.x, o)
        roles = {
            "scores": f"MatMul {scores.label!r}"
            + (f" via {', '.join(score_nodes)}" if score_nodes else ""),
            "value": f"MatMul {value_matmul.label!r}"
            + (f" after {', '.join(guard)}" if guard else ""),
            "Q": _describe_linear(q),
            "K": _describe_linear(k),
            "V": _describe_linear(v),
            "O": f"{o.kind} {', '.join(o.nodes)} (weight {o.weight!r})",
            **stream.pop("roles"),
        }
        return AttentionBlock(
            index=index,
            softmax=softmax.label,
            n_heads=n_heads,
            n_kv_heads=columns["n_kv_heads"],
            d_model=d_model,
            d_head=d_head,
            scale=scale,
            attention_name=softmax.outputs[0],
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
            **stream,
        )

    def check_self_attention(self, q: _Trace, k: _Trace, v: _Trace) -> None:
        sources = {self.stream_tensor(trace.linear.x) for trace in (q, k, v)}
        if len(sources) != 1:
            raise _RejectError(
                "not_self_attention",
                f"Q, K and V project different tensors ({', '.join(sorted(sources))}); "
                f"only self-attention is supported",
            )

    def check_softmax_axis(self, softmax: Node, rank: int) -> None:
        axis = int(softmax.attr("axis", -1))
        if axis not in (-1, rank - 1):
            raise _RejectError(
                "softmax_axis",
                f"Softmax axis is {axis}; expected the last axis (-1) of the rank-{rank} scores",
                (softmax.label,),
            )

    @staticmethod
    def scale_notes(scale: float, d_head: int) -> tuple[str, ...]:
        expected = 1.0 / math.sqrt(d_head)
        if abs(scale / expected - 1.0) <= SCALE_RTOL:
            return ()
        return (
            f"score scale {scale:.6g} differs from 1/sqrt(d_head) = {expected:.6g} "
            f"(d_head {d_head} taken from the head-split Reshape)",
        )

    # -- 1. scores ---------------------------------------------------------------------------------
    def scores_matmul(self, softmax: Node) -> tuple[Node, float, list[str]]:
        """Walk back from the Softmax to the QKᵀ MatMul; returns (MatMul, scale, nodes passed)."""
        name, scale, passed = softmax.input(0), 1.0, []
        for _ in range(_MAX_WALK):
            node = self.producer(name)
            if node is None:
                raise _RejectError(
                    "no_qk_matmul",
                    f"QK^T MatMul not found: the Softmax input comes from {self.origin(name)}",
                )
            if node.op_type == "MatMul":
                for operand in node.inputs:
                    if self.const(operand) is not None:
                        raise _RejectError(
                            "no_qk_matmul",
                            f"QK^T MatMul not found: MatMul {node.label!r} multiplies by the "
                            f"constant {operand!r}, not a query-key product",
                            (node.label,),
                        )
                return node, scale, passed
            factor, data = (
                self.scalar_factor(node) if node.op_type in ("Mul", "Div") else (None, "")
            )
            if factor is not None:
                scale, name = scale * factor, data
            elif node.op_type in _SCORE_PASS:
                name = node.input(0)
            elif node.op_type in ("Add", "Sub", "Where"):
                name = self.score_branch(node)
            elif node.op_type in ("Mul", "Div"):
                raise _RejectError(
                    "score_scale_not_constant",
                    f"the scores are scaled by a non-constant factor: {node.op_type} "
                    f"{node.label!r} reads {self.origin(self.scale_operand(node))}",
                    (node.label,),
                )
            else:
                raise _RejectError(
                    "no_qk_matmul",
                    f"QK^T MatMul not found: walking back from the Softmax reached "
                    f"{node.op_type} {node.label!r}",
                    (node.label,),
                )
            passed.append(f"{node.op_type} {node.label!r}")
        raise _RejectError("no_qk_matmul", "QK^T MatMul not found: the path is too long")

    def scale_operand(self, node: Node) -> str:
        """The operand of a score Mul/Div that is not the scores."""
        if node.op_type == "Div" or self.reaches_qk(node.input(0), depth=12):
            return node.input(1)
        return node.input(0)

    def score_branch(self, node: Node) -> str:
        """The input of a mask Add/Sub/Where that carries the scores."""
        positions = {"Add": (0, 1), "Sub": (0,), "Where": (1, 2)}[node.op_type]
        candidates = [
            node.input(i) for i in positions if node.input(i) and self.const(node.input(i)) is None
        ]
        if len(candidates) == 1:
            return candidates[0]
        reaching = [name for name in candidates if self.reaches_qk(name, depth=12)]
        if reaching:
            return reaching[0]
        raise _RejectError(
            "no_qk_matmul",
            f"QK^T MatMul not found: no input of {node.op_type} {node.label!r} comes from a "
            f"product of two non-constant tensors",
            (node.label,),
        )

    def reaches_qk(self, name: str, depth: int) -> bool:
        """Whether a product of two non-constant tensors lies within ``depth`` mask/scale ops."""
        frontier, seen = [name], set()
        for _ in range(depth):
            next_frontier = []
            for tensor in frontier:
                node = self.producer(tensor)
                if node is None or node.position in seen:
                    continue
                seen.add(node.position)
                if node.op_type == "MatMul":
                    if all(self.const(operand) is None for operand in node.inputs):
                        return True
                elif node.op_type in ("Add", "Sub", "Mul", "Div", "Where", "Cast", "Identity"):
                    next_frontier.extend(operand for operand in node.inputs if operand)
            frontier = next_frontier
        return False

    # -- 2. value MatMul ---------------------------------------------------------------------------
    def value_matmul(self, softmax: Node) -> tuple[Node, list[str]]:
        """Walk forward from the Softmax to the MatMul with V; returns (MatMul, guard nodes)."""
        name, passed = softmax.outputs[0], []
        for _ in range(8):
            users = self.consumers(name)
            matmuls = [node for node in users if node.op_type == "MatMul" and node.input(0) == name]
            if len(matmuls) == 1:
                return matmuls[0], passed
            guard = self.nan_guard(name, users)
            if guard is not None:
                passed.append(f"IsNaN/Where guard {guard.label!r}")
                name = guard.outputs[0]
                continue
            if (
                len(users) == 1
                and users[0].op_type in _VALUE_PRESERVING
                and users[0].input(0) == name
            ):
                passed.append(f"{users[0].op_type} {users[0].label!r}")
                name = users[0].outputs[0]
                continue
            break
        where = ", ".join(f"{node.op_type} {node.label!r}" for node in users) or (
            "a graph output only" if name in self.index.graph_outputs else "nothing"
        )
        raise _RejectError(
            "value_matmul_missing",
            f"value MatMul not found: the Softmax output goes to {where}",
            tuple(node.label for node in users),
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

    # -- 3. projections ----------------------------------------------------------------------------
    def trace(self, name: str, role: str) -> _Trace:
        """Walk back from an attention operand to its projection."""
        steps: list[_Step] = []
        scale, rope, start = 1.0, False, name
        for _ in range(_MAX_WALK):
            linear = self.linear_ending_at(name, role)
            if linear is not None:
                return _Trace(role, linear, tuple(reversed(steps)), scale, rope)
            node = self.producer(name)
            if node is None:
                raise _RejectError(
                    f"{role.lower()}_projection_missing",
                    f"{role} projection not found: walking back from the attention reached "
                    f"{self.origin(name)}",
                )
            op = node.op_type
            if op in _LAYOUT_OPS and node.input(0):
                steps.append(_Step(node, node.input(0), name, skip=op in _VALUE_PRESERVING))
                name = node.input(0)
                continue
            factor, data = self.scalar_factor(node) if op in ("Mul", "Div") else (None, "")
            if factor is not None:
                scale *= factor
                steps.append(_Step(node, data, name, skip=True))
                name = data
                continue
            source = self.rope_source(node) if op == "Add" else None
            if source is not None:
                rope = True
                steps.append(_Step(node, source, name, skip=True))
                name = source
                continue
            raise _RejectError(
                f"{role.lower()}_projection_missing",
                f"{role} projection not found: walking back from {start!r} reached {op} "
                f"{node.label!r} (expected a MatMul/Gemm with a constant weight)",
                (node.label,),
            )
        raise _RejectError(
            f"{role.lower()}_projection_missing", f"{role} projection not found: path too long"
        )

    def origin(self, name: str) -> str:
        """Where a tensor comes from, for messages (graph inputs it is computed from, if few)."""
        if name in self.index.graph_inputs:
            return f"graph input {name!r}"
        if self.const(name) is not None:
            return f"constant {name!r}"
        inputs = self.input_ancestors(name, depth=6)
        if inputs:
            return f"tensor {name!r}, computed from graph input {', '.join(map(repr, inputs))}"
        return f"tensor {name!r}"

    def input_ancestors(self, name: str, depth: int) -> list[str]:
        frontier, found = [name], []
        for _ in range(depth):
            next_frontier = []
            for tensor in frontier:
                if tensor in self.index.graph_inputs and tensor not in found:
                    found.append(tensor)
                node = self.producer(tensor)
                if node is not None:
                    next_frontier.extend(operand for operand in node.inputs if operand)
            frontier = next_frontier
        return found

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
            raise _RejectError(
                f"{role.lower()}_weight_not_constant",
                f"{role} projection weight is not a constant: {node.op_type} {node.label!r} "
                f"reads its weight from {self.origin(weight_name)}",
                (node.label,),
            )
        transpose_a = bool(node.attr("transA", 0))
        transpose = bool(node.attr("transB", 0)) if node.op_type != "MatMul" else False
        if weight.ndim != 2 or transpose_a:
            raise _RejectError(
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
            if integer is None or integer.op_type != "MatMulInteger":
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
        if len(muls) != 2 or any(mul is None or mul.op_type != "Mul" for mul in muls):
            return None
        for plain, rotated in (muls, muls[::-1]):
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

    # -- 4. the probe ------------------------------------------------------------------------------
    def probe_heads(self, q: _Trace, k: _Trace, v: _Trace) -> _Layout:
        """Run each projection→operand path on an encoded tensor and decode the head layout."""
        q_value = self.run_path(q)
        k_value = self.run_path(k)
        v_value = self.run_path(v)
        lead = _broadcast_lead(q_value, k_value, v_value)
        tokens = q_value.shape[-2]
        q_heads = self.decode(q_value, q, lead, tokens, transposed=False)
        k_heads = self.decode(k_value, k, lead, tokens, transposed=True)
        v_heads = self.decode(v_value, v, lead, tokens, transposed=False)
        for role, heads in (("K", k_heads), ("V", v_heads)):
            if not (
                np.array_equal(heads.head_of, q_heads.head_of)
                and np.array_equal(heads.batch_of, q_heads.batch_of)
            ):
                raise _RejectError(
                    "head_layout", f"{role} heads are not aligned with the query heads"
                )
        return _Layout(q_heads, k_heads, v_heads, lead, tokens)

    def lead_shape(self, linear: LinearMatch) -> tuple[int, ...]:
        shape = self.context.shape(linear.x)
        if shape is None or len(shape) < 2 or shape[-1] != linear.d_in:
            return (PROBE_BATCH, PROBE_SEQUENCE)
        return shape[:-1]

    def run_path(self, trace: _Trace) -> np.ndarray:
        lead = self.lead_shape(trace.linear)
        width = trace.linear.d_out
        positions = math.prod(lead)
        value = (
            np.arange(positions, dtype=np.float64)[:, None] * width + np.arange(width)
        ).reshape(*lead, width)
        self.context.set_shape(trace.linear.output, value.shape)
        for step in trace.steps:
            if not step.skip:
                value = self.apply(step, value, trace.role)
            self.context.set_shape(step.output, value.shape)
        return value

    def apply(self, step: _Step, value: np.ndarray, role: str) -> np.ndarray:
        node, op = step.node, step.node.op_type
        values = [self.context.value(name) if name else None for name in node.inputs[1:]]
        try:
            return _apply_layout(node, value, values, node.outputs.index(step.output))
        except (ValueError, TypeError, IndexError) as err:
            if op == "Reshape":
                target = (
                    "an unknown shape"
                    if values[0] is None
                    else str([int(d) for d in np.ravel(values[0])])
                )
                raise _RejectError(
                    "head_reshape",
                    f"{role} head-split Reshape {node.label!r} cannot reshape {role} of shape "
                    f"{value.shape} (projection width {value.shape[-1] if value.ndim else '?'}) "
                    f"into {target}",
                    (node.label,),
                    probe_sizes=_static_sizes(values[0], value),
                ) from None
            raise _RejectError(
                "head_layout",
                f"{role} head layout: {op} {node.label!r} cannot be applied to shape {value.shape}: {err}",
                (node.label,),
            ) from None

    def decode(
        self,
        value: np.ndarray,
        trace: _Trace,
        lead: tuple[int, ...],
        tokens: int,
        *,
        transposed: bool,
    ) -> _Heads:
        """Which projection columns reach each (position, head feature) of an attention operand."""
        role, width = trace.role, trace.linear.d_out
        path = _path_text(trace)
        if value.ndim < 2:
            raise _RejectError(
                "head_layout", f"{role} reaches the attention with shape {value.shape}"
            )
        if transposed:
            value = np.swapaxes(value, -1, -2)
        try:
            value = np.broadcast_to(value, (*lead, *value.shape[-2:]))
        except ValueError:
            raise _RejectError(
                "head_layout", f"{role} of shape {value.shape} does not broadcast to {lead}"
            ) from None
        flat = value.reshape(-1, *value.shape[-2:])
        columns, token = (
            np.mod(flat, width).astype(np.int64),
            np.floor_divide(flat, width).astype(np.int64),
        )
        features_on_tokens = not (columns == columns[:, :1, :]).all()
        tokens_on_features = not (token == token[:, :, :1]).all()
        if (
            transposed
            and (features_on_tokens or tokens_on_features)
            and self.untransposed(value, width)
        ):
            raise _RejectError(
                "k_not_transposed",
                f"K is not transposed for QK^T: it reaches the score MatMul as (..., tokens, "
                f"d_head) after {path}",
            )
        if features_on_tokens or tokens_on_features or flat.shape[1] != tokens:
            what = (
                "mixes projection features into the token axis"
                if features_on_tokens
                else "mixes tokens into the head-feature axis"
                if tokens_on_features
                else f"changes the token count to {flat.shape[1]}"
            )
            code = "head_reshape" if "Reshape" in path else "head_layout"
            raise _RejectError(
                code,
                f"{role} head split {what} (projection width {width}; path {path})",
            )
        return _group_heads(columns[:, 0, :], token[:, :, 0], tokens, role)

    @staticmethod
    def untransposed(value: np.ndarray, width: int) -> bool:
        swapped = np.swapaxes(value, -1, -2)
        columns = np.mod(swapped, width)
        return bool((columns == columns[..., :1, :]).all())

    def head_columns(self, q: _Heads, k: _Heads, v: _Heads) -> dict:
        d_head = q.columns.shape[1]
        if k.columns.shape[1] != d_head:
            raise _RejectError(
                "head_size", f"head sizes differ: Q has d_head={d_head}, K has {k.columns.shape[1]}"
            )
        if v.columns.shape[1] != d_head:
            raise _RejectError(
                "head_size",
                f"head sizes differ: Q/K have d_head={d_head}, V has {v.columns.shape[1]}",
            )
        q_columns = q.columns.ravel()
        if len(np.unique(q_columns)) != q_columns.size:
            raise _RejectError("head_layout", "query heads read overlapping projection columns")
        k_blocks, v_blocks = _kv_blocks(k.columns, "K"), _kv_blocks(v.columns, "V")
        if len(k_blocks) != len(v_blocks):
            raise _RejectError(
                "head_layout", f"K has {len(k_blocks)} distinct heads but V has {len(v_blocks)}"
            )
        return {
            "n_kv_heads": len(k_blocks),
            "q": q_columns,
            "k": np.concatenate(k_blocks),
            "v": np.concatenate(v_blocks),
        }

    # -- 5. output projection ----------------------------------------------------------------------
    def output_projection(
        self, value_matmul: Node, layout: _Layout
    ) -> tuple[LinearMatch, np.ndarray]:
        """Forward from the ·V MatMul through the head merge to W_O; returns (W_O, canonical rows)."""
        linear, steps = self.find_output_linear(value_matmul.outputs[0])
        n_heads, d_head = layout.q.columns.shape
        width, tokens = n_heads * d_head, layout.tokens
        head = layout.q.head_of[:, None, None] * d_head + np.arange(d_head)[None, None, :]
        token = layout.q.batch_of[:, None, None] * tokens + np.arange(tokens)[None, :, None]
        probe = (head + width * token).astype(np.float64).reshape(*layout.lead, tokens, d_head)
        self.context.set_shape(value_matmul.outputs[0], probe.shape)
        for step in steps:
            if not step.skip:
                probe = self.apply(step, probe, "attention output")
            self.context.set_shape(step.output, probe.shape)
        if probe.shape[-1] != width or linear.d_in != width:
            raise _RejectError(
                "head_merge",
                f"head merge gives {probe.shape[-1]} features and W_O reads {linear.d_in}; "
                f"expected n_heads*d_head = {width}",
                linear.nodes,
            )
        flat = probe.reshape(-1, width)
        rows, token = np.mod(flat, width).astype(np.int64), np.floor_divide(flat, width)
        if not ((rows == rows[:1]).all() and (token == token[:, :1]).all()):
            raise _RejectError(
                "head_merge", "the head merge mixes tokens into the feature axis", linear.nodes
            )
        if not np.array_equal(np.sort(rows[0]), np.arange(width)):
            raise _RejectError(
                "head_merge", "the head merge does not cover every head feature once", linear.nodes
            )
        return linear, np.argsort(rows[0])

    def find_output_linear(self, name: str) -> tuple[LinearMatch, tuple[_Step, ...]]:
        steps: list[_Step] = []
        for _ in range(_MAX_WALK):
            users = self.consumers(name)
            if len(users) != 1:
                where = (
                    ", ".join(f"{node.op_type} {node.label!r}" for node in users)
                    if users
                    else ("a graph output" if name in self.index.graph_outputs else "no node")
                )
                raise _RejectError(
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
                    _Step(user, name, user.outputs[0], skip=user.op_type in _VALUE_PRESERVING)
                )
                name = user.outputs[0]
                continue
            raise _RejectError(
                "no_output_projection",
                f"output projection not found: the attention output reaches {user.op_type} "
                f"{user.label!r}, not a MatMul with a constant weight",
                (user.label,),
            )
        raise _RejectError("no_output_projection", "output projection not found: path too long")

    def output_linear_at(self, user: Node, name: str) -> LinearMatch | None:
        """W_O when ``user`` starts a projection of ``name`` (else None)."""
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
        except _RejectError as reject:
            raise _RejectError("no_output_projection", reject.reason, reject.nodes) from None
        if linear is None or linear.x != name:
            raise _RejectError(
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

    # -- 6. residual and norm ----------------------------------------------------------------------
    def block_stream(self, x: str, o: LinearMatch) -> dict:
        """Residual Add, LayerScale, norm position and the block's input/output tensor names."""
        attention_input = self.stream_tensor(x)
        branch = self.strip_reshapes_forward(o.output)
        layer_scale, branch = self.layer_scale_after(branch, o.d_out)
        residual_node, residual_in = self.residual_add(branch)
        roles: dict[str, str] = {}
        if layer_scale is not None:
            roles["layer scale"] = f"Mul by constant {layer_scale!r}"
        norm, norm_match, norm_output = "none", None, None
        if residual_node is not None:
            roles["residual"] = f"Add {residual_node.label!r}"
            pre = self.norm_ending_at(attention_input)
            if pre is not None and self.strip_casts(pre.input) == self.strip_casts(residual_in):
                norm, norm_match = "pre", pre
            elif self.strip_casts(residual_in) == self.strip_casts(attention_input):
                post = self.norm_starting_at(residual_node.outputs[0])
                if post is not None:
                    norm, norm_match, norm_output = "post", post, post.output
        if norm_match is not None:
            roles["norm"] = f"{norm}-LN {norm_match.kind}: {', '.join(norm_match.nodes)}"
        residual = residual_node.outputs[0] if residual_node is not None else None
        block_input = (
            norm_match.input if norm == "pre" else (residual_in if residual_in else attention_input)
        )
        sub_block_output = norm_output or residual or o.output
        output = (
            self.block_output(sub_block_output, post=norm == "post")
            if residual
            else sub_block_output
        )
        return {
            "norm": norm,
            "norm_kind": norm_match.kind if norm_match is not None else None,
            "norm_match": norm_match,
            "has_layer_scale": layer_scale is not None,
            "layer_scale": layer_scale,
            "input_name": block_input,
            "residual_name": residual,
            "norm_output_name": norm_output,
            "output_name": output,
            "roles": roles,
        }

    def stream_tensor(self, name: str) -> str:
        """The residual-stream tensor behind a projection input: undo Casts and, for 2-D (Gemm)
        projections, the Reshape/Flatten that flattened the tokens."""
        name = self.strip_casts(name)
        node = self.producer(name)
        if node is not None and node.op_type in ("Reshape", "Flatten"):
            shape = self.context.shape(name)
            target = self.context.value(node.input(1)) if node.op_type == "Reshape" else None
            if (
                (shape is not None and len(shape) == 2)
                or (target is not None and target.size == 2)
                or node.op_type == "Flatten"
            ):
                return self.strip_casts(node.input(0))
        return name

    def strip_reshapes_forward(self, name: str) -> str:
        for _ in range(4):
            users = self.consumers(name)
            if len(users) == 1 and users[0].op_type in ("Reshape", "Cast", "Identity", "Dropout"):
                name = users[0].outputs[0]
            else:
                break
        return name

    def layer_scale_after(self, name: str, d_model: int) -> tuple[str | None, str]:
        users = self.consumers(name)
        if len(users) == 1 and users[0].op_type == "Mul":
            other = next((operand for operand in users[0].inputs if operand != name), "")
            value = self.const(other)
            if value is not None and value.size in (1, d_model):
                return other, self.strip_reshapes_forward(users[0].outputs[0])
        return None, name

    def residual_add(self, name: str) -> tuple[Node | None, str]:
        adds = [node for node in self.consumers(name) if node.op_type == "Add"]
        for node in adds:
            other = next((operand for operand in node.inputs if operand != name), "")
            if other and self.const(other) is None:
                return node, other
        return None, ""

    def block_output(self, name: str, *, post: bool) -> str:
        """After the attention sub-block: the MLP residual Add (and its norm for post-LN)."""
        for node in self.consumers(name):
            others = [operand for operand in node.inputs if operand != name]
            if node.op_type != "Add" or len(others) != 1 or self.const(others[0]) is not None:
                continue
            if post:
                norm = self.norm_starting_at(node.outputs[0])
                return norm.output if norm is not None else node.outputs[0]
            return node.outputs[0]
        return name

    def norm_starting_at(self, name: str) -> NormMatch | None:
        """The outermost norm (LayerNorm or RMSNorm) that reads ``name``, searching forward."""
        frontier, seen, best = [name], set(), None
        for _ in range(12):
            next_frontier = []
            for tensor in frontier:
                for node in self.consumers(tensor):
                    if node.position in seen:
                        continue
                    seen.add(node.position)
                    for output in node.outputs:
                        match = self.norm_ending_at(output)
                        if match is not None and self.strip_casts(match.input) == self.strip_casts(
                            name
                        ):
                            if best is None or len(match.nodes) > len(best.nodes):
                                best = match
                        next_frontier.append(output)
            frontier = next_frontier
        return best

    def norm_ending_at(self, name: str) -> NormMatch | None:
        """The norm whose output is ``name`` (fused op or decomposed chain), else None."""
        output, passed = name, []
        node = self.producer(self.strip_casts(name))
        if node is None:
            return None
        fused = self.fused_norm(node, output)
        if fused is not None:
            return fused
        beta = gamma = None
        if node.op_type == "Add":
            beta, inner = self.constant_operand(node)
            if beta is not None:
                passed.append(node.label)
                node = self.producer(self.strip_casts(inner))
        if node is not None and node.op_type == "Mul":
            gamma, inner = self.constant_operand(node)
            if gamma is not None:
                passed.append(node.label)
                node = self.producer(self.strip_casts(inner))
        if node is None:
            return None
        core = self.norm_core(node)
        if core is None:
            return None
        kind, x, eps, nodes = core
        if kind == "rmsnorm" and beta is not None:
            return None
        return NormMatch(kind, x, output, gamma, beta, eps, tuple(nodes) + tuple(reversed(passed)))

    def fused_norm(self, node: Node, output: str) -> NormMatch | None:
        kinds = {
            "LayerNormalization": "layernorm",
            "SimplifiedLayerNormalization": "rmsnorm",
            "RMSNormalization": "rmsnorm",
        }
        if node.op_type not in kinds:
            return None
        axis = int(node.attr("axis", -1))
        shape = self.context.shape(node.input(0))
        if axis != -1 and (shape is None or axis != len(shape) - 1):
            return None
        return NormMatch(
            kinds[node.op_type],
            node.input(0),
            output,
            node.input(1) or None,
            node.input(2) or None,
            float(node.attr("epsilon", 1e-5)),
            (node.label,),
        )

    def constant_operand(self, node: Node) -> tuple[str | None, str]:
        """(constant, other) for a binary node with one scalar or vector constant operand."""
        for const_pos in (1, 0):
            value = self.const(node.input(const_pos))
            if value is None or self.const(node.input(1 - const_pos)) is not None:
                continue
            if value.size == 1 or value.size == value.shape[-1]:
                return node.input(const_pos), node.input(1 - const_pos)
        return None, ""

    def norm_core(self, node: Node) -> tuple[str, str, float | None, list[str]] | None:
        """``(x - mean) / sqrt(var + eps)`` (layernorm) or ``x / sqrt(mean(x²) + eps)`` (rmsnorm)."""
        if node.op_type == "Div":
            numerator, root = node.input(0), self.producer(node.input(1))
            root_nodes = [node.label]
        elif node.op_type == "Mul":
            numerator, root, root_nodes = None, None, [node.label]
            for pos in (0, 1):
                candidate = self.producer(node.input(pos))
                inner = self.reciprocal_root(candidate)
                if inner is not None:
                    numerator, root = node.input(1 - pos), inner
                    root_nodes.append(candidate.label)
                    break
        else:
            return None
        if root is None or root.op_type != "Sqrt":
            return None
        variance = self.variance(root.input(0))
        if variance is None:
            return None
        squared, eps, variance_nodes = variance
        numerator = self.strip_casts(numerator)
        centred = self.producer(numerator)
        if centred is not None and centred.op_type == "Sub":
            mean = self.producer(centred.input(1))
            if mean is None or mean.op_type != "ReduceMean" or mean.input(0) != centred.input(0):
                return None
            if not self.last_axis(mean) or self.strip_casts(squared) != numerator:
                return None
            nodes = [mean.label, centred.label, *variance_nodes, root.label, *root_nodes]
            return "layernorm", centred.input(0), eps, nodes
        if self.strip_casts(squared) != numerator:
            return None
        return "rmsnorm", numerator, eps, [*variance_nodes, root.label, *root_nodes]

    def reciprocal_root(self, node: Node | None) -> Node | None:
        if node is None:
            return None
        if node.op_type == "Reciprocal":
            return self.producer(node.input(0))
        if node.op_type == "Div":
            one = self.const(node.input(0))
            if one is not None and one.size == 1 and float(one.ravel()[0]) == 1.0:
                return self.producer(node.input(1))
        return None

    def variance(self, name: str) -> tuple[str, float | None, list[str]] | None:
        """``ReduceMean(Pow(y, 2) | Mul(y, y)) + eps`` → (y, eps, nodes)."""
        add = self.producer(name)
        if add is None or add.op_type != "Add":
            return None
        eps_name, mean_name = self.constant_operand(add)
        if eps_name is None:
            return None
        mean = self.producer(mean_name)
        if mean is None or mean.op_type != "ReduceMean" or not self.last_axis(mean):
            return None
        square = self.producer(mean.input(0))
        if square is None:
            return None
        if square.op_type == "Pow":
            exponent = self.const(square.input(1))
            if exponent is None or exponent.size != 1 or float(exponent.ravel()[0]) != 2.0:
                return None
        elif not (square.op_type == "Mul" and square.input(0) == square.input(1)):
            return None
        eps = float(self.const(eps_name).ravel()[0])
        return square.input(0), eps, [square.label, mean.label, add.label]

    def last_axis(self, reduce: Node) -> bool:
        axes = self.const(reduce.input(1)) if reduce.input(1) else reduce.attr("axes")
        if axes is None or len(np.ravel(axes)) != 1:
            return False
        axis = int(np.ravel(axes)[0])
        if axis == -1:
            return True
        shape = self.context.shape(reduce.input(0))
        return (shape is not None and axis == len(shape) - 1) or (shape is None and axis == 2)


def _describe_linear(trace: _Trace) -> str:
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


def _static_sizes(target: np.ndarray | None, value: np.ndarray) -> tuple[int, int] | None:
    """(batch, sequence) spelled out by a static head-split target such as [1, 197, 12, 64]."""
    if target is None or value.ndim != 3:
        return None
    dims = [int(d) for d in np.ravel(target)]
    if len(dims) < 3 or dims[0] <= 0 or dims[1] <= 0:
        return None
    features = dims[2:]
    known = math.prod(d for d in features if d > 0)
    fits = (
        known == value.shape[-1] if all(d > 0 for d in features) else value.shape[-1] % known == 0
    )
    return (dims[0], dims[1]) if fits else None


def _path_text(trace: _Trace) -> str:
    steps = [f"{step.node.op_type} {step.node.label!r}" for step in trace.steps if not step.skip]
    return " -> ".join([f"projection {trace.linear.nodes[-1]!r}", *steps])


def _apply_layout(node: Node, value: np.ndarray, values: list, output: int) -> np.ndarray:
    """Apply one layout op to the probe (shape-like inputs already evaluated in ``values``)."""
    op = node.op_type
    if op == "Transpose":
        perm = node.attr("perm")
        return np.transpose(value, perm if perm is not None else None)
    if op == "Reshape":
        if values[0] is None:
            raise ValueError("the target shape could not be evaluated")
        return value.reshape(
            reshape_target(value.shape, values[0], allowzero=bool(node.attr("allowzero", 0)))
        )
    if op == "Flatten":
        return flatten(value, int(node.attr("axis", 1)))
    if op in ("Squeeze", "Unsqueeze"):
        axes = values[0] if values and values[0] is not None else node.attr("axes")
        axes = None if axes is None else [int(axis) for axis in np.ravel(axes)]
        if op == "Unsqueeze":
            return unsqueeze(value, axes or [])
        return np.squeeze(value) if axes is None else np.squeeze(value, axis=tuple(axes))
    if op == "Expand":
        return np.broadcast_to(
            value, np.broadcast_shapes(value.shape, tuple(int(d) for d in np.ravel(values[0])))
        )
    if op == "Tile":
        return np.tile(value, [int(r) for r in np.ravel(values[0])])
    if op == "Split":
        return apply_split(node, value, values[0] if values else None, output)
    if op == "Slice":
        return apply_slice(value, *(values + [None] * (4 - len(values)))[:4])
    if op == "Gather":
        if values[0] is None:
            raise ValueError("the Gather indices are not constant")
        return np.take(value, values[0], axis=int(node.attr("axis", 0)))
    raise ValueError(f"{op} is not a layout op")


def _broadcast_lead(*values: np.ndarray) -> tuple[int, ...]:
    try:
        return tuple(np.broadcast_shapes(*(value.shape[:-2] for value in values)))
    except ValueError:
        raise _RejectError(
            "head_layout",
            "Q, K and V head axes do not broadcast: "
            + ", ".join(str(value.shape) for value in values),
        ) from None


def _group_heads(columns: np.ndarray, token: np.ndarray, tokens: int, role: str) -> _Heads:
    """Split flattened leading positions into (batch, head) from the encoded token index."""
    batch = token[:, 0] // tokens
    expected = batch[:, None] * tokens + np.arange(tokens)[None, :]
    if not np.array_equal(token, expected):
        raise _RejectError("head_layout", f"{role} reorders or mixes tokens between sequences")
    head = np.zeros(len(batch), dtype=np.int64)
    per_batch = None
    for b in np.unique(batch):
        positions = np.flatnonzero(batch == b)
        head[positions] = np.arange(len(positions))
        if per_batch is None:
            per_batch = columns[positions]
        elif not np.array_equal(per_batch, columns[positions]):
            raise _RejectError("head_layout", f"{role} heads differ between batch items")
    return _Heads(columns=per_batch, head_of=head, batch_of=batch)


def _kv_blocks(columns: np.ndarray, role: str) -> list[np.ndarray]:
    """Distinct key/value heads in order; query head h must use kv head h // (n_heads / n_kv)."""
    blocks: list[np.ndarray] = []
    for row in columns:
        if not any(np.array_equal(row, block) for block in blocks):
            blocks.append(row)
    n_heads, n_kv = len(columns), len(blocks)
    if n_heads % n_kv:
        raise _RejectError(
            "head_layout", f"{n_heads} query heads cannot share {n_kv} {role} heads evenly"
        )
    group = n_heads // n_kv
    for head, row in enumerate(columns):
        if not np.array_equal(row, blocks[head // group]):
            raise _RejectError(
                "head_layout",
                f"{role} heads are not grouped contiguously: query head {head} does not use "
                f"{role} head {head // group} of {n_kv}",
            )
    flat = np.concatenate(blocks)
    if len(np.unique(flat)) != flat.size:
        raise _RejectError("head_layout", f"{role} heads read overlapping projection columns")
    return blocks
