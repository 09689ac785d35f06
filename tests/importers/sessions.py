"""Test helper: the models onnxruntime is given while a test runs (what an audit really runs)."""

from __future__ import annotations

import onnx
import pytest

from oversmooth.importers.run import runner as runner_module


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
