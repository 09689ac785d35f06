"""Test helper: the models onnxruntime is given while a test runs (what an audit really runs)."""

from __future__ import annotations

import numpy as np
import onnx
import onnxruntime as ort
import pytest

from oversmooth.importers.runtime import runner as runner_module


def captured_sessions(monkeypatch: pytest.MonkeyPatch) -> list[onnx.ModelProto]:
    """The models onnxruntime is given from now on (parsed from the bytes it receives)."""
    captured: list[onnx.ModelProto] = []
    real = runner_module._open_session

    def spy(ort_module, model, *args, **kwargs):
        captured.append(
            onnx.load_from_string(model) if isinstance(model, bytes) else onnx.load(model)
        )
        return real(ort_module, model, *args, **kwargs)

    monkeypatch.setattr(runner_module, "_open_session", spy)
    return captured


def run_unoptimised(proto: onnx.ModelProto, feeds: dict[str, np.ndarray]) -> list[np.ndarray]:
    """Every output of ``proto`` on ``feeds``: onnxruntime's CPU provider, one thread, no graph
    optimisation (so a fused operator runs as its own kernel, a defused graph node by node)."""
    options = ort.SessionOptions()
    options.graph_optimization_level = ort.GraphOptimizationLevel.ORT_DISABLE_ALL
    options.intra_op_num_threads = 1
    session = ort.InferenceSession(
        proto.SerializeToString(), options, providers=["CPUExecutionProvider"]
    )
    return session.run(None, feeds)
