"""Attribution of a block's observed change of a smoothing metric to the parts of its sublayers.

A pre-LN attention sublayer is, on the same input X (n×d) and the same attention A_h, exactly::

    X ↦ X + Σ_h A_h D X M_h + 𝟙cᵀ,

with ``M_h`` the effective head product (centring, γ, W_V^h W_O^h, output scale), ``D =
diag(1/σ_t)`` the norm's per-token scale at X (RMSNorm: 1/rms; post-LN and norm-free: I) and c
the bias row ``((β W_V + b_V) W_O + b_O) ⊙ s`` (docs/theory.md §6.11–6.12). The theory's operator
is the first term alone. This module evaluates the sublayer on the same X and A with parts
removed and splits the change of a metric f (HFC/LFC, the cosine) among them:

    states   x = X,  lin = X + Σ A_h X M_h,  scl = X + Σ A_h D X M_h,
             lin+c = lin + 𝟙cᵀ,  model = scl + 𝟙cᵀ (the sublayer as the theory's parts rebuild it)

- **linear** ``f(lin) − f(x)``: the effective-H operator, no D, no c — the part the theory covers;
- **scale** and **bias**: the Shapley split of ``f(model) − f(lin)`` between the two terms the
  effective H leaves out (symmetric, the average of both orders: ``scale = ½[(f(scl) − f(lin)) +
  (f(model) − f(lin+c))]``, ``bias`` the other half-sums). The linear operator is the base, not
  a third player: D and c modify the branch, and "D without the branch" is no sublayer. The
  sequential split in the order linear → scale → bias is returned beside it;
- **norm** (post-LN only) ``f(LN(model)) − f(model)``: the norm after the residual add;
- **reconstruction** ``f(graph) − f(rebuilt)``: what the rebuilt sublayer misses against the
  graph's own tensor (round-off of the float32 graph, a renormalised A over padding, a
  departure the matcher walked: a branch norm, clipped values);
- **mlp** ``f(output) − f(graph)``: the rest of the block.

The parts sum to ``f(output) − f(x)`` exactly (a telescoping sum: by construction, a plumbing
identity, not evidence); the reconstruction part says how far the rebuilt sublayer is from the
graph's.

Functions
---------
sublayer_states   -- the four states of the attention sublayer with parts removed
attribute         -- the parts of one metric from its values at every state
relative_residual -- how far the rebuilt sublayer is from the graph's tensor
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass

import numpy as np
from numpy.typing import ArrayLike, NDArray

from oversmooth.simulator.operator import HeadFactors, apply_layer
from oversmooth.simulator.validation import as_float_array

__all__ = ["PARTS", "STATES", "SublayerStates", "attribute", "relative_residual", "sublayer_states"]

FloatArray = NDArray[np.float64]

#: The parts of a block's change, in the order they are reported.
PARTS = ("linear", "scale", "bias", "norm", "reconstruction", "mlp")
#: The states a metric is evaluated at (``normed`` only for a post-LN block).
STATES = ("x", "linear", "scaled", "linear_bias", "model", "normed", "graph", "output")


@dataclass(frozen=True)
class SublayerStates:
    """The attention sublayer on one X with parts removed, each (n, d) float64.

    Attributes
    ----------
    x : the input X
    linear : ``X + Σ_h A_h X M_h``
    scaled : ``X + Σ_h A_h D X M_h``
    linear_bias : ``linear + 𝟙cᵀ``
    model : ``scaled + 𝟙cᵀ``, the rebuilt sublayer (before a post-LN norm)
    """

    x: FloatArray
    linear: FloatArray
    scaled: FloatArray
    linear_bias: FloatArray
    model: FloatArray


def sublayer_states(
    A_heads: ArrayLike,
    M_heads: ArrayLike | HeadFactors,
    X: ArrayLike,
    scale: ArrayLike | None,
    bias: ArrayLike,
) -> SublayerStates:
    """Evaluate the attention sublayer on ``X`` with D, c, both or neither.

    Parameters
    ----------
    A_heads : (heads, n, n) array_like
        The heads' attention on X (row-stochastic; rows renormalised exactly).
    M_heads : (heads, d, d) array_like or HeadFactors
        Effective head products.
    X : (n, d) array_like
    scale : (n,) array_like or None
        The per-token scale D (None: D = I, and ``scaled`` is ``linear``).
    bias : (d,) array_like
        The bias row c.

    Returns
    -------
    SublayerStates
    """
    X = as_float_array(X, "X", min_ndim=2)
    c = as_float_array(bias, "bias", min_ndim=1)[None, :]
    linear = apply_layer(A_heads, M_heads, X)
    scaled = linear if scale is None else apply_layer(A_heads, M_heads, X, scale=scale)
    return SublayerStates(X, linear, scaled, linear + c, scaled + c)


def attribute(values: Mapping[str, float]) -> dict[str, tuple[float, float]]:
    """Split ``f(output) − f(x)`` into :data:`PARTS`, Shapley and sequential.

    Parameters
    ----------
    values : mapping of str to float
        f at each of :data:`STATES` (``normed`` may be absent: no post-LN norm, part ``norm`` 0).

    Returns
    -------
    dict of str to (float, float)
        Per part, ``(shapley, sequential)``: equal but for scale and bias, whose sequential
        split takes the order linear → scale → bias. Either column sums to ``f(output) − f(x)``.
    """
    v = dict(values)
    rebuilt = v.get("normed", v["model"])
    scale_first = v["scaled"] - v["linear"]
    bias_second = v["model"] - v["scaled"]
    scale = 0.5 * (scale_first + (v["model"] - v["linear_bias"]))
    bias = 0.5 * ((v["linear_bias"] - v["linear"]) + bias_second)
    same = {
        "linear": v["linear"] - v["x"],
        "norm": rebuilt - v["model"],
        "reconstruction": v["graph"] - rebuilt,
        "mlp": v["output"] - v["graph"],
    }
    split = {"scale": (scale, scale_first), "bias": (bias, bias_second)}
    return {part: split.get(part, (same.get(part, 0.0), same.get(part, 0.0))) for part in PARTS}


def relative_residual(graph: ArrayLike, rebuilt: ArrayLike) -> float:
    """``‖graph − rebuilt‖_F / ‖graph‖_F``: how far the rebuilt sublayer is from the graph's."""
    graph = np.asarray(graph, dtype=np.float64)
    scale = float(np.linalg.norm(graph))
    return (
        float(np.linalg.norm(graph - np.asarray(rebuilt, dtype=np.float64)) / scale)
        if scale
        else float("nan")
    )
