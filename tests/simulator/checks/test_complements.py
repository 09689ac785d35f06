"""Claims 34 (S5c, the disks) and 35 (the LFC block of a multi-head layer),
:mod:`oversmooth.simulator.checks.complements`, with claim 11's complex example that the disks
explain: each check's premise computed independently of the check's body.

Moved from tests/simulator/test_checks_complex_s5.py, but for claim 21's test (now in
test_reparameterization.py) and the claim-11 check's registration (test_linear_algebra.py).
"""

from __future__ import annotations

import math

import numpy as np
import pytest
from hypothesis import assume, given
from hypothesis import strategies as st

from oversmooth.simulator import spectra, theory
from oversmooth.simulator import tolerances as tol
from oversmooth.simulator.checks import CHECKS, complements
from tests.strategies import seeds

BY_NAME = {check.name: check for check in CHECKS}


def _two_token_attention(t: float) -> np.ndarray:
    """``[[1-a, a], [a, 1-a]]`` with spectrum {1, t}, ``a = (1 - t) / 2``."""
    a = (1.0 - t) / 2.0
    return np.array([[1.0 - a, a], [a, 1.0 - a]])


def _pair_block(z: complex) -> np.ndarray:
    """The real 2x2 H with eigenvalues z and conj(z)."""
    return np.array([[z.real, -z.imag], [z.imag, z.real]])


def _in_disk(z: complex, t: float) -> float:
    """``|c| - |z - c|`` for the disk of the real eigenvalue t (positive inside)."""
    c = -1.0 / (1.0 + t)
    return abs(c) - abs(z - c)


# ----------------------------------------------------------------------------------------------
# claim 11: S5 fails for complex lambda^H with real part in [-1, 0)
# ----------------------------------------------------------------------------------------------


def test_claim_11_complex_example_is_perron_dominated() -> None:
    # lambda^H = -1 ± 0.9i, spec(A) = {0.5, 1}: |1 + z| = 0.9 > |1 + 0.5 z| = 0.673.
    z = complex(-1.0, 0.9)
    dom = theory.dominance(_two_token_attention(0.5), _pair_block(z))
    assert dom.kind == "perron"
    assert dom.modulus == pytest.approx(0.9, rel=tol.STEP_RTOL)
    assert abs(1 + 0.5 * z) == pytest.approx(math.sqrt(0.25 + 0.2025), rel=tol.STEP_RTOL)
    assert _in_disk(z, 0.5) < 0  # outside D_0.5, as S5c says it must be
    # The real value with the same real part is inside S5's hypothesis and not Perron-dominated.
    assert theory.dominance(_two_token_attention(0.5), [[-1.0]]).kind == "non-perron"


# ----------------------------------------------------------------------------------------------
# claim 34: the disks D_w of S5c
# ----------------------------------------------------------------------------------------------


@given(
    t=st.floats(-0.9, 0.9),
    x=st.floats(-3.0, 1.0),
    y=st.floats(0.01, 2.0),
)
def test_claim_34_one_pair_is_perron_dominated_exactly_outside_the_disk(
    t: float, x: float, y: float
) -> None:
    # For d = 2 (one pair) and spec(A) = {1, t}, S5c is an equivalence: inside <=> no Perron.
    z = complex(x, y)
    depth = _in_disk(z, t)
    assume(abs(depth) > 1e-6)
    kind = theory.dominance(_two_token_attention(t), _pair_block(z)).kind
    assert (kind == "perron") == (depth < 0), (t, z, depth, kind)


@given(
    w_abs=st.floats(0.0, 0.99),
    w_arg=st.floats(0.0, 2 * math.pi),
    x=st.floats(-3.0, 3.0),
    y=st.floats(-3.0, 3.0),
    s=st.floats(1e-3, 1.0),
)
def test_claim_34_disk_identity_contains_s5_and_excludes_s6(
    w_abs: float, w_arg: float, x: float, y: float, s: float
) -> None:
    # |1 + w z|^2 - |1 + z|^2 = (1 - |w|^2) (|c_w|^2 - |z - c_w|^2): inside D_w <=> row w beats Perron.
    w = w_abs * complex(math.cos(w_arg), math.sin(w_arg))
    z = complex(x, y)
    (c,) = complements.disk_centers([1.0, w])
    lhs = abs(1 + w * z) ** 2 - abs(1 + z) ** 2
    rhs = (1 - w_abs**2) * (abs(c) ** 2 - abs(z - c) ** 2)
    assert lhs == pytest.approx(rhs, rel=1e-9, abs=1e-9 * (1 + abs(c)) ** 2 * (1 + abs(z)) ** 2)
    assert abs(-s - c) < abs(c)  # S5: [-1, 0) lies inside every D_w
    assert abs(s - c) > abs(c)  # S6: no positive real does


