"""The panel tridiagonalisation's CUDA kernel, run on the CPU and (marker ``cuda``) on a GPU.

On the CPU its source runs under the host's C++ compiler with each block's threads as host
threads and a barrier for ``__syncthreads``
(:data:`~tests.importers.runtime.device_helpers.THREADED_SHIMS`), launched as
:func:`~oversmooth.importers.runtime.panel_kernel.panel_householder_tridiagonal` launches it.
It must leave the array code's tridiagonal (the same reflectors) and keep LAPACK's eigenvalues,
whatever the panel's width and the threads per block, and its threads must never race.
"""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest

from oversmooth.importers.runtime.device_spectra import (
    householder_tridiagonal,
    tridiagonal_eigenvalues,
)
from oversmooth.importers.runtime.panel_kernel import (
    MAX_PANEL,
    PANEL_SOURCE,
    panel_width,
)
from tests.importers.runtime.device_helpers import (
    THREADED_SHIMS,
    assert_a_broken_kernel_is_caught,
    assert_races_only_without,
    assert_same_spectra,
    assert_the_array_codes_tridiagonal,
    cupy_or_skip,
    host_program,
    host_tridiagonal,
    random_grams,
    special_grams,
)

#: One launch of the panel kernel: a block of THREADS host threads per matrix, panels of PANEL
#: steps, the shared memory panel_householder_tridiagonal asks for. Prints a, then d, then e.
_PANEL_MAIN = r"""
int main() {
    int count, n, threads, panel;
    if (std::scanf("%d %d %d %d", &count, &n, &threads, &panel) != 4) return 1;
    const long long shared = 2LL * panel * n + (2LL * panel + 1) * threads + 1;
    if (shared > (long long)(sizeof oversmooth_shared / sizeof(double))) return 2;
    const long long size = (long long)count * n * n;
    const int sub = n > 1 ? n - 1 : 1;
    std::vector<double> a(size), d((long long)count * n), e((long long)count * sub, 0.0);
    for (long long i = 0; i < size; ++i) if (std::scanf("%lf", &a[i]) != 1) return 1;
    if (n > 2)
        LAUNCH_BLOCKS(count, threads,
                      oversmooth_panel_tridiagonal(a.data(), d.data(), e.data(), n, panel));
    for (double x : a) std::printf("%.17g\n", x);
    for (double x : d) std::printf("%.17g\n", x);
    for (long long i = 0; i < (long long)count * (n - 1); ++i) std::printf("%.17g\n", e[i]);
    return 0;
}
"""


