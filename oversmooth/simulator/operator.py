"""The dominating eigenvalue of a whole multi-head layer, exactly and without the nd×nd matrix.

A multi-head attention layer without normalisation is linear in the tokens X (n×d)::

    T(X) = X + Σ_h A_h X M_h,        vec T = I + Σ_h M_hᵀ ⊗ A_h   (column-major vec),

with A_h (n×n) the row-stochastic attention of head h and ``M_h = W_V^h W_O^h`` (d×d, rank at most
d_head) its value-output product. With one head (or one A shared by every head) Lemma 1 gives the
spectrum from eig(A) and eig(M) (:mod:`oversmooth.simulator.theory`); with several different A_h it does not,
and the dominance of each head alone (:mod:`oversmooth.simulator.perron`) says nothing certain about the layer.
This module finds the layer's dominating eigenvalue itself.

Decomposition
-------------
Every ``A_h 𝟙 = 𝟙``, so the low-frequency subspace ``L = {𝟙 sᵀ : s ∈ R^d}`` is invariant:
``T(𝟙 sᵀ) = 𝟙 (s + Mᵀ s)ᵀ`` with ``M = Σ_h M_h`` (the rows of each A_h, checked to
STOCHASTIC_ATOL, are rescaled to sum to one exactly, so this holds for the matrices used). Hence
T is block triangular over L and the quotient ``R^{n×d} / L``:

- on L its eigenvalues are ``1 + eig(M)`` (the LFC or Perron-type eigenvalues: d of them, from a
  d×d eigensolve), and ``rho_lfc = max_j |1 + λ_j(M)|``;
- the other ``(n − 1) d`` are those of the induced map on the quotient, ``rho_quotient`` its
  spectral radius.

The quotient map is represented on a complement of L. Let the n×(n−1) matrix Q hold an
orthonormal basis of 𝟙^⊥. Every X splits uniquely as ``X = 𝟙 sᵀ + Q Y`` with ``Y = Qᵀ X`` (because
``Qᵀ 𝟙 = 0`` and ``QᵀQ = I``), so ``X ↦ Qᵀ X`` is the projection onto span(Q) ⊗ R^d along L, and since
``T(L) ⊆ L`` the quotient map is conjugate to ``Y ↦ Qᵀ T(Q Y)`` on (n−1)×d matrices. Q is the last
n−1 columns of the Householder reflector ``H = I − 2 v vᵀ / (vᵀ v)``, ``v = 𝟙 + √n e_1`` (which maps
𝟙 to ``−√n e_1``), applied in O(n d) and never formed.

Solvers
-------
Up to :data:`DENSE_MAX_ORDER` the quotient matrix ((n−1)d square) is built by applying the map to
unit vectors and handed to a dense eigensolver. Above it, ARPACK (``scipy.sparse.linalg.eigs``,
``which="LM"``) runs on a ``LinearOperator`` whose product costs ``Σ_h (n² r_h + 2 n d r_h)`` flops
in factored form (r_h = d_head) or ``Σ_h (n² d + n d²)`` with dense M_h; if it does not converge it
is retried with a larger Krylov space and more restarts, then solved dense up to
:data:`DENSE_FALLBACK_MAX_ORDER`, and otherwise :class:`QuotientConvergenceError` is raised.
Both products and ARPACK's own steps are small BLAS calls: on a busy machine, limit BLAS to one
thread as the audit does (``threadpool_limits(1, "blas")``); on a shared 2-core machine threaded
OpenBLAS made a n = 257, d = 64 layer 50× slower (11 s instead of 0.2 s).

Accuracy
--------
A dense or ARPACK-converged eigenvalue is an eigenvalue of the quotient to its residual times its
condition number (ARPACK_TOL, or ARPACK_RETRY_TOL on the retry: within 5e-9 relative of the dense
radius on every one of 600 random layers of order 45–390). That ARPACK's is the *largest* is not
guaranteed: when the quotient's spectrum fills a disk (random weights and attention) the top is
not separated, and a Krylov method may stop at a pair just below it; :data:`ARPACK_WANTED` and
:data:`ARPACK_NCV` are sized so that it did not on a random ViT-sized layer. A top set apart
(nearly decomposable attention, an outlying eigenvalue of M) converges in a few hundred products.

Kinds
-----
"perron" when ``rho_lfc > rho_quotient (1 + tie_rtol)`` (every dominating mode is low-frequency:
the layer smooths), "non-perron" when ``rho_quotient > rho_lfc (1 + tie_rtol)``, "balanced"
otherwise. The names are :data:`oversmooth.simulator.theory.KINDS`; without a Kronecker structure there is no
(A-index, H-index) grid, so a tie between L and the quotient is "balanced" here even where
Definition 4 would call a tie within one H column "non-perron", and a conjugate pair of modes in
two non-Perron rows is "non-perron" here where :func:`oversmooth.simulator.theory.dominance` says "balanced".

Value-output products are taken dense, ``(heads, d, d)``, or factored as :class:`HeadFactors`
``(W_V (heads, d, r), W_O (heads, r, d))``; the factored product is the cheaper one whenever
r ≤ d/2 and never forms M_h. Grouped-query attention needs nothing special: each query head has its
own A_h and M_h (its group's shared W_V^h repeated for each query head of the group).

Functions
---------
apply_layer          -- T(X) = X + Σ_h A_h D X M_h for a batch of token matrices (D = I by default;
                        the per-token D is the operating point's, simulator.operating)
lfc_eigenvalues      -- 1 + eig(Σ_h M_h): T on the low-frequency subspace
quotient_matrix      -- the dense (n−1)d × (n−1)d matrix of T on the quotient (small sizes)
quotient_radius      -- spectral radius and dominating eigenvalue of T on the quotient
operator_dominance   -- kind, both radii and the dominating eigenvalue of the layer
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Literal

import numpy as np
from numpy.typing import ArrayLike, NDArray
from scipy.sparse.linalg import ArpackNoConvergence, LinearOperator, eigs

from oversmooth.simulator.errors import InputError, OversmoothError
from oversmooth.simulator.theory import Kind, value_spectrum
from oversmooth.simulator.tolerances import ARPACK_RETRY_TOL, ARPACK_TOL, TIE_RTOL
from oversmooth.simulator.validation import as_float_array, as_row_stochastic, check_choice

__all__ = [
    "DENSE_FALLBACK_MAX_ORDER",
    "DENSE_MAX_ORDER",
    "CheckedLayer",
    "HeadFactors",
    "OperatorDominance",
    "QuotientConvergenceError",
    "apply_layer",
    "checked_layer",
    "heads_sum",
    "householder",
    "lfc_eigenvalues",
    "operator_dominance",
    "quotient_matrix",
    "quotient_radius",
    "reflect",
]

FloatArray = NDArray[np.float64]
ComplexArray = NDArray[np.complex128]
Method = Literal["auto", "dense", "arpack"]

#: Largest quotient order (n−1)d solved dense by default. At order 400 the dense path (build and
#: eigensolve) takes about 40 ms on one core, ARPACK 10–30 ms on a well-separated top but seconds on
#: a clustered one (and it needs order > k + 1): below this, the exact answer at a fixed cost.
DENSE_MAX_ORDER = 400

#: Largest quotient order solved dense after ARPACK failed twice: 2048² float64 is 32 MiB, and the
#: eigensolve takes a few seconds (1.2 s at order 1600 on one core).
DENSE_FALLBACK_MAX_ORDER = 2048

#: Eigenvalues ARPACK is asked for. A quotient whose spectrum fills a disk (random attention and
#: weights) has no separated top, and a Krylov method may converge to a pair just below it: on a
#: random layer of order 98304 (n = 257, d = 384, 6 heads), 2 wanted values found a pair 2.7e-5
#: below the top from two of four start vectors, 6 found the top from all four (in about 5000
#: products, fewer than the 2 took to find it). A conjugate pair at the top comes out whole.
ARPACK_WANTED = 6

#: Krylov dimension and restart limit of the first ARPACK attempt (on that random layer 100
#: vectors needed about 55 restarts; with 60 vectors it found a pair 4e-4 below the top).
ARPACK_NCV = 100
ARPACK_MAXITER = 100

#: The retry: a larger Krylov space, more restarts, and a residual of at most ARPACK_RETRY_TOL
#: (simulator.tolerances) for a tight cluster at the top, whose vectors converge slowly.
ARPACK_RETRY_NCV = 200
ARPACK_RETRY_MAXITER = 300

#: Fixed seed of ARPACK's start vector: the same layer gives the same answer and count.
ARPACK_SEED = 20240109


class QuotientConvergenceError(OversmoothError):
    """ARPACK did not converge on the quotient map, and the problem is too large to solve dense.

    Not the input's fault: exit status 1, like a failed check.
    """

    exit_code = 1


@dataclass(frozen=True)
class HeadFactors:
    """Value-output products in factored form: ``M_h = W_V[h] @ W_O[h]``.

    Attributes
    ----------
    W_V : (heads, d, r) array_like
    W_O : (heads, r, d) array_like
    """

    W_V: ArrayLike
    W_O: ArrayLike


@dataclass(frozen=True)
class OperatorDominance:
    """The dominating eigenvalue of ``T = I + Σ_h M_hᵀ ⊗ A_h`` split by the low-frequency subspace.

    Attributes
    ----------
    kind : {"perron", "non-perron", "balanced"}
        Which side holds the spectral radius (see the module docstring).
    rho_lfc : float
        ``max_j |1 + λ_j(Σ_h M_h)|``: T's spectral radius on ``L = 𝟙 ⊗ R^d``.
    rho_quotient : float
        T's spectral radius on the quotient ``R^{n×d} / L`` (0 when n = 1).
    eigenvalue : complex
        A dominating eigenvalue of the winning side (of L for "balanced"); of a conjugate pair,
        the one with nonnegative imaginary part.
    iterations : int
        Applications of the quotient map to a vector (ARPACK's matvecs, or one per column when the
        quotient matrix was built for a dense solve).
    """

    kind: Kind
    rho_lfc: float
    rho_quotient: float
    eigenvalue: complex
    iterations: int


@dataclass(frozen=True)
class CheckedLayer:
    """Validated heads: A (heads, n, n) with exact unit row sums, W_V (heads, d, r) or None for
    dense products, W_O (heads, r, d) (the dense M_h when W_V is None), and the per-token scale
    D = diag(scale) (n,) read before every head, or None for D = I."""

    A: FloatArray
    W_V: FloatArray | None
    W_O: FloatArray
    scale: FloatArray | None = None

    @property
    def n(self) -> int:
        return int(self.A.shape[-1])

    @property
    def d(self) -> int:
        return int(self.W_O.shape[-1])


# -- validation ------------------------------------------------------------------------------------


def _heads(array: FloatArray, name: str) -> FloatArray:
    """A single (k, m) matrix is one head; otherwise exactly (heads, k, m)."""
    if array.ndim == 2:
        return array[None]
    if array.ndim != 3 or array.shape[0] == 0:
        raise InputError(f"`{name}` must have shape (heads, ., .); got {array.shape}")
    return array


def _products(M_heads: ArrayLike | HeadFactors) -> tuple[FloatArray | None, FloatArray]:
    if isinstance(M_heads, HeadFactors):
        W_V = _heads(as_float_array(M_heads.W_V, "W_V", min_ndim=2), "W_V")
        W_O = _heads(as_float_array(M_heads.W_O, "W_O", min_ndim=2), "W_O")
        heads, d, r = W_V.shape
        if W_O.shape != (heads, r, d):
            raise InputError(
                f"`W_O` must have shape {(heads, r, d)} to follow `W_V` {W_V.shape}; got {W_O.shape}"
            )
        return W_V, W_O
    M = _heads(as_float_array(M_heads, "M_heads", min_ndim=2), "M_heads")
    if M.shape[-1] != M.shape[-2]:
        raise InputError(f"`M_heads` must have shape (heads, d, d); got {M.shape}")
    return None, M


def _scale(scale: ArrayLike | None, n: int) -> FloatArray | None:
    """The per-token scale as a positive finite (n,) vector, or None (D = I)."""
    if scale is None:
        return None
    values = as_float_array(scale, "scale", min_ndim=1)
    if values.shape != (n,) or not np.all(values > 0):
        raise InputError(f"`scale` must be {n} positive finite numbers; got shape {values.shape}")
    return values


def checked_layer(
    A_heads: ArrayLike, M_heads: ArrayLike | HeadFactors, scale: ArrayLike | None = None
) -> CheckedLayer:
    """The heads of one layer checked once: A_heads (heads, n, n) row-stochastic (rescaled to exact
    unit row sums), M_heads dense (heads, d, d) or factored (:class:`HeadFactors`), and the
    optional per-token scale (n,)."""
    A = _heads(as_row_stochastic(A_heads, "A_heads"), "A_heads")
    W_V, W_O = _products(M_heads)
    if W_O.shape[0] != A.shape[0]:
        raise InputError(
            f"`A_heads` and `M_heads` must have as many heads; got {A.shape[0]} and {W_O.shape[0]}"
        )
    # Exact row sums make L exactly invariant: the LFC eigenvalues are then those of T itself.
    A = A / A.sum(axis=-1, keepdims=True)
    return CheckedLayer(A, W_V, W_O, _scale(scale, A.shape[-1]))


# -- the layer map and the quotient map ------------------------------------------------------------


def heads_sum(layer: CheckedLayer, Z: FloatArray) -> FloatArray:
    """``Σ_h A_h D Z M_h`` for Z of shape (..., n, d), as three matrix products (D = I unless
    the layer has a per-token scale)."""
    A, W_V, W_O = layer.A, layer.W_V, layer.W_O
    if layer.scale is not None:
        Z = Z * layer.scale[:, None]
    heads, r, d = W_O.shape
    if W_V is None:
        U = A @ Z[..., None, :, :]  # (..., heads, n, d)
    else:
        V_cat = np.moveaxis(W_V, 0, 1).reshape(d, heads * r)  # columns head-major
        ZV = (Z @ V_cat).reshape((*Z.shape[:-1], heads, r))  # (..., n, heads, r)
        U = A @ np.moveaxis(ZV, -2, -3)  # (..., heads, n, r)
    stacked = np.moveaxis(U, -3, -2).reshape((*Z.shape[:-1], heads * r))
    return stacked @ W_O.reshape(heads * r, d)


def apply_layer(
    A_heads: ArrayLike,
    M_heads: ArrayLike | HeadFactors,
    X: ArrayLike,
    *,
    scale: ArrayLike | None = None,
) -> FloatArray:
    """Apply the linear multi-head layer ``T(X) = X + Σ_h A_h D X M_h`` (D = I by default).

    Parameters
    ----------
    A_heads : (heads, n, n) array_like
        Row-stochastic attention per head (rows are renormalised to sum to one exactly).
    M_heads : (heads, d, d) array_like or HeadFactors
        ``M_h = W_V^h W_O^h``, dense or factored.
    X : (..., n, d) array_like
        Token matrices.
    scale : (n,) array_like, optional
        The per-token scale ``D = diag(scale)`` (positive; a pre-norm's ``1/σ_t`` at its
        operating point, :mod:`oversmooth.simulator.operating`); None is D = I.

    Returns
    -------
    (..., n, d) ndarray
    """
    layer = checked_layer(A_heads, M_heads, scale)
    X = as_float_array(X, "X", min_ndim=2)
    if X.shape[-2:] != (layer.n, layer.d):
        raise InputError(f"`X` must have shape (..., {layer.n}, {layer.d}); got {X.shape}")
    return X + heads_sum(layer, X)


def householder(n: int) -> tuple[FloatArray, float]:
    """``v = 𝟙 + √n e_1`` and ``2 / (vᵀv)``: ``H = I − (2/vᵀv) v vᵀ`` maps 𝟙 to ``−√n e_1``."""
    v = np.ones(n)
    v[0] += np.sqrt(n)
    return v, 2.0 / float(v @ v)


def reflect(v: FloatArray, beta: float, X: FloatArray) -> FloatArray:
    """``H X`` for X of shape (..., n, d)."""
    return X - beta * v[:, None] * (v @ X)[..., None, :]


def _quotient_apply(layer: CheckedLayer, v: FloatArray, beta: float, Y: FloatArray) -> FloatArray:
    """``Qᵀ T(Q Y)`` for Y of shape (..., n − 1, d); Q = columns 2..n of the reflector."""
    pad = np.zeros((*Y.shape[:-2], 1, Y.shape[-1]))
    Z = reflect(v, beta, np.concatenate([pad, Y], axis=-2))  # Q Y
    return reflect(v, beta, Z + heads_sum(layer, Z))[..., 1:, :]


class _QuotientOperator(LinearOperator):
    """``Y ↦ Qᵀ T(Q Y)`` on vec(Y) (row-major vec of the (n−1)×d matrix), counting applications."""

    def __init__(self, layer: CheckedLayer) -> None:
        self.layer = layer
        self.v, self.beta = householder(layer.n)
        self.shape_y = (layer.n - 1, layer.d)
        self.count = 0
        order = (layer.n - 1) * layer.d
        super().__init__(dtype=np.float64, shape=(order, order))

    def _matvec(self, x: FloatArray) -> FloatArray:
        self.count += 1
        Y = np.asarray(x, dtype=np.float64).reshape(self.shape_y)
        return _quotient_apply(self.layer, self.v, self.beta, Y).reshape(-1)

    def _matmat(self, X: FloatArray) -> FloatArray:
        """Column j of the result is the map applied to column j of X."""
        self.count += X.shape[1]
        Y = np.asarray(X.T, dtype=np.float64).reshape((X.shape[1], *self.shape_y))
        return _quotient_apply(self.layer, self.v, self.beta, Y).reshape(X.shape[1], -1).T

    def dense(self, block: int = 256) -> FloatArray:
        """The quotient matrix, built from the unit vectors ``block`` columns at a time."""
        order = self.shape[0]
        out = np.empty((order, order))
        for start in range(0, order, block):
            stop = min(start + block, order)
            units = np.zeros((order, stop - start))
            units[np.arange(start, stop), np.arange(stop - start)] = 1.0
            out[:, start:stop] = self._matmat(units)
        return out


def quotient_matrix(A_heads: ArrayLike, M_heads: ArrayLike | HeadFactors) -> FloatArray:
    """The matrix of T on the quotient by L, in the basis ``Q e_i e_jᵀ`` (row-major vec of Y).

    Its order is (n−1)d; this is for small layers and tests. Its eigenvalues together with
    :func:`lfc_eigenvalues` are all nd eigenvalues of T.

    Parameters
    ----------
    A_heads : (heads, n, n) array_like
    M_heads : (heads, d, d) array_like or HeadFactors

    Returns
    -------
    ((n − 1) d, (n − 1) d) ndarray
    """
    op = _QuotientOperator(checked_layer(A_heads, M_heads))
    if op.shape[0] > DENSE_FALLBACK_MAX_ORDER:
        raise InputError(
            f"the quotient matrix of order {op.shape[0]} is larger than "
            f"{DENSE_FALLBACK_MAX_ORDER}; use quotient_radius"
        )
    return op.dense()


# -- eigenvalues -----------------------------------------------------------------------------------


def _top(values: ComplexArray) -> complex:
    """The eigenvalue of largest modulus; of a conjugate pair, the one with Im ≥ 0."""
    value = complex(values[int(np.argmax(np.abs(values)))])
    return value.conjugate() if value.imag < 0 else value


def _lfc(W_V: FloatArray | None, W_O: FloatArray) -> ComplexArray:
    if W_V is None:
        return 1.0 + np.linalg.eigvals(W_O.sum(axis=0)).astype(np.complex128)
    heads, d, r = W_V.shape
    # Σ_h W_V^h W_O^h = [W_V^1 … W_V^H] [W_O^1; …; W_O^H]: eigenvalues via the smaller product.
    V_cat = np.moveaxis(W_V, 0, 1).reshape(d, heads * r)
    return 1.0 + value_spectrum(V_cat, W_O.reshape(heads * r, d))


def lfc_eigenvalues(M_heads: ArrayLike | HeadFactors) -> ComplexArray:
    """Eigenvalues of the layer on the low-frequency subspace: ``1 + eig(Σ_h M_h)``.

    ``T(𝟙 sᵀ) = 𝟙 sᵀ + Σ_h A_h 𝟙 sᵀ M_h = 𝟙 (s + Mᵀ s)ᵀ`` for row-stochastic A_h, so T acts on
    ``L = {𝟙 sᵀ}`` as ``I + Mᵀ``, ``M = Σ_h M_h``: no attention matrix is needed.

    Parameters
    ----------
    M_heads : (heads, d, d) array_like or HeadFactors

    Returns
    -------
    (d,) complex ndarray
    """
    return _lfc(*_products(M_heads))


def _arpack(op: _QuotientOperator, tol: float, ncv: int, maxiter: int) -> ComplexArray:
    order = op.shape[0]
    k = min(ARPACK_WANTED, order - 2)
    v0 = np.random.default_rng(ARPACK_SEED).standard_normal(order)
    ncv = min(max(ncv, 2 * k + 1), order)
    options = {"which": "LM", "tol": tol, "ncv": ncv, "maxiter": maxiter, "v0": v0}
    values: ComplexArray = eigs(op, k, return_eigenvectors=False, **options)
    return values


def _solve_arpack(op: _QuotientOperator, tol: float) -> ComplexArray:
    """ARPACK; again with a larger Krylov space and at most ARPACK_RETRY_TOL; then dense."""
    try:
        return _arpack(op, tol, ARPACK_NCV, ARPACK_MAXITER)
    except ArpackNoConvergence:
        pass
    try:
        return _arpack(op, max(tol, ARPACK_RETRY_TOL), ARPACK_RETRY_NCV, ARPACK_RETRY_MAXITER)
    except ArpackNoConvergence as err:
        if op.shape[0] <= DENSE_FALLBACK_MAX_ORDER:
            return np.linalg.eigvals(op.dense()).astype(np.complex128)
        raise QuotientConvergenceError(
            f"ARPACK did not converge on the quotient map of order {op.shape[0]} after "
            f"{op.count} products (tol {tol:g}, then {max(tol, ARPACK_RETRY_TOL):g}), and it is "
            f"too large to solve dense (> {DENSE_FALLBACK_MAX_ORDER})"
        ) from err


def _quotient(layer: CheckedLayer, method: str, tol: float) -> tuple[float, complex, int]:
    check_choice(method, "method", ("auto", "dense", "arpack"))
    op = _QuotientOperator(layer)
    order = op.shape[0]
    if order == 0:
        return 0.0, 0j, 0
    if method == "arpack" and order < ARPACK_WANTED + 2:
        raise InputError(
            f"ARPACK needs a quotient of order at least {ARPACK_WANTED + 2}; got {order}"
        )
    if method == "dense" or (method == "auto" and order <= DENSE_MAX_ORDER):
        values = np.linalg.eigvals(op.dense()).astype(np.complex128)
    else:
        values = _solve_arpack(op, tol)
    top = _top(values)
    return abs(top), top, op.count


def quotient_radius(
    A_heads: ArrayLike,
    M_heads: ArrayLike | HeadFactors,
    *,
    tol: float = ARPACK_TOL,
    method: Method = "auto",
) -> tuple[float, complex, int]:
    """Spectral radius of the layer on the quotient by the low-frequency subspace, matrix-free.

    The map ``Y ↦ Qᵀ (Q Y + Σ_h A_h Q Y M_h)`` on (n−1)×d matrices, Q an orthonormal basis of 𝟙^⊥
    (an implicit Householder reflector), is T's induced map on ``R^{n×d} / L``.

    Parameters
    ----------
    A_heads : (heads, n, n) array_like
        Row-stochastic attention per head.
    M_heads : (heads, d, d) array_like or HeadFactors
        ``M_h = W_V^h W_O^h``.
    tol : float
        ARPACK's relative residual ``‖T y − θ y‖ ≤ tol |θ|``.
    method : {"auto", "dense", "arpack"}
        "auto" is dense up to order :data:`DENSE_MAX_ORDER`, ARPACK above; "arpack" needs order at
        least ``ARPACK_WANTED + 2``.

    Returns
    -------
    rho : float
        ``max |θ|`` over the quotient's eigenvalues θ (0.0 when n = 1).
    eigenvalue : complex
        A θ with ``|θ| = rho`` (Im ≥ 0 of a conjugate pair).
    iterations : int
        Applications of the map to a vector.

    Raises
    ------
    QuotientConvergenceError
        ARPACK failed twice on a quotient above :data:`DENSE_FALLBACK_MAX_ORDER`.
    """
    return _quotient(checked_layer(A_heads, M_heads), method, tol)


def _kind(rho_lfc: float, rho_quotient: float, tie_rtol: float) -> Kind:
    if rho_lfc > rho_quotient * (1.0 + tie_rtol):
        return "perron"
    if rho_quotient > rho_lfc * (1.0 + tie_rtol):
        return "non-perron"
    return "balanced"


def operator_dominance(
    A_heads: ArrayLike,
    M_heads: ArrayLike | HeadFactors,
    *,
    tie_rtol: float = TIE_RTOL,
    tol: float = ARPACK_TOL,
    method: Method = "auto",
) -> OperatorDominance:
    """Which side of ``T = I + Σ_h M_hᵀ ⊗ A_h`` dominates: the low-frequency subspace or the quotient.

    Parameters
    ----------
    A_heads : (heads, n, n) array_like
        Row-stochastic attention per head; a single (n, n) matrix is one head.
    M_heads : (heads, d, d) array_like or HeadFactors
        ``M_h = W_V^h W_O^h``, dense or factored.
    tie_rtol : float
        Relative gap under which the two radii tie ("balanced").
    tol, method
        See :func:`quotient_radius`.

    Returns
    -------
    OperatorDominance
    """
    layer = checked_layer(A_heads, M_heads)
    lfc = _lfc(layer.W_V, layer.W_O)
    rho_quotient, mu_quotient, iterations = _quotient(layer, method, tol)
    mu_lfc = _top(lfc)
    kind = _kind(abs(mu_lfc), rho_quotient, tie_rtol)
    eigenvalue = mu_quotient if kind == "non-perron" else mu_lfc
    return OperatorDominance(kind, abs(mu_lfc), rho_quotient, eigenvalue, iterations)
