"""The layer's dominating eigenvalue (simulator.operator) against dense eig of the nd×nd T.

``T = I + Σ_h M_hᵀ ⊗ A_h`` is formed here with ``np.kron`` (column-major vec: vec(A X M) =
(Mᵀ ⊗ A) vec X) on small layers, and the module's two radii are compared with references computed
from T alone: T restricted to L = 𝟙 ⊗ R^d, and the centred map (I_d ⊗ P) T, P = I − 𝟙𝟙ᵀ/n, whose
spectrum is the quotient's plus d zeros. Both the dense and the ARPACK path are checked; a layer
where the per-head rule and the operator disagree, exact ties by symmetry, the invariance of L, and
a ViT-sized layer (n = 257, d = 64, 6 heads) solved without any nd×nd array complete it.
"""

from __future__ import annotations

import time
import tracemalloc
from typing import Any

import numpy as np
import pytest
from hypothesis import assume, given, settings
from hypothesis import strategies as st
from numpy.testing import assert_allclose
from scipy.optimize import linear_sum_assignment
from scipy.sparse.linalg import ArpackNoConvergence
from threadpoolctl import threadpool_limits

from oversmooth.simulator import operator, spectra
from oversmooth.simulator.attention import softmax
from oversmooth.simulator.errors import InputError
from oversmooth.simulator.operator import (
    HeadFactors,
    QuotientConvergenceError,
    apply_layer,
    lfc_eigenvalues,
    operator_dominance,
    quotient_matrix,
    quotient_radius,
)
from oversmooth.simulator.theory import KINDS, dominance, kron_eigenvalues, perron_index
from oversmooth.simulator.tolerances import (
    ARPACK_RETRY_TOL,
    ARPACK_TOL,
    STEP_ATOL,
    STEP_RTOL,
    TIE_RTOL,
)
from tests.strategies import ATTENTION_KINDS, build_attention, seeds

#: The module's radii against the dense references (relative).
RADIUS_RTOL = 1e-8
#: The quotient radius against Lemma 1's from eig(A) (see test_one_head_agrees_with_lemma_1).
LEMMA_RTOL = 1e-6
#: A dense relative gap between the radii this large decides the kind beyond round-off.
CLEAR_GAP = 1e-6
#: The eigenvalue multisets of the plumbing check, matched one to one (absolute, O(1) spectra).
#: Sharpened attention can be nearly defective (eigenvector condition numbers of 1e11 and more, a
#: cluster of three eigenvalues about 0), and a cluster of k such eigenvalues moves by about
#: (κ eps)^(1/k): 1e-6 is seen. The power traces of the same check are exact to round-off.
MULTISET_ATOL = 1e-4


# -- layers and dense references -------------------------------------------------------------------


@st.composite
def layer_params(
    draw: st.DrawFn, *, n: tuple[int, int] = (2, 8), d: tuple[int, int] = (1, 6)
) -> dict[str, Any]:
    """Sizes, an attention generator, a sharpening power (nearly reducible A for large powers),
    a head width r (low rank when r < d), a scale of M and a seed."""
    dim = draw(st.integers(*d))
    return {
        "kind": draw(st.sampled_from(ATTENTION_KINDS)),
        "n": draw(st.integers(*n)),
        "d": dim,
        "heads": draw(st.integers(1, 4)),
        "r": draw(st.integers(1, dim)),
        "scale": draw(st.floats(0.2, 6.0)),
        "power": draw(st.sampled_from([1.0, 3.0, 12.0])),
        "m_scale": draw(st.floats(0.2, 3.0)),
        "seed": draw(seeds()),
    }


