"""Model inputs as data (:mod:`oversmooth.importers.inputs.feeds`): the feed digest and its streamed
twin, :class:`Inputs` held in memory or read per batch (construction, batches, subsets,
concatenation), checking feeds against graph inputs (names, dtypes, ranks, fixed and symbolic dims,
a KV cache fed empty, token values, finite floats) and mapping canonical feeds onto a graph
(renaming, casting, a fixed sequence met by masked padding).

Bundled, image, text and ``.npz`` sources are ``test_sources``/``test_npz``; inputs read lazily
through an audit ``test_lazy_inputs``; fixed sequences on real graphs ``runtime/test_batching``.
"""

from __future__ import annotations

import hashlib

import numpy as np
import pytest

from oversmooth.importers import errors
from oversmooth.importers.errors import ImporterInputError
from oversmooth.importers.graph import GraphInput
from oversmooth.importers.inputs import sources
from oversmooth.importers.inputs.feeds import (
    Inputs,
    check_feeds,
    check_finite,
    concatenate,
    expected_inputs_text,
    feeds_digest,
    for_graph,
    streamed_digest,
)
from oversmooth.simulator.errors import InputError
from tests.importers.inputs.batched import assert_batches_are_the_items

INT64 = np.dtype(np.int64)
TEXT_GRAPH = (
    GraphInput("input_ids", INT64, ("batch", "sequence")),
    GraphInput("attention_mask", INT64, ("batch", "sequence")),
)
IMAGE_GRAPH = (GraphInput("input_image", np.dtype(np.float32), ("batch_size", 3, 224, 224)),)


class _RowsReader:
    """A :class:`~oversmooth.importers.inputs.feeds.FeedReader` over arrays held here, counting
    the items it is asked for."""

    def __init__(self, feeds: dict[str, np.ndarray]) -> None:
        self.feeds = feeds
        self.n_items = len(next(iter(feeds.values())))
        self.asked: list[tuple[int, int]] = []

    def read(self, start: int, stop: int):
        self.asked.append((start, stop))
        return {name: array[start:stop] for name, array in self.feeds.items()}, None

    def digest(self) -> str:
        return streamed_digest(lambda start, stop: self.read(start, stop)[0], self.n_items)


def _text(lengths: list[int], width: int) -> Inputs:
    """Texts of ``lengths`` real tokens (ids 1, 2, ...), padded with 0 to ``width``."""
    mask = np.arange(width)[None, :] < np.array(lengths)[:, None]
    ids = np.where(mask, np.arange(1, width + 1)[None, :], 0).astype(np.int64)
    return Inputs(
        feeds={"input_ids": ids, "attention_mask": mask.astype(np.int64)},
        token_mask=mask,
        labels=[f"t{i}" for i in range(len(lengths))],
        source="test",
    )


# Moved from tests/importers/inputs/test_sources.py.
def test_for_graph_drops_feeds_the_graph_lacks_and_casts_ids() -> None:
    graph = (
        GraphInput("input_ids", np.dtype(np.int32), ("b", "t")),
        GraphInput("attention_mask", np.dtype(np.int32), ("b", "t")),
    )
    text = sources.bundled_inputs("text")
    mapped = for_graph(text, graph)
    assert set(mapped.feeds) == {"input_ids", "attention_mask"}
    assert mapped.feeds["input_ids"].dtype == np.int32
    assert np.array_equal(mapped.feeds["input_ids"], text.feeds["input_ids"])
    assert mapped.digest != text.digest
    assert mapped.labels == text.labels


# Moved from tests/importers/inputs/test_sources.py.
def test_for_graph_maps_text_by_name_fragment() -> None:
    graph = (
        GraphInput("ids", np.dtype(np.int64), ("b", "t")),
        GraphInput("mask", np.dtype(np.int64), ("b", "t")),
        GraphInput("segment_type", np.dtype(np.int64), ("b", "t")),
    )
    text = sources.bundled_inputs("text")
    mapped = for_graph(text, graph)
    assert np.array_equal(mapped.feeds["mask"], text.feeds["attention_mask"])
    assert np.array_equal(mapped.feeds["segment_type"], text.feeds["token_type_ids"])


