"""How items are cut into onnxruntime calls: fixed batch and sequence sizes, batch-mixing graphs.

A graph with a fixed batch size runs at that size (filler rows dropped) and gives the numbers of the
same graph with a symbolic batch; a fixed sequence length is met by masked padding; a graph whose
``DynamicQuantizeLinear`` takes its scale over the whole batch runs every input alone, so its
numbers do not depend on ``batch_size``; a graph that fixes batch 1 in a Reshape behind a symbolic
input batch runs one input per call once onnxruntime refuses a batch.
"""

from __future__ import annotations

import json
import re
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import onnx
import pytest
from numpy.testing import assert_allclose
from onnx import TensorProto, helper

from oversmooth.importers.audit.pipeline import audit
from oversmooth.importers.audit.records import AuditResult
from oversmooth.importers.errors import FeedError
from oversmooth.importers.graph import load_model, model_from_proto
from oversmooth.importers.inputs.feeds import Inputs, for_graph
from oversmooth.importers.inputs.sources import random_inputs
from oversmooth.importers.runtime.batching import batch_mixing_nodes, fixed_batch, items_per_call
from oversmooth.importers.runtime.runner import Runner
from oversmooth.simulator import tolerances as tol
from oversmooth.simulator.metrics import METRICS
from tests.importers.family_corpus import fixture_bytes
from tests.importers.head_split_blocks import batch_one_inside
from tests.importers.small_graph import SmallGraph
from tests.realmodels import require_real_model


@dataclass(frozen=True)
class Corpus:
    """Family fixtures as plain ``.onnx`` files (the corpus stores them xz-compressed)."""

    bert: Path
    bert_int8: Path
    vit: Path


@pytest.fixture(scope="module")
def corpus(tmp_path_factory: pytest.TempPathFactory) -> Corpus:
    folder = tmp_path_factory.mktemp("families")
    files = {"bert": "bert/legacy_eager", "bert_int8": "bert/int8", "vit": "vit/legacy_eager"}
    paths = {}
    for key, name in files.items():
        paths[key] = folder / f"{key}.onnx"
        paths[key].write_bytes(fixture_bytes(f"{name}.onnx.xz"))
    return Corpus(**paths)


VOCAB = 128  # the BERT fixture's vocabulary


def with_fixed_dims(source: Path, target: Path, **dims: int) -> Path:
    """``source`` saved to ``target`` with the named symbolic input dims fixed (e.g. batch=1)."""
    model = onnx.load(source)
    for value in model.graph.input:
        for dim in value.type.tensor_type.shape.dim:
            if dim.dim_param in dims:
                dim.dim_value = dims[dim.dim_param]
    onnx.save(model, target)
    return target


def text_inputs(lengths: list[int], seed: int = 0) -> Inputs:
    """Canonical text feeds: ids below the fixture's vocabulary, padded to the longest (mask 0)."""
    rng = np.random.default_rng(seed)
    width = max(lengths)
    mask = (np.arange(width) < np.asarray(lengths)[:, None]).astype(np.int64)
    ids = rng.integers(1, VOCAB, size=mask.shape) * mask
    return Inputs(
        feeds={"input_ids": ids, "attention_mask": mask, "token_type_ids": np.zeros_like(ids)},
        token_mask=mask.astype(bool),
        labels=[f"text-{i}" for i in range(len(lengths))],
        source="test",
    )


def cases_by_item(result: AuditResult) -> list:
    """Dominance cases in (input, block, head) order (each batch lists its cases layer first)."""
    return sorted(result.dominance, key=lambda case: (case.input, case.block, case.head))


def assert_same_numbers(result: AuditResult, expected: AuditResult, rtol: float, atol: float):
    for metric in METRICS:
        assert_allclose(
            result.metrics[metric], expected.metrics[metric], rtol=rtol, atol=atol, err_msg=metric
        )
    got, want = cases_by_item(result), cases_by_item(expected)
    assert [(c.input, c.block, c.head, c.kind) for c in got] == [
        (c.input, c.block, c.head, c.kind) for c in want
    ]
    assert_allclose([abs(c.mu) for c in got], [abs(c.mu) for c in want], rtol=rtol, atol=atol)


# -- a fixed batch size --------------------------------------------------------------------------


