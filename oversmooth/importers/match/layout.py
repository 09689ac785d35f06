"""The head layout probe: which projection columns feed which head, and the head merge into W_O.

The layout ops between a projection and an attention MatMul are run on a tensor whose entries
encode (token, column); what reaches the QKᵀ and ·V MatMuls tells the number of heads, the head
size, the key/value head grouping (GQA) and exactly which weight column feeds which head. The same
encoding, run forward through the head merge, gives the row order of W_O.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np

from oversmooth.importers.match.codes import RejectCode
from oversmooth.importers.match.layout_ops import apply_layout as _apply_layout
from oversmooth.importers.match.limits import MAX_PROBE_TOKENS, PROBE_BATCH, PROBE_SEQUENCE
from oversmooth.importers.match.norms import NormMatcher
from oversmooth.importers.match.projections import Step, Trace, path_text
from oversmooth.importers.match.results import LinearMatch
from oversmooth.importers.match.walker import RejectError


@dataclass(frozen=True)
class _Heads:
    """Decoded head layout at one attention operand."""

    columns: np.ndarray  # (n_heads, d_head) projection columns feeding each query head
    head_of: np.ndarray  # (N,) head index of each flattened leading position
    batch_of: np.ndarray  # (N,) batch index of each flattened leading position
    time_major: bool = False  # the stream's positions run (token, batch), not (batch, token)


@dataclass(frozen=True)
class Layout:
    """The probe's findings at the two attention MatMuls."""

    q: _Heads
    k: _Heads
    v: _Heads
    lead: tuple[int, ...]  # broadcast leading axes of the scores, e.g. (batch, heads)
    tokens: int

    @property
    def time_major(self) -> bool:
        """The block's stream is (tokens, batch, features) (``nn.TransformerEncoder`` without
        ``batch_first``)."""
        return self.q.time_major


