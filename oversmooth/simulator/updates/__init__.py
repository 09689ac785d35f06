"""Update rules: one Transformer layer ``X_{l-1} -> X_l`` on batched tokens ``(..., n, d)``.

Every rule is a frozen dataclass, validated once when built, satisfying the :class:`UpdateRule`
protocol: it is called as ``rule(X, layer, cache) -> X_next`` where ``layer`` is the 0-based index
of the block being applied (``X_{layer} -> X_{layer+1}``) and ``cache`` is a dict private to one
trajectory (NeuTRENO and ResFormer keep the first layer's values there). ``__call__`` does no
validation, because it runs at every layer; ``check_tokens`` validates an input once
(``oversmooth.simulator.dynamics.iterate`` calls it), and ``batch_shape`` gives the rule's own batch axes.

A rule's own matrices may carry leading batch axes, which broadcast against those of ``X``: a
``(64, n, n)`` stack of attention matrices with a ``(64, n, d)`` stack of inputs runs 64 systems.

``homogeneous`` is True iff ``rule(c X) = c rule(X)`` for every ``c > 0`` (with any arrays kept in
``cache["scaled"]`` scaled by the same c); the iterator may then renormalise X after every layer.

Cache protocol
--------------
``cache["scaled"]`` is a dict of arrays that are homogeneous of degree one in X (for example the
first layer's values ``V_0 = X_0 W_V``). Whoever rescales the state X by a factor must rescale these
arrays by the same factor, so that the rule stays homogeneous jointly in (X, cache).

Rules (docs/theory.md §3, §4, §7)
-----------------------------
LinearRule             -- X + A X W_V W_proj (eq. vec_update); without skip A X W_V W_proj (S7)
PreLNRule              -- X + A LN(X) W_V W_proj
PostLNRule             -- LN(X + A X W_V W_proj)
SoftmaxAttentionRule   -- multi-head softmax attention recomputed from X, optional LN and MLP
MLP                    -- act(X W_1 + b_1) W_2 + b_2, the optional feed-forward sub-block
NeuTRENORule           -- Nguyen et al. 2023: (A V_l + lam (V_0 - V_l)) W_proj on the residual
ValueResidualRule      -- ResFormer (w1 V_1 + w2 V_n) and SVFormer (V_n := V_1), Zhou et al. 2024
SimilarityRemovalRule  -- Yu & Zhang 2023: X + (I - tau 11^T/n) A X W_V W_proj
AttnScaleRule          -- Wang et al. 2022: A -> 11^T/n + (1 + omega)(A - 11^T/n)
FeatScaleRule          -- Wang et al. 2022: X + Y + s_d * DC[Y] + s_h * HC[Y], Y = A X W_V W_proj

Modules
-------
base      -- the UpdateRule protocol, the cache key, the shared base class, validation helpers
mlp       -- the MLP sub-block
linear    -- fixed-attention rules: linear, Pre-LN, Post-LN
softmax   -- softmax attention recomputed from X
related   -- the mitigations of related work (NeuTRENO, ResFormer/SVFormer, AttnScale, ...)
registry  -- rules by name and :func:`rule_from_system`
"""

from oversmooth.simulator.updates.base import SCALED, UpdateRule
from oversmooth.simulator.updates.linear import LinearRule, PostLNRule, PreLNRule
from oversmooth.simulator.updates.mlp import MLP
from oversmooth.simulator.updates.registry import (
    RULE_OPTIONS,
    RULES,
    SYSTEM_RULES,
    rule_from_system,
)
from oversmooth.simulator.updates.related import (
    AttnScaleRule,
    FeatScaleRule,
    NeuTRENORule,
    SimilarityRemovalRule,
    ValueResidualRule,
)
from oversmooth.simulator.updates.softmax import SoftmaxAttentionRule

__all__ = [
    "MLP",
    "RULES",
    "RULE_OPTIONS",
    "SCALED",
    "SYSTEM_RULES",
    "AttnScaleRule",
    "FeatScaleRule",
    "LinearRule",
    "NeuTRENORule",
    "PostLNRule",
    "PreLNRule",
    "SimilarityRemovalRule",
    "SoftmaxAttentionRule",
    "UpdateRule",
    "ValueResidualRule",
    "rule_from_system",
]
