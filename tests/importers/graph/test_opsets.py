"""Models older than opset 13 read through ONNX's version converter (importers.graph.opsets): the
conversion is exact on each op form that changed before 13 and keeps every tensor name; the model
given is not changed, its large tensors come back as they were (external data unread), a model the
converter refuses is one line, and the optional outputs named on the conversion are mirrored onto
the model as shipped."""

from __future__ import annotations

import numpy as np
import onnx
import onnxruntime as ort
import pytest
from onnx import TensorProto, helper, numpy_helper

from oversmooth.importers.errors import UnsupportedModelError
from oversmooth.importers.graph.opsets import (
    LOWEST_OPSET,
    READ_OPSET,
    mirror_outputs,
    to_read_opset,
)

F = TensorProto.FLOAT


def _x_model(opset: int, nodes: list, outputs: tuple[str, ...] = ("y",)) -> onnx.ModelProto:
    graph = helper.make_graph(
        nodes,
        "old",
        [helper.make_tensor_value_info("x", F, ["b", 2, 4, 4])],
        [helper.make_tensor_value_info(name, F, None) for name in outputs],
    )
    return helper.make_model(graph, opset_imports=[helper.make_opsetid("", opset)], ir_version=4)


def _const(name: str, value: object, dtype: type = np.float32) -> onnx.NodeProto:
    tensor = numpy_helper.from_array(np.asarray(value, dtype=dtype))
    return helper.make_node("Constant", [], [name], value=tensor)


_node = helper.make_node
#: One graph per op form that changed before opset 13: (opset, nodes, outputs).
OLD_FORMS = {
    "axes_attributes": (
        11,
        [
            _node("Unsqueeze", ["x"], ["u"], axes=[1]),
            _node("Squeeze", ["u"], ["s"], axes=[1]),
            _node("Split", ["s"], ["a", "b"], axis=3, split=[1, 3]),
            _node("ReduceSum", ["b"], ["y"], axes=[3], keepdims=1),
        ],
        ("y", "a"),
    ),
    "clip_attributes": (7, [_node("Clip", ["x"], ["y"], min=-0.5, max=0.5)], ("y",)),
    "pad_attributes": (
        7,
        [_node("Pad", ["x"], ["y"], pads=[0, 0, 1, 1, 0, 0, 1, 1], value=0.5)],
        ("y",),
    ),
    "pad_input": (
        11,
        [
            _const("p", [0, 0, 1, 1, 0, 0, 1, 1], np.int64),
            _node("Pad", ["x", "p"], ["y"], mode="reflect"),
        ],
        ("y",),
    ),
    "upsample": (7, [_node("Upsample", ["x"], ["y"], scales=[1.0, 1.0, 2.0, 2.0])], ("y",)),
    "upsample_scales_input": (
        9,
        [_const("s", [1, 1, 2, 2]), _node("Upsample", ["x", "s"], ["y"])],
        ("y",),
    ),
    "resize_10": (10, [_const("s", [1, 1, 2, 2]), _node("Resize", ["x", "s"], ["y"])], ("y",)),
    "dropout_ratio": (7, [_node("Dropout", ["x"], ["y"], ratio=0.3)], ("y",)),
    "softmax_axes": (
        11,
        [
            _node("Softmax", ["x"], ["last"], axis=3),
            _node("Softmax", ["x"], ["minus_one"], axis=-1),
            _node("Softmax", ["x"], ["joint"], axis=1),
            _node("Softmax", ["x"], ["default"]),
        ],
        ("last", "minus_one", "joint", "default"),
    ),
}


@pytest.mark.parametrize("form", sorted(OLD_FORMS))
def test_the_conversion_is_exact_and_keeps_every_tensor_name(form: str) -> None:
    opset, nodes, outputs = OLD_FORMS[form]
    model = _x_model(opset, nodes, outputs)
    converted = to_read_opset(model, "the model")
    assert converted.opset_import[0].version == 13
    names = {name for node in converted.graph.node for name in node.output}
    assert {name for node in model.graph.node for name in node.output} <= names
    x = np.random.default_rng(0).standard_normal((2, 2, 4, 4)).astype(np.float32)
    runs = [
        ort.InferenceSession(m.SerializeToString()).run(None, {"x": x}) for m in (model, converted)
    ]
    for old, new in zip(*runs, strict=True):
        np.testing.assert_array_equal(old, new)
    if form == "softmax_axes":  # over the last axis: one node writing its own output
        softmax = {
            node.output[0]: node for node in converted.graph.node if node.op_type == "Softmax"
        }
        for name in ("last", "minus_one"):
            assert helper.get_attribute_value(softmax[name].attribute[0]) == -1
        assert "joint" not in softmax  # Flatten → Softmax → Reshape, over H·T·T entries
        assert "default" not in softmax


