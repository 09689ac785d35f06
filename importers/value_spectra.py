"""Eigenvalues of the value-projection products W_V W_O of an imported model, per head and per layer.

Public API
----------
SpectrumRow
    One eigenvalue: ``(layer, head, kind, real, imag)``; ``head`` is -1 for layer-level rows.
SPECTRUM_KINDS
    ``"head"``, ``"layer"``, ``"head-gamma"``, ``"layer-gamma"``.
head_eigenvalues, layer_eigenvalues
    The eigenvalues of one block's per-head or whole-layer product (optionally with γ folded in).
BlockSpectra, block_spectra, blocks_spectra
    Every kind of eigenvalue of one block (of every block), as arrays (what the audit caches).
spectrum_rows
    Tidy rows from those arrays.
model_spectra
    Tidy rows for every block.
summarize_spectra
    Per kind: count, fraction with negative real part, skewness of the real parts, spectral radius.

Notes
-----
Per head (docs/theory.md §3.3, claim 31): ``M_h = W_V^h W_O^h`` is d×d with rank ≤ d_head; its nonzero
eigenvalues are those of the d_head×d_head ``W_O^h W_V^h``, so only those d_head values are reported
(the other d − d_head are exactly zero). With GQA, query head h reads key/value head
``h // (n_heads / n_kv_heads)``. Per layer: the d eigenvalues of ``W_V W_O`` with W_V's key/value
heads expanded to the query heads (H = Σ_h M_h, the whole-layer value matrix when every head shares
one attention matrix). For pre-LN blocks the attention branch reads ``LN(x) = γ ⊙ x̂ + β``, so the
linear part acting on the normalised tokens is ``diag(γ) W_V W_O``: reported separately as
``head-gamma`` and ``layer-gamma`` (the γ-sign effect of docs/theory.md §4). Eigenvalues are complex in
general; both parts are kept.
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from dataclasses import dataclass

import numpy as np
from threadpoolctl import threadpool_limits

from importers.errors import ImporterInputError
from importers.weights import BlockWeights
from simulator.theory import value_spectrum

__all__ = [
    "LAYER_HEAD",
    "SPECTRA_COLUMNS",
    "SPECTRUM_KINDS",
    "BlockSpectra",
    "SpectrumRow",
    "SpectrumSummary",
    "block_spectra",
    "blocks_spectra",
    "head_eigenvalues",
    "layer_eigenvalues",
    "model_spectra",
    "spectrum_rows",
    "summarize_spectra",
]

SPECTRUM_KINDS = ("head", "layer", "head-gamma", "layer-gamma")
#: Columns of ``spectra.csv``: one eigenvalue per row.
SPECTRA_COLUMNS = ("layer", "head", "kind", "real", "imag")
#: The ``head`` value of layer-level rows.
LAYER_HEAD = -1


@dataclass(frozen=True)
class SpectrumRow:
    """One eigenvalue of one block's value product (``head`` is -1 for whole-layer rows)."""

    layer: int
    head: int
    kind: str
    real: float
    imag: float


@dataclass(frozen=True)
class SpectrumSummary:
    """Summary of the eigenvalues of one kind, pooled over layers and heads.

    Attributes
    ----------
    count : int
    negative_fraction : float
        Fraction with negative real part.
    skewness : float
        Fisher–Pearson skewness of the real parts (NaN when they are all equal).
    spectral_radius : float
        Largest modulus.
    """

    kind: str
    count: int
    negative_fraction: float
    skewness: float
    spectral_radius: float


def head_eigenvalues(block: BlockWeights, head: int, *, gamma: bool = False) -> np.ndarray:
    """The d_head eigenvalues of ``W_O^h W_V^h`` (with ``diag(γ)`` before W_V^h when ``gamma``).

    Parameters
    ----------
    block : BlockWeights
    head : int
        Query head, 0 ≤ head < n_heads.
    gamma : bool
        Fold the attention norm's γ in (requires ``block.gamma``).

    Returns
    -------
    (d_head,) complex ndarray
        The nonzero-capable eigenvalues of the d×d ``[diag(γ)] W_V^h W_O^h`` (claim 31).
    """
    W_V, W_O = block.value_head(head)
    if gamma:
        W_V = _scale_rows(block, W_V)
    # value_spectrum(A, B) gives eig(A @ B) when A has at least as many columns as rows, so
    # passing (W_O^h, W_V^h) computes the small d_head x d_head product directly.
    return value_spectrum(W_O, W_V)


def layer_eigenvalues(block: BlockWeights, *, gamma: bool = False) -> np.ndarray:
    """The d eigenvalues of ``[diag(γ)] W_V W_O`` with key/value heads expanded (d×d)."""
    W_V = block.expanded_W_V()
    if gamma:
        W_V = _scale_rows(block, W_V)
    return value_spectrum(W_V, block.W_O)


