"""onnxruntime-genai's model-builder decoders (the corpus' ``genai_fp32`` and ``genai_int4``
fixtures of Llama, Qwen2, Mistral and Phi-3): ``GroupQueryAttention`` defused with its KV cache
fed empty, every layer measurable (the last residual exists only inside a fused skip norm whose
residual output the builder leaves out), the audit noting that it ran without a cache.

The family test (``test_families.py``) checks their heads, weights and layers against the truth;
here the int4 layers are checked exactly too, and the audit end to end.
"""

from __future__ import annotations

import numpy as np
import pytest

from oversmooth.importers.audit.pipeline import audit
from oversmooth.importers.audit.session import layer_tensors
from oversmooth.importers.graph import OnnxModel, model_from_proto
from oversmooth.importers.inputs.feeds import Inputs, for_graph
from oversmooth.importers.inputs.sources import default_inputs
from oversmooth.importers.match import find_attention_blocks
from oversmooth.importers.runtime.runner import Runner
from oversmooth.importers.weights import block_weights
from oversmooth.simulator.metrics import all_metrics
from tests.importers.family_corpus import FIXTURES, MANIFEST, fixture_proto, load_fixture

GENAI = sorted(
    (entry["file"], entry["truth"])
    for entry in MANIFEST["fixtures"]
    if entry["variant"].startswith("genai_")
)
CACHES = [f"past_key_values.{layer}.{kind}" for layer in (0, 1) for kind in ("key", "value")]
#: Layers of the int4 graphs with their ``MatMulNBits`` kept in float (no int8 activations).
EXACT_LAYER_RTOL = 1e-6


def _truth(name: str) -> dict[str, np.ndarray]:
    with np.load(FIXTURES / name) as data:
        return {key: data[key] for key in data.files}


def _relative(found: np.ndarray, truth: np.ndarray) -> float:
    return float(np.linalg.norm(found - truth) / np.linalg.norm(truth))


def _layers(model: OnnxModel, truth: dict[str, np.ndarray]) -> list[np.ndarray]:
    blocks = [block_weights(model, block) for block in find_attention_blocks(model).blocks]
    names = layer_tensors(blocks)
    feeds = {spec.name: truth[f"feed_{spec.name}"] for spec in model.inputs}
    outputs = Runner(model, expose=names, provider="cpu", threads=1).collect(feeds)
    return [outputs[name] for name in names]


def test_the_corpus_has_the_four_builder_families_in_both_precisions() -> None:
    made = {file.split("/")[0] + "-" + file.split("/")[1].split(".")[0] for file, _ in GENAI}
    assert made == {
        f"{family}-genai_{precision}"
        for family in ("llama", "qwen2", "mistral", "phi3")
        for precision in ("fp32", "int4")
    }


@pytest.mark.parametrize(("file", "truth"), GENAI)
def test_every_attention_is_defused_and_reads_its_cache_empty(file: str, truth: str) -> None:
    model = load_fixture(file)
    assert len(model.defused) == 2
    assert not model.declined
    assert {spec.name: spec.past_axis for spec in model.inputs if spec.past_axis is not None} == (
        dict.fromkeys(CACHES, 2)
    )
    report = find_attention_blocks(model)
    assert len(report.blocks) == 2
    for block in report.blocks:
        assert block.stream_error is None
        assert any("past length 0" in note for note in block.notes)
        assert block.defused_from is not None
        assert "GroupQueryAttention" in block.defused_from


@pytest.mark.parametrize(
    ("file", "truth"), [pair for pair in GENAI if "int4" in pair[0]], ids=lambda item: item
)
def test_int4_layers_are_exact_where_the_kernel_keeps_activations_in_float(
    file: str, truth: str
) -> None:
    """The builder's CPU int4 graphs round each ``MatMulNBits`` input to int8 at run time
    (``accuracy_level`` 4: layers within 1e-2 of the dequantised truth, the family test's
    quantised tolerance); with that level set to 0 the same graph, read the same way, is the
    dequantised model exactly: the layers read are the residual stream."""
    proto = fixture_proto(file)
    levels = [
        attribute
        for node in proto.graph.node
        if node.op_type == "MatMulNBits"
        for attribute in node.attribute
        if attribute.name == "accuracy_level"
    ]
    assert levels
    assert {attribute.i for attribute in levels} == {4}
    for attribute in levels:
        attribute.i = 0
    expected = _truth(truth)
    found = _layers(model_from_proto(proto), expected)
    for layer, value in enumerate(found):
        error = _relative(value.astype(np.float64), expected["hidden"][layer].astype(np.float64))
        assert error < EXACT_LAYER_RTOL, (layer, error)


