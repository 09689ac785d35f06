"""One node run by ONNX's own implementation (:mod:`oversmooth.importers.graph.reference`): every
output, the op as its opset defines it, None where there is no implementation, a refusal as a
ValueError naming the node, and an op's overflow returned as its value, not raised.

That the values are onnxruntime's, op by op, is ``test_ops`` (through the op table's ``fold``).
"""

from __future__ import annotations

import numpy as np
import pytest
from onnx import helper

from oversmooth.importers.graph import Node
from oversmooth.importers.graph.reference import reference_outputs

F32, I64 = np.float32, np.int64


def _node(op: str, inputs: list[str], outputs: list[str], opset: int, **attrs) -> Node:
    return Node(0, helper.make_node(op, inputs, outputs, name=f"my_{op}", **attrs), opset)


def test_every_output_of_a_node_is_returned() -> None:
    """Split of 7 into 3, 3 and 1 (opset 18's num_outputs), each output numpy's."""
    data = np.arange(14, dtype=F32).reshape(2, 7)
    node = _node("Split", ["x"], ["a", "b", "c"], 18, axis=1, num_outputs=3)
    outputs = reference_outputs(node, [data])
    assert outputs is not None
    assert len(outputs) == 3
    for found, expected in zip(outputs, np.split(data, [3, 6], axis=1), strict=True):
        np.testing.assert_array_equal(found, expected, strict=True)


def test_the_op_is_the_one_its_opset_defines() -> None:
    """Clip's bounds are attributes at opset 6 and inputs from 11: the same bounds either way."""
    data = np.array([-5.0, -1.0, 0.5, 4.0], F32)
    old = _node("Clip", ["x"], ["y"], 6, min=-2.0, max=1.0)
    new = _node("Clip", ["x", "lo", "hi"], ["y"], 11)
    expected = np.array([-2.0, -1.0, 0.5, 1.0], F32)
    (found_old,) = reference_outputs(old, [data])
    (found_new,) = reference_outputs(new, [data, np.array(-2.0, F32), np.array(1.0, F32)])
    np.testing.assert_array_equal(found_old, expected, strict=True)
    np.testing.assert_array_equal(found_new, expected, strict=True)


def test_a_reduction_reads_its_axes_as_its_opset_says() -> None:
    """ReduceSum's axes: an attribute at opset 11, an input at 13."""
    data = np.arange(6, dtype=F32).reshape(2, 3)
    (old,) = reference_outputs(_node("ReduceSum", ["x"], ["y"], 11, axes=[1], keepdims=0), [data])
    (new,) = reference_outputs(
        _node("ReduceSum", ["x", "axes"], ["y"], 13, keepdims=0), [data, np.array([1], I64)]
    )
    np.testing.assert_array_equal(old, np.array([3.0, 12.0], F32), strict=True)
    np.testing.assert_array_equal(new, old, strict=True)


@pytest.mark.parametrize("op", ["NoSuchOp", "FusedMatMul"])
def test_an_op_with_no_implementation_has_none(op: str) -> None:
    node = _node(op, ["a", "b"], ["y"], 17)
    assert reference_outputs(node, [np.ones((2, 2), F32), np.ones((2, 2), F32)]) is None


def test_a_refusal_is_a_value_error_naming_the_node() -> None:
    node = _node("MatMul", ["a", "b"], ["y"], 17)
    with pytest.raises(ValueError, match=r"^MatMul 'my_MatMul': ") as raised:
        reference_outputs(node, [np.ones((2, 3), F32), np.ones((4, 2), F32)])
    assert raised.value.__cause__ is not None


def test_an_op_that_outputs_no_tensor_is_refused() -> None:
    node = _node("SequenceConstruct", ["a", "b"], ["s"], 17)
    with pytest.raises(ValueError, match="does not output tensors"):
        reference_outputs(node, [np.ones(2, F32), np.ones(3, F32)])


@pytest.mark.usefixtures("strict_fp")
def test_an_ops_overflow_is_its_value_not_an_error() -> None:
    """Under floating-point errors raised (the ``strict_fp`` fixture), 1/0 and log(0) are still
    the values onnxruntime gives: inf and -inf."""
    (quotient,) = reference_outputs(
        _node("Div", ["a", "b"], ["y"], 17), [np.ones(2, F32), np.zeros(2, F32)]
    )
    (log,) = reference_outputs(_node("Log", ["x"], ["y"], 17), [np.zeros(2, F32)])
    np.testing.assert_array_equal(quotient, np.full(2, np.inf, F32), strict=True)
    np.testing.assert_array_equal(log, np.full(2, -np.inf, F32), strict=True)
