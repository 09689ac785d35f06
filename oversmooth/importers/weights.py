"""Read a matched attention block's weights as float64 arrays in the row-vector convention.

Public API
----------
BlockWeights
    W_Q, W_K, W_V, W_O, biases, the attention sub-block's norm parameters and LayerScale of one block,
    plus the graph tensor names the audit needs (block input/output, residual, attention probabilities).
block_weights
    One :class:`~oversmooth.importers.match.AttentionBlock` → :class:`BlockWeights`.
extract
    Every block of a model, in depth order.
linear_weights
    One projection → ``(W, b)`` with ``y = x @ W + b`` (dequantised, Gemm ``transB``/``alpha``/``beta``
    applied).

Convention (docs/theory.md §3.3, §6.7): ``y = x @ W``; W_Q is (d_model, n_heads·d_head) with head h in
columns ``h·d_head:(h+1)·d_head``; W_K and W_V are (d_model, n_kv_heads·d_head); W_O is
(n_heads·d_head, d_model) with head h in the matching rows. Quantised weights are returned
dequantised: int8 Cast→Mul and DequantizeLinear are folded exactly as the graph computes them
(float32); onnxruntime dynamic quantisation (MatMulInteger) gives ``(W_q − zero_point)·scale`` and
block-quantised ``MatMulNBits`` ``(q − z)·s`` per block (:mod:`oversmooth.importers.nbits`), both exact
in float64.
"""

from __future__ import annotations

from dataclasses import dataclass, field, fields
from typing import Any

import numpy as np
from numpy.typing import NDArray

from oversmooth.importers.errors import ExtractionError
from oversmooth.importers.graph import GraphIndex, OnnxModel
from oversmooth.importers.match import (
    AttentionBlock,
    LinearMatch,
    check_complete,
    find_attention_blocks,
)
from oversmooth.importers.match.linear_forms import dense_weight
from oversmooth.importers.nbits import dequantize_nbits
from oversmooth.simulator.effective import prenorm_left

__all__ = [
    "FACTOR_KEYS",
    "WEIGHT_KEYS",
    "BlockWeights",
    "block_weights",
    "extract",
    "linear_weights",
]

FloatArray = NDArray[np.float64]

#: Array fields of :class:`BlockWeights`, in the order they are written to ``.npz`` files.
WEIGHT_KEYS = (
    "W_Q",
    "W_K",
    "W_V",
    "W_O",
    "b_Q",
    "b_K",
    "b_V",
    "b_O",
    "gamma",
    "beta",
    "layer_scale",
)
#: The effective H's factors written after them (:meth:`BlockWeights.h_factors`).
FACTOR_KEYS = ("h_centre", "h_scale_in", "h_scale_out")


