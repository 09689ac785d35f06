"""Model transformations for the paper's other Table 1 columns: random init and ± reparameterisation.

``random_init`` keeps the architecture and re-initialises every trained parameter as a freshly built
model would: each float initializer with at least two axes (projections, MLP, token and position
embeddings, convolution kernels) is drawn from N(0, std²), and each float vector is reset to the
identity of the operation that applies it (:func:`vector_init`): 1 for a scale (a norm's γ, LayerScale,
any vector a ``Mul`` applies), 0 for a shift (a norm's β, a bias, any vector an ``Add`` applies).
What it keeps: scalars (norm epsilons, score scales), integer tensors (shapes, indices), and any
vector whose consumer is neither of those (counted in the file's metadata).

``reparameterize`` replaces each head's value and output projections so that the head's effective
product (docs/theory.md §6.8) is ``M_h = C diag(γ) W_V^h W_O^h diag(s) = Q Λ Q^T`` (docs/theory.md §5):
Q (d × d_head) orthonormal and Λ > 0 (``plus``, Perron-type dominance for every attention matrix, S6)
or Λ in [-1, 0) (``minus``, never Perron-type, S5). Among such matrices it takes the nearest
(Frobenius) to the trained product: the skew part of ``M_h`` is orthogonal to every symmetric matrix,
so the target is ``sym(M_h)``; its d_head eigenvalues of the right sign are kept and clipped into the
allowed range. Where the block's input is centred (a pre-LayerNorm), Q is taken inside 𝟙^⊥, the only
directions the centring C passes. Then γ and the LayerScale s are absorbed where they act:
``W_V^h = diag(γ)⁻¹ Q`` and ``W_O^h = Λ Q^T diag(s)⁻¹``, so ``C diag(γ) W_V^h = C Q = Q`` and the
network is otherwise unchanged (the norm, Q, K and the MLP keep their weights). ``h="stored"``
reparameterises ``W_V^h W_O^h`` itself instead (``W_V^h = Q``, ``W_O^h = Λ Q^T``; the paper's protocol,
under which the effective product of a pre-LN block is not of one sign).

Weights must be stored as float initializers (optionally through a Cast, as with float16). Quantised
weights (int8 with Cast→Mul, DequantizeLinear, MatMulInteger) are refused: writing them back would
need requantisation, and a silently broken model is worse than an error.
"""

from __future__ import annotations

import os
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Literal

import numpy as np
import onnx
from onnx import numpy_helper

from oversmooth.importers.errors import ImporterInputError, TransformError
from oversmooth.importers.graph import load_model
from oversmooth.importers.match import LinearMatch, find_attention_blocks
from oversmooth.importers.weights import BlockWeights, block_weights
from oversmooth.importers.zoo import lookup
from oversmooth.simulator.output import atomic_output
from oversmooth.simulator.validation import (
    as_generator,
    as_square,
    check_choice,
    check_positive_int,
)

__all__ = [
    "NEGATIVE_CLIP",
    "POSITIVE_FLOOR",
    "centred_basis",
    "nearest_signed_factors",
    "random_init",
    "reparameterize",
    "vector_init",
]

#: Λ of a ``plus`` head is at least this fraction of its largest eigenvalue (strictly positive).
POSITIVE_FLOOR = 1e-3
#: Λ of a ``minus`` head lies in [-1, -NEGATIVE_CLIP] (strictly negative, S5's [-1, 0)).
NEGATIVE_CLIP = 1e-3
_FLOAT_TYPES = {onnx.TensorProto.FLOAT, onnx.TensorProto.FLOAT16, onnx.TensorProto.DOUBLE}
_INTEGER_TYPES = {
    onnx.TensorProto.INT8,
    onnx.TensorProto.UINT8,
    onnx.TensorProto.INT4,
    onnx.TensorProto.UINT4,
}


@dataclass(frozen=True)
class _Stored:
    """Where a projection's weight lives: an initializer, read as (d_in, d_out) after ``transpose``."""

    tensor: onnx.TensorProto
    transpose: bool


