"""Row-stochastic test matrices and their dense non-Perron spectrum (shared by the tests of
:mod:`oversmooth.simulator.perron` and :mod:`oversmooth.simulator.doeblin`)."""

from __future__ import annotations

import numpy as np

from oversmooth.simulator.theory import perron_index

__all__ = ["nonperron_moduli", "sharpened"]


def nonperron_moduli(A: np.ndarray, centre: float = 0.0) -> np.ndarray:
    """Per matrix, the largest ``|λ − centre|`` of an eigenvalue other than the Perron root (dense)."""
    eig = np.linalg.eigvals(A)
    p = perron_index(eig)
    others = np.abs(eig - centre)
    np.put_along_axis(others, p[..., None], 0.0, axis=-1)
    return others.max(axis=-1)


def sharpened(A: np.ndarray, power: float) -> np.ndarray:
    """Entrywise power, rows renormalised: near-reducible attention for large powers."""
    B = A**power
    return B / B.sum(axis=-1, keepdims=True)
