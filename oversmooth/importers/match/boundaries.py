"""Where each layer begins: residual sub-layers inside a layer before its attention.

The stream walk (:mod:`oversmooth.importers.match.stream`) follows each block from the stream its attention
reads to the stream the next attention reads, passing the non-attention sub-layers between them
(:meth:`~oversmooth.importers.match.stream.StreamMatcher.further_sublayers`). In most families none lies
there and the two streams are the layers' boundaries. A Conformer layer has sub-layers on both
sides of its attention: half-step FFN, attention, convolution module, half-step FFN, final
LayerNorm. Between two attentions the walk passes three sums (convolution, FFN, the next layer's
first FFN) but after the last attention only two: the difference, ``k``, is the number of
sub-layers a layer holds before its attention. So every layer boundary lies ``k`` sub-layers
before each attention, as Hugging Face's ``hidden_states`` count them: layer 0 is the input of
block 0 (before its first FFN), layer i the output of block i-1 (after its final norm). Counting
from the last block keeps out what a model adds to the stream before its first layer (HuBERT's
positional convolution, ``x + conv(x)``, is no sub-layer of layer 0).

A sub-layer is a residual sum ``x + f(x)``, ``f`` computed from ``x`` without attention, followed
by any norm the stream continues on (a post-LN sum's norm, the Conformer's final LayerNorm). One
step back from a stream passes that norm, if the stream is the output of a norm of a sum, then
the sum, to the summand the branch is computed from.

Public API
----------
layer_boundaries
    The blocks with their input and output moved to their layers' boundaries.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Sequence

from oversmooth.importers.match.results import AttentionBlock, NormMatch
from oversmooth.importers.match.stream import StreamMatcher
from oversmooth.importers.match.walker import MatchBasis

__all__ = ["layer_boundaries"]


def sublayers_before_attention(blocks: Sequence[AttentionBlock]) -> int:
    """``k``: the sums the walk passes between two attentions less those after the last one.

    0 where it cannot be told: one block, a block whose stream was not established, or blocks
    before the last that pass different numbers of sums.
    """
    if len(blocks) < 2 or any(block.stream_error is not None for block in blocks):
        return 0
    between = {block.further_sums for block in blocks[:-1]}
    if len(between) != 1:
        return 0
    return max(between.pop() - blocks[-1].further_sums, 0)


def layer_boundaries(basis: MatchBasis, blocks: list[AttentionBlock]) -> list[AttentionBlock]:
    """``blocks`` (in depth order) with each input and output at its layer's boundary.

    Unchanged where no sub-layer comes before the attention (:func:`sublayers_before_attention`
    is 0). Otherwise block i's input is the stream ``k`` sub-layers before its attention's (which
    becomes ``attention_input_name``), block i-1's output is that same stream, and the last
    block's output also passes the norm its sub-layer ends with where the others' do. A boundary
    that is not found is the block's ``stream_error`` (the audit refuses it).

    Parameters
    ----------
    basis : MatchBasis
        The graph's match basis (its queries: sums, norms, branches).
    blocks : list of AttentionBlock
        Every matched block, numbered, their streams as the walk left them.

    Returns
    -------
    list of AttentionBlock
    """
    k = sublayers_before_attention(blocks)
    if k == 0:
        return blocks
    walker = StreamMatcher(basis, basis.shapes.context())
    starts = [sublayers_back(walker, block.input_name, k) for block in blocks]
    moved = []
    for i, block in enumerate(blocks):
        start = starts[i]
        if start is None:
            moved.append(_lost(block, f"the stream {k} residual sub-layer(s) before it"))
            continue
        if i + 1 < len(blocks):
            output, missing = starts[i + 1], "the next layer's input"
        else:
            output = _last_output(walker, block, start)
            missing = "the norm closing its layer, as the other layers close"
        if output is None:
            moved.append(_lost(block, missing))
            continue
        base = walker.before_constant_terms(start)
        moved.append(
            dataclasses.replace(
                block,
                input_name=start,
                input_base=base if base != start else None,
                output_name=output,
                attention_input_name=block.input_name,
                notes=(*block.notes, _note(k, start, block.input_name)),
                roles=block.roles
                | {"layer input": f"{k} sub-layer(s) before {block.input_name!r}"},
            )
        )
    return moved


def sublayers_back(walker: StreamMatcher, name: str, k: int) -> str | None:
    """The stream ``k`` residual sub-layers before ``name`` (see the module docstring), or None
    where a step back meets no sum of a branch computed from one summand without attention."""
    for _ in range(k):
        norm = _norm_of_sum(walker, name)
        source = walker.view_source(norm.input if norm is not None else name)
        node = walker.producer(source)
        total = walker.as_sum(node) if node is not None else None
        if total is None or walker.view_source(walker.requested(total.output)) != source:
            return None
        a, b = total.terms
        streams = [x for x, other in ((a, b), (b, a)) if _branch_of(walker, other, x)]
        if len(streams) != 1:
            return None
        name = streams[0]
    return name


def _branch_of(walker: StreamMatcher, term: str, stream: str) -> bool:
    """Whether ``term`` is a branch computed from ``stream`` without attention."""
    return walker.branch_kind(term, {stream, walker.view_source(stream)}) == "branch"


def _norm_of_sum(walker: StreamMatcher, name: str) -> NormMatch | None:
    """The norm whose output ``name`` is, where it normalises (a view of) a residual sum."""
    norm = walker.norm_ending_at(walker.view_source(name))
    if norm is None:
        return None
    node = walker.producer(walker.view_source(walker.strip_casts(norm.input)))
    return norm if node is not None and walker.as_sum(node) is not None else None


def _last_output(walker: StreamMatcher, block: AttentionBlock, start: str) -> str | None:
    """The last block's output: where the walk ended, then the norm of the stream that ends
    every other layer, if they end with one (``start`` is the last block's layer input)."""
    if _norm_of_sum(walker, start) is None or walker.norm_ending_at(block.output_name) is not None:
        return block.output_name
    norm = walker.norm_starting_at(block.output_name)
    return norm.output if norm is not None else None


def _lost(block: AttentionBlock, what: str) -> AttentionBlock:
    """``block`` refused: the boundary of its layer (``what``) was not found."""
    reason = f"the layer boundary was not found: {what}"
    return dataclasses.replace(block, stream_error=block.stream_error or reason)


def _note(k: int, start: str, attention_input: str) -> str:
    return (
        f"{k} residual sub-layer(s) come before the attention inside this layer: the layer's "
        f"input is {start!r}, the attention reads {attention_input!r} (the layers are the "
        f"stream between whole layers, as Hugging Face's hidden_states count them)"
    )
