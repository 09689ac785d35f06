"""Feeds of a decoder exported for generation: key/value caches fed empty, and position ids.

A language model as shipped (optimum's ``text-generation-with-past``) takes its key/value cache
as graph inputs (:mod:`importers.graph.kv_cache`); the audit feeds them with a past length of 0,
where the graph computes exactly the model without a cache. Such graphs (and other decoder
exports) also take ``position_ids``, which are counted over the real tokens of each item.

Public API
----------
positions
    Position ids of tokens under their mask.
takes_positions
    Whether a graph input takes position ids.
empty_cache, with_empty_caches
    The feed of a cache input at past length 0; feeds completed with them.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence

import numpy as np

from importers.errors import FeedError
from importers.graph import GraphInput

__all__ = ["empty_cache", "positions", "takes_positions", "with_empty_caches"]


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
