"""Declared sizes are reasoned about, never allocated: the shape engine and the op table.

A graph may declare a tensor of 2^40 elements (a fixed input axis, a ConstantOfShape, Tile or
Expand on the way to the scores). The shape engine computes such shapes by arithmetic
(:mod:`oversmooth.importers.graph.shape_rules`), materialises a value only within ``max_elements``
(:mod:`oversmooth.importers.graph.ops`), and refuses a graph input it could not feed, naming it.
"""

from __future__ import annotations

from pathlib import Path

import numpy as np
import onnx
import pytest
from hypothesis import given
from hypothesis import strategies as st
from onnx import helper, numpy_helper

from oversmooth.cli import main
from oversmooth.importers.graph import Node, model_from_proto
from oversmooth.importers.graph.ops import OPS, fold
from oversmooth.importers.graph.shapes import ShapeContext
from oversmooth.importers.match import find_attention_blocks
from tests.importers.builders import assemble

SEED = 3
BIG = 2**40


def _bert() -> onnx.ModelProto:
    return assemble("bert_legacy", SEED).built.model


def fixed_axis_model(axis: int) -> onnx.ModelProto:
    """bert_legacy with axis ``axis`` of every graph input fixed at 2^40."""
    model = _bert()
    for graph_input in model.graph.input:
        dims = graph_input.type.tensor_type.shape.dim
        dims[axis].ClearField("dim_param")
        dims[axis].dim_value = BIG
    return model


def huge_intermediate_model(op: str) -> onnx.ModelProto:
    """bert_legacy whose mask term passes through a 2^40-element ``op`` and a ReduceMax back to
    its own shape before it is added to the scores: a valid graph with a huge intermediate."""
    model = _bert()
    graph = model.graph
    mask = next(
        name
        for node in graph.node
        if node.op_type == "Add"
        for name in node.input
        if any(p.op_type == "Mul" and name in p.output for p in graph.node)
    )
    dims = [BIG, 1, 1, 1, 1] if op == "Expand" else [BIG, 1, 1, 1]  # Expand broadcasts in front
    graph.initializer.append(numpy_helper.from_array(np.array(dims, np.int64), "huge_target"))
    if op == "ConstantOfShape":
        zero = numpy_helper.from_array(np.zeros(1, np.float32))
        first = helper.make_node(op, ["huge_target"], ["huge"], value=zero)
        last = helper.make_node("Add", [mask, "huge_reduced"], ["mask_poisoned"])
    else:
        first = helper.make_node(op, [mask, "huge_target"], ["huge"])
        last = helper.make_node("Identity", ["huge_reduced"], ["mask_poisoned"])
    if op == "Expand":  # back to the mask term's own shape
        graph.initializer.append(numpy_helper.from_array(np.array([0], np.int64), "front"))
        reduce = helper.make_node("ReduceMax", ["huge", "front"], ["huge_reduced"], keepdims=0)
    else:  # a (1, 1, 1, 1) term
        reduce = helper.make_node("ReduceMax", ["huge"], ["huge_reduced"], keepdims=1)
    for node in graph.node:
        if node.op_type == "Add" and mask in node.input:
            node.input[list(node.input).index(mask)] = "mask_poisoned"
    position = next(i for i, node in enumerate(graph.node) if mask in node.output)
    for offset, node in enumerate((first, reduce, last), start=1):
        graph.node.insert(position + offset, node)
    return model


@pytest.mark.parametrize("axis", [0, 1])
@pytest.mark.parametrize("command", ["inspect", "weights"])
def test_a_graph_input_declared_beyond_the_limit_is_refused_by_name(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], axis: int, command: str
) -> None:
    path = tmp_path / "big.onnx"
    onnx.save(fixed_axis_model(axis), path)
    out = [] if command == "inspect" else ["--out", str(tmp_path / "w.npz")]
    assert main([command, str(path), *out]) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1
    assert "graph input 'input_ids'" in err
    assert "OVERSMOOTH_MAX_ELEMENTS" in err
    assert "1099511627776" in err
    assert not (tmp_path / "w.npz").exists()


@pytest.mark.parametrize("op", ["ConstantOfShape", "Tile", "Expand"])
def test_a_huge_intermediate_on_the_way_to_the_scores_is_reasoned_about_not_built(op: str) -> None:
    """The blocks are matched (the huge tensor's shape is arithmetic, its value unknown)."""
    model = model_from_proto(huge_intermediate_model(op))
    report = find_attention_blocks(model)
    assert len(report.blocks) == 2
    context = ShapeContext(model.index, batch=2, sequence=6)
    shape = context.shape("huge")
    assert shape is not None
    assert shape[0] >= BIG
    if op == "ConstantOfShape":
        assert context.value("huge") is None  # within max_elements only


