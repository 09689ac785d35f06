"""A decoder's feeds (importers.inputs.decoder_feeds): key/value caches fed empty, position ids,
and the encoder's output it takes as graph inputs: text sources draw the states (seeded per item
by its token ids) and give their mask ones; the token mask stays the decoder's own; an ``.npz``
may hold them; the audit's note says which. (Caches fed through every input source, on the
corpus' with-past exports: tests/importers/test_kv_cache.py.)"""

from __future__ import annotations

import numpy as np
import pytest

from oversmooth.importers.errors import FeedError
from oversmooth.importers.graph import GraphInput
from oversmooth.importers.inputs.decoder_feeds import (
    EncoderInputs,
    cache_note,
    empty_cache,
    encoder_inputs,
    encoder_states_note,
    positions,
    takes_positions,
    token_mask_input,
    with_empty_caches,
    with_encoder_states,
)
from oversmooth.importers.inputs.feeds import Inputs, for_graph
from oversmooth.importers.inputs.sources import random_inputs

D_MODEL = 32
INT64, FLOAT32 = np.dtype(np.int64), np.dtype(np.float32)

#: The inputs of the legacy T5 decoder export, the encoder's mask declared first.
DECODER = (
    GraphInput("encoder_attention_mask", INT64, ("batch", "encoder_sequence")),
    GraphInput("input_ids", INT64, ("batch", "sequence")),
    GraphInput("attention_mask", INT64, ("batch", "sequence")),
    GraphInput("encoder_hidden_states", FLOAT32, ("batch", "encoder_sequence", D_MODEL)),
)


def _text(ids: np.ndarray) -> Inputs:
    mask = np.ones_like(ids)
    mask[1, -2:] = 0
    return Inputs(
        feeds={"input_ids": ids, "attention_mask": mask},
        token_mask=mask.astype(bool),
        labels=tuple(f"item-{i}" for i in range(len(ids))),
        source="test",
    )


def test_encoder_inputs_are_found_by_rank_dtype_and_axes() -> None:
    encoder = encoder_inputs(DECODER)
    assert [spec.name for spec in encoder.states] == ["encoder_hidden_states"]
    assert [spec.name for spec in encoder.masks] == ["encoder_attention_mask"]
    assert token_mask_input(DECODER) == "attention_mask"
    encoder_only = [spec for spec in DECODER if spec.name in ("input_ids", "attention_mask")]
    assert encoder_inputs(encoder_only).names == frozenset()
    assert token_mask_input(encoder_only) == "attention_mask"


def test_a_mask_sharing_the_states_token_axis_is_the_encoders_whatever_its_name() -> None:
    renamed = (GraphInput("cross_mask", INT64, ("batch", "encoder_sequence")), *DECODER[1:])
    assert [spec.name for spec in encoder_inputs(renamed).masks] == ["cross_mask"]
    assert token_mask_input(renamed) == "attention_mask"


def test_text_inputs_get_random_states_the_same_for_an_item_in_any_batch() -> None:
    ids = np.random.default_rng(0).integers(3, 100, size=(3, 5))
    whole = for_graph(_text(ids), DECODER)
    states = whole.feeds["encoder_hidden_states"]
    assert states.shape == (3, 5, D_MODEL)
    assert states.dtype == np.float32
    assert np.array_equal(whole.feeds["encoder_attention_mask"], np.ones((3, 5), np.int64))
    assert np.array_equal(whole.token_mask, whole.feeds["attention_mask"].astype(bool))
    alone = for_graph(_text(ids[[1, 2]]), DECODER).feeds["encoder_hidden_states"]
    np.testing.assert_array_equal(alone, states[[1, 2]])
    assert not np.allclose(states[0], states[1])
    other = for_graph(_text(ids + 1), DECODER).feeds["encoder_hidden_states"]
    assert not np.allclose(other, states)


def test_states_given_are_kept() -> None:
    ids = np.full((2, 4), 7)
    given = np.zeros((2, 3, D_MODEL), np.float32)
    feeds = with_encoder_states({"input_ids": ids, "encoder_hidden_states": given}, DECODER)
    assert feeds["encoder_hidden_states"] is given
    assert feeds["encoder_attention_mask"].shape == (2, 3)


def test_states_of_an_open_width_are_refused_in_one_line() -> None:
    open_width = (*DECODER[:3], GraphInput("encoder_hidden_states", FLOAT32, ("b", "s", "d")))
    with pytest.raises(FeedError, match=r"feature axis is left open; feed them in an \.npz"):
        with_encoder_states({"input_ids": np.ones((1, 2), np.int64)}, open_width)


