"""Language models as shipped for generation: key/value caches are inputs, fed empty, not structure.

optimum's ``text-generation-with-past`` exports (the corpus' ``with_past`` fixtures) concatenate
``past_key_values.*`` inputs with the new keys and values. Fed a cache of length 0 the graph is the
model without a cache: the matcher passes that ``Concat`` as the identity, the probe sizes the past
axis 0, every input source feeds the caches empty (and position ids counted over the tokens), and
the audit says so in a note. A merged decoder (the ``merged`` fixture: an ``If`` on
``use_cache_branch``) is read through its no-cache branch. (On hand-made graphs: what counts as a
cache input in graph/test_kv_cache.py, which ``If`` is inlined in graph/test_branches.py, the
feeds in inputs/test_decoder_feeds.py.)
"""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest

from oversmooth.cli import main
from oversmooth.importers.audit.pipeline import audit
from oversmooth.importers.errors import FeedError
from oversmooth.importers.graph import ShapeContext
from oversmooth.importers.graph.kv_cache import cache_inputs
from oversmooth.importers.inputs import sources
from oversmooth.importers.inputs.decoder_feeds import positions
from oversmooth.importers.inputs.feeds import Inputs, check_feeds, for_graph
from oversmooth.importers.match import find_attention_blocks
from oversmooth.simulator.errors import one_line
from tests.importers.family_corpus import MANIFEST, fixture_bytes, load_fixture

WITH_PAST = sorted(
    entry["file"] for entry in MANIFEST["fixtures"] if entry["variant"] == "with_past"
)
CACHES = [f"past_key_values.{layer}.{kind}" for layer in (0, 1) for kind in ("key", "value")]


def test_the_corpus_has_with_past_fixtures() -> None:
    assert {Path(file).parent.name for file in WITH_PAST} >= {"gpt2", "llama"}


@pytest.mark.parametrize("file", WITH_PAST)
def test_cache_inputs_are_found_by_structure(file: str) -> None:
    model = load_fixture(file)
    axes = {spec.name: spec.past_axis for spec in model.inputs}
    assert {name: axis for name, axis in axes.items() if axis is not None} == dict.fromkeys(
        CACHES, 2
    )
    cache_free = load_fixture(file.replace("with_past", "optimum"))
    assert cache_inputs(cache_free.index) == {}
    assert all(spec.past_axis is None for spec in cache_free.inputs)


@pytest.mark.parametrize("file", WITH_PAST)
def test_the_probe_sizes_the_past_empty_and_the_mask_past_plus_current(file: str) -> None:
    model = load_fixture(file)
    context = ShapeContext(model.index, batch=2, sequence=3)
    shape = context.shape("past_key_values.0.key")
    assert shape is not None
    assert shape[0] == 2
    assert shape[2] == 0
    assert context.shape("attention_mask") == (2, 3)  # past + current = current
    assert context.shape("input_ids") == (2, 3)


@pytest.mark.parametrize("file", WITH_PAST)
def test_every_block_notes_the_cache_it_reads_empty(file: str) -> None:
    report = find_attention_blocks(load_fixture(file))
    assert not report.failures
    for block in report.blocks:
        (note,) = [note for note in block.notes if "KV cache" in note]
        assert "past length 0" in note
        for kind in ("key", "value"):
            assert f"'past_key_values.{block.index}.{kind}'" in note
        assert "empty KV cache" in block.roles["K"]
        assert "empty KV cache" in block.roles["V"]


# -- feeds ------------------------------------------------------------------------------------------


def test_random_inputs_feed_empty_caches_positions_and_a_current_length_mask() -> None:
    graph = load_fixture("gpt2/with_past.onnx.xz").inputs
    feeds = sources.random_inputs(graph, batch=2, seq=5, vocab_size=100).feeds
    for name in CACHES:
        assert feeds[name].shape == (2, 4, 0, 8)
        assert feeds[name].dtype == np.float32
    assert feeds["attention_mask"].shape == (2, 5)
    assert np.all(feeds["attention_mask"] == 1)
    assert np.array_equal(feeds["position_ids"], np.tile(np.arange(5), (2, 1)))
    check_feeds(feeds, graph)


