"""The family fixture corpus (docs/fixtures.md): its manifest and its xz-compressed ONNX files.

The fixtures are stored as ``<family>/<variant>.onnx.xz`` to keep the corpus small (float weights
compress little, but an export's node names, constant nodes and value infos compress about 2:1);
``xz -dk`` gives back the exporter's file byte for byte.
"""

from __future__ import annotations

import json
import lzma
from pathlib import Path
from typing import Any

import onnx

from oversmooth.importers.graph import OnnxModel, model_from_proto

FIXTURES = Path(__file__).resolve().parent.parent / "fixtures" / "families"
MANIFEST: dict[str, Any] = json.loads((FIXTURES / "manifest.json").read_text(encoding="utf-8"))


def fixture_bytes(file: str) -> bytes:
    """The exporter's ONNX file behind a manifest ``file`` (``<family>/<variant>.onnx.xz``)."""
    return lzma.decompress((FIXTURES / file).read_bytes())


def fixture_proto(file: str) -> onnx.ModelProto:
    """The ONNX model of a manifest ``file``."""
    return onnx.load_from_string(fixture_bytes(file))


def load_fixture(file: str) -> OnnxModel:
    """The fixture loaded as a user's file is: checked, indexed and defused (:func:`model_from_proto`)."""
    return model_from_proto(fixture_proto(file), path=FIXTURES / file)
