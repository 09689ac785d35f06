"""Smoothing metrics reduced inside the graph: ONNX nodes that turn each layer into a few numbers.

The audit needs, per input and layer, only the :class:`~oversmooth.simulator.statistics.TokenStatistics` of
the hidden state X (B, T, D): eight scalars and, for the spectral metrics, one Gram matrix. The
nodes built here compute them where the model runs (on the GPU under the CUDA provider), in
float64, on the real tokens only, so what comes back per layer is ``(B, 8)`` plus ``(B, k, k)``
instead of ``(B, T, D)``; :func:`oversmooth.simulator.statistics.metrics_from_statistics` finishes on the host.

Per layer, with ``w`` (B, T) the token weights (1 for a counted token, 0 for padding and for
excluded prefix tokens) and ``Xm = w ⊙ X`` (rows zeroed)::

    n      = Σ_t w_t                       x̄ = Σ_t Xm_t / n
    C      = w ⊙ (X - 1 x̄ᵀ)               hfc_sq = ||C||_F²      lfc_sq = n ||x̄||²
    U      = Xm / ||Xm_t|| (0 for 0 rows)  unit_sum_sq = ||Σ_t U_t||²   unit_trace = ||U||_F²
    m      = #{t : ||Xm_t|| > 0}           dong_num_sq = max col |C| sum × max row |C| sum (same for X)
    G      = Xm Xmᵀ (k = T) or Xmᵀ Xm (k = D), whichever is smaller

and, for a layer that a pre-norm reads (the depth step, docs/theory.md §6.11), the token weights'
sum of the norm's per-token scale ``1/s_t``: ``s_t = sqrt(var_f(X_t) + eps)`` (LayerNorm, biased
variance over the features) or ``sqrt(mean_f(X_t²) + eps)`` (RMSNorm).

The weights come from an extra graph input ``oversmooth.token_mask`` (B, T) when the inputs carry
a padding mask, else they are all ones built from X's own shape; prefix tokens are zeroed in the
graph. Node spellings follow the default-domain opset of the graph that runs
(:meth:`~oversmooth.importers.graph.OnnxModel.session_model`, as old as opset 7): axes as inputs from opset 18
for every reduction, from 13 for ReduceSum and Unsqueeze; Slice bounds as inputs from 10; before 9
(no ConstantOfShape) the ones are a Tile, and before 12 (no Range, GreaterOrEqual) the prefix
tokens are zeroed by slicing them off and back.

Public API
----------
ReductionPlan
    The nodes, constants, extra input and outputs to append, and the decoder of their values.
plan_reductions
    Build the plan for chosen layer tensors of a model.
MASK_INPUT
    The name of the extra token-mask input.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Literal

import numpy as np
import onnx
from onnx import TensorProto, helper

from oversmooth.importers.errors import ImporterInputError
from oversmooth.importers.graph import GraphInput, OnnxModel
from oversmooth.importers.runtime.gram_spectra import gram_eigenvalues
from oversmooth.importers.runtime.node_builder import NodeBuilder
from oversmooth.simulator.backend import array_module, to_numpy
from oversmooth.simulator.statistics import SCALAR_FIELDS, TokenStatistics, centred_gram_top

__all__ = [
    "MASK_INPUT",
    "ROWS_INPUT",
    "GraphExtension",
    "ReductionPlan",
    "extend_plan",
    "plan_reductions",
]

Gram = Literal["tokens", "features", "none"]
#: A norm's per-token scale to reduce: its kind and epsilon (:attr:`ReductionPlan.token_scale`).
TokenScale = tuple[Literal["layernorm", "rmsnorm"], float]

#: The extra graph input carrying the (B, T) token weights, when the inputs have a padding mask.
MASK_INPUT = "oversmooth.token_mask"
#: The extra graph input selecting the (B,) items whose layer tensors come back whole
#: (:attr:`ReductionPlan.token_rows`): 1 for an item to return, 0 otherwise.
ROWS_INPUT = "oversmooth.token_rows"
_PREFIX = "oversmooth.reduce"
_DOUBLE = TensorProto.DOUBLE


@dataclass(frozen=True)
class GraphExtension:
    """Nodes, constants, inputs and typed outputs to append to a graph for one session.

    Attributes
    ----------
    nodes : tuple of onnx.NodeProto
    initializers : tuple of onnx.TensorProto
    inputs : tuple of onnx.ValueInfoProto
        Extra graph inputs the caller feeds.
    outputs : tuple of onnx.ValueInfoProto
        Typed outputs the session returns.
    replaces : tuple of str
        Earlier outputs this one makes unneeded (:func:`extend_plan`): no longer returned, and
        the nodes only they needed removed.
    """

    nodes: tuple[onnx.NodeProto, ...] = ()
    initializers: tuple[onnx.TensorProto, ...] = ()
    inputs: tuple[onnx.ValueInfoProto, ...] = ()
    outputs: tuple[onnx.ValueInfoProto, ...] = ()
    replaces: tuple[str, ...] = ()

    @property
    def output_names(self) -> list[str]:
        return [value.name for value in self.outputs]

    @property
    def graph_inputs(self) -> tuple[GraphInput, ...]:
        """The extra inputs as :class:`~oversmooth.importers.graph.GraphInput` (for feed checks)."""
        return tuple(
            GraphInput(
                value.name,
                np.dtype(helper.tensor_dtype_to_np_dtype(value.type.tensor_type.elem_type)),
                tuple(
                    dim.dim_value if dim.HasField("dim_value") else dim.dim_param or None
                    for dim in value.type.tensor_type.shape.dim
                ),
            )
            for value in self.inputs
        )


@dataclass(frozen=True)
class ReductionPlan:
    """What :func:`plan_reductions` appends, and how to read the values back.

    Attributes
    ----------
    layers : tuple of str
        The reduced tensors, in layer order.
    gram : {"tokens", "features", "none"}
        Which Gram matrix comes back (``X Xᵀ``, ``Xᵀ X`` or none).
    masked : bool
        Whether the caller feeds :data:`MASK_INPUT`.
    extension : GraphExtension
        What to append to the graph.
    prefix : int
        Leading tokens left out of every statistic.
    spectral_norm : bool
        Also the centred Gram's largest eigenvalue (``hfc_top``, for the spectral-norm HFC/LFC):
        each layer's sum of counted rows comes back too when the Gram is D×D.
    token_scale : tuple of (kind, eps) or None
        Per layer, the norm whose per-token scale is reduced (:meth:`inverse_scale`), or None.
    token_rows : bool
        Every layer also comes back whole, float64 and batch-first, for the items the caller
        marks in :data:`ROWS_INPUT` only (:meth:`tokens_name`, :meth:`rows_feed`): a ``(K, T,
        D)`` output for the K marked items, ``(0, T, D)`` for a batch with none, so a long audit
        copies the few items the operating point and the attribution read, not every item.
    late : GraphExtension
        The statistics of the layers :func:`extend_plan` added, to append to the graph onnxruntime
        has already optimised with :attr:`extension` (empty when none was added).
    replaced : frozenset of int
        Layers whose statistics the late ones replace (:func:`extend_plan`), not computed; their
        rows (:meth:`tokens_name`) still come back.
    """

    layers: tuple[str, ...]
    gram: Gram
    masked: bool
    extension: GraphExtension = field(repr=False)
    prefix: int = 0
    spectral_norm: bool = False
    token_scale: tuple[TokenScale | None, ...] = ()
    token_rows: bool = False
    late: GraphExtension = field(default=GraphExtension(), repr=False)
    replaced: frozenset[int] = frozenset()

    def computes(self, layer: int) -> bool:
        """Whether the session computes ``layer``'s statistics (not :attr:`replaced`)."""
        return layer not in self.replaced

    def tokens_name(self, layer: int) -> str:
        return f"{_PREFIX}.{layer}.tokens"

    def rows_feed(self, keep: np.ndarray) -> dict[str, np.ndarray]:
        """The extra feed marking the (B,) items whose layers come back whole (empty unless
        :attr:`token_rows`)."""
        return {ROWS_INPUT: np.asarray(keep, dtype=np.float64)} if self.token_rows else {}

    def scalars_name(self, layer: int) -> str:
        return f"{_PREFIX}.{layer}.scalars"

    def gram_name(self, layer: int) -> str:
        return f"{_PREFIX}.{layer}.gram"

    def mask_feed(self, token_mask: np.ndarray) -> dict[str, np.ndarray]:
        """The extra feed for a ``(B, T)`` boolean token mask (empty when not ``masked``)."""
        return {MASK_INPUT: np.asarray(token_mask, dtype=np.float64)} if self.masked else {}

    def totals_name(self, layer: int) -> str:
        return f"{_PREFIX}.{layer}.totals"

    def inverse_scale_name(self, layer: int) -> str:
        return f"{_PREFIX}.{layer}.inverse_scale"

    def inverse_scale(self, outputs: Mapping[str, np.ndarray], layer: int) -> np.ndarray | None:
        """(B,) token-weighted sum of ``1/s_t`` of ``layer`` (None when it has no norm to
        reduce); divided by the token count, the mean per-token scale of the norm reading it."""
        if layer >= len(self.token_scale) or self.token_scale[layer] is None:
            return None
        return np.asarray(to_numpy(outputs[self.inverse_scale_name(layer)]), dtype=np.float64)

    def grams_on_device(self, outputs: Mapping[str, np.ndarray]) -> bool:
        """Whether every computed layer's Gram matrices stayed on the GPU (CuPy arrays); a
        model that runs some nodes on the CPU can return some layers' on the host."""
        layers = [layer for layer in range(len(self.layers)) if self.computes(layer)]
        return (
            self.gram != "none"
            and bool(layers)
            and all(array_module(outputs[self.gram_name(layer)]) is not np for layer in layers)
        )

    def layer_spectra(
        self, outputs: Mapping[str, np.ndarray], layers: Sequence[int]
    ) -> dict[int, np.ndarray]:
        """``{layer: (B, k) ascending Gram eigenvalues}`` of ``layers``, one solve per order k.

        The layers' ``(B, k, k)`` Gram matrices, all in one place (:meth:`grams_on_device`), are
        stacked, those of one shape together (a model whose stages change the token count or
        the width has several), and handed to
        :func:`~oversmooth.importers.runtime.gram_spectra.gram_eigenvalues`: on a GPU each
        step of its tridiagonalisation is then one kernel over every layer of the batch rather
        than one per layer. Empty without a Gram matrix.
        """
        if self.gram == "none":
            return {}
        by_shape: dict[tuple[int, ...], list[int]] = {}
        for layer in layers:
            by_shape.setdefault(tuple(outputs[self.gram_name(layer)].shape), []).append(layer)
        spectra: dict[int, np.ndarray] = {}
        for shape, group in by_shape.items():
            grams = [outputs[self.gram_name(layer)] for layer in group]
            stacked = grams[0] if len(grams) == 1 else array_module(grams[0]).stack(grams)
            eig = gram_eigenvalues(stacked).reshape(len(group), *shape[:-1])
            spectra.update(zip(group, eig, strict=True))
        return spectra

    def statistics(
        self,
        outputs: Mapping[str, np.ndarray],
        layer: int,
        token_mask: np.ndarray | None = None,
        eig: np.ndarray | None = None,
    ) -> TokenStatistics:
        """The :class:`~oversmooth.simulator.statistics.TokenStatistics` of one layer for one batch.

        Gram eigenvalues ``eig`` (B, k) as :meth:`layer_spectra` gives them, else computed here
        (in float64, batched, where the Gram matrices are: on the GPU when the session kept them
        there, :func:`~oversmooth.importers.runtime.gram_spectra.gram_eigenvalues`); with
        ``spectral_norm``, the centred
        Gram's largest one too (:func:`~oversmooth.simulator.statistics.centred_gram_top`, on the host: from
        the T×T Gram and the token weights, ``token_mask`` (B, T) with the prefix left out, or
        from the D×D Gram and the rows' sum).
        """
        if self.gram != "none" and eig is None:
            eig = gram_eigenvalues(outputs[self.gram_name(layer)])
        stats = TokenStatistics.from_packed(outputs[self.scalars_name(layer)], eig)
        if not self.spectral_norm or self.gram == "none":
            return stats
        gram = np.asarray(to_numpy(outputs[self.gram_name(layer)]), np.float64)
        if self.gram == "tokens":
            weights = np.ones(gram.shape[:2]) if token_mask is None else token_mask.astype(float)
            weights[:, : self.prefix] = 0.0
            top = centred_gram_top(gram, "tokens", weights=weights)
        else:
            totals = outputs[self.totals_name(layer)]
            top = centred_gram_top(gram, "features", totals=totals, n_tokens=stats.n_tokens)
        return dataclasses.replace(stats, hfc_top=top)


