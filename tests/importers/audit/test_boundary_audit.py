"""The audit of a model whose layers hold a residual sub-layer before the attention (a Conformer's
half-step FFN, :mod:`oversmooth.importers.match.boundaries`): the layers are the stream between whole
layers, and what the audit measures on the stream an attention reads (the pre-norm's per-token
scale, the operating point's X, the attribution's rebuilt sublayer) reads that stream, not the
layer's input.

Tests that can fail: the layers' metrics against the NumPy forward pass; the depth step's mean
per-token scale against a recomputation on the attention's own input; the rebuilt sublayer
against the graph's tensor (it would differ by the first FFN's change were it rebuilt on the
layer); the attribution's parts against the in-graph block change.
"""

from __future__ import annotations

import numpy as np
import onnx
import pytest

from oversmooth.importers.audit.pipeline import audit
from oversmooth.importers.inputs.feeds import Inputs
from oversmooth.importers.runtime.runner import Runner
from oversmooth.simulator.metrics import hfc_lfc
from oversmooth.simulator.operating import token_inverse_scale
from tests.importers.match.test_boundaries import build
from tests.importers.stream_graphs import EPS


@pytest.fixture(scope="module")
def audited(tmp_path_factory: pytest.TempPathFactory) -> tuple:
    model, x, hidden = build("macaron")
    path = tmp_path_factory.mktemp("boundary") / "macaron.onnx"
    onnx.save(model.proto, path)
    inputs = Inputs(feeds={"x": x}, token_mask=None, labels=("a", "b"), source="test")
    result = audit(path, inputs, provider="cpu", operator_inputs=2, dominance="operating")
    return model, x, hidden, result


def test_the_layers_are_the_whole_layers_stream(audited: tuple) -> None:
    _, _, hidden, result = audited
    expected = np.array([[hfc_lfc(h[item]) for h in hidden] for item in range(2)])
    np.testing.assert_allclose(result.metrics["hfc_lfc"], expected, rtol=1e-4)


def test_the_per_token_scale_is_the_attentions_input(audited: tuple) -> None:
    model, x, hidden, result = audited
    reads = [block.attention_input_name for block in result.blocks]
    streams = Runner(model, expose=reads, provider="cpu", threads=1).collect({"x": x})
    assert result.depth is not None
    for b, row in enumerate(result.depth.per_block):
        expected = token_inverse_scale(np.asarray(streams[reads[b]], np.float64), "layernorm", EPS)
        assert row.inverse_scale_mean == pytest.approx(float(expected.mean()), rel=1e-5)
        on_layer = token_inverse_scale(hidden[b], "layernorm", EPS).mean()
        assert row.inverse_scale_mean != pytest.approx(float(on_layer), rel=1e-3)


def test_the_rebuilt_sublayer_and_the_parts(audited: tuple) -> None:
    _, _, _, result = audited
    assert {(case.block, case.input) for case in result.attribution} == {
        (b, i) for b in range(3) for i in range(2)
    }
    assert {case.block for case in result.operating} == {0, 1, 2}
    for case in result.attribution:
        assert case.reconstruction_residual < 1e-5, case
    metrics = result.metrics["hfc_lfc"]
    for b in range(3):
        for item in range(2):
            parts = [c for c in result.attribution if (c.block, c.input) == (b, item)]
            total = sum(case.delta_hfc_lfc for case in parts)
            measured = metrics[item, b + 1] - metrics[item, b]
            assert total == pytest.approx(measured, rel=1e-5, abs=1e-6), (b, item)


def test_the_notes_say_where_the_layer_begins(audited: tuple) -> None:
    _, _, _, result = audited
    texts = [note.text for note in result.notes if note.kind == "layers"]
    assert any("come before the attention inside each layer" in text for text in texts), texts