@pytest.mark.parametrize("fixed", [1, 4])
def test_a_fixed_batch_image_graph_runs_at_its_size(
    corpus: Corpus, tmp_path: Path, fixed: int
) -> None:
    model = load_model(with_fixed_dims(corpus.vit, tmp_path / "fixed.onnx", batch=fixed))
    assert fixed_batch(model.inputs) == fixed
    inputs = random_inputs(model.inputs, seed=2, batch=6)  # 6 = one full batch of 4 and a part
    result = audit(model, inputs, provider="cpu", batch_size=3)
    expected = audit(corpus.vit, inputs, provider="cpu", batch_size=3)
    assert result.inputs.n_inputs == 6
    assert any(f"fixes the batch size at {fixed}" in note.text for note in result.notes)
    assert_same_numbers(result, expected, tol.ORT_RTOL, tol.ORT_ATOL)


def test_the_runner_fills_a_fixed_batch_and_drops_the_filler(
    corpus: Corpus, tmp_path: Path
) -> None:
    path = with_fixed_dims(corpus.vit, tmp_path / "fixed.onnx", batch=4)
    feeds = random_inputs(load_model(path).inputs, seed=1, batch=5).feeds
    expose = [load_model(path).proto.graph.node[-1].output[0]]
    fixed = Runner(load_model(path), expose=expose, provider="cpu").collect(feeds, batch_size=2)
    free = Runner(load_model(corpus.vit), expose=expose, provider="cpu").collect(feeds)
    assert fixed[expose[0]].shape[0] == 5
    assert_allclose(fixed[expose[0]], free[expose[0]], rtol=tol.ORT_RTOL, atol=tol.ORT_ATOL)


# -- a fixed sequence length ---------------------------------------------------------------------


def test_a_fixed_sequence_length_is_met_by_masked_padding(corpus: Corpus, tmp_path: Path) -> None:
    path = with_fixed_dims(corpus.bert, tmp_path / "fixed.onnx", batch=1, sequence=16)
    model = load_model(path)
    text = text_inputs([5, 9, 7])
    padded = for_graph(text, model.inputs)
    assert padded.feeds["input_ids"].shape == (3, 16)
    assert padded.token_mask.sum(axis=1).tolist() == [5, 9, 7]
    assert not padded.feeds["attention_mask"][:, 9:].any()
    result = audit(model, padded, provider="cpu")
    expected = audit(corpus.bert, for_graph(text, load_model(corpus.bert).inputs), provider="cpu")
    assert_same_numbers(result, expected, tol.ORT_RTOL, tol.ORT_ATOL)
    assert [c.n_tokens for c in cases_by_item(result)] == [
        c.n_tokens for c in cases_by_item(expected)
    ]


def test_texts_longer_than_a_fixed_sequence_are_refused_in_one_line(
    corpus: Corpus, tmp_path: Path
) -> None:
    model = load_model(with_fixed_dims(corpus.bert, tmp_path / "fixed.onnx", sequence=8))
    with pytest.raises(FeedError, match="fixes the sequence at 8 tokens; got texts of 9") as info:
        for_graph(text_inputs([5, 9]), model.inputs)
    assert "\n" not in str(info.value)


def test_padding_beyond_the_real_tokens_is_cut_to_a_fixed_sequence(
    corpus: Corpus, tmp_path: Path
) -> None:
    model = load_model(with_fixed_dims(corpus.bert, tmp_path / "fixed.onnx", sequence=6))
    text = text_inputs([5, 6])
    wide = Inputs(
        feeds={name: np.pad(array, ((0, 0), (0, 4))) for name, array in text.feeds.items()},
        token_mask=np.pad(text.token_mask, ((0, 0), (0, 4))),
        labels=text.labels,
        source="test",
    )
    fitted = for_graph(wide, model.inputs)
    assert np.array_equal(fitted.feeds["input_ids"], text.feeds["input_ids"])


# -- batch-mixing nodes ------------------------------------------------------------------------


def _graph_with(op_type: str, constant_input: bool = False, **attrs: object):
    """x (batch, 4) -> op -> y, or the op applied to a weight and added to x."""
    g = SmallGraph()
    source = g.const(np.ones((3, 4))) if constant_input else "x"
    reduced = g.op(op_type, source, **attrs)
    out = g.op("Add", "x", reduced)
    graph = helper.make_graph(
        g.nodes,
        "g",
        [helper.make_tensor_value_info("x", TensorProto.FLOAT, ["batch", 4])],
        [helper.make_tensor_value_info(out, TensorProto.FLOAT, None)],
        initializer=g.inits,
    )
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])
    return model_from_proto(model)


