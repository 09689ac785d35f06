"""Model inputs as data: :class:`Inputs` (feeds plus provenance) and checking feeds against a graph.

Every input source (:mod:`importers.run.sources`) returns an :class:`Inputs`: batch-first feeds keyed by
the model's graph input names, a mask of the real (non-padding) tokens, one label per item, where the
data came from and a digest of the feed bytes. Feeds are checked against the model's graph inputs
(names, ranks, fixed dimensions, dtypes); a mismatch raises :class:`~importers.errors.FeedError`
listing what the model expects.

Public API
----------
Inputs
    Feeds plus token mask, labels, source, digest and a ``random`` flag.
check_feeds
    Check feeds against graph inputs.
for_graph
    Rename, cast and check canonical feeds against a model's graph inputs.
feeds_digest
    The sha256 over feed names, dtypes, shapes and bytes.
TEXT_FEEDS, IMAGE_FEED
    Canonical feed names before they are mapped onto a graph's inputs.
"""

from __future__ import annotations

import hashlib
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, replace

import numpy as np
from numpy.typing import NDArray

from importers.errors import FeedError, ImporterInputError
from importers.graph import GraphInput

__all__ = [
    "IMAGE_FEED",
    "TEXT_FEEDS",
    "Inputs",
    "check_feeds",
    "expected_inputs_text",
    "feeds_digest",
    "for_graph",
]

#: Canonical text feed names, in the order BERT-style graphs declare them.
TEXT_FEEDS = ("input_ids", "attention_mask", "token_type_ids")
#: Canonical name of the image feed before it is mapped to the graph's input name.
IMAGE_FEED = "pixel_values"
_TEXT_ALIASES = {"input_ids": "ids", "attention_mask": "mask", "token_type_ids": "type"}


def expected_inputs_text(inputs: Iterable[GraphInput]) -> str:
    """The model's inputs as one line, for error messages."""
    return "; ".join(graph_input.describe() for graph_input in inputs)


def feeds_digest(feeds: Mapping[str, np.ndarray]) -> str:
    """Return the sha256 over feed names, dtypes, shapes and bytes, in name order."""
    digest = hashlib.sha256()
    for name in sorted(feeds):
        array = np.ascontiguousarray(feeds[name])
        digest.update(f"{name}|{array.dtype.str}|{array.shape}|".encode())
        digest.update(array.tobytes())
    return digest.hexdigest()


@dataclass(frozen=True, kw_only=True)
class Inputs:
    """A batch of model inputs with provenance.

    Attributes
    ----------
    feeds : dict of str to ndarray
        Batch-first arrays keyed by graph input name (text: ``(B, T)`` integer ids and masks;
        images: ``(B, 3, H, W)`` float32, normalised).
    token_mask : (B, T) bool ndarray or None
        True on real tokens, False on padding; None when every token is real (images).
    labels : tuple of str
        One label per batch item (file name or sentence).
    source : str
        ``"bundled-images"``, ``"bundled-text"``, ``"npz:<digest>"``, ``"images:<dir>"``,
        ``"text:<file>"`` or ``"random"``.
    digest : str
        :func:`feeds_digest` of ``feeds``.
    random : bool
        True for labelled noise rather than real data.
    """

    feeds: dict[str, np.ndarray]
    token_mask: NDArray[np.bool_] | None
    labels: tuple[str, ...]
    source: str
    digest: str = ""
    random: bool = False

    def __post_init__(self) -> None:
        if not self.digest:
            object.__setattr__(self, "digest", feeds_digest(self.feeds))

    @property
    def batch_size(self) -> int:
        """Number of items."""
        return len(self.labels)

    def token_mask_for(self, n_tokens: int) -> NDArray[np.bool_]:
        """Return the ``(B, n_tokens)`` real-token mask for a hidden state with ``n_tokens`` tokens."""
        if self.token_mask is None:
            return np.ones((self.batch_size, n_tokens), dtype=bool)
        if self.token_mask.shape[1] != n_tokens:
            raise ImporterInputError(
                f"`n_tokens` must equal the input sequence length {self.token_mask.shape[1]}; "
                f"got {n_tokens}"
            )
        return self.token_mask

    def subset(self, items: slice | Sequence[int]) -> Inputs:
        """Return the items selected by ``items`` (a slice or indices) as new Inputs."""
        index = items if isinstance(items, slice) else np.asarray(items, dtype=np.intp)
        labels = np.asarray(self.labels, dtype=object)[index]
        return replace(
            self,
            feeds={name: array[index] for name, array in self.feeds.items()},
            token_mask=None if self.token_mask is None else self.token_mask[index],
            labels=tuple(str(label) for label in labels),
            digest="",
        )


def _feed_error(problem: str, expected: Sequence[GraphInput]) -> FeedError:
    return FeedError(f"{problem}; the model expects {expected_inputs_text(expected)}")