def _type_name(tensor: onnx.TensorProto) -> str:
    return onnx.TensorProto.DataType.Name(tensor.data_type)


def _initializers(model: onnx.ModelProto) -> dict[str, onnx.TensorProto]:
    return {t.name: t for t in model.graph.initializer}


def _producers(model: onnx.ModelProto) -> dict[str, onnx.NodeProto]:
    return {out: node for node in model.graph.node for out in node.output}


def _stored(model: onnx.ModelProto, linear: LinearMatch, role: str) -> _Stored:
    if linear.kind == "matmul_integer":
        raise TransformError(
            f"{role} weight {linear.weight!r} is dynamically quantised (MatMulInteger); "
            "transform needs float weights"
        )
    initializers, producers = _initializers(model), _producers(model)
    name = linear.weight
    node = producers.get(name)
    if node is not None and node.op_type == "Cast" and node.input[0] in initializers:
        name = node.input[0]
    elif node is not None:
        raise TransformError(
            f"{role} weight {linear.weight!r} is computed by a {node.op_type} node "
            "(quantised or folded); transform needs weights stored as float initializers"
        )
    if name not in initializers:
        raise TransformError(
            f"{role} weight {linear.weight!r} is not an initializer; cannot rewrite it"
        )
    tensor = initializers[name]
    if tensor.data_type not in _FLOAT_TYPES:
        raise TransformError(
            f"{role} weight {name!r} has ONNX type {_type_name(tensor)} (quantised); "
            "transform needs float weights"
        )
    if linear.alpha != 1.0:
        raise TransformError(
            f"{role} weight {name!r} is scaled by Gemm alpha={linear.alpha}; unsupported"
        )
    return _Stored(tensor, linear.transpose)


def _read(stored: _Stored) -> np.ndarray:
    array = numpy_helper.to_array(stored.tensor).astype(np.float64)
    return array.T if stored.transpose else array


def _write(stored: _Stored, matrix: np.ndarray, what: str) -> None:
    """Store ``matrix`` in the initializer, in its dtype; refused where an entry does not fit."""
    dtype = numpy_helper.to_array(stored.tensor).dtype
    with np.errstate(over="ignore", invalid="ignore"):  # checked just below, in one line
        array = (matrix.T if stored.transpose else matrix).astype(dtype)
    if not np.all(np.isfinite(array)):
        raise TransformError(
            f"{what} ({stored.tensor.name!r}) would not be finite in {dtype}: the scale it absorbs "
            "is too small to divide by; reparameterise the stored product (`h='stored'`) instead"
        )
    stored.tensor.CopyFrom(numpy_helper.from_array(np.ascontiguousarray(array), stored.tensor.name))


def nearest_signed_factors(
    M: np.ndarray,
    d_head: int,
    sign: Literal["plus", "minus"],
    basis: np.ndarray | None = None,
) -> tuple[np.ndarray, np.ndarray]:
    """Factors ``(Q, Λ)`` of the nearest ``Q Λ Q^T`` to ``M`` with Λ of one sign (see module docstring).

    Parameters
    ----------
    M : (d, d) ndarray
        The trained ``W_V^h W_O^h``.
    d_head : int
        Rank of the head (columns of Q).
    sign : {"plus", "minus"}
    basis : (d, k) ndarray, optional
        Orthonormal columns spanning the subspace Q must lie in (k ≥ d_head); default the whole
        space. The nearest matrix is then taken among ``Q Λ Qᵀ`` with Q inside it.

    Returns
    -------
    Q : (d, d_head) ndarray
        Orthonormal columns (inside ``basis``).
    lam : (d_head,) ndarray
        In ``[POSITIVE_FLOOR * max(λ_max, 1), max(λ_max, floor)]`` for plus (λ_max the largest
        eigenvalue of sym(M)), in ``[-1, -NEGATIVE_CLIP]`` for minus.

    Raises
    ------
    ImporterInputError
        M is not one square matrix, ``d_head`` is not in ``1..d``, or ``sign`` is unknown.
    """
    M = as_square(M, "M", error=ImporterInputError)
    if M.ndim != 2:
        raise ImporterInputError(f"`M` must be one (d, d) matrix; got shape {M.shape}")
    d_head = check_positive_int(d_head, "d_head", error=ImporterInputError)
    B = np.eye(M.shape[0]) if basis is None else basis
    if d_head > B.shape[1]:
        raise ImporterInputError(f"`d_head` must be at most {B.shape[1]}; got {d_head}")
    check_choice(sign, "sign", ("plus", "minus"), error=ImporterInputError)
    w, U = np.linalg.eigh(B.T @ ((M + M.T) / 2) @ B)
    U = B @ U
    if sign == "plus":
        order = np.argsort(w)[::-1][:d_head]
        top = max(float(w[order[0]]), 1.0)
        lam = np.clip(w[order], POSITIVE_FLOOR * top, None)
    else:
        order = np.argsort(w)[:d_head]
        lam = np.clip(w[order], -1.0, -NEGATIVE_CLIP)
    return U[:, order], lam


