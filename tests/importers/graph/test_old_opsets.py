"""Models of opsets 7 to 12: read through ONNX's version converter, run by onnxruntime as shipped.

The loader converts such a model to opset 13 for reading (:mod:`oversmooth.importers.graph.opsets`) and keeps
the model as read for onnxruntime (:meth:`OnnxModel.session_model`). Checked here (the converter
itself, exact on each op form that changed before 13, in test_opsets.py): builder models spelled
at older opsets (``tests/importers/old_opsets.py``; the converter cannot go down) are matched with
the same blocks and weights as at opset 13, and audited to the same numbers, by a session on the
old graph itself; a Softmax whose pre-13 axis is not the last is not taken for attention; weights
held in ``Constant`` nodes are read as projection weights; paddle2onnx's form loads at opset 11.
"""

from __future__ import annotations

import functools
from dataclasses import replace
from pathlib import Path

import numpy as np
import onnx
import onnxruntime as ort
import pytest
from onnx import TensorProto

from oversmooth.importers.audit.pipeline import audit
from oversmooth.importers.audit.session import audit_session, layer_tensors
from oversmooth.importers.graph import load_model, model_from_proto
from oversmooth.importers.match import find_attention_blocks
from oversmooth.importers.match.codes import RejectCode
from oversmooth.importers.runtime import runner as runner_module
from oversmooth.importers.weights import block_weights
from tests.importers.audited import builder_inputs
from tests.importers.builders import RECIPES, Assembly, assemble_recipe
from tests.importers.old_opsets import downgrade
from tests.importers.paddle_graph import paddle_ocr
from tests.importers.sessions import captured_sessions

SEED = 4
# -- builder models spelled at old opsets ------------------------------------------------------


#: (variant, opset): BERT down to opset 9 (GELU's Erf is 9), Llama without GQA down to 7 (Expand
#: is 8), GPT-2's fused QKV cut by a Split whose sizes are an attribute.
CASES = [
    ("bert_legacy", 12),
    ("bert_legacy", 11),
    ("bert_legacy", 9),
    ("gpt2_fused_qkv", 11),
    ("llama_rmsnorm_rope_gqa", 8),
    ("llama_rmsnorm_rope_gqa", 7),
]


@functools.cache
def _opset13(name: str, mha: bool) -> Assembly:
    recipe = replace(RECIPES[name], opset=13, fused_ln=False)
    return assemble_recipe(replace(recipe, n_kv_heads=None) if mha else recipe, SEED)


def _pair(name: str, opset: int, *, constants_as_nodes: bool = False):
    """The opset-13 builder model and its spelling at ``opset``, each loaded."""
    assembly = _opset13(name, mha=opset < 8)
    old = downgrade(assembly.built.model, opset, constants_as_nodes=constants_as_nodes)
    return assembly, model_from_proto(assembly.built.model), model_from_proto(old)


@pytest.mark.parametrize(("name", "opset"), CASES)
def test_an_old_spelling_runs_as_the_original(name: str, opset: int) -> None:
    """The test helper's own check: onnxruntime computes the same on both spellings."""
    assembly = _opset13(name, mha=opset < 8)
    old = downgrade(assembly.built.model, opset)
    assert old.opset_import[0].version == opset
    feeds = assembly.built.inputs
    runs = [
        ort.InferenceSession(m.SerializeToString()).run(None, feeds)
        for m in (assembly.built.model, old)
    ]
    np.testing.assert_array_equal(runs[0][0], runs[1][0])


@pytest.mark.parametrize(("name", "opset"), CASES)
def test_blocks_and_weights_are_those_of_the_opset_13_model(name: str, opset: int) -> None:
    _, new, old = _pair(name, opset, constants_as_nodes=opset == 11)
    assert (old.opset, old.source is not None, new.source) == (opset, True, None)
    found, expected = find_attention_blocks(old).blocks, find_attention_blocks(new).blocks
    assert len(found) == len(expected) == 2
    for block, twin in zip(found, expected, strict=True):
        assert block.to_dict() == twin.to_dict()  # heads, norm, scale, tensors the audit reads
        got, want = block_weights(old, block), block_weights(new, twin)
        for role in ("W_Q", "W_K", "W_V", "W_O", "b_Q", "b_O", "gamma"):
            np.testing.assert_array_equal(getattr(got, role), getattr(want, role), err_msg=role)


