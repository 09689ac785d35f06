"""Reshape's 0 and -1, as ONNX defines them, in every part of the importer that replays a Reshape.

A 0 in the target copies the input's dimension at that position (opset 5 on; from opset 14
``allowzero=1`` makes it a zero-size dimension instead), and one -1 is inferred from the element
count. The value rule (constant folding and the layout probe) and the shape rule (shape arithmetic,
which must cope with declared sizes of 2^40 elements) are one function,
:func:`oversmooth.importers.graph.reshape_target`; it is checked here against ONNX's reference implementation.

paddle2onnx spells every Paddle ``reshape`` with such zeros. Its OCR recognisers downsample an open
image width by a convolution stack: at the probe's width of 3 no token reaches the attention, which
must send the match to the longer probe, not end it as a "malformed graph" (the report of a
PaddleOCR model at opset 14: "cannot reshape array of size 0 into shape (0,15)").
"""

from __future__ import annotations

import numpy as np
import onnx
import pytest
from onnx import TensorProto, helper, numpy_helper
from onnx.reference.ops.op_reshape import reshape_reference_implementation

from oversmooth.importers.graph import Node, model_from_proto, reshape_target
from oversmooth.importers.graph.ops import OPS, fold
from oversmooth.importers.graph.shapes import ShapeContext
from oversmooth.importers.match import find_attention_blocks
from oversmooth.importers.match.codes import RejectCode
from oversmooth.importers.match.core import Matcher
from oversmooth.importers.match.limits import PROBE_BATCH, PROBE_SEQUENCE
from oversmooth.importers.match.walker import MatchBasis, RejectError
from oversmooth.importers.weights import block_weights
from tests.importers.paddle_graph import D_HEAD, N_HEADS, paddle_ocr

BIG = 2**40
SHAPES = [(2, 3, 5), (0, 15), (2, 0, 15), (30,), (1, 15)]
TARGETS = [
    [0, -1],
    [0, 15],
    [0, 0, -1],
    [0, -1, 15],
    [-1, 0],
    [0, 5, 3],
    [2, 0, 0],
    [0, 0, 0],
    [15, -1, 0],
    [-1],
    [-1, -1],
    [6, 5],
]


class _Known:
    """Fixed input shapes and values, as a ShapeContext answers a shape rule."""

    def __init__(self, values: dict[str, np.ndarray]) -> None:
        self.values = values

    def need_shape(self, name: str) -> tuple[int, ...] | None:
        return tuple(np.shape(self.values[name])) if name in self.values else None

    def need_value(self, name: str) -> np.ndarray | None:
        return self.values.get(name)


def _outcome(function, *args):
    """The shape of the array ``function`` returns (or the shape it returns), or "refused" when it
    raises."""
    try:
        result = function(*args)
    except (ValueError, IndexError):
        return "refused"
    return result if isinstance(result, tuple) else result.shape


@pytest.mark.parametrize("allowzero", [0, 1])
@pytest.mark.parametrize("shape", SHAPES, ids=str)
def test_value_and_shape_rules_are_onnx_reshape(shape: tuple[int, ...], allowzero: int) -> None:
    """Same shape as ONNX's reference, or refused where it refuses (a copying 0 past the input's
    rank, two -1s, a -1 beside a zero-size dimension)."""
    data = np.zeros(shape, np.float32)
    node = Node(0, helper.make_node("Reshape", ["x", "t"], ["y"], allowzero=allowzero))
    for dims in TARGETS:
        target = np.array(dims, np.int64)
        expected = _outcome(reshape_reference_implementation, data, target, allowzero)
        value = _outcome(fold, node, [data, target])
        rule = _outcome(OPS["Reshape"].shape, _Known({"x": data, "t": target}), node, 0)
        assert value == rule == expected, (shape, dims, allowzero)
    with pytest.raises(ValueError, match="not a valid shape"):  # NumPy's reference takes -2 as -1
        reshape_target(shape, np.array([-2], np.int64), allowzero=bool(allowzero))


def _context(nodes: list, x_dims: list, *, opset: int = 14, **sizes: int) -> ShapeContext:
    x = helper.make_tensor_value_info("x", TensorProto.FLOAT, x_dims)
    out = helper.make_tensor_value_info(nodes[-1].output[0], TensorProto.FLOAT, None)
    model = helper.make_model(
        helper.make_graph(nodes, "g", [x], [out]), opset_imports=[helper.make_opsetid("", opset)]
    )
    return ShapeContext(model_from_proto(model).index, **sizes)


