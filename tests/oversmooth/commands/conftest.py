"""Fixtures of the command tests (tests/oversmooth/commands/)."""

from __future__ import annotations

import onnx
import pytest

from tests.importers.builders import VARIANTS


@pytest.fixture
def variant_file(tmp_path):
    """Save a builder variant to disk; returns (path, Built)."""

    def save(name: str):
        built = VARIANTS[name](0)
        path = tmp_path / f"{name}.onnx"
        onnx.save(built.model, path)
        return path, built

    return save