@pytest.mark.parametrize(
    ("op_type", "attrs", "constant_input", "mixes"),
    [
        ("ReduceMean", {"axes": [0]}, False, True),
        ("ReduceMean", {}, False, True),
        ("ReduceMean", {"axes": [-1]}, False, False),
        ("ReduceMean", {"axes": [0]}, True, False),
        ("Softmax", {"axis": 0}, False, True),
        ("Softmax", {}, False, False),
        ("ArgMax", {}, False, True),
        ("Relu", {}, False, False),
    ],
)
def test_batch_mixing_nodes_are_found_by_structure(op_type, attrs, constant_input, mixes) -> None:
    model = _graph_with(op_type, constant_input, **attrs)
    assert bool(batch_mixing_nodes(model)) is mixes
    items, notes = items_per_call(model, 4)
    assert (items, bool(notes)) == ((1, True) if mixes else (4, False))


def test_a_dynamically_quantised_graph_gives_the_same_numbers_whatever_the_batch_size(
    corpus: Corpus,
) -> None:
    model = load_model(corpus.bert_int8)
    assert {node.op_type for node in batch_mixing_nodes(model)} == {"DynamicQuantizeLinear"}
    inputs = for_graph(text_inputs([5, 9, 7, 9, 3, 8], seed=4), model.inputs)
    results = [audit(model, inputs, provider="cpu", batch_size=size) for size in (1, 4, 6)]
    for result in results[1:]:
        for metric in METRICS:  # identical, not merely close: every input ran alone
            assert np.array_equal(
                result.metrics[metric], results[0].metrics[metric], equal_nan=True
            )
        assert cases_by_item(result) == cases_by_item(results[0])
    assert any("DynamicQuantizeLinear" in n.text and "alone" in n.text for n in results[1].notes)


def test_a_dynamically_quantised_graph_with_a_fixed_batch_fills_it_with_the_input_itself(
    corpus: Corpus,
    tmp_path: Path,
) -> None:
    path = with_fixed_dims(corpus.bert_int8, tmp_path / "fixed.onnx", batch=3)
    inputs = for_graph(text_inputs([5, 9, 7, 4], seed=6), load_model(path).inputs)
    result = audit(path, inputs, provider="cpu", batch_size=4)
    alone = audit(corpus.bert_int8, inputs, provider="cpu", batch_size=1)
    assert any("filled to the graph's fixed batch of 3" in note.text for note in result.notes)
    assert_same_numbers(result, alone, tol.ORT_RTOL, tol.ORT_ATOL)


@pytest.mark.realmodel
def test_the_zoo_models_mix_no_items_and_keep_their_batch_size() -> None:
    for name in ("dinov2-vits14", "minilm-l3", "minilm-l6-int8"):
        model = load_model(require_real_model(name))
        assert batch_mixing_nodes(model) == [], name
        assert items_per_call(model, 4) == (4, []), name


@pytest.mark.realmodel
@pytest.mark.parametrize("quantise", [False, True], ids=["minilm-l6-int8", "minilm-l3-dynamic"])
def test_minilm_int8_numbers_do_not_depend_on_the_batch_size(tmp_path: Path, quantise: bool):
    """minilm-l6-int8 is weight-only int8 (no run-time quantisation); onnxruntime's
    ``quantize_dynamic`` of minilm-l3 has ``DynamicQuantizeLinear`` (measured before the fix: 9e-3
    cosine and 2.5e-2 HFC/LFC between batch 1 and 4)."""
    from onnxruntime.quantization import QuantType, quantize_dynamic

    from oversmooth.importers.inputs.sources import bundled_inputs

    path = require_real_model("minilm-l3" if quantise else "minilm-l6-int8")
    if quantise:
        quantize_dynamic(path, tmp_path / "q.onnx", weight_type=QuantType.QInt8)
        path = tmp_path / "q.onnx"
    model = load_model(path)
    inputs = bundled_inputs("text", graph=model.inputs)
    results = [
        audit(model, inputs, provider="cpu", batch_size=size, dominance="none")
        for size in (1, 4, 12)
    ]
    for result in results[1:]:
        for metric in METRICS:
            assert np.array_equal(
                result.metrics[metric], results[0].metrics[metric], equal_nan=True
            )


