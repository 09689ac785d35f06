"""The certified dominance step (simulator.perron) against the dense path it replaces.

The dense path computes every eigenvalue of A and applies Definition 4 (``certify=False``); the
certified path must give the same kind for every head and the same μ, λ^A and λ^H to 1e-9, on
random row-stochastic matrices of every generator (sharp ones close to reducible included), near
ties, periodic and decomposable matrices, complex H spectra, and matrices it must refuse. The
bound itself (simulator.doeblin) is tested in test_doeblin.py.
"""

from __future__ import annotations

import numpy as np
import pytest
from hypothesis import assume, example, given
from hypothesis import strategies as st
from numpy.testing import assert_allclose

from oversmooth.simulator import spectra
from oversmooth.simulator.perron import (
    CERTIFY_MIN_ORDER,
    DominatingModes,
    dominating_modes,
    nonperron_radius,
    perron_certified,
    perron_targets,
)
from oversmooth.simulator.theory import HEAD_KINDS, contracting_heads, dominance_kinds
from oversmooth.simulator.tolerances import EIG_TOL, PERRON_MARGIN, TIE_RTOL
from tests.simulator.stochastic import sharpened
from tests.strategies import attention_params, build_attention, complex_spectra, real_spectra

HEADS = 3


def assert_same_as_dense(A: np.ndarray, eig_H: np.ndarray) -> DominatingModes:
    """The certified path equals the dense one (kinds exactly, modes to EIG_TOL); returns it.

    Matrices of every order try the certificate (``min_order=1``), small ones included."""
    fast = dominating_modes(A, eig_H, min_order=1)
    dense = dominating_modes(A, eig_H, certify=False)
    assert not dense.certified.any()
    np.testing.assert_array_equal(fast.kinds, dense.kinds)
    for name in ("mu", "eig_A", "eig_H"):
        assert_allclose(getattr(fast, name), getattr(dense, name), rtol=0, atol=EIG_TOL)
    assert (fast.kinds[fast.certified] == 0).all()
    assert_allclose(fast.eig_A[fast.certified], 1.0, rtol=0, atol=0)
    return fast


def spectra_for_heads(values: list[complex], heads: int = HEADS) -> np.ndarray:
    return np.tile(np.asarray(values, dtype=np.complex128), (heads, 1))


# -- random matrices -------------------------------------------------------------------------------


@given(
    attention_params(n=(2, 40), scale=(0.2, 6.0)),
    st.one_of(real_spectra(max_size=6), complex_spectra()),
    st.sampled_from([1.0, 3.0, 12.0]),
)
def test_certified_path_equals_the_dense_path(params, eig_H, power) -> None:
    A = sharpened(build_attention(params, batch=(HEADS,)), power)
    assert_same_as_dense(A, spectra_for_heads(eig_H))


@given(
    attention_params(kinds=("symmetric", "doubly-stochastic"), n=(3, 24), scale=(0.5, 4.0)),
    st.floats(0.05, 2.0),
    st.sampled_from([0.0, 1e-12, 5e-10, 2e-9, 1e-7, 1e-6, 3e-6, 1e-4, 1e-2]),
)
def test_near_ties_between_the_perron_row_and_another_row(params, a, gap) -> None:
    """H = {a, b < 0}: ``|1 + b λ_min|`` sits ``gap`` (relative) below the Perron ``1 + a``.

    With a real spectrum and b < 0 the largest non-Perron ``|1 + b λ|`` is at the most negative
    λ; ``|1 + b| < 1 + a`` keeps a's Perron mode on top. Gaps below the tie tolerance make the
    case non-perron; those below the margin must never be certified.
    """
    A = build_attention(params, batch=(HEADS,))
    lowest = np.linalg.eigvals(A).real.min(axis=-1)  # a real spectrum by construction
    assume(np.all(lowest < -1e-2))
    b = -((1.0 + a) * (1.0 - gap) - 1.0) / -lowest
    assume(np.all(np.abs(1.0 + b) < (1.0 + a) * (1.0 - 1e-3)))
    eig_H = np.stack([np.full(HEADS, a), b], axis=-1).astype(np.complex128)
    fast = assert_same_as_dense(A, eig_H)
    if gap < PERRON_MARGIN:
        assert not fast.certified.any()


