"""The standard-ONNX pieces a fused attention operator is rewritten into
(:mod:`oversmooth.importers.graph.defuse_parts`), each emitted alone and run by onnxruntime against
a NumPy computation of what it stands for: causal biases (upper-left and bottom-right), the four
key-mask forms, head repetition, the split/merge of heads, the capped attention; the checks every
rewrite makes of its node; the graph with nodes replaced and what it drops; the element types read.

Whole fused operators against onnxruntime's own kernels are ``test_defuse``.
"""

from __future__ import annotations

import math

import numpy as np
import onnx
import pytest
from onnx import TensorProto, helper, numpy_helper

from oversmooth.importers.graph.defuse_parts import (
    DeclinedError,
    Emitter,
    Facts,
    attention_scale,
    num_heads,
    refuse_inputs,
    refuse_outputs,
    with_replaced_nodes,
)
from oversmooth.importers.graph.index import GraphIndex
from oversmooth.simulator import tolerances as tol
from tests.importers.sessions import run_unoptimised

D = TensorProto.DOUBLE
I64 = TensorProto.INT64
#: The bias a masked score gets in these tests (any finite value the float type holds).
MASKED = -1e4


def _run(emitter: Emitter, output: str, feeds: dict[str, np.ndarray]) -> np.ndarray:
    """The emitter's nodes as a graph of ``feeds`` (their dtypes and shapes), its ``output`` run."""
    inputs = [
        helper.make_tensor_value_info(
            name, helper.np_dtype_to_tensor_dtype(value.dtype), list(value.shape)
        )
        for name, value in feeds.items()
    ]
    graph = helper.make_graph(
        emitter.nodes,
        "emitted",
        inputs,
        [onnx.ValueInfoProto(name=output)],
        emitter.initializers,
    )
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)], ir_version=10)
    (found,) = run_unoptimised(model, feeds)
    return found


@pytest.mark.parametrize(("queries", "keys"), [(4, 4), (2, 5)])
def test_the_causal_bias_masks_later_keys_upper_left_or_bottom_right(queries, keys) -> None:
    """Query i sees key j iff j <= i (upper left) or j <= i + T - S (bottom right: the query after
    a past of T - S keys); equal lengths make the two the same mask."""
    feeds = {"q": np.zeros((1, queries, 2)), "k": np.zeros((1, keys, 2))}
    i, j = np.arange(queries)[:, None], np.arange(keys)[None, :]
    for bottom_right, later in ((False, j > i), (True, j > i + keys - queries)):
        emitter = Emitter("attn", np.float64)
        out = emitter.causal_bias(("q", 1), ("k", 1), MASKED, bottom_right=bottom_right)
        found = _run(emitter, out, feeds)
        np.testing.assert_array_equal(found, np.where(later, MASKED, 0.0), strict=True)


def test_key_masks_of_every_form_bias_exactly_the_masked_keys() -> None:
    """Batch 2, 5 keys: lengths (3, 5); end/start pairs (4, 5 / 1, 0); 0/1 keys; per-query keys."""
    keys = np.zeros((2, 5, 3))
    position = np.arange(5)[None, :]
    lengths = np.array([3, 5], np.int32)
    ends, starts = np.array([4, 5]), np.array([1, 0])
    flags = np.array([[1, 1, 0, 1, 0], [0, 1, 1, 1, 1]], np.int32)
    per_query = np.random.default_rng(3).integers(0, 2, (2, 4, 5)).astype(np.int32)
    cases = {
        "index": (lengths, position >= lengths[:, None], (2, 1, 1, 5)),
        "index-2B": (
            np.concatenate([ends, starts]).astype(np.int32),
            (position >= ends[:, None]) | (position < starts[:, None]),
            (2, 1, 1, 5),
        ),
        "keys": (flags, flags <= 0, (2, 1, 1, 5)),
        "queries_keys": (per_query, per_query <= 0, (2, 1, 4, 5)),
    }
    for form, (mask, masked, shape) in cases.items():
        emitter = Emitter("attn", np.float64)
        out = emitter.key_mask_bias("mask", form.removesuffix("-2B"), "keys", MASKED)
        found = _run(emitter, out, {"mask": mask, "keys": keys})
        expected = np.where(masked, MASKED, 0.0)
        expected = expected[:, None, None, :] if masked.ndim == 2 else expected[:, None]
        assert found.shape == shape, form
        np.testing.assert_array_equal(found, expected, strict=True, err_msg=form)