def build_layer(p: dict[str, Any]) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """``(A (heads, n, n), W_V (heads, d, r), W_O (heads, r, d))``: Gaussian, non-symmetric factors."""
    A = build_attention(p, batch=(p["heads"],)) ** p["power"]  # sharpened: nearly reducible
    A /= A.sum(axis=-1, keepdims=True)
    gen = np.random.default_rng(p["seed"] + 1)
    d, r, heads = p["d"], p["r"], p["heads"]
    W_V = gen.standard_normal((heads, d, r)) * (p["m_scale"] / np.sqrt(d))
    W_O = gen.standard_normal((heads, r, d)) / np.sqrt(r)
    return A, W_V, W_O


def dense_T(A: np.ndarray, M: np.ndarray) -> np.ndarray:
    """``I + Σ_h kron(M_hᵀ, A_h)``: vec(T X) for column-major vec."""
    n, d = A.shape[-1], M.shape[-1]
    return np.eye(n * d) + sum(np.kron(Mh.T, Ah) for Ah, Mh in zip(A, M, strict=True))


def dense_reference(A: np.ndarray, M: np.ndarray) -> dict[str, Any]:
    """Radii from T alone: T on L in the basis vec(𝟙 e_jᵀ)/√n, and ``(I_d ⊗ P) T`` for two
    projections P along 𝟙 (the centring ``I − 𝟙𝟙ᵀ/n`` and ``I − 𝟙 e_1ᵀ``), whose spectra are the
    quotient's plus d zeros.

    ``rtol`` is the radius tolerance: RADIUS_RTOL, or a hundred times the two quotient radii's own
    spread where the top is nearly defective (sharpened attention: then every eigensolver is
    good to about sqrt(eps) only)."""
    n, d = A.shape[-1], M.shape[-1]
    T = dense_T(A, M)
    basis = np.kron(np.eye(d), np.ones((n, 1)) / np.sqrt(n))  # (nd, d), orthonormal columns
    rho_lfc = float(np.abs(np.linalg.eigvals(basis.T @ T @ basis)).max())
    radii = [
        float(np.abs(np.linalg.eigvals(np.kron(np.eye(d), P) @ T)).max())
        for P in (np.eye(n) - 1.0 / n, np.eye(n) - np.outer(np.ones(n), np.eye(n)[0]))
    ]
    rho_q = radii[0]
    rtol = max(RADIUS_RTOL, 100 * abs(radii[1] - rho_q) / max(rho_q, 1.0))
    eig_T = np.linalg.eigvals(T)
    gap = abs(rho_lfc - rho_q) / max(rho_lfc, rho_q)
    kind = "perron" if rho_lfc > rho_q else "non-perron"  # compared only where gap > CLEAR_GAP
    return {
        "rho_lfc": rho_lfc,
        "rho_q": rho_q,
        "rtol": rtol,
        "eig_T": eig_T,
        "kind": kind,
        "gap": gap,
    }


def assert_same_multiset(a: np.ndarray, b: np.ndarray, atol: float) -> None:
    assert a.shape == b.shape
    cost = np.abs(a[:, None] - b[None, :])
    rows, cols = linear_sum_assignment(cost)
    assert cost[rows, cols].max() <= atol, cost[rows, cols].max()


def assert_matches_dense(result: operator.OperatorDominance, ref: dict[str, Any]) -> None:
    assert_allclose(result.rho_lfc, ref["rho_lfc"], rtol=RADIUS_RTOL)
    assert_allclose(result.rho_quotient, ref["rho_q"], rtol=ref["rtol"])
    top = max(result.rho_lfc, result.rho_quotient)
    assert_allclose(top, np.abs(ref["eig_T"]).max(), rtol=ref["rtol"])
    side = result.rho_quotient if result.kind == "non-perron" else result.rho_lfc
    assert_allclose(abs(result.eigenvalue), side, rtol=1e-15)
    assert result.eigenvalue.imag >= 0
    if ref["gap"] > CLEAR_GAP:
        assert result.kind == ref["kind"]
    assert result.kind in KINDS


# -- against dense eig of T ------------------------------------------------------------------------


