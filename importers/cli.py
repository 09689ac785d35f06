"""Register the importer's subcommands with the ``oversmooth`` dispatcher.

Subcommands: ``inspect`` (matched attention blocks and rejected candidates), ``weights`` (per-block
weights to ``.npz``), ``spectra`` (eigenvalues of W_V W_O to CSV), ``transform`` (random init and
± reparameterisation), plus ``models`` and ``fetch`` from :mod:`importers.cmd_models`.
"""

from __future__ import annotations

import argparse
import os
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from importers.graph import OnnxModel


def register(subparsers: argparse._SubParsersAction) -> None:
    """Add the importer's subcommands to ``subparsers`` (entry point ``oversmooth.commands``).

    Only argparse work happens here; onnx and NumPy are imported when a command runs.
    """
    from importers import cmd_inspect, cmd_models, cmd_spectra, cmd_transform, cmd_weights

    cmd_inspect.register(subparsers)
    cmd_weights.register(subparsers)
    cmd_spectra.register(subparsers)
    cmd_models.register(subparsers)
    cmd_transform.register(subparsers)


def add_model_argument(parser: argparse.ArgumentParser) -> None:
    """The positional MODEL argument shared by the importer's subcommands."""
    parser.add_argument(
        "model",
        metavar="MODEL",
        help="an .onnx file or a zoo name (see `oversmooth models`)",
    )


def open_model(spec: str | os.PathLike[str]) -> OnnxModel:
    """Resolve a path or zoo name and load the model (external data is read only when needed)."""
    from importers.graph import load_model
    from importers.zoo import resolve_model

    return load_model(resolve_model(spec))
