"""Layout ops replayed on the numeric probe (:func:`oversmooth.importers.match.layout_ops.apply_layout`):
numpy's answer for each layout op, a named reason for an operand it could not evaluate, and the op
table's size guard for one that would grow past the limit.
"""

from __future__ import annotations

import numpy as np
import pytest
from onnx import helper

from oversmooth.importers.graph import Node
from oversmooth.importers.match.layout_ops import apply_layout

I64 = np.int64
BIG = 2**40
#: A probe whose entries are all distinct, so any misplaced entry shows.
PROBE = np.arange(2 * 3 * 4, dtype=np.float64).reshape(2, 3, 4)


def _node(op: str, inputs: list[str], outputs: int = 1, opset: int = 17, **attrs) -> Node:
    names = [f"y{i}" for i in range(outputs)]
    return Node(0, helper.make_node(op, inputs, names, **attrs), opset)


@pytest.mark.parametrize(
    ("node", "values", "output", "expected"),
    [
        (_node("Transpose", ["x"], perm=[2, 0, 1]), [], 0, PROBE.transpose(2, 0, 1)),
        (_node("Reshape", ["x", "s"]), [np.array([0, 6, -1], I64)], 0, PROBE.reshape(2, 6, 2)),
        (_node("Flatten", ["x"], axis=2), [], 0, PROBE.reshape(6, 4)),
        (_node("Unsqueeze", ["x", "a"]), [np.array([1], I64)], 0, PROBE[:, None]),
        (
            _node("Split", ["x", "s"], outputs=2, axis=2),
            [np.array([1, 3], I64)],
            1,
            PROBE[:, :, 1:],
        ),
        (
            _node("Gather", ["x", "i"], axis=1),
            [np.array([2, 0], I64)],
            0,
            PROBE[:, [2, 0]],
        ),
        (_node("Expand", ["x", "s"]), [np.array([2, 2, 3, 4], I64)], 0, np.stack([PROBE] * 2)),
        (_node("Tile", ["x", "r"]), [np.array([1, 1, 2], I64)], 0, np.tile(PROBE, (1, 1, 2))),
    ],
    ids=lambda v: v.op_type if isinstance(v, Node) else "",
)
def test_a_layout_op_moves_the_probe_as_numpy_does(
    node: Node, values: list, output: int, expected: np.ndarray
) -> None:
    found = apply_layout(node, PROBE, values, output)
    np.testing.assert_array_equal(found, expected, strict=True)


@pytest.mark.parametrize("op", ["Add", "Softmax", "MatMul", "NoSuchOp"])
def test_an_op_that_is_not_a_layout_op_is_refused(op: str) -> None:
    """Only ops that move entries may be replayed: an Add on the probe would change the codes."""
    with pytest.raises(ValueError, match=rf"^{op} is not a layout op$"):
        apply_layout(_node(op, ["x", "b"]), PROBE, [np.ones(4)], 0)


# Moved from tests/importers/graph/test_ops.py.
def test_the_layout_probe_is_refused_by_the_same_guard() -> None:
    node = Node(0, helper.make_node("Expand", ["x", "shape"], ["y"]), 17)
    with pytest.raises(ValueError, match="exceed the size limit"):
        apply_layout(node, np.zeros((1, 1)), [np.array([BIG, 1], I64)], 0)


# Moved from tests/importers/graph/test_shapes.py.
@pytest.mark.parametrize("op", ["Reshape", "Expand", "Tile", "Gather", "GatherND"])
def test_a_layout_op_whose_shape_operand_is_unknown_is_named(op: str) -> None:
    """The head-layout probe names the operand it could not evaluate (Cohere's optimised GQA
    ``Expand`` read a run-time shape: an internal TypeError had leaked into the reason)."""
    node = Node(0, helper.make_node(op, ["x", "operand"], ["y"]))
    with pytest.raises(ValueError, match=rf"^the {op} .* could not be evaluated$"):
        apply_layout(node, np.zeros((2, 3)), [None], 0)


@pytest.mark.parametrize(
    ("node", "values", "name"),
    [
        (_node("Slice", ["x", "starts", "ends"]), [np.array([0], I64), None], "ends"),
        (
            _node("Slice", ["x", "starts", "ends", "axes"]),
            [None, np.array([1], I64), None],
            "starts",
        ),
        (_node("Split", ["x", "sizes"], outputs=2, axis=2), [None], "sizes"),
    ],
    ids=["Slice-ends", "Slice-starts", "Split-sizes"],
)
def test_a_slice_or_split_whose_bounds_are_unknown_names_the_operand(
    node: Node, values: list, name: str
) -> None:
    """Bounds given as inputs (opset 10+ Slice, opset 13+ Split) that could not be evaluated are
    named in the reason, not left to the evaluator's own message about a None."""
    with pytest.raises(
        ValueError, match=rf"^the {node.op_type} operand '{name}' could not be evaluated$"
    ):
        apply_layout(node, PROBE, values, 0)


def test_an_omitted_optional_operand_is_not_unknown() -> None:
    """A Slice without axes or steps (empty names) replays with their defaults."""
    node = _node("Slice", ["x", "starts", "ends", "", ""])
    found = apply_layout(node, PROBE, [np.array([1], I64), np.array([2], I64), None, None], 0)
    np.testing.assert_array_equal(found, PROBE[1:2], strict=True)
