"""From an attention operand back to its projection (:mod:`oversmooth.importers.match.projections`):
the walk back through a bias, a scale, a head split and a clip on a hand-built graph, the forms of
the product it reads (MatMul, Gemm with transB), the rejections naming what was found instead, and
the texts a block's roles and reasons are written with.
"""

from __future__ import annotations

import numpy as np
import onnx
import pytest
from onnx import helper

from oversmooth.importers.graph import Node, model_from_proto
from oversmooth.importers.match.codes import RejectCode
from oversmooth.importers.match.limits import PROBE_BATCH, PROBE_SEQUENCE
from oversmooth.importers.match.projections import ProjectionFinder, describe_linear, path_text
from oversmooth.importers.match.walker import MatchBasis, RejectError
from tests.importers.small_graph import SmallGraph

D, HEADS = 8, 2
W = np.arange(D * D, dtype=np.float32).reshape(D, D) / 64


def _finder(model: onnx.ModelProto) -> ProjectionFinder:
    basis = MatchBasis(model_from_proto(model).index, PROBE_BATCH, PROBE_SEQUENCE)
    return ProjectionFinder(basis, basis.shapes.context())


def _head_split(g: SmallGraph, projected: str) -> str:
    """``Clip(Transpose(Reshape(projected · 0.5)), -3, 3)``: (B, H, T, d_head)."""
    scaled = g.op("Mul", projected, g.const(0.5))
    split = g.op("Reshape", scaled, g.const([0, 0, HEADS, D // HEADS], np.int64))
    heads = g.op("Transpose", split, perm=[0, 2, 1, 3])
    return g.op("Clip", heads, g.const(-3.0), g.const(3.0))


def test_the_walk_back_passes_scale_layout_and_clip_to_the_biased_matmul() -> None:
    g = SmallGraph()
    weight, bias = g.const(W), g.const(np.ones(D))
    matmul = g.op("MatMul", "x", weight)
    projected = g.op("Add", matmul, bias)
    operand = _head_split(g, projected)
    trace = _finder(g.model(operand, D)).trace(operand, "Q")
    linear = trace.linear
    assert (linear.kind, linear.x, linear.weight, linear.bias) == ("matmul", "x", weight, bias)
    assert (linear.d_in, linear.d_out, linear.output, linear.transpose) == (D, D, projected, False)
    assert trace.scale == 0.5
    assert [(s.node.op_type, s.skip) for s in trace.steps] == [
        ("Mul", True),
        ("Reshape", False),
        ("Transpose", False),
        ("Clip", True),
    ]
    assert trace.steps[0].source == projected
    assert trace.steps[-1].output == operand
    assert trace.clipped.endswith("to [-3, 3]")
    assert not trace.rope
    assert path_text(trace) == (
        "projection 'Add#1' -> Reshape 'Reshape#3' -> Transpose 'Transpose#4'"
    )
    assert describe_linear(trace) == (
        f"matmul MatMul#0, Add#1 (weight {weight!r}; scaled by 0.5, layout Reshape/Transpose)"
    )


def test_a_gemm_with_transb_reads_its_weight_as_out_by_in() -> None:
    """Gemm(x, W, b, transB=1, alpha=2) with W of shape (6, 8): d_in 8, d_out 6."""
    g = SmallGraph()
    weight, bias = g.const(np.ones((6, D))), g.const(np.ones(6))
    flat = g.op("Flatten", "x", axis=2)
    out = g.op("Gemm", flat, weight, bias, transB=1, alpha=2.0, beta=0.25)
    linear = _finder(g.model(out, D)).trace(out, "V").linear
    assert (linear.kind, linear.d_in, linear.d_out, linear.transpose) == ("gemm", D, 6, True)
    assert (linear.alpha, linear.beta, linear.bias) == (2.0, 0.25, bias)


@pytest.mark.parametrize(
    ("weight", "code", "reason"),
    [
        ("input", RejectCode.K_WEIGHT_NOT_CONSTANT, "K projection weight is not a constant"),
        ("3d", RejectCode.K_PROJECTION_UNSUPPORTED, r"weight of shape \(2, 8, 8\)"),
    ],
)
def test_a_product_whose_weight_the_theory_cannot_read_is_refused(
    weight: str, code: RejectCode, reason: str
) -> None:
    g = SmallGraph()
    inputs = []
    if weight == "input":
        name = "w"
        inputs = [helper.make_tensor_value_info("w", onnx.TensorProto.FLOAT, [D, D])]
    else:
        name = g.const(np.ones((2, D, D)))
    out = g.op("MatMul", "x", name)
    with pytest.raises(RejectError, match=reason) as raised:
        _finder(g.model(out, D, inputs=inputs)).trace(out, "K")
    assert raised.value.code == code


def test_a_walk_that_reaches_no_projection_names_where_it_ended() -> None:
    g = SmallGraph()
    out = g.op("Transpose", g.op("Softmax", "x", axis=-1), perm=[1, 0, 2])
    with pytest.raises(RejectError, match=r"reached Softmax 'Softmax#0'") as raised:
        _finder(g.model(out, D)).trace(out, "V")
    assert raised.value.code == RejectCode.V_PROJECTION_MISSING
    g = SmallGraph()
    out = g.op("Transpose", "x", perm=[1, 0, 2])
    with pytest.raises(RejectError, match="reached graph input 'x'"):
        _finder(g.model(out, D)).trace(out, "Q")


@pytest.mark.parametrize(
    ("inputs", "attrs", "opset", "bounds"),
    [
        (["x", "lo", "hi"], {}, 17, (-2.0, 5.0)),
        (["x", "lo"], {}, 17, (-2.0, np.inf)),
        (["x", "", "hi"], {}, 17, (-np.inf, 5.0)),
        (["x"], {"min": -1.5, "max": 1.5}, 10, (-1.5, 1.5)),
        (["x"], {}, 17, None),
        (["x", "x"], {}, 17, None),
    ],
)
def test_clip_bounds_by_hand(inputs: list, attrs: dict, opset: int, bounds) -> None:
    """Constant bounds (an absent one infinite, attributes before opset 11); a bound computed
    from the data, or none at all, is no clip the walk passes."""
    g = SmallGraph()
    names = {"lo": g.const(-2.0), "hi": g.const(5.0), "x": "x", "": ""}
    node = helper.make_node("Clip", [names[i] for i in inputs], ["y"], **attrs)
    g.nodes.append(node)
    finder = _finder(g.model("y", D, opsets=(("", opset),)))
    assert finder.clip_bounds(Node(0, node, opset)) == bounds
