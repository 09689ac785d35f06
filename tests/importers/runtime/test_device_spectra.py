"""The Gram spectra the audit computes on a GPU: Householder tridiagonalisation, then bisection.

On the CPU: the batched tridiagonalisation (the same array code the GPU runs, in NumPy) keeps
every eigenvalue of real and random Gram matrices (against LAPACK's ``eigvalsh``); the bisection
kernel's C source, compiled by the host's C++ compiler under shims for CUDA's thread indices,
gives LAPACK's eigenvalues of those tridiagonals. Where CUDA and CuPy work (marker ``cuda``):
the fused kernels equal the plain array operations, and the whole device solve equals LAPACK.
"""

from __future__ import annotations

import types
from collections.abc import Callable
from pathlib import Path

import numpy as np
import pytest
from hypothesis import given
from hypothesis import strategies as st

from oversmooth.importers.runtime import device_spectra
from oversmooth.importers.runtime.device_spectra import (
    from_lower_triangle,
    householder_tridiagonal,
    tridiagonal_eigenvalues,
)
from oversmooth.importers.runtime.gram_spectra import gram_eigenvalues
from oversmooth.simulator import statistics
from tests.importers.runtime.device_helpers import (
    assert_same_spectra,
    cupy_or_skip,
    host_program,
    random_grams,
    run_program,
    special_grams,
)


@pytest.mark.parametrize(
    ("count", "n", "d", "rank"),
    [
        (3, 257, 384, None),
        (3, 257, 384, 4),
        (4, 50, 20, None),
        (2, 1, 3, None),
        (2, 2, 3, None),
        (2, 3, 3, None),
        (3, 17, 17, 1),
    ],
)
def test_tridiagonalisation_keeps_every_eigenvalue(
    count: int, n: int, d: int, rank: int | None
) -> None:
    gram = random_grams(count * n, count, n, d, rank)
    d_, e = householder_tridiagonal(gram.copy())
    assert d_.shape == (count, n)
    assert e.shape == (count, max(n - 1, 0))
    assert_same_spectra(tridiagonal_eigenvalues(d_, e), gram)


def test_tridiagonalisation_of_special_matrices() -> None:
    gram = special_grams()
    d, e = householder_tridiagonal(gram.copy())
    assert_same_spectra(tridiagonal_eigenvalues(d, e), gram)
    assert np.all(d[0] == 0.0)
    assert np.all(e[0] == 0.0)


@given(
    seed=st.integers(0, 2**32 - 1),
    n=st.integers(1, 24),
    d=st.integers(1, 30),
    scale=st.sampled_from([1e-200, 1e-8, 1.0, 1e8, 1e150]),
)
def test_tridiagonalisation_property(seed: int, n: int, d: int, scale: float) -> None:
    gram = random_grams(seed, 2, n, d) * scale
    d_, e = householder_tridiagonal(gram.copy())
    assert_same_spectra(tridiagonal_eigenvalues(d_, e), gram)


def test_a_broken_reflector_is_caught() -> None:
    """The comparison above fails when a step's update is wrong (here ``A + v wᵀ + w vᵀ``, not
    the similarity ``P A P``, which changes the spectrum): the test can fail."""
    gram = random_grams(1, 2, 30, 40)
    original = device_spectra._trailing_operations

    def wrong_update(xp):  # type: ignore[no-untyped-def]
        matvec, update = original(xp)
        return matvec, lambda block, v, w: update(block, v, -w)

    with pytest.MonkeyPatch.context() as patch:
        patch.setattr(device_spectra, "_trailing_operations", wrong_update)
        d, e = householder_tridiagonal(gram.copy())
    with pytest.raises(AssertionError):
        assert_same_spectra(tridiagonal_eigenvalues(d, e), gram)


def test_only_the_lower_triangle_is_read_as_by_lapack() -> None:
    """An inexactly symmetric Gram matrix (a general product's rounding, here exaggerated): the
    device solver's steps see what LAPACK's ``eigvalsh`` reads, the lower triangle."""
    gram = random_grams(21, 3, 30, 40)
    gram = (gram + np.swapaxes(gram, -1, -2)) / 2  # exactly symmetric
    skewed = gram + np.triu(np.random.default_rng(5).normal(size=gram.shape), 1)
    work = from_lower_triangle(skewed)
    np.testing.assert_array_equal(work, gram)
    d, e = householder_tridiagonal(work)
    assert_same_spectra(tridiagonal_eigenvalues(d, e), skewed)


