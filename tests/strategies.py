"""Hypothesis strategies: small parameter dicts from which the simulator builds matrices.

Nothing here draws a large array element by element. A strategy draws sizes, spectrum ranges (or
a short spectrum of at most a dozen values), a logit scale and a seed; the matrices then come from
:mod:`oversmooth.simulator.spectra` with that seed, so every failing example shrinks to a few numbers.
"""

from __future__ import annotations

from typing import Any

import numpy as np
from hypothesis import strategies as st

from oversmooth.simulator import checks, spectra
from oversmooth.simulator.checks import Check, Choice, FloatRange, IntRange

__all__ = [
    "ATTENTION_KINDS",
    "attention_params",
    "build_attention",
    "build_h",
    "check_params",
    "complex_spectra",
    "h_params",
    "real_spectra",
    "seeds",
    "spec_strategy",
]

#: Attention generators of :mod:`oversmooth.simulator.spectra` by name.
ATTENTION_KINDS = ("symmetric", "psd", "doubly-stochastic", "general")


def seeds() -> st.SearchStrategy[int]:
    """Seeds for ``numpy.random.default_rng``."""
    return st.integers(0, 2**32 - 1)


def spec_strategy(spec: IntRange | FloatRange | Choice) -> st.SearchStrategy[Any]:
    """The hypothesis strategy of one parameter of a :class:`oversmooth.simulator.checks.Check`."""
    if isinstance(spec, IntRange):
        return st.integers(spec.low, spec.high)
    if isinstance(spec, FloatRange):
        return st.floats(spec.low, spec.high, allow_nan=False, allow_infinity=False)
    return st.sampled_from(spec.options)


def check_params(check: Check) -> st.SearchStrategy[dict[str, Any]]:
    """Parameter dicts of ``check``: the same keys and ranges as ``check.draw`` produces."""
    return st.fixed_dictionaries({key: spec_strategy(spec) for key, spec in check.space.items()})


def all_check_names() -> list[str]:
    """Names of the registered checks (for parametrisation)."""
    return list(checks.check_names())


def real_spectra(
    *, min_size: int = 1, max_size: int = 8, low: float = -2.0, high: float = 2.0
) -> st.SearchStrategy[list[float]]:
    """A short real spectrum (at most ``max_size`` values) in ``[low, high]``."""
    values = st.floats(low, high, allow_nan=False, allow_infinity=False)
    return st.lists(values, min_size=min_size, max_size=max_size)


@st.composite
def complex_spectra(
    draw: st.DrawFn, *, max_pairs: int = 3, max_real: int = 4, radius: float = 2.0
) -> list[complex]:
    """A spectrum closed under conjugation: a few real values and complex-conjugate pairs.

    Imaginary parts are at least 0.05 so that a pair never degenerates into a double real root.
    """
    reals = draw(real_spectra(min_size=0, max_size=max_real, low=-radius, high=radius))
    part = st.floats(-radius, radius, allow_nan=False, allow_infinity=False)
    imaginary = st.floats(0.05, radius, allow_nan=False, allow_infinity=False)
    pairs = draw(st.lists(st.tuples(part, imaginary), min_size=1, max_size=max_pairs))
    values = [complex(r) for r in reals]
    for a, b in pairs:
        values += [complex(a, b), complex(a, -b)]
    return values


def attention_params(
    *,
    kinds: tuple[str, ...] = ATTENTION_KINDS,
    n: tuple[int, int] = (2, 12),
    scale: tuple[float, float] = (0.5, 1.5),
) -> st.SearchStrategy[dict[str, Any]]:
    """``{"kind", "n", "scale", "seed"}`` for :func:`build_attention`."""
    return st.fixed_dictionaries(
        {
            "kind": st.sampled_from(kinds),
            "n": st.integers(*n),
            "scale": st.floats(*scale, allow_nan=False, allow_infinity=False),
            "seed": seeds(),
        }
    )


def build_attention(params: dict[str, Any], *, batch: tuple[int, ...] = ()) -> np.ndarray:
    """The attention matrix (or batch) described by :func:`attention_params`."""
    kind, n, scale, seed = params["kind"], params["n"], params["scale"], params["seed"]
    if kind == "symmetric":
        return spectra.attention_symmetric_scores(n, scale=scale, batch=batch, rng=seed)
    if kind == "psd":
        return spectra.attention_symmetric_scores(
            n, scale=scale, scores="psd", batch=batch, rng=seed
        )
    if kind == "doubly-stochastic":
        return spectra.attention_doubly_stochastic(n, scale=scale, batch=batch, rng=seed)
    return spectra.attention_general(n, scale=scale, batch=batch, rng=seed)


def h_params(
    *, d: tuple[int, int] = (1, 8), low: float = -2.0, high: float = 2.0, symmetric: bool = True
) -> st.SearchStrategy[dict[str, Any]]:
    """``{"eigenvalues", "symmetric", "seed"}`` for :func:`build_h` (a real spectrum)."""
    return st.fixed_dictionaries(
        {
            "eigenvalues": real_spectra(min_size=d[0], max_size=d[1], low=low, high=high),
            "symmetric": st.just(symmetric),
            "seed": seeds(),
        }
    )


def build_h(params: dict[str, Any]) -> np.ndarray:
    """``H`` with the prescribed spectrum: symmetric (``h_symmetric``) or not (``h_nonsymmetric``)."""
    if params["symmetric"]:
        return spectra.h_symmetric(params["eigenvalues"], rng=params["seed"])
    return spectra.h_nonsymmetric(params["eigenvalues"], rng=params["seed"])
