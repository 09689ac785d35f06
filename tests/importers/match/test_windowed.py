"""Windowed attention (Swin) is declined by name; the Pad shape rule its windows need.

A Swin block cuts each input's T = 16 tokens (a 4×4 grid) into windows of t = 4 (2×2) and folds them
into the batch axis before the Q/K/V projections: the scores are (B·4, H, 4, 4). There is then no
T×T attention matrix per input, so the importer must decline the block, naming the windows, instead
of auditing each window as if it were an input. The same holds when the projections read the whole
(B, T, D) stream and the block's own head-split Reshapes fold the windows into the leading axis
(:mod:`tests.importers.head_split_blocks`).
"""

from __future__ import annotations

import numpy as np
import pytest
from onnx import TensorProto, helper

from oversmooth.importers.graph import ShapeContext, model_from_proto
from oversmooth.importers.match import NoAttentionBlocksError, find_attention_blocks
from oversmooth.importers.match.codes import RejectCode
from tests.importers.head_split_blocks import windowed_decoder
from tests.importers.small_graph import SmallGraph

D, HEADS, D_HEAD, GRID, WINDOW = 8, 2, 4, 4, 2


def _block(g: SmallGraph, x: str, rng: np.random.Generator) -> str:
    """Self-attention over the tokens of ``x`` (rows of its batch axis attend separately)."""
    heads = g.const([0, 0, HEADS, D_HEAD], np.int64)

    def project(role: str) -> str:
        weight = g.const(rng.normal(size=(D, D)))
        return g.op("Reshape", g.op("MatMul", x, weight), heads)

    q = g.op("Transpose", project("q"), perm=[0, 2, 1, 3])
    k_t = g.op("Transpose", project("k"), perm=[0, 2, 3, 1])
    v = g.op("Transpose", project("v"), perm=[0, 2, 1, 3])
    scores = g.op("Mul", g.op("MatMul", q, k_t), g.const(D_HEAD**-0.5))
    mixed = g.op(
        "Transpose", g.op("MatMul", g.op("Softmax", scores, axis=-1), v), perm=[0, 2, 1, 3]
    )
    merged = g.op("Reshape", mixed, g.const([0, 0, D], np.int64))
    return g.op("MatMul", merged, g.const(rng.normal(size=(D, D))))


def _model(windowed: bool):
    rng = np.random.default_rng(0)
    g = SmallGraph()
    if windowed:  # (B, 16, D) -> (B, 2, 2, 2, 2, D) -> windows first -> (B·4, 4, D)
        grid = g.op("Reshape", "x", g.const([-1, 2, WINDOW, 2, WINDOW, D], np.int64))
        cells = g.op("Transpose", grid, perm=[0, 1, 3, 2, 4, 5])
        windows = g.op("Reshape", cells, g.const([-1, WINDOW * WINDOW, D], np.int64))
        attended = _block(g, windows, rng)
        back = g.op("Reshape", attended, g.const([-1, 2, 2, WINDOW, WINDOW, D], np.int64))
        back = g.op("Transpose", back, perm=[0, 1, 3, 2, 4, 5])
        attended = g.op("Reshape", back, g.const([-1, GRID * GRID, D], np.int64))
    else:
        attended = _block(g, "x", rng)
    out = g.op("Add", "x", attended)
    graph = helper.make_graph(
        g.nodes,
        "windows",
        [helper.make_tensor_value_info("x", TensorProto.FLOAT, ["batch", GRID * GRID, D])],
        [helper.make_tensor_value_info(out, TensorProto.FLOAT, None)],
        g.inits,
    )
    return model_from_proto(helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)]))


def test_windowed_attention_is_declined_naming_the_windows() -> None:
    with pytest.raises(
        NoAttentionBlocksError,
        match="windowed attention: each input's tokens attend within 4 windows of 4 tokens",
    ):
        find_attention_blocks(_model(windowed=True))


def test_windows_folded_by_the_head_split_are_declined_naming_them() -> None:
    """Block 1 projects the (B, 16, D) stream but its Softmax is (4·B, heads, 4, 4): declined;
    the blocks attending over all 16 tokens around it are found."""
    report = find_attention_blocks(model_from_proto(windowed_decoder()))
    softmaxes = [block.softmax for block in report.blocks]
    [failure] = report.failures
    assert len(softmaxes) == 2
    assert failure.softmax not in softmaxes
    assert failure.code is RejectCode.WINDOWED_ATTENTION
    assert "each input's tokens attend within 4 windows of 4 tokens" in failure.reason
    assert "\n" not in failure.reason


def test_the_same_block_over_all_tokens_is_found() -> None:
    report = find_attention_blocks(_model(windowed=False))
    assert len(report.blocks) == 1
    assert not report.failures


@pytest.mark.parametrize(
    ("pads", "axes", "expected"),
    [
        ([0, 1, 2, 0, 3, 0], None, (2, 7, 7)),  # begins then ends, every axis
        ([1, 2], [1], (2, 6, 5)),  # opset-18 axes: only axis 1
    ],
)
def test_pad_takes_its_shape_from_its_run_time_pads(pads, axes, expected) -> None:
    g = SmallGraph()
    inputs = ["x", g.const(pads, np.int64), ""]
    if axes is not None:
        inputs.append(g.const(axes, np.int64))
    g.nodes.append(helper.make_node("Pad", inputs, ["padded"]))
    graph = helper.make_graph(
        g.nodes,
        "pad",
        [helper.make_tensor_value_info("x", TensorProto.FLOAT, [2, 3, 5])],
        [helper.make_tensor_value_info("padded", TensorProto.FLOAT, None)],
        g.inits,
    )
    model = model_from_proto(helper.make_model(graph, opset_imports=[helper.make_opsetid("", 18)]))
    assert ShapeContext(model.index, batch=2, sequence=3).shape("padded") == expected
