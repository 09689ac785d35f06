"""Loading a model (:mod:`oversmooth.importers.graph.load`): the graph inputs a caller feeds (fixed,
symbolic and unknown dims; initializers excluded) and their one-line description, the name of a
loaded or in-memory model, the opset onnxruntime runs, and the refusals of an in-memory model that
is not ONNX, has no nodes, no default domain, or an initializer its graph input contradicts.

Hostile files (missing, empty, truncated, random bytes, unsupported opsets, external data outside
the folder) are ``tests/importers/test_hostile.py``; old opsets ``test_old_opsets``.
"""

from __future__ import annotations

from pathlib import Path

import numpy as np
import onnx
import pytest
from onnx import TensorProto, helper

from oversmooth.importers.errors import ModelFileError, UnsupportedModelError
from oversmooth.importers.graph import GraphInput, load_model
from oversmooth.importers.graph.load import SUPPORTED_OPSETS, model_from_proto

F = TensorProto.FLOAT


def _identity_model(
    opset: int = 17, *, name: str = "g", dims: list | None = None
) -> onnx.ModelProto:
    """``y = Identity(x)`` for one float input ``x`` of ``dims``."""
    graph = helper.make_graph(
        [helper.make_node("Identity", ["x"], ["y"])],
        name,
        [helper.make_tensor_value_info("x", F, dims if dims is not None else [2, 3])],
        [helper.make_tensor_value_info("y", F, None)],
    )
    return helper.make_model(graph, opset_imports=[helper.make_opsetid("", opset)], ir_version=8)


def _only_custom_domain(model: onnx.ModelProto) -> None:
    """Every node, and the one domain imported, are ``com.example``."""
    model.opset_import[0].CopyFrom(helper.make_opsetid("com.example", 1))
    for node in model.graph.node:
        node.domain = "com.example"


# Moved from tests/importers/inputs/test_sources.py.
def test_model_inputs_read_names_dtypes_and_symbolic_dims(tmp_path: Path) -> None:
    import onnx
    from onnx import TensorProto, helper

    ids = helper.make_tensor_value_info("ids", TensorProto.INT64, ["batch", "seq"])
    weight = helper.make_tensor_value_info("w", TensorProto.FLOAT, [4])
    out = helper.make_tensor_value_info("y", TensorProto.INT64, ["batch", "seq"])
    graph = helper.make_graph(
        [helper.make_node("Identity", ["ids"], ["y"])],
        "g",
        [ids, weight],
        [out],
        initializer=[helper.make_tensor("w", TensorProto.FLOAT, [4], [0.0] * 4)],
    )
    path = tmp_path / "m.onnx"
    onnx.save(helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)]), path)
    assert load_model(path).inputs == (GraphInput("ids", np.dtype(np.int64), ("batch", "seq")),)


def test_a_dim_with_neither_value_nor_name_reads_as_unknown() -> None:
    """A fixed dim is its int, a named one its name, an empty one None (shown ``?``)."""
    model = _identity_model(dims=[4, "seq", None])
    (found,) = model_from_proto(model).inputs
    assert found == GraphInput("x", np.dtype(np.float32), (4, "seq", None))
    assert found.describe() == "x: float32 [4, seq, ?]"


def test_a_cache_input_describes_the_axis_fed_empty() -> None:
    entry = GraphInput("past_key", np.dtype(np.float16), ("b", 2, "p", 8), past_axis=2)
    assert entry.describe() == "past_key: float16 [b, 2, p, 8] (KV cache: axis 2 fed empty)"


def test_a_loaded_model_is_named_by_its_file_an_in_memory_one_by_its_graph(tmp_path: Path) -> None:
    path = tmp_path / "tiny.onnx"
    onnx.save(_identity_model(name="graph-name"), path)
    loaded = load_model(path)
    assert (loaded.name, loaded.path) == ("tiny.onnx", path)
    assert model_from_proto(_identity_model(name="graph-name")).name == "graph-name"
    assert model_from_proto(_identity_model(name="")).name == "<model>"


@pytest.mark.parametrize("opset", [SUPPORTED_OPSETS[0], 11, 13, SUPPORTED_OPSETS[1]])
def test_the_session_opset_is_the_one_the_running_graph_imports(opset: int) -> None:
    """The opset onnxruntime runs is the file's own: an old model runs as shipped (``source``),
    a current one as read; the graph the matcher reads is never older than opset 13."""
    model = model_from_proto(_identity_model(opset))
    session = model.session_model()
    imported = {entry.domain: entry.version for entry in session.opset_import}
    assert model.opset == opset
    assert model.session_opset == imported[""] == opset
    assert (session is model.proto) == (opset >= 13)
    assert {e.domain: e.version for e in model.proto.opset_import}[""] >= 13


def test_the_callers_proto_is_left_as_it_was() -> None:
    """Reading an old model converts it; the proto given is not touched."""
    original = _identity_model(9)
    before = original.SerializeToString()
    model_from_proto(original)
    assert original.SerializeToString() == before


@pytest.mark.parametrize(
    ("mutate", "error", "message"),
    [
        (lambda m: m.ClearField("graph"), ModelFileError, "the model has no graph"),
        (lambda m: setattr(m, "ir_version", 0), ModelFileError, "no graph, IR version"),
        (lambda m: m.graph.ClearField("node"), ModelFileError, "graph with nodes; the model"),
        (_only_custom_domain, UnsupportedModelError, "imports only ['com.example']"),
    ],
    ids=["no-graph", "no-ir-version", "no-nodes", "no-default-domain"],
)
def test_an_in_memory_model_that_is_not_one_is_refused(mutate, error, message) -> None:
    """Without a path the message speaks of "the model"; no traceback of onnx's own."""
    model = _identity_model()
    mutate(model)
    with pytest.raises(error) as caught:
        model_from_proto(model)
    assert message in str(caught.value)
    assert "\n" not in str(caught.value)


def test_an_initializer_its_graph_input_contradicts_is_refused(tmp_path: Path) -> None:
    """A graph input ``w`` declared int64 over a float initializer ``w``: onnxruntime refuses
    it, so does the loader, naming both data types."""
    model = _identity_model()
    model.graph.input.append(helper.make_tensor_value_info("w", TensorProto.INT64, [2]))
    model.graph.initializer.append(helper.make_tensor("w", F, [2], [1.0, 2.0]))
    path = tmp_path / "contradicted.onnx"
    onnx.save(model, path)
    with pytest.raises(ModelFileError, match=r"'w' has data type 1 but .* declares 7"):
        load_model(path)
