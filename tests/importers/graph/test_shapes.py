"""ShapeContext on small graphs: exported shape arithmetic evaluated at concrete sizes (issue 11).

Legacy exports compute a head-split Reshape's target from ``Shape`` of activations; the shapes of
the activations on the way (convolutions, quantisation, fused norms, position ``Range``) must be
known at the probe's sizes for the target to be evaluated. An op without a rule falls back on ONNX
shape inference with the graph inputs pinned to those sizes.
"""

from __future__ import annotations

import numpy as np
import onnx
import pytest
from onnx import TensorProto, helper, numpy_helper
from onnx.reference import ReferenceEvaluator

from oversmooth.importers.graph.load import model_from_proto
from oversmooth.importers.graph.shapes import ShapeContext, concrete_shapes

F = TensorProto.FLOAT
I64 = TensorProto.INT64


def _context(
    nodes: list, inputs: list, initializers: list, *, batch: int = 2, sequence: int = 3
) -> ShapeContext:
    graph = helper.make_graph(
        nodes, "g", inputs, [helper.make_tensor_value_info(nodes[-1].output[0], F, None)]
    )
    graph.initializer.extend(initializers)
    model = helper.make_model(
        graph, opset_imports=[helper.make_opsetid("", 17), helper.make_opsetid("com.microsoft", 1)]
    )
    return ShapeContext(model_from_proto(model).index, batch=batch, sequence=sequence)


def _ints(name: str, values: list[int]) -> TensorProto:
    return numpy_helper.from_array(np.asarray(values, dtype=np.int64), name)


def _floats(name: str, shape: tuple[int, ...]) -> TensorProto:
    return numpy_helper.from_array(np.zeros(shape, np.float32), name)


def test_patch_embedding_fixes_the_token_count_of_a_run_time_head_split_target() -> None:
    # ViT-like: Conv patches -> Flatten(2) -> Transpose -> Shape/Gather/Concat head-split target.
    nodes = [
        helper.make_node("Conv", ["x", "w", "b"], ["c"], kernel_shape=[4, 4], strides=[4, 4]),
        helper.make_node("Flatten", ["c"], ["f"], axis=2),
        helper.make_node("Shape", ["c"], ["cs"]),
        helper.make_node("Slice", ["cs", "zero", "two"], ["nc"]),
        helper.make_node("Concat", ["nc", "minus1"], ["flat_shape"], axis=0),
        helper.make_node("Reshape", ["c", "flat_shape"], ["r"]),
        helper.make_node("Transpose", ["r"], ["t"], perm=[0, 2, 1]),
        helper.make_node("Shape", ["t"], ["ts"]),
        helper.make_node("Gather", ["ts", "zero_s"], ["b0"], axis=0),
        helper.make_node("Gather", ["ts", "one_s"], ["t0"], axis=0),
        helper.make_node("Unsqueeze", ["b0", "zero"], ["b1"]),
        helper.make_node("Unsqueeze", ["t0", "zero"], ["t1"]),
        helper.make_node("Concat", ["b1", "t1", "heads"], ["target"], axis=0),
        helper.make_node("Reshape", ["t", "target"], ["q"]),
    ]
    inputs = [helper.make_tensor_value_info("x", F, ["batch", 3, 16, 16])]
    inits = [
        _floats("w", (8, 3, 4, 4)),
        _floats("b", (8,)),
        _ints("zero", [0]),
        _ints("two", [2]),
        _ints("minus1", [-1]),
        numpy_helper.from_array(np.asarray(0, np.int64), "zero_s"),
        numpy_helper.from_array(np.asarray(1, np.int64), "one_s"),
        _ints("heads", [2, 4]),
    ]
    context = _context(nodes, inputs, inits)
    assert context.shape("c") == (2, 8, 4, 4)
    assert context.value("target").tolist() == [2, 16, 2, 4]  # 16 tokens, fixed by the image
    assert context.shape("q") == (2, 16, 2, 4)


