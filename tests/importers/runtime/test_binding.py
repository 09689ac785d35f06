"""Bound runs of one onnxruntime session (importers.runtime.binding) on the CPU: outputs equal an
unbound run, host buffers are reused by input shapes in a ring of ``reuse`` sets, and an output
whose shape changes although the inputs' did not is allocated afresh. (The CUDA path, with outputs
kept on the device, is tested in test_device_path.py where a GPU is present.)"""

from __future__ import annotations

import functools

import numpy as np
import onnxruntime as ort
import pytest
from onnx import TensorProto, helper

from oversmooth.importers.audit.session import layer_tensors
from oversmooth.importers.graph import OnnxModel
from oversmooth.importers.match import find_attention_blocks
from oversmooth.importers.runtime.binding import BoundOutputs
from oversmooth.importers.runtime.runner import Runner
from oversmooth.importers.weights import block_weights
from tests.importers.audited import builder_model_and_inputs

SEED = 3


@functools.cache
def _layers(model: OnnxModel) -> list[str]:
    blocks = [block_weights(model, block) for block in find_attention_blocks(model).blocks]
    return layer_tensors(blocks)


@pytest.fixture
def bound() -> BoundOutputs:
    """``y = x + x`` and ``z = NonZero(x)`` (its shape depends on x's values) on the CPU."""
    graph = helper.make_graph(
        [helper.make_node("Add", ["x", "x"], ["y"]), helper.make_node("NonZero", ["x"], ["z"])],
        "bound",
        [helper.make_tensor_value_info("x", TensorProto.FLOAT, ["n", 3])],
        [
            helper.make_tensor_value_info("y", TensorProto.FLOAT, ["n", 3]),
            helper.make_tensor_value_info("z", TensorProto.INT64, [2, "k"]),
        ],
    )
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)], ir_version=8)
    options = ort.SessionOptions()
    options.log_severity_level = 4  # the refused pre-allocated output is expected, not news
    session = ort.InferenceSession(
        model.SerializeToString(), options, providers=["CPUExecutionProvider"]
    )
    return BoundOutputs(session, ["y", "z"], ort.RunOptions(), False, frozenset(), ort.OrtValue)


def _expected(x: np.ndarray) -> list[np.ndarray]:
    """What the graph computes, by NumPy."""
    return [x + x, np.array(np.nonzero(x), dtype=np.int64)]


def _assert_outputs(found: list[np.ndarray], x: np.ndarray) -> None:
    for got, want in zip(found, _expected(x), strict=True):
        np.testing.assert_array_equal(got, want)


def test_two_reused_output_sets_keep_the_previous_batch_valid() -> None:
    """``reuse_outputs=2``: a batch's arrays survive the next batch's run (the audit reduces one
    batch while onnxruntime runs the next), and the two sets take turns."""
    model, inputs = builder_model_and_inputs("bert_legacy", SEED)
    layers = _layers(model)
    runner = Runner(model, expose=layers[1:2], provider="cpu")
    feeds = {name: np.concatenate([array] * 4) for name, array in inputs.feeds.items()}
    fresh = list(runner.run(feeds, batch_size=2))
    name = runner.output_names[0]
    previous, pointers = None, []
    for i, outputs in enumerate(runner.run(feeds, batch_size=2, reuse_outputs=2)):
        if previous is not None:
            np.testing.assert_array_equal(previous, fresh[i - 1][name])
        previous = outputs[name]
        pointers.append(previous.ctypes.data)
    assert len(pointers) >= 4
    assert pointers[0] != pointers[1]
    assert pointers[2:4] == pointers[0:2]


def test_a_bound_run_gives_the_outputs_in_order(bound: BoundOutputs) -> None:
    x = np.array([[1.0, 0.0, -2.0], [0.0, 3.0, 0.0]], np.float32)
    outputs = bound.run({"x": x}, 0)
    _assert_outputs(outputs, x)
    assert all(output.flags.c_contiguous for output in outputs)
    assert bound.run({"x": x}, 0)[0] is not outputs[0]  # no reuse: fresh arrays each run


def test_the_same_input_shapes_reuse_the_host_arrays(bound: BoundOutputs) -> None:
    x = np.array([[1.0, 0.0, 0.0], [0.0, 2.0, 0.0]], np.float32)
    first = bound.run({"x": x}, 1)
    pointer = first[0].ctypes.data
    second = bound.run({"x": 3.0 * x}, 1)  # same nonzeros: every output keeps its shape
    assert second[0].ctypes.data == pointer
    _assert_outputs(second, 3.0 * x)
    wider = np.ones((4, 3), np.float32)
    third = bound.run({"x": wider}, 1)  # other input shapes: arrays of their own
    _assert_outputs(third, wider)
    assert third[0].shape == (4, 3)


def test_an_output_whose_shape_changed_is_allocated_afresh(bound: BoundOutputs) -> None:
    x = np.array([[1.0, 0.0, 0.0], [0.0, 2.0, 0.0]], np.float32)
    bound.run({"x": x}, 1)
    bound.run({"x": x}, 1)  # the next run with these shapes writes into the first's arrays
    more = np.array([[1.0, 1.0, 0.0], [0.0, 2.0, 0.0]], np.float32)  # three nonzeros, not two
    _assert_outputs(bound.run({"x": more}, 1), more)
    _assert_outputs(bound.run({"x": more}, 1), more)  # and reused from there on
