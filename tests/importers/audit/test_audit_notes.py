"""The notes an audit states before it measures (importers.audit.audit_notes): one typed note per
thing the model lacks or departs from, and per thing its inputs are, on graphs that have each one
(builder models, the stream tests' graphs, the family corpus)."""

from __future__ import annotations

import dataclasses

import numpy as np
import pytest

from oversmooth.importers.audit.audit_notes import RANDOM_INPUTS, input_notes, model_notes
from oversmooth.importers.graph import OnnxModel, model_from_proto
from oversmooth.importers.inputs.feeds import Inputs
from oversmooth.importers.match import find_attention_blocks
from oversmooth.simulator.statistics import SPECTRAL_METRICS
from tests.importers.builders import assemble, assemble_near_miss
from tests.importers.family_corpus import load_fixture
from tests.importers.head_split_blocks import windowed_decoder
from tests.importers.stream_graphs import build

SEED = 3


def notes_of(model: OnnxModel) -> list[tuple[str, str]]:
    """``(kind, text)`` of every model note of ``model``."""
    return [(note.kind, note.text) for note in model_notes(find_attention_blocks(model), model)]


def zero_inputs(model: OnnxModel, *, source: str, random: bool) -> Inputs:
    """One item of zeros per graph input (their values are never read by the notes)."""
    feeds = {spec.name: np.zeros((1, 2)) for spec in model.inputs}
    return Inputs(labels=["item-0"], source=source, feeds=feeds, random=random)


# -- the model ------------------------------------------------------------------------------------


def test_a_fully_matched_plain_model_has_no_notes() -> None:
    assert notes_of(model_from_proto(assemble("bert_legacy", SEED).built.model)) == []


@pytest.mark.parametrize(
    ("model", "kind", "starts"),
    [
        (
            lambda: model_from_proto(assemble_near_miss("softmax_axis", SEED).built.model),
            "partial",
            "PARTIAL: 1 of 2 attention blocks not matched",
        ),
        (
            lambda: model_from_proto(windowed_decoder()),
            "skipped",
            "SKIPPED by design: 1 of 3 attention blocks are outside the theory",
        ),
        (
            lambda: load_fixture("gpt2/with_past.onnx.xz"),
            "kv-cache",
            "audited at past length 0: the 4 KV cache input(s) 'past_key_values.0.key'",
        ),
        (
            lambda: load_fixture("gpt2/merged.onnx.xz"),
            "kv-cache",
            "merged decoder read through the no-cache branch",
        ),
        (
            lambda: build("moe")[0],
            "not-attention",
            "2 Softmax node(s) are not token attention and are neither audited nor counted as declined",
        ),
    ],
    ids=["partial", "skipped", "kv-cache-inputs", "kv-cache-branch", "not-attention"],
)
def test_each_departure_of_the_model_is_one_note_of_its_kind(model, kind: str, starts: str) -> None:
    ((found_kind, text),) = notes_of(model())
    assert found_kind == kind
    assert text.startswith(starts)
    assert "\n" not in text


def test_the_not_attention_note_names_three_softmaxes_and_counts_the_rest() -> None:
    model = build("moe")[0]
    report = find_attention_blocks(model)
    routers = [failure for failure in report.failures if failure.not_attention]
    assert len(routers) == 2
    many = dataclasses.replace(report, failures=[*report.failures, *routers, *routers])
    ((_, text),) = [(note.kind, note.text) for note in model_notes(many, model)]
    assert text.startswith("6 Softmax node(s) are not token attention")
    assert text.count("'Softmax#") == 3  # three named
    assert text.endswith(" and 3 more)")


# -- the inputs -----------------------------------------------------------------------------------


def test_real_inputs_to_an_encoder_with_every_metric_have_no_notes() -> None:
    model = model_from_proto(assemble("bert_legacy", SEED).built.model)
    assert (
        input_notes(model, zero_inputs(model, source="bundled-text", random=False), spectral=True)
        == []
    )


def test_random_inputs_and_skipped_metrics_are_noted_in_that_order() -> None:
    model = model_from_proto(assemble("bert_legacy", SEED).built.model)
    notes = input_notes(model, zero_inputs(model, source="random", random=True), spectral=False)
    assert [note.kind for note in notes] == ["random", "not-computed"]
    assert notes[0].text == RANDOM_INPUTS
    assert notes[1].text == f"not computed (spectral=False): {', '.join(SPECTRAL_METRICS)}"


@pytest.mark.parametrize(
    ("source", "ends"),
    [
        ("random", "the layers hold the cross-attention's mix of that noise"),
        ("npz:0123", "read from the .npz"),
    ],
)
def test_a_decoders_encoder_states_are_noted_first(source: str, ends: str) -> None:
    model = load_fixture("whisper_decoder/dynamo_eager.onnx.xz")
    notes = input_notes(
        model, zero_inputs(model, source=source, random=source == "random"), spectral=True
    )
    assert notes[0].kind == "encoder-states"
    assert notes[0].text.startswith("the graph takes the encoder states 'encoder_hidden_states'")
    assert notes[0].text.endswith(ends)
    assert [note.kind for note in notes[1:]] == (["random"] if source == "random" else [])