# -- structured matrices ---------------------------------------------------------------------------


def test_periodic_and_decomposable_attention_is_never_certified() -> None:
    cyclic = np.roll(np.eye(5), 1, axis=1)  # eigenvalues: the fifth roots of unity
    two_blocks = np.zeros((6, 6))
    two_blocks[:3, :3] = 1 / 3
    two_blocks[3:, 3:] = 1 / 3  # the eigenvalue 1 twice
    for A in (cyclic, two_blocks):
        stack = np.stack([A] * HEADS)
        eig_H = spectra_for_heads([0.8, -0.3, 0.1 + 0.2j, 0.1 - 0.2j])
        assert not assert_same_as_dense(stack, eig_H).certified.any()
        assert (nonperron_radius(stack) >= 1.0).all()


def test_diffuse_attention_is_certified_with_the_perron_mode() -> None:
    A = spectra.attention_symmetric_scores(64, scale=0.3, batch=(HEADS,), rng=1)
    eig_H = spectra_for_heads([0.9, -0.6, 0.2 + 0.5j, 0.2 - 0.5j, 0.0])
    fast = assert_same_as_dense(A, eig_H)
    assert fast.certified.all()
    assert_allclose(fast.mu, 1.9, rtol=0, atol=0)


def test_small_matrices_go_dense_by_default_with_the_same_answer() -> None:
    """Below CERTIFY_MIN_ORDER the default skips the certificate (cheaper dense); at it, it tries."""
    eig_H = spectra_for_heads([0.9, -0.6, 0.2 + 0.5j, 0.2 - 0.5j, 0.0])
    for n, tries in ((CERTIFY_MIN_ORDER - 1, False), (CERTIFY_MIN_ORDER, True)):
        A = spectra.attention_symmetric_scores(n, scale=0.3, batch=(HEADS,), rng=1)
        default = dominating_modes(A, eig_H)
        assert default.certified.tolist() == [tries] * HEADS
        certified = assert_same_as_dense(A, eig_H)
        assert certified.certified.all()
        np.testing.assert_array_equal(default.kinds, certified.kinds)
        assert_allclose(default.mu, certified.mu, rtol=0, atol=EIG_TOL)


def test_a_nearly_decomposable_psd_attention_is_certified_by_the_shifted_disk() -> None:
    """λ_2 ≈ 0.99 defeats the disk about 0, but a PSD-score A has its spectrum in [0, 1]:
    the disk about α = ρ/2 keeps ``|1 − 0.35 λ|`` below the Perron ``1.3``."""
    A = spectra.attention_symmetric_scores(12, scale=2.0, scores="psd", batch=(HEADS,), rng=7)
    eig_H = spectra_for_heads([0.3, -0.35])
    assert (nonperron_radius(A) > perron_targets(eig_H).radius).all()
    assert assert_same_as_dense(A, eig_H).certified.all()


def test_a_complex_pair_on_top_reports_the_dense_path_member() -> None:
    """Both members of a conjugate pair give the same |μ|: the first one in eig order wins."""
    A = spectra.attention_symmetric_scores(32, scale=0.3, batch=(HEADS,), rng=2)
    for pair in ([0.7 - 0.4j, 0.7 + 0.4j], [0.7 + 0.4j, 0.7 - 0.4j]):
        eig_H = spectra_for_heads([-0.2, *pair, 0.1])
        fast = assert_same_as_dense(A, eig_H)
        assert fast.certified.all()
        assert_allclose(fast.eig_H, pair[0], rtol=0, atol=0)


def test_an_ambiguous_top_of_h_goes_to_the_dense_path() -> None:
    """Two different λ^H with the same |1 + λ^H|: the dense argmax depends on round-off."""
    angle = 0.3
    other = -1.0 + 1.5 * np.exp(1j * angle)  # |1 + other| = 1.5 = |1 + 0.5|
    eig_H = spectra_for_heads([0.5, other, np.conj(other)])
    assert (perron_targets(eig_H).radius == 0).all()
    A = spectra.attention_symmetric_scores(16, scale=0.3, batch=(HEADS,), rng=3)
    assert not assert_same_as_dense(A, eig_H).certified.any()