def test_a_boolean_mask_is_zero_where_true_and_minus_infinity_where_false() -> None:
    mask = np.array([[True, False, True]])
    emitter = Emitter("attn", np.float64)
    found = _run(emitter, emitter.bool_mask_bias("mask"), {"mask": mask})
    np.testing.assert_array_equal(found, np.array([[0.0, -np.inf, 0.0]]), strict=True)


@pytest.mark.parametrize("group", [1, 3])
def test_repeated_heads_repeat_each_key_value_head_group_times(group: int) -> None:
    """(B, H_kv, T, d) → (B, H_kv·group, T, d) as ``numpy.repeat`` along the heads."""
    x = np.random.default_rng(1).standard_normal((2, 2, 3, 4))
    emitter = Emitter("attn", np.float64)
    out = emitter.repeat_heads("x", group)
    found = x if out == "x" else _run(emitter, out, {"x": x})
    np.testing.assert_array_equal(found, np.repeat(x, group, axis=1), strict=True)


def test_split_then_merged_heads_are_numpys_reshape_and_transpose() -> None:
    x = np.random.default_rng(2).standard_normal((2, 3, 8))
    emitter = Emitter("attn", np.float64)
    split = emitter.split_heads("x", 4, (0, 2, 1, 3))
    np.testing.assert_array_equal(
        _run(emitter, split, {"x": x}), x.reshape(2, 3, 4, 2).transpose(0, 2, 1, 3), strict=True
    )
    emitter.merge_heads(split, "merged")
    np.testing.assert_array_equal(_run(emitter, "merged", {"x": x}), x, strict=True)


@pytest.mark.parametrize("softcap", [0.0, 2.0])
def test_attend_is_softmax_of_scaled_capped_biased_scores_times_values(softcap: float) -> None:
    """Softmax(c·tanh(s·QKᵀ/c) + bias) V, written out in NumPy (no cap where c = 0)."""
    rng = np.random.default_rng(4)
    q, k, v = (rng.standard_normal((1, 2, 3, 4)) for _ in range(3))
    bias = np.where(np.arange(3)[None, :] > np.arange(3)[:, None], MASKED, 0.0)
    scale = 0.7
    emitter = Emitter("attn", np.float64)
    biases = [emitter.const("bias", bias)]
    out = emitter.attend("q", "k_t", "v", scale, biases, "attn/softmax", softcap=softcap)
    found = _run(emitter, out, {"q": q, "k_t": k.transpose(0, 1, 3, 2), "v": v})
    scores = scale * np.einsum("bhid,bhjd->bhij", q, k)
    if softcap:
        scores = softcap * np.tanh(scores / softcap)
    weights = np.exp(scores + bias - (scores + bias).max(-1, keepdims=True))
    expected = (weights / weights.sum(-1, keepdims=True)) @ v
    np.testing.assert_allclose(found, expected, rtol=tol.GRAM_RTOL, atol=0)
    assert [n.name for n in emitter.nodes if n.op_type == "Softmax"] == ["attn/softmax"]


def test_emitted_names_are_prefixed_fresh_and_constants_keep_their_dtype() -> None:
    emitter = Emitter("layer.0/attn", np.float16)
    names = [emitter.ints("axes", [1]), emitter.scalar("scale", 0.5), emitter.fresh("x")]
    assert names == ["layer.0/attn/axes_1", "layer.0/attn/scale_2", "layer.0/attn/x_3"]
    dtypes = [numpy_helper.to_array(t).dtype for t in emitter.initializers]
    assert dtypes == [np.dtype(np.int64), np.dtype(np.float16)]
    emitter.scalar("filter", -3.4e38)  # overflows float16 to -inf, quietly
    assert numpy_helper.to_array(emitter.initializers[-1]) == -np.inf


def _node_index(**attrs: object) -> GraphIndex:
    """One fused-looking node ``Attention(x, "", mask) -> (y, "", present)`` with ``attrs``."""
    node = helper.make_node(
        "Attention", ["x", "", "mask"], ["y", "", "present"], domain="com.microsoft", **attrs
    )
    graph = helper.make_graph(
        [node],
        "g",
        [helper.make_tensor_value_info(n, TensorProto.FLOAT, [2]) for n in ("x", "mask")],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, [2])],
    )
    return GraphIndex(graph)