def _token_weights(b: NodeBuilder, x: str, mask: str | None, prefix: int) -> str:
    """(B, T) double: the mask input, or ones shaped like X's first two axes; prefix zeroed."""
    weights = b.ones_like_lead(x, "ones") if mask is None else mask
    if prefix == 0:
        return weights
    if b.opset < 12:  # no Range or GreaterOrEqual: the prefix columns sliced off, zeroed, put back
        head = b.op(
            "Mul", [b.slice(weights, 0, prefix, 1, "prefix"), b.const(0.0, np.float64)], "zeros"
        )
        tail = b.slice(weights, prefix, np.iinfo(np.int64).max, 1, "after_prefix")
        return b.op("Concat", [head, tail], "weights", axis=1)
    tokens = b.op(
        "Gather", [b.op("Shape", [weights], "shape"), b.const(1, np.int64)], "tokens", axis=0
    )
    positions = b.op("Range", [b.const(0, np.int64), tokens, b.const(1, np.int64)], "positions")
    kept = b.op("GreaterOrEqual", [positions, b.const(prefix, np.int64)], "after_prefix")
    return b.op("Mul", [weights, b.op("Cast", [kept], "after_prefix", to=_DOUBLE)], "weights")


def _norm_1_inf_sq(b: NodeBuilder, absolute: str, hint: str) -> str:
    """(B,): max column sum × max row sum of a (B, T, D) non-negative tensor."""
    col = b.reduce("ReduceMax", b.reduce("ReduceSum", absolute, [1], "colsum"), [1], "colmax")
    row = b.reduce("ReduceMax", b.reduce("ReduceSum", absolute, [2], "rowsum"), [1], "rowmax")
    return b.op("Mul", [col, row], hint)


