"""The onnxruntime runner: exposed intermediate tensors, batching, providers, bad feeds."""

from __future__ import annotations

import re
from pathlib import Path

import numpy as np
import onnx
import pytest
from onnx import TensorProto, helper, numpy_helper

from oversmooth.importers.errors import FeedError, ProviderError, RunnerError
from oversmooth.importers.graph import load_model, model_from_proto
from oversmooth.importers.inputs.sources import bundled_inputs
from oversmooth.importers.runtime.runner import Runner, cuda_failure_reason, plain_session
from oversmooth.simulator import tolerances as tol
from oversmooth.simulator.attention import layer_norm
from oversmooth.simulator.errors import InputError
from tests.realmodels import require_real_model

D_MODEL = 8
LN_EPS = 1e-5


def _tiny_weights(rng: np.random.Generator) -> dict[str, np.ndarray]:
    return {
        "gamma": rng.normal(1.0, 0.3, D_MODEL).astype(np.float32),
        "beta": rng.normal(0.0, 0.3, D_MODEL).astype(np.float32),
        "W": (rng.standard_normal((D_MODEL, D_MODEL)) / np.sqrt(D_MODEL)).astype(np.float32),
    }


def _tiny_model(weights: dict[str, np.ndarray]) -> onnx.ModelProto:
    """x → LayerNormalization → MatMul W → Add(x, ·) residual → Relu → y (pre-LN block shape)."""
    nodes = [
        helper.make_node(
            "LayerNormalization", ["x", "gamma", "beta"], ["ln"], axis=-1, epsilon=LN_EPS
        ),
        helper.make_node("MatMul", ["ln", "W"], ["proj"]),
        helper.make_node("Add", ["x", "proj"], ["resid"]),
        helper.make_node("Relu", ["resid"], ["y"]),
    ]
    graph = helper.make_graph(
        nodes,
        "tiny_block",
        [helper.make_tensor_value_info("x", TensorProto.FLOAT, ["batch", "tokens", D_MODEL])],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, ["batch", "tokens", D_MODEL])],
        initializer=[numpy_helper.from_array(array, name) for name, array in weights.items()],
    )
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])
    model.ir_version = 8
    onnx.checker.check_model(model)
    return model


def _reference(x: np.ndarray, weights: dict[str, np.ndarray]) -> dict[str, np.ndarray]:
    """float64 recomputation of the tiny block."""
    ln = layer_norm(x.astype(np.float64), weights["gamma"], weights["beta"], eps=LN_EPS)
    resid = x + ln @ weights["W"].astype(np.float64)
    return {"ln": ln, "resid": resid, "y": np.maximum(resid, 0.0)}


@pytest.fixture
def tiny(tmp_path: Path, rng: np.random.Generator):
    """(path, weights, x) of the tiny block, saved as a single file."""
    weights = _tiny_weights(rng)
    path = tmp_path / "tiny.onnx"
    onnx.save(_tiny_model(weights), path)
    x = rng.standard_normal((5, 7, D_MODEL)).astype(np.float32)
    return path, weights, x


def _assert_float32_close(actual: np.ndarray, expected: np.ndarray, what: str) -> None:
    np.testing.assert_allclose(
        actual, expected, rtol=tol.FLOAT32_RTOL, atol=tol.FLOAT32_ATOL, err_msg=what
    )


def test_exposed_tensors_match_numpy_recomputation(tiny) -> None:
    path, weights, x = tiny
    runner = Runner(load_model(path), expose=["ln", "resid"], provider="cpu", threads=1)
    assert runner.output_names == ["ln", "resid"]
    outputs = runner.collect({"x": x})
    expected = _reference(x, weights)
    assert set(outputs) == {"ln", "resid"}
    for name in ("ln", "resid"):
        assert outputs[name].dtype == np.float32
        _assert_float32_close(outputs[name], expected[name], name)


def test_include_outputs_appends_original_outputs(tiny) -> None:
    path, weights, x = tiny
    runner = Runner(load_model(path), expose=["ln"], include_outputs=True, provider="cpu")
    assert runner.output_names == ["ln", "y"]
    outputs = runner.collect({"x": x})
    _assert_float32_close(outputs["y"], _reference(x, weights)["y"], "y")


def test_batches_equal_one_big_batch(tiny) -> None:
    path, _, x = tiny
    runner = Runner(load_model(path), expose=["ln", "resid"], provider="cpu")
    whole = runner.collect({"x": x})
    pieces = list(runner.run({"x": x}, batch_size=2))
    assert [piece["ln"].shape[0] for piece in pieces] == [2, 2, 1]
    for name in ("ln", "resid"):
        joined = np.concatenate([piece[name] for piece in pieces])
        np.testing.assert_allclose(
            joined, whole[name], rtol=tol.ORT_REPEAT_RTOL, atol=tol.ORT_REPEAT_ATOL
        )