@given(layer_params())
def test_the_spectrum_of_T_is_the_lfc_and_the_quotient_spectra(params) -> None:
    """Plumbing check of the decomposition: eig(T) = (1 + eig(Σ M_h)) ∪ eig(quotient matrix) as
    multisets, and through the traces of T's powers; the factored and the dense products give
    the same quotient matrix and LFC eigenvalues."""
    A, W_V, W_O = build_layer(params)
    M = W_V @ W_O
    Q = quotient_matrix(A, M)
    n, d = params["n"], params["d"]
    assert Q.shape == ((n - 1) * d, (n - 1) * d)
    T = dense_T(A, M)
    both = np.concatenate([lfc_eigenvalues(M), np.linalg.eigvals(Q)])
    assert_same_multiset(np.linalg.eigvals(T), both, MULTISET_ATOL)
    on_l = np.eye(d) + M.sum(axis=0).T
    for j in (1, 2, 3):  # tr(T^j) = tr(T|_L^j) + tr(Q^j): the same statement without eigensolvers
        power = np.linalg.matrix_power
        expected = np.trace(power(on_l, j)) + np.trace(power(Q, j))
        assert_allclose(np.trace(power(T, j)), expected, rtol=1e-12, atol=1e-12 * n * d)
    assert_allclose(quotient_matrix(A, HeadFactors(W_V, W_O)), Q, rtol=0, atol=1e-12)
    assert_same_multiset(lfc_eigenvalues(HeadFactors(W_V, W_O)), both[:d], 1e-8)


@given(layer_params())
def test_the_dense_path_equals_dense_eig_of_T(params) -> None:
    A, W_V, W_O = build_layer(params)
    ref = dense_reference(A, W_V @ W_O)
    for M in (W_V @ W_O, HeadFactors(W_V, W_O)):
        result = operator_dominance(A, M, method="dense")
        assert_matches_dense(result, ref)
        assert result.iterations == (params["n"] - 1) * params["d"]


@given(layer_params())
def test_the_arpack_path_equals_dense_eig_of_T(params) -> None:
    """ARPACK on orders where it is valid (the Krylov space is often the whole space here)."""
    A, W_V, W_O = build_layer(params)
    assume((params["n"] - 1) * params["d"] >= operator.ARPACK_WANTED + 2)
    ref = dense_reference(A, W_V @ W_O)
    assert_matches_dense(operator_dominance(A, HeadFactors(W_V, W_O), method="arpack"), ref)


@settings(max_examples=12)
@given(layer_params(n=(16, 40), d=(3, 10)))
def test_arpack_with_restarts_equals_the_dense_path(params) -> None:
    """Orders of 45 to 390, beyond ARPACK's Krylov space: restarts happen and must converge."""
    A, W_V, W_O = build_layer(params)
    dense = quotient_radius(A, HeadFactors(W_V, W_O), method="dense")
    arpack = quotient_radius(A, HeadFactors(W_V, W_O), method="arpack")
    assert_allclose(arpack[0], dense[0], rtol=RADIUS_RTOL)
    assert_allclose(abs(arpack[1]), arpack[0], rtol=1e-15)


@given(layer_params(d=(1, 4)))
def test_one_head_agrees_with_lemma_1(params) -> None:
    """One head: eig(T) = 1 + λ^A_i λ^M_j (Lemma 1); the Perron row is L, the others the quotient.

    Where the gap is clear, the layer is perron exactly when simulator.theory says so. (Its other
    kinds are finer: a conjugate pair of modes in two non-Perron rows is "balanced" there, a
    rank-two limit, and "non-perron" here, where only L and the quotient are told apart.) The
    reference eig(A) of sharpened attention is itself only good to about sqrt(κ eps) (κ its
    eigenvector condition number, up to 1e11), hence the looser radius tolerance.
    """
    A, W_V, W_O = build_layer({**params, "heads": 1})
    M = (W_V @ W_O)[0]
    mu = kron_eigenvalues(np.linalg.eigvals(A[0]), np.linalg.eigvals(M))
    p = int(perron_index(np.linalg.eigvals(A[0])))
    rho_q = float(np.abs(np.delete(mu, p, axis=0)).max())
    result = operator_dominance(A, M)
    assert_allclose(result.rho_lfc, np.abs(mu[p]).max(), rtol=RADIUS_RTOL)
    assert_allclose(result.rho_quotient, rho_q, rtol=LEMMA_RTOL)
    gap = abs(result.rho_lfc - rho_q) / max(result.rho_lfc, rho_q)
    if gap > CLEAR_GAP:
        assert (result.kind == "perron") == (dominance(A[0], M.T).kind == "perron")