def _layer_nodes(
    b: NodeBuilder,
    x: str,
    layer: int,
    mask: str | None,
    prefix: int,
    gram: Gram,
    time_major: bool,
    totals: bool = False,
    token_scale: TokenScale | None = None,
    rows: str | None = None,
    gram_as: onnx.NodeProto | None = None,
) -> None:
    """Append the statistics nodes of one layer tensor ``x`` (B, T, D), or (T, B, D) when
    ``time_major`` (transposed to (B, T, D) first); with ``totals``, the (B, D) sum of the
    counted rows is an output too; with ``token_scale``, the weighted sum of the norm's
    ``1/s_t``; with ``rows`` (a (K,) index tensor), the float64 layer of those items; with
    ``gram_as``, the Gram matrix is that node's operator and attributes over ``(Xm, Xm)``."""
    if time_major:
        x = b.op("Transpose", [x], f"{layer}.batch_first", perm=[1, 0, 2])
    xd = b.op("Cast", [x], f"{layer}.x64", to=_DOUBLE)
    w = _token_weights(b, xd, mask, prefix)
    # Every token counted (no mask, no prefix): w is all ones, and a product by 1.0 is exact, so
    # the (B, T, D) products by it are skipped; the values are bit for bit the same.
    w3 = None if mask is None and prefix == 0 else b.unsqueeze(w, 2, f"{layer}.w3")

    def counted(tensor: str, hint: str) -> str:
        """``tensor`` (B, T, D) with the rows of uncounted tokens zeroed."""
        return tensor if w3 is None else b.op("Mul", [tensor, w3], hint)

    xm = counted(xd, f"{layer}.xm")
    n = b.reduce("ReduceSum", w, [1], f"{layer}.n")
    total = b.reduce("ReduceSum", xm, [1], f"{layer}.total")
    if totals:
        b.output("Identity", [total], f"{_PREFIX}.{layer}.totals")
    mean = b.op("Div", [total, b.unsqueeze(n, 1, f"{layer}.n2")], f"{layer}.mean")
    dev = b.op("Sub", [xd, b.unsqueeze(mean, 1, f"{layer}.mean3")], f"{layer}.dev")
    centered = counted(dev, f"{layer}.centered")
    hfc_sq = b.reduce("ReduceSumSquare", centered, [1, 2], f"{layer}.hfc_sq")
    lfc_sq = b.op("Mul", [n, b.reduce("ReduceSumSquare", mean, [1], "mean_sq")], f"{layer}.lfc_sq")
    norms = b.op("Sqrt", [b.reduce("ReduceSumSquare", xm, [2], "row_sq", keepdims=1)], "norms")
    nonzero = b.op(
        "Cast", [b.op("Greater", [norms, b.const(0.0, np.float64)], "gt0")], "nonzero", to=_DOUBLE
    )
    one_where_zero = b.op("Sub", [b.const(1.0, np.float64), nonzero], "zero_rows")
    unit = b.op("Div", [xm, b.op("Add", [norms, one_where_zero], "safe_norms")], f"{layer}.unit")
    unit_sum = b.reduce("ReduceSum", unit, [1], "unit_sum")
    statistics = {
        "n_tokens": n,
        "hfc_sq": hfc_sq,
        "lfc_sq": lfc_sq,
        "unit_sum_sq": b.reduce("ReduceSumSquare", unit_sum, [1], f"{layer}.unit_sum_sq"),
        "unit_trace": b.reduce("ReduceSumSquare", unit, [1, 2], f"{layer}.unit_trace"),
        "n_nonzero": b.reduce("ReduceSum", nonzero, [1, 2], f"{layer}.m"),
        "dong_num_sq": _norm_1_inf_sq(b, b.op("Abs", [centered], "abs_c"), f"{layer}.dong_num"),
        "dong_den_sq": _norm_1_inf_sq(b, b.op("Abs", [xm], "abs_x"), f"{layer}.dong_den"),
    }
    # (B, 8): the (B,) scalars one after another, then one row per field, then transposed. Three
    # nodes of data movement instead of an Unsqueeze per field and a Concat: the bits are the
    # same, and on a GPU every node costs its dispatch (about 23 µs on an H200, whatever it does).
    stacked = b.op(
        "Concat", [statistics[name] for name in SCALAR_FIELDS], f"{layer}.stacked", axis=0
    )
    by_field = b.op(
        "Reshape", [stacked, b.const([len(SCALAR_FIELDS), -1], np.int64)], f"{layer}.by_field"
    )
    b.output("Transpose", [by_field], f"{_PREFIX}.{layer}.scalars", perm=[1, 0])
    if token_scale is not None:
        _inverse_scale_nodes(b, xd, w, layer, token_scale)
    if rows is not None:
        b.output("Gather", [xd, rows], f"{_PREFIX}.{layer}.tokens", axis=0)
    if gram != "none" and gram_as is not None:
        attributes = {a.name: helper.get_attribute_value(a) for a in gram_as.attribute}
        b.output(
            gram_as.op_type,
            [xm, xm],
            f"{_PREFIX}.{layer}.gram",
            domain=gram_as.domain,
            **attributes,
        )
    elif gram != "none":
        xt = b.op("Transpose", [xm], f"{layer}.xt", perm=[0, 2, 1])
        pair = [xm, xt] if gram == "tokens" else [xt, xm]
        b.output("MatMul", pair, f"{_PREFIX}.{layer}.gram")


