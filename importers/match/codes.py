"""Every reason code a rejected Softmax can carry (``MatchFailure.code``, ``inspect --json``).

One enumeration, so a code is a name the type checker knows, never a string assembled or searched
for: a role's code is looked up with :func:`projection_code`. The values are the stable tags the
JSON records have always carried.
"""

from __future__ import annotations

from enum import StrEnum
from typing import Literal

__all__ = ["RejectCode", "projection_code"]


class RejectCode(StrEnum):
    """Why one Softmax was not matched as an attention block."""

    #: The catch-all of a hand-made :class:`~importers.match.MatchFailure`.
    OTHER = "other"
    #: A constant or attribute that no ONNX graph can hold around the candidate.
    MALFORMED = "malformed"
    #: A fused attention operator left in the graph (not defused at load).
    FUSED_ATTENTION_OP = "fused_attention_op"
    SOFTMAX_AXIS = "softmax_axis"
    NO_QK_MATMUL = "no_qk_matmul"
    K_NOT_TRANSPOSED = "k_not_transposed"
    SCORE_VIEW = "score_view"
    SCORE_SCALE_NOT_CONSTANT = "score_scale_not_constant"
    SCORE_BIAS_HIDDEN = "score_bias_hidden"
    WINDOWED_ATTENTION = "windowed_attention"
    VALUE_MATMUL_MISSING = "value_matmul_missing"
    NOT_SELF_ATTENTION = "not_self_attention"
    NO_OUTPUT_PROJECTION = "no_output_projection"
    HEAD_RESHAPE = "head_reshape"
    HEAD_LAYOUT = "head_layout"
    HEAD_MERGE = "head_merge"
    HEAD_SIZE = "head_size"
    WIDTH_MISMATCH = "width_mismatch"
    ROTARY_SCALE = "rotary_scale"
    Q_PROJECTION_MISSING = "q_projection_missing"
    K_PROJECTION_MISSING = "k_projection_missing"
    V_PROJECTION_MISSING = "v_projection_missing"
    OUTPUT_PROJECTION_MISSING = "output_projection_missing"
    Q_PROJECTION_UNSUPPORTED = "q_projection_unsupported"
    K_PROJECTION_UNSUPPORTED = "k_projection_unsupported"
    V_PROJECTION_UNSUPPORTED = "v_projection_unsupported"
    OUTPUT_PROJECTION_UNSUPPORTED = "output_projection_unsupported"
    Q_WEIGHT_NOT_CONSTANT = "q_weight_not_constant"
    K_WEIGHT_NOT_CONSTANT = "k_weight_not_constant"
    V_WEIGHT_NOT_CONSTANT = "v_weight_not_constant"
    OUTPUT_WEIGHT_NOT_CONSTANT = "output_weight_not_constant"


#: What went wrong with a projection, for :func:`projection_code`.
ProjectionProblem = Literal["projection_missing", "projection_unsupported", "weight_not_constant"]


def projection_code(role: str, problem: ProjectionProblem) -> RejectCode:
    """The code of ``problem`` for the projection of ``role`` (``Q``, ``K``, ``V`` or ``output``)."""
    return RejectCode(f"{role.lower()}_{problem}")