@pytest.mark.parametrize(
    "eig_H",
    [[-0.5, -0.2], [0.0, 0.0], [-2.5, 0.1]],
    ids=["top-below-one", "zero-H", "negative-dominates"],
)
def test_h_without_a_certifiable_top_has_no_target(eig_H) -> None:
    targets = perron_targets(spectra_for_heads(eig_H))
    assert (targets.radius <= 1.0).all()
    A = spectra.attention_symmetric_scores(8, scale=1.0, batch=(HEADS,), rng=4)
    assert_same_as_dense(A, spectra_for_heads(eig_H))


def test_matrices_that_are_not_stochastic_are_refused() -> None:
    A = spectra.attention_symmetric_scores(6, scale=0.3, batch=(HEADS,), rng=5)
    negative = A.copy()
    negative[:, 0, :2] += [-0.01, 0.01]  # rows still sum to 1, one entry below 0
    if (negative >= 0).all():
        negative[:, 0, 0] = -1e-3
        negative[:, 0, 1] += 1e-3
    loose = A * 1.01  # rows sum to 1.01
    targets = perron_targets(spectra_for_heads([0.9, 0.1]))
    for bad in (negative, loose):
        assert not perron_certified(bad, targets).any()
        assert np.isinf(nonperron_radius(bad)).all()
    assert perron_certified(A, targets).all()


def test_a_single_token_has_no_other_eigenvalue_and_an_empty_stack_no_case() -> None:
    one = np.ones((HEADS, 1, 1))
    assert (nonperron_radius(one) < 1e-12).all()  # zero up to the counted round-off
    assert assert_same_as_dense(one, spectra_for_heads([0.5, -0.1])).certified.all()
    assert not assert_same_as_dense(one, spectra_for_heads([-0.5, -0.1])).certified.any()
    empty = dominating_modes(np.zeros((0, 4, 4)), np.zeros((0, 2), dtype=complex))
    assert empty.kinds.shape == (0,)


def test_the_targets_radius_is_the_largest_that_keeps_other_rows_below_the_tie() -> None:
    eig_H = np.array([[0.6, -0.8, 0.1j]])
    targets = perron_targets(eig_H)
    top = 1.6 * (1 - TIE_RTOL) * (1 - PERRON_MARGIN)
    assert_allclose(targets.radius, (top - 1.0) / 0.8, rtol=1e-15)
    assert targets.best.tolist() == [0]


