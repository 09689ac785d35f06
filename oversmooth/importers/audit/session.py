"""The audit's onnxruntime session: which tensors are layers, their in-graph reductions, the runner.

Public API
----------
layer_tensors
    The graph tensors the audit records as layers (block 0's input, every block's output).
audit_session, AuditSession
    The session an audit runs (model plus in-graph reductions), for the audit, benchmarks and tools.
LOOKAHEAD_BATCHES
    Batches whose host work may still run while the next batch is inferred (that work and its
    overlap with inference: :mod:`oversmooth.importers.audit.host_work`).
check_finite_outputs
    Refuse a batch whose layer statistics or attention probabilities went NaN or infinite.
"""

from __future__ import annotations

from collections.abc import Iterator, Sequence
from dataclasses import dataclass, field
from typing import Any, Literal

import numpy as np

from oversmooth.importers.audit.dominance import (
    nonfinite_attention,
)
from oversmooth.importers.audit.layers import (
    check_counted_tokens,
    layer_tensors,
)
from oversmooth.importers.audit.pre_norm_sums import PreNormSums
from oversmooth.importers.errors import (
    ImporterError,
    NonFiniteModelError,
)
from oversmooth.importers.graph import OnnxModel
from oversmooth.importers.graph.shapes import ShapeContext
from oversmooth.importers.inputs.feeds import Inputs
from oversmooth.importers.match import AttentionBlock
from oversmooth.importers.runtime.batching import run_batches
from oversmooth.importers.runtime.reductions import Gram, ReductionPlan, TokenScale, plan_reductions
from oversmooth.importers.runtime.runner import Runner, default_threads
from oversmooth.simulator.backend import HostCopies, to_numpy
from oversmooth.simulator.statistics import (
    TokenStatistics,
)

__all__ = [
    "GRAM_NORM_SQ_LIMIT",
    "LOOKAHEAD_BATCHES",
    "STREAM_TERMS",
    "AuditSession",
    "attention_sublayer_tensor",
    "audit_session",
    "check_finite_outputs",
    "layer_tensors",
    "nonfinite_layer_items",
]

#: Batches whose host work (metrics, dominance) may still run while the next batch is inferred.
LOOKAHEAD_BATCHES = 1

#: What the depth step reads of each layer besides the metrics (per input and layer): the mean
#: token's norm ‖x̄‖ and the mean per-token ``1/s_t`` of the pre-norm reading it (docs/theory.md
#: §6.11).
STREAM_TERMS = ("mean_norm", "inverse_scale")


def _gram_orientation(graph: OnnxModel, layer0: str, first: Inputs, block: AttentionBlock) -> Gram:
    """The smaller Gram matrix of a (T, D) hidden state: T×T when T <= D is known, else D×D.

    Either gives the same singular values; the smaller costs less to build, to copy back and to
    diagonalise (DINOv2: T = 257 against D = 384, 2.2x fewer entries and host time). T is
    the token axis of the inputs' mask, else that of layer 0's shape with the graph inputs pinned
    to the first input's shapes, by the graph's own shape arithmetic (:class:`ShapeContext`: ONNX
    shape inference cannot follow DINOv2's position-embedding interpolation to its 257 tokens).
    """
    if first.token_mask is not None:
        tokens: int | None = first.token_mask.shape[1]
    else:
        shapes = ShapeContext(graph.index, batch=first.batch_size, sequence=1)
        for name, array in first.feeds.items():
            shapes.set_shape(name, np.shape(array))
        try:
            dims = shapes.shape(layer0)
        except ImporterError:  # no rule reaches it: the D×D Gram is always right
            dims = None
        token_axis = 0 if block.time_major else 1
        tokens = dims[token_axis] if dims is not None and len(dims) == 3 else None
    return "tokens" if tokens is not None and tokens <= block.d_model else "features"


