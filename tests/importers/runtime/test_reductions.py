"""In-graph metric reductions: the statistics computed by ONNX nodes give the host-side metrics.

Each test runs one session that returns both the hidden states (exposed) and their in-graph
statistics, so both sides see the same float32 tensor; the metrics must then agree to the round-off
of a float64 Gram matrix. On every builder variant (padding masks, prefix tokens, both Gram
orientations, opsets 14 to 18, fp16 and quantised weights), on every zoo model (CPU), and on CUDA
where a CUDA session can be created (marker ``cuda``: skipped elsewhere).
"""

from __future__ import annotations

import dataclasses
import functools
import importlib
from collections.abc import Iterator
from pathlib import Path

import numpy as np
import onnx
import pytest
from numpy.testing import assert_allclose

from oversmooth.importers.audit.pipeline import audit
from oversmooth.importers.audit.session import layer_tensors
from oversmooth.importers.errors import ImporterInputError, ProviderError
from oversmooth.importers.graph import OnnxModel, load_model, model_from_proto
from oversmooth.importers.inputs.feeds import Inputs
from oversmooth.importers.inputs.sources import default_inputs
from oversmooth.importers.match import find_attention_blocks
from oversmooth.importers.runtime.reductions import MASK_INPUT, GraphExtension, plan_reductions
from oversmooth.importers.runtime.runner import Runner, open_session
from oversmooth.importers.weights import block_weights
from oversmooth.importers.zoo import get_model, models
from oversmooth.simulator.metrics import METRICS, all_metrics
from oversmooth.simulator.statistics import SPECTRAL_METRICS, metrics_from_statistics
from oversmooth.simulator.tolerances import GRAM_ATOL, GRAM_RTOL, ORT_ATOL, ORT_RTOL
from tests.importers.audited import builder_model_and_inputs
from tests.importers.builders import VARIANTS, assemble
from tests.realmodels import require_real_model

SEED = 3


@functools.cache
def _layers(model: OnnxModel) -> list[str]:
    blocks = [block_weights(model, block) for block in find_attention_blocks(model).blocks]
    return layer_tensors(blocks)


def _host_metrics(hidden: np.ndarray, keep: np.ndarray) -> dict[str, np.ndarray]:
    per_item = [all_metrics(hidden[b][keep[b]].astype(np.float64)) for b in range(len(hidden))]
    return {name: np.array([float(item[name]) for item in per_item]) for name in METRICS}


def _compared(
    model: OnnxModel,
    inputs: Inputs,
    *,
    prefix: int,
    gram: str,
    provider: str = "cpu",
    batch_size: int = 4,
) -> Iterator[tuple[int, str, np.ndarray, np.ndarray]]:
    """Yield (layer, metric, in-graph values, host values) for every batch."""
    layers = _layers(model)
    plan = plan_reductions(
        model,
        layers,
        prefix=prefix,
        masked=inputs.token_mask is not None,
        gram=gram,  # type: ignore[arg-type]
    )
    given = {spec.name for spec in model.inputs}
    runner = Runner(
        model,
        expose=[name for name in layers if name not in given],
        extension=plan.extension,
        provider=provider,  # type: ignore[arg-type]
    )
    feeds = dict(inputs.feeds)
    if inputs.token_mask is not None:
        feeds.update(plan.mask_feed(inputs.token_mask))
    start = 0
    for outputs in runner.run(feeds, batch_size=batch_size):
        for layer, name in enumerate(layers):
            hidden = outputs[name] if name in outputs else inputs.feeds[name][start:]
            hidden = hidden[: len(outputs[plan.scalars_name(layer)])]
            keep = inputs.token_mask_for(hidden.shape[1])[start : start + len(hidden)].copy()
            keep[:, :prefix] = False
            expected = _host_metrics(hidden, keep)
            got = metrics_from_statistics(plan.statistics(outputs, layer))
            for metric in METRICS:
                yield layer, metric, got[metric], expected[metric]
        start += len(hidden)