@pytest.fixture(scope="module")
def panel_binary(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return host_program(tmp_path_factory.mktemp("panel"), PANEL_SOURCE, _PANEL_MAIN, THREADED_SHIMS)


def test_the_panel_kernel_gives_the_array_codes_tridiagonal(panel_binary: Path) -> None:
    """At the width the audit's order gets (7 at order 257, 128 threads), at the widest, at the
    narrowest, with panels that do not divide the steps, with fewer threads than columns and
    more, and at the orders where the loop of steps is empty or one step long."""
    cases = [
        (random_grams(11, 2, 257, 384), 128, panel_width(257, 128)),
        (random_grams(12, 2, 257, 384, rank=2), 32, MAX_PANEL),
        (special_grams(), 16, 3),
        (special_grams()[:2], 64, 2),
        (random_grams(15, 2, 50, 60), 8, 1),
    ]
    cases += [(random_grams(13, 2, n, 3), 4, 2) for n in (1, 2, 3, 4, 5)]
    for gram, threads, panel in cases:
        assert_the_array_codes_tridiagonal(
            *host_tridiagonal(panel_binary, gram, f"{threads} {panel}"), gram
        )


@pytest.mark.parametrize(
    ("correct", "broken"),
    [
        # the panel's earlier updates left out of x
        (
            "x -= V[q * n + k] * W[q * n + j] + W[q * n + k] * V[q * n + j];",
            "x -= V[q * n + k] * W[q * n + j];",
        ),
        # ... or out of d_k
        ("diagonal -= 2.0 * V[q * n + k] * W[q * n + k];", ""),
        # the correction of p = A v by the panel's updates left out
        ("w[i] = 2.0 * (p - c * v[i]);", "w[i] = 2.0 * (w[i] - c * v[i]);"),
        # c without its corrections
        ("c -= 2.0 * rows[(1 + q) * threads] * rows[(1 + panel + q) * threads];", ""),
        # the trailing block's update at the panel's end left out
        ("column[(long long)j * n] = entry;", ""),
    ],
)
def test_a_broken_panel_kernel_is_caught(tmp_path: Path, correct: str, broken: str) -> None:
    """The comparison above can fail: each of the panel's corrections left out gives another
    spectrum."""
    assert_a_broken_kernel_is_caught(tmp_path, PANEL_SOURCE, _PANEL_MAIN, (correct, broken), "8 4")


def test_the_panel_kernels_threads_never_race(tmp_path: Path) -> None:
    """Every access of shared or global memory that two of a block's threads make, one of them a
    write, is ordered by a barrier, with more threads than columns and fewer; without the
    barrier after a panel's update of the trailing block, ThreadSanitizer sees a race."""
    runs = [(random_grams(21, 1, 40, 60), "16 3"), (random_grams(22, 1, 20, 30), "4 2")]
    barrier = "        }\n        __syncthreads();\n    }\n}"
    without = "        }\n    }\n}"
    assert_races_only_without(tmp_path, PANEL_SOURCE, _PANEL_MAIN, (barrier, without), runs)


def test_the_panel_is_as_wide_as_a_blocks_shared_memory_allows() -> None:
    """48 KiB of doubles hold 2 w n + (2 w + 1) threads + 1: 7 at DINOv2's order 257 with the
    single launch's 128 threads, the widest for a small order, none for a large one."""
    assert panel_width(257, 128) == 7
    assert panel_width(20, 32) == MAX_PANEL
    assert panel_width(1400, 128) == 1
    for n, threads in ((257, 128), (384, 128), (1000, 128)):
        w = panel_width(n, threads)
        assert 2 * w * n + (2 * w + 1) * threads + 1 <= 6144
        assert w == MAX_PANEL or 2 * (w + 1) * n + (2 * w + 3) * threads + 1 > 6144


def test_orders_where_no_panel_of_two_fits_take_the_single_launch(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """Below a panel of two steps the single launch runs (here, the order also too large for
    it, the fused kernels' array code, which runs on NumPy)."""
    from oversmooth.importers.runtime import householder_kernels, panel_kernel

    gram = random_grams(17, 2, 6, 8)
    monkeypatch.setattr(panel_kernel, "panel_width", lambda n, threads: 1)
    monkeypatch.setattr(householder_kernels, "BLOCK_MAX_ORDER", 5)
    d, e = panel_kernel.panel_householder_tridiagonal(gram.copy())
    d_array, e_array = householder_tridiagonal(gram.copy())
    assert np.array_equal(d, d_array)
    assert np.array_equal(e, e_array)


@pytest.mark.cuda
def test_the_panel_kernel_on_the_gpu_keeps_lapacks_spectra() -> None:
    """On a GPU the panel kernel's tridiagonal keeps LAPACK's eigenvalues, at DINOv2's order and
    on the special matrices (its entries are compared on the CPU: a GPU's rounding moves the
    late entries more, as the single launch's)."""
    cupy = cupy_or_skip()
    from oversmooth.importers.runtime.panel_kernel import panel_householder_tridiagonal

    for gram in (
        random_grams(31, 3, 257, 384),
        random_grams(32, 2, 257, 384, rank=8),
        special_grams(),
    ):
        d, e = panel_householder_tridiagonal(cupy.asarray(gram))
        assert_same_spectra(tridiagonal_eigenvalues(cupy.asnumpy(d), cupy.asnumpy(e)), gram)