def _inverse_scale_nodes(b: NodeBuilder, xd: str, w: str, layer: int, scale: TokenScale) -> None:
    """``Σ_t w_t / s_t`` (B,) of the (B, T, D) double ``xd``: s_t the norm's per-token scale."""
    kind, eps = scale
    centred = xd
    if kind == "layernorm":
        mean = b.reduce("ReduceMean", xd, [2], f"{layer}.feature_mean", keepdims=1)
        centred = b.op("Sub", [xd, mean], f"{layer}.feature_dev")
    square = b.op("Mul", [centred, centred], f"{layer}.feature_sq")
    variance = b.reduce("ReduceMean", square, [2], f"{layer}.feature_var")
    scale_t = b.op(
        "Sqrt", [b.op("Add", [variance, b.const(eps, np.float64)], "var_eps")], "token_scale"
    )
    inverse = b.op("Reciprocal", [scale_t], f"{layer}.inverse_scale_t")
    weighted = b.op("Mul", [inverse, w], f"{layer}.weighted_inverse")
    total = b.reduce("ReduceSum", weighted, [1], f"{layer}.inverse_scale_sum")
    b.output("Identity", [total], f"{_PREFIX}.{layer}.inverse_scale")


def _typed(name: str, dims: Sequence[str | int]) -> onnx.ValueInfoProto:
    return helper.make_tensor_value_info(name, _DOUBLE, list(dims))