def _ints(name: str, values: list[int]) -> onnx.NodeProto:
    tensor = numpy_helper.from_array(np.array(values, np.int64))
    return helper.make_node("Constant", [], [name], value=tensor)


def test_zeros_copy_the_dimensions_of_the_probe_sizes() -> None:
    """paddle2onnx's head split and merge at the probe's (batch, tokens): 0 is the batch there."""
    nodes = [
        _ints("split", [0, -1, 3, 2, 15]),
        helper.make_node("Reshape", ["x", "split"], ["heads"]),
        _ints("merge", [0, -1, 90]),
        helper.make_node("Reshape", ["heads", "merge"], ["merged"]),
        _ints("keep", [0, 0, 0, 0, 0]),
        helper.make_node("Reshape", ["heads", "keep"], ["same"]),
    ]
    context = _context(nodes, ["batch", "tokens", 90], batch=PROBE_BATCH, sequence=PROBE_SEQUENCE)
    assert context.shape("heads") == (PROBE_BATCH, PROBE_SEQUENCE, 3, 2, 15)
    assert context.shape("merged") == (PROBE_BATCH, PROBE_SEQUENCE, 90)
    assert context.shape("same") == (PROBE_BATCH, PROBE_SEQUENCE, 3, 2, 15)


def test_allowzero_makes_a_zero_a_zero_size_dimension() -> None:
    """With ``allowzero=1`` a 0 is a size: fine on an empty input, refused on a full one."""
    nodes = [
        _ints("empty_shape", [0, 15]),
        helper.make_node("ConstantOfShape", ["empty_shape"], ["empty"]),
        _ints("target", [0, 15]),
        helper.make_node("Reshape", ["empty", "target"], ["kept"], allowzero=1),
        helper.make_node("Reshape", ["x", "target"], ["refused"], allowzero=1),
        helper.make_node("Reshape", ["x", "target"], ["copied"]),
        _ints("inferred", [0, -1]),
        helper.make_node("Reshape", ["empty", "inferred"], ["ambiguous"], allowzero=1),
    ]
    context = _context(nodes, ["batch", 15], batch=4, sequence=3)
    assert context.shape("kept") == (0, 15)
    assert context.value("kept").shape == (0, 15)
    assert context.shape("refused") is None  # 60 elements cannot fill (0, 15)
    assert context.shape("copied") == (4, 15)
    assert context.shape("ambiguous") is None  # a -1 beside a 0: nothing to infer it from


def test_a_declared_2_to_the_40_elements_is_reshaped_by_arithmetic() -> None:
    """A 0 copies 2^20 and a -1 infers 2^20 of a 2^40-element tensor: no array is built."""
    nodes = [
        _ints("huge_shape", [2**20, 2**10, 2**10]),
        helper.make_node("ConstantOfShape", ["huge_shape"], ["huge"]),
        _ints("target", [0, -1]),
        helper.make_node("Reshape", ["huge", "target"], ["flat"]),
        _ints("zero_target", [0, 0, 0]),
        helper.make_node("Reshape", ["huge", "zero_target"], ["same"], allowzero=0),
    ]
    context = _context(nodes, ["batch", 15], batch=2, sequence=3)
    assert context.shape("flat") == (2**20, 2**20)
    assert context.shape("same") == (2**20, 2**10, 2**10)
    assert np.prod(context.shape("flat"), dtype=object) == BIG
    assert context.value("huge") is None  # beyond max_elements: never materialised
    assert context.value("flat") is None


def test_an_ocr_width_downsampled_to_nothing_at_the_probe_is_matched_at_the_longer_probe() -> None:
    """paddle2onnx's OCR form at opset 14: the short probe sees no token and says so (a head-split
    rejection); the longer probe matches the block and reads its weights."""
    built = paddle_ocr(opset=14)
    model = model_from_proto(built.model)
    softmax = model.index.nodes_of_type("Softmax")[0]
    with pytest.raises(RejectError, match="no tokens") as caught:
        Matcher(MatchBasis(model.index, PROBE_BATCH, PROBE_SEQUENCE)).match(softmax, 0)
    assert caught.value.code == RejectCode.HEAD_RESHAPE
    report = find_attention_blocks(model)
    assert report.failures == []
    (block,) = report.blocks
    assert (block.n_heads, block.d_head, block.norm) == (N_HEADS, D_HEAD, "pre")
    weights = block_weights(model, block)
    for role in "QKVO":
        np.testing.assert_array_equal(getattr(weights, f"W_{role}"), getattr(built, f"W_{role}"))
