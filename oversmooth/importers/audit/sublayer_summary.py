"""Per-block summaries of the attribution and the operating point (``audit.json``, ``report.md``).

The cases are :class:`~oversmooth.importers.audit.operating_step.AttributionCase` and
:class:`~oversmooth.importers.audit.operating_step.OperatingCase` (read by attribute: this module imports no
record type, so :mod:`oversmooth.importers.audit.records` can use it).

Public API
----------
ATTRIBUTION_DEFINITION, OPERATING_DEFINITION
    What ``audit.json`` → ``attribution`` and → ``dominance.operating`` hold.
attribution_blocks
    Per block, the mean of every part's change over the inputs, and the largest residual.
operating_blocks
    Per block, the operating point's kinds, directions and limits over the inputs.
sublayer_json
    The ``audit.json`` keys of both (none when neither ran).
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import numpy as np

from oversmooth.simulator.attribution import PARTS

__all__ = [
    "ATTRIBUTION_DEFINITION",
    "OPERATING_DEFINITION",
    "OTHER_PARTS",
    "attribution_blocks",
    "operating_blocks",
    "sublayer_json",
]

#: The parts of the attention sublayer the effective-H theory leaves out.
OTHER_PARTS = ("scale", "bias", "norm", "reconstruction")

ATTRIBUTION_DEFINITION = (
    "per (block, input) of the first --operator-inputs inputs: the block's observed change of "
    "HFC/LFC and cosine split into linear (X + sum_h A_h X M_h with the effective H: the part "
    "the theory covers), scale (the pre-norm's per-token 1/sigma, D) and bias (the bias row c) "
    "by a Shapley split over {D, c} with the linear operator as base (sequential order linear, "
    "scale, bias beside it), norm (a post-LN norm after the residual add), reconstruction (the "
    "graph's attention-sublayer tensor minus the rebuilt one) and mlp (the rest of the block); "
    "the parts sum to the block's change; reconstruction_residual = ||graph - rebuilt||_F / "
    "||graph||_F"
)
OPERATING_DEFINITION = (
    "per (input, block) of the first --operator-inputs inputs: the attention sublayer frozen at "
    "the input's own norm, T_D(X) = X + sum_h A_h D X M_h (D = diag(1/sigma) of a pre-LayerNorm, "
    "1/rms of a pre-RMSNorm, I for post-LN and norm-free blocks); kind perron when its "
    "dominating eigenspace lies in the low-frequency subspace (repetition drives HFC/LFC to 0), "
    "balanced when it meets it, else non-perron; limit = HFC/LFC of the dominating eigenvector, "
    "which repetition reaches; direction smoothing when the limit lies below the input's HFC/LFC"
)


def _mean(values: Sequence[float]) -> float:
    finite = np.asarray(values, dtype=np.float64)
    finite = finite[np.isfinite(finite)]
    return float(finite.mean()) if finite.size else float("nan")


def attribution_blocks(cases: Sequence[Any]) -> list[dict[str, Any]]:
    """Per block: the inputs, each part's mean ``delta_hfc_lfc`` and ``delta_cosine`` (Shapley),
    the attention sublayer's and the block's total, and the largest reconstruction residual."""
    by_block: dict[int, list[Any]] = {}
    for case in cases:
        by_block.setdefault(case.block, []).append(case)
    rows = []
    for block, found in sorted(by_block.items()):
        parts = {
            part: {
                "delta_hfc_lfc": _mean([c.delta_hfc_lfc for c in found if c.part == part]),
                "delta_cosine": _mean([c.delta_cosine for c in found if c.part == part]),
            }
            for part in PARTS
        }
        attention = [p for p in PARTS if p != "mlp"]
        rows.append(
            {
                "block": block,
                "inputs": len({c.input for c in found}),
                "parts": parts,
                "attention_hfc_lfc": sum(parts[p]["delta_hfc_lfc"] for p in attention),
                "attention_cosine": sum(parts[p]["delta_cosine"] for p in attention),
                "reconstruction_residual": max(c.reconstruction_residual for c in found),
            }
        )
    return rows


def operating_blocks(cases: Sequence[Any]) -> list[dict[str, Any]]:
    """Per block: the inputs, the share of each kind and direction, the mean limit HFC/LFC (its
    low end) and the input's, the mean 1/σ and what D is."""
    by_block: dict[int, list[Any]] = {}
    for case in cases:
        by_block.setdefault(case.block, []).append(case)
    rows = []
    for block, found in sorted(by_block.items()):
        kinds = [c.kind for c in found]
        directions = [c.direction for c in found]
        rows.append(
            {
                "block": block,
                "inputs": len(found),
                "scale": found[0].scale,
                "mean_inverse_scale": _mean([c.mean_inverse_scale for c in found]),
                "perron": kinds.count("perron") / len(found),
                "non_perron": kinds.count("non-perron") / len(found),
                "balanced": kinds.count("balanced") / len(found),
                "smoothing": directions.count("smoothing") / len(found),
                "no_smoothing": directions.count("no smoothing") / len(found),
                "tie": directions.count("tie") / len(found),
                "limit_hfc_lfc": _mean([c.limit_low for c in found]),
                "input_hfc_lfc": _mean([c.input_hfc_lfc for c in found]),
                "hfc_share": _mean([c.hfc_share for c in found]),
            }
        )
    return rows


def sublayer_json(operating: Sequence[Any], attribution: Sequence[Any]) -> dict[str, Any]:
    """``{"attribution": ..., "operating": ...}`` for ``audit.json``, each key only when it ran."""
    found: dict[str, Any] = {}
    if attribution:
        found["attribution"] = {
            "definition": ATTRIBUTION_DEFINITION,
            "per_block": attribution_blocks(attribution),
        }
    if operating:
        found["operating"] = {
            "definition": OPERATING_DEFINITION,
            "per_block": operating_blocks(operating),
        }
    return found
