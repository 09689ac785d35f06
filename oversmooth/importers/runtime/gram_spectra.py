"""Every eigenvalue of a stack of symmetric Gram matrices, on the GPU where they are.

The layer metrics need the whole spectrum of each layer's Gram matrix (the effective rank is a
function of every singular value). On the host that is LAPACK's ``eigvalsh``. On a GPU it is
LAPACK's two steps, each batched over the whole stack
(:mod:`~oversmooth.importers.runtime.device_spectra`): a Householder tridiagonalisation, by
default the audit's single launch of a thread block per matrix
(:data:`AUDIT_TRIDIAGONALISATION`), then
bisection on Sturm counts; each spectrum is checked there and only the eigenvalues come to the
host. This module sits above the array code and the kernels (the single launch and the panels
build on it), and the choice between them is made here.

Public API
----------
TRIDIAGONALISATIONS, AUDIT_TRIDIAGONALISATION
    Every device tridiagonalisation by name (the benchmarks' choice), and the audit's.
gram_eigenvalues
    Ascending eigenvalues of ``(..., n, n)`` Gram matrices, on the host, float64.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import numpy as np

from oversmooth.importers.runtime.device_spectra import (
    from_lower_triangle,
    householder_tridiagonal,
    tridiagonal_eigenvalues,
)
from oversmooth.importers.runtime.householder_kernels import (
    block_householder_tridiagonal,
    raw_householder_tridiagonal,
)
from oversmooth.importers.runtime.panel_kernel import panel_householder_tridiagonal
from oversmooth.simulator import statistics
from oversmooth.simulator.backend import array_module
from oversmooth.simulator.statistics import redo_unconverged

__all__ = ["AUDIT_TRIDIAGONALISATION", "TRIDIAGONALISATIONS", "gram_eigenvalues"]

#: Every device tridiagonalisation, ``(N, n, n)`` symmetric stack (overwritten) → ``(d, e)``,
#: by the name the benchmarks take and print: the fused kernels, the four raw kernels per step,
#: the single launch of a thread block per matrix (the audit's, :data:`AUDIT_TRIDIAGONALISATION`),
#: and the same in panels whose updates are applied once per panel (not yet timed on a GPU).
TRIDIAGONALISATIONS: dict[str, Callable[[Any], tuple[Any, Any]]] = {
    "fused": householder_tridiagonal,
    "raw": raw_householder_tridiagonal,
    "block": block_householder_tridiagonal,
    "panel": panel_householder_tridiagonal,
}

#: The tridiagonalisation the audit's Gram spectra use on a GPU: the fastest of
#: :data:`TRIDIAGONALISATIONS` timed on DINOv2's 800 Gram matrices of order 257 on an H200,
#: 0.051 ms per matrix (spectrum included) against 0.107 (raw) and 0.261 (fused),
#: docs/performance.md; ``panel`` is not yet timed.
AUDIT_TRIDIAGONALISATION = "block"


def gram_eigenvalues(
    gram: Any, tridiagonalise: Callable[[Any], tuple[Any, Any]] | None = None
) -> np.ndarray:
    """Ascending eigenvalues of symmetric matrices, float64, on the host.

    Parameters
    ----------
    gram : (..., n, n) array
        NumPy: LAPACK's ``eigvalsh``
        (:func:`oversmooth.simulator.statistics.gram_eigenvalues`). A device library's (CuPy):
        ``tridiagonalise`` then
        :func:`~oversmooth.importers.runtime.device_spectra.tridiagonal_eigenvalues` on the
        device, each spectrum checked by
        :func:`~oversmooth.simulator.statistics.redo_unconverged` (one that fails is recomputed
        by LAPACK on the host); only the ``(..., n)`` eigenvalues come to the host.
    tridiagonalise : callable, optional
        ``(N, n, n)`` stack (overwritten) → diagonals and subdiagonals on the device; default
        the audit's, one launch of a thread block per matrix (:data:`AUDIT_TRIDIAGONALISATION`;
        the benchmarks pass the others of :data:`TRIDIAGONALISATIONS`).

    Returns
    -------
    (..., n) float64 ndarray
    """
    xp = array_module(gram)
    if xp is np:
        return statistics.gram_eigenvalues(gram)
    n = gram.shape[-1]
    stack = gram.reshape(-1, n, n).astype(xp.float64, copy=False)
    tridiagonalise = tridiagonalise or TRIDIAGONALISATIONS[AUDIT_TRIDIAGONALISATION]
    d, e = tridiagonalise(from_lower_triangle(stack))
    eig = tridiagonal_eigenvalues(d, e)
    return redo_unconverged(stack, eig).reshape(gram.shape[:-1])
