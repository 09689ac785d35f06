"""A score term's value comes from the importer's one evaluator, not one of its own.

The term below depends on the attention mask, so it is evaluated from the cut subgraph: a bias
table of int8 codes gathered by the mask's positions and dequantised per head at opset 13 (where
``onnx.reference`` has no DequantizeLinear: the op table's rule serves), laid out and expanded to
(batch, heads, T, T). Its value is onnxruntime's with an all-ones mask, and the op table's size
guard refuses it when the expanded term would exceed ``max_elements``.
"""

from __future__ import annotations

import numpy as np
import onnx
import onnxruntime as ort
import pytest
from onnx import TensorProto, helper

from oversmooth.importers.graph import model_from_proto
from oversmooth.importers.match.score_values import neutral_value
from oversmooth.importers.match.walker import GraphWalker, MatchBasis
from tests.importers.small_graph import SmallGraph

BATCH, T, HEADS = 2, 4, 2


def _term_model() -> tuple[onnx.ModelProto, str]:
    g = SmallGraph()
    positions = g.op(
        "Sub", g.op("CumSum", "attention_mask", g.const(1, np.int64)), g.const(1, np.int64)
    )
    codes = np.arange(-T * HEADS, T * HEADS, 2, dtype=np.int8).reshape(T, HEADS) * 9
    gathered = g.op("Gather", g.const(codes, np.int8), positions, axis=0)  # (B, T, H)
    scale, zero_point = g.const([0.0625, 0.5]), g.const([3, -7], np.int8)
    bias = g.op("DequantizeLinear", gathered, scale, zero_point, axis=2)
    per_key = g.op("Unsqueeze", g.op("Transpose", bias, perm=[0, 2, 1]), g.const([2], np.int64))
    target = g.const([BATCH, HEADS, T, T], np.int64)
    term = g.op("Expand", per_key, target)
    mask = helper.make_tensor_value_info("attention_mask", TensorProto.INT64, ["batch", "sequence"])
    graph = helper.make_graph(
        g.nodes,
        "term",
        [mask],
        [helper.make_tensor_value_info(term, TensorProto.FLOAT, None)],
        g.inits,
    )
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 13)], ir_version=8)
    return model, term


def _neutral(model: onnx.ModelProto, term: str) -> np.ndarray | None:
    basis = MatchBasis(model_from_proto(model).index, BATCH, T)
    return neutral_value(GraphWalker(basis, basis.shapes.context()), term)


def test_a_term_through_an_opset_13_dequantize_is_onnxruntimes() -> None:
    model, term = _term_model()
    session = ort.InferenceSession(model.SerializeToString(), providers=["CPUExecutionProvider"])
    (expected,) = session.run(None, {"attention_mask": np.ones((BATCH, T), np.int64)})
    found = _neutral(model, term)
    assert found is not None
    np.testing.assert_array_equal(found, expected, strict=True)


def test_the_op_tables_size_guard_refuses_a_term_too_large(monkeypatch: pytest.MonkeyPatch) -> None:
    """The expanded term holds 64 elements, everything before it at most 16: with the limit at 16
    only the op table's guard (on Expand) can refuse it."""
    model, term = _term_model()
    monkeypatch.setenv("OVERSMOOTH_MAX_ELEMENTS", "16")
    assert _neutral(model, term) is None
    monkeypatch.setenv("OVERSMOOTH_MAX_ELEMENTS", "64")
    assert _neutral(model, term) is not None