def centred_basis(d: int) -> np.ndarray:
    """Orthonormal columns (d, d − 1) spanning 𝟙^⊥, the range of the centring ``I − 𝟙𝟙ᵀ/d``."""
    ones = np.ones((d, 1)) / np.sqrt(d)
    full, _ = np.linalg.qr(np.hstack([ones, np.eye(d)[:, : d - 1]]))
    return full[:, 1:d]


def _absorbed_scales(block: BlockWeights) -> tuple[np.ndarray, np.ndarray]:
    """The effective H's per-feature scales (γ before W_V, s after W_O), refused where one is 0."""
    factors = block.h_factors()
    scale_in, scale_out = factors["h_scale_in"], factors["h_scale_out"]
    for name, scale in (("norm γ", scale_in), ("LayerScale", scale_out)):
        if not np.all(np.abs(scale) > 0):
            raise TransformError(
                f"block {block.index}: its {name} has a zero entry, which no value projection "
                "can compensate; reparameterise the stored product (`h='stored'`) instead"
            )
    return scale_in, scale_out


def _reparameterize_block(
    model: onnx.ModelProto,
    block: BlockWeights,
    sign: Literal["plus", "minus"],
    h: Literal["effective", "stored"],
) -> None:
    """Set every head's effective (or stored) product to its nearest ``Q Λ Qᵀ`` of one sign."""
    if block.n_kv_heads != block.n_heads:
        raise TransformError(
            f"block {block.index} shares values across heads (GQA: {block.n_kv_heads} kv heads "
            f"for {block.n_heads} heads); per-head reparameterisation is undefined"
        )
    v, o = _stored(model, block.v, "value"), _stored(model, block.o, "output")
    W_v, W_o = _read(v), _read(o)
    for name, weight in (("W_V", W_v), ("W_O", W_o)):  # block_weights checked them; as stored here
        if not np.all(np.isfinite(weight)):
            raise TransformError(f"block {block.index}'s stored {name} must be finite")
    d = block.d_head
    effective = h == "effective"
    ones = np.ones(block.d_model)
    scale_in, scale_out = _absorbed_scales(block) if effective else (ones, ones)
    basis = centred_basis(block.d_model) if effective and block.centred else None
    for head in range(block.n_heads):
        cols = block.v_columns[head * d : (head + 1) * d]
        rows = block.o_rows[head * d : (head + 1) * d]
        left, right = (
            block.effective_value_head(head) if effective else (W_v[:, cols], W_o[rows, :])
        )
        Q, lam = nearest_signed_factors(_head_product(left, right, block, head), d, sign, basis)
        with np.errstate(over="ignore"):  # an overflow is refused by _write, in one line
            W_v[:, cols] = Q / scale_in[:, None]
            W_o[rows, :] = (lam[:, None] * Q.T) / scale_out[None, :]
    _write(v, W_v, f"block {block.index}'s reparameterised W_V")
    _write(o, W_o, f"block {block.index}'s reparameterised W_O")