def test_window_geometry_padding_dilation_auto_pad_and_ceil_mode() -> None:
    nodes = [
        helper.make_node(
            "Conv", ["x", "w"], ["c"], pads=[1, 1, 1, 1], dilations=[2, 2], strides=[2, 1]
        ),
        helper.make_node("Conv", ["c", "w2"], ["same"], auto_pad="SAME_UPPER", strides=[2, 2]),
        helper.make_node("MaxPool", ["same"], ["pool"], kernel_shape=[2, 2], strides=[2, 2]),
        helper.make_node(
            "AveragePool", ["same"], ["ceil"], kernel_shape=[2, 2], strides=[2, 2], ceil_mode=1
        ),
        helper.make_node("GlobalAveragePool", ["ceil"], ["g"]),
    ]
    inputs = [helper.make_tensor_value_info("x", F, [1, 3, 11, 9])]
    inits = [_floats("w", (5, 3, 3, 3)), _floats("w2", (6, 5, 1, 1))]
    context = _context(nodes, inputs, inits)
    assert context.shape("c") == (1, 5, 5, 7)  # (11 + 2 - 5) // 2 + 1, (9 + 2 - 5) + 1
    assert context.shape("same") == (1, 6, 3, 4)
    assert context.shape("pool") == (1, 6, 1, 2)
    assert context.shape("ceil") == (1, 6, 2, 2)
    assert context.shape("g") == (1, 6, 1, 1)


def test_quantised_and_fused_ops_keep_the_shapes_a_reshape_target_reads() -> None:
    nodes = [
        helper.make_node("DynamicQuantizeLinear", ["x"], ["xq", "xs", "xz"]),
        helper.make_node("MatMulInteger", ["xq", "wq", "xz", "wz"], ["mi"]),
        # a scale of its own: not the quantiser's pair, which the reading removes
        helper.make_node("DequantizeLinear", ["xq", "dscale", "xz"], ["dq"]),
        helper.make_node(
            "SkipLayerNormalization",
            ["x", "dq", "gamma"],
            ["sln", "", "", "sum"],
            domain="com.microsoft",
        ),
        helper.make_node("CumSum", ["sln", "axis"], ["cs"]),
        helper.make_node("Resize", ["x4", "", "", "sizes"], ["rs"]),
        helper.make_node("Resize", ["x4", "", "scales"], ["rc"]),
    ]
    inputs = [
        helper.make_tensor_value_info("x", F, ["batch", "sequence", 8]),
        helper.make_tensor_value_info("x4", F, [1, 8, 4, 4]),
    ]
    inits = [
        numpy_helper.from_array(np.zeros((8, 6), np.uint8), "wq"),
        numpy_helper.from_array(np.asarray(0, np.uint8), "wz"),
        numpy_helper.from_array(np.asarray(0.5, np.float32), "dscale"),
        _floats("gamma", (8,)),
        numpy_helper.from_array(np.asarray(1, np.int64), "axis"),
        _ints("sizes", [1, 8, 5, 7]),
        numpy_helper.from_array(np.asarray([1, 1, 2, 0.5], np.float32), "scales"),
    ]
    context = _context(nodes, inputs, inits, batch=2, sequence=3)
    assert context.shape("xq") == (2, 3, 8)
    assert context.shape("xs") == ()
    assert context.shape("mi") == (2, 3, 6)
    assert context.shape("dq") == (2, 3, 8)
    assert context.shape("sln") == context.shape("sum") == (2, 3, 8)
    assert context.shape("cs") == (2, 3, 8)
    assert context.shape("rs") == (1, 8, 5, 7)
    assert context.shape("rc") == (1, 8, 8, 2)


def test_a_range_of_positions_takes_its_shape_from_its_value() -> None:
    # BART-like learned positions: Range(0, sequence) -> Gather of a table -> Add to the embeddings.
    nodes = [
        helper.make_node("Shape", ["x"], ["xs"]),
        helper.make_node("Gather", ["xs", "one_s"], ["n"], axis=0),
        helper.make_node("Range", ["zero_s", "n", "one_s"], ["positions"]),
        helper.make_node("Gather", ["table", "positions"], ["pos"], axis=0),
        helper.make_node("Add", ["x", "pos"], ["h"]),
        helper.make_node("Pow", ["two_s", "n"], ["p"]),
        helper.make_node("Floor", ["half"], ["fl"]),
        helper.make_node("Greater", ["n", "one_s"], ["gt"]),
        helper.make_node("Mod", ["n", "two_s"], ["md"]),
    ]
    inputs = [helper.make_tensor_value_info("x", F, ["batch", "sequence", 4])]
    inits = [
        numpy_helper.from_array(np.asarray(0, np.int64), "zero_s"),
        numpy_helper.from_array(np.asarray(1, np.int64), "one_s"),
        numpy_helper.from_array(np.asarray(2, np.int64), "two_s"),
        numpy_helper.from_array(np.asarray(2.5, np.float32), "half"),
        _floats("table", (10, 4)),
    ]
    context = _context(nodes, inputs, inits, batch=2, sequence=5)
    assert context.shape("positions") == (5,)
    assert context.shape("h") == (2, 5, 4)
    assert int(context.value("p")) == 32
    assert float(context.value("fl")) == 2.0
    assert bool(context.value("gt")) is True
    assert int(context.value("md")) == 1