def _assert_equal(model: OnnxModel, inputs: Inputs, label: str, **options: object) -> None:
    for layer, metric, got, expected in _compared(model, inputs, **options):  # type: ignore[arg-type]
        assert_allclose(
            got, expected, rtol=GRAM_RTOL, atol=GRAM_ATOL, err_msg=f"{label}: {metric}, {layer}"
        )


@pytest.mark.parametrize("gram", ["tokens", "features"])
@pytest.mark.parametrize("prefix", [0, 1])
@pytest.mark.parametrize("name", sorted(VARIANTS))
def test_in_graph_statistics_give_the_host_metrics(name: str, prefix: int, gram: str) -> None:
    model, inputs = builder_model_and_inputs(name, SEED)
    _assert_equal(model, inputs, name, prefix=prefix, gram=gram)


@pytest.mark.parametrize("opset", [14, 17, 18])
def test_reductions_are_spelled_for_the_models_opset(opset: int) -> None:
    # ReduceSumSquare/ReduceMax take axes as an attribute below opset 18 and as an input from 18.
    model, inputs = builder_model_and_inputs("bert_legacy", SEED)
    proto = type(model.proto)()
    proto.CopyFrom(model.proto)
    for entry in proto.opset_import:
        if entry.domain in ("", "ai.onnx"):
            entry.version = opset
    relabelled = model_from_proto(proto)
    assert relabelled.opset == opset
    _assert_equal(relabelled, inputs, f"opset {opset}", prefix=1, gram="tokens")


def test_padding_never_counts() -> None:
    # Changing what sits at padded positions changes no statistic.
    model, inputs = builder_model_and_inputs("bert_legacy", SEED)
    assert inputs.token_mask is not None
    assert not inputs.token_mask.all()
    layers = _layers(model)
    plan = plan_reductions(model, layers, masked=True)
    runner = Runner(model, expose=[], extension=plan.extension, provider="cpu")
    feeds = {**inputs.feeds, **plan.mask_feed(inputs.token_mask)}
    other = dict(feeds)
    other["input_ids"] = np.where(inputs.token_mask, feeds["input_ids"], 1)
    first, second = runner.collect(feeds), runner.collect(other)
    for layer in range(1, len(layers)):  # layer 0 sits before attention mixes the tokens
        a = metrics_from_statistics(plan.statistics(first, layer))
        b = metrics_from_statistics(plan.statistics(second, layer))
        for metric in METRICS:
            assert_allclose(a[metric], b[metric], rtol=1e-5, atol=1e-6, err_msg=metric)


@pytest.mark.parametrize("gram", ["tokens", "features"])
def test_counting_every_token_skips_the_weights_bit_for_bit(gram: str) -> None:
    """Without a mask or a prefix the weights are all ones and the (B, T, D) products by them are
    left out (two per layer); every statistic and Gram matrix is bit for bit what the same graph
    gives when an all-ones mask is fed and multiplied in."""
    model, inputs = builder_model_and_inputs("vit_prenorm_layerscale", SEED)
    assert inputs.token_mask is None
    layers = _layers(model)
    given = {spec.name for spec in model.inputs}
    exposed = [name for name in layers if name not in given]
    plain = plan_reductions(model, layers, masked=False, gram=gram)  # type: ignore[arg-type]
    masked = plan_reductions(model, layers, masked=True, gram=gram)  # type: ignore[arg-type]

    def products(plan) -> int:  # type: ignore[no-untyped-def]
        return sum(node.op_type == "Mul" for node in plan.extension.nodes)

    assert products(masked) - products(plain) == 2 * len(layers)
    first = Runner(model, expose=exposed, extension=plain.extension, provider="cpu")
    second = Runner(model, expose=exposed, extension=masked.extension, provider="cpu")
    unmasked = first.collect(dict(inputs.feeds))
    ones = np.ones(unmasked[exposed[0]].shape[:2], dtype=bool)  # (B, T) of a batch-first layer
    with_mask = second.collect({**inputs.feeds, **masked.mask_feed(ones)})
    for name in plain.extension.output_names:
        np.testing.assert_array_equal(unmasked[name], with_mask[name], err_msg=name)


