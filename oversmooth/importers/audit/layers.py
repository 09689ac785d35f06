"""Which graph tensors an audit records as layers (block 0's input, then every block's output),
and their metrics per batch.

Split from :mod:`oversmooth.importers.audit.session` (which re-exports :func:`layer_tensors`).

Public API
----------
layer_tensors
    The graph tensors the audit records as layers.
measure_layers
    One batch's metrics per layer, from the statistics the session reduced in the graph.
check_counted_tokens
    Refuse a batch item left with fewer than 2 counted tokens.
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence

import numpy as np

from oversmooth.importers.errors import ImporterInputError, LayerStreamError
from oversmooth.importers.graph import GraphIndex
from oversmooth.importers.match import AttentionBlock
from oversmooth.importers.runtime.reductions import ReductionPlan
from oversmooth.simulator.metrics import METRICS
from oversmooth.simulator.statistics import (
    SPECTRAL_METRICS,
    SPECTRAL_NORM_METRIC,
    metrics_from_statistics,
)

__all__ = ["check_counted_tokens", "layer_tensors", "measure_layers"]


def layer_tensors(
    blocks: Sequence[AttentionBlock],
    notes: list[str] | None = None,
    *,
    partial: bool = False,
    skipped: Sequence[str] = (),
    index: GraphIndex | None = None,
) -> list[str]:
    """Graph tensors of the recorded layers: block 0's input, then every block's output.

    Layer 0 is the stream entering block 0, layer i the output of block i-1 (see
    :mod:`oversmooth.importers.audit.pipeline`, Layers); the matcher traces both from the graph's residual sums
    (:mod:`oversmooth.importers.match.stream`). Every layer is checked against the block structure: block
    i-1's output, found walking forward from its MLP residual, must be the stream block i reads,
    found walking back from its attention (its norm's input, or the attention input, that its
    attention residual adds), or the stream that one adds input-independent terms to
    (``input_base``: YOLOS' position embeddings between blocks; noted). Where residual
    sub-layers come before each attention inside its layer (a Conformer's half-step FFN), the
    blocks' inputs and outputs are already the whole layers' boundaries
    (:mod:`oversmooth.importers.match.boundaries`; noted).

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
    skipped, index : sequence of str, GraphIndex
        The Softmaxes skipped by design (labels) and the graph: a break of the chain with one of
        them between the two blocks (computed from the earlier block's output, read by the later
        block's input: a whole windowed layer) is noted the same way instead of refused.

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
        between = _skipped_between(index, skipped, blocks[i - 1].output_name, blocks[i].input_name)
        if between:
            mismatch += (
                f": the block(s) skipped by design {', '.join(map(repr, between))} lie between "
                f"them, outside every layer"
            )
        elif not partial:
            raise LayerStreamError(
                f"layer {i} would not be the residual stream: {mismatch}, and the importer "
                f"does not follow what changes the stream between them (for example a term "
                f"added between blocks, as YOLOS adds position embeddings)"
            )
        if notes is not None:
            notes.append(f"{mismatch}; layer {i} uses the latter")
    if notes is not None and blocks[0].attention_input_name is not None:
        notes.append(_boundary_note(blocks[0]))
    if len(set(names)) != len(names):
        raise LayerStreamError(
            f"two layers would read the same tensor ({', '.join(map(repr, names))}): internal error"
        )
    return names


def _boundary_note(first: AttentionBlock) -> str:
    """The note of layers that begin before sub-layers that come before each attention."""
    return (
        f"residual sub-layers come before the attention inside each layer: layer 0 is block 0's "
        f"input ({first.input_name!r}) and layer i block i-1's output, the stream between whole "
        f"layers as Hugging Face's hidden_states count them; the attention reads another stream "
        f"({first.attention_input_name!r} in block 0), on which the pre-norm's per-token scale, "
        f"the operating point and the attribution are read (the earlier sub-layers' change joins "
        f"the attribution's mlp part)"
    )


def _skipped_between(
    index: GraphIndex | None, skipped: Sequence[str], start: str, end: str
) -> list[str]:
    """The Softmaxes of ``skipped`` (labels) computed from ``start`` whose output ``end`` is
    computed from (none without ``index``)."""
    if index is None or not skipped:
        return []
    before_end = _ancestors(index, end)
    return [
        node.label
        for node in index.nodes_of_type("Softmax")
        if node.label in skipped
        and node.outputs[0] in before_end
        and start in _ancestors(index, node.inputs[0])
    ]


def _ancestors(index: GraphIndex, name: str) -> set[str]:
    """``name`` and every tensor its value is computed from."""
    found, frontier = {name}, [name]
    while frontier:
        node = index.producer(frontier.pop())
        for operand in node.inputs if node is not None else ():
            if operand and operand not in found:
                found.add(operand)
                frontier.append(operand)
    return found


def check_counted_tokens(n_tokens: np.ndarray, labels: Sequence[str]) -> None:
    """Every item of a batch (``labels``, one each) keeps at least 2 tokens for the metrics."""
    short = np.flatnonzero(np.asarray(n_tokens) < 2)
    if short.size:
        item = int(short[0])
        label = labels[item] if len(labels[item]) <= 40 else labels[item][:37] + "..."
        raise ImporterInputError(
            f"input {label!r} keeps {int(n_tokens[item])} token(s) for the metrics once padding "
            "and the `exclude_prefix` tokens are left out; a smoothing metric needs at least 2"
        )


def computed_layers(plan: ReductionPlan) -> list[int]:
    """The layers whose metrics ``plan`` computes, in depth order."""
    return list(filter(plan.computes, range(len(plan.layers))))


def measure_layers(
    outputs: dict[str, np.ndarray],
    plan: ReductionPlan,
    start: int,
    per_input: dict[str, np.ndarray],
    labels: Sequence[str],
    token_mask: np.ndarray | None = None,
    stream: dict[str, np.ndarray] | None = None,
    layers: Iterable[int] | None = None,
) -> int:
    """Fill ``per_input[metric][item, layer]`` for one batch from its in-graph statistics.

    Without a Gram matrix (``spectral=False``) only the scalar metrics are filled; a layer the
    plan does not compute (:attr:`ReductionPlan.replaced`) stays as it is. ``stream``
    (:data:`~oversmooth.importers.audit.session.STREAM_TERMS`, (n_inputs, layers) each) gets
    ‖x̄‖ = sqrt(lfc_sq / n) and, where the plan reduces a norm's scale, the mean ``1/s_t`` over
    the counted tokens. ``layers`` (default :func:`computed_layers`) are the layers to measure:
    calls on disjoint layers write disjoint columns, so they may run on different threads. Gram
    matrices on the GPU have their spectra computed in one stacked solve for all of ``layers``
    (:meth:`~oversmooth.importers.runtime.reductions.ReductionPlan.layer_spectra`); on the host
    each layer's are computed on their own.
    Returns the batch size (0 without a layer).
    """
    names = [name for name in METRICS if plan.gram != "none" or name not in SPECTRAL_METRICS]
    names += [SPECTRAL_NORM_METRIC] if plan.spectral_norm and plan.gram != "none" else []
    batch = 0
    layers = computed_layers(plan) if layers is None else list(layers)
    spectra = plan.layer_spectra(outputs, layers) if plan.grams_on_device(outputs) else {}
    for layer in layers:
        statistics = plan.statistics(outputs, layer, token_mask, spectra.get(layer))
        check_counted_tokens(statistics.n_tokens, labels)
        values = metrics_from_statistics(statistics, names)
        for metric, value in values.items():
            batch = len(value)
            per_input[metric][start : start + batch, layer] = value
        if stream is not None:
            n = np.asarray(statistics.n_tokens, dtype=np.float64)
            rows = slice(start, start + len(n))
            stream["mean_norm"][rows, layer] = np.sqrt(np.asarray(statistics.lfc_sq) / n)
            inverse = plan.inverse_scale(outputs, layer)
            if inverse is not None:
                stream["inverse_scale"][rows, layer] = inverse / n
    return batch