# Moved from tests/importers/inputs/test_sources.py.
@pytest.mark.parametrize(
    ("feeds", "problem"),
    [
        ({"input_ids": np.zeros((2, 5), np.int64)}, "missing feed(s) attention_mask"),
        (
            {
                "input_ids": np.zeros((2, 5), np.int64),
                "attention_mask": np.ones((2, 5), np.int64),
                "extra": np.ones(2),
            },
            "unknown feed(s) extra",
        ),
        (
            {
                "input_ids": np.zeros((2, 5), np.float32),
                "attention_mask": np.ones((2, 5), np.int64),
            },
            "feed 'input_ids' must be int64; got float32",
        ),
        (
            {
                "input_ids": np.zeros((2, 5, 1), np.int64),
                "attention_mask": np.ones((2, 5), np.int64),
            },
            "feed 'input_ids' must have 2 axes; got shape (2, 5, 1)",
        ),
        (
            {"input_ids": np.zeros((2, 5), np.int64), "attention_mask": np.ones((2, 6), np.int64)},
            "axis 1 (sequence) must be 5 like the other feeds; got shape (2, 6)",
        ),
    ],
    ids=["missing", "unknown", "dtype", "rank", "symbolic-dim"],
)
def test_check_feeds_errors_list_what_the_model_expects(feeds: dict, problem: str) -> None:
    with pytest.raises(errors.FeedError) as info:
        check_feeds(feeds, TEXT_GRAPH)
    message = str(info.value)
    assert problem in message
    assert "input_ids: int64 [batch, sequence]; attention_mask: int64 [batch, sequence]" in message
    assert "\n" not in message


# Moved from tests/importers/inputs/test_sources.py.
def test_check_feeds_fixed_dim() -> None:
    with pytest.raises(errors.FeedError, match=r"axis 1 must be 3; got shape \(1, 1, 224, 224\)"):
        check_feeds({"input_image": np.zeros((1, 1, 224, 224), np.float32)}, IMAGE_GRAPH)


# Moved from tests/importers/inputs/test_sources.py.
def test_subset_and_token_mask_for() -> None:
    text = sources.bundled_inputs("text")
    part = text.subset([1, 3])
    assert part.labels == (text.labels[1], text.labels[3])
    assert np.array_equal(part.feeds["input_ids"], text.feeds["input_ids"][[1, 3]])
    assert part.digest == feeds_digest(part.feeds)
    assert part.token_mask_for(text.token_mask.shape[1]).shape == (2, text.token_mask.shape[1])
    with pytest.raises(InputError, match="`n_tokens` must equal"):
        part.token_mask_for(3)
    images = sources.bundled_inputs("image").subset(slice(0, 2))
    assert images.token_mask_for(257).shape == (2, 257)
    assert images.token_mask_for(257).all()


# Moved from tests/importers/inputs/test_sources.py.
@pytest.mark.parametrize(
    ("name", "values", "problem"),
    [
        ("input_ids", [[101, -1, 102]], "non-negative token ids"),
        ("attention_mask", [[1, 2, 1]], "only 0 and 1"),
    ],
)
def test_token_values_that_onnxruntime_would_misread_are_refused(name, values, problem):
    feeds = {
        "input_ids": np.array([[101, 7, 102]], np.int64),
        "attention_mask": np.ones((1, 3), np.int64),
    }
    feeds[name] = np.array(values, np.int64)
    with pytest.raises(errors.FeedError, match=problem):
        check_feeds(feeds, TEXT_GRAPH)


# Moved from tests/importers/audit/test_nonfinite.py.
def test_feeds_are_refused_by_feed_and_input() -> None:
    check_finite({"ids": np.zeros((2, 3), np.int64), "x": np.ones((2, 3))}, ("a", "b"))
    with pytest.raises(ImporterInputError, match=r"feed 'x' of input 'b' \(item 11\)"):
        check_finite({"x": np.array([[1.0], [np.nan]])}, ("a", "b"), 10)
    with pytest.raises(ImporterInputError, match="one value for every input"):
        check_finite({"x": np.array(np.inf)}, ("a",))


