"""Eigenvalues of the value-projection products W_V W_O of an imported model, per head and per layer.

Public API
----------
SpectrumRow
    One eigenvalue: ``(block, head, kind, real, imag)``; ``head`` is -1 for whole-layer rows.
SPECTRUM_KINDS
    ``"head"``, ``"layer"`` (the stored ``W_V W_O``), ``"head-effective"``, ``"layer-effective"``
    (the effective H, every linear factor of the branch folded in).
H_CHOICES
    ``"effective"`` (the operator the model applies; the default) or ``"stored"`` (the paper's
    protocol: ``W_V W_O`` as the checkpoint stores it).
head_eigenvalues, layer_eigenvalues
    The eigenvalues of one block's per-head or whole-layer product, stored or effective.
BlockSpectra, block_spectra, blocks_spectra
    Every kind of eigenvalue of one block (of every block), as arrays (what the audit caches).
spectrum_rows
    Tidy rows from those arrays.
model_spectra
    Tidy rows for every block.
summarize_spectra
    Per kind: count, share with negative real part, median real part, share inside the disk
    ``|1 + z| < 1``, skewness of the real parts, spectral radius.

Notes
-----
Per head (docs/theory.md §3.3, claim 31): ``M_h = W_V^h W_O^h`` is d×d with rank ≤ d_head; its nonzero
eigenvalues are those of the d_head×d_head ``W_O^h W_V^h``, so only those d_head values are reported
(the other d − d_head are exactly zero). With GQA, query head h reads key/value head
``h // (n_heads / n_kv_heads)``. Per layer: the d eigenvalues of ``W_V W_O`` with W_V's key/value
heads expanded to the query heads (H = Σ_h M_h, the whole-layer value matrix when every head shares
one attention matrix).

The effective H (docs/theory.md §6.8) is the right-acting linear map from the residual stream to the
branch's contribution through every linear factor:
``M_h = C diag(γ) W_V^h W_O^h diag(s)`` with C the pre-LayerNorm's centring ``I − 𝟙𝟙ᵀ/d`` (not
RMSNorm's), γ the pre-norm's scale and s the LayerScale or constant branch multiplier
(:meth:`~oversmooth.importers.weights.BlockWeights.h_factors`); its d_head possibly nonzero eigenvalues are those
of ``W_O^h diag(s) C diag(γ) W_V^h``. Unlike ``W_V W_O`` it does not depend on how a checkpoint
happens to be parametrised (negating γ_k with row k of W_V, or s_k with column k of W_O, leaves
it unchanged). Eigenvalues are complex in general; both parts are kept.
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from dataclasses import dataclass

import numpy as np
from threadpoolctl import threadpool_limits

from oversmooth.importers.defaults import H_CHOICES as H_CHOICES
from oversmooth.importers.defaults import HChoice as HChoice
from oversmooth.importers.errors import ExtractionError
from oversmooth.importers.weights import BlockWeights
from oversmooth.simulator.errors import InputError
from oversmooth.simulator.theory import value_spectrum

__all__ = [
    "H_CHOICES",
    "LAYER_HEAD",
    "SPECTRA_COLUMNS",
    "SPECTRUM_KINDS",
    "BlockSpectra",
    "HChoice",
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

SPECTRUM_KINDS = ("head", "layer", "head-effective", "layer-effective")
#: Which H a spectrum, a dominance step or a figure uses.
#: Columns of ``spectra.csv``: one eigenvalue per row.
SPECTRA_COLUMNS = ("block", "head", "kind", "real", "imag")
#: The ``head`` value of layer-level rows.
LAYER_HEAD = -1


@dataclass(frozen=True)
class SpectrumRow:
    """One eigenvalue of one block's value product (``head`` is -1 for whole-layer rows)."""

    block: int
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
        Share with negative real part (the paper's "skewed to negative values").
    median_real : float
        Median of the real parts.
    inside_unit_disk : float
        Share inside ``|1 + z| < 1``: eigenvalues that shrink their mode ``|1 + λ| < 1`` (with a
        Perron λ^A = 1: damped low-frequency directions).
    skewness : float
        Fisher–Pearson skewness of the real parts (NaN when they are all equal); a shape statistic,
        not the sign question.
    spectral_radius : float
        Largest modulus.
    """

    kind: str
    count: int
    negative_fraction: float
    median_real: float
    inside_unit_disk: float
    skewness: float
    spectral_radius: float


def head_eigenvalues(block: BlockWeights, head: int, *, h: HChoice = "stored") -> np.ndarray:
    """The d_head eigenvalues of head ``head``'s product, stored or effective.

    Parameters
    ----------
    block : BlockWeights
    head : int
        Query head, 0 ≤ head < n_heads.
    h : {"stored", "effective"}
        ``W_V^h W_O^h`` as stored, or the effective ``M_h`` (the module docstring).

    Returns
    -------
    (d_head,) complex ndarray
        The nonzero-capable eigenvalues of the d×d product (claim 31): those of the
        d_head×d_head product of its factors in the other order.
    """
    W_V, W_O = block.effective_value_head(head) if h == "effective" else block.value_head(head)
    # value_spectrum(A, B) gives eig(A @ B) when A has at least as many columns as rows, so
    # passing (W_O^h, W_V^h) computes the small d_head x d_head product directly.
    return value_spectrum(W_O, W_V)


def layer_eigenvalues(block: BlockWeights, *, h: HChoice = "stored") -> np.ndarray:
    """The d eigenvalues of the whole-layer ``Σ_h M_h`` (key/value heads expanded), stored or
    effective."""
    if h == "effective":
        return value_spectrum(block.effective_W_V(), block.effective_W_O())
    return value_spectrum(block.expanded_W_V(), block.W_O)


@dataclass(frozen=True)
class BlockSpectra:
    """Every eigenvalue kind of one block's value products (complex arrays).

    Attributes
    ----------
    index : int
        The block's index.
    head : (n_heads, d_head) ndarray
        Row h: :func:`head_eigenvalues` of head h, stored.
    layer : (d_model,) ndarray
        :func:`layer_eigenvalues`, stored.
    head_effective, layer_effective : ndarray
        The same of the effective H (equal to the stored ones where nothing is folded).
    """

    index: int
    head: np.ndarray
    layer: np.ndarray
    head_effective: np.ndarray
    layer_effective: np.ndarray

    def heads(self, *, h: HChoice) -> np.ndarray:
        """The per-head eigenvalues of the ``h`` H (:data:`H_CHOICES`)."""
        return self.head_effective if h == "effective" else self.head

    def whole_layer(self, *, h: HChoice) -> np.ndarray:
        """The whole-layer eigenvalues of the ``h`` H (:data:`H_CHOICES`)."""
        return self.layer_effective if h == "effective" else self.layer


def block_spectra(block: BlockWeights) -> BlockSpectra:
    """Every kind of :data:`SPECTRUM_KINDS` for one block (the effective kinds computed only
    where the block folds a factor; else they are the stored ones)."""
    kinds = []
    try:
        for h in ("stored", "effective") if block.folded() else ("stored",):
            heads = np.stack([head_eigenvalues(block, i, h=h) for i in range(block.n_heads)])
            kinds.append((heads, layer_eigenvalues(block, h=h)))
    except InputError as err:  # a product that overflows float64 never reaches the eigensolver
        raise ExtractionError(f"block {block.index}'s value product: {err}") from None
    return BlockSpectra(block.index, *kinds[0], *kinds[-1])


def blocks_spectra(blocks: Sequence[BlockWeights]) -> list[BlockSpectra]:
    """:func:`block_spectra` of every block, with one BLAS thread.

    Many small dense eigenproblems gain nothing from more threads, and multithreaded BLAS
    collapses when the cores are busy (DINOv2's 168 problems: 1.75 s with one thread, 71 s with
    the default threads beside one busy process on 2 cores).
    """
    with threadpool_limits(limits=1, user_api="blas"):
        return [block_spectra(block) for block in blocks]


def model_spectra(blocks: Sequence[BlockWeights]) -> list[SpectrumRow]:
    """Tidy eigenvalue rows for every block: per head and per layer, stored then effective."""
    return spectrum_rows(blocks_spectra(blocks))


def spectrum_rows(spectra: Sequence[BlockSpectra]) -> list[SpectrumRow]:
    """Tidy rows, per block: the heads then the layer, stored then effective."""
    rows: list[SpectrumRow] = []
    for block in spectra:
        kinds = [("", block.head, block.layer)]
        kinds.append(("-effective", block.head_effective, block.layer_effective))
        for suffix, heads, layer in kinds:
            for head, values in enumerate(heads):
                rows.extend(_rows(block.index, head, "head" + suffix, values))
            rows.extend(_rows(block.index, LAYER_HEAD, "layer" + suffix, layer))
    return rows


def _rows(block: int, head: int, kind: str, values: np.ndarray) -> Iterable[SpectrumRow]:
    return (SpectrumRow(block, head, kind, float(z.real), float(z.imag)) for z in values)


def summarize_spectra(rows: Sequence[SpectrumRow]) -> dict[str, SpectrumSummary]:
    """Per kind (in :data:`SPECTRUM_KINDS` order): count, negative share, median real part, share
    inside ``|1 + z| < 1``, skewness, radius."""
    summaries = {}
    for kind in SPECTRUM_KINDS:
        values = np.array([complex(row.real, row.imag) for row in rows if row.kind == kind])
        if values.size:
            summaries[kind] = SpectrumSummary(
                kind=kind,
                count=int(values.size),
                negative_fraction=float(np.mean(values.real < 0)),
                median_real=float(np.median(values.real)),
                inside_unit_disk=float(np.mean(np.abs(1.0 + values) < 1.0)),
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