def test_external_data_model_runs_and_leaves_no_temporary_file(tmp_path: Path, tiny) -> None:
    _, weights, x = tiny
    folder = tmp_path / "external"
    folder.mkdir()
    path = folder / "tiny_ext.onnx"
    onnx.save(
        _tiny_model(weights),
        path,
        save_as_external_data=True,
        all_tensors_to_one_file=True,
        location="tiny_ext.data",
        size_threshold=0,
    )
    before = sorted(p.name for p in folder.iterdir())
    assert before == ["tiny_ext.data", "tiny_ext.onnx"]
    runner = Runner(load_model(path), expose=["resid"], provider="cpu")
    outputs = runner.collect({"x": x})
    assert sorted(p.name for p in folder.iterdir()) == before
    _assert_float32_close(outputs["resid"], _reference(x, weights)["resid"], "resid")


def test_bad_feeds_list_the_model_inputs(tiny) -> None:
    path, _, x = tiny
    runner = Runner(load_model(path), expose=["ln"], provider="cpu")
    expected = "x: float32 [batch, tokens, 8]"
    with pytest.raises(FeedError, match=re.escape(expected)):
        next(runner.run({"x": x.astype(np.float64)}))
    with pytest.raises(FeedError, match=r"axis 2 must be 8"):
        next(runner.run({"x": x[..., :4]}))
    with pytest.raises(FeedError, match="missing feed"):
        next(runner.run({"input": x}))


def test_unknown_exposed_name_is_a_clear_error(tiny) -> None:
    path, _, _ = tiny
    with pytest.raises(InputError, match=r"got 'lnn', which no node produces \(closest: ln"):
        Runner(load_model(path), expose=["lnn"], provider="cpu")
    with pytest.raises(InputError, match="list of tensor names"):
        Runner(load_model(path), expose="ln", provider="cpu")  # type: ignore[arg-type]


@pytest.mark.parametrize(
    ("kwargs", "message"),
    [
        ({"provider": "tpu"}, "`provider` must be one of auto, cpu, cuda; got 'tpu'"),
        ({"threads": 0}, "`threads` must be a positive integer or None; got 0"),
        ({"optimization": "max"}, "`optimization` must be one of disable, basic"),
    ],
)
def test_bad_options_are_named(tiny, kwargs: dict, message: str) -> None:
    path, _, _ = tiny
    with pytest.raises(InputError, match=re.escape(message)):
        Runner(load_model(path), expose=["ln"], **kwargs)


def test_an_in_memory_model_runs_and_is_left_unchanged(tiny) -> None:
    path, _, x = tiny
    model = model_from_proto(onnx.load(path))
    before = model.proto.SerializeToString()
    runner = Runner(model, expose=["ln"], provider="cpu")
    assert runner.provenance()["model"] is None
    assert runner.collect({"x": x})["ln"].shape == x.shape
    assert model.proto.SerializeToString() == before


def test_bad_batch_size(tiny) -> None:
    path, _, x = tiny
    runner = Runner(load_model(path), expose=["ln"], provider="cpu")
    with pytest.raises(InputError, match="`batch_size` must be a positive integer"):
        next(runner.run({"x": x}, batch_size=0))


def test_provenance_records_every_session_option(tiny) -> None:
    path, _, _ = tiny
    runner = Runner(
        load_model(path), expose=["ln"], provider="cpu", threads=1, optimization="basic"
    )
    record = runner.provenance()
    assert record["provider_requested"] == "cpu"
    assert record["provider_used"] == ["CPUExecutionProvider"]
    assert record["exposed"] == ["ln"]
    options = record["session_options"]
    assert options["intra_op_num_threads"] == 1
    assert options["session.intra_op.allow_spinning"] == "0"
    assert options["graph_optimization_level"] == "ORT_ENABLE_BASIC"
    assert record["onnxruntime"]


def test_cpu_provider_runs_on_cpu(tiny) -> None:
    path, _, _ = tiny
    runner = Runner(load_model(path), expose=["ln"], provider="cpu")
    assert runner.provider_used == ["CPUExecutionProvider"]


def _cuda_session_works(path: Path) -> bool:
    """Whether this machine can really run a CUDA session (not merely list the provider)."""
    return (
        "CUDAExecutionProvider" in plain_session(load_model(path), provider="auto").get_providers()
    )


def test_auto_provider_reports_what_runs_and_why(tiny) -> None:
    path, _, x = tiny
    runner = Runner(load_model(path), expose=["ln"], provider="auto")
    assert runner.provider_used == list(runner.session.get_providers())
    assert runner.provider_note
    if runner.provider_used[0] == "CPUExecutionProvider":
        assert "using the CPU" in runner.provider_note
    assert runner.collect({"x": x})["ln"].shape == x.shape


def test_cuda_requested_but_unavailable_is_a_clear_error(tiny) -> None:
    path, weights, x = tiny
    if _cuda_session_works(path):
        runner = Runner(load_model(path), expose=["ln"], provider="cuda")
        assert runner.provider_used[0] == "CUDAExecutionProvider"
        assert runner.provenance()["io_binding"]
        _assert_float32_close(
            runner.collect({"x": x})["ln"], _reference(x, weights)["ln"], "ln on CUDA"
        )
        return
    with pytest.raises(ProviderError, match="`provider` cuda"):
        Runner(load_model(path), expose=["ln"], provider="cuda")


