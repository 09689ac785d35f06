"""Every subcommand of ``oversmooth``, one module each.

``simulate`` and ``verify`` (the theory simulator), ``inspect`` (matched attention blocks and
rejected candidates), ``weights`` (per-block weights to ``.npz``), ``spectra`` (eigenvalues of the
value products to CSV), ``models`` (the zoo), ``transform`` (random init and ±
reparameterisation), ``doctor`` (what onnxruntime can run here), ``audit`` (a model on real inputs:
the report folder), ``sweep`` (a grid of simulator runs) and ``train`` (small ViTs in three variants:
the ``train`` extra). :mod:`oversmooth.commands.common`
holds what they share.
"""

from __future__ import annotations

import argparse


def register(subparsers: argparse._SubParsersAction) -> None:
    """Add every subcommand to ``subparsers``, in the order ``oversmooth --help`` lists them.

    Only argparse work happens here; NumPy, onnx and matplotlib are imported when a command runs.
    """
    from oversmooth.commands import (
        audit,
        doctor,
        inspect,
        models,
        simulate,
        spectra,
        sweep,
        train,
        transform,
        verify,
        weights,
    )

    for command in (
        simulate,
        verify,
        inspect,
        weights,
        spectra,
        models,
        transform,
        doctor,
        audit,
        sweep,
        train,
    ):
        command.register(subparsers)