def _head_product(
    left: np.ndarray, right: np.ndarray, block: BlockWeights, head: int
) -> np.ndarray:
    """``left @ right`` (head ``head``'s product), refused in one line where it overflows float64
    (no RuntimeWarning, and nothing non-finite reaches the eigensolver)."""
    with np.errstate(over="ignore", invalid="ignore"):
        product = left @ right
    if not np.all(np.isfinite(product)):
        raise TransformError(
            f"block {block.index} head {head}: W_V^h W_O^h overflows float64; its weights are "
            "too large to reparameterise"
        )
    return product


def _matched_with_weights(
    model: str | os.PathLike[str],
) -> tuple[Path, list[BlockWeights], onnx.ModelProto]:
    """Parse the model once: its attention blocks with their weights (refusing models without
    any, with the importer's message), then the proto onnxruntime runs (a model older than opset
    13 as it was read, not its conversion) with every external tensor read in (from inside its
    folder only: the loader has checked every location)."""
    from onnx.external_data_helper import load_external_data_for_model

    path = lookup(model).path
    loaded = load_model(path)
    blocks = [block_weights(loaded, block) for block in find_attention_blocks(loaded).blocks]
    proto = loaded.session_model()
    if loaded.path is not None:
        load_external_data_for_model(proto, os.fspath(loaded.path.parent))
    return path, blocks, proto


#: The metadata key that marks a model file as written by this module (so it may be replaced).
TRANSFORM_KEY = "oversmooth.transform"


def is_transformed_model(path: Path) -> bool:
    """Whether ``path`` is an ONNX file written by :func:`reparameterize` or :func:`random_init`."""
    proto = onnx.ModelProto()
    try:
        proto.ParseFromString(path.read_bytes())
    except Exception:  # protobuf decode errors have no common base
        return False
    return any(entry.key == TRANSFORM_KEY for entry in proto.metadata_props)


def _save(
    model: onnx.ModelProto, out: str | os.PathLike[str], source: Path, what: str, force: bool
) -> Path:
    """Write ``model`` atomically to ``out``, marked as ours; never over its own source file, and
    over another existing file only when it is an earlier transform or ``force``."""
    target = Path(out)
    try:
        onto_source = target.exists() and target.resolve() == source.resolve()
    except (OSError, ValueError):  # a name the file system refuses: atomic_output says so below
        onto_source = False
    if onto_source:
        raise ImporterInputError(
            f"`out` must differ from the model it transforms; got {str(out)!r} for both"
        )
    del model.metadata_props[:]  # the source's own marks would claim a file we did not write
    entry = model.metadata_props.add()
    entry.key, entry.value = TRANSFORM_KEY, what
    if model.ByteSize() > 2**31 - 2**26:
        raise TransformError(
            "the transformed model exceeds 2 GB; saving with external data is not supported yet"
        )
    ours = None if force else is_transformed_model
    with atomic_output(target, "wb", label="out", ours=ours) as handle:
        handle.write(model.SerializeToString())
    return target


def reparameterize(
    model: str | os.PathLike[str],
    sign: Literal["plus", "minus"],
    out: str | os.PathLike[str],
    *,
    force: bool = False,
    h: Literal["effective", "stored"] = "effective",
) -> Path:
    """Write a copy of ``model`` whose every head's product is ``Q Λ Q^T`` of the given sign.

    Parameters
    ----------
    model : path-like or zoo name
    sign : {"plus", "minus"}
    out : path-like
        The new ``.onnx`` file (written atomically).
    h : {"effective", "stored"}
        Which product gets the spectrum: the effective ``M_h`` (default; γ and LayerScale absorbed
        into W_V and W_O, see the module docstring) or ``W_V^h W_O^h`` as stored.

    Returns
    -------
    Path
    """
    check_choice(sign, "sign", ("plus", "minus"), error=ImporterInputError)
    check_choice(h, "h", ("effective", "stored"), error=ImporterInputError)
    source, blocks, proto = _matched_with_weights(model)
    for block in blocks:
        _reparameterize_block(proto, block, sign, h)
    return _save(proto, out, source, f"reparam {sign} h={h}", force)