def test_provider_failure_leaves_stderr_alone(tiny, capfd: pytest.CaptureFixture[str]) -> None:
    path, _, _ = tiny
    Runner(load_model(path), expose=["ln"], provider="auto")
    captured = capfd.readouterr()
    assert captured.out == ""
    assert captured.err == ""


def testcuda_failure_reason_is_extracted_from_the_log() -> None:
    log = [
        "\x1b[1;31m2026 [E:onnxruntime:Default, provider_bridge_ort.cc:1] Failed to load library "
        "libonnxruntime_providers_cuda.so with error: libcublasLt.so.13: cannot open shared "
        "object file\x1b[m",
        "[W:onnxruntime:Default] Failed to create CUDAExecutionProvider.",
    ]
    assert cuda_failure_reason(log) == "libcublasLt.so.13: cannot open shared object file"
    assert cuda_failure_reason([]) == "onnxruntime gave no reason"


def test_plain_session_keeps_original_outputs(tiny) -> None:
    path, weights, x = tiny
    session = plain_session(load_model(path), provider="cpu", threads=1)
    assert [output.name for output in session.get_outputs()] == ["y"]
    (y,) = session.run(None, {"x": x})
    _assert_float32_close(y, _reference(x, weights)["y"], "plain y")


# --- the real paraphrase-MiniLM-L3 -------------------------------------------------------------


@pytest.mark.realmodel
def test_real_minilm_l3_exposed_layernorm_and_add_outputs() -> None:
    path = require_real_model("minilm-l3")
    graph = onnx.load(path, load_external_data=False).graph
    norms = [node.output[0] for node in graph.node if node.op_type == "LayerNormalization"]
    adds = [node.output[0] for node in graph.node if node.op_type == "Add"][:6]
    runner = Runner(load_model(path), expose=[*norms, *adds], provider="cpu")
    text = bundled_inputs("text", graph=runner.inputs)
    batch = text.subset(slice(0, 4))
    outputs = runner.collect(batch, batch_size=3)
    assert len(norms) == 7
    lengths = batch.feeds["attention_mask"].sum(axis=1)
    for name in norms:
        hidden = outputs[name]
        assert hidden.shape == (*batch.feeds["input_ids"].shape, 384)
        assert hidden.dtype == np.float32
        assert np.all(np.isfinite(hidden))
    # The last LayerNorm is the graph's own last hidden state, exposed as `onnx::Shape_422`.
    plain = plain_session(load_model(path), provider="cpu")
    (last,) = plain.run(["onnx::Shape_422"], batch.feeds)
    for item, length in enumerate(lengths):
        np.testing.assert_allclose(
            outputs[norms[-1]][item, :length],
            last[item, :length],
            rtol=tol.ORT_REPEAT_RTOL,
            atol=tol.ORT_REPEAT_ATOL,
        )


@pytest.mark.realmodel
def test_real_minilm_l3_layernorm_output_is_layernorm_of_its_input() -> None:
    """The exposed LayerNorm output equals LN (float64, ONNX semantics) of its exposed input."""
    path = require_real_model("minilm-l3")
    model = onnx.load(path)
    node = next(node for node in model.graph.node if node.op_type == "LayerNormalization")
    weights = {init.name: numpy_helper.to_array(init) for init in model.graph.initializer}
    eps = next((attr.f for attr in node.attribute if attr.name == "epsilon"), 1e-5)
    runner = Runner(load_model(path), expose=[node.input[0], node.output[0]], provider="cpu")
    batch = bundled_inputs("text", graph=runner.inputs).subset([0, 9])
    outputs = runner.collect(batch)
    expected = layer_norm(
        outputs[node.input[0]].astype(np.float64),
        weights[node.input[1]],
        weights[node.input[2]],
        eps=eps,
    )
    np.testing.assert_allclose(
        outputs[node.output[0]], expected, rtol=tol.ORT_RTOL, atol=tol.ORT_ATOL
    )


def test_a_failed_run_names_the_items_and_the_shapes_fed() -> None:
    """A graph that fixes a length its inputs do not have (ESM's legacy export fixes its rotary
    table at the traced length) fails in onnxruntime; the error says what was fed (the batch's,
    as its inputs fail alone too)."""
    graph = helper.make_graph(
        [helper.make_node("Add", ["x", "table"], ["y"])],
        "fixed_length",
        [helper.make_tensor_value_info("x", TensorProto.FLOAT, ["batch", "tokens"])],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, ["batch", "tokens"])],
        [numpy_helper.from_array(np.zeros(8, dtype=np.float32), "table")],
    )
    proto = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)], ir_version=8)
    runner = Runner(model_from_proto(proto), expose=["y"], provider="cpu", threads=1)
    assert runner.collect({"x": np.zeros((2, 8), np.float32)})["y"].shape == (2, 8)
    with pytest.raises(
        RunnerError, match=r"^onnxruntime failed on items 0-1 \(fed x \[2, 16\]\): "
    ):  # retried one input per call, which fails too: the batch's error stands
        runner.collect({"x": np.zeros((2, 16), np.float32)})
    assert runner.one_per_call.note == ""