def test_only_heads_left_undecided_by_the_first_squarings_are_estimated(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """The estimate costs about two squarings a head: a head that the first disk certifies within
    ``HOPELESS_SQUARINGS`` squarings is never estimated, and the answer is still the dense one."""
    from oversmooth.simulator import doeblin, perron

    estimated: list[np.ndarray] = []
    estimate = doeblin.nonperron_estimate

    def recording(A: np.ndarray, shift: np.ndarray) -> np.ndarray:
        estimated.extend(A)
        return estimate(A, shift)

    monkeypatch.setattr(perron, "nonperron_estimate", recording)
    mild = [spectra.attention_symmetric_scores(40, scale=s, rng=1) for s in (0.3, 1.0, 1.5)]
    sharp = spectra.attention_symmetric_scores(40, scale=2.0, scores="psd", batch=(2,), rng=7)
    stack = np.concatenate([np.stack(mild), sharp])
    eig_H = spectra_for_heads([0.3, -0.35], heads=5)
    radius = perron_targets(eig_H).radius
    within = nonperron_radius(stack, squarings=doeblin.HOPELESS_SQUARINGS) < radius
    assert within.any()  # 0 squarings: the first head; 3: two more
    assert not within.all()
    assert_same_as_dense(stack, eig_H)
    assert estimated, "the undecided heads were estimated"
    for A in estimated:
        assert not any(np.array_equal(A, stack[h]) for h in np.flatnonzero(within))


@pytest.mark.parametrize("max_squarings", [0, 1, 2, 3])
def test_the_second_disk_is_centred_on_an_estimate_however_few_squarings(
    monkeypatch: pytest.MonkeyPatch, max_squarings: int
) -> None:
    """Heads that stop before the estimate (fewer squarings than ``_HOPELESS_SQUARINGS``) are
    estimated before the second disk: its centre is half the estimate, never a default."""
    from oversmooth.simulator import perron

    centred: list[np.ndarray] = []
    second_disk = perron._shifted_disk_certified

    def recording(A, targets, heads, rho, estimate, squarings):  # type: ignore[no-untyped-def]
        centred.append(estimate[heads])
        return second_disk(A, targets, heads, rho, estimate, squarings)

    monkeypatch.setattr(perron, "_shifted_disk_certified", recording)
    A = spectra.attention_symmetric_scores(12, scale=2.0, scores="psd", batch=(HEADS,), rng=7)
    eig_H = spectra_for_heads([0.3, -0.35])
    assert perron_certified(A, perron_targets(eig_H), max_squarings=max_squarings).all()
    assert centred, "the first disk left heads to the second"
    assert all(np.isfinite(values).all() for values in centred)


def _two_weakly_coupled_clusters(m: int = 3, a: float = 0.2, c: float = 0.03) -> np.ndarray:
    """Two clusters of m tokens (within: ``a`` on the diagonal, the rest spread evenly), each
    token also attending with weight c to its twin in the other cluster. Symmetric, with
    eigenvalues 1, 1 − 2c, ``(1 − c)(a − (1 − a)/(m − 1)) ± c``; every column holds zeros, so
    τ(A) = 1."""
    within = a * np.eye(m) + (1 - a) * (np.ones((m, m)) - np.eye(m)) / (m - 1)
    zero, twin = np.zeros((m, m)), np.eye(m)
    return (1 - c) * np.block([[within, zero], [zero, within]]) + c * np.block(
        [[zero, twin], [twin, zero]]
    )


def test_the_first_disk_is_finished_where_the_second_disk_needs_it(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """λ₂ = 0.94 and eigenvalues down to −0.224, against λ^H = 0.3 and −0.35 (first-disk target
    0.857): the first disk is hopeless, and with its bound at τ(A) = 1 the second disk about
    α = 0.47 must hold λ^H = 0.3 too (R = 0.53, below the spread 0.694). Squared towards |λ₂|,
    the first disk passes λ^H = 0.3 and R grows to 1.33: certified, as the dense path says.
    Without the tightening (no reachable ρ assumed) the head is left to the dense path."""
    from oversmooth.simulator import perron

    A = _two_weakly_coupled_clusters()[None]
    assert_allclose(np.sort(np.linalg.eigvals(A[0]).real), [-0.224] * 2 + [-0.164] * 2 + [0.94, 1])
    eig_H = spectra_for_heads([0.3, -0.35], heads=1)
    targets = perron_targets(eig_H)
    assert nonperron_radius(A, squarings=0)[0] >= 1.0 - 1e-12  # τ(A) = 1
    assert perron_certified(A, targets).tolist() == [True]
    modes = assert_same_as_dense(np.repeat(A, 2, axis=0), np.repeat(eig_H, 2, axis=0))
    assert HEAD_KINDS[modes.kinds[0]] == "perron"
    monkeypatch.setattr(perron, "_REACHABLE", 0.0)
    assert perron_certified(A, targets).tolist() == [False]


@given(
    attention_params(n=(2, 40), scale=(0.2, 6.0)),
    st.one_of(real_spectra(max_size=6), complex_spectra()),
    st.sampled_from([1.0, 3.0, 12.0]),
    st.lists(st.floats(0.0, 1.5), min_size=1, max_size=5),
)
def test_a_wrong_estimate_costs_time_never_correctness(params, eig_H, power, guesses) -> None:
    """The estimates only order the work (which disk, which centre, whether to finish the first
    disk for the second): with estimates replaced by arbitrary numbers, every answer is still the
    dense path's."""
    from oversmooth.simulator import perron

    calls = iter(range(1_000_000))

    def arbitrary(A: np.ndarray, shift: np.ndarray) -> np.ndarray:
        start = next(calls)
        return np.array([guesses[(start + i) % len(guesses)] for i in range(len(A))])

    A = sharpened(build_attention(params, batch=(HEADS,)), power)
    with pytest.MonkeyPatch.context() as patch:
        patch.setattr(perron, "nonperron_estimate", arbitrary)
        assert_same_as_dense(A, spectra_for_heads(eig_H))


def test_finishing_the_first_disk_trusts_its_bound_never_its_target(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """Two clusters coupled by 1e-9 (λ₂ = 1 − 2e-9: its mode with λ^H = 0.3 ties the Perron one,
    so the kind is not perron) and estimates that mislead the schedule (|λ₂| guessed 0.8, the
    spread about α = 0.4 guessed 0.62) into finishing the first disk for the second. The first
    disk cannot get below λ₂, so λ^H = 0.3 stays with the second disk, which cannot hold λ₂ = 1 −
    2e-9 within R = 0.6 of 0.4: undecided, as it must be. Taking the ρ the second disk asked for
    (≈ 0.99999) instead of the bound reached would certify it."""
    from oversmooth.simulator import perron

    A = _two_weakly_coupled_clusters(c=1e-9)[None]
    eig_H = spectra_for_heads([0.3, -0.35, -1.0], heads=1)
    dense = dominating_modes(A, eig_H, certify=False)
    assert HEAD_KINDS[dense.kinds[0]] != "perron"
    guesses = iter([0.8])
    monkeypatch.setattr(
        perron, "nonperron_estimate", lambda A, shift: np.full(len(A), next(guesses, 0.62))
    )
    assert perron_certified(A, perron_targets(eig_H)).tolist() == [False]
    np.testing.assert_array_equal(dominating_modes(A, eig_H, min_order=1).kinds, dense.kinds)


# -- the contracting class: decided from H alone ---------------------------------------------------


@st.composite
def contracting_spectra(draw: st.DrawFn) -> list[complex]:
    """A head's range spectrum inside the closed disk |1 + z| ≤ 1 (boundary included), plus the
    exact null-space 0 the per-head rule appends."""
    angles = st.floats(0.0, 2 * np.pi, allow_nan=False)
    radii = st.floats(0.0, 1.0, allow_nan=False)
    values = draw(st.lists(st.tuples(radii, angles), min_size=1, max_size=5))
    spectrum = [-1.0 + r * np.exp(1j * t) for r, t in values]
    spectrum += [value.conjugate() for value in spectrum if abs(value.imag) > 0]
    return [*spectrum, 0.0]


@given(attention_params(n=(2, 40), scale=(0.2, 6.0)), contracting_spectra())
@example(
    {"kind": "symmetric", "n": 2, "scale": 1.0, "seed": 0}, [-2.0 + 0j, 0.0]
)  # the boundary |1 + λ^H| = 1 itself
def test_a_contracting_head_is_never_perron_on_the_dense_path(params, eig_H) -> None:
    """What the class claims, checked against Definition 4 on the full spectrum of A: a head with
    a null-space 0 and every other |1 + λ^H| ≤ 1 is non-perron or balanced whatever A is."""
    A = build_attention(params, batch=(HEADS,))
    lam_H = spectra_for_heads(eig_H)
    assert contracting_heads(lam_H).all()
    kinds = dominance_kinds(np.linalg.eigvals(A), lam_H)
    assert (kinds != 0).all()


def test_contracting_heads_take_no_spectrum_and_report_no_mode() -> None:
    A = spectra.attention_general(40, batch=(HEADS,), rng=3)
    eig_H = np.array(
        [
            [-0.5, -1.2 + 0.3j, -1.2 - 0.3j, 0.0],  # contracting
            [-0.5, 0.4, 0.0, 0.0],  # |1 + 0.4| > 1: not contracting
            [-0.5, -1.5, -1.9, -0.1],  # no null-space 0: not contracting
        ],
        dtype=np.complex128,
    )
    sent: list[np.ndarray] = []

    def to_host(array: np.ndarray) -> np.ndarray:
        sent.append(np.asarray(array))
        return np.asarray(array)

    modes = dominating_modes(A, eig_H, to_host=to_host)
    assert HEAD_KINDS[modes.kinds[0]] == "contracting"
    for mode in (modes.mu, modes.eig_A, modes.eig_H):
        assert np.isnan(mode[0])
    assert not modes.certified[0]
    assert {HEAD_KINDS[k] for k in modes.kinds[1:]} <= {"perron", "non-perron", "balanced"}
    assert sum(len(array) for array in sent) <= 2  # the contracting head's A stays where it is
    dense = dominating_modes(A[1:], eig_H[1:], certify=False)
    np.testing.assert_array_equal(modes.kinds[1:], dense.kinds)


@pytest.mark.parametrize(
    ("spectrum", "expected"),
    [
        ([-1.0, 0.0], True),  # |1 + λ| = 0
        ([-2.0, 0.0], True),  # on the boundary
        ([-2.0 * (1 + TIE_RTOL / 2), 0.0], True),  # within the tie tolerance
        ([-2.0 * (1 + 10 * TIE_RTOL), 0.0], False),  # beyond it
        ([0.1, 0.0], False),
        ([-1.0, -0.5], False),  # no null space
        ([1e-300, -1.0], False),  # a tiny eigenvalue is not the null space
    ],
)
def test_contracting_heads_boundary(spectrum: list[complex], expected: bool) -> None:
    assert bool(contracting_heads(np.asarray(spectrum, dtype=np.complex128))) is expected


@given(
    attention_params(n=(2, 40), scale=(0.2, 6.0)),
    st.one_of(real_spectra(max_size=6), complex_spectra()),
    st.integers(1, 9),
    st.booleans(),
)
@example(  # a subnormal λ^H: the first disk's need overflowed to +inf with a warning
    params={"kind": "general", "n": 11, "scale": 5.0, "seed": 1},
    eig_H=[0.5, 2.225073858507203e-309, -1.0],
    parts=1,
    certify=True,
)
def test_the_dense_parts_change_no_answer(params, eig_H, parts, certify) -> None:
    """Solving the undecided heads in consecutive parts gives the one-call answer bit for bit
    (the same bytes and dtypes); the map is given the parts, in order, covering every undecided
    head once, and the undecided matrices come to the host in one copy."""
    heads = 7
    A = build_attention(params, batch=(heads,))
    lam_H = spectra_for_heads(eig_H, heads)
    whole = dominating_modes(A, lam_H, certify=certify, min_order=1)
    seen: list[slice] = []
    copies: list[np.ndarray] = []

    def recording_map(solve, items):  # type: ignore[no-untyped-def]
        seen.extend(items)
        return [solve(item) for item in reversed(items)][::-1]  # out of order, returned in order

    def to_host(array: np.ndarray) -> np.ndarray:
        copies.append(array)
        return np.asarray(array)

    parted = dominating_modes(
        A,
        lam_H,
        certify=certify,
        min_order=1,
        to_host=to_host,
        dense_parts=parts,
        dense_map=recording_map,
    )
    assert_same_bytes(parted, whole)
    undecided = int(
        np.count_nonzero(~whole.certified & (whole.kinds != HEAD_KINDS.index("contracting")))
    )
    assert [(part.start, part.stop) for part in seen] == [
        (k * undecided // len(seen), (k + 1) * undecided // len(seen)) for k in range(len(seen))
    ]
    assert len(seen) == (min(parts, undecided) if undecided else 0)
    assert [len(copy) for copy in copies] == ([undecided] if undecided else [])


def assert_same_bytes(got: DominatingModes, expected: DominatingModes) -> None:
    """Every field the same dtype and the same bytes (NaNs, signed zeros and all)."""
    for name in ("kinds", "mu", "eig_A", "eig_H", "certified"):
        a, b = getattr(got, name), getattr(expected, name)
        assert a.dtype == b.dtype, name
        assert a.tobytes() == b.tobytes(), name