def test_claim_34_real_disk_centre() -> None:
    (c,) = complements.disk_centers([1.0, 0.5])
    assert c == pytest.approx(-1.0 / 1.5, rel=tol.STEP_RTOL)
    (c0,) = complements.disk_centers([0.0, 1.0])  # w = 0: the disk |z + 1| < 1
    assert c0 == pytest.approx(-1.0, rel=tol.STEP_RTOL)


@given(seed=seeds(), side=st.sampled_from(("inside", "outside")), d=st.integers(1, 8))
def test_claim_34_drawn_spectra_satisfy_the_hypothesis(seed: int, side: str, d: int) -> None:
    gen = np.random.default_rng(seed)
    A = spectra.attention_general(6, rng=gen)
    eig_A = np.linalg.eigvals(A)
    centers = complements.disk_centers(eig_A)
    p = {"d": d, "side": side, "depth": 0.9}
    values = np.array(complements.disk_spectrum(p, eig_A, gen))
    assert values.size == d
    np.testing.assert_allclose(np.sort_complex(values), np.sort_complex(values.conj()), atol=0)
    inside = np.abs(values[:, None] - centers[None, :]) < np.abs(centers)[None, :]
    if side == "inside":
        assert inside.any(axis=1).all()
    else:
        assert not inside.any()
    # Every inside eigenvalue beats its Perron value in some non-Perron row (the claim's premise).
    p_idx = int(theory.perron_index(eig_A))
    others = np.delete(eig_A, p_idx)
    beats = np.abs(1 + others[None, :] * values[:, None]).max(axis=1) > np.abs(1 + values)
    assert beats.all() if side == "inside" else not beats.any()


def test_claim_34_draws_complex_spectra() -> None:
    check = BY_NAME["s5_complex_disks"]
    gen = np.random.default_rng(0)
    eig_A = np.linalg.eigvals(spectra.attention_symmetric_scores(5, rng=gen))
    complex_draws = 0
    for seed in range(20):
        values = complements.disk_spectrum(
            {"d": 6, "side": "inside", "depth": 0.5}, eig_A, np.random.default_rng(seed)
        )
        complex_draws += any(abs(v.imag) > 0 for v in values)
    assert complex_draws >= 10
    assert not check.counterexample


# ----------------------------------------------------------------------------------------------
# claim 35: the LFC block of a multi-head layer
# ----------------------------------------------------------------------------------------------


@given(seed=seeds(), heads=st.integers(1, 4))
def test_claim_35_lfc_block_needs_row_stochastic_heads(seed: int, heads: int) -> None:
    p = {"n": 5, "d": 4, "heads": heads, "a_kind": "general", "seed": seed}
    A, M, T = complements.multi_head_system(p)
    predicted = 1.0 + np.linalg.eigvals(sum(M))
    dense = np.linalg.eigvals(T)
    distance = np.abs(predicted[:, None] - dense[None, :]).min(axis=1)
    assert distance.max() <= tol.EIG_TOL * (1.0 + np.abs(dense).max())
    # Row sums 1.5 instead of 1 scale the block to s -> (I + 1.5 sum_h M_h)^T s: the identity breaks.
    T_off = np.eye(T.shape[0]) + sum(1.5 * np.kron(Mh.T, Ah) for Mh, Ah in zip(M, A, strict=True))
    off = np.abs(predicted[:, None] - np.linalg.eigvals(T_off)[None, :]).min(axis=1)
    nonzero = np.abs(predicted - 1.0) > 1e-3
    assume(nonzero.any())
    assert off[nonzero].max() > 1e3 * tol.EIG_TOL


def test_claim_35_one_head_is_lemma_1s_perron_row() -> None:
    p = {"n": 4, "d": 3, "heads": 1, "a_kind": "symmetric", "seed": 7}
    A, M, _ = complements.multi_head_system(p)
    mu = theory.kron_eigenvalues(np.linalg.eigvals(A[0]), np.linalg.eigvals(M[0].T))
    perron_row = mu[int(theory.perron_index(np.linalg.eigvals(A[0])))]
    np.testing.assert_allclose(
        np.sort_complex(perron_row),
        np.sort_complex(1.0 + np.linalg.eigvals(M[0])),
        atol=tol.EIG_TOL,
    )


def test_the_module_registers_claims_34_and_35() -> None:
    assert [check.claim for check in complements.CHECKS] == [34, 35]