def _unsqueezed_packing(extension: GraphExtension) -> GraphExtension:
    """``extension`` with each layer's eight scalars packed as they were until 2026-11-28: an
    ``Unsqueeze`` per (B,) scalar to (B, 1), then one ``Concat`` along axis 1."""
    produced = {output: node for node in extension.nodes for output in node.output}
    nodes: list[onnx.NodeProto] = []
    axes = onnx.numpy_helper.from_array(np.array([1], dtype=np.int64), "test.axes")
    for node in extension.nodes:
        if node.op_type != "Transpose" or not node.output[0].endswith(".scalars"):
            nodes.append(node)
            continue
        concat = produced[produced[node.input[0]].input[0]]
        columns = [f"{name}.column" for name in concat.input]
        nodes += [
            onnx.helper.make_node("Unsqueeze", [name, "test.axes"], [column])
            for name, column in zip(concat.input, columns, strict=True)
        ]
        nodes.append(onnx.helper.make_node("Concat", columns, [node.output[0]], axis=1))
    kept = [node for node in nodes if not node.output[0].endswith((".stacked", ".by_field"))]
    initializers = (*extension.initializers, axes)
    return dataclasses.replace(extension, nodes=tuple(kept), initializers=initializers)


def test_the_scalars_are_packed_by_data_movement_alone() -> None:
    """Three nodes per layer (Concat, Reshape, Transpose) pack the eight scalars, bit for bit
    as an Unsqueeze per scalar and a Concat did (on a GPU each node costs its dispatch)."""
    model, inputs = builder_model_and_inputs("bert_legacy", SEED)
    layers = _layers(model)
    plan = plan_reductions(model, layers, masked=True, gram="tokens")
    before = _unsqueezed_packing(plan.extension)
    unsqueezes = sum(node.op_type == "Unsqueeze" for node in plan.extension.nodes)
    assert sum(node.op_type == "Unsqueeze" for node in before.nodes) == unsqueezes + 8 * len(layers)
    given = {spec.name for spec in model.inputs}
    exposed = [name for name in layers if name not in given]
    feeds = {**inputs.feeds, **plan.mask_feed(inputs.token_mask)}
    now = Runner(model, expose=exposed, extension=plan.extension, provider="cpu").collect(feeds)
    then = Runner(model, expose=exposed, extension=before, provider="cpu").collect(feeds)
    for layer in range(len(layers)):
        name = plan.scalars_name(layer)
        assert now[name].shape == (inputs.batch_size, 8)
        assert now[name].tobytes() == then[name].tobytes(), name


@pytest.mark.parametrize("gram", ["tokens", "features"])
def test_time_major_layers_are_reduced_batch_first(gram: str) -> None:
    """A (T, B, D) layer (nn.TransformerEncoder without batch_first) flagged time-major gives the
    statistics of its (B, T, D) transpose; unflagged, the same tensor gives other numbers."""
    tokens, batch, width = 5, 3, 4
    graph = onnx.helper.make_graph(
        [onnx.helper.make_node("Identity", ["x"], ["layer"])],
        "time_major",
        [onnx.helper.make_tensor_value_info("x", onnx.TensorProto.FLOAT, [tokens, batch, width])],
        [onnx.helper.make_tensor_value_info("layer", onnx.TensorProto.FLOAT, None)],
    )
    proto = onnx.helper.make_model(graph, opset_imports=[onnx.helper.make_opsetid("", 17)])
    proto.ir_version = 8  # what onnxruntime loads, whatever the installed onnx writes by default
    model = model_from_proto(proto)
    hidden = np.random.default_rng(SEED).standard_normal((tokens, batch, width)).astype(np.float32)
    batch_first = hidden.transpose(1, 0, 2)
    expected = _host_metrics(batch_first, np.ones((batch, tokens), dtype=bool))
    for flag in (True, False):
        plan = plan_reductions(model, ["layer"], gram=gram, time_major=[flag])  # type: ignore[arg-type]
        runner = Runner(model, expose=[], extension=plan.extension, provider="cpu")
        outputs = runner.collect({"x": hidden}, batch_size=tokens)
        got = metrics_from_statistics(plan.statistics(outputs, 0))
        if flag:
            for metric in METRICS:
                assert_allclose(
                    got[metric], expected[metric], rtol=GRAM_RTOL, atol=GRAM_ATOL, err_msg=metric
                )
        else:
            assert got["hfc_lfc"].shape != expected["hfc_lfc"].shape
    with pytest.raises(ImporterInputError, match="one flag per layer"):
        plan_reductions(model, ["layer"], time_major=[True, False])