def test_the_checks_of_a_fused_node_decline_by_the_feature_named() -> None:
    node = _node_index(num_heads=4, scale=0.25).nodes[0]
    assert num_heads(node) == 4
    assert attention_scale(node, 16) == 0.25
    refuse_inputs(node, {1: "with weights", 3: "with a past"})  # absent or empty: no refusal
    refuse_outputs(node, {1: "with a second output", 3: "with a fourth"})
    with pytest.raises(DeclinedError, match=r"^with a key mask$"):
        refuse_inputs(node, {2: "with a key mask"})
    with pytest.raises(DeclinedError, match=r"^with a present output$"):
        refuse_outputs(node, {2: "with a present output"})
    with pytest.raises(DeclinedError, match="without a positive kv_heads attribute"):
        num_heads(node, "kv_heads")
    unscaled = _node_index(num_heads=4).nodes[0]
    assert attention_scale(unscaled, 16) == 1 / math.sqrt(16)


def test_replaced_nodes_drop_what_only_they_read() -> None:
    """``y = Add(x, w)``, ``z = Mul(y, u)``: replacing the Add by ``Sub(x, s)`` drops ``w`` (read
    by it alone), keeps ``u``; the graph input ``x`` stays (still read)—a graph input the emitter
    does without, ``extra``, goes only where it is named unneeded."""
    x = helper.make_tensor_value_info("x", D, [2])
    extra = helper.make_tensor_value_info("extra", D, [2])
    graph = helper.make_graph(
        [
            helper.make_node("Add", ["x", "w", "extra"], ["y"]),
            helper.make_node("Mul", ["y", "u"], ["z"]),
        ],
        "g",
        [x, extra],
        [helper.make_tensor_value_info("z", D, [2])],
        [numpy_helper.from_array(np.ones(2), "w"), numpy_helper.from_array(np.full(2, 3.0), "u")],
    )
    proto = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)], ir_version=10)
    index = GraphIndex(proto.graph)
    for unneeded, inputs in ((set(), ["x", "extra"]), ({"extra"}, ["x"])):
        emitter = Emitter("add", np.float64)
        emitter.op("Sub", ["x", emitter.const("s", np.full(2, 2.0))], output="y")
        emitter.unneeded_inputs |= unneeded
        copy = with_replaced_nodes(proto, index, {0: emitter})
        assert [n.op_type for n in copy.graph.node] == ["Sub", "Mul"]
        assert sorted(t.name for t in copy.graph.initializer) == ["add/s_1", "u"]
        assert [v.name for v in copy.graph.input] == inputs
    feeds = {"x": np.array([1.0, 5.0])}
    (found,) = run_unoptimised(copy, feeds)
    np.testing.assert_array_equal(found, (feeds["x"] - 2.0) * 3.0, strict=True)
    assert [n.op_type for n in proto.graph.node] == ["Add", "Mul"]  # the original is untouched


def test_facts_read_element_types_from_initializers_inputs_casts_and_inference() -> None:
    nodes = [
        helper.make_node("Cast", ["ids"], ["as_half"], to=TensorProto.FLOAT16),
        helper.make_node("Add", ["x", "w"], ["summed"]),
    ]
    graph = helper.make_graph(
        nodes,
        "g",
        [
            helper.make_tensor_value_info("ids", I64, [2]),
            helper.make_tensor_value_info("x", D, [2]),
        ],
        [helper.make_tensor_value_info("summed", TensorProto.UNDEFINED, None)],
        [numpy_helper.from_array(np.ones(2), "w")],
    )
    proto = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])
    facts = Facts(proto, GraphIndex(proto.graph))
    found = {name: facts.elem_type(name) for name in ("w", "ids", "as_half", "summed", "nowhere")}
    assert found == {
        "w": D,
        "ids": I64,
        "as_half": TensorProto.FLOAT16,
        "summed": D,
        "nowhere": None,
    }
    assert facts.float_dtype("as_half", "a query") == np.dtype(np.float16)
    with pytest.raises(DeclinedError, match="with a mask of unknown or non-float element type"):
        facts.float_dtype("ids", "a mask")
    assert facts.shape("nowhere") is None