# -- the per-head rule is not the layer's ----------------------------------------------------------


@pytest.mark.parametrize(("n", "d", "method"), [(6, 3, "dense"), (40, 8, "arpack")])
def test_heads_that_are_perron_alone_make_a_non_perron_layer(n, d, method) -> None:
    """``M_1 = 2.5 G``, ``M_2 = −3 G`` with spec(G) ⊂ [0.5, 1] and PSD-score attention (spectrum in
    [0, 1)): alone each head is perron (``1 + 2.5`` and ``|1 − 3|`` beat every other row), but
    ``Σ M_h = −0.5 G`` leaves L at most 0.75 while the quotient keeps modes near 1."""
    A = spectra.attention_symmetric_scores(n, scale=1.0, scores="psd", batch=(2,), rng=3)
    G = spectra.h_symmetric(np.linspace(0.5, 1.0, d), rng=4)
    M = np.stack([2.5 * G, -3.0 * G])
    per_head = [dominance(A[h], M[h].T).kind for h in range(2)]
    assert per_head == ["perron", "perron"]
    result = operator_dominance(A, M, method=method)
    assert result.kind == "non-perron"
    assert_allclose(result.rho_lfc, 0.75, rtol=1e-12)
    if n * d <= 64:
        ref = dense_reference(A, M)
        assert_matches_dense(result, ref)
        assert ref["kind"] == "non-perron"
    else:
        dense = quotient_radius(A, M, method="dense")
        assert_allclose(result.rho_quotient, dense[0], rtol=RADIUS_RTOL)
    assert result.rho_quotient > 1.0


# -- exact ties by symmetry ------------------------------------------------------------------------


