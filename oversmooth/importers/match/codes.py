"""Every reason code a rejected Softmax can carry (``MatchFailure.code``, ``inspect --json``), and
whether a block declined with it was skipped by design or should have been read.

One enumeration, so a code is a name the type checker knows, never a string assembled or searched
for: a role's code is looked up with :func:`projection_code`. The values are the stable tags the
JSON records have always carried.

Skipped by design
-----------------
The theory is about self-attention, ``X_l = X_{l-1} + A X_{l-1} W_V W_O``: A mixes the tokens of X
itself, so the block applies ``I + H ⊗ A`` to X. Two kinds of attention are declined because no
such operator describes them, and a model that has them beside self-attention is audited over its
self-attention blocks (:data:`DISPOSITIONS`, ``"by_design"``):

- ``cross_attention``: the keys and values project another sequence (a decoder reading the
  encoder's output), so A mixes *that* sequence's values into the stream;
- ``windowed_attention``: each input's tokens attend within windows (Swin), so no single A over
  all its tokens exists.

Every other code is a ``"failure"``: the block is attention of the kind the theory covers, or may
be, and the matcher could not read it (a projection, a head layout, a score term it does not
know); a result without it silently misses a layer, so the audit refuses it unless ``--partial``.
"""

from __future__ import annotations

from collections.abc import Mapping
from enum import StrEnum
from types import MappingProxyType
from typing import Literal

__all__ = ["DISPOSITIONS", "Disposition", "RejectCode", "by_design", "projection_code"]


class RejectCode(StrEnum):
    """Why one Softmax was not matched as an attention block."""

    #: The catch-all of a hand-made :class:`~oversmooth.importers.match.MatchFailure`.
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
    #: Q, K and V project different tensors of one sequence (MobileBERT's bottleneck, SegFormer's
    #: spatially reduced keys): not read, though A may still mix the stream's own tokens.
    NOT_SELF_ATTENTION = "not_self_attention"
    #: Q projects the stream, K and V one tensor not computed from it: another sequence.
    CROSS_ATTENTION = "cross_attention"
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


#: Whether a block declined with a code lies outside the theory (``by_design``: skipped, the audit
#: reads the others) or should have been read (``failure``: the audit refuses without --partial).
Disposition = Literal["by_design", "failure"]

#: Every :class:`RejectCode` with its :data:`Disposition` (the module docstring says why).
DISPOSITIONS: Mapping[RejectCode, Disposition] = MappingProxyType(
    {
        RejectCode.OTHER: "failure",
        RejectCode.MALFORMED: "failure",
        RejectCode.FUSED_ATTENTION_OP: "failure",
        RejectCode.SOFTMAX_AXIS: "failure",
        RejectCode.NO_QK_MATMUL: "failure",
        RejectCode.K_NOT_TRANSPOSED: "failure",
        RejectCode.SCORE_VIEW: "failure",
        RejectCode.SCORE_SCALE_NOT_CONSTANT: "failure",
        RejectCode.SCORE_BIAS_HIDDEN: "failure",
        RejectCode.WINDOWED_ATTENTION: "by_design",
        RejectCode.VALUE_MATMUL_MISSING: "failure",
        RejectCode.NOT_SELF_ATTENTION: "failure",
        RejectCode.CROSS_ATTENTION: "by_design",
        RejectCode.NO_OUTPUT_PROJECTION: "failure",
        RejectCode.HEAD_RESHAPE: "failure",
        RejectCode.HEAD_LAYOUT: "failure",
        RejectCode.HEAD_MERGE: "failure",
        RejectCode.HEAD_SIZE: "failure",
        RejectCode.WIDTH_MISMATCH: "failure",
        RejectCode.ROTARY_SCALE: "failure",
        RejectCode.Q_PROJECTION_MISSING: "failure",
        RejectCode.K_PROJECTION_MISSING: "failure",
        RejectCode.V_PROJECTION_MISSING: "failure",
        RejectCode.OUTPUT_PROJECTION_MISSING: "failure",
        RejectCode.Q_PROJECTION_UNSUPPORTED: "failure",
        RejectCode.K_PROJECTION_UNSUPPORTED: "failure",
        RejectCode.V_PROJECTION_UNSUPPORTED: "failure",
        RejectCode.OUTPUT_PROJECTION_UNSUPPORTED: "failure",
        RejectCode.Q_WEIGHT_NOT_CONSTANT: "failure",
        RejectCode.K_WEIGHT_NOT_CONSTANT: "failure",
        RejectCode.V_WEIGHT_NOT_CONSTANT: "failure",
        RejectCode.OUTPUT_WEIGHT_NOT_CONSTANT: "failure",
    }
)


def by_design(code: RejectCode) -> bool:
    """Whether a block declined with ``code`` is skipped by design (outside the theory)."""
    return DISPOSITIONS[code] == "by_design"
