"""Key/value cache inputs found by structure (importers.graph.kv_cache) on hand-made graphs: an
open axis concatenated with computed keys, through casts, transposes and one index of a packed
past; what is no cache; an input concatenated along two axes of its own; and the view itself.
(The corpus' with-past exports: tests/importers/test_kv_cache.py.)"""

from __future__ import annotations

import numpy as np
import onnx
import pytest
from onnx import TensorProto, helper

from oversmooth.importers.graph import model_from_proto
from oversmooth.importers.graph.kv_cache import cache_inputs, cache_view


def _concat_graph(
    past_shape: list,
    axis: int,
    *,
    perm: list[int] | None = None,
    other: str = "computed",
    view: str = "",
) -> onnx.ModelProto:
    """``Concat(view(past), x · W)`` along ``axis``: ``view`` a Transpose by ``perm`` (or none),
    after a ``Cast`` (``view="cast"``) or the ``Gather`` of index 1 along axis 0 (``"gather"``:
    the values of onnxruntime's packed (2, B, N, P, H) past); ``other="constant"`` concatenates a
    constant instead of the product."""
    nodes, past = [], "past"
    if view == "cast":
        nodes.append(helper.make_node("Cast", [past], ["past_c"], to=TensorProto.FLOAT))
        past = "past_c"
    if view == "gather":
        index = helper.make_tensor("one", TensorProto.INT64, [], [1])
        nodes.append(helper.make_node("Constant", [], ["index"], value=index))
        nodes.append(helper.make_node("Gather", [past, "index"], ["past_g"], axis=0))
        past = "past_g"
    if perm is not None:
        nodes.append(helper.make_node("Transpose", [past], ["past_t"], perm=perm))
        past = "past_t"
    weight = helper.make_tensor("W", TensorProto.FLOAT, [4, 4], np.eye(4, dtype=np.float32).ravel())
    nodes.append(helper.make_node("MatMul", ["x", "W"], ["new"]))
    second = "new" if other == "computed" else "W_const"
    nodes.append(helper.make_node("Concat", [past, second], ["joined"], axis=axis))
    initializers = [weight]
    if other == "constant":
        initializers.append(
            helper.make_tensor("W_const", TensorProto.FLOAT, [1, 1, 1, 4], np.ones(4, np.float32))
        )
    graph = helper.make_graph(
        nodes,
        "cache",
        [
            helper.make_tensor_value_info("past", TensorProto.FLOAT, past_shape),
            helper.make_tensor_value_info("x", TensorProto.FLOAT, ["b", 1, "t", 4]),
        ],
        [helper.make_tensor_value_info("joined", TensorProto.FLOAT, None)],
        initializers,
    )
    return helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])


@pytest.mark.parametrize(
    ("past_shape", "axis", "perm", "other", "expected"),
    [
        (["b", 1, "past", 4], 2, None, "computed", {"past": 2}),
        (["b", 1, "past", 4], -2, None, "computed", {"past": 2}),
        # a (batch, heads, d_head, past) cache transposed to (batch, heads, past, d_head)
        (["b", 1, 4, "past"], 2, [0, 1, 3, 2], "computed", {"past": 3}),
        (["b", 1, 5, 4], 2, None, "computed", {}),  # a fixed length is no open past
        (["b", 1, "past", 4], 2, None, "constant", {}),  # nothing computed joins it
        (["b", "past"], 1, None, "computed", {}),  # rank 2: not keys or values
    ],
)
def test_a_cache_is_an_open_axis_concatenated_with_computed_keys(
    past_shape: list, axis: int, perm: list[int] | None, other: str, expected: dict
) -> None:
    model = model_from_proto(_concat_graph(past_shape, axis, perm=perm, other=other))
    assert cache_inputs(model.index) == expected


