"""The importer's subcommands of ``oversmooth``, one module each.

``inspect`` (matched attention blocks and rejected candidates), ``weights`` (per-block weights to
``.npz``), ``spectra`` (eigenvalues of W_V W_O to CSV), ``transform`` (random init and ±
reparameterisation), ``models`` and ``fetch`` (the zoo), ``doctor`` (what onnxruntime can run here). :func:`register` is the
``oversmooth.commands`` entry point; :mod:`importers.commands.common` holds what they share.
"""

from __future__ import annotations

import argparse


def register(subparsers: argparse._SubParsersAction) -> None:
    """Add the importer's subcommands to ``subparsers`` (entry point ``oversmooth.commands``).

    Only argparse work happens here; onnx and NumPy are imported when a command runs.
    """
    from importers.commands import doctor, inspect, models, spectra, transform, weights

    inspect.register(subparsers)
    weights.register(subparsers)
    spectra.register(subparsers)
    models.register(subparsers)
    transform.register(subparsers)
    doctor.register(subparsers)