def _node(op: str, n_inputs: int, **attrs: object) -> Node:
    names = [f"x{i}" for i in range(n_inputs)]
    return Node(0, helper.make_node(op, names, ["y0", "y1"] if op == "Split" else ["y"], **attrs))


class _Known:
    """A lookup of fixed input shapes and values, as a ShapeContext answers a rule."""

    def __init__(self, node: Node, values: list[np.ndarray]) -> None:
        self.by_name = dict(zip(node.inputs, values, strict=True))

    def need_shape(self, name: str) -> tuple[int, ...] | None:
        return tuple(np.shape(self.by_name[name])) if name in self.by_name else None

    def need_value(self, name: str) -> np.ndarray | None:
        return self.by_name.get(name)


def _cases(draw: st.DrawFn) -> tuple[Node, list[np.ndarray]]:
    shape = tuple(draw(st.lists(st.integers(1, 4), min_size=1, max_size=4)))
    data = np.arange(int(np.prod(shape)), dtype=np.float32).reshape(shape)
    rank = len(shape)
    kind = draw(
        st.sampled_from(
            [
                "Transpose",
                "Reshape",
                "Flatten",
                "Unsqueeze",
                "Squeeze",
                "Expand",
                "Tile",
                "Gather",
                "Concat",
                "Slice",
                "ReduceSum",
                "Split",
            ]
        )
    )
    if kind == "Transpose":
        perm = draw(st.permutations(range(rank)))
        return _node(kind, 1, perm=list(perm)), [data]
    if kind == "Reshape":
        return _node(kind, 2), [data, np.array([-1], np.int64)]
    if kind == "Flatten":
        return _node(kind, 1, axis=draw(st.integers(-rank, rank))), [data]
    if kind == "Unsqueeze":
        return _node(kind, 2), [data, np.array([draw(st.integers(0, rank))], np.int64)]
    if kind == "Squeeze":
        ones = [axis for axis, dim in enumerate(shape) if dim == 1]
        return _node(kind, 2), [data, np.array(ones[:1] or [], np.int64)]
    if kind == "Expand":
        target = [
            draw(st.sampled_from([dim, 1])) if dim != 1 else draw(st.integers(1, 3))
            for dim in shape
        ]
        return _node(kind, 2), [data, np.array(target, np.int64)]
    if kind == "Tile":
        return _node(kind, 2), [data, np.array([draw(st.integers(1, 3)) for _ in shape], np.int64)]
    if kind == "Gather":
        indices = np.zeros(draw(st.lists(st.integers(1, 3), max_size=2)), np.int64)
        return _node(kind, 2, axis=draw(st.integers(0, rank - 1))), [data, indices]
    if kind == "Concat":
        return _node(kind, 2, axis=draw(st.integers(0, rank - 1))), [data, data]
    if kind == "Slice":
        axis = draw(st.integers(0, rank - 1))
        start, end = draw(st.integers(-5, 5)), draw(st.integers(-5, 5))
        return _node(kind, 4), [data, *(np.array([v], np.int64) for v in (start, end, axis))]
    if kind == "ReduceSum":
        keep = draw(st.integers(0, 1))
        axes = np.array([draw(st.integers(0, rank - 1))], np.int64)
        return _node(kind, 2, keepdims=keep), [data, axes]
    axis = draw(st.integers(0, rank - 1))
    return _node("Split", 1, axis=axis, num_outputs=2), [data]


_REDUCE = {
    "ReduceSum": lambda node, values: np.sum(
        values[0], axis=tuple(int(a) for a in values[1]), keepdims=bool(node.attr("keepdims", 1))
    )
}


@given(case=st.composite(_cases)())
def test_every_shape_rule_agrees_with_the_shape_of_its_value(case) -> None:
    """One table: an op's shape rule and its value semantics give the same shape."""
    node, values = case
    rule = OPS[node.op_type].shape
    assert rule is not None
    for output in range(len(node.outputs)):
        if node.op_type == "Split" and values[0].shape[int(node.attr("axis"))] < 2:
            continue
        reduce = _REDUCE.get(node.op_type)
        value = reduce(node, values) if reduce else fold(node, values, output)
        assert value is not None
        assert rule(_Known(node, values), node, output) == value.shape, node.op_type


def test_a_value_beyond_the_limit_is_unknown_not_built(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("OVERSMOOTH_MAX_ELEMENTS", "100")
    node = _node("ConstantOfShape", 1)
    assert fold(node, [np.array([10, 10], np.int64)]) is not None
    assert fold(node, [np.array([10, 11], np.int64)]) is None
    tile = _node("Tile", 2)
    assert fold(tile, [np.zeros((10, 10)), np.array([2, 1], np.int64)]) is None
