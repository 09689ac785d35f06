"""Every rule by name, and building a named rule on a fixed system (what ``simulate`` runs).

Public API
----------
RULES
    Every rule class by name.
SYSTEM_RULES, RULE_OPTIONS
    The rule names :func:`rule_from_system` accepts, and the options each takes.
rule_from_system
    Build a named rule on ``(A, W_V, W_proj[, gamma, beta])``.
"""

from __future__ import annotations

from typing import Any

from numpy.typing import ArrayLike

from oversmooth.simulator.errors import InputError
from oversmooth.simulator.updates.base import UpdateRule
from oversmooth.simulator.updates.linear import (
    FixedAttentionRule,
    LinearRule,
    PostLNRule,
    PreLNRule,
)
from oversmooth.simulator.updates.related import (
    AttnScaleRule,
    FeatScaleRule,
    NeuTRENORule,
    SimilarityRemovalRule,
    ValueResidualRule,
)
from oversmooth.simulator.updates.softmax import SoftmaxAttentionRule
from oversmooth.simulator.validation import check_choice

__all__ = ["RULES", "RULE_OPTIONS", "SYSTEM_RULES", "rule_from_system"]


#: Every rule class by name.
RULES: dict[str, type[UpdateRule]] = {
    "linear": LinearRule,
    "pre-ln": PreLNRule,
    "post-ln": PostLNRule,
    "softmax-attention": SoftmaxAttentionRule,
    "neutreno": NeuTRENORule,
    "value-residual": ValueResidualRule,
    "similarity-removal": SimilarityRemovalRule,
    "attnscale": AttnScaleRule,
    "featscale": FeatScaleRule,
}

#: Names accepted by :func:`rule_from_system`, each with its class and fixed keyword arguments.
_SYSTEM_RULES: dict[str, tuple[type[FixedAttentionRule], dict[str, Any]]] = {
    "linear": (LinearRule, {}),
    "no-skip": (LinearRule, {"skip": False}),
    "pre-ln": (PreLNRule, {}),
    "post-ln": (PostLNRule, {}),
    "neutreno": (NeuTRENORule, {}),
    "resformer": (ValueResidualRule, {"mode": "resformer"}),
    "svformer": (ValueResidualRule, {"mode": "svformer"}),
    "similarity-removal": (SimilarityRemovalRule, {}),
    "attnscale": (AttnScaleRule, {"omega": 0.5}),
    "featscale": (FeatScaleRule, {"s_d": 0.0, "s_h": 0.5}),
}

#: Rule names for a fixed system ``(A, W_V, W_proj[, gamma, beta])``, as used by ``simulate``.
SYSTEM_RULES: tuple[str, ...] = tuple(_SYSTEM_RULES)

#: Options each system rule accepts besides the system (for the command line).
RULE_OPTIONS: dict[str, tuple[str, ...]] = {
    "linear": (),
    "no-skip": (),
    "pre-ln": ("eps",),
    "post-ln": ("eps",),
    "neutreno": ("lam",),
    "resformer": ("weights",),
    "svformer": (),
    "similarity-removal": ("tau",),
    "attnscale": ("omega",),
    "featscale": ("s_d", "s_h", "code_faithful"),
}

_USES_LAYER_NORM = ("pre-ln", "post-ln")


def rule_from_system(
    name: str,
    *,
    A: ArrayLike,
    W_V: ArrayLike,
    W_proj: ArrayLike,
    gamma: ArrayLike | None = None,
    beta: ArrayLike | None = None,
    **options: Any,
) -> FixedAttentionRule:
    """Build the rule called ``name`` on a fixed system.

    Parameters
    ----------
    name : str
        One of :data:`SYSTEM_RULES`: ``linear``, ``no-skip``, ``pre-ln``, ``post-ln``, ``neutreno``,
        ``resformer``, ``svformer``, ``similarity-removal``, ``attnscale``, ``featscale``.
    A : (..., n, n) array_like
    W_V : (..., d, d_v) array_like
    W_proj : (..., d_v, d) array_like
    gamma, beta : (..., d) array_like, optional
        LayerNorm parameters; used by ``pre-ln`` and ``post-ln`` only, ignored by the others.
    **options
        The rule's own options (:data:`RULE_OPTIONS`). Defaults: ``lam=0.6``,
        ``weights=(0.5, 0.5)``, ``tau=1``; ``omega=0.5`` and ``s_h=0.5`` (``s_d=0``) are illustrative
        values that switch the mitigation on (the papers initialise them at 0, the identity).

    Returns
    -------
    FixedAttentionRule
        The rule: an :class:`~oversmooth.simulator.updates.UpdateRule` with ``H``, ``M`` and the arrays.
    """
    check_choice(name, "rule", SYSTEM_RULES)
    unknown = sorted(set(options) - set(RULE_OPTIONS[name]))
    if unknown:
        allowed = ", ".join(RULE_OPTIONS[name]) or "none"
        raise InputError(
            f"rule option `{unknown[0]}` is not accepted by rule {name!r} (accepted: {allowed})"
        )
    cls, fixed = _SYSTEM_RULES[name]
    kwargs = {**fixed, **options}
    if name in _USES_LAYER_NORM:
        kwargs.update(gamma=gamma, beta=beta)
    return cls(A, W_V, W_proj, **kwargs)
