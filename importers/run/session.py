"""The audit's onnxruntime session: which tensors are layers, their in-graph reductions, the runner.

Public API
----------
layer_tensors
    The graph tensors the audit records as layers (block 0's input, every block's output).
audit_session, AuditSession
    The session an audit runs (model plus in-graph reductions), for the audit, benchmarks and tools.
LOOKAHEAD_BATCHES
    Batches whose host work may still run while the next batch is inferred.
"""

from __future__ import annotations

from collections.abc import Iterator, Sequence
from dataclasses import dataclass
from typing import Literal

import numpy as np

from importers.errors import ImporterError, LayerStreamError
from importers.graph import OnnxModel
from importers.graph.shapes import ShapeContext
from importers.match import AttentionBlock
from importers.run.batching import run_batches
from importers.run.feeds import Inputs
from importers.run.reductions import Gram, ReductionPlan, plan_reductions
from importers.run.runner import Runner

__all__ = ["LOOKAHEAD_BATCHES", "AuditSession", "audit_session", "layer_tensors"]

#: Batches whose host work (metrics, dominance) may still run while the next batch is inferred.
LOOKAHEAD_BATCHES = 1


def layer_tensors(
    blocks: Sequence[AttentionBlock], notes: list[str] | None = None, *, partial: bool = False
) -> list[str]:
    """Graph tensors of the recorded layers: block 0's input, then every block's output.

    Layer 0 is the stream entering block 0, layer i the output of block i-1 (see
    :mod:`importers.run.audit`, Layers); the matcher traces both from the graph's residual sums
    (:mod:`importers.match.stream`). Every layer is checked against the block structure: block
    i-1's output, found walking forward from its MLP residual, must be the stream block i reads,
    found walking back from its attention (its norm's input, or the attention input, that its
    attention residual adds), or the stream that one adds input-independent terms to
    (``input_base``: YOLOS' position embeddings between blocks; noted).

    Parameters
    ----------
    blocks : sequence of AttentionBlock
        The matched blocks in depth order.
    notes : list of str, optional
        Notes on the layer choice are appended here.
    partial : bool
        The blocks are only the matched part of the model (``--partial``): between two of them an
        unmatched block may sit, so a break of the chain is noted (the earlier block's output is
        used) instead of refused.

    Returns
    -------
    list of str

    Raises
    ------
    LayerStreamError
        A block's residual stream could not be established, or a layer tensor is not the stream
        entering the next block.
    """
    for block in blocks:
        if block.stream_error is not None:
            raise LayerStreamError(
                f"layer {block.index + 1} (the output of block {block.index}) cannot be read: "
                f"{block.stream_error}"
            )
    names = [blocks[0].input_name] + [block.output_name for block in blocks]
    for i in range(1, len(blocks)):
        if blocks[i].input_name == blocks[i - 1].output_name:
            continue
        if blocks[i].input_base == blocks[i - 1].output_name:
            if notes is not None:
                notes.append(
                    f"block {i} reads block {i - 1}'s output plus a term that does not depend on "
                    f"the inputs ({blocks[i].input_name!r}); layer {i} is block {i - 1}'s output"
                )
            continue
        mismatch = (
            f"block {i} reads {blocks[i].input_name!r} but block {i - 1} ends at "
            f"{blocks[i - 1].output_name!r}"
        )
        if not partial:
            raise LayerStreamError(
                f"layer {i} would not be the residual stream: {mismatch}, and the importer "
                f"does not follow what changes the stream between them (for example a term "
                f"added between blocks, as YOLOS adds position embeddings)"
            )
        if notes is not None:
            notes.append(f"{mismatch}; layer {i} uses the latter")
    if len(set(names)) != len(names):
        raise LayerStreamError(
            f"two layers would read the same tensor ({', '.join(map(repr, names))}): internal error"
        )
    return names


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
    attention : list of str
        The attention probabilities fetched per block (empty without dominance).
    plan : ReductionPlan
    runner : Runner
        Returns the reductions' outputs, then the attention probabilities.
    inputs : Inputs
        What the session runs on (held in memory or read per batch).
    notes : list of str
        Notes on the layer choice.
    """

    layers: list[str]
    attention: list[str]
    plan: ReductionPlan
    runner: Runner
    inputs: Inputs
    notes: list[str]

    def batch_feeds(self, batch: Inputs) -> dict[str, np.ndarray]:
        """A batch's feeds plus the token mask the reductions read (padding never counts)."""
        mask = batch.token_mask
        return {**batch.feeds, **(self.plan.mask_feed(mask) if mask is not None else {})}

    @property
    def feeds(self) -> dict[str, np.ndarray]:
        """:meth:`batch_feeds` of every input at once (read whole, in memory)."""
        return self.batch_feeds(self.inputs)

    def batches(
        self, items: int, *, progress: bool = False
    ) -> Iterator[tuple[Inputs, dict[str, np.ndarray]]]:
        """``(batch, outputs)`` for the inputs read ``items`` at a time (see :func:`run_batches`).

        Each batch's outputs stay valid while :data:`LOOKAHEAD_BATCHES` more are run.
        """
        return run_batches(
            self.runner,
            self.inputs,
            self.batch_feeds,
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
) -> AuditSession:
    """Build the session the audit runs: layer statistics reduced in the graph, attention exposed.

    Only the reductions' outputs come back per layer (:mod:`importers.run.reductions`): eight
    scalars, plus the smaller Gram matrix when ``spectral`` (the singular-value metrics need it);
    the attention probabilities are fetched only when ``attention`` (the dominance step needs
    them). ``partial``: ``blocks`` are only the matched part of the model (see
    :func:`layer_tensors`).
    """
    notes: list[str] = []
    layers = layer_tensors(blocks, notes, partial=partial)
    probs = [block.attention_name for block in blocks] if attention else []
    first = inputs.read(0, 1)  # masked or not, and the token count, without reading every input
    time_major = [blocks[0].time_major] + [block.time_major for block in blocks]
    gram = _gram_orientation(graph, layers[0], first, blocks[0]) if spectral else "none"
    plan = plan_reductions(
        graph,
        layers,
        prefix=prefix,
        masked=first.token_mask is not None,
        gram=gram,
        time_major=time_major,
    )
    runner = Runner(
        graph, expose=probs, extension=plan.extension, provider=provider, threads=threads
    )
    return AuditSession(layers, probs, plan, runner, inputs, notes)
