"""oversmooth.importers.runtime.graph_edits: tensors read from the graph onnxruntime optimised.

A post-LN block's residual sum is fused with its norm into ``SkipLayerNormalization``; reading it
there (the node's optional sum output) must leave every other output bitwise as it was, and give
the sum itself: the norm of it is the norm's output, and on builder models it is the NumPy sum.
"""

from __future__ import annotations

import numpy as np
import onnx
import pytest
from numpy.testing import assert_allclose
from onnx import helper

from oversmooth.importers.match import find_attention_blocks
from oversmooth.importers.runtime.graph_edits import (
    LateOutputs,
    drop_outputs,
    expose_late,
    optimised_product_of_itself,
)
from oversmooth.importers.runtime.reductions import GraphExtension
from oversmooth.importers.runtime.runner import Runner
from oversmooth.simulator.metrics import cosine
from tests.importers.audited import assembly_of, builder_model_and_inputs, real_tokens
from tests.importers.reference import forward_trace

#: Post-LN builder variants: the sum and the norm as separate nodes (LayerNormalization, or a
#: decomposed one onnxruntime fuses first).
POST_LN = ("bert_legacy", "bert_decomposed_ln", "where_mask")


def _graph(nodes: list[onnx.NodeProto]) -> onnx.GraphProto:
    return helper.make_graph(nodes, "g", [], [])


def _skip_norm(*outputs: str) -> onnx.NodeProto:
    return helper.make_node(
        "SkipLayerNormalization", ["x", "b", "g", "beta"], list(outputs), domain="com.microsoft"
    )


def test_a_fused_sum_is_the_skip_norms_optional_output_under_its_own_name() -> None:
    graph = _graph([_skip_norm("y")])
    assert expose_late(graph, {"sum": "y"}) == ["sum"]
    assert list(graph.node[0].output) == ["y", "", "", "sum"]


def test_a_sum_that_survived_is_read_as_it_is_and_a_missing_one_is_none() -> None:
    graph = _graph([helper.make_node("Add", ["x", "b"], ["sum"]), _skip_norm("z")])
    assert expose_late(graph, {"sum": "y", "gone": "nowhere"}) == ["sum", None]
    assert list(graph.node[1].output) == ["z"]  # untouched


def test_a_sum_output_onnxruntime_already_named_is_read_under_that_name() -> None:
    graph = _graph([_skip_norm("y", "", "", "kept")])
    assert expose_late(graph, {"sum": "y"}) == ["kept"]


def test_a_norm_outside_the_contrib_domain_is_no_fused_sum() -> None:
    node = helper.make_node("SkipLayerNormalization", ["x", "b", "g"], ["y"], domain="other")
    assert expose_late(_graph([node]), {"sum": "y"}) == [None]


def _chain_graph(extra: tuple[onnx.NodeProto, ...] = ()) -> onnx.GraphProto:
    """x → a → {b → kept, c → gone}, and d → gone2 from a: dropping gone and gone2 leaves
    a (shared with kept) and b."""
    nodes = [
        helper.make_node("Relu", ["x"], ["a"]),
        helper.make_node("Neg", ["a"], ["b"]),
        helper.make_node("Abs", ["b"], ["kept"]),
        helper.make_node("Exp", ["a"], ["c"]),
        helper.make_node("Abs", ["c"], ["gone"]),
        helper.make_node("Sqrt", ["a"], ["gone2"]),
        *extra,
    ]
    value = onnx.TensorProto.FLOAT
    return helper.make_graph(
        nodes,
        "g",
        [helper.make_tensor_value_info("x", value, [2])],
        [helper.make_tensor_value_info(name, value, [2]) for name in ("kept", "gone", "gone2")],
    )


def test_dropping_outputs_removes_the_nodes_only_they_needed() -> None:
    graph = _chain_graph()
    assert drop_outputs(graph, ["gone", "gone2"]) == 3
    assert [value.name for value in graph.output] == ["kept"]
    assert [node.output[0] for node in graph.node] == ["a", "b", "kept"]
    assert drop_outputs(graph, []) == 0


def test_a_graph_with_a_subgraph_keeps_its_nodes_when_outputs_are_dropped() -> None:
    """An If's branches read outer tensors without listing them: no node is removed then."""
    branch = helper.make_graph(
        [helper.make_node("Identity", ["c"], ["out"])],
        "branch",
        [],
        [helper.make_tensor_value_info("out", onnx.TensorProto.FLOAT, [2])],
    )
    condition = helper.make_node("Constant", [], ["cond"], value_int=1)
    branching = helper.make_node("If", ["cond"], ["chosen"], then_branch=branch, else_branch=branch)
    graph = _chain_graph((condition, branching))
    nodes = len(graph.node)
    assert drop_outputs(graph, ["gone"]) == 0
    assert [value.name for value in graph.output] == ["kept", "gone2"]
    assert len(graph.node) == nodes