def test_the_digest_is_sha256_over_name_dtype_shape_and_bytes_in_name_order() -> None:
    """Hand-built from its definition for one feed; the same values in another memory order are
    the same digest, the same bytes under another shape, dtype or name are not."""
    x = np.arange(6, dtype=np.int32).reshape(2, 3)
    expected = hashlib.sha256(b"x|<i4|(2, 3)|" + x.tobytes()).hexdigest()
    assert feeds_digest({"x": x}) == expected
    assert feeds_digest({"x": np.asfortranarray(x)}) == expected
    others = [{"x": x.reshape(3, 2)}, {"x": x.view(np.float32)}, {"y": x}]
    assert expected not in {feeds_digest(feeds) for feeds in others}
    pair = {"b": x, "a": x + 1}
    assert feeds_digest(pair) == feeds_digest(dict(reversed(pair.items())))


def test_a_streamed_digest_equals_the_digest_of_every_item_at_once(small_chunks) -> None:
    """Read one item or so at a time (64-byte pieces), a 0-d feed once."""
    rng = np.random.default_rng(0)
    feeds = {
        "x": rng.standard_normal((7, 3)),
        "ids": rng.integers(0, 9, (7, 5)),
        "scale": np.array(0.5),
    }

    def read(start: int, stop: int) -> dict[str, np.ndarray]:
        return {n: a[start:stop] if a.ndim else a for n, a in feeds.items()}

    assert streamed_digest(read, 7) == feeds_digest(feeds)


def test_inputs_take_either_feeds_or_a_reader() -> None:
    feeds = {"x": np.zeros((1, 2))}
    reader = _RowsReader(feeds)
    for both_or_neither in ({"feeds": feeds, "reader": reader}, {}):
        with pytest.raises(ImporterInputError, match="either `feeds` or a `reader`"):
            Inputs(labels=["a"], source="test", **both_or_neither)


def test_inputs_read_per_batch_are_read_only_when_asked_and_equal_those_held() -> None:
    """A reader is asked for the batches taken, nothing more; the items, subsets, digest and
    concatenation equal those of the same arrays held in memory."""
    x = np.arange(10.0).reshape(5, 2)
    reader = _RowsReader({"x": x})
    lazy = Inputs(reader=reader, labels=list("abcde"), source="test")
    held = Inputs(feeds={"x": x}, labels=list("abcde"), source="test")
    assert repr(lazy) == "Inputs(5 items from 'test', read per batch)"
    assert repr(held) == "Inputs(5 items from 'test', in memory)"
    assert reader.asked == []
    assert [part.labels for part in lazy.batches(2)] == [("a", "b"), ("c", "d"), ("e",)]
    assert reader.asked == [(0, 2), (2, 4), (4, 5)]
    assert_batches_are_the_items(lazy, 2)
    picked = lazy.subset([4, 1])
    np.testing.assert_array_equal(picked.feeds["x"], x[[4, 1]], strict=True)
    assert picked.labels == ("e", "b")
    assert picked.in_memory
    assert lazy.digest == held.digest == feeds_digest({"x": x})
    joined = concatenate([held.read(3, 5), held.read(0, 1)], held)
    np.testing.assert_array_equal(joined.feeds["x"], x[[3, 4, 0]], strict=True)
    assert concatenate([], held).batch_size == 0


def test_a_feed_shared_by_every_item_is_kept_whole() -> None:
    """A 0-d feed (one value for every item) is neither indexed nor concatenated."""
    held = Inputs(feeds={"x": np.ones((3, 2)), "t": np.array(7)}, labels="abc", source="test")
    part = held.subset([0, 2])
    assert part.feeds["t"] == 7
    assert part.feeds["x"].shape == (2, 2)
    assert concatenate([part, held.read(1, 2)], held).feeds["t"] == 7


def test_the_expected_inputs_are_one_line_in_graph_order() -> None:
    assert expected_inputs_text(TEXT_GRAPH) == (
        "input_ids: int64 [batch, sequence]; attention_mask: int64 [batch, sequence]"
    )


def test_a_fixed_batch_is_not_checked_with_any_batch_and_token_values_only_when_asked() -> None:
    graph = (GraphInput("input_ids", INT64, (1, "t")),)
    feeds = {"input_ids": np.array([[-1, 2], [3, 4]])}
    check_feeds(feeds, graph, any_batch=True, values=False)
    with pytest.raises(errors.FeedError, match="axis 0 must be 1"):
        check_feeds(feeds, graph, values=False)
    with pytest.raises(errors.FeedError, match="non-negative token ids; got -1"):
        check_feeds(feeds, graph, any_batch=True)