def _taken_names(model: OnnxModel) -> set[str]:
    graph = model.session_model().graph
    names = {value.name for value in (*graph.input, *graph.output, *graph.initializer)}
    names.update(output for node in graph.node for output in node.output)
    return names


def plan_reductions(
    model: OnnxModel,
    layers: Sequence[str],
    *,
    prefix: int = 0,
    masked: bool = False,
    gram: Gram = "tokens",
    time_major: Sequence[bool] = (),
    spectral_norm: bool = False,
    token_scale: Sequence[TokenScale | None] = (),
    token_rows: bool = False,
) -> ReductionPlan:
    """Plan the in-graph statistics of ``layers`` (each a (B, T, D) tensor of ``model``).

    Parameters
    ----------
    model : OnnxModel
        Not changed: the plan's :class:`GraphExtension` is appended for one session by
        :class:`~oversmooth.importers.runtime.runner.Runner`.
    layers : sequence of str
        Node outputs or graph inputs, one per layer.
    prefix : int
        Leading tokens left out of every statistic (CLS, registers).
    masked : bool
        Weight tokens by the fed :data:`MASK_INPUT` (B, T) (padding masks), else count all.
    gram : {"tokens", "features", "none"}
        The Gram matrix to return (``X Xᵀ``, T×T, or ``Xᵀ X``, D×D), or none (no spectral metric).
    time_major : sequence of bool
        Per layer, whether it is (T, B, D) instead (:attr:`AttentionBlock.time_major`); empty:
        every layer is batch-first.
    spectral_norm : bool
        Also return what the spectral-norm HFC/LFC needs (:attr:`ReductionPlan.spectral_norm`).
    token_scale : sequence of (kind, eps) or None
        Per layer (a prefix of ``layers``; missing entries are None), the norm reading it whose
        per-token scale to reduce (:meth:`ReductionPlan.inverse_scale`): ``"layernorm"`` or
        ``"rmsnorm"`` with its epsilon.
    token_rows : bool
        Also return every layer whole for the items marked in :data:`ROWS_INPUT`
        (:attr:`ReductionPlan.token_rows`; from opset 9, which has ``NonZero``: an older graph
        gets a plan whose ``token_rows`` is False).

    Returns
    -------
    ReductionPlan
    """
    if gram not in ("tokens", "features", "none"):
        raise ImporterInputError(f"`gram` must be tokens, features or none; got {gram!r}")
    if isinstance(prefix, bool) or not isinstance(prefix, int) or prefix < 0:
        raise ImporterInputError(f"`prefix` must be a non-negative integer; got {prefix!r}")
    builder = NodeBuilder(model.session_opset, _taken_names(model), _PREFIX)
    mask = MASK_INPUT if masked else None
    if mask is not None and mask in builder.taken:
        raise ImporterInputError(f"the model already has a tensor named {mask!r}")
    outputs: list[onnx.ValueInfoProto] = []
    if time_major and len(time_major) != len(layers):
        raise ImporterInputError(
            f"`time_major` needs one flag per layer ({len(layers)}); got {len(time_major)}"
        )
    if len(token_scale) > len(layers):
        raise ImporterInputError(
            f"`token_scale` has {len(token_scale)} entries for {len(layers)} layers"
        )
    scales = (*token_scale, *([None] * (len(layers) - len(token_scale))))
    rows = _marked_rows(builder) if token_rows else None
    totals = spectral_norm and gram == "features"
    for layer, name in enumerate(layers):
        tm = bool(time_major and time_major[layer])
        _layer_nodes(builder, name, layer, mask, prefix, gram, tm, totals, scales[layer], rows)
        outputs += _layer_outputs(layer, rows is not None, scales[layer] is not None, gram, totals)
    extension = GraphExtension(
        nodes=tuple(builder.nodes),
        initializers=tuple(builder.initializers.values()),
        inputs=(_typed(MASK_INPUT, ["batch", "tokens"]),) * masked
        + (_typed(ROWS_INPUT, ["batch"]),) * (rows is not None),
        outputs=tuple(outputs),
    )
    return ReductionPlan(
        tuple(layers), gram, masked, extension, prefix, spectral_norm, scales, rows is not None
    )