def test_the_callers_graph_is_unchanged_and_names_are_checked() -> None:
    model, _ = builder_model_and_inputs("bert_legacy", SEED)
    before = model.proto.SerializeToString()
    plan = plan_reductions(model, _layers(model), masked=True)
    runner = Runner(model, expose=[], extension=plan.extension, provider="cpu")
    assert model.proto.SerializeToString() == before
    assert MASK_INPUT in {spec.name for spec in runner.inputs}
    with pytest.raises(ImporterInputError, match="gram"):
        plan_reductions(model, _layers(model), gram="rows")  # type: ignore[arg-type]
    with pytest.raises(ImporterInputError, match="prefix"):
        plan_reductions(model, _layers(model), prefix=-1)
    proto = type(model.proto)()
    proto.CopyFrom(model.proto)
    proto.graph.node.append(
        onnx.helper.make_node("Identity", ["input_ids"], ["oversmooth.reduce.0.scalars"])
    )
    with pytest.raises(ImporterInputError, match="already has a tensor"):
        plan_reductions(model_from_proto(proto), _layers(model))


# -- real models --------------------------------------------------------------------------------


@functools.cache
def _zoo(name: str) -> tuple[OnnxModel, Inputs, int]:
    model = load_model(require_real_model(name))
    entry = get_model(name)
    return model, default_inputs(model.inputs, entry), int(entry.prefix_tokens)


def _cuda_or_skip() -> None:
    tiny = assemble("bert_legacy", SEED).built.model.SerializeToString()
    try:
        open_session(tiny, "cuda")
    except ProviderError as err:
        pytest.skip(f"no CUDA here: {err}")


ZOO = [entry.name for entry in models()]


#: Every provider test runs on the CPU; the CUDA ones where CUDA works (skipped elsewhere).
PROVIDERS = ["cpu", pytest.param("cuda", marks=pytest.mark.cuda)]


@pytest.mark.realmodel
@pytest.mark.parametrize("provider", PROVIDERS)
@pytest.mark.parametrize("name", ZOO)
def test_zoo_models_in_graph_statistics_give_the_host_metrics(name: str, provider: str) -> None:
    if provider == "cuda":
        _cuda_or_skip()
    model, inputs, prefix = _zoo(name)
    _assert_equal(model, inputs, name, prefix=prefix, gram="tokens", provider=provider)


@pytest.mark.cuda
@pytest.mark.parametrize("name", sorted(VARIANTS))
def test_builder_in_graph_statistics_give_the_host_metrics_on_cuda(name: str) -> None:
    _cuda_or_skip()
    model, inputs = builder_model_and_inputs(name, SEED)
    _assert_equal(model, inputs, name, prefix=1, gram="features", provider="cuda")


@pytest.mark.cuda
@pytest.mark.realmodel
@pytest.mark.parametrize("name", ZOO)
def test_zoo_audit_on_cuda_equals_the_cpu_audit(name: str) -> None:
    # Different kernels (cuBLAS without TF32, MLAS) round differently: float32 agreement only.
    _cuda_or_skip()
    model, inputs, _ = _zoo(name)
    on_gpu = audit(model, inputs, provider="cuda", dominance="none", exclude_prefix=True)
    on_cpu = audit(model, inputs, provider="cpu", dominance="none", exclude_prefix=True)
    assert on_gpu.provider.used[0] == "CUDAExecutionProvider"
    assert on_cpu.provider.used[0] == "CPUExecutionProvider"
    for metric in METRICS:
        assert_allclose(
            on_gpu.metrics[metric],
            on_cpu.metrics[metric],
            rtol=ORT_RTOL,
            atol=ORT_ATOL,
            err_msg=f"{name}: {metric}",
        )