def test_random_inputs_take_the_decoders_own_mask_as_the_token_mask() -> None:
    inputs = random_inputs(DECODER, batch=2, seq=4)
    batch = inputs.read(0, 2)
    assert batch.feeds["encoder_hidden_states"].shape == (2, 4, D_MODEL)
    assert np.array_equal(batch.token_mask, batch.feeds["attention_mask"].astype(bool))


@pytest.mark.parametrize(
    ("source", "said"), [("npz:0123456789ab", "read from the .npz"), ("bundled", "not real data")]
)
def test_the_note_says_what_the_states_were_fed(source: str, said: str) -> None:
    note = encoder_states_note(DECODER, source)
    assert "'encoder_hidden_states'" in note
    assert said in note
    assert encoder_states_note(DECODER[1:3], source) == ""


# -- key/value caches and positions ---------------------------------------------------------------


def test_a_cache_with_another_open_axis_cannot_be_sized() -> None:
    sized = GraphInput("past", np.dtype(np.float32), ("b", 2, "past", 8), past_axis=2)
    assert empty_cache(sized, 3).shape == (3, 2, 0, 8)
    unsized = GraphInput("past", np.dtype(np.float32), ("b", "heads", "past", 8), past_axis=2)
    with pytest.raises(FeedError, match="axis 1 is left open"):
        empty_cache(unsized, 2)


def test_a_packed_past_has_its_items_second() -> None:
    """onnxruntime's packed ``past`` (2, B, N, P, H): the items are its first open axis."""
    packed = GraphInput("past_0", np.dtype(np.float16), (2, "batch", 4, "past", 8), past_axis=3)
    cache = empty_cache(packed, 5)
    assert cache.shape == (2, 5, 4, 0, 8)
    assert cache.dtype == np.float16
    fixed = GraphInput("past", np.dtype(np.float32), (1, 2, "past", 8), past_axis=2)
    assert empty_cache(fixed, 3).shape == (3, 2, 0, 8)  # no open axis: the items are first


def test_missing_caches_are_added_empty_with_as_many_items_as_the_feeds() -> None:
    caches = [
        GraphInput(f"past.{i}", np.dtype(np.float32), ("b", 2, "past", 4), past_axis=2)
        for i in range(2)
    ]
    graph = (GraphInput("input_ids", INT64, ("b", "s")), *caches)
    given = np.zeros((3, 2, 0, 4), np.float32)
    feeds = with_empty_caches({"input_ids": np.ones((3, 5), np.int64), "past.0": given}, graph)
    assert feeds["past.0"] is given
    assert feeds["past.1"].shape == (3, 2, 0, 4)
    plain = {"input_ids": np.ones((3, 5), np.int64)}
    assert with_empty_caches(plain, graph[:1]) == plain


def test_the_cache_note_names_four_caches_and_counts_the_rest() -> None:
    names = [f"past.{i}" for i in range(6)]
    note = cache_note(names)
    assert note.startswith("audited at past length 0: the 6 KV cache input(s) 'past.0', ")
    assert "'past.3' and 2 more were fed empty" in note
    assert "'past.4'" not in note


def test_positions_count_the_real_tokens_from_zero() -> None:
    mask = np.array([[0, 1, 1, 0, 1], [1, 1, 1, 1, 1]])
    np.testing.assert_array_equal(positions(mask), [[0, 0, 1, 1, 2], [0, 1, 2, 3, 4]])
    assert positions(mask).dtype == np.int64


@pytest.mark.parametrize(
    ("spec", "takes"),
    [
        (GraphInput("position_ids", INT64, ("b", "s")), True),
        (GraphInput("cache_position", np.dtype(np.int32), ("s",)), True),
        (GraphInput("position_embeddings", FLOAT32, ("b", "s", 8)), False),
        (GraphInput("input_ids", INT64, ("b", "s")), False),
    ],
    ids=lambda value: getattr(value, "name", str(value)),
)
def test_integer_position_inputs_take_positions(spec: GraphInput, takes: bool) -> None:
    assert takes_positions(spec) is takes


# -- encoder inputs without token ids ----------------------------------------------------------------


def test_a_graph_without_token_ids_has_no_encoder_inputs() -> None:
    """An image encoder takes a float rank-3 input too, but no ids: it is no decoder."""
    image = (GraphInput("embeddings", FLOAT32, ("batch", "patches", D_MODEL)),)
    assert encoder_inputs(image) == EncoderInputs()
    assert token_mask_input(image) is None


def test_states_cannot_be_drawn_without_token_ids() -> None:
    with pytest.raises(FeedError, match="no token ids to seed them"):
        with_encoder_states({"decoder_ids": np.ones((1, 3), np.int64)}, DECODER)
