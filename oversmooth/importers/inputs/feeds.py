"""Model inputs as data: :class:`Inputs` (feeds plus provenance) and checking feeds against a graph.

Every input source (:mod:`oversmooth.importers.inputs.sources`) returns an :class:`Inputs`: batch-first feeds keyed by
the model's graph input names, a mask of the real (non-padding) tokens, one label per item, where the
data came from and a digest of the feed bytes. Feeds are checked against the model's graph inputs
(names, ranks, fixed dimensions, dtypes); a mismatch raises :class:`~oversmooth.importers.errors.FeedError`
listing what the model expects.

Inputs are held in memory (``feeds``) or read batch by batch by a :class:`FeedReader` (images
decoded, noise drawn, ``.npz`` members read when a batch is asked for), so that an audit's memory
does not grow with the number of inputs; :meth:`Inputs.batches` reads them in order either way.

Public API
----------
Inputs
    Feeds (or a reader) plus token mask, labels, source, digest and a ``random`` flag.
FeedReader
    What reads items ``[start, stop)`` of inputs not held in memory.
check_feeds, check_values
    Check feeds against graph inputs; check only their token values (ids >= 0, masks 0/1).
check_finite
    Refuse float feeds holding NaN or infinities, naming the feed and the input.
for_graph
    Rename, cast, pad (a fixed sequence length) and check canonical feeds against a model's inputs.
feeds_digest, streamed_digest
    The sha256 over feed names, dtypes, shapes and bytes; the same, read piece by piece.
concatenate
    Inputs one after the other.
TEXT_FEEDS, IMAGE_FEED
    Canonical feed names before they are mapped onto a graph's inputs.
"""

from __future__ import annotations

import hashlib
from collections.abc import Callable, Iterable, Iterator, Mapping, Sequence
from typing import Any, Protocol

import numpy as np
from numpy.typing import NDArray

from oversmooth.importers.errors import FeedError, ImporterInputError
from oversmooth.importers.graph import GraphInput
from oversmooth.importers.inputs.decoder_feeds import (
    encoder_inputs,
    positions,
    takes_positions,
    with_empty_caches,
    with_encoder_states,
)