def test_an_audit_without_spectral_metrics_keeps_the_scalar_ones(tmp_path: Path) -> None:
    path = tmp_path / "bert.onnx"
    model, inputs = builder_model_and_inputs("bert_legacy", SEED)
    onnx.save(model.proto, path)
    full = audit(path, inputs, provider="cpu", dominance="none")
    fast = audit(path, inputs, provider="cpu", dominance="none", spectral=False)
    for metric in METRICS:
        if metric in SPECTRAL_METRICS:
            assert np.isnan(fast.metrics[metric]).all(), metric
            assert metric not in fast.config.metrics
        else:
            assert_allclose(fast.metrics[metric], full.metrics[metric], rtol=GRAM_RTOL)
    assert any("spectral=False" in note.text for note in fast.notes)


def test_reused_output_buffers_hold_each_batch_and_are_reused() -> None:
    model, inputs = builder_model_and_inputs("bert_legacy", SEED)
    layers = _layers(model)
    plan = plan_reductions(model, layers, masked=True)
    runner = Runner(model, expose=layers[1:2], extension=plan.extension, provider="cpu")
    feeds = {**inputs.feeds, **plan.mask_feed(inputs.token_mask)}
    feeds = {name: np.concatenate([array] * 4) for name, array in feeds.items()}
    size = 3  # batches of 3, 3, ..., and a smaller last one
    fresh = list(runner.run(feeds, batch_size=size))
    pointers = []
    for i, outputs in enumerate(runner.run(feeds, batch_size=size, reuse_outputs=True)):
        for name in runner.output_names:
            np.testing.assert_array_equal(outputs[name], fresh[i][name], err_msg=name)
        pointers.append(outputs[runner.output_names[0]].ctypes.data)
    assert len(pointers) == len(fresh) >= 3
    assert len(feeds["input_ids"]) % size != 0
    assert pointers[1] == pointers[0]  # same input shapes: the same host array again
    assert runner.collect(feeds, batch_size=size)[layers[1]].shape[0] == len(feeds["input_ids"])


@pytest.mark.parametrize("orientation", ["tokens", "features"])
@pytest.mark.parametrize("name", ["bert_legacy", "vit_prenorm_layerscale"])
def test_the_spectral_norm_hfc_lfc_equals_numpy_on_the_forward_pass(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, name: str, orientation: str
) -> None:
    """``--spectral-hfc``: from either Gram orientation (T×T with the token weights, D×D with
    the rows' sum), equal to simulator.metrics.hfc_lfc(X, norm="spectral") of the counted tokens;
    every other metric and layers.csv's metrics unchanged."""
    from oversmooth.simulator.metrics import hfc_lfc
    from oversmooth.simulator.statistics import SPECTRAL_NORM_METRIC
    from tests.importers.audited import real_tokens
    from tests.importers.reference import forward_trace

    session_module = importlib.import_module("oversmooth.importers.audit.session")
    monkeypatch.setattr(session_module, "_gram_orientation", lambda *args: orientation)
    assembly = assemble(name, 3)
    path = tmp_path / f"{name}.onnx"
    onnx.save(assembly.built.model, path)
    _, inputs = builder_model_and_inputs(name, SEED)
    with_norm = audit(path, inputs, provider="cpu", spectral_norm=True, exclude_prefix=1)
    plain = audit(path, inputs, provider="cpu", exclude_prefix=1)
    keep = real_tokens(assembly)
    keep[:, :1] = False  # the excluded prefix token
    for layer, hidden in enumerate(forward_trace(assembly).hidden):
        expected = [hfc_lfc(hidden[b][keep[b]], norm="spectral") for b in range(len(hidden))]
        assert_allclose(
            with_norm.metrics[SPECTRAL_NORM_METRIC][:, layer],
            expected,
            rtol=ORT_RTOL,
            atol=ORT_ATOL,
        )
    for metric in METRICS:
        np.testing.assert_array_equal(with_norm.metrics[metric], plain.metrics[metric])
    assert SPECTRAL_NORM_METRIC not in plain.metrics
