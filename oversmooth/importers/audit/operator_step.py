"""The audit's exact layer dominance (``dominance="operator"``): one case per (input, block).

A block applies ``T = I + Σ_h M_hᵀ ⊗ A_h`` to its tokens, with every head's own attention A_h and
its effective (or stored) product ``M_h`` — not one ``I + M_hᵀ ⊗ A_h`` per head. Because every A_h
is row-stochastic, T leaves the low-frequency subspace ``{𝟙 sᵀ}`` invariant and acts on it as
``I + Σ_h M_h``; the block is Perron-dominated (it smooths, in the linear theory) when the largest
``|1 + λ(Σ_h M_h)|`` beats T's spectral radius on the quotient by that subspace
(:func:`oversmooth.simulator.operator.operator_dominance`, matrix-free). Its cost is a few hundred
applications of T per (input, block), so the audit runs it on the first ``operator_inputs``
inputs only, beside the per-head cases of the same inputs, and reports how often the per-head rule
(the majority of a block's heads) agrees with it (docs/theory.md §6.2).

Public API
----------
operator_factors
    Per block, every head's ``M_h`` in factored form.
operator_cases
    The cases of one batch's (input, block) problems.
"""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np

from oversmooth.importers.audit.dominance import DominanceProblem
from oversmooth.importers.audit.records import OperatorCase
from oversmooth.importers.value_spectra import HChoice
from oversmooth.importers.weights import BlockWeights
from oversmooth.simulator.backend import to_numpy
from oversmooth.simulator.operator import HeadFactors, operator_dominance

__all__ = ["operator_cases", "operator_factors"]


def operator_factors(blocks: Sequence[BlockWeights], h: HChoice) -> tuple[HeadFactors, ...]:
    """Per block, ``M_h = W_V[h] @ W_O[h]`` of every query head, effective or stored.

    ``W_V`` is (heads, d, d_head) and ``W_O`` (heads, d_head, d), float64; ``h`` as
    :data:`oversmooth.importers.value_spectra.H_CHOICES` (:meth:`BlockWeights.effective_value_head`).
    """
    factors = []
    for block in blocks:
        pairs = [
            block.effective_value_head(head) if h == "effective" else block.value_head(head)
            for head in range(block.n_heads)
        ]
        W_V = np.stack([np.ascontiguousarray(left) for left, _ in pairs])
        W_O = np.stack([np.ascontiguousarray(right) for _, right in pairs])
        factors.append(HeadFactors(W_V, W_O))
    return tuple(factors)


def operator_cases(
    problems: Sequence[DominanceProblem],
    factors: Sequence[HeadFactors],
    tie_rtol: float,
    inputs: int,
) -> list[OperatorCase]:
    """The operator cases of ``problems`` whose input is among the first ``inputs``, in order.

    Each problem's attention (real tokens, rows renormalised: :meth:`DominanceProblem.attention`)
    meets its block's factors, on the host (attention kept on a GPU is copied for these few
    inputs).
    """
    cases = []
    for problem in problems:
        if problem.item >= inputs:
            continue
        result = operator_dominance(
            to_numpy(problem.attention()), factors[problem.layer], tie_rtol=tie_rtol
        )
        cases.append(
            OperatorCase(
                problem.item,
                problem.layer,
                result.kind,
                result.rho_lfc,
                result.rho_quotient,
                complex(result.eigenvalue),
                result.iterations,
                problem.n_tokens,
            )
        )
    return cases