def swap_layer(B: np.ndarray, C: np.ndarray, D: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """``A_h = P ⊗ B_h`` (P the 2×2 swap) and ``M_h = [[0, C_h], [D_h, 0]]``.

    With σ = (1, −1), both 𝟙_2 ⊗ R^k and σ ⊗ R^k are A_h-invariant, A_h acting as B_h and −B_h; so
    T is ``T_+ = I + Σ M_hᵀ ⊗ B_h`` plus ``T_- = I − Σ M_hᵀ ⊗ B_h``, and ``R M_h R = −M_h``
    (R = diag(I, −I)) makes T_- similar to T_+. L lies in the T_+ part, T_- wholly in the quotient:
    when T_+ is perron, ``rho_quotient = rho(T_-) = rho(T_+) = rho_lfc`` exactly."""
    P = np.array([[0.0, 1.0], [1.0, 0.0]])
    A = np.stack([np.kron(P, b) for b in B])
    zero = np.zeros_like(C)
    M = np.concatenate(
        [np.concatenate([zero, C], axis=-1), np.concatenate([D, zero], axis=-1)], axis=-2
    )
    return A, M


@given(
    st.integers(1, 12),
    st.integers(1, 3),
    st.integers(1, 3),
    st.floats(0.1, 1.0),
    seeds(),
    st.booleans(),
)
def test_a_symmetric_layer_is_balanced(k, m, heads, scale, seed, arpack) -> None:
    gen = np.random.default_rng(seed)
    if k == 1:
        B = np.ones((heads, 1, 1))
    else:
        B = spectra.attention_general(k, scale=scale, batch=(heads,), rng=gen)
    C, D = 1.5 * gen.standard_normal((2, heads, m, m))
    A, M = swap_layer(B, C, D)
    n, d = 2 * k, 2 * m
    plus = dense_reference(B, M)  # T_+ is the layer (B_h, M_h) on k tokens
    assume(plus["rho_q"] < (1.0 - 1e-3) * plus["rho_lfc"])
    method = "arpack" if arpack and (n - 1) * d >= operator.ARPACK_WANTED + 2 else "dense"
    result = operator_dominance(A, M, method=method)
    assert result.kind == "balanced"
    assert_allclose(result.rho_quotient, result.rho_lfc, rtol=TIE_RTOL)
    assert_allclose(result.rho_lfc, plus["rho_lfc"], rtol=RADIUS_RTOL)


def test_the_two_token_swap_ties_exactly() -> None:
    """n = 2, A_h the swap for every head: the quotient is ``I − Mᵀ``, L is ``I + Mᵀ``, and a
    spectrum of M symmetric about 0 makes them the same."""
    M = np.array([[[0.0, 0.7], [0.2, 0.0]], [[0.0, -0.1], [0.9, 0.0]]])
    A = np.stack([np.array([[0.0, 1.0], [1.0, 0.0]])] * 2)
    result = operator_dominance(A, M)
    assert result.kind == "balanced"
    assert_allclose(result.rho_quotient, result.rho_lfc, rtol=1e-15)
    assert_allclose(result.eigenvalue, 1.0 + np.sqrt(0.6 * 1.1), rtol=1e-15)


# -- the low-frequency subspace --------------------------------------------------------------------


@given(layer_params(), seeds())
def test_the_low_frequency_subspace_is_invariant(params, seed) -> None:
    """``T(𝟙 sᵀ) = 𝟙 (s + Mᵀ s)ᵀ`` with M = Σ_h M_h, and apply_layer is vec⁻¹ of T's product."""
    A, W_V, W_O = build_layer(params)
    M = W_V @ W_O
    gen = np.random.default_rng(seed)
    s = gen.standard_normal(params["d"])
    ones = np.ones((params["n"], 1))
    for products in (M, HeadFactors(W_V, W_O)):
        image = apply_layer(A, products, ones * s)
        assert_allclose(image, ones * (s + M.sum(axis=0).T @ s), rtol=STEP_RTOL, atol=STEP_ATOL)
    X = gen.standard_normal((params["n"], params["d"]))
    vec = dense_T(A, M) @ X.reshape(-1, order="F")
    assert_allclose(apply_layer(A, M, X).reshape(-1, order="F"), vec, rtol=1e-12, atol=1e-12)


def test_lfc_eigenvalues_need_no_attention() -> None:
    gen = np.random.default_rng(5)
    W_V, W_O = gen.standard_normal((3, 6, 2)), gen.standard_normal((3, 2, 6))
    expected = 1.0 + np.linalg.eigvals((W_V @ W_O).sum(axis=0))
    for products in (W_V @ W_O, HeadFactors(W_V, W_O)):
        assert_same_multiset(lfc_eigenvalues(products), expected, 1e-10)
    small = HeadFactors(W_V[:1], W_O[:1])  # rank 2 < d: four eigenvalues exactly 1
    assert (lfc_eigenvalues(small) == 1.0).sum() == 4


# -- a ViT-sized layer -----------------------------------------------------------------------------


def test_a_vit_sized_layer_is_solved_without_an_nd_by_nd_array() -> None:
    """n = 257, d = 64, 6 heads sharing one attention matrix (so that Lemma 1 gives the exact
    answer from eig(A) and eig(M)): ARPACK on the order-16384 quotient, peak memory a few MiB
    where T alone would take 2 GiB."""
    n, d, heads, r = 257, 64, 6, 16
    gen = np.random.default_rng(6)
    groups = np.arange(n) % 3  # three token groups: eigenvalues of A near 1 stand out
    logits = 0.5 * gen.standard_normal((n, n)) + 4.0 * np.equal.outer(groups, groups)
    A = np.broadcast_to(softmax(logits), (heads, n, n))
    W_V = gen.standard_normal((heads, d, r)) / np.sqrt(d)
    W_O = gen.standard_normal((heads, r, d)) / np.sqrt(r)
    tracemalloc.start()
    start = time.perf_counter()
    with threadpool_limits(limits=1, user_api="blas"):  # as in the audit: small BLAS calls
        result = operator_dominance(A, HeadFactors(W_V, W_O))
    elapsed = time.perf_counter() - start
    peak = tracemalloc.get_traced_memory()[1]
    tracemalloc.stop()
    assert peak < 64 * 2**20, peak
    lam_A = np.linalg.eigvals(A[0])
    mu = kron_eigenvalues(lam_A, np.linalg.eigvals((W_V @ W_O).sum(axis=0)))
    p = int(perron_index(lam_A))
    assert_allclose(result.rho_lfc, np.abs(mu[p]).max(), rtol=RADIUS_RTOL)
    assert_allclose(result.rho_quotient, np.abs(np.delete(mu, p, axis=0)).max(), rtol=RADIUS_RTOL)
    assert 0 < result.iterations < 1000
    assert elapsed < 10.0  # about 0.3 s on one core


# -- refusals and failures -------------------------------------------------------------------------


def test_bad_input_is_refused() -> None:
    A = spectra.attention_general(4, batch=(2,), rng=1)
    M = np.zeros((2, 3, 3))
    with pytest.raises(InputError, match="as many heads"):
        operator_dominance(A, M[:1])
    with pytest.raises(InputError, match="row-stochastic"):
        operator_dominance(A * 1.1, M)
    with pytest.raises(InputError, match="W_O"):
        operator_dominance(A, HeadFactors(np.zeros((2, 3, 2)), np.zeros((2, 3, 2))))
    with pytest.raises(InputError, match="method"):
        operator_dominance(A, M, method="power")  # type: ignore[arg-type]
    with pytest.raises(InputError, match="ARPACK needs"):
        operator_dominance(A[:, :2, :2] * 0 + 0.5, M[:, :1, :1], method="arpack")
    with pytest.raises(InputError, match="X"):
        apply_layer(A, M, np.zeros((4, 2)))


def test_a_single_token_has_an_empty_quotient() -> None:
    result = operator_dominance(np.ones((2, 1, 1)), np.full((2, 3, 3), 0.1))
    assert (result.rho_quotient, result.iterations) == (0.0, 0)
    assert result.kind == "perron"


def test_arpack_failures_fall_back_to_dense_then_raise(monkeypatch) -> None:
    A, W_V, W_O = build_layer(
        {
            "kind": "general",
            "n": 30,
            "d": 8,
            "heads": 2,
            "r": 3,
            "scale": 1.0,
            "power": 1.0,
            "m_scale": 1.0,
            "seed": 9,
        }
    )
    dense = quotient_radius(A, HeadFactors(W_V, W_O), method="dense")
    calls = []

    def failing_eigs(*args, **kwargs):
        calls.append((kwargs["ncv"], kwargs["tol"]))
        raise ArpackNoConvergence("no convergence", np.array([]), np.array([]))

    monkeypatch.setattr(operator, "eigs", failing_eigs)
    fallback = quotient_radius(A, HeadFactors(W_V, W_O), method="arpack")
    assert fallback[:2] == dense[:2]
    assert len(calls) == 2
    assert calls[1][0] > calls[0][0]  # a larger Krylov space
    assert calls[1][1] == max(ARPACK_TOL, ARPACK_RETRY_TOL)  # and a looser residual
    monkeypatch.setattr(operator, "DENSE_FALLBACK_MAX_ORDER", 10)
    with pytest.raises(QuotientConvergenceError, match="did not converge"):
        quotient_radius(A, HeadFactors(W_V, W_O), method="arpack")