def _layer_outputs(
    layer: int, rows: bool, inverse_scale: bool, gram: Gram, totals: bool
) -> list[onnx.ValueInfoProto]:
    """The typed outputs :func:`_layer_nodes` gives layer ``layer``, in the session's order."""
    outputs = [_typed(f"{_PREFIX}.{layer}.scalars", ["batch", len(SCALAR_FIELDS)])]
    if rows:
        outputs.append(_typed(f"{_PREFIX}.{layer}.tokens", ["rows", "tokens", "d"]))
    if inverse_scale:
        outputs.append(_typed(f"{_PREFIX}.{layer}.inverse_scale", ["batch"]))
    if gram != "none":
        outputs.append(_typed(f"{_PREFIX}.{layer}.gram", ["batch", "k", "k"]))
    if totals:
        outputs.append(_typed(f"{_PREFIX}.{layer}.totals", ["batch", "d"]))
    return outputs


def extend_plan(
    plan: ReductionPlan,
    model: OnnxModel,
    layers: Sequence[str],
    *,
    time_major: Sequence[bool] = (),
    replacing: Sequence[int] = (),
    gram_as: onnx.NodeProto | None = None,
) -> ReductionPlan:
    """``plan`` with the statistics of further ``layers`` in :attr:`ReductionPlan.late`.

    The late nodes are appended to the graph onnxruntime has already optimised with
    ``plan.extension`` (:class:`~oversmooth.importers.runtime.runner.LateOutputs`), so reading
    a tensor there changes none of the fusions the other numbers came from: a post-LN block's sum
    before its norm, which onnxruntime fuses into ``SkipLayerNormalization`` with the norm, is
    read from that node's own optional sum output. Same options as ``plan``, except that the late
    layers reduce no per-token scale and never come back whole (nothing reads them so); they are
    numbered after ``plan.layers``, and their nodes and constants live under a namespace of their
    own, never meeting the first extension's, which the optimiser may have renamed or removed.
    ``replacing``: layers of ``plan`` whose statistics the new ones make unneeded (a post-LN
    norm's output, once the sum before it is read): their outputs but the rows are the late
    extension's :attr:`~GraphExtension.replaces`, the layers :attr:`ReductionPlan.replaced`.
    ``gram_as``: the node the optimised graph computes a first-extension Gram matrix with, where
    it reads one tensor twice (:func:`~oversmooth.importers.runtime.graph_edits.
    optimised_product_of_itself`): the late Gram matrices are written the same way, since the
    late nodes are not optimised; else as a ``MatMul`` of ``Xm`` and its ``Transpose``.
    """
    if time_major and len(time_major) != len(layers):
        raise ImporterInputError(
            f"`time_major` needs one flag per layer ({len(layers)}); got {len(time_major)}"
        )
    first = plan.extension
    taken = _taken_names(model) | {value.name for value in first.initializers}
    taken |= {output for node in first.nodes for output in node.output}
    builder = NodeBuilder(model.session_opset, taken, namespace=f"{_PREFIX}.late")
    mask = MASK_INPUT if plan.masked else None
    totals = plan.spectral_norm and plan.gram == "features"
    outputs: list[onnx.ValueInfoProto] = []
    for k, name in enumerate(layers):
        layer = len(plan.layers) + k
        tm = bool(time_major and time_major[k])
        _layer_nodes(
            builder, name, layer, mask, plan.prefix, plan.gram, tm, totals, gram_as=gram_as
        )
        outputs += _layer_outputs(layer, False, False, plan.gram, totals)
    scales = (*plan.token_scale, *([None] * (len(plan.layers) - len(plan.token_scale))))
    replaces = tuple(  # every output but the rows
        value.name
        for layer in replacing
        for value in _layer_outputs(layer, False, scales[layer] is not None, plan.gram, totals)
    )
    late = GraphExtension(
        nodes=tuple(builder.nodes),
        initializers=tuple(builder.initializers.values()),
        outputs=tuple(outputs),
        replaces=replaces,
    )
    return dataclasses.replace(
        plan,
        layers=(*plan.layers, *layers),
        token_scale=(*scales, *([None] * len(layers))),
        late=late,
        replaced=plan.replaced | frozenset(replacing),
    )


def _marked_rows(b: NodeBuilder) -> str | None:
    """(K,) int64: the indices of the items marked in :data:`ROWS_INPUT`; None before opset 9
    (no ``NonZero``: the layers do not come back whole, and the plan says so)."""
    if b.opset < 9:
        return None
    if ROWS_INPUT in b.taken:
        raise ImporterInputError(f"the model already has a tensor named {ROWS_INPUT!r}")
    # fixed names, not b.fresh's numbered ones: the statistics' nodes keep their names
    marked = b.output("Greater", [ROWS_INPUT, b.const(0.0, np.float64)], f"{_PREFIX}.rows.marked")
    found = b.output("NonZero", [marked], f"{_PREFIX}.rows.nonzero")  # (1, K)
    return b.output("Reshape", [found, b.const([-1], np.int64)], f"{_PREFIX}.rows.index")