@dataclass(frozen=True)
class AuditSession:
    """The audit's onnxruntime session: the model plus its in-graph reductions, and its feeds.

    Attributes
    ----------
    layers : list of str
        The layer tensors (:func:`layer_tensors`), reduced in the graph.
    sublayers : list of int
        The blocks whose stream after the attention sublayer
        (:func:`attention_sublayer_tensor`) is reduced too; their statistics follow the layers'
        in the plan, in this order.
    pre_norm_sums : list of int
        The post-LN blocks whose attention sublayer is measured on the residual sum before their
        norm (docs/theory.md §6.6), read from the graph onnxruntime optimised
        (:class:`~oversmooth.importers.runtime.graph_edits.LateOutputs`): last in the plan, in this
        order (:attr:`late_start`). Their entry among :attr:`sublayers` stays the norm's output.
    attention_inputs : list of int
        The blocks whose attention reads another stream than their layer's input
        (:attr:`~oversmooth.importers.match.AttentionBlock.attention_input_name`: sub-layers come before the
        attention inside the layer); that stream is reduced too, after the sublayers' in the
        plan, in this order (:attr:`reads`).
    attention : list of str
        The attention probabilities fetched per block (empty without dominance).
    plan : ReductionPlan
    runner : Runner
        Returns the reductions' outputs, then the attention probabilities.
    inputs : Inputs
        What the session runs on (held in memory or read per batch).
    notes : list of str
        Notes on the layer choice.
    threads : int
        The host threads of the audit's work (and onnxruntime's intra-op threads).
    copies : HostCopies
        Counts the attention matrices the dominance step brings to the host: on a GPU (the
        attention kept there, :attr:`Runner.on_device`) only the heads the certificate leaves
        undecided; on the CPU the same heads (nothing is copied, the count is the same).
    """

    layers: list[str]
    attention: list[str]
    sublayers: list[int]
    plan: ReductionPlan
    runner: Runner
    inputs: Inputs
    notes: list[str]
    threads: int = 1
    copies: HostCopies = field(default_factory=HostCopies)
    attention_inputs: list[int] = field(default_factory=list)
    pre_norm_sums: list[int] = field(default_factory=list)

    @property
    def late_start(self) -> int:
        """The plan layer of the first :attr:`pre_norm_sums` entry (after the attention inputs')."""
        return len(self.layers) + len(self.sublayers) + len(self.attention_inputs)

    @property
    def reads(self) -> list[int]:
        """Per block, the plan layer of the stream its attention reads: its layer, or its entry
        after the sublayers' (:attr:`attention_inputs`)."""
        after = len(self.layers) + len(self.sublayers)
        extra = {block: after + j for j, block in enumerate(self.attention_inputs)}
        return [extra.get(i, i) for i in range(len(self.layers) - 1)]

    def batch_feeds(self, batch: Inputs) -> dict[str, np.ndarray]:
        """A batch's feeds plus the token mask the reductions read (padding never counts)."""
        mask = batch.token_mask
        return {**batch.feeds, **(self.plan.mask_feed(mask) if mask is not None else {})}

    @property
    def feeds(self) -> dict[str, np.ndarray]:
        """:meth:`batch_feeds` of every input at once (read whole, in memory)."""
        return self.batch_feeds(self.inputs)

    def batches(
        self, items: int, *, progress: bool = False, rows: int = 0
    ) -> Iterator[tuple[Inputs, dict[str, np.ndarray]]]:
        """``(batch, outputs)`` for the inputs read ``items`` at a time (see :func:`run_batches`).

        Each batch's outputs stay valid while :data:`LOOKAHEAD_BATCHES` more are run. With a
        plan that returns whole layers (:attr:`ReductionPlan.token_rows`), those of the first
        ``rows`` inputs come back (the batches are read in order).
        """
        first = [0]

        def feeds(batch: Inputs) -> dict[str, np.ndarray]:
            keep = first[0] + np.arange(batch.batch_size) < rows
            first[0] += batch.batch_size
            return {**self.batch_feeds(batch), **self.plan.rows_feed(keep)}

        return run_batches(
            self.runner,
            self.inputs,
            feeds,
            items,
            progress=progress,
            keep=LOOKAHEAD_BATCHES + 1,
        )