def test_a_kv_cache_feed_must_have_an_empty_past_axis() -> None:
    graph = (GraphInput("past", np.dtype(np.float32), ("b", 2, "p", 4), past_axis=2),)
    check_feeds({"past": np.zeros((3, 2, 0, 4), np.float32)}, graph)
    with pytest.raises(errors.FeedError, match=r"KV cache: .* its axis 2 must be 0"):
        check_feeds({"past": np.zeros((3, 2, 1, 4), np.float32)}, graph)


def test_a_non_finite_feed_names_its_count_kinds_and_a_shortened_label() -> None:
    x = np.zeros((3, 4))
    x[2, [0, 3]] = np.nan
    x[2, 1] = -np.inf
    labels = ("a", "b", "c" * 60)
    with pytest.raises(ImporterInputError) as caught:
        check_finite({"x": x}, labels)
    assert f"input '{'c' * 37}...' (item 2) holds 3 NaN/inf value(s)" in str(caught.value)
    check_finite({"x": np.zeros((0, 4)) * np.nan}, ())  # nothing to check


def test_a_fixed_sequence_is_met_by_masked_padding_or_cut_padding() -> None:
    """Texts of 2 and 3 real tokens padded to 5 meet a graph fixing 4 (id 0, mask 0 after the
    real tokens); a text of 5 real tokens does not."""
    graph = tuple(GraphInput(spec.name, INT64, ("batch", 4)) for spec in TEXT_GRAPH)
    fitted = for_graph(_text([2, 3], width=5), graph)
    expected_mask = np.array([[1, 1, 0, 0], [1, 1, 1, 0]])
    np.testing.assert_array_equal(fitted.feeds["attention_mask"], expected_mask, strict=True)
    np.testing.assert_array_equal(fitted.feeds["input_ids"], expected_mask * [1, 2, 3, 4])
    np.testing.assert_array_equal(fitted.token_mask, expected_mask.astype(bool), strict=True)
    widened = for_graph(
        _text([2, 3], width=3), (*graph[:1], GraphInput("attention_mask", INT64, ("batch", 4)))
    )
    np.testing.assert_array_equal(widened.feeds["attention_mask"], expected_mask, strict=True)
    with pytest.raises(errors.FeedError, match="fixes the sequence at 4 tokens; got texts of 5"):
        for_graph(_text([5, 1], width=5), graph)


def test_a_fixed_sequence_without_a_mask_input_is_refused_rather_than_padded() -> None:
    graph = (GraphInput("input_ids", INT64, ("batch", 4)),)
    with pytest.raises(errors.FeedError, match="no attention-mask input to hide padding"):
        for_graph(_text([2, 3], width=3), graph)
    exact = for_graph(_text([4, 4], width=4), graph)  # nothing to hide: taken as it is
    assert exact.feeds["input_ids"].shape == (2, 4)


def test_float_feeds_are_not_cast_to_integer_inputs() -> None:
    inputs = Inputs(feeds={"input_ids": np.ones((1, 3))}, labels=["a"], source="test")
    with pytest.raises(errors.FeedError, match="feed 'input_ids' must be int64; got float64"):
        for_graph(inputs, TEXT_GRAPH[:1])


def test_inputs_read_per_batch_are_mapped_per_batch() -> None:
    """The mapping of lazy inputs reads nothing but the first item until the batches are read;
    then every batch is renamed and cast like the inputs held in memory."""
    ids = np.arange(12, dtype=np.int64).reshape(4, 3)
    reader = _RowsReader({"input_ids": ids})
    graph = (GraphInput("token_ids", np.dtype(np.int32), ("b", "t")),)
    mapped = for_graph(Inputs(reader=reader, labels="abcd", source="test"), graph)
    assert reader.asked == [(0, 1)]
    assert not mapped.in_memory
    batches = [batch.feeds["token_ids"] for batch in mapped.batches(3)]
    np.testing.assert_array_equal(np.concatenate(batches), ids.astype(np.int32), strict=True)
