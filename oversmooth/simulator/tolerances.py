"""Every numerical tolerance of the project, named once, with the reason for its size.

One table for both users: the claim checks of :mod:`oversmooth.simulator.checks` (``oversmooth verify``) and the
test suite import their tolerances from here, so a check and the test of the same identity can never
drift apart. Values are float64 unless a comment says otherwise.
"""

from __future__ import annotations

import numpy as np

EPS = float(np.finfo(np.float64).eps)

#: A handful of float64 flops against a hand formula (one update step, vec identity).
STEP_RTOL = 1e-12
STEP_ATOL = 1e-12

#: Eigenvalues from two different eigensolvers (Kronecker-free vs dense, Lemma 1), relative to
#: the largest modulus (absolute on O(1) spectra): eigenvalue conditioning of non-normal matrices
#: costs a few digits.
EIG_TOL = 1e-9

#: Relative modulus under which two eigenvalues |mu| count as tied (Definition 4 allows ties).
TIE_RTOL = 1e-9

#: ARPACK's relative residual for the quotient map's dominating eigenvalue (simulator.operator):
#: an eigenvalue's error is about its condition number times this, so a kind decided against
#: TIE_RTOL stays right for condition numbers up to about 1e3.
ARPACK_TOL = 1e-12

#: ARPACK's residual on its retry. A tight cluster at the top of the quotient (several near-1
#: eigenvalues of A times one eigenvalue of M) converges in value long before its vectors do; at
#: this residual the moduli of such clusters came out within 2e-9 (relative) of the dense ones.
ARPACK_RETRY_TOL = 1e-8

#: A certified perron case (simulator.perron) keeps this relative distance from the tie threshold,
#: so that the dense path, whose eigenvalues carry round-off (a few digits more for non-normal A),
#: finds the same kind.
PERRON_MARGIN = 1e-6

#: A smoothing metric (HFC/LFC, 1 - cos, sigma_2/sigma_1) counts as converged to 0 below this.
SMOOTH_THRESHOLD = 1e-6

#: Row sums of a row-stochastic matrix must equal one to this absolute tolerance.
STOCHASTIC_ATOL = 1e-8

#: Theorem bounds (inequalities): slack for round-off only.
BOUND_RTOL = 1e-9
BOUND_ATOL = 1e-12

#: A fitted asymptotic rate against the predicted one, on well-separated instances (claim 12).
RATE_RTOL = 1e-3

#: A metric after many layers against its predicted limit (claims 14, 15, 17).
LIMIT_RTOL = 1e-6

#: Metrics below this are at the float64 floor (fitting them fits round-off).
FLOOR = 1e3 * EPS

#: float32 reductions (LayerNorm, softmax) against a float64 recomputation.
FLOAT32_RTOL = 1e-5
FLOAT32_ATOL = 1e-5

#: Metrics from token statistics (Gram eigenvalues, float64) against the SVD of the same matrix:
#: a Gram matrix holds singular values below about sqrt(k eps) sigma_1 only as round-off.
GRAM_RTOL = 1e-6
GRAM_ATOL = 1e-7

#: A Gram spectrum from a device's eigensolver (CuPy's batched Jacobi solver reports no failure
#: unless asked) is kept when its Frobenius defect |‖G‖_F² − Σ λ_i²| is at most this many times
#: k ε ‖G‖_F² (k the order; the sums' own round-off is about k ε ‖G‖_F²). By the Wielandt–Hoffman
#: theorem the values are then within about sqrt(that) ‖G‖_F of the eigenvalues in the 2-norm
#: (1.9e-6 at k = 257, under 3e-6 with the sums' round-off); a run stopped with more off-diagonal
#: mass is redone by LAPACK on the host.
GRAM_DEFECT_ULPS = 64.0

#: A float32 ONNX Runtime block output against the float64 simulator from extracted weights.
ORT_RTOL = 1e-4
ORT_ATOL = 1e-4


def iterated_atol(n_steps: int, scale: float, c: float = 10.0) -> float:
    """Absolute tolerance for ``n_steps`` of float64 iteration, scaled by the initial norm."""
    return c * n_steps * EPS * scale


# --- importers: model inputs and the onnxruntime runner ---------------------------------------

#: One 8-bit intensity level: images pass through 8-bit PNG storage and bicubic resampling.
PIXEL_ATOL = 1.0 / 255.0

#: The same float32 ONNX Runtime graph run twice (batch split, extra outputs, thread count):
#: kernels may reorder float32 sums, so results agree to a few float32 ulps of O(1) activations.
ORT_REPEAT_RTOL = 1e-5
ORT_REPEAT_ATOL = 1e-5


# --- simulator: update rules, deep iteration and the simulate command -------------------------

#: Iterating the linear rule L <= 30 times against the binomial closed form (claim 5), with a
#: positive-spectrum M so that the closed-form sum itself has no cancellation.
CLOSED_FORM_RTOL = 1e-10

# --- ONNX test-model builders (tests/importers/builders.py) ---

#: A dynamically quantised weight against its float original: at most half a quantisation step,
#: the step itself being computed in float32 by the quantiser (a few ulps of slack).
QUANT_STEP_RTOL = 1e-5


# --- importers: graph matching, weight extraction and spectra ---------------------------------

#: Claim 31: the nonzero eigenvalues of the d x d per-head product W_V^h W_O^h against the
#: eigenvalues of the d_head x d_head W_O^h W_V^h, relative to the spectral radius ("atol 1e-6 in
#: float32 terms"; both are float64 eigensolves of the same float32-valued weights).
HEAD_SPECTRUM_RTOL = 1e-6

#: An eigenvalue of a value product whose modulus is at most this times its kind's spectral radius
#: is a null-space zero (rank deficiency, the pre-LayerNorm centring): the computed ones are round-off,
#: about 1e-16 relative; the audit's spectra figure leaves them out and counts them.
ZERO_EIGENVALUE_RTOL = 1e-9

#: The effective spectrum (pre-norm centring and gamma, LayerScale folded) must differ from the stored
#: one by more than this, relative
#: to the spectral radius (the sums of the eigenvalues, i.e. the traces, are compared).
GAMMA_FOLD_MIN_RTOL = 1e-3


# --- importers: the model audit and the transforms (random init, ± reparameterisation) --------

#: Columns of a float64 symmetric eigensolver's eigenvector matrix: orthonormal to round-off.
ORTHONORMAL_ATOL = 1e-12

#: A sample standard deviation of n normal draws against the true one, in standard errors
#: (std / sqrt(2 n)): six of them make a false alarm a one-in-a-billion event.
SAMPLE_STD_SIGMAS = 6.0

#: A product of two float16-stored factors (the ± reparameterised W_V^h, W_O^h of a float16
#: model) against its float64 value: a few half-precision unit roundoffs (2^-11 ≈ 4.9e-4).
FLOAT16_RTOL = 2e-3