def audit_session(
    graph: OnnxModel,
    blocks: Sequence[AttentionBlock],
    inputs: Inputs,
    *,
    prefix: int = 0,
    attention: bool = True,
    spectral: bool = True,
    provider: Literal["auto", "cpu", "cuda"] = "auto",
    threads: int | None = None,
    partial: bool = False,
    spectral_norm: bool = False,
    skipped: Sequence[str] = (),
    token_rows: bool = False,
) -> AuditSession:
    """Build the session the audit runs: layer statistics reduced in the graph, attention exposed.

    Only the reductions' outputs come back per layer (:mod:`oversmooth.importers.runtime.reductions`): eight
    scalars, plus the smaller Gram matrix when ``spectral`` (the singular-value metrics need it);
    the attention probabilities are fetched only when ``attention`` (the dominance step needs
    them). On a GPU with CuPy the Gram matrices and the attention probabilities stay there
    (:attr:`Runner.on_device`): their eigenvalues and the perron certificate are computed there
    and only small records come back. ``partial``: ``blocks`` are only the matched part of the
    model; ``skipped``: the Softmaxes skipped by design (see :func:`layer_tensors`).
    """
    notes: list[str] = []
    layers = layer_tensors(blocks, notes, partial=partial, skipped=skipped, index=graph.index)
    probs = [block.attention_name for block in blocks] if attention else []
    first = inputs.read(0, 1)  # masked or not, and the token count, without reading every input
    mids = {block.index: attention_sublayer_tensor(block) for block in blocks}
    sublayers = [i for i, block in enumerate(blocks) if mids[block.index] is not None]
    reads = [i for i, block in enumerate(blocks) if block.attention_input_name is not None]
    time_major = [blocks[0].time_major] + [block.time_major for block in blocks]
    time_major += [blocks[i].time_major for i in [*sublayers, *reads]]
    gram = _gram_orientation(graph, layers[0], first, blocks[0]) if spectral else "none"
    token_scale = _token_scales(blocks, len(sublayers), reads)
    plan = plan_reductions(
        graph,
        [
            *layers,
            *(str(mids[blocks[i].index]) for i in sublayers),
            *(str(blocks[i].attention_input_name) for i in reads),
        ],
        prefix=prefix,
        masked=first.token_mask is not None,
        gram=gram,
        time_major=time_major,
        spectral_norm=spectral_norm,
        token_scale=token_scale,
        token_rows=token_rows,
    )
    grams = [plan.gram_name(layer) for layer in range(len(plan.layers))] if spectral else []
    late = PreNormSums(graph, blocks, sublayers, plan, first_sublayer=len(layers))
    runner = Runner(
        graph,
        expose=probs,
        extension=plan.extension,
        provider=provider,
        threads=threads,
        device_outputs=[*probs, *grams],
        late=late.outputs(),
    )
    return AuditSession(
        layers,
        probs,
        sublayers,
        late.plan,
        runner,
        inputs,
        notes,
        threads or default_threads(),
        attention_inputs=reads,
        pre_norm_sums=late.blocks,
    )


def _token_scales(
    blocks: Sequence[AttentionBlock], n_sublayers: int, reads: Sequence[int]
) -> list[TokenScale | None]:
    """Per plan layer, the pre-norm whose per-token scale is reduced on it: block i's on layer i
    (what its attention reads), or on its attention input's entry where it has one (``reads``)."""
    if not reads:
        return [_token_scale(block) for block in blocks]
    on_layers = [None if i in reads else _token_scale(block) for i, block in enumerate(blocks)]
    return [*on_layers, *[None] * (1 + n_sublayers), *(_token_scale(blocks[i]) for i in reads)]


def _token_scale(block: AttentionBlock) -> TokenScale | None:
    """The pre-norm whose per-token scale the depth step reads on the block's input layer (the
    stream a pre-norm normalises), or None: post-LN and norm-free blocks, an unknown epsilon."""
    norm = block.norm_match
    if block.norm != "pre" or norm is None or norm.eps is None:
        return None
    return (norm.kind, float(norm.eps))


def attention_sublayer_tensor(block: AttentionBlock) -> str | None:
    """The residual stream right after ``block``'s attention sublayer, before its MLP (or None).

    Pre-LN and norm-free blocks: the attention residual sum ``X + branch(X)``; post-LN blocks: the
    norm after it (the stream the MLP reads). A parallel block has no such stream (attention and
    MLP add to the stream together), nor does a block whose residual was not established.
    """
    if block.parallel or block.stream_error is not None or block.residual_name is None:
        return None
    if block.norm == "post":
        return block.norm_output_name
    return block.residual_name


#: An item whose counted rows have ``‖Xm‖_F²`` above this is refused like a non-finite one: below
#: it no entry of its Gram matrix, at most ``‖Xm‖_F²`` in modulus, can overflow: float64 tops out
#: just under 2^1024, a factor of 8 above, against the statistics' and the product's own relative
#: rounding of a few T·D·u (under 10⁻⁶ for any layer that fits in memory).
GRAM_NORM_SQ_LIMIT = 2.0**1020


