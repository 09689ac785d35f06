"""The operating-point operator of an attention sublayer: the layer frozen at one input's norm.

A pre-LN block normalises its input token by token before the branch, ``LN(x_t) = (x_t C / σ_t)
⊙ γ + β`` (C the feature centring, σ_t the token's standard deviation; RMSNorm: no centring, σ_t
the token's root mean square). Frozen at one input's σ — the operating point — the attention
sublayer is affine in the tokens X (n×d)::

    X ↦ T_D(X) + 𝟙cᵀ,    T_D(X) = X + Σ_h A_h D X M_h,    D = diag(1/σ_t),

with ``M_h`` the head's effective product (γ, centring and the output scale folded in) and c the
bias row. In row-major vec, ``T_D = I + Σ_h (A_h D) ⊗ M_hᵀ``. Post-LN and norm-free blocks have
``D = I``, and T_D is the exact operator of :mod:`oversmooth.simulator.operator`.

The low-frequency subspace is no longer invariant
-------------------------------------------------
``A_h D`` is non-negative but not row-stochastic: its row sums ``A_h (1/σ)`` vary over the tokens
unless 1/σ is constant. So ``T_D(𝟙 sᵀ) = 𝟙 sᵀ + Σ_h (A_h D 𝟙)(M_hᵀ s)ᵀ`` leaves
``L = 𝟙 ⊗ R^d``, the block-triangular split of :mod:`oversmooth.simulator.operator` fails, and the
eigenvalues of T_D are not ``1 + eig(Σ M_h)`` together with a quotient's.

The criterion (docs/theory.md §6.12)
------------------------------------
Let μ₁ be T_D's eigenvalue of largest modulus and V its eigenvector (an n×d matrix). If μ₁ is
real, simple and strictly dominant, power iteration gives ``T_D^k X / ‖T_D^k X‖ → ±V`` for every
X with a component along V, so **HFC/LFC(T_D^k X) → ρ* = ‖(I − P)V‖ / ‖P V‖**, P the token
mean ``X ↦ 𝟙 x̄ᵀ``: repeating the frozen operator drives HFC/LFC to the ratio of its dominating
eigenvector, at rate ``|μ₂/μ₁|`` per application. A conjugate pair at the top spans a real plane
where ``T_D`` rotates and scales: HFC/LFC keeps oscillating between the smallest and largest
ratio over that plane's states ``Re(e^{iφ} V)`` (:func:`limit_range`: a 2×2 pencil). So:

- **perron** — the dominating eigenspace lies in L (ρ* = 0 to :data:`SMOOTH_THRESHOLD`):
  repetition drives HFC/LFC to 0. With D = I this is exactly the operator's perron kind (L is
  invariant, and the eigenvectors of the LFC eigenvalues lie in it; an eigenvalue of the quotient
  has an eigenvector with a non-zero quotient part), so the rule reduces to
  :func:`oversmooth.simulator.operator.operator_dominance` — a plumbing check, not evidence;
- **non-perron** — the dominating eigenspace meets L only in 0: HFC/LFC tends to a floor
  ρ* > 0, or oscillates above one. A D that breaks the invariance of L makes this the generic
  case: perron needs an eigenvector inside L, which a non-invariant L contains only by accident;
- **balanced** — a tie at the top (within ``tie_rtol``) whose eigenspace meets L but is not
  inside it.

What the operating point changes is therefore graded, not binary: ρ* (or its range under a tie
or rotation) against the HFC/LFC of the input the operator was frozen at says whether repeating
the sublayer lowers it ("smoothing", to a floor), raises it ("no smoothing"), or neither within
``tie_rtol`` (:func:`repetition_direction`).

Functions
---------
token_inverse_scale   -- the per-token 1/σ of a LayerNorm (1/rms of an RMSNorm) of X
operating_matrix      -- the dense nd×nd matrix of T_D (small sizes, tests)
limit_range           -- HFC/LFC range over the real states of an eigenvector
operating_dominance   -- kind, spectral radius, dominating eigenvalue, HFC share and ρ* of T_D
repetition_direction  -- whether repeating T_D lowers or raises an input's HFC/LFC
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Literal

import numpy as np
import scipy.linalg
from numpy.typing import ArrayLike, NDArray
from scipy.sparse.linalg import ArpackNoConvergence, LinearOperator, eigs

from oversmooth.simulator.errors import InputError
from oversmooth.simulator.operator import (
    ARPACK_MAXITER,
    ARPACK_NCV,
    ARPACK_RETRY_MAXITER,
    ARPACK_RETRY_NCV,
    ARPACK_SEED,
    ARPACK_WANTED,
    DENSE_FALLBACK_MAX_ORDER,
    DENSE_MAX_ORDER,
    CheckedLayer,
    HeadFactors,
    QuotientConvergenceError,
    checked_layer,
    heads_sum,
)
from oversmooth.simulator.theory import Kind
from oversmooth.simulator.tolerances import ARPACK_RETRY_TOL, ARPACK_TOL, SMOOTH_THRESHOLD, TIE_RTOL
from oversmooth.simulator.validation import as_float_array, check_choice

__all__ = [
    "DIRECTIONS",
    "OperatingDominance",
    "limit_range",
    "operating_dominance",
    "operating_matrix",
    "repetition_direction",
    "token_inverse_scale",
]

FloatArray = NDArray[np.float64]
ComplexArray = NDArray[np.complex128]
Direction = Literal["smoothing", "no smoothing", "tie"]
#: What repeating the operating-point operator does to an input's HFC/LFC.
DIRECTIONS: tuple[Direction, ...] = ("smoothing", "no smoothing", "tie")


@dataclass(frozen=True)
class OperatingDominance:
    """The dominating eigenvalue of ``T_D = I + Σ_h (A_h D) ⊗ M_hᵀ`` and where its eigenvector lies.

    Attributes
    ----------
    kind : {"perron", "non-perron", "balanced"}
        Whether the dominating eigenspace lies in L, meets it, or not (module docstring).
    rho : float
        The spectral radius |μ₁|.
    eigenvalue : complex
        A dominating eigenvalue (Im ≥ 0 of a conjugate pair).
    hfc_share : float
        ``‖(I − P)V‖² / ‖V‖²`` of the dominating eigenvector V (complex norms; the largest over a
        tie), in [0, 1].
    limit_low, limit_high : float
        The range of HFC/LFC over the real states of the dominating eigenvectors: the limit ρ* of
        repeated application (equal for a real, simple top; the oscillation's range for a
        conjugate pair; over the tied eigenvectors for a tie). ``inf`` where a state has no LFC.
    dominating : int
        Dominating eigenvalues, a conjugate pair counted once.
    gap : float
        ``|μ₂| / |μ₁|`` over the eigenvalues found outside the dominating set (the rate of
        convergence to ρ*; NaN when none was found).
    iterations : int
        Applications of T_D (ARPACK's products, or one per column of the dense matrix).
    """

    kind: Kind
    rho: float
    eigenvalue: complex
    hfc_share: float
    limit_low: float
    limit_high: float
    dominating: int
    gap: float
    iterations: int


def token_inverse_scale(
    X: ArrayLike, kind: Literal["layernorm", "rmsnorm"], eps: float
) -> FloatArray:
    """The per-token scale a norm applies: ``1/σ_t`` (LayerNorm) or ``1/rms_t`` (RMSNorm).

    ``σ_t = sqrt(var_f(x_t) + eps)`` (biased variance over the features, ONNX's
    ``LayerNormalization``), ``rms_t = sqrt(mean_f(x_t²) + eps)``.

    Parameters
    ----------
    X : (..., n, d) array_like
    kind : {"layernorm", "rmsnorm"}
    eps : float

    Returns
    -------
    (..., n) ndarray
    """
    check_choice(kind, "kind", ("layernorm", "rmsnorm"))
    X = as_float_array(X, "X", min_ndim=2)
    centred = X - X.mean(axis=-1, keepdims=True) if kind == "layernorm" else X
    return 1.0 / np.sqrt((centred * centred).mean(axis=-1) + eps)


class _FullOperator(LinearOperator):
    """``X ↦ T_D(X)`` on the row-major vec of the n×d X, counting applications."""

    def __init__(self, layer: CheckedLayer) -> None:
        self.layer = layer
        self.shape_x = (layer.n, layer.d)
        self.count = 0
        order = layer.n * layer.d
        super().__init__(dtype=np.float64, shape=(order, order))

    def _apply(self, X: FloatArray) -> FloatArray:
        return X + heads_sum(self.layer, X)

    def _matvec(self, x: FloatArray) -> FloatArray:
        self.count += 1
        return self._apply(np.asarray(x, dtype=np.float64).reshape(self.shape_x)).reshape(-1)

    def _matmat(self, X: FloatArray) -> FloatArray:
        self.count += X.shape[1]
        Y = np.asarray(X.T, dtype=np.float64).reshape((X.shape[1], *self.shape_x))
        return self._apply(Y).reshape(X.shape[1], -1).T

    def dense(self) -> FloatArray:
        return self._matmat(np.eye(self.shape[0]))


def operating_matrix(
    A_heads: ArrayLike, M_heads: ArrayLike | HeadFactors, scale: ArrayLike | None = None
) -> FloatArray:
    """The dense matrix of ``T_D`` on the row-major vec of X: ``I + Σ_h (A_h D) ⊗ M_hᵀ``.

    Parameters
    ----------
    A_heads : (heads, n, n) array_like
        Row-stochastic attention per head.
    M_heads : (heads, d, d) array_like or HeadFactors
    scale : (n,) array_like, optional
        The diagonal of D (positive); None is D = I.

    Returns
    -------
    (n d, n d) ndarray
    """
    op = _FullOperator(checked_layer(A_heads, M_heads, scale))
    if op.shape[0] > DENSE_FALLBACK_MAX_ORDER:
        raise InputError(
            f"the operator of order {op.shape[0]} is larger than {DENSE_FALLBACK_MAX_ORDER}; "
            "use operating_dominance"
        )
    return op.dense()


def _hfc(V: ArrayLike) -> NDArray[np.generic]:
    """``(I − P) V`` of (..., n, d): each column minus its token mean."""
    V = np.asarray(V)
    return V - V.mean(axis=-2, keepdims=True)


def limit_range(V: ArrayLike) -> tuple[float, float]:
    """Smallest and largest HFC/LFC over the real states ``Re(e^{iφ} V)`` of an eigenvector.

    With ``R = Re V``, ``J = Im V`` the states are ``cos φ R − sin φ J``; their squared HFC and
    LFC norms are quadratic forms in ``(cos φ, −sin φ)`` with 2×2 Gram matrices ``G_H``, ``G_L``,
    so the ratio's range is the pencil's eigenvalues (a real V: one value).

    Parameters
    ----------
    V : (n, d) array_like, complex or real

    Returns
    -------
    low, high : float
        ``inf`` where some state has no LFC but an HFC.
    """
    V = np.asarray(V, dtype=np.complex128)
    parts = [V.real, V.imag] if np.linalg.norm(V.imag) > 0 else [V.real]
    high_part = np.stack([_hfc(part).reshape(-1) for part in parts])
    low_part = np.stack([np.sqrt(V.shape[0]) * part.mean(axis=0) for part in parts])
    G_H, G_L = high_part @ high_part.T, low_part @ low_part.T
    if np.linalg.matrix_rank(G_L) < len(parts):  # a state without LFC (up to round-off)
        values = scipy.linalg.eigvals(G_H, G_L)
        finite = np.abs(values[np.isfinite(values)].real)
        low = float(np.sqrt(finite.min())) if finite.size else float("inf")
        return low, float("inf")
    values = scipy.linalg.eigvalsh(G_H, G_L)
    return float(np.sqrt(max(values[0], 0.0))), float(np.sqrt(max(values[-1], 0.0)))


def _arpack(
    op: _FullOperator, tol: float, ncv: int, maxiter: int
) -> tuple[ComplexArray, ComplexArray]:
    order = op.shape[0]
    k = min(ARPACK_WANTED, order - 2)
    v0 = np.random.default_rng(ARPACK_SEED).standard_normal(order)
    ncv = min(max(ncv, 2 * k + 1), order)
    values, vectors = eigs(op, k, which="LM", tol=tol, ncv=ncv, maxiter=maxiter, v0=v0)
    return np.asarray(values, np.complex128), np.asarray(vectors, np.complex128)


def _eigenpairs(op: _FullOperator, method: str, tol: float) -> tuple[ComplexArray, ComplexArray]:
    """Eigenvalues and eigenvectors (columns) of T_D: all (dense) or the largest few (ARPACK)."""
    order = op.shape[0]
    if method == "dense" or (method == "auto" and order <= DENSE_MAX_ORDER) or order < 8:
        values, vectors = np.linalg.eig(op.dense())
        return values.astype(np.complex128), vectors.astype(np.complex128)
    for attempt_tol, ncv, maxiter in (
        (tol, ARPACK_NCV, ARPACK_MAXITER),
        (max(tol, ARPACK_RETRY_TOL), ARPACK_RETRY_NCV, ARPACK_RETRY_MAXITER),
    ):
        try:
            return _arpack(op, attempt_tol, ncv, maxiter)
        except ArpackNoConvergence:
            continue
    if order <= DENSE_FALLBACK_MAX_ORDER:
        values, vectors = np.linalg.eig(op.dense())
        return values.astype(np.complex128), vectors.astype(np.complex128)
    raise QuotientConvergenceError(
        f"ARPACK did not converge on the operating-point operator of order {order} after "
        f"{op.count} products, and it is too large to solve dense (> {DENSE_FALLBACK_MAX_ORDER})"
    )


def _real_phase(V: ComplexArray, value: complex) -> ComplexArray:
    """The eigenvector of a real eigenvalue as a real vector (its phase removed)."""
    if value.imag != 0:
        return V
    phase = V[int(np.argmax(np.abs(V)))]
    return (V * (abs(phase) / phase)).real.astype(np.complex128)


def _real_basis(vectors: ComplexArray) -> FloatArray:
    """Orthonormal columns spanning the real and imaginary parts of ``vectors`` (columns)."""
    parts = np.concatenate([vectors.real, vectors.imag], axis=1)
    U, s, _ = np.linalg.svd(parts, full_matrices=False)
    return U[:, s > s[0] * 1e-8] if s.size and s[0] > 0 else U[:, :0]


def _kind(basis: FloatArray, n: int, d: int, atol: float) -> Kind:
    """Perron when the span lies in L, balanced when it meets L, else non-perron."""
    high = np.asarray(_hfc(basis.T.reshape(-1, n, d)), np.float64).reshape(basis.shape[1], -1).T
    s = np.linalg.svd(high, compute_uv=False)
    if s.max(initial=0.0) <= atol:
        return "perron"
    return "balanced" if s.min() <= atol else "non-perron"


def _dominating(values: ComplexArray, tie_rtol: float) -> NDArray[np.bool_]:
    """The eigenvalues within ``tie_rtol`` of the top modulus, one of each conjugate pair."""
    modulus = np.abs(values)
    top = modulus.max()
    keep = modulus * (1.0 + tie_rtol) >= top
    return keep & (values.imag >= -tie_rtol * top)


def operating_dominance(
    A_heads: ArrayLike,
    M_heads: ArrayLike | HeadFactors,
    scale: ArrayLike | None = None,
    *,
    tie_rtol: float = TIE_RTOL,
    smooth_atol: float = SMOOTH_THRESHOLD,
    tol: float = ARPACK_TOL,
    method: Literal["auto", "dense", "arpack"] = "auto",
) -> OperatingDominance:
    """Classify the operating-point operator ``T_D(X) = X + Σ_h A_h D X M_h`` (module docstring).

    Parameters
    ----------
    A_heads : (heads, n, n) array_like
        Row-stochastic attention per head (rows renormalised to sum to one exactly).
    M_heads : (heads, d, d) array_like or HeadFactors
        The heads' (effective) products.
    scale : (n,) array_like, optional
        The diagonal of D, positive (a pre-norm's ``1/σ_t`` of the input, :func:`token_inverse_scale`);
        None is D = I, where the kind is :func:`oversmooth.simulator.operator.operator_dominance`'s.
    tie_rtol : float
        Relative gap under which eigenvalue moduli tie.
    smooth_atol : float
        A unit state of the dominating eigenspace with ‖(I − P)·‖ at most this lies in L.
    tol : float
        ARPACK's relative residual.
    method : {"auto", "dense", "arpack"}
        "auto": dense up to order :data:`~oversmooth.simulator.operator.DENSE_MAX_ORDER`, else ARPACK on
        the matrix-free operator (the largest :data:`~oversmooth.simulator.operator.ARPACK_WANTED`).

    Returns
    -------
    OperatingDominance
    """
    check_choice(method, "method", ("auto", "dense", "arpack"))
    layer = checked_layer(A_heads, M_heads, scale)
    op = _FullOperator(layer)
    values, vectors = _eigenpairs(op, method, tol)
    top = _dominating(values, tie_rtol)
    n, d = layer.n, layer.d
    chosen = np.stack(
        [_real_phase(V, value) for V, value in zip(vectors[:, top].T, values[top], strict=True)]
    ).reshape(-1, n, d)
    ranges = np.array([limit_range(V) for V in chosen])
    shares = (
        np.linalg.norm(_hfc(chosen), axis=(1, 2)) ** 2 / np.linalg.norm(chosen, axis=(1, 2)) ** 2
    )
    first = int(np.argmax(np.abs(values)))
    eigenvalue = complex(values[first])
    rest = np.abs(values[~(np.abs(values) * (1.0 + tie_rtol) >= np.abs(values).max())])
    return OperatingDominance(
        kind=_kind(_real_basis(vectors[:, top]), n, d, smooth_atol),
        rho=float(abs(eigenvalue)),
        eigenvalue=eigenvalue.conjugate() if eigenvalue.imag < 0 else eigenvalue,
        hfc_share=float(shares.max()),
        limit_low=float(ranges[:, 0].min()),
        limit_high=float(ranges[:, 1].max()),
        dominating=int(top.sum()),
        gap=float(rest.max() / abs(eigenvalue)) if rest.size else float("nan"),
        iterations=op.count,
    )


def repetition_direction(
    limit_low: float, limit_high: float, start: float, tie_rtol: float = TIE_RTOL
) -> Direction:
    """What repeating T_D does to an input whose HFC/LFC is ``start``.

    "smoothing" when every limit state lies below it (``limit_high (1 + tie_rtol) < start``),
    "no smoothing" when every one lies above (``limit_low > start (1 + tie_rtol)``), else "tie".
    """
    if limit_high * (1.0 + tie_rtol) < start:
        return "smoothing"
    if limit_low > start * (1.0 + tie_rtol):
        return "no smoothing"
    return "tie"