@dataclass(frozen=True, eq=False, kw_only=True)
class BlockWeights(AttentionBlock):
    """A matched attention sub-block with its weights read (float64, read-only arrays).

    The structure (sizes, norm position, graph tensor names, ``sources``, ``to_dict()``) is
    inherited from :class:`~oversmooth.importers.match.AttentionBlock`; this record adds the numbers.

    Attributes
    ----------
    W_Q : (d_model, n_heads*d_head) ndarray
    W_K, W_V : (d_model, n_kv_heads*d_head) ndarray
    W_O : (n_heads*d_head, d_model) ndarray
    b_Q, b_K, b_V, b_O : ndarray or None
    gamma, beta : (d_model,) ndarray or None
        The attention sub-block's norm: the norm before attention (pre-LN) or after the attention
        residual Add (post-LN).
    layer_scale : (d_model,) ndarray or None
    eps : float or None
        The norm's epsilon.
    """

    W_Q: FloatArray = field(repr=False)
    W_K: FloatArray = field(repr=False)
    W_V: FloatArray = field(repr=False)
    W_O: FloatArray = field(repr=False)
    b_Q: FloatArray | None = field(repr=False)
    b_K: FloatArray | None = field(repr=False)
    b_V: FloatArray | None = field(repr=False)
    b_O: FloatArray | None = field(repr=False)
    gamma: FloatArray | None = field(repr=False)
    beta: FloatArray | None = field(repr=False)
    layer_scale: FloatArray | None = field(repr=False)
    eps: float | None

    @property
    def kv_group(self) -> int:
        """Query heads per key/value head (1 without GQA)."""
        return self.n_heads // self.n_kv_heads

    def value_head(self, head: int) -> tuple[FloatArray, FloatArray]:
        """``(W_V^h, W_O^h)`` for query head ``head``: (d_model, d_head) and (d_head, d_model).

        With GQA, head h reads key/value head ``h // (n_heads / n_kv_heads)``.
        """
        kv = head // self.kv_group
        d = self.d_head
        return self.W_V[:, kv * d : (kv + 1) * d], self.W_O[head * d : (head + 1) * d, :]

    def expanded_W_V(self) -> FloatArray:
        """W_V with each key/value head repeated for its query heads: (d_model, n_heads*d_head)."""
        return np.concatenate([self.value_head(head)[0] for head in range(self.n_heads)], axis=1)

    def arrays(self) -> dict[str, FloatArray]:
        """The arrays that are present, keyed as in :data:`WEIGHT_KEYS`, then the effective H's
        factors (:data:`FACTOR_KEYS`, see :meth:`h_factors`)."""
        found = {key: getattr(self, key) for key in WEIGHT_KEYS}
        present = {key: value for key, value in found.items() if value is not None}
        return {**present, **self.h_factors()}

    @property
    def centred(self) -> bool:
        """Whether the attention branch reads its input centred (a pre-LN LayerNorm; not RMSNorm)."""
        return self.norm == "pre" and self.norm_kind == "layernorm"

    def h_factors(self) -> dict[str, FloatArray]:
        """The linear factors the effective H folds around ``W_V W_O`` (docs/theory.md §6.8).

        ``h_centre`` (a 0-d 1.0 or 0.0): the input is centred, ``x ↦ x (I − 𝟙𝟙ᵀ/d)``;
        ``h_scale_in`` (d,): then scaled per feature (a pre-norm's γ, else ones);
        ``h_scale_out`` (d,): the branch's output scaled per feature after W_O (LayerScale, a
        constant branch multiplier, else ones). So for head h
        ``M_h = C diag(h_scale_in) W_V^h W_O^h diag(h_scale_out)``, C the centring or I.
        """
        ones = np.ones(self.d_model)
        gamma = self.gamma if self.norm == "pre" and self.gamma is not None else ones
        scale = self.layer_scale if self.layer_scale is not None else ones
        return {
            "h_centre": _frozen(np.array(1.0 if self.centred else 0.0)),
            "h_scale_in": _frozen(gamma),
            "h_scale_out": _frozen(scale),
        }

    def folded(self) -> tuple[str, ...]:
        """The factors the effective H folds in besides ``W_V W_O``, by name (empty: H is stored)."""
        names: tuple[str, ...] = ("centring",) if self.centred else ()
        if self.norm == "pre" and self.gamma is not None:
            names += ("gamma",)
        return names + (("layer_scale",) if self.layer_scale is not None else ())

    def omitted(self) -> tuple[str, ...]:
        """What the attention branch applies that no right factor can carry (listed, not folded).

        The pre-norm's per-token 1/σ (a positive scale per token, not per feature) and its β, the
        value and output biases (constant rows after the row-stochastic A), a norm after the
        residual add (post-LN: it acts on the sum, outside the branch), and the matcher's
        ``departures`` (a branch norm, clipped values).
        """
        names = []
        if self.norm == "pre":
            names.append(f"per-token 1/σ of the {self.norm_kind or 'norm'}")
            names += ["beta"] if self.beta is not None else []
        names += [name for name in ("b_V", "b_O") if getattr(self, name) is not None]
        names += ["the norm after the residual add"] if self.norm == "post" else []
        return tuple(names + list(self.departures))

    def effective_value_head(self, head: int) -> tuple[FloatArray, FloatArray]:
        """``(L W_V^h, W_O^h R)`` of query head ``head``, their product the effective ``M_h``.

        ``L = C diag(h_scale_in)`` (d×d, C the centring or I) and ``R = diag(h_scale_out)``
        (:meth:`h_factors`); shapes (d_model, d_head) and (d_head, d_model).
        """
        W_V, W_O = self.value_head(head)
        return self._left(W_V), W_O * self.h_factors()["h_scale_out"][None, :]

    def effective_W_V(self) -> FloatArray:
        """``L W_V`` with key/value heads expanded: (d_model, n_heads*d_head)."""
        return self._left(self.expanded_W_V())

    def effective_W_O(self) -> FloatArray:
        """``W_O R``: (n_heads*d_head, d_model)."""
        return self.W_O * self.h_factors()["h_scale_out"][None, :]

    def _left(self, W_V: FloatArray) -> FloatArray:
        """``C diag(h_scale_in) W_V``: rows scaled, then (when centred) column means removed."""
        return prenorm_left(W_V, self.h_factors()["h_scale_in"], centred=self.centred)