class LayoutProbe(NormMatcher):
    """Probe the head split at the attention MatMuls and the head merge before W_O."""

    def probe_heads(self, q: Trace, k: Trace, v: Trace) -> Layout:
        """Run each projection→operand path on an encoded tensor and decode the head layout."""
        q_value = self.run_path(q)
        k_value = self.run_path(k)
        v_value = self.run_path(v)
        _check_tokens(q_value, k_value, v_value)
        lead = _broadcast_lead(q_value, k_value, v_value)
        tokens = q_value.shape[-2]
        q_heads = self.decode(q_value, q, lead, tokens, transposed=False)
        k_heads = self.decode(k_value, k, lead, tokens, transposed=True)
        v_heads = self.decode(v_value, v, lead, tokens, transposed=False)
        for role, heads in (("K", k_heads), ("V", v_heads)):
            if not (
                np.array_equal(heads.head_of, q_heads.head_of)
                and np.array_equal(heads.batch_of, q_heads.batch_of)
                and heads.time_major == q_heads.time_major
            ):
                raise RejectError(
                    RejectCode.HEAD_LAYOUT, f"{role} heads are not aligned with the query heads"
                )
        return Layout(q_heads, k_heads, v_heads, lead, tokens)

    def lead_shape(self, linear: LinearMatch) -> tuple[int, ...]:
        """The positions of the projection input (its shape less the features)."""
        shape = self.context.shape(linear.x)
        if shape is not None and linear.channel_axis != -1 and len(shape) > 2:
            shape = (*shape[:1], *shape[2:], shape[1])  # (batch, channels, ...) → features last
        if shape is not None and linear.in_axes > 1 and len(shape) > linear.in_axes:
            shape = (*shape[: -linear.in_axes], math.prod(shape[-linear.in_axes :]))
        if shape is None or len(shape) < 2 or shape[-1] != linear.d_in:
            return (PROBE_BATCH, PROBE_SEQUENCE)
        return shape[:-1]

    def run_path(self, trace: Trace) -> np.ndarray:
        """The encoded projection output (entry ``position · width + column``, positions
        numbered in the stream's own layout) carried through the trace's steps."""
        width = trace.linear.d_out
        perm = self.stream_permutation(trace.linear.x)
        stream = self.context.shape(self.stream_tensor(trace.linear.x)) if perm else None
        if perm is None or stream is None or len(stream) != len(perm):
            lead = self.lead_shape(trace.linear)
            value = placed(self.encoded(lead, width), trace.linear)
        else:  # a (tokens, batch) view of the stream: number the stream's positions, then permute
            value = np.transpose(self.encoded(stream[:-1], width), perm)
            lead = self.lead_shape(trace.linear)
            if math.prod(lead) == math.prod(value.shape[:-1]):
                value = value.reshape(*lead, width)
        self.context.set_shape(trace.linear.output, value.shape)
        time_major = perm is not None and perm[:2] == (1, 0)
        for step in trace.steps:
            if not step.skip:
                value = self.apply(step, value, trace.role, time_major=time_major)
            self.context.set_shape(step.output, value.shape)
        return value

    @staticmethod
    def encoded(lead: Sequence[int], width: int) -> np.ndarray:
        """``(*lead, width)`` with entry ``position · width + column``, positions row-major."""
        positions = math.prod(lead)
        return (np.arange(positions, dtype=np.float64)[:, None] * width + np.arange(width)).reshape(
            *lead, width
        )

    def apply(
        self, step: Step, value: np.ndarray, role: str, *, time_major: bool = False
    ) -> np.ndarray:
        """``value`` carried through one layout step; a Reshape that cannot take it is declined
        with the (batch, sequence) probe sizes its static target spells out, if any (read as
        (tokens, batch) where the projections read a ``time_major`` view of the stream)."""
        node, op = step.node, step.node.op_type
        values = [self.context.value(name) if name else None for name in node.inputs[1:]]
        try:
            return _apply_layout(node, value, values, node.outputs.index(step.output))
        except (ValueError, TypeError, IndexError) as err:
            if op == "Reshape":
                shape = values[0] if values else None  # a Reshape without its shape input
                target = (
                    "an unknown shape" if shape is None else str([int(d) for d in np.ravel(shape)])
                )
                raise RejectError(
                    RejectCode.HEAD_RESHAPE,
                    f"{role} head-split Reshape {node.label!r} cannot reshape {role} of shape "
                    f"{value.shape} (projection width {value.shape[-1] if value.ndim else '?'}) "
                    f"into {target}",
                    (node.label,),
                    probe_sizes=_static_sizes(shape, value, time_major=time_major),
                ) from None
            raise RejectError(
                RejectCode.HEAD_LAYOUT,
                f"{role} head layout: {op} {node.label!r} cannot be applied to shape {value.shape}: {err}",
                (node.label,),
            ) from None

    def decode(
        self,
        value: np.ndarray,
        trace: Trace,
        lead: tuple[int, ...],
        tokens: int,
        *,
        transposed: bool,
    ) -> _Heads:
        """Which projection columns reach each (position, head feature) of an attention operand."""
        role, width = trace.role, trace.linear.d_out
        path = path_text(trace)
        if value.ndim < 2:
            raise RejectError(
                RejectCode.HEAD_LAYOUT, f"{role} reaches the attention with shape {value.shape}"
            )
        if transposed:
            value = np.swapaxes(value, -1, -2)
        try:
            value = np.broadcast_to(value, (*lead, *value.shape[-2:]))
        except ValueError:
            raise RejectError(
                RejectCode.HEAD_LAYOUT,
                f"{role} of shape {value.shape} does not broadcast to {lead}",
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
            raise RejectError(
                RejectCode.K_NOT_TRANSPOSED,
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
            code = RejectCode.HEAD_RESHAPE if "Reshape" in path else RejectCode.HEAD_LAYOUT
            raise RejectError(
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
            raise RejectError(
                RejectCode.HEAD_SIZE,
                f"head sizes differ: Q has d_head={d_head}, K has {k.columns.shape[1]}",
            )
        if v.columns.shape[1] != d_head:
            raise RejectError(
                RejectCode.HEAD_SIZE,
                f"head sizes differ: Q/K have d_head={d_head}, V has {v.columns.shape[1]}",
            )
        q_columns = q.columns.ravel()
        if len(np.unique(q_columns)) != q_columns.size:
            raise RejectError(
                RejectCode.HEAD_LAYOUT, "query heads read overlapping projection columns"
            )
        k_blocks, v_blocks = _kv_blocks(k.columns, "K"), _kv_blocks(v.columns, "V")
        if len(k_blocks) != len(v_blocks):
            raise RejectError(
                RejectCode.HEAD_LAYOUT,
                f"K has {len(k_blocks)} distinct heads but V has {len(v_blocks)}",
            )
        return {
            "n_kv_heads": len(k_blocks),
            "q": q_columns,
            "k": np.concatenate(k_blocks),
            "v": np.concatenate(v_blocks),
        }

    def merge_rows(
        self, name: str, steps: tuple[Step, ...], linear: LinearMatch, layout: Layout
    ) -> np.ndarray:
        """Probe the head merge from the ·V MatMul output ``name`` (through ``steps``) to W_O;
        returns the rows of W_O in canonical order."""
        n_heads, d_head = layout.q.columns.shape
        width, tokens = n_heads * d_head, layout.tokens
        head = layout.q.head_of[:, None, None] * d_head + np.arange(d_head)[None, None, :]
        token = layout.q.batch_of[:, None, None] * tokens + np.arange(tokens)[None, :, None]
        probe = (head + width * token).astype(np.float64).reshape(*layout.lead, tokens, d_head)
        self.context.set_shape(name, probe.shape)
        for step in steps:
            if not step.skip:
                probe = self.apply(step, probe, "attention output")
            self.context.set_shape(step.output, probe.shape)
        probe = features_last(probe, linear)
        if probe.shape[-1] != width or linear.d_in != width:
            raise RejectError(
                RejectCode.HEAD_MERGE,
                f"head merge gives {probe.shape[-1]} features and W_O reads {linear.d_in}; "
                f"expected n_heads*d_head = {width}",
                linear.nodes,
            )
        flat = probe.reshape(-1, width)
        rows, token = np.mod(flat, width).astype(np.int64), np.floor_divide(flat, width)
        if not ((rows == rows[:1]).all() and (token == token[:, :1]).all()):
            raise RejectError(
                RejectCode.HEAD_MERGE,
                "the head merge mixes tokens into the feature axis",
                linear.nodes,
            )
        if not np.array_equal(np.sort(rows[0]), np.arange(width)):
            raise RejectError(
                RejectCode.HEAD_MERGE,
                "the head merge does not cover every head feature once",
                linear.nodes,
            )
        return np.argsort(rows[0])


def placed(value: np.ndarray, linear: LinearMatch) -> np.ndarray:
    """A projection output ``value`` (*positions, d_out) laid out as the projection writes it:
    the features shaped ``out_dims`` (Einsum) or moved to ``channel_axis`` (Conv)."""
    if linear.out_dims:
        value = value.reshape(*value.shape[:-1], *linear.out_dims)
    if linear.channel_axis != -1:
        value = np.moveaxis(value, -1, linear.channel_axis)
    return value


def features_last(value: np.ndarray, linear: LinearMatch) -> np.ndarray:
    """A projection input ``value`` with its features as one last axis (:func:`placed` undone
    for the input side: ``channel_axis`` moved last, ``in_axes`` trailing axes flattened)."""
    if linear.channel_axis != -1 and value.ndim > 2:
        value = np.moveaxis(value, linear.channel_axis, -1)
    if linear.in_axes > 1 and value.ndim > linear.in_axes:
        value = value.reshape(*value.shape[: -linear.in_axes], -1)
    return value


def _static_sizes(
    target: np.ndarray | None, value: np.ndarray, *, time_major: bool = False
) -> tuple[int, int] | None:
    """(batch, sequence) spelled out by a static head-split target such as [1, 197, 12, 64]
    (its leading pair swapped where ``time_major``: the target then spells (tokens, batch))."""
    sizes = _leading_sizes(target, value)
    return sizes[::-1] if sizes is not None and time_major else sizes


def _leading_sizes(target: np.ndarray | None, value: np.ndarray) -> tuple[int, int] | None:
    """The leading pair of a static head-split target that fits the projection width."""
    if target is None or value.ndim != 3:
        return None
    dims = [int(d) for d in np.ravel(target)]
    if len(dims) < 3 or dims[0] <= 0 or dims[1] <= 0 or dims[0] * dims[1] > MAX_PROBE_TOKENS:
        return None
    features = dims[2:]
    known = math.prod(d for d in features if d > 0)
    width = value.shape[-1]
    fits = known == width if all(d > 0 for d in features) else width % known == 0
    if fits:
        return (dims[0], dims[1])
    # nn.MultiheadAttention's (T, B·H, d_head): the heads folded into the second leading axis.
    folded = dims[1] * dims[2]
    if len(dims) == 3 and dims[2] > 0 and width % dims[2] == 0 and folded % width == 0:
        return (dims[0], folded // width)
    return None


def _check_tokens(q: np.ndarray, k: np.ndarray, v: np.ndarray) -> None:
    """Refuse operands that reach the attention empty at the probe's sizes.

    An open axis the graph downsamples (an OCR model's image width through a convolution stack)
    can shrink to nothing at the probe's short sequence: the attention then sees no tokens and the
    layout cannot be decoded. A head-split rejection, so the match is retried with every open axis
    :data:`~oversmooth.importers.match.limits.LONG_PROBE_SEQUENCE` long.
    """
    for role, value in (("Q", q), ("K", k), ("V", v)):
        if value.size == 0:
            raise RejectError(
                RejectCode.HEAD_RESHAPE,
                f"{role} reaches the attention with shape {value.shape}: no tokens at the probe's "
                f"sizes (an open axis shrinks to nothing on the way)",
            )


def _broadcast_lead(*values: np.ndarray) -> tuple[int, ...]:
    try:
        return tuple(np.broadcast_shapes(*(value.shape[:-2] for value in values)))
    except ValueError:
        raise RejectError(
            RejectCode.HEAD_LAYOUT,
            "Q, K and V head axes do not broadcast: "
            + ", ".join(str(value.shape) for value in values),
        ) from None


def _group_heads(columns: np.ndarray, token: np.ndarray, tokens: int, role: str) -> _Heads:
    """Split flattened leading positions into (batch, head) from the encoded token index.

    The stream's positions are numbered in its own layout: ``b · T + t`` for a batch-first stream,
    ``t · B + b`` for a time-major one (each row of an attention operand must be one sequence's
    tokens in order, either way).
    """
    batch = token[:, 0] // tokens
    expected = batch[:, None] * tokens + np.arange(tokens)[None, :]
    time_major = False
    if not np.array_equal(token, expected):
        if not _time_major(token, tokens):
            raise RejectError(
                RejectCode.HEAD_LAYOUT, f"{role} reorders or mixes tokens between sequences"
            )
        batch, time_major = token[:, 0], True
    head = np.zeros(len(batch), dtype=np.int64)
    per_batch = None
    for b in np.unique(batch):
        positions = np.flatnonzero(batch == b)
        head[positions] = np.arange(len(positions))
        if per_batch is None:
            per_batch = columns[positions]
        elif not np.array_equal(per_batch, columns[positions]):
            raise RejectError(RejectCode.HEAD_LAYOUT, f"{role} heads differ between batch items")
    if per_batch is None:
        raise RejectError(RejectCode.HEAD_LAYOUT, f"{role} heads: the probe reached no batch item")
    return _Heads(columns=per_batch, head_of=head, batch_of=batch, time_major=time_major)


def _time_major(token: np.ndarray, tokens: int) -> bool:
    """Whether each row's positions are ``t · B + b`` (a (tokens, batch) stream), B the rows'
    batch count."""
    rows = token.shape[0]
    items = (token.max() + 1) // tokens if token.size else 0
    if items == 0 or rows % items:
        return False
    batch = token[:, 0]
    expected = np.arange(tokens)[None, :] * items + batch[:, None]
    return bool(np.array_equal(token, expected) and np.all(batch < items))


def _kv_blocks(columns: np.ndarray, role: str) -> list[np.ndarray]:
    """Distinct key/value heads in order; query head h must use kv head h // (n_heads / n_kv)."""
    blocks: list[np.ndarray] = []
    for row in columns:
        if not any(np.array_equal(row, block) for block in blocks):
            blocks.append(row)
    n_heads, n_kv = len(columns), len(blocks)
    if n_heads % n_kv:
        raise RejectError(
            RejectCode.HEAD_LAYOUT, f"{n_heads} query heads cannot share {n_kv} {role} heads evenly"
        )
    group = n_heads // n_kv
    for head, row in enumerate(columns):
        if not np.array_equal(row, blocks[head // group]):
            raise RejectError(
                RejectCode.HEAD_LAYOUT,
                f"{role} heads are not grouped contiguously: query head {head} does not use "
                f"{role} head {head // group} of {n_kv}",
            )
    flat = np.concatenate(blocks)
    if len(np.unique(flat)) != flat.size:
        raise RejectError(
            RejectCode.HEAD_LAYOUT, f"{role} heads read overlapping projection columns"
        )
    return blocks