def _weight_matrices(model: onnx.ModelProto) -> Iterator[onnx.TensorProto]:
    for tensor in model.graph.initializer:
        if len(tensor.dims) >= 2 and int(np.prod(tensor.dims)) > 1:
            if tensor.data_type in _INTEGER_TYPES:
                raise TransformError(
                    f"initializer {tensor.name!r} is a quantised ({_type_name(tensor)}) weight; "
                    "random init would need requantisation"
                )
            if tensor.data_type in _FLOAT_TYPES:
                yield tensor


#: Operations that scale by a vector (its identity is 1) and that shift by one (identity 0), with
#: the input position of the vector where it is fixed (None: either operand).
_SCALES = {"Mul": None, "LayerNormalization": 1, "SimplifiedLayerNormalization": 1}
_SHIFTS = {"Add": None, "LayerNormalization": 2, "Gemm": 2, "Sub": None}
#: Operations a vector may pass through unchanged in value on its way to its consumer.
_PASS_THROUGH = {"Cast", "Reshape", "Unsqueeze", "Identity", "Flatten"}


def vector_init(model: onnx.ModelProto, name: str) -> float | None:
    """The fresh value of vector initializer ``name``: 1.0 (a scale), 0.0 (a shift), or None.

    The vector's consumers are followed through value-preserving steps (:data:`_PASS_THROUGH`);
    every consumer must agree, else (or for any other consumer) the vector is kept (None).
    """
    consumers: dict[str, list[tuple[onnx.NodeProto, int]]] = {}
    for node in model.graph.node:
        for position, source in enumerate(node.input):
            consumers.setdefault(source, []).append((node, position))
    found: set[float] = set()
    frontier = [name]
    while frontier:
        for node, position in consumers.get(frontier.pop(), []):
            if node.op_type in _PASS_THROUGH and position == 0:
                frontier.extend(node.output)
            elif node.op_type in _SCALES and _SCALES[node.op_type] in (None, position):
                found.add(1.0)
            elif node.op_type in _SHIFTS and _SHIFTS[node.op_type] in (None, position):
                found.add(0.0)
            else:
                return None
    return found.pop() if len(found) == 1 else None


def _vectors(model: onnx.ModelProto) -> Iterator[onnx.TensorProto]:
    for tensor in model.graph.initializer:
        if len(tensor.dims) == 1 and tensor.dims[0] > 1 and tensor.data_type in _FLOAT_TYPES:
            yield tensor


def random_init(
    model: str | os.PathLike[str],
    out: str | os.PathLike[str],
    *,
    std: float = 0.02,
    seed: int = 0,
    force: bool = False,
) -> Path:
    """Write a copy of ``model`` with every trained parameter re-initialised (module docstring).

    Parameters
    ----------
    model : path-like or zoo name
    out : path-like
    std : float
        Standard deviation (0.02 is the usual Transformer initialisation).
    seed : int

    Returns
    -------
    Path
    """
    if not np.isfinite(std) or std <= 0:
        raise TransformError(f"`std` must be a positive number; got {std!r}")
    rng = as_generator(seed, error=ImporterInputError)
    source, _, proto = _matched_with_weights(model)
    kept = 0
    for tensor in list(_vectors(proto)):
        value = vector_init(proto, tensor.name)
        if value is None:
            kept += 1
            continue
        fresh = np.full(tuple(tensor.dims), value, numpy_helper.to_array(tensor).dtype)
        tensor.CopyFrom(numpy_helper.from_array(fresh, tensor.name))
    for tensor in list(_weight_matrices(proto)):
        dtype = numpy_helper.to_array(tensor).dtype
        with np.errstate(over="ignore"):  # checked just below
            fresh = rng.normal(0.0, std, tuple(tensor.dims)).astype(dtype)
        if not np.all(np.isfinite(fresh)):
            raise TransformError(
                f"`std` must keep the weights finite in {dtype}; {std!r} overflows "
                f"initializer {tensor.name!r}"
            )
        tensor.CopyFrom(numpy_helper.from_array(fresh, tensor.name))
    what = f"random-init std={std!r} seed={seed} vectors-kept={kept}"
    return _save(proto, out, source, what, force)