def test_on_the_host_gram_eigenvalues_are_lapacks() -> None:
    gram = random_grams(3, 4, 30, 20)
    np.testing.assert_array_equal(gram_eigenvalues(gram), statistics.gram_eigenvalues(gram))


def test_the_device_path_tridiagonalises_by_the_audits_choice_unless_told(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """On a device the Gram spectra take :data:`AUDIT_TRIDIAGONALISATION` (the single launch),
    or the tridiagonalisation passed. NumPy stands in for the device library: the path is the
    device's, the array code the kernels' stand-in, and the spectra still LAPACK's."""
    from oversmooth.importers.runtime import gram_spectra

    assert gram_spectra.AUDIT_TRIDIAGONALISATION == "block"
    called: list[str] = []

    def spy(name: str) -> Callable[[np.ndarray], tuple[np.ndarray, np.ndarray]]:
        def tridiagonalise(a: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
            called.append(name)
            return householder_tridiagonal(a)

        return tridiagonalise

    device = types.SimpleNamespace(float64=np.float64)
    monkeypatch.setattr(gram_spectra, "array_module", lambda array: device)
    monkeypatch.setitem(gram_spectra.TRIDIAGONALISATIONS, "block", spy("block"))
    gram = random_grams(4, 3, 20, 30)
    assert_same_spectra(gram_eigenvalues(gram), gram)
    assert_same_spectra(gram_eigenvalues(gram, tridiagonalise=spy("given")), gram)
    assert called == ["block", "given"]


_BISECTION_MAIN = r"""
int main() {
    int count, n;
    if (std::scanf("%d %d", &count, &n) != 2) return 1;
    long long total = (long long)count * n;
    std::vector<double> d(total), e(count * (n > 1 ? n - 1 : 1)), out(total);
    for (long long i = 0; i < total; ++i) if (std::scanf("%lf", &d[i]) != 1) return 1;
    for (long long i = 0; i < (long long)count * (n - 1); ++i)
        if (std::scanf("%lf", &e[i]) != 1) return 1;
    LAUNCH(total, 1, 1, oversmooth_tridiagonal_bisection(d.data(), e.data(), out.data(), n, total));
    for (long long i = 0; i < total; ++i) std::printf("%.17g\n", out[i]);
    return 0;
}
"""


def _host_bisection(tmp_path: Path, d: np.ndarray, e: np.ndarray) -> np.ndarray:
    """The bisection kernel's source run by the host's C++ compiler, one 'thread' at a time."""
    binary = host_program(tmp_path, device_spectra.BISECTION_SOURCE, _BISECTION_MAIN)
    count, n = d.shape
    return run_program(binary, f"{count} {n}", np.r_[d.ravel(), e.ravel()]).reshape(count, n)


def test_the_bisection_kernel_source_gives_lapacks_eigenvalues(tmp_path: Path) -> None:
    grams = [random_grams(5, 3, 257, 384), random_grams(6, 3, 257, 384, rank=3), special_grams()]
    grams += [random_grams(8, 3, n, 4) for n in (1, 2, 3)]
    for gram in grams:
        d, e = householder_tridiagonal(gram.copy())
        eig = _host_bisection(tmp_path, d, e)
        assert_same_spectra(eig, gram)
    zero = _host_bisection(tmp_path, np.zeros((1, 5)), np.zeros((1, 4)))
    np.testing.assert_array_equal(zero, 0.0)


@pytest.mark.cuda
def test_fused_kernels_equal_the_array_operations_on_the_gpu() -> None:
    cupy = cupy_or_skip()
    gram = cupy.asarray(random_grams(9, 5, 64, 80))
    fused = device_spectra._trailing_operations(cupy)
    block, v = gram[:, 3:, 3:], cupy.asarray(np.random.default_rng(2).normal(size=(5, 61)))
    w = 0.5 * v[:, ::-1]
    expected = cupy.asnumpy(device_spectra._matvec(block, v))
    # the sums run in another order: agreement to round-off of the largest term
    atol = 1e-13 * float(cupy.abs(block).max() * cupy.abs(v).sum(axis=1).max())
    np.testing.assert_allclose(cupy.asnumpy(fused[0](block, v)), expected, rtol=0, atol=atol)
    plain = gram.copy()
    device_spectra._rank2_update(plain[:, 3:, 3:], v, w)
    fused[1](block, v, w)
    np.testing.assert_allclose(cupy.asnumpy(gram), cupy.asnumpy(plain), rtol=1e-13, atol=1e-12)


@pytest.mark.cuda
def test_gram_eigenvalues_on_the_gpu_are_lapacks() -> None:
    """The audit's device solver (the single launch) and the fused kernels, its fallback above
    the single launch's largest order, each with the bisection and the check."""
    cupy = cupy_or_skip()
    grams = [random_grams(5, 4, 257, 384), random_grams(6, 4, 257, 384, rank=3), special_grams()]
    for gram in grams:
        for tridiagonalise in (None, householder_tridiagonal):
            eig = gram_eigenvalues(cupy.asarray(gram), tridiagonalise=tridiagonalise)
            assert isinstance(eig, np.ndarray)
            assert_same_spectra(eig, gram)
    zero = gram_eigenvalues(cupy.zeros((2, 9, 9)))
    np.testing.assert_array_equal(zero, 0.0)


class _Held:
    """Stands for a device array: NumPy data behind a device mark, owned by a stand-in package."""

    __module__ = "oversmooth_stand_in_device"
    __dlpack_device__ = None

    def __init__(self, data: np.ndarray) -> None:
        self.data = data
        self.shape = data.shape


def _stand_in_package(monkeypatch: pytest.MonkeyPatch) -> None:
    import sys
    import types

    package = types.ModuleType("oversmooth_stand_in_device")
    package.asnumpy = lambda held: held.data  # type: ignore[attr-defined]
    package.matmul = np.matmul  # type: ignore[attr-defined]
    package.linalg = np.linalg  # type: ignore[attr-defined]
    package.stack = lambda helds: _Held(np.stack([h.data for h in helds]))  # type: ignore[attr-defined]
    monkeypatch.setitem(sys.modules, "oversmooth_stand_in_device", package)


def test_a_batchs_device_grams_are_solved_in_one_stacked_call(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """Every layer's Gram matrices on the device: one solve for all of them, each layer's
    spectra as its own solve gives; one layer's on the host: the layers are solved one by one."""
    from oversmooth.importers.runtime import reductions
    from oversmooth.importers.runtime.reductions import GraphExtension, ReductionPlan

    _stand_in_package(monkeypatch)
    calls: list[tuple[int, ...]] = []

    def solve(gram):  # type: ignore[no-untyped-def]
        calls.append(gram.shape)
        return np.linalg.eigvalsh(gram.data if isinstance(gram, _Held) else gram)

    monkeypatch.setattr(reductions, "gram_eigenvalues", solve)
    names = ("a", "b", "c", "d")
    plan = ReductionPlan(names, "tokens", False, GraphExtension(), replaced=frozenset({1}))
    grams = {
        0: random_grams(0, 4, 9, 12),
        2: random_grams(2, 4, 9, 12),
        3: random_grams(3, 4, 5, 12),
    }
    outputs = {plan.gram_name(layer): _Held(gram) for layer, gram in grams.items()}
    assert plan.grams_on_device(outputs)
    spectra = plan.layer_spectra(outputs, [0, 2, 3])
    assert calls == [(2, 4, 9, 9), (4, 5, 5)]  # one solve per order (a stage of 5 tokens)
    for layer, gram in grams.items():
        np.testing.assert_array_equal(spectra[layer], np.linalg.eigvalsh(gram))
    outputs[plan.gram_name(2)] = grams[2]
    assert not plan.grams_on_device(outputs)
    none = ReductionPlan(("a",), "none", False, GraphExtension())
    assert not none.grams_on_device({})
    assert none.layer_spectra({}, [0]) == {}
