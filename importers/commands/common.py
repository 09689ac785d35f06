"""What the importer's subcommands share: the MODEL argument and opening it.

Only argparse work happens at import time; onnx is imported when a command runs.
"""

from __future__ import annotations

import argparse
import os
from typing import TYPE_CHECKING

if TYPE_CHECKING:  # a type only; importing onnx here would slow every `oversmooth` call
    from importers.graph import OnnxModel


def add_model_argument(parser: argparse.ArgumentParser) -> None:
    """The positional MODEL argument shared by the importer's subcommands."""
    parser.add_argument(
        "model",
        metavar="MODEL",
        help="an .onnx file or a zoo name (see `oversmooth models`)",
    )


def add_force_argument(parser: argparse.ArgumentParser) -> None:
    """``--force``: replace an existing output that is not an earlier output of this command."""
    parser.add_argument(
        "--force", action="store_true", help="replace an existing --out that is not ours"
    )


def open_model(spec: str | os.PathLike[str]) -> OnnxModel:
    """Resolve a path or zoo name and load the model (external data is read only when needed)."""
    from importers.graph import load_model
    from importers.zoo import lookup

    return load_model(lookup(spec).path)