def _scale_rows(block: BlockWeights, W_V: np.ndarray) -> np.ndarray:
    if block.gamma is None:
        raise ImporterInputError(
            f"`block` must have a norm γ to fold in; block {block.index} has none"
        )
    return block.gamma[:, None] * W_V


@dataclass(frozen=True)
class BlockSpectra:
    """Every eigenvalue kind of one block's value products (complex arrays).

    Attributes
    ----------
    index : int
        The block's index.
    head : (n_heads, d_head) ndarray
        Row h: :func:`head_eigenvalues` of head h.
    layer : (d_model,) ndarray
        :func:`layer_eigenvalues`.
    head_gamma, layer_gamma : ndarray or None
        The same with γ folded in; present for pre-LN blocks with a γ only.
    """

    index: int
    head: np.ndarray
    layer: np.ndarray
    head_gamma: np.ndarray | None
    layer_gamma: np.ndarray | None

    def heads(self, *, gamma: bool) -> np.ndarray:
        """The per-head eigenvalues, γ-folded when ``gamma`` and available."""
        return self.head_gamma if gamma and self.head_gamma is not None else self.head

    def whole_layer(self, *, gamma: bool) -> np.ndarray:
        """The whole-layer eigenvalues, γ-folded when ``gamma`` and available."""
        return self.layer_gamma if gamma and self.layer_gamma is not None else self.layer


def block_spectra(block: BlockWeights) -> BlockSpectra:
    """Every kind of :data:`SPECTRUM_KINDS` for one block (γ-folded kinds for pre-LN blocks)."""
    kinds = []
    for gamma in (False, True) if block.norm == "pre" and block.gamma is not None else (False,):
        heads = np.stack([head_eigenvalues(block, h, gamma=gamma) for h in range(block.n_heads)])
        kinds.append((heads, layer_eigenvalues(block, gamma=gamma)))
    folded = kinds[1] if len(kinds) > 1 else (None, None)
    return BlockSpectra(block.index, *kinds[0], *folded)


def blocks_spectra(blocks: Sequence[BlockWeights]) -> list[BlockSpectra]:
    """:func:`block_spectra` of every block, with one BLAS thread.

    Many small dense eigenproblems gain nothing from more threads, and multithreaded BLAS
    collapses when the cores are busy (DINOv2's 168 problems: 1.75 s with one thread, 71 s with
    the default threads beside one busy process on 2 cores).
    """
    with threadpool_limits(limits=1, user_api="blas"):
        return [block_spectra(block) for block in blocks]


def model_spectra(blocks: Sequence[BlockWeights]) -> list[SpectrumRow]:
    """Tidy eigenvalue rows for every block: per head, per layer, and γ-folded for pre-LN blocks."""
    return spectrum_rows(blocks_spectra(blocks))


def spectrum_rows(spectra: Sequence[BlockSpectra]) -> list[SpectrumRow]:
    """Tidy rows, per block: the heads then the layer, plain then γ-folded."""
    rows: list[SpectrumRow] = []
    for block in spectra:
        kinds = [("", block.head, block.layer)]
        if block.head_gamma is not None and block.layer_gamma is not None:
            kinds.append(("-gamma", block.head_gamma, block.layer_gamma))
        for suffix, heads, layer in kinds:
            for head, values in enumerate(heads):
                rows.extend(_rows(block.index, head, "head" + suffix, values))
            rows.extend(_rows(block.index, LAYER_HEAD, "layer" + suffix, layer))
    return rows


def _rows(layer: int, head: int, kind: str, values: np.ndarray) -> Iterable[SpectrumRow]:
    return (SpectrumRow(layer, head, kind, float(z.real), float(z.imag)) for z in values)


def summarize_spectra(rows: Sequence[SpectrumRow]) -> dict[str, SpectrumSummary]:
    """Per kind (in :data:`SPECTRUM_KINDS` order): count, negative fraction, skewness, radius."""
    summaries = {}
    for kind in SPECTRUM_KINDS:
        values = np.array([complex(row.real, row.imag) for row in rows if row.kind == kind])
        if values.size:
            summaries[kind] = SpectrumSummary(
                kind=kind,
                count=int(values.size),
                negative_fraction=float(np.mean(values.real < 0)),
                skewness=_skewness(values.real),
                spectral_radius=float(np.max(np.abs(values))),
            )
    return summaries


def _skewness(x: np.ndarray) -> float:
    """Fisher–Pearson coefficient m3 / m2^(3/2) (biased moments); NaN for constant data."""
    centred = x - x.mean()
    m2 = float(np.mean(centred**2))
    if m2 == 0.0:
        return float("nan")
    return float(np.mean(centred**3) / m2**1.5)