__all__ = [
    "IMAGE_FEED",
    "TEXT_FEEDS",
    "Inputs",
    "check_feeds",
    "check_finite",
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
        _update(digest, name, feeds[name])
    return digest.hexdigest()


def _update(digest: Any, name: str, array: np.ndarray) -> None:
    array = np.ascontiguousarray(array)
    digest.update(f"{name}|{array.dtype.str}|{array.shape}|".encode())
    digest.update(array)  # its buffer: no copy of the bytes


class FeedReader(Protocol):
    """Reads items ``[start, stop)`` of inputs that are not held in memory.

    ``read`` returns batch-first feeds keyed by name and the ``(stop - start, T)`` token mask (None
    when every token is real); ``digest`` the :func:`feeds_digest` of all items, read piece by
    piece (:func:`streamed_digest`).
    """

    n_items: int

    def read(self, start: int, stop: int) -> tuple[dict[str, np.ndarray], NDArray[np.bool_] | None]:
        """Items ``[start, stop)``: their feeds and token mask."""
        ...  # pragma: no cover - a protocol

    def digest(self) -> str:
        """The :func:`feeds_digest` of every item."""
        ...  # pragma: no cover - a protocol


class Inputs:
    """Model inputs with provenance: held in memory, or read batch by batch from their source.

    Parameters
    ----------
    feeds : dict of str to ndarray, optional
        Every item in memory: batch-first arrays keyed by graph input name (text: ``(B, T)``
        integer ids and masks; images: ``(B, 3, H, W)`` float32, normalised).
    token_mask : (B, T) bool ndarray, optional
        With ``feeds``: True on real tokens, False on padding; None when every token is real.
    reader : FeedReader, optional
        Instead of ``feeds``: reads items on demand (images decoded, noise drawn, ``.npz`` members
        read per batch), so memory does not grow with the number of items.
    labels : sequence of str
        One label per item (file name or sentence).
    source : str
        ``"bundled-images"``, ``"bundled-text"``, ``"npz:<digest>"``, ``"images:<dir>"``,
        ``"text:<file>"`` or ``"random"``.
    digest : str, optional
        :func:`feeds_digest` of all feeds; computed when first asked for (for a reader, by reading
        every item once more).
    random : bool
        True for labelled noise rather than real data.
    """

    __slots__ = ("_digest", "_feeds", "_reader", "_token_mask", "labels", "random", "source")

    def __init__(
        self,
        *,
        labels: Sequence[str],
        source: str,
        feeds: dict[str, np.ndarray] | None = None,
        token_mask: NDArray[np.bool_] | None = None,
        reader: FeedReader | None = None,
        digest: str = "",
        random: bool = False,
    ) -> None:
        if (feeds is None) == (reader is None):
            raise ImporterInputError(
                "`Inputs` needs either `feeds` or a `reader`; got both or neither"
            )
        self.labels = tuple(labels)
        self.source = source
        self.random = random
        self._feeds = feeds
        self._token_mask = token_mask
        self._reader = reader
        self._digest = digest

    def __repr__(self) -> str:
        held = "in memory" if self.in_memory else "read per batch"
        return f"Inputs({self.batch_size} items from {self.source!r}, {held})"

    @property
    def in_memory(self) -> bool:
        """Whether every item is held in memory (else items are read per batch)."""
        return self._feeds is not None

    @property
    def feeds(self) -> dict[str, np.ndarray]:
        """Every item's feeds (read whole, in memory, when the inputs come from a reader)."""
        return self._feeds if self._feeds is not None else self.read(0, self.batch_size).feeds

    @property
    def token_mask(self) -> NDArray[np.bool_] | None:
        """``(B, T)``: True on real tokens, False on padding; None when every token is real."""
        if self._feeds is not None:
            return self._token_mask
        return self.read(0, self.batch_size).token_mask

    @property
    def digest(self) -> str:
        """:func:`feeds_digest` of every item's feeds."""
        if not self._digest:
            reader = self._reader
            self._digest = feeds_digest(self.feeds) if reader is None else reader.digest()
        return self._digest

    @property
    def batch_size(self) -> int:
        """Number of items."""
        return len(self.labels)

    def token_mask_for(self, n_tokens: int) -> NDArray[np.bool_]:
        """Return the ``(B, n_tokens)`` real-token mask for a hidden state with ``n_tokens`` tokens."""
        mask = self.token_mask
        if mask is None:
            return np.ones((self.batch_size, n_tokens), dtype=bool)
        if mask.shape[1] != n_tokens:
            raise ImporterInputError(
                f"`n_tokens` must equal the input sequence length {mask.shape[1]}; got {n_tokens}"
            )
        return mask

    def read(self, start: int, stop: int) -> Inputs:
        """Items ``[start, stop)`` as Inputs held in memory."""
        stop = min(stop, self.batch_size)
        if self._feeds is not None:
            return self.subset(slice(start, stop))
        assert self._reader is not None
        feeds, mask = self._reader.read(start, stop)
        return Inputs(
            feeds=feeds,
            token_mask=mask,
            labels=self.labels[start:stop],
            source=self.source,
            random=self.random,
        )

    def batches(self, size: int) -> Iterator[Inputs]:
        """Consecutive batches of at most ``size`` items, each held in memory, in item order."""
        for start in range(0, self.batch_size, size):
            yield self.read(start, start + size)

    def subset(self, items: slice | Sequence[int]) -> Inputs:
        """Return the items selected by ``items`` (a slice or indices) as new Inputs in memory."""
        if self._feeds is None:
            indices = range(self.batch_size)[items] if isinstance(items, slice) else items
            parts = [self.read(int(i), int(i) + 1) for i in indices]
            return concatenate(parts, self)
        index = items if isinstance(items, slice) else np.asarray(items, dtype=np.intp)
        labels = np.asarray(self.labels, dtype=object)[index]
        mask = self._token_mask
        return Inputs(
            feeds={name: _rows(array, index) for name, array in self._feeds.items()},
            token_mask=None if mask is None else mask[index],
            labels=tuple(str(label) for label in labels),
            source=self.source,
            random=self.random,
        )

    def with_feeds(self, reader: FeedReader) -> Inputs:
        """The same items, labels and provenance read through ``reader`` (digest recomputed)."""
        return Inputs(reader=reader, labels=self.labels, source=self.source, random=self.random)


def _rows(array: np.ndarray, index: slice | np.ndarray) -> np.ndarray:
    return array[index] if array.ndim else array


def concatenate(parts: Sequence[Inputs], like: Inputs) -> Inputs:
    """Items of ``parts`` (held in memory) one after the other, with ``like``'s provenance."""
    if not parts:
        return like.read(0, 0)
    masks = [part.token_mask for part in parts if part.token_mask is not None]
    return Inputs(
        feeds={
            name: np.concatenate([part.feeds[name] for part in parts]) if array.ndim else array
            for name, array in parts[0].feeds.items()
        },
        token_mask=np.concatenate(masks) if masks else None,
        labels=tuple(label for part in parts for label in part.labels),
        source=like.source,
        random=like.random,
    )


#: Bytes of one feed read at a time while streaming a digest.
DIGEST_CHUNK_BYTES = 4 * 2**20


def streamed_digest(read: Callable[[int, int], Mapping[str, np.ndarray]], n_items: int) -> str:
    """:func:`feeds_digest` of ``n_items`` items read in pieces, one feed at a time.

    Equal to ``feeds_digest`` of the concatenated feeds: per feed (in name order) its header with
    the full shape, then the bytes of its rows in order. ``read(start, stop)`` returns the feeds
    of items ``[start, stop)``; each feed is read in pieces of about :data:`DIGEST_CHUNK_BYTES`,
    so memory stays bounded whatever ``n_items``.
    """
    probe = read(0, 1)
    digest = hashlib.sha256()
    for name in sorted(probe):
        row = np.asarray(probe[name])
        if row.ndim == 0:
            _update(digest, name, row)
            continue
        shape = (n_items, *row.shape[1:])
        digest.update(f"{name}|{row.dtype.str}|{shape}|".encode())
        step = max(1, DIGEST_CHUNK_BYTES // max(1, row.nbytes))
        for start in range(0, n_items, step):
            digest.update(np.ascontiguousarray(read(start, start + step)[name]).tobytes())
    return digest.hexdigest()


def _feed_error(problem: str, expected: Sequence[GraphInput]) -> FeedError:
    return FeedError(f"{problem}; the model expects {expected_inputs_text(expected)}")


def _check_one(
    array: np.ndarray,
    spec: GraphInput,
    bound: dict[str, int],
    expected: Sequence[GraphInput],
    any_batch: bool,
) -> None:
    if array.dtype != spec.dtype:
        raise _feed_error(f"feed {spec.name!r} must be {spec.dtype}; got {array.dtype}", expected)
    if array.ndim != len(spec.shape):
        raise _feed_error(
            f"feed {spec.name!r} must have {len(spec.shape)} axes; got shape {array.shape}",
            expected,
        )
    for axis, (dim, size) in enumerate(zip(spec.shape, array.shape, strict=True)):
        if axis == spec.past_axis:
            if size != 0:
                raise _feed_error(
                    f"feed {spec.name!r} is a KV cache: the audit runs the model without a cache "
                    f"(past length 0), so its axis {axis} must be 0; got shape {array.shape}",
                    expected,
                )
            continue
        if isinstance(dim, int) and dim != size and not (any_batch and axis == 0):
            raise _feed_error(
                f"feed {spec.name!r} axis {axis} must be {dim}; got shape {array.shape}", expected
            )
        if isinstance(dim, str) and bound.setdefault(dim, size) != size:
            raise _feed_error(
                f"feed {spec.name!r} axis {axis} ({dim}) must be {bound[dim]} like the other "
                f"feeds; got shape {array.shape}",
                expected,
            )


def check_feeds(
    feeds: Mapping[str, np.ndarray],
    expected: Sequence[GraphInput],
    *,
    any_batch: bool = False,
    values: bool = True,
) -> None:
    """Check that ``feeds`` match the graph inputs exactly: names, dtypes, ranks, fixed dims.

    A symbolic dimension must take the same size in every feed that uses it. With ``any_batch`` a
    batch size (axis 0) the graph fixes is not checked (the runner fills batches to it). Without
    ``values`` only names, dtypes and shapes are checked, not the token values (:func:`check_values`).

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
        _check_one(np.asarray(feeds[spec.name]), spec, bound, expected, any_batch)
    if values:
        check_values(feeds, expected)


def check_values(feeds: Mapping[str, np.ndarray], expected: Sequence[GraphInput]) -> None:
    """Check the token values of those ``feeds`` that are graph inputs (any subset, any rows).

    Raises
    ------
    FeedError
        Negative token ids, or a mask holding other values than 0 and 1.
    """
    for spec in expected:
        if spec.name in feeds:
            _check_token_values(np.asarray(feeds[spec.name]), spec, expected)


def check_finite(feeds: Mapping[str, np.ndarray], labels: Sequence[str], first: int = 0) -> None:
    """Refuse float feeds holding NaN or infinities, naming the feed and the first such input.

    ``labels`` name the items of ``feeds`` (batch first), the first of them numbered ``first``.
    Checked on every batch before the model runs: a non-finite input would make every metric and
    eigenvalue of its layers NaN (or LAPACK fail on them), so it is refused as bad input, and a
    non-finite hidden state found later is the model's own (:class:`NonFiniteModelError`).

    Raises
    ------
    ImporterInputError
        A float feed with a NaN or infinite entry.
    """
    for name, array in feeds.items():
        array = np.asarray(array)
        if array.dtype.kind not in "fc" or array.size == 0:
            continue
        finite = np.isfinite(array)
        if finite.all():
            continue
        if not array.ndim:
            raise ImporterInputError(
                f"inputs must be finite; feed {name!r} (one value for every input) is {array}"
            )
        item = int(np.flatnonzero(~finite.reshape(len(array), -1).all(axis=1))[0])
        label = labels[item] if item < len(labels) else f"item-{first + item}"
        row = np.atleast_1d(array[item])
        bad = row[~np.isfinite(row)]
        kinds = "/".join(sorted({"NaN" if np.isnan(x) else "inf" for x in bad[:64]}))
        raise ImporterInputError(
            f"inputs must be finite; feed {name!r} of input {_short(label)!r} (item "
            f"{first + item}) holds {bad.size} {kinds} value(s)"
        )


def _short(label: str) -> str:
    return label if len(label) <= 40 else label[:37] + "..."


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
    if "position" in lowered:  # position ids are counted from the mask, never token ids
        return None
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


def _map_image(
    feeds: Mapping[str, np.ndarray], expected: Sequence[GraphInput]
) -> dict[str, np.ndarray]:
    candidates = [spec for spec in expected if spec.dtype.kind == "f" and len(spec.shape) == 4]
    if len(expected) != 1 or len(candidates) != 1:
        raise _feed_error("images need a model with a single (B, 3, H, W) float input", expected)
    spec = candidates[0]
    return {spec.name: _cast(feeds[IMAGE_FEED], spec, expected)}


def _map_text(
    feeds: Mapping[str, np.ndarray], expected: Sequence[GraphInput]
) -> dict[str, np.ndarray]:
    """Text feeds onto the graph's inputs: ids, mask and types by name, position ids counted from
    the mask (:func:`positions`); key/value caches and a decoder's encoder states and mask are
    added later (:func:`with_empty_caches`, :func:`with_encoder_states`)."""
    mapped: dict[str, np.ndarray] = {}
    encoder = encoder_inputs(expected).names
    for spec in expected:
        if (spec.past_axis is not None or spec.name in encoder) and spec.name not in feeds:
            continue
        if takes_positions(spec) and spec.name not in feeds:
            mask = feeds.get("attention_mask", np.ones_like(feeds["input_ids"]))
            mapped[spec.name] = positions(mask).astype(spec.dtype)
            continue
        source = _text_source_for(spec, feeds)
        if source is None:
            raise _feed_error(f"no text feed fits graph input {spec.name!r}", expected)
        mapped[spec.name] = _cast(feeds[source], spec, expected)
    return mapped


def _fixed_sequence(expected: Sequence[GraphInput]) -> int | None:
    encoder = encoder_inputs(expected).names
    sizes = {
        spec.shape[1] for spec in expected if len(spec.shape) == 2 and spec.name not in encoder
    }
    fixed = [size for size in sizes if isinstance(size, int)]
    return fixed[0] if len(fixed) == 1 else None


def _fit_sequence(
    feeds: dict[str, np.ndarray],
    token_mask: NDArray[np.bool_] | None,
    expected: Sequence[GraphInput],
    mask_name: str | None,
) -> tuple[dict[str, np.ndarray], NDArray[np.bool_] | None]:
    """Texts padded (or their padding cut) to the sequence length the graph fixes, if it fixes one.

    The padding tokens get id 0 and mask 0, so attention ignores them and no metric counts them.
    Refused when a text has more real tokens than that length, or when the graph has no mask input
    to hide the padding.
    """
    length = _fixed_sequence(expected)
    width = next(iter(feeds.values())).shape[1]
    if length is None or width == length:
        return feeds, token_mask
    real = np.ones(width, bool) if token_mask is None else token_mask.any(axis=0)
    longest = int(np.flatnonzero(real)[-1]) + 1 if real.any() else 0
    if longest > length:
        raise _feed_error(
            f"the model fixes the sequence at {length} tokens; got texts of {longest} tokens "
            f"(shorten them)",
            expected,
        )
    if mask_name is None and longest != length:
        raise _feed_error(
            f"the model fixes the sequence at {length} tokens and has no attention-mask input to "
            f"hide padding; got texts of {longest} tokens",
            expected,
        )
    extra = length - longest
    fitted = {
        name: np.pad(array[:, :longest], ((0, 0), (0, extra))) for name, array in feeds.items()
    }
    if token_mask is None:
        token_mask = np.ones((next(iter(feeds.values())).shape[0], width), bool)
    return fitted, np.pad(token_mask[:, :longest], ((0, 0), (0, extra)))


def _map_feeds(
    feeds: Mapping[str, np.ndarray],
    token_mask: NDArray[np.bool_] | None,
    expected: Sequence[GraphInput],
) -> tuple[dict[str, np.ndarray], NDArray[np.bool_] | None]:
    if IMAGE_FEED in feeds:
        return _map_image(feeds, expected), token_mask
    if set(feeds) & set(TEXT_FEEDS):
        own = [spec for spec in expected if spec.name not in encoder_inputs(expected).names]
        mask_name, ids = (
            next((spec.name for spec in own if _text_source_for(spec, feeds) == name), None)
            for name in ("attention_mask", "input_ids")
        )
        fitted, mask = _fit_sequence(_map_text(feeds, expected), token_mask, expected, mask_name)
        fitted = with_encoder_states(with_empty_caches(fitted, expected), expected, ids or "")
        return fitted, mask
    return with_empty_caches(feeds, expected), token_mask


class _MappedReader:
    """Reads ``inputs`` batch by batch and maps each batch onto the graph inputs."""

    def __init__(self, inputs: Inputs, expected: Sequence[GraphInput]) -> None:
        self.inputs = inputs
        self.expected = tuple(expected)
        self.n_items = inputs.batch_size

    def read(self, start: int, stop: int) -> tuple[dict[str, np.ndarray], NDArray[np.bool_] | None]:
        batch = self.inputs.read(start, stop)
        return _map_feeds(batch.feeds, batch.token_mask, self.expected)

    def digest(self) -> str:
        return streamed_digest(lambda start, stop: self.read(start, stop)[0], self.n_items)


def for_graph(inputs: Inputs, expected: Sequence[GraphInput]) -> Inputs:
    """Map canonical feeds onto a model's graph inputs, then check them.

    Text feeds (``input_ids``, ``attention_mask``, ``token_type_ids``) go to the graph inputs of the
    same name (or containing ``ids`` / ``mask`` / ``type``); those the graph lacks are dropped; a
    sequence length the graph fixes is met by padding (masked out, see :func:`_fit_sequence`).
    The image feed goes to the graph's single 4-axis float input. Integer and float feeds are cast
    to the graph's integer or float dtype; other dtype changes are refused. A batch size the graph
    fixes is not checked: the runner fills its batches to it. Inputs that are read per batch are
    mapped per batch; their first item is checked here, every batch when it is run.

    Raises
    ------
    FeedError
        The feeds cannot be mapped or do not fit; the message lists the model's inputs.
    """
    if not inputs.in_memory:
        reader = _MappedReader(inputs, expected)
        check_feeds(reader.read(0, 1)[0], expected, any_batch=True)
        return inputs.with_feeds(reader)
    feeds, mask = _map_feeds(inputs.feeds, inputs.token_mask, expected)
    check_feeds(feeds, expected, any_batch=True)
    return Inputs(
        feeds=feeds,
        token_mask=mask,
        labels=inputs.labels,
        source=inputs.source,
        random=inputs.random,
    )