# -- a batch fixed inside the graph ----------------------------------------------------------------

D_FIXED, TOKENS_FIXED = 8, 6  # batch_one_inside()'s features and tokens


def test_a_batch_fixed_inside_the_graph_runs_one_input_per_call() -> None:
    """onnxruntime refuses 3 inputs at once; the runner runs them one per call (the outputs of
    single calls, exactly), and from then on every call of several inputs (note: the node)."""
    model = model_from_proto(batch_one_inside())
    assert fixed_batch(model.inputs) is None
    x = np.random.default_rng(0).standard_normal((5, TOKENS_FIXED, D_FIXED)).astype(np.float32)
    out = model.proto.graph.output[0].name
    runner = Runner(model, expose=[out], provider="cpu", threads=1)
    batches = list(runner.run({"x": x}, batch_size=3))
    note = runner.one_per_call.note
    assert re.search(r"batch at 1 inside the graph \(Reshape 'node_view(_\d+)?' refused 3 ", note)
    assert runner.provenance()["one_input_per_call"] == note
    alone = Runner(model, expose=[out], provider="cpu", threads=1).collect({"x": x}, batch_size=1)
    assert [len(batch[out]) for batch in batches] == [3, 2]
    assert np.array_equal(np.concatenate([batch[out] for batch in batches]), alone[out])


def test_the_audit_of_a_batch_fixed_inside_equals_a_batch_size_1_audit(
    tmp_path: Path, capsys
) -> None:
    """``oversmooth audit`` at the default batch size writes the layers.csv of ``--batch-size 1``,
    byte for byte (and its dominance cases), and says in report.md and audit.json why it ran one
    input per call."""
    from oversmooth.cli import main

    path = tmp_path / "view.onnx"
    onnx.save(batch_one_inside(), path)
    argv = ["audit", str(path), "--random", "5", "--no-progress", "--out"]
    assert main([*argv, str(tmp_path / "batched")]) == 0
    assert main([*argv, str(tmp_path / "alone"), "--batch-size", "1"]) == 0
    capsys.readouterr()
    layers = [(tmp_path / folder / "layers.csv").read_bytes() for folder in ("batched", "alone")]
    assert layers[0] == layers[1]
    cases = [  # a batch lists its cases layer first: the same rows, in another order
        sorted((tmp_path / folder / "dominance.csv").read_text(encoding="utf-8").splitlines())
        for folder in ("batched", "alone")
    ]
    assert cases[0] == cases[1]
    doc = json.loads((tmp_path / "batched" / "audit.json").read_text(encoding="utf-8"))
    note = doc["provenance"]["runner"]["one_input_per_call"]
    assert re.match(r"the model fixes the batch at 1 inside the graph \(Reshape 'node_view", note)
    assert "refused 4 inputs at once" in note
    assert note.endswith("ran one input per call")
    assert note in doc["notes"]
    assert f"- note: {note}" in (tmp_path / "batched" / "report.md").read_text(encoding="utf-8")
    alone = json.loads((tmp_path / "alone" / "audit.json").read_text(encoding="utf-8"))
    assert alone["provenance"]["runner"]["one_input_per_call"] is None


# -- the command line ----------------------------------------------------------------------------


def test_the_audit_command_runs_a_fixed_batch_graph_on_npz_shards(
    corpus: Corpus, tmp_path: Path, capsys
) -> None:
    """``--batch-size 2`` on a graph fixed at batch 1, inputs from a folder of two .npz shards."""
    from oversmooth.cli import main

    path = with_fixed_dims(corpus.vit, tmp_path / "fixed.onnx", batch=1)
    feeds = random_inputs(load_model(path).inputs, seed=0, batch=3).feeds["pixel_values"]
    shards = tmp_path / "shards"
    shards.mkdir()
    np.savez(shards / "a.npz", pixel_values=feeds[:2])
    np.savez_compressed(shards / "b.npz", pixel_values=feeds[2:])
    out = tmp_path / "report"
    argv = ["audit", str(path), "--inputs", str(shards), "--batch-size", "2", "--out", str(out)]
    code = main([*argv, "--no-progress"])
    stdout = capsys.readouterr().out
    assert code == 0
    assert "3 inputs from npz:" in stdout
    assert "fixes the batch size at 1" in stdout
    assert "fixes the batch size at 1" in (out / "report.md").read_text(encoding="utf-8")
