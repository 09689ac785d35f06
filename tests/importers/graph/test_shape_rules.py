"""Output shapes by arithmetic alone (:mod:`oversmooth.importers.graph.shape_rules`).

Each rule's answer on small inputs is the shape of what ONNX's reference implementation computes
on a one-node model; the same rules on declared sizes of 2^40 elements answer at once, from
numbers, with nothing of that size allocated. ``reshape_target`` and ``apply_slice`` are checked
against ONNX's own Reshape and Slice on drawn shapes and bounds.

That each layout op's shape rule agrees with its value rule is ``test_declared_sizes``; Reshape's
0 and -1 through the whole importer is ``test_reshape``.
"""

from __future__ import annotations

import tracemalloc

import numpy as np
import pytest
from hypothesis import given
from hypothesis import strategies as st
from onnx import TensorProto, helper
from onnx.reference import ReferenceEvaluator
from onnx.reference.ops.op_reshape import reshape_reference_implementation

from oversmooth.importers.graph import Node
from oversmooth.importers.graph.shape_rules import (
    SHAPE_RULES,
    apply_slice,
    broadcast_rule,
    reshape_target,
    same_shape_rule,
    split_sizes,
)

M = 2**20  # a declared dimension: M x M is 2^40 elements


class _Shapes:
    """A lookup that knows shapes (and small integer values) only: nothing is an array."""

    def __init__(
        self, shapes: dict[str, tuple[int, ...]], values: dict[str, np.ndarray] | None = None
    ) -> None:
        self.shapes, self.values = shapes, values or {}

    def need_shape(self, name: str) -> tuple[int, ...] | None:
        return self.shapes.get(name)

    def need_value(self, name: str) -> np.ndarray | None:
        return self.values.get(name)


def _reference_shape(node, arrays: dict[str, np.ndarray], opset: int = 18) -> tuple[int, ...]:
    """The shape of output 0 of ``node`` that ONNX's reference computes from ``arrays``."""
    inputs = [
        helper.make_tensor_value_info(n, helper.np_dtype_to_tensor_dtype(a.dtype), a.shape)
        for n, a in arrays.items()
    ]
    graph = helper.make_graph(
        [node],
        "g",
        inputs,
        [helper.make_tensor_value_info(node.output[0], TensorProto.FLOAT, None)],
    )
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", opset)])
    (value,) = ReferenceEvaluator(model).run(None, arrays)[:1]
    return value.shape


def _f(*shape: int) -> np.ndarray:
    return np.ones(shape, np.float32)


def _i(*values: int) -> np.ndarray:
    return np.array(values, np.int64)