@pytest.mark.parametrize(
    ("past_shape", "axis", "perm", "view", "expected"),
    [
        (["b", 1, "past", 4], 2, None, "cast", {"past": 2}),  # float16 graphs cast the cache
        (["b", 1, 4, "past"], -2, [0, 1, 3, 2], "cast", {"past": 3}),
        ([2, "b", 1, "past", 4], 2, None, "gather", {"past": 3}),  # a packed past's values
        ([2, "b", 1, "past", 4], -2, None, "gather", {"past": 3}),
        ([2, "b", 1, 4, "past"], 2, [0, 1, 3, 2], "gather", {"past": 4}),
        ([2, "b", "past", 1, 4], 2, None, "gather", {}),  # axis 2 of the values: fixed
    ],
)
def test_a_cache_is_found_through_casts_and_one_index_of_a_packed_past(
    past_shape: list, axis: int, perm: list[int] | None, view: str, expected: dict
) -> None:
    model = model_from_proto(_concat_graph(past_shape, axis, perm=perm, view=view))
    assert cache_inputs(model.index) == expected


def _graph(inputs: list[onnx.ValueInfoProto], nodes: list[onnx.NodeProto], initializers=()):
    """The model of ``nodes`` over ``inputs`` (its only output the last node's)."""
    graph = helper.make_graph(
        nodes,
        "views",
        inputs,
        [helper.make_tensor_value_info(nodes[-1].output[0], TensorProto.FLOAT, None)],
        list(initializers),
    )
    return model_from_proto(helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)]))


def test_an_input_concatenated_along_two_of_its_axes_is_no_cache() -> None:
    past = helper.make_tensor_value_info("past", TensorProto.FLOAT, ["b", 1, "p", "q"])
    x = helper.make_tensor_value_info("x", TensorProto.FLOAT, ["b", 1, "t", "t"])
    nodes = [
        helper.make_node("Relu", ["x"], ["new"]),
        helper.make_node("Concat", ["past", "new"], ["along_p"], axis=2),
        helper.make_node("Concat", ["past", "new"], ["along_q"], axis=3),
        helper.make_node("Add", ["along_p", "along_q"], ["y"]),
    ]
    assert cache_inputs(_graph([past, x], nodes).index) == {}
    assert cache_inputs(_graph([past, x], nodes[:2]).index) == {"past": 2}  # one axis: a cache


def test_a_reversing_transpose_maps_the_axis_back() -> None:
    """Transpose without ``perm`` reverses the axes: axis 1 of the view is axis 2 of a rank-4 input."""
    past = helper.make_tensor_value_info("past", TensorProto.FLOAT, ["b", 1, "p", 4])
    model = _graph([past], [helper.make_node("Transpose", ["past"], ["view"])])
    assert cache_view(model.index, "view", 1) == ("past", 2)
    assert cache_view(model.index, "view", -3) == ("past", 2)
    assert cache_view(model.index, "view", 4) is None  # outside the rank
    assert cache_view(model.index, "past", 0) == ("past", 0)  # the input itself


@pytest.mark.parametrize(
    ("elem_type", "shape", "initializer"),
    [
        (TensorProto.INT64, ["b", 1, "p", 4], False),  # not float: ids, not keys
        (TensorProto.FLOAT, ["b", "p"], False),  # rank 2
        (TensorProto.FLOAT, [1, 1, 2, 4], True),  # a weight, not an input
    ],
    ids=["integer", "rank-2", "initializer"],
)
def test_views_of_what_cannot_be_a_cache_are_none(
    elem_type: int, shape: list, initializer: bool
) -> None:
    past = helper.make_tensor_value_info("past", elem_type, shape)
    inits = (
        [helper.make_tensor("past", TensorProto.FLOAT, shape, np.zeros(8, np.float32))]
        if initializer
        else []
    )
    model = _graph([past], [helper.make_node("Identity", ["past"], ["view"])], inits)
    assert cache_view(model.index, "view", 0) is None


def test_a_view_through_an_op_that_mixes_values_is_none() -> None:
    past = helper.make_tensor_value_info("past", TensorProto.FLOAT, ["b", 1, "p", 4])
    model = _graph([past], [helper.make_node("Relu", ["past"], ["view"])])
    assert cache_view(model.index, "view", 2) is None