def extract(model: OnnxModel, *, partial: bool = False) -> list[BlockWeights]:
    """Weights of every attention block of ``model``, in depth order.

    Parameters
    ----------
    partial : bool
        Accept a model whose attention is only partly matched (the matched blocks are returned).

    Raises
    ------
    NoAttentionBlocksError
        Nothing matched (see :func:`oversmooth.importers.match.find_attention_blocks`).
    IncompleteMatchError
        Some attention was not matched and ``partial`` is not set.
    ExtractionError
        A matched weight has an unexpected size, or a NaN or infinite entry.
    """
    report = find_attention_blocks(model)
    check_complete(report, partial=partial)
    return [block_weights(model, block) for block in report.blocks]


def block_weights(model: OnnxModel, block: AttentionBlock) -> BlockWeights:
    """Read one matched block's weights (float64, canonical head order)."""
    index = model.index
    W_q, b_q = linear_weights(index, block.q)
    W_k, b_k = linear_weights(index, block.k)
    W_v, b_v = linear_weights(index, block.v)
    W_o, b_o = linear_weights(index, block.o)
    norm = block.norm_match
    d = block.d_model
    structure = {item.name: getattr(block, item.name) for item in fields(AttentionBlock)}
    weights: dict[str, Any] = {  # FloatArray or None each, as BlockWeights types them
        "W_Q": _frozen(W_q[:, block.q_columns]),
        "W_K": _frozen(W_k[:, block.k_columns]),
        "W_V": _frozen(W_v[:, block.v_columns]),
        "W_O": _frozen(W_o[block.o_rows, :]),
        "b_Q": _select(b_q, block.q_columns),
        "b_K": _select(b_k, block.k_columns),
        "b_V": _select(b_v, block.v_columns),
        "b_O": None if b_o is None else _frozen(b_o),
        "gamma": _vector(index, norm.gamma if norm else None, d, "gamma"),
        "beta": _vector(index, norm.beta if norm else None, d, "beta"),
        "layer_scale": _vector(index, block.layer_scale_name, d, "layer_scale"),
    }
    _check_finite(block, weights)
    return BlockWeights(**structure, **weights, eps=norm.eps if norm else None)


def _check_finite(block: AttentionBlock, weights: dict[str, FloatArray | None]) -> None:
    """Refuse a NaN or infinite weight (the model file is bad input): nothing computed from it
    (value spectra, the effective H, a reparameterisation) could mean anything, and LAPACK would
    fail on it with a traceback instead of a line."""
    norm = block.norm_match
    tensors = {
        "W_Q": block.q.weight,
        "W_K": block.k.weight,
        "W_V": block.v.weight,
        "W_O": block.o.weight,
        "b_Q": block.q.bias,
        "b_K": block.k.bias,
        "b_V": block.v.bias,
        "b_O": block.o.bias,
        "gamma": norm.gamma if norm else None,
        "beta": norm.beta if norm else None,
        "layer_scale": block.layer_scale_name,
    }
    for key, value in weights.items():
        if value is None:
            continue
        finite = np.isfinite(value)
        if not finite.all():
            bad = value[~finite]
            kinds = sorted(
                {"NaN" if np.isnan(x) else "+inf" if x > 0 else "-inf" for x in bad[:64]}
            )
            raise ExtractionError(
                f"block {block.index}'s {key} ({tensors[key]!r}) must be finite; got "
                f"{'/'.join(kinds)} in {bad.size} of its {value.size} entries"
            )