@pytest.mark.parametrize("variant", ["with_past", "optimum"])
def test_bundled_text_counts_positions_over_the_real_tokens(variant: str) -> None:
    """Position ids are counted from the mask, not taken from the token ids (whose name also
    holds "ids"); a cache-free export gets the same positions."""
    graph = load_fixture(f"llama/{variant}.onnx.xz").inputs
    inputs = sources.bundled_inputs("text", graph=graph)
    feeds, mask = inputs.feeds, inputs.feeds["attention_mask"]
    expected = np.maximum(np.cumsum(mask, axis=1) - 1, 0)
    assert np.array_equal(feeds["position_ids"], expected)
    assert np.array_equal(positions(np.array([[1, 1, 1, 0]])), [[0, 1, 2, 2]])
    caches = [spec for spec in graph if spec.past_axis is not None]
    assert len(caches) == (4 if variant == "with_past" else 0)
    for spec in caches:
        assert feeds[spec.name].shape == (len(mask), 2, 0, 8)


def test_an_npz_without_the_caches_gets_them_empty(tmp_path: Path) -> None:
    graph = load_fixture("gpt2/with_past.onnx.xz").inputs
    ids = np.arange(12, dtype=np.int64).reshape(2, 6)
    path = tmp_path / "feeds.npz"
    np.savez(path, input_ids=ids, attention_mask=np.ones_like(ids), position_ids=ids % 6)
    feeds = sources.from_npz(path, graph).feeds
    assert all(feeds[name].shape == (2, 4, 0, 8) for name in CACHES)
    assert np.array_equal(feeds["input_ids"], ids)


def test_a_cache_that_is_not_empty_is_refused_in_one_line() -> None:
    graph = load_fixture("gpt2/with_past.onnx.xz").inputs
    feeds = sources.random_inputs(graph, batch=1, seq=3).feeds
    feeds["past_key_values.1.value"] = np.zeros((1, 4, 2, 8), np.float32)
    with pytest.raises(FeedError) as caught:
        check_feeds(feeds, graph)
    message = one_line(caught.value)
    assert "'past_key_values.1.value' is a KV cache" in message
    assert "must be 0" in message


# -- a merged decoder ------------------------------------------------------------------------------


def test_a_merged_decoder_is_read_through_its_no_cache_branch() -> None:
    model = load_fixture("gpt2/merged.onnx.xz")
    (branch,) = model.branches
    assert (branch.switch, branch.branch, branch.caches) == (
        "use_cache_branch",
        "else",
        tuple(CACHES),
    )
    assert [spec.name for spec in model.inputs] == ["input_ids", "attention_mask", "position_ids"]
    assert not model.index.nodes_of_type("If")
    report = find_attention_blocks(model)
    assert len(report.blocks) == 2
    assert all(branch.note() in block.notes for block in report.blocks)


# -- the audit ---------------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("family", "variant"), [("gpt2", "with_past"), ("llama", "with_past"), ("gpt2", "merged")]
)
def test_the_audit_at_past_length_0_is_the_audit_of_the_model_without_a_cache(
    family: str, variant: str
) -> None:
    """The same token ids through the with-past (or merged) export and the cache-free
    (feature-extraction) export of the same model give the same layer metrics."""
    ids = np.random.default_rng(3).integers(3, 128, size=(3, 7), dtype=np.int64)
    canonical = Inputs(
        feeds={"input_ids": ids, "attention_mask": np.ones_like(ids)},
        token_mask=np.ones(ids.shape, dtype=bool),
        labels=("a", "b", "c"),
        source="test",
    )
    results = []
    for name in (variant, "optimum"):
        model = load_fixture(f"{family}/{name}.onnx.xz")
        results.append(audit(model, for_graph(canonical, model.inputs), provider="cpu"))
    cached, plain = results
    for metric, values in plain.metrics.items():
        np.testing.assert_allclose(cached.metrics[metric], values, rtol=1e-4, err_msg=metric)
    assert [note.kind for note in cached.notes].count("kv-cache") == 1
    assert "kv-cache" not in [note.kind for note in plain.notes]


def test_auditing_a_with_past_export_end_to_end(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    model = tmp_path / "gpt2-with-past.onnx"
    model.write_bytes(fixture_bytes("gpt2/with_past.onnx.xz"))
    out = tmp_path / "report"
    argv = ["audit", model, "--random", "2", "--vocab-size", "100", "--out", out, "--no-progress"]
    assert main([str(arg) for arg in argv]) == 0
    stdout = capsys.readouterr().out
    doc = json.loads((out / "audit.json").read_text(encoding="utf-8"))
    (note,) = [note for note in doc["notes"] if note.startswith("audited at past length 0")]
    assert all(f"'{name}'" in note for name in CACHES)
    assert "fed empty" in note
    assert note in (out / "report.md").read_text(encoding="utf-8")
    assert f"note: {note}" in stdout
    assert all("past length 0" in " ".join(block["notes"]) for block in doc["blocks"])