def _check_one(
    array: np.ndarray, spec: GraphInput, bound: dict[str, int], expected: Sequence[GraphInput]
) -> None:
    if array.dtype != spec.dtype:
        raise _feed_error(f"feed {spec.name!r} must be {spec.dtype}; got {array.dtype}", expected)
    if array.ndim != len(spec.shape):
        raise _feed_error(
            f"feed {spec.name!r} must have {len(spec.shape)} axes; got shape {array.shape}",
            expected,
        )
    for axis, (dim, size) in enumerate(zip(spec.shape, array.shape, strict=True)):
        if isinstance(dim, int) and dim != size:
            raise _feed_error(
                f"feed {spec.name!r} axis {axis} must be {dim}; got shape {array.shape}", expected
            )
        if isinstance(dim, str) and bound.setdefault(dim, size) != size:
            raise _feed_error(
                f"feed {spec.name!r} axis {axis} ({dim}) must be {bound[dim]} like the other "
                f"feeds; got shape {array.shape}",
                expected,
            )


def check_feeds(feeds: Mapping[str, np.ndarray], expected: Sequence[GraphInput]) -> None:
    """Check that ``feeds`` match the graph inputs exactly: names, dtypes, ranks, fixed dims.

    A symbolic dimension must take the same size in every feed that uses it.

    Raises
    ------
    FeedError
        A missing or unknown feed, a wrong dtype, rank or size; the message lists every expected
        input with its shape (symbolic dims by name) and dtype.
    """
    names = [spec.name for spec in expected]
    missing = [name for name in names if name not in feeds]
    if missing:
        raise _feed_error(f"missing feed(s) {', '.join(missing)}", expected)
    unknown = [name for name in feeds if name not in names]
    if unknown:
        raise _feed_error(f"unknown feed(s) {', '.join(unknown)}", expected)
    bound: dict[str, int] = {}
    for spec in expected:
        _check_one(np.asarray(feeds[spec.name]), spec, bound, expected)
        _check_token_values(np.asarray(feeds[spec.name]), spec, expected)


def _check_token_values(
    array: np.ndarray, spec: GraphInput, expected: Sequence[GraphInput]
) -> None:
    """Integer id feeds must be non-negative (onnxruntime would wrap -1 to the vocabulary's last
    row, a silent wrong answer) and mask feeds 0 or 1."""
    if array.dtype.kind not in "iu" or array.size == 0:
        return
    lowered = spec.name.lower()
    if "mask" in lowered and not np.all((array == 0) | (array == 1)):
        raise _feed_error(f"feed {spec.name!r} must hold only 0 and 1", expected)
    if "ids" in lowered and array.min() < 0:
        raise _feed_error(
            f"feed {spec.name!r} must hold non-negative token ids; got {int(array.min())}", expected
        )


def _text_source_for(spec: GraphInput, available: Mapping[str, np.ndarray]) -> str | None:
    if spec.name in available:
        return spec.name
    lowered = spec.name.lower()
    for canonical, alias in _TEXT_ALIASES.items():
        if canonical in available and alias in lowered:
            return canonical
    return None


def _cast(array: np.ndarray, spec: GraphInput, expected: Sequence[GraphInput]) -> np.ndarray:
    if array.dtype == spec.dtype:
        return array
    same_kind = (array.dtype.kind in "iub" and spec.dtype.kind in "iu") or (
        array.dtype.kind == "f" and spec.dtype.kind == "f"
    )
    if not same_kind:
        raise _feed_error(f"feed {spec.name!r} must be {spec.dtype}; got {array.dtype}", expected)
    return array.astype(spec.dtype)


def _map_image(inputs: Inputs, expected: Sequence[GraphInput]) -> dict[str, np.ndarray]:
    candidates = [spec for spec in expected if spec.dtype.kind == "f" and len(spec.shape) == 4]
    if len(expected) != 1 or len(candidates) != 1:
        raise _feed_error("images need a model with a single (B, 3, H, W) float input", expected)
    spec = candidates[0]
    return {spec.name: _cast(inputs.feeds[IMAGE_FEED], spec, expected)}


def _map_text(inputs: Inputs, expected: Sequence[GraphInput]) -> dict[str, np.ndarray]:
    feeds: dict[str, np.ndarray] = {}
    for spec in expected:
        source = _text_source_for(spec, inputs.feeds)
        if source is None:
            raise _feed_error(f"no text feed fits graph input {spec.name!r}", expected)
        feeds[spec.name] = _cast(inputs.feeds[source], spec, expected)
    return feeds


def for_graph(inputs: Inputs, expected: Sequence[GraphInput]) -> Inputs:
    """Map canonical feeds onto a model's graph inputs, then check them.

    Text feeds (``input_ids``, ``attention_mask``, ``token_type_ids``) go to the graph inputs of the
    same name (or containing ``ids`` / ``mask`` / ``type``); those the graph lacks are dropped.
    The image feed goes to the graph's single 4-axis float input. Integer and float feeds are cast
    to the graph's integer or float dtype; other dtype changes are refused.

    Raises
    ------
    FeedError
        The feeds cannot be mapped or do not fit; the message lists the model's inputs.
    """
    if IMAGE_FEED in inputs.feeds:
        feeds = _map_image(inputs, expected)
    elif set(inputs.feeds) & set(TEXT_FEEDS):
        feeds = _map_text(inputs, expected)
    else:
        feeds = dict(inputs.feeds)
    check_feeds(feeds, expected)
    return replace(inputs, feeds=feeds, digest="")