def linear_weights(index: GraphIndex, linear: LinearMatch) -> tuple[FloatArray, FloatArray | None]:
    """``(W, b)`` of a projection with ``y = x @ W + b``; W is (d_in, d_out) float64."""
    raw = _constant(index, linear.weight)
    if linear.kind == "matmul_integer":
        W = _dequantize_integer(index, linear, raw)
    elif linear.kind == "matmul_nbits":
        W = _dequantize_nbits(index, linear, raw)
    elif linear.kind in ("einsum", "conv"):
        W = dense_weight(linear, raw.astype(np.float64))
    else:
        W = raw.astype(np.float64)
        if linear.transpose:
            W = W.T
        if linear.alpha != 1.0:
            W = W * linear.alpha
    if W.shape != (linear.d_in, linear.d_out):
        raise ExtractionError(
            f"weight {linear.weight!r} must have shape ({linear.d_in}, {linear.d_out}); got {W.shape}"
        )
    if linear.bias is None:
        return W, None
    bias = _constant(index, linear.bias).astype(np.float64)
    if bias.size == 1:
        bias = np.full(linear.d_out, bias.ravel()[0])
    if bias.size != linear.d_out:
        raise ExtractionError(
            f"bias {linear.bias!r} must have {linear.d_out} entries; got shape {bias.shape}"
        )
    bias = bias.reshape(-1)
    return W, bias * linear.beta if linear.beta != 1.0 else bias


def _dequantize_integer(index: GraphIndex, linear: LinearMatch, raw: np.ndarray) -> FloatArray:
    """``(W_q − zero_point) · scale`` with a per-tensor or per-output-column scale, exact in float64.

    The graph never forms this product (MatMulInteger sums integers, then one Mul applies
    ``x_scale · w_scale``); an 8-bit integer times a float32 scale is exact in float64.
    """
    shifted = raw.astype(np.int64)
    if linear.weight_zero_point is not None:
        zero_point = _constant(index, linear.weight_zero_point).astype(np.int64)
        shifted = shifted - (
            zero_point.reshape(1, -1) if zero_point.size > 1 else zero_point.reshape(())
        )
    if linear.weight_scale is None:
        raise ExtractionError(f"integer weight {linear.weight!r} must have a scale; got none")
    scale = _constant(index, linear.weight_scale).astype(np.float64)
    scale = scale.reshape(1, -1) if scale.size > 1 else scale.reshape(())
    return shifted.astype(np.float64) * scale


def _dequantize_nbits(index: GraphIndex, linear: LinearMatch, raw: np.ndarray) -> FloatArray:
    """The (K, N) weight of a ``MatMulNBits`` projection, exact in float64 (:mod:`oversmooth.importers.nbits`)."""
    if linear.weight_scale is None:
        raise ExtractionError(f"n-bit weight {linear.weight!r} must have scales; got none")
    zero_points = (
        None if linear.weight_zero_point is None else _constant(index, linear.weight_zero_point)
    )
    try:
        return dequantize_nbits(
            raw,
            _constant(index, linear.weight_scale),
            zero_points,
            bits=linear.bits,
            block_size=linear.block_size,
            K=linear.d_in,
            N=linear.d_out,
        )
    except ValueError as err:
        raise ExtractionError(f"n-bit weight {linear.weight!r}: {err}") from None


def _constant(index: GraphIndex, name: str) -> np.ndarray:
    value = index.constant_value(name)
    if value is None:
        raise ExtractionError(f"tensor {name!r} must be a constant; got a computed tensor")
    return value


def _vector(index: GraphIndex, name: str | None, size: int, what: str) -> FloatArray | None:
    if name is None:
        return None
    value = _constant(index, name).astype(np.float64)
    if value.size == 1:
        value = np.full(size, value.ravel()[0])
    if value.size != size:
        raise ExtractionError(f"{what} {name!r} must have {size} entries; got shape {value.shape}")
    return _frozen(value.reshape(size))


def _select(bias: FloatArray | None, columns: np.ndarray) -> FloatArray | None:
    return None if bias is None else _frozen(bias[columns])


def _frozen(array: np.ndarray) -> FloatArray:
    array = np.asarray(array, dtype=np.float64, order="C")  # 0-d stays 0-d (not ascontiguousarray)
    array.flags.writeable = False
    return array
