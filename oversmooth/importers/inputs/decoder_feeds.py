"""Feeds of a decoder: key/value caches fed empty, position ids, and an encoder's output.

A language model as shipped (optimum's ``text-generation-with-past``) takes its key/value cache
as graph inputs (:mod:`oversmooth.importers.graph.kv_cache`); the audit feeds them with a past length of 0,
where the graph computes exactly the model without a cache. Such graphs (and other decoder
exports) also take ``position_ids``, which are counted over the real tokens of each item.

A decoder with cross-attention exported alone (T5's, Marian's decoder stack) takes the encoder's
output as a graph input, ``encoder_hidden_states`` (batch, encoder tokens, features), and often
its mask. Text sources know nothing of it: where the feeds lack them, the states are drawn
standard normal, each item from its own generator seeded by its token ids (the same item gets the
same states whatever batch it is read in), and their mask is ones; an ``.npz`` may hold them.

Public API
----------
positions
    Position ids of tokens under their mask.
takes_positions
    Whether a graph input takes position ids.
empty_cache, with_empty_caches, cache_note
    The feed of a cache input at past length 0; feeds completed with them; the audit's note.
encoder_inputs, token_mask_input, with_encoder_states, encoder_states_note
    A decoder's encoder-state inputs and their masks; the mask of its own tokens; feeds completed
    with random encoder states; the audit's note of what they were fed.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass

import numpy as np

from oversmooth.importers.errors import FeedError
from oversmooth.importers.graph import GraphInput

__all__ = [
    "EncoderInputs",
    "cache_note",
    "empty_cache",
    "encoder_inputs",
    "encoder_states_note",
    "positions",
    "takes_positions",
    "token_mask_input",
    "with_empty_caches",
    "with_encoder_states",
]

#: Mixed into the seed of each item's random encoder states (with its token ids).
ENCODER_STATES_SEED = 20240532


def positions(mask: np.ndarray) -> np.ndarray:
    """Position ids of ``(B, T)`` tokens under their mask: 0, 1, ... over each item's real tokens
    (``cumsum(mask) - 1``, as transformers counts them; 0 before the first real token)."""
    return np.maximum(np.cumsum(np.asarray(mask, np.int64), axis=-1) - 1, 0)


def takes_positions(spec: GraphInput) -> bool:
    """An integer input of position ids (``position_ids``): it gets :func:`positions`."""
    return spec.dtype.kind in "iu" and "position" in spec.name.lower()


def empty_cache(spec: GraphInput, rows: int) -> np.ndarray:
    """The feed of a key/value cache input at past length 0: ``rows`` items (along the first open
    axis other than the past one, else the first: onnxruntime's packed (2, B, N, P, H) ``past``
    has its items second), the past axis empty, the other axes the sizes the graph fixes.

    Raises
    ------
    FeedError
        An axis other than the items and the past is left open (its size cannot be known).
    """
    shape = []
    items = _items_axis(spec)
    for axis, dim in enumerate(spec.shape):
        if axis == spec.past_axis:
            shape.append(0)
        elif axis == items:
            shape.append(rows)
        elif isinstance(dim, int):
            shape.append(dim)
        else:
            raise FeedError(
                f"cannot size the empty KV cache {spec.describe()}: its axis {axis} is left "
                f"open; feed it in an .npz (`--inputs`) with axis {spec.past_axis} of size 0"
            )
    return np.zeros(shape, dtype=spec.dtype)


def _items_axis(spec: GraphInput) -> int:
    """The items axis of a cache input: its first open axis other than the past axis, else 0."""
    open_axes = [
        axis
        for axis, dim in enumerate(spec.shape)
        if axis != spec.past_axis and not isinstance(dim, int)
    ]
    return open_axes[0] if open_axes else 0


def with_empty_caches(
    feeds: Mapping[str, np.ndarray], expected: Sequence[GraphInput]
) -> dict[str, np.ndarray]:
    """``feeds`` plus an :func:`empty_cache` for every key/value cache input they lack (as many
    items as the feeds have)."""
    missing = [spec for spec in expected if spec.past_axis is not None and spec.name not in feeds]
    if not missing:
        return dict(feeds)
    rows = next((int(np.shape(array)[0]) for array in feeds.values() if np.ndim(array)), 1)
    return {**feeds, **{spec.name: empty_cache(spec, rows) for spec in missing}}


def cache_note(caches: Sequence[str]) -> str:
    """The note of an audit of a model with key/value cache inputs (``caches``, graph input names)."""
    named = ", ".join(map(repr, caches[:4]))
    named += f" and {len(caches) - 4} more" if len(caches) > 4 else ""
    return (
        f"audited at past length 0: the {len(caches)} KV cache input(s) {named} were fed empty, so "
        f"the model computes without a cache (the attention covers the given tokens only); its "
        f"present key/value outputs are ignored"
    )


@dataclass(frozen=True)
class EncoderInputs:
    """A decoder's inputs that come from its encoder: ``states`` (float (batch, tokens,
    features)) and ``masks`` (integer (batch, tokens): the encoder's attention mask)."""

    states: tuple[GraphInput, ...] = ()
    masks: tuple[GraphInput, ...] = ()

    @property
    def names(self) -> frozenset[str]:
        """Every encoder input's name."""
        return frozenset(spec.name for spec in (*self.states, *self.masks))


def _takes_ids(spec: GraphInput) -> bool:
    """An integer input of token ids (not a mask, token types or positions)."""
    lowered = spec.name.lower()
    return spec.dtype.kind in "iu" and not any(
        word in lowered for word in ("mask", "type", "position")
    )


def encoder_inputs(expected: Sequence[GraphInput]) -> EncoderInputs:
    """The inputs of ``expected`` a decoder's encoder would give it.

    States: in a graph that takes token ids, every float input of rank 3 that is no key/value
    cache (the hidden states of another sequence). Masks: every integer input of rank 2 whose
    name holds ``mask`` and either ``encoder`` or whose token axis is a symbol the states' token
    axis has and the token ids' has not (optimum's ``encoder_attention_mask`` of
    ``encoder_sequence_length`` tokens).
    """
    ids = [spec for spec in expected if _takes_ids(spec) and len(spec.shape) == 2]
    if not ids:
        return EncoderInputs()
    states = tuple(
        spec
        for spec in expected
        if spec.dtype.kind == "f" and len(spec.shape) == 3 and spec.past_axis is None
    )
    own_axes = {spec.shape[1] for spec in ids}
    state_axes = {spec.shape[1] for spec in states if isinstance(spec.shape[1], str)} - own_axes
    masks = tuple(
        spec
        for spec in expected
        if states
        and spec.dtype.kind in "iu"
        and len(spec.shape) == 2
        and "mask" in spec.name.lower()
        and ("encoder" in spec.name.lower() or spec.shape[1] in state_axes)
    )
    return EncoderInputs(states, masks)


def token_mask_input(expected: Sequence[GraphInput]) -> str | None:
    """The graph input holding the mask of the model's own tokens: the first whose name holds
    ``mask`` that is not an encoder's (:func:`encoder_inputs`); None when there is none."""
    encoder = encoder_inputs(expected).names
    return next(
        (
            spec.name
            for spec in expected
            if "mask" in spec.name.lower() and spec.name not in encoder
        ),
        None,
    )


def _encoder_states(spec: GraphInput, ids: np.ndarray) -> np.ndarray:
    """Standard normal states for the (B, T) token ids ``ids``: (B, tokens, features), the tokens
    the graph fixes or T, item i drawn from a generator seeded by its ids."""
    tokens, features = spec.shape[1], spec.shape[2]
    if not isinstance(features, int):
        raise FeedError(
            f"cannot draw the encoder states {spec.describe()}: its feature axis is left open; "
            f"feed them in an .npz (`--inputs`)"
        )
    length = tokens if isinstance(tokens, int) else int(ids.shape[1])
    rows = [
        np.random.default_rng(
            [ENCODER_STATES_SEED, *np.asarray(row, np.int64).tolist()]
        ).standard_normal((length, features))
        for row in ids
    ]
    return (
        np.stack(rows).astype(spec.dtype) if rows else np.zeros((0, length, features), spec.dtype)
    )


def with_encoder_states(
    feeds: Mapping[str, np.ndarray], expected: Sequence[GraphInput], ids: str = "input_ids"
) -> dict[str, np.ndarray]:
    """``feeds`` plus, for every encoder input they lack (:func:`encoder_inputs`), random states
    seeded per item by its token ids (``feeds[ids]``) and masks of ones as long as the states."""
    encoder = encoder_inputs(expected)
    missing = [spec for spec in encoder.states if spec.name not in feeds]
    if not missing and all(spec.name in feeds for spec in encoder.masks):
        return dict(feeds)
    if ids not in feeds:
        raise FeedError(
            f"cannot draw the encoder states of {', '.join(s.name for s in missing)}: no token "
            f"ids to seed them; feed them in an .npz (`--inputs`)"
        )
    added = {spec.name: _encoder_states(spec, np.asarray(feeds[ids])) for spec in missing}
    states = [np.shape(feeds[s.name] if s.name in feeds else added[s.name]) for s in encoder.states]
    for spec in encoder.masks:
        if spec.name not in feeds:
            added[spec.name] = np.ones(states[0][:2], dtype=spec.dtype)
    return {**feeds, **added}


def encoder_states_note(expected: Sequence[GraphInput], source: str) -> str:
    """What a decoder's encoder-state inputs were fed, for inputs from ``source`` (the
    :class:`~oversmooth.importers.inputs.feeds.Inputs` source); empty for a graph without them."""
    states = encoder_inputs(expected).states
    if not states:
        return ""
    named = ", ".join(repr(spec.name) for spec in states)
    what = f"the graph takes the encoder states {named} (its cross-attention's keys and values)"
    if source.startswith("npz:"):
        return f"{what}: read from the .npz"
    return (
        f"{what}: not real data but standard normal noise, drawn per item (random inputs draw "
        "it with the rest, text inputs seed it by the item's token ids), their mask ones; the "
        "layers hold the cross-attention's mix of that noise"
    )