def nonfinite_layer_items(scalars: Any) -> np.ndarray:
    """(batch,) bool: the items whose layer statistics ``scalars`` (B, 8) hold a NaN or an infinity,
    or whose ``hfc_sq + lfc_sq`` exceeds :data:`GRAM_NORM_SQ_LIMIT`.

    This decides for the layer's Gram matrix too, without reading it (B·k² numbers against B·8).
    A NaN or an infinity anywhere in the counted layer ``Xm = w ⊙ X`` (an uncounted row holding one
    gives ``0·∞``, a NaN, there too) makes the sum of its column, so the mean x̄ and
    ``lfc_sq = n ‖x̄‖²``, a NaN or an infinity (``0·∞`` again when n = 0). And with every entry
    finite, ``|G_ij| ≤ ‖Xm‖_F² = hfc_sq + lfc_sq`` (Cauchy–Schwarz, for ``Xm Xmᵀ`` and ``Xmᵀ Xm``
    alike), so below the limit the Gram matrix is finite as well.
    """
    packed = np.asarray(to_numpy(scalars), dtype=np.float64)
    stats = TokenStatistics.from_packed(packed)
    finite = np.isfinite(packed).all(axis=1)
    with np.errstate(over="ignore", invalid="ignore"):
        small = stats.hfc_sq + stats.lfc_sq <= GRAM_NORM_SQ_LIMIT
    return ~(finite & small)


def check_finite_outputs(
    session: AuditSession,
    blocks: Sequence[AttentionBlock],
    outputs: dict[str, np.ndarray],
    batch: Inputs,
    start: int,
) -> None:
    """Refuse a batch whose layer statistics or attention probabilities hold NaN or infinities,
    naming the first input and the first place in depth order that went non-finite.

    Depth order: layer i (the stream entering block i), the stream block i's attention reads
    where it is another, block i's attention probabilities, the stream after block i's attention
    sublayer, layer i + 1. The feeds were checked finite before
    the batch ran (:func:`~oversmooth.importers.inputs.feeds.check_finite`), so the model produced these values;
    nothing computed from them (Gram eigenvalues, dominating eigenvalues) would mean anything,
    and LAPACK would fail on them.

    Raises
    ------
    NonFiniteModelError
        Exit status 1.
    """
    plan, n_layers = session.plan, len(session.layers)
    found: list[tuple[float, str, np.ndarray]] = []
    for layer in filter(plan.computes, range(len(plan.layers))):
        scalars = outputs[plan.scalars_name(layer)]
        check_counted_tokens(TokenStatistics.from_packed(scalars).n_tokens, batch.labels)
        bad = nonfinite_layer_items(scalars)
        if not bad.any():
            continue
        if layer >= session.late_start:
            i = session.pre_norm_sums[layer - session.late_start]
            where = f"the sum before block {blocks[i].index}'s post-norm"
            found.append((3 * i + 1.5, where, bad))
        elif layer >= n_layers + len(session.sublayers):
            i = session.attention_inputs[layer - n_layers - len(session.sublayers)]
            where = f"the stream block {blocks[i].index}'s attention reads"
            found.append((3 * i + 0.5, where, bad))
        elif layer >= n_layers:
            i = session.sublayers[layer - n_layers]
            where = f"the stream after block {blocks[i].index}'s attention sublayer"
            found.append((3 * i + 2, where, bad))
        elif layer == 0:
            found.append((0, f"layer 0 (the stream entering block {blocks[0].index})", bad))
        else:
            where = f"layer {layer} (the output of block {blocks[layer - 1].index})"
            found.append((3 * layer, where, bad))
    for i, name in enumerate(session.attention):
        bad = nonfinite_attention(outputs[name], name, blocks[i].n_heads, batch, block=blocks[i])
        if bad.any():
            found.append((3 * i + 1, f"block {blocks[i].index}'s attention probabilities", bad))
    if found:
        _, where, bad = min(found, key=lambda entry: entry[0])
        item = int(np.flatnonzero(bad)[0])
        label = batch.labels[item]
        label = label if len(label) <= 40 else label[:37] + "..."
        raise NonFiniteModelError(
            f"the model produced NaN or infinite values from finite input {label!r} (item "
            f"{start + item}): first at {where}; its weights or its precision cannot carry "
            "this input, and no metric or eigenvalue can be computed from such values"
        )