def test_an_op_without_a_rule_falls_back_on_onnx_inference_at_the_assumed_sizes() -> None:
    nodes = [
        helper.make_node("Einsum", ["x", "w"], ["e"], equation="bij,jk->bik"),
        helper.make_node("Shape", ["e"], ["es"]),
        helper.make_node("Reshape", ["e", "es"], ["r"]),
    ]
    inputs = [helper.make_tensor_value_info("x", F, ["batch", "sequence", 4])]
    context = _context(nodes, inputs, [_floats("w", (4, 6))], batch=2, sequence=7)
    assert context.shape("e") == (2, 7, 6)
    assert context.value("es").tolist() == [2, 7, 6]
    assert context.shape("r") == (2, 7, 6)


def test_concrete_shapes_pins_inputs_and_needs_opset_imports() -> None:
    graph = helper.make_graph(
        [helper.make_node("Einsum", ["x", "w"], ["e"], equation="bij,jk->bik")],
        "g",
        [helper.make_tensor_value_info("x", F, ["batch", "sequence", 4])],
        [helper.make_tensor_value_info("e", F, ["batch", "sequence", 6])],
        [_floats("w", (4, 6))],
    )
    opsets = [helper.make_opsetid("", 17)]
    # graph outputs are not value_info: only intermediate tensors are reported
    graph.node.append(helper.make_node("Identity", ["e"], ["e2"]))
    graph.output[0].name = "e2"
    assert concrete_shapes(graph, opsets, {"x": (3, 5, 4)})["e"] == (3, 5, 6)
    assert "e" not in concrete_shapes(graph, opsets, {})  # symbolic: not concrete
    assert concrete_shapes(graph, (), {"x": (3, 5, 4)}) == {}
    onnx.checker.check_graph(graph)


@pytest.mark.parametrize(
    ("data_shape", "indices", "batch_dims"),
    [
        ((3, 2, 5, 4), [[1]], 0),  # Falcon's fused-QKV pick of one group: a Gather in disguise
        ((3, 2, 5, 4), [[2, 1], [0, 0]], 0),
        ((3, 2, 5, 4), [[[1, 4]], [[0, -1]], [[0, 0]]], 1),
        ((2, 3, 4), [[[0, 1, 2], [1, 2, 3]]], 0),
    ],
)
def test_gather_nd_shape_agrees_with_the_onnx_reference(data_shape, indices, batch_dims) -> None:
    """The shape rule's arithmetic (the value is the reference's own: tests/importers/graph/test_ops.py)."""
    data = np.arange(np.prod(data_shape), dtype=np.float32).reshape(data_shape)
    index = np.asarray(indices, np.int64)
    node = helper.make_node("GatherND", ["data", "index"], ["out"], batch_dims=batch_dims)
    graph = helper.make_graph(
        [node],
        "g",
        [helper.make_tensor_value_info("data", F, data_shape)],
        [helper.make_tensor_value_info("out", F, None)],
        [numpy_helper.from_array(index, "index")],
    )
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])
    (expected,) = ReferenceEvaluator(model).run(None, {"data": data})
    context = ShapeContext(model_from_proto(model).index, batch=2, sequence=3)
    assert context.shape("out") == expected.shape


def test_a_symbol_takes_its_size_from_its_first_graph_input_whatever_is_asked_first() -> None:
    """``seq`` is axis 1 of the first input and axis 0 of the second: it is the sequence size in
    both, even when the second input's shape is asked for first (it used to be the batch size
    then, so the answer depended on which part of the matcher asked first)."""
    first = helper.make_tensor_value_info("first", F, ["batch", "seq"])
    second = helper.make_tensor_value_info("second", F, ["seq", 4])
    nodes = [helper.make_node("Identity", ["second"], ["out"])]
    graph = helper.make_graph(
        nodes, "g", [first, second], [helper.make_tensor_value_info("out", F, None)]
    )
    index = model_from_proto(
        helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])
    ).index
    for order in (["second", "first"], ["first", "second"]):
        context = ShapeContext(index, batch=2, sequence=5)
        shapes = {name: context.shape(name) for name in order}
        assert shapes == {"first": (2, 5), "second": (5, 4)}