def _identity_reads(found: list[str | None], optimised: onnx.GraphProto) -> GraphExtension:
    """Each late tensor copied out as it is (``late.<k>``), float32 (B, T, D)."""
    names = [name for name in found if name is not None]
    return GraphExtension(
        nodes=tuple(
            helper.make_node("Identity", [name], [f"late.{k}"]) for k, name in enumerate(names)
        ),
        outputs=tuple(
            helper.make_tensor_value_info(f"late.{k}", onnx.TensorProto.FLOAT, None)
            for k in range(len(names))
        ),
    )


@pytest.mark.parametrize("name", POST_LN)
def test_reading_the_sum_late_changes_no_other_output_and_gives_the_sum(name: str) -> None:
    model, inputs = builder_model_and_inputs(name)
    blocks = find_attention_blocks(model).blocks
    norms = [str(block.norm_output_name) for block in blocks]
    plain = Runner(model, expose=norms, provider="cpu", threads=1)
    late = Runner(
        model,
        expose=norms,
        provider="cpu",
        threads=1,
        late=LateOutputs(
            {str(b.residual_name): str(b.norm_output_name) for b in blocks}, _identity_reads
        ),
    )
    assert late.late_outputs == [f"late.{k}" for k in range(len(blocks))]
    before = plain.collect(inputs.feeds)
    after = late.collect(inputs.feeds)
    for tensor in norms:
        np.testing.assert_array_equal(after[tensor], before[tensor])
    assembly = assembly_of(name)
    keep = real_tokens(assembly)
    for k, expected in enumerate(forward_trace(assembly).attention_sum):
        got = np.asarray(after[f"late.{k}"], np.float64)
        scale = np.abs(expected[keep]).max()
        assert_allclose(got[keep], expected[keep], atol=1e-5 * scale)


def test_the_builders_exercise_the_fused_path(tmp_path) -> None:
    """onnxruntime fuses the builders' post-LN sum and norm, so the test above reads the sum
    through the fused node's optional output (not through a surviving Add)."""
    import onnxruntime as ort

    fused = 0
    for name in POST_LN:
        model, _ = builder_model_and_inputs(name)
        options = ort.SessionOptions()
        options.optimized_model_filepath = str(tmp_path / f"{name}.onnx")
        ort.InferenceSession(
            model.session_model().SerializeToString(), options, providers=["CPUExecutionProvider"]
        )
        optimised = onnx.load(options.optimized_model_filepath)
        sums = {str(block.residual_name) for block in find_attention_blocks(model).blocks}
        produced = {output for node in optimised.graph.node for output in node.output}
        fused += bool(sums - produced)
    assert fused >= 1


def test_a_model_with_external_data_keeps_the_norm_output_and_says_so(tmp_path) -> None:
    """The late read needs the optimised graph in memory; a model whose weights live in a side
    file is run as it is: its post-LN sublayers are measured after the norm, and a note says so."""
    from oversmooth.importers.audit.pipeline import audit
    from oversmooth.importers.graph import load_model

    model, inputs = builder_model_and_inputs("bert_legacy")
    path = tmp_path / "bert_legacy.onnx"
    proto = onnx.ModelProto()  # onnx.save moves the weights out of the proto it is given: a copy,
    proto.CopyFrom(model.session_model())  # so the cached builder model stays whole for others
    onnx.save(
        proto,
        path,
        save_as_external_data=True,
        all_tensors_to_one_file=True,
        location="bert_legacy.data",
        size_threshold=0,
    )
    result = audit(load_model(path), inputs, provider="cpu")
    assert any("measured after the norm" in str(note) for note in result.notes)
    assembly = assembly_of("bert_legacy")
    keep = real_tokens(assembly)
    after_norm = forward_trace(assembly).after_attention[0]
    measured = result.attention_part["cosine"][:, 0]
    for item, value in enumerate(measured):
        assert value == pytest.approx(cosine(after_norm[item][keep[item]]), rel=1e-4, abs=1e-6)


def test_the_optimisers_product_of_one_tensor_with_itself_is_found_by_its_output() -> None:
    """The first of the outputs that the graph produces decides: a node reading one tensor twice
    is returned, a product of two tensors (a Transpose kept apart) is not, nor is a graph that
    produces none of them."""
    fused = helper.make_node("FusedMatMul", ["x", "x"], ["g.1"], domain="com.microsoft", transB=1)
    plain = helper.make_node("MatMul", ["x", "xt"], ["g.0"])
    graph = helper.make_graph([plain, fused], "g", [], [])
    assert optimised_product_of_itself(graph, ["g.1"]) == fused
    assert optimised_product_of_itself(graph, ["g.0", "g.1"]) is None
    assert optimised_product_of_itself(graph, ["absent", "g.1"]) == fused
    assert optimised_product_of_itself(graph, ["absent"]) is None
