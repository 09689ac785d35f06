"""The audit's dominance step: the dominating eigenvalue of ``I + H_h ⊗ A`` per (input, layer, head).

A is a head's attention matrix restricted to the real tokens (rows renormalised), H_h the head's
value spectrum (see :mod:`importers.run.audit`, "Dominance counting"). Most cases are decided
without the spectrum of A: :func:`simulator.perron.dominating_modes` certifies perron kind from a
bound on A's non-Perron eigenvalues and computes the full spectra only of the heads it cannot
decide; its answer is the dense path's (same kind, μ, λ^A, λ^H to round-off).

Public API
----------
dominance_spectra
    Per block, the (n_heads, k) H eigenvalues the dominance step uses, from the value spectra.
DominanceProblem, dominance_problems
    The heads of one (input, layer), and all of one batch of onnxruntime outputs.
measure_dominance
    The cases of one batch of onnxruntime outputs.
"""

from __future__ import annotations

from collections.abc import Sequence
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass

import numpy as np

from importers.errors import ImporterInputError
from importers.run.feeds import Inputs
from importers.run.records import DominanceCase
from importers.value_spectra import BlockSpectra
from importers.weights import BlockWeights
from simulator.perron import PerronTargets, dominating_modes, perron_targets
from simulator.theory import KINDS

__all__ = ["DominanceProblem", "dominance_problems", "dominance_spectra", "measure_dominance"]


def dominance_spectra(
    blocks: Sequence[BlockWeights],
    spectra: Sequence[BlockSpectra],
    granularity: str,
    fold_gamma: bool,
) -> list[np.ndarray]:
    """Per block a (n_heads, k) array of H eigenvalues used for dominance.

    ``granularity`` is ``"layer"`` or ``"head"``. ``"head"``: the d_head eigenvalues of ``W_O^h W_V^h`` plus the zero eigenvalue of the
    rank-deficient d×d product (when ``d_model > d_head``); ``"layer"``: the d eigenvalues of the
    whole-layer product for every head. ``fold_gamma`` uses the γ-folded kinds of pre-LN blocks.
    """
    values = []
    for block, spectrum in zip(blocks, spectra, strict=True):
        if granularity == "layer":
            eig = np.tile(spectrum.whole_layer(gamma=fold_gamma), (block.n_heads, 1))
        else:
            eig = spectrum.heads(gamma=fold_gamma)
            if block.d_model > block.d_head:  # the d×d product also has the eigenvalue 0
                eig = np.concatenate([eig, np.zeros((block.n_heads, 1))], axis=1)
        values.append(eig)
    return values


def _token_masks(inputs: Inputs, batch: int, n_tokens: int) -> np.ndarray:
    # Images have no mask (every position is real); a text mask must match the token axis exactly.
    return inputs.token_mask_for(n_tokens)[:batch]


def _attention_probs(array: np.ndarray, name: str, n_heads: int) -> np.ndarray:
    if array.ndim != 4 or array.shape[1] != n_heads or array.shape[2] != array.shape[3]:
        raise ImporterInputError(
            f"attention probabilities {name!r} must have shape (batch, {n_heads}, T, T); got {array.shape}"
        )
    return array


@dataclass(frozen=True)
class DominanceProblem:
    """The heads of one (input, layer): attention probabilities and the H spectra they meet.

    Attributes
    ----------
    item, layer : int
    probs : (heads, T, T) ndarray
        The block's attention probabilities for this input (all positions).
    token_mask : (T,) bool ndarray
        The real tokens.
    eig_H : (heads, k) complex ndarray
    targets : PerronTargets
        ``perron_targets(eig_H)``, shared by the layer's problems.
    """

    item: int
    layer: int
    probs: np.ndarray
    token_mask: np.ndarray
    eig_H: np.ndarray
    targets: PerronTargets

    def attention(self) -> np.ndarray:
        """A (heads, n, n): the real tokens' rows and columns, rows renormalised (float64)."""
        if self.token_mask.all():  # images: no copy of a submatrix (10x faster at T = 257)
            A = self.probs.astype(np.float64)
        else:
            keep = np.flatnonzero(self.token_mask)
            A = self.probs[:, keep[:, None], keep].astype(np.float64)
        A /= A.sum(axis=-1, keepdims=True)
        return A

    def cases(self, tie_rtol: float, *, certify: bool = True) -> list[DominanceCase]:
        """One case per head (:func:`simulator.perron.dominating_modes`; ``certify=False``: dense)."""
        A = self.attention()
        modes = dominating_modes(
            A, self.eig_H, tie_rtol=tie_rtol, certify=certify, targets=self.targets
        )
        return [
            DominanceCase(
                self.item,
                self.layer,
                head,
                KINDS[int(modes.kinds[head])],
                complex(modes.mu[head]),
                complex(modes.eig_A[head]),
                complex(modes.eig_H[head]),
                int(A.shape[-1]),
            )
            for head in range(A.shape[0])
        ]


def dominance_problems(
    outputs: dict[str, np.ndarray],
    blocks: Sequence[BlockWeights],
    attention: Sequence[str],
    inputs: Inputs,
    start: int,
    eig_H: Sequence[np.ndarray],
    tie_rtol: float,
) -> list[DominanceProblem]:
    """The (input, layer) problems of one batch of outputs, in (layer, input) order.

    ``outputs`` hold the blocks' attention probabilities under the names ``attention`` for the
    batch ``inputs``, whose first input is numbered ``start``; ``eig_H`` holds one (n_heads, k)
    array per block (:func:`dominance_spectra`).
    """
    problems = []
    for layer, (block, name) in enumerate(zip(blocks, attention, strict=False)):
        probs = _attention_probs(outputs[name], name, block.n_heads)
        masks = _token_masks(inputs, probs.shape[0], probs.shape[-1])
        targets = perron_targets(eig_H[layer], tie_rtol=tie_rtol)
        problems += [
            DominanceProblem(start + b, layer, probs[b], masks[b], eig_H[layer], targets)
            for b in range(len(probs))
        ]
    return problems


def measure_dominance(
    outputs: dict[str, np.ndarray],
    blocks: Sequence[BlockWeights],
    attention: Sequence[str],
    inputs: Inputs,
    start: int,
    eig_H: Sequence[np.ndarray],
    tie_rtol: float,
    pool: ThreadPoolExecutor,
) -> list[DominanceCase]:
    """Dominance cases of one batch: every (input, layer, head) with its attention matrix.

    The (input, layer) problems (:func:`dominance_problems`) are spread over ``pool``'s threads
    (matrix products and LAPACK release the GIL); the cases come back in (layer, input, head)
    order whatever the thread count.
    """
    problems = dominance_problems(outputs, blocks, attention, inputs, start, eig_H, tie_rtol)
    done = pool.map(lambda problem: problem.cases(tie_rtol), problems)
    return [case for cases in done for case in cases]
