"""Every numerical tolerance the tests use, named once, with the reason for its size."""

from __future__ import annotations

import numpy as np

EPS = float(np.finfo(np.float64).eps)

#: A handful of float64 flops against a hand formula (one update step, vec identity).
STEP_RTOL = 1e-12
STEP_ATOL = 1e-12

#: Eigenvalues from two different eigensolvers (Kronecker-free vs dense, Lemma 1): eigenvalue
#: conditioning of non-normal matrices costs a few digits.
EIG_ATOL = 1e-9

#: Theorem bounds (inequalities): slack for round-off only.
BOUND_RTOL = 1e-9
BOUND_ATOL = 1e-12

#: A fitted asymptotic rate against the predicted one, on well-separated instances (claim 12).
RATE_RTOL = 1e-3

#: A metric after many layers against its predicted limit (claims 14, 15).
LIMIT_RTOL = 1e-6

#: Metrics below this are at the float64 floor (fitting them fits round-off).
FLOOR = 1e3 * EPS

#: float32 reductions (LayerNorm, softmax) against a float64 recomputation.
FLOAT32_RTOL = 1e-5
FLOAT32_ATOL = 1e-5

#: A float32 ONNX Runtime block output against the float64 simulator from extracted weights.
ORT_RTOL = 1e-4
ORT_ATOL = 1e-4


def iterated_atol(n_steps: int, scale: float, c: float = 10.0) -> float:
    """Absolute tolerance for ``n_steps`` of float64 iteration, scaled by the initial norm."""
    return c * n_steps * EPS * scale