@pytest.mark.parametrize(("name", "opset"), [("bert_legacy", 11), ("llama_rmsnorm_rope_gqa", 7)])
def test_the_audit_runs_the_old_graph_and_measures_what_opset_13_does(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, name: str, opset: int
) -> None:
    """onnxruntime is given the old file's graph itself (its nodes first, then the audit's
    reductions spelled for its opset); every number equals the opset-13 model's audit, with a
    prefix token excluded (the reductions' oldest spellings)."""
    assembly = _opset13(name, mha=opset < 8)
    new, old = tmp_path / "new.onnx", tmp_path / "old.onnx"
    onnx.save(assembly.built.model, new)
    onnx.save(downgrade(assembly.built.model, opset), old)
    inputs = builder_inputs(assembly)
    expected = audit(new, inputs, provider="cpu", cache=False, exclude_prefix=1)
    captured = captured_sessions(monkeypatch)
    result = audit(old, inputs, provider="cpu", cache=False, exclude_prefix=1)
    # the graph the audit gives onnxruntime; a post-LN model's session is then opened once more
    # on the graph onnxruntime optimised from it (the sums before the norms, graph_edits)
    session_model, *reopened = captured
    assert len(reopened) <= 1
    assert session_model.opset_import[0].version == opset
    shipped = list(onnx.load(old).graph.node)
    assert list(session_model.graph.node)[: len(shipped)] == shipped
    for metric, values in expected.metrics.items():
        np.testing.assert_allclose(
            result.metrics[metric], values, rtol=1e-6, atol=1e-9, err_msg=metric
        )
    assert [(c.kind, c.block, c.head) for c in result.dominance] == [
        (c.kind, c.block, c.head) for c in expected.dominance
    ]


def test_the_audit_session_names_only_tensors_of_the_old_graph() -> None:
    assembly, _, old = _pair("bert_legacy", 11)
    blocks = find_attention_blocks(old).blocks
    session = audit_session(old, blocks, builder_inputs(assembly), provider="cpu")
    shipped = {name for node in old.source.graph.node for name in node.output}
    assert set(session.layers) == set(layer_tensors(blocks))
    assert set(session.layers) | set(session.attention) <= shipped


def test_a_softmax_over_more_than_the_last_axis_is_not_attention() -> None:
    """Before opset 13, ``axis=1`` on (B, H, T, T) scores normalises over H·T·T entries at once."""
    assembly = _opset13("bert_legacy", mha=False)
    old = downgrade(assembly.built.model, 11)
    first = next(node for node in old.graph.node if node.op_type == "Softmax")
    first.attribute[0].i = 1
    report = find_attention_blocks(model_from_proto(old))
    assert len(report.blocks) == 1  # the second block
    (failure,) = report.failures
    assert failure.code == RejectCode.SCORE_VIEW
    assert "Flatten" in failure.reason


@pytest.mark.parametrize("opset", [13, 11])
def test_weights_in_constant_nodes_are_read_as_projection_weights(opset: int) -> None:
    assembly = _opset13("bert_legacy", mha=False)
    model = model_from_proto(downgrade(assembly.built.model, opset, constants_as_nodes=True))
    assert not model.proto.graph.initializer
    for block, expected in zip(
        find_attention_blocks(model).blocks, assembly.built.blocks, strict=True
    ):
        weights = block_weights(model, block)
        for role in ("W_Q", "W_K", "W_V", "W_O", "b_Q", "gamma"):
            np.testing.assert_allclose(
                getattr(weights, role), getattr(expected, role), err_msg=role
            )


def test_an_old_model_with_external_data_is_read_and_run(tmp_path: Path) -> None:
    assembly = _opset13("bert_legacy", mha=False)
    path = tmp_path / "old.onnx"
    old = downgrade(assembly.built.model, 11)
    onnx.save(old, path, save_as_external_data=True, location="old.bin", size_threshold=0)
    model = load_model(path)
    assert model.source.graph.initializer[0].data_location == TensorProto.EXTERNAL
    (block, _) = find_attention_blocks(model).blocks
    np.testing.assert_allclose(block_weights(model, block).W_Q, assembly.built.blocks[0].W_Q)
    result = audit(model, builder_inputs(assembly), provider="cpu", cache=False)
    assert result.n_layers == 3


def test_paddle2onnx_form_at_opset_11_is_matched_and_run() -> None:
    """Weights in Constant nodes, a 0 in every Reshape target, the Softmax axis spelled 3."""
    built = paddle_ocr(opset=11)
    model = model_from_proto(built.model)
    (block,) = find_attention_blocks(model).blocks
    weights = block_weights(model, block)
    for role in "QKVO":
        np.testing.assert_array_equal(getattr(weights, f"W_{role}"), getattr(built, f"W_{role}"))
    runner = runner_module.Runner(model, expose=[block.attention_name], provider="cpu")
    (probs,) = runner.session.run(None, built.feed)
    assert probs.shape == (2, 2, 6, 6)
    np.testing.assert_allclose(probs.sum(axis=-1), 1.0, rtol=1e-5)


def test_a_transform_of_an_old_model_keeps_its_opset(tmp_path: Path) -> None:
    """``transform`` rewrites the weights of the model as shipped, not of its conversion."""
    from oversmooth.importers.transform import reparameterize

    source = tmp_path / "old.onnx"
    onnx.save(downgrade(_opset13("bert_legacy", mha=False).built.model, 11), source)
    written = onnx.load(reparameterize(source, "plus", tmp_path / "plus.onnx"))
    assert written.opset_import[0].version == 11
    assert len(find_attention_blocks(load_model(tmp_path / "plus.onnx")).blocks) == 2