def test_the_last_residual_is_exposed_from_the_final_skip_norm() -> None:
    """The builder's last ``SkipSimplifiedLayerNormalization`` (the final norm) emits only its
    normalised output; the audit's last layer is its residual sum, named at load."""
    original = fixture_proto("llama/genai_fp32.onnx.xz")
    final = [n for n in original.graph.node if n.op_type == "SkipSimplifiedLayerNormalization"][-1]
    assert len(final.output) == 1
    model = load_fixture("llama/genai_fp32.onnx.xz")
    blocks = [block_weights(model, block) for block in find_attention_blocks(model).blocks]
    last = layer_tensors(blocks)[-1]
    (node,) = [n for n in model.index.nodes if last in n.outputs]
    assert node.op_type == "SkipSimplifiedLayerNormalization"
    assert node.outputs.index(last) == 3


@pytest.mark.parametrize("family", ["llama", "phi3"])
def test_the_audit_measures_the_true_stream_and_says_it_ran_without_a_cache(family: str) -> None:
    """The audit of the truth's token ids (caches and all other feeds made by the audit itself)
    gives the metrics of the true hidden states, and one ``kv-cache`` note."""
    model = load_fixture(f"{family}/genai_fp32.onnx.xz")
    truth = _truth(f"{family}/truth_genai.npz")
    ids = truth["feed_input_ids"]
    inputs = Inputs(
        feeds={"input_ids": ids, "attention_mask": np.ones_like(ids)},
        token_mask=np.ones(ids.shape, dtype=bool),
        labels=tuple(f"item-{i}" for i in range(len(ids))),
        source="test",
    )
    result = audit(model, for_graph(inputs, model.inputs), provider="cpu", cache=False)
    expected = all_metrics(truth["hidden"].astype(np.float64))  # (layers, items) each
    for metric in ("hfc_lfc", "cosine", "sigma_ratio"):
        np.testing.assert_allclose(
            result.metrics[metric], expected[metric].T, rtol=1e-4, err_msg=metric
        )
    (note,) = [note for note in result.notes if note.kind == "kv-cache"]
    assert all(f"'{name}'" in note.text for name in CACHES)


def test_a_padded_item_is_audited_as_it_is_alone() -> None:
    """``seqlens_k`` comes from the attention mask: an item padded on the right in a batch gives
    the metrics it gives alone (padding never enters a metric nor a real token's attention)."""
    model = load_fixture("mistral/genai_fp32.onnx.xz")
    ids = np.random.default_rng(5).integers(3, 128, size=(2, 7), dtype=np.int64)
    mask = np.ones_like(ids)
    mask[1, 5:] = 0

    def run(feeds: dict[str, np.ndarray], token_mask: np.ndarray) -> dict[str, np.ndarray]:
        inputs = Inputs(
            feeds=feeds,
            token_mask=token_mask.astype(bool),
            labels=tuple(f"item-{i}" for i in range(len(token_mask))),
            source="test",
        )
        result = audit(model, for_graph(inputs, model.inputs), provider="cpu", cache=False)
        return result.metrics

    batched = run({"input_ids": ids, "attention_mask": mask}, mask)
    alone_ids = ids[1:, :5]
    alone = run({"input_ids": alone_ids, "attention_mask": np.ones_like(alone_ids)}, mask[1:, :5])
    for metric in ("hfc_lfc", "cosine", "sigma_ratio"):
        np.testing.assert_allclose(batched[metric][1:], alone[metric], rtol=1e-4, err_msg=metric)


@pytest.mark.parametrize("file", ["llama/genai_fp32.onnx.xz", "llama/with_past.onnx.xz"])
def test_a_decoder_with_cache_inputs_gets_the_bundled_sentences_by_default(file: str) -> None:
    """Its 4-axis float cache inputs are fed empty, not taken for an image input."""
    inputs = default_inputs(load_fixture(file).inputs)
    assert inputs.source == "bundled-text"
