"""What the subcommands share: the MODEL argument, ``--force``, ``--scheduler`` and opening a model.

Only argparse work happens at import time; onnx is imported when a command runs.
"""

from __future__ import annotations

import argparse
import os
from typing import TYPE_CHECKING

if TYPE_CHECKING:  # a type only; importing onnx here would slow every `oversmooth` call
    from oversmooth.importers.graph import OnnxModel


def count_or_rule(text: str) -> int | str:
    """argparse ``type`` of ``--dominance-inputs``: a positive integer, ``all`` or ``auto``."""
    if text in ("all", "auto"):
        return text
    try:
        return positive_int(text)
    except argparse.ArgumentTypeError:
        raise argparse.ArgumentTypeError(
            f"must be a positive integer, 'all' or 'auto'; got {text!r}"
        ) from None


def positive_int(text: str) -> int:
    """argparse ``type`` of a count (``--threads``, ``--batch-size``, ...): refused at parse time,
    with the option named, before any work starts."""
    try:
        value = int(text)
    except ValueError:
        value = 0
    if value <= 0:
        raise argparse.ArgumentTypeError(f"must be a positive integer; got {text!r}")
    return value


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


def add_scheduler_options(parser: argparse.ArgumentParser, what: str) -> None:
    """``--scheduler`` and ``--workers`` (:func:`oversmooth.executor.open_executor`); ``what`` says
    how the work is split."""
    parser.add_argument(
        "--scheduler",
        metavar="ADDRESS",
        help=f"run on a Dask cluster: `local` starts one on this machine, tcp://HOST:PORT uses an "
        f"existing one ({what})",
    )
    parser.add_argument(
        "--workers",
        type=positive_int,
        metavar="N",
        help="worker processes of `--scheduler local` (default: the usable cores)",
    )


def open_model(spec: str | os.PathLike[str]) -> OnnxModel:
    """Resolve a path or zoo name and load the model (external data is read only when needed)."""
    from oversmooth.importers.graph import load_model
    from oversmooth.importers.zoo import lookup

    return load_model(lookup(spec).path)