#: (node, small inputs, the same node's inputs declared with huge sizes, the hand-worked answer)
CASES = [
    (
        helper.make_node("MatMul", ["a", "b"], ["y"]),
        {"a": _f(2, 1, 3, 4), "b": _f(5, 4, 6)},
        {"a": (2, 1, M, M), "b": (5, M, 6)},
        (2, 5, M, 6),
    ),
    (
        helper.make_node("MatMul", ["a", "b"], ["y"]),
        {"a": _f(4), "b": _f(3, 4, 6)},
        {"a": (M,), "b": (3, M, M)},
        (3, M),
    ),
    (
        helper.make_node("Gemm", ["a", "b"], ["y"], transA=1, transB=1),
        {"a": _f(4, 3), "b": _f(5, 4)},
        {"a": (M, M), "b": (7, M)},
        (M, 7),
    ),
    (
        helper.make_node(
            "Conv", ["x", "w"], ["y"], strides=[2, 3], pads=[1, 0, 1, 2], dilations=[2, 1]
        ),
        {"x": _f(1, 3, 9, 11), "w": _f(8, 3, 3, 4)},
        {"x": (1, 3, M, M), "w": (8, 3, 3, 4)},
        # (M + 2 - 5) // 2 + 1 and (M + 2 - 4) // 3 + 1
        (1, 8, (M - 3) // 2 + 1, (M - 2) // 3 + 1),
    ),
    (
        helper.make_node("Conv", ["x", "w"], ["y"], strides=[4], auto_pad="SAME_UPPER"),
        {"x": _f(2, 3, 10), "w": _f(5, 3, 3)},
        {"x": (2, 3, M + 1), "w": (5, 3, 3)},
        (2, 5, M // 4 + 1),
    ),
    (
        helper.make_node("MaxPool", ["x"], ["y"], kernel_shape=[3], strides=[2], ceil_mode=1),
        {"x": _f(1, 2, 10)},
        {"x": (1, 2, M)},
        (1, 2, M // 2),  # ceil((M - 3) / 2) + 1
    ),
    (
        helper.make_node("GlobalAveragePool", ["x"], ["y"]),
        {"x": _f(2, 3, 4, 5)},
        {"x": (2, 3, M, M)},
        (2, 3, 1, 1),
    ),
    (
        helper.make_node("ReduceMean", ["x", "axes"], ["y"], keepdims=0),
        {"x": _f(2, 3, 4), "axes": _i(-1, 0)},
        {"x": (M, 3, M), "axes": [-1, 0]},
        (3,),
    ),
    (
        helper.make_node("Pad", ["x", "pads", "", "axes"], ["y"]),
        {"x": _f(2, 3, 4), "pads": _i(1, 2, 3, 4), "axes": _i(2, 0)},
        {"x": (M, 3, M), "pads": [1, 2, 3, 4], "axes": [2, 0]},
        (M + 6, 3, M + 4),  # axis 2 gets 1 + 3, axis 0 gets 2 + 4
    ),
    (
        helper.make_node("GatherND", ["x", "i"], ["y"], batch_dims=1),
        {"x": _f(2, 3, 4, 5), "i": np.zeros((2, 6, 2), np.int64)},
        {"x": (M, M, 4, 5), "i": (M, 6, 2)},
        (M, 6, 5),
    ),
    (
        helper.make_node("Resize", ["x", "", "scales"], ["y"], mode="nearest"),
        {"x": _f(1, 2, 3, 5), "scales": np.array([1, 1, 2.5, 0.5], np.float32)},
        {"x": (1, 2, M, M + 1), "scales": [1, 1, 2.5, 0.5]},
        (1, 2, 5 * M // 2, M // 2),
    ),
    (
        helper.make_node("Concat", ["a", "b"], ["y"], axis=-2),
        {"a": _f(2, 3, 4), "b": _f(2, 5, 4)},
        {"a": (2, M, M), "b": (2, M, M)},
        (2, 2 * M, M),
    ),
]


def _huge_lookup(declared: dict) -> _Shapes:
    shapes = {k: v for k, v in declared.items() if isinstance(v, tuple)}
    values = {k: np.array(v) for k, v in declared.items() if isinstance(v, list)}
    return _Shapes(shapes, values)


def _small_lookup(arrays: dict[str, np.ndarray]) -> _Shapes:
    return _Shapes({k: a.shape for k, a in arrays.items()}, arrays)


@pytest.mark.parametrize("case", CASES, ids=lambda case: case[0].op_type)
def test_a_rule_gives_the_shape_onnx_computes(case) -> None:
    node_proto, arrays, _, _ = case
    node = Node(0, node_proto, 18)
    rule = SHAPE_RULES[node.op_type]
    assert rule(_small_lookup(arrays), node, 0) == _reference_shape(node_proto, arrays)


@pytest.mark.parametrize("case", CASES, ids=lambda case: case[0].op_type)
def test_a_rule_on_two_to_the_40_elements_costs_nothing(case) -> None:
    """The hand-worked shape of the declared sizes, with under 64 KiB allocated."""
    node_proto, _, declared, expected = case
    node = Node(0, node_proto, 18)
    tracemalloc.start()
    try:
        found = SHAPE_RULES[node.op_type](_huge_lookup(declared), node, 0)
        _, peak = tracemalloc.get_traced_memory()
    finally:
        tracemalloc.stop()
    assert found == expected
    assert peak < 2**16


def test_broadcast_and_same_shape_rules_by_hand() -> None:
    add = Node(0, helper.make_node("Add", ["a", "b", "c"], ["y"]))
    lookup = _Shapes({"a": (M, 1, 1), "b": (1, M), "c": (3, 1, 1)})
    with pytest.raises(ValueError, match="broadcast"):
        broadcast_rule(lookup, add, 0)
    lookup.shapes["c"] = (1, 1)
    assert broadcast_rule(lookup, add, 0) == (M, 1, M)
    del lookup.shapes["c"]
    assert broadcast_rule(lookup, add, 0) is None  # one operand's shape unknown
    norm = Node(0, helper.make_node("LayerNormalization", ["a"], ["y", "mean", "inv"]))
    assert same_shape_rule(lookup, norm, 0) == (M, 1, 1)
    assert same_shape_rule(lookup, norm, 1) is None


@pytest.mark.parametrize(
    ("attrs", "outputs", "length", "sizes", "expected"),
    [
        ({}, 3, 7, None, [3, 3, 1]),
        ({"num_outputs": 4}, 4, 8, None, [2, 2, 2, 2]),
        ({"split": [1, 5]}, 2, 6, None, [1, 5]),
        ({}, 2, 6, np.array([4, 2]), [4, 2]),
        ({}, 2, M + 1, None, [M // 2 + 1, M // 2]),
    ],
)
def test_split_sizes_by_hand(attrs, outputs, length, sizes, expected) -> None:
    """Equal parts rounded up, the last one shorter (ONNX 18), or the sizes given."""
    node = Node(0, helper.make_node("Split", ["x"], [f"y{i}" for i in range(outputs)], **attrs))
    assert split_sizes(node, length, sizes) == expected


_dims = st.lists(st.integers(1, 4), min_size=1, max_size=4)
_target = st.lists(st.sampled_from([-1, 0, 1, 2, 3, 4, 6, 8, 12]), min_size=1, max_size=4)


@given(shape=_dims, target=_target, allowzero=st.booleans())
def test_reshape_target_is_onnx_reshape(
    shape: list[int], target: list[int], allowzero: bool
) -> None:
    """The same shape as ONNX's reference on drawn shapes and targets, refused where it refuses
    (its NumPy reshape raises)."""
    data = np.zeros(shape, np.float32)
    try:
        expected = reshape_reference_implementation(data, np.array(target, np.int64), allowzero)
    except (ValueError, IndexError):
        with pytest.raises(ValueError, match="Reshape"):
            reshape_target(tuple(shape), np.array(target, np.int64), allowzero=allowzero)
        return
    found = reshape_target(tuple(shape), np.array(target, np.int64), allowzero=allowzero)
    assert found == expected.shape


@given(shape=_dims, target=_target)
def test_reshape_target_scales_with_a_copied_dimension(shape: list[int], target: list[int]) -> None:
    """A first axis M times longer, copied by a leading 0: the answer's first axis is M times
    longer too, the rest unchanged, computed from numbers alone."""
    target = [0, *target]
    try:
        small = reshape_target(tuple(shape), np.array(target, np.int64), allowzero=False)
    except ValueError:
        return
    huge = reshape_target((shape[0] * M, *shape[1:]), np.array(target, np.int64), allowzero=False)
    assert huge == (small[0] * M, *small[1:])


_bound = st.one_of(st.integers(-6, 6), st.sampled_from([-(2**62), 2**62]))


@given(
    shape=_dims,
    data=st.data(),
)
def test_apply_slice_is_onnx_slice(shape: list[int], data: st.DataObject) -> None:
    """Drawn starts, ends (huge ones included), axes and steps: ONNX's reference Slice."""
    rank = len(shape)
    axes = data.draw(
        st.lists(
            st.integers(-rank, rank - 1), min_size=1, max_size=rank, unique_by=lambda a: a % rank
        )
    )
    starts = data.draw(st.lists(_bound, min_size=len(axes), max_size=len(axes)))
    ends = data.draw(st.lists(_bound, min_size=len(axes), max_size=len(axes)))
    steps = data.draw(
        st.lists(st.sampled_from([-3, -1, 1, 2]), min_size=len(axes), max_size=len(axes))
    )
    array = np.arange(int(np.prod(shape)), dtype=np.float32).reshape(shape)
    arrays = {"x": array, "s": _i(*starts), "e": _i(*ends), "a": _i(*axes), "p": _i(*steps)}
    node = helper.make_node("Slice", list(arrays), ["y"])
    inputs = [
        helper.make_tensor_value_info(n, helper.np_dtype_to_tensor_dtype(a.dtype), a.shape)
        for n, a in arrays.items()
    ]
    graph = helper.make_graph(
        [node], "g", inputs, [helper.make_tensor_value_info("y", TensorProto.FLOAT, None)]
    )
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 18)])
    (expected,) = ReferenceEvaluator(model).run(None, arrays)
    found = apply_slice(array, starts, ends, axes, steps)
    np.testing.assert_array_equal(found, expected, strict=True)


def test_apply_slice_without_bounds_is_refused() -> None:
    with pytest.raises(ValueError, match="slice bounds unknown"):
        apply_slice(np.zeros(3), None, [2])