def _large_weight_model(weight: onnx.TensorProto) -> onnx.ModelProto:
    """``y = Unsqueeze(x @ w, axes=[1])`` at opset 11 (axes an attribute), ``w`` an initializer."""
    graph = helper.make_graph(
        [_node("MatMul", ["x", weight.name], ["h"]), _node("Unsqueeze", ["h"], ["y"], axes=[1])],
        "large",
        [helper.make_tensor_value_info("x", F, ["b", 128])],
        [helper.make_tensor_value_info("y", F, None)],
        [weight],
    )
    return helper.make_model(graph, opset_imports=[helper.make_opsetid("", 11)], ir_version=6)


def test_the_opsets_read() -> None:
    assert (LOWEST_OPSET, READ_OPSET) == (7, 13)


def test_the_model_given_is_not_changed_and_its_large_weights_come_back_whole() -> None:
    weight = numpy_helper.from_array(
        np.random.default_rng(1).standard_normal((128, 256)).astype(np.float32), "w"
    )  # 128 KiB: past the converter as name and dims only
    model = _large_weight_model(weight)
    before = model.SerializeToString()
    converted = to_read_opset(model, "the model")
    assert model.SerializeToString() == before
    (restored,) = converted.graph.initializer
    assert restored == weight
    unsqueeze = next(node for node in converted.graph.node if node.op_type == "Unsqueeze")
    assert len(unsqueeze.input) == 2  # axes moved to an input: opset 13's form


def test_external_data_is_carried_by_reference_not_read() -> None:
    weight = onnx.TensorProto(name="w", data_type=TensorProto.FLOAT, dims=[128, 256])
    weight.data_location = TensorProto.EXTERNAL
    for key, value in (("location", "absent.bin"), ("offset", "0"), ("length", "131072")):
        entry = weight.external_data.add()
        entry.key, entry.value = key, value
    converted = to_read_opset(
        _large_weight_model(weight), "the model"
    )  # absent.bin is never opened
    assert converted.graph.initializer[0] == weight


@pytest.mark.parametrize(
    ("node", "why"),
    [
        (_node("NotAnOp", ["x"], ["y"]), "has no registered schema"),
        (_node("Upsample", ["x"], ["y"], scales=[1.0, 2.0]), "ShapeInferenceError"),
    ],
    ids=["unknown-op", "bad-attributes"],
)
def test_a_model_the_converter_refuses_is_one_line(node: onnx.NodeProto, why: str) -> None:
    graph = helper.make_graph(
        [node],
        "refused",
        [helper.make_tensor_value_info("x", F, ["b", 4])],
        [helper.make_tensor_value_info("y", F, None)],
    )
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 9)], ir_version=6)
    with pytest.raises(UnsupportedModelError) as info:
        to_read_opset(model, "'model.onnx'")
    message = str(info.value)
    assert message.startswith(
        "`model` must be convertible to opset 13 by ONNX's version converter; 'model.onnx' "
        "(opset 9) is not: "
    )
    assert why in message
    assert "\n" not in message


def test_optional_outputs_named_on_the_conversion_are_mirrored() -> None:
    source = helper.make_model(
        helper.make_graph(
            [
                _node("LayerNormalization", ["x", "g"], ["y"]),
                _node("Relu", ["y"], ["r"]),
                _node("Sigmoid", ["y"], ["s"]),
            ],
            "source",
            [],
            [],
        )
    )
    converted = helper.make_model(
        helper.make_graph(
            [
                _node(
                    "LayerNormalization", ["x", "g"], ["y", "", "inv_std"]
                ),  # named by the matcher
                _node("Relu", ["y"], ["r"]),
                _node("Tanh", ["y"], ["s", "extra"]),  # another op writing "s": not a twin
            ],
            "converted",
            [],
            [],
        )
    )
    mirror_outputs(source, converted)
    assert [list(node.output) for node in source.graph.node] == [["y", "", "inv_std"], ["r"], ["s"]]
