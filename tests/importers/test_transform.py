"""The model transforms: nearest ± reparameterisation of every head, random init, refusals (the
``oversmooth transform`` command: tests/oversmooth/commands/test_transform.py).

``nearest_signed_factors`` must return orthonormal Q and Λ of the requested sign and range, and
``Q Λ Qᵀ`` must be the nearest such matrix to the trained product (checked against random feasible
competitors and small feasible perturbations of the answer). A ``plus`` model must make every
dominating eigenvalue of ``I + H_h ⊗ A`` Perron-type and a ``minus`` model none (S5, S6), on the
builder models and on the real ViT. Quantised models are refused without writing anything;
``random_init`` changes float matrices only, reproducibly by seed.
"""

from __future__ import annotations

import functools
from pathlib import Path

import numpy as np
import onnx
import pytest
from hypothesis import given
from hypothesis import strategies as st
from numpy.testing import assert_allclose
from onnx import numpy_helper

from oversmooth.importers.audit.pipeline import audit
from oversmooth.importers.graph import load_model, model_from_proto
from oversmooth.importers.inputs.sources import bundled_inputs
from oversmooth.importers.transform import (
    NEGATIVE_CLIP,
    POSITIVE_FLOOR,
    TransformError,
    centred_basis,
    nearest_signed_factors,
    random_init,
    reparameterize,
    vector_init,
)
from oversmooth.importers.value_spectra import head_eigenvalues
from oversmooth.importers.weights import BlockWeights, extract
from oversmooth.simulator import tolerances as tol
from oversmooth.simulator.errors import InputError
from tests.importers.audited import builder_inputs
from tests.importers.builders import assemble
from tests.realmodels import require_real_model

SEED = 5
#: Builder variants with float weights and one value head per query head, stored differently:
#: separate MatMuls, a fused QKV, Gemm with transB, float16 behind a Cast, a pre-LN ViT.
REPARAM_VARIANTS = (
    "bert_legacy",
    "gpt2_fused_qkv",
    "gemm_transb",
    "fp16_weights",
    "vit_prenorm_layerscale",
)
FLOAT32_VARIANTS = ("bert_legacy", "gpt2_fused_qkv", "gemm_transb", "vit_prenorm_layerscale")
QUANTISED_VARIANTS = ("dynamic_quant", "int8_weight_only")


@functools.cache
def _model(name: str) -> onnx.ModelProto:
    return assemble(name, SEED).built.model


@pytest.fixture(scope="module")
def model_dir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return tmp_path_factory.mktemp("transform-models")


def saved(folder: Path, name: str) -> Path:
    path = folder / f"{name}.onnx"
    if not path.exists():
        onnx.save(_model(name), path)
    return path


@functools.cache
def _reparameterized(folder: Path, name: str, sign: str, h: str = "effective") -> Path:
    return reparameterize(saved(folder, name), sign, folder / f"{name}-{sign}-{h}.onnx", h=h)


def weights_of(path: Path) -> list[BlockWeights]:
    return extract(model_from_proto(onnx.load(path)))


def value_product(block: BlockWeights, head: int, h: str = "stored") -> np.ndarray:
    W_V, W_O = block.effective_value_head(head) if h == "effective" else block.value_head(head)
    return W_V @ W_O


# -- nearest_signed_factors ----------------------------------------------------------------------


@st.composite
def trained_products(draw: st.DrawFn) -> tuple[np.ndarray, int, str, np.random.Generator]:
    """A random d×d product, a head width, a sign, and a generator for competitors."""
    rng = np.random.default_rng(draw(st.integers(0, 2**32 - 1)))
    d = draw(st.integers(2, 10))
    d_head = draw(st.integers(1, d))
    scale = draw(st.sampled_from([0.05, 1.0, 4.0]))
    M = scale * rng.standard_normal((d, d))
    return M, d_head, draw(st.sampled_from(["plus", "minus"])), rng


def feasible_range(M: np.ndarray, sign: str) -> tuple[float, float]:
    """The interval every entry of Λ must lie in (plus: floor to +inf is capped for sampling)."""
    if sign == "minus":
        return -1.0, -NEGATIVE_CLIP
    w = np.linalg.eigvalsh((M + M.T) / 2)
    return POSITIVE_FLOOR * max(float(w.max()), 1.0), 2.0 * max(float(np.abs(w).max()), 1.0)


def distance(M: np.ndarray, Q: np.ndarray, lam: np.ndarray) -> float:
    return float(np.linalg.norm(M - (Q * lam) @ Q.T))


def random_orthonormal(rng: np.random.Generator, d: int, k: int) -> np.ndarray:
    Q, _ = np.linalg.qr(rng.standard_normal((d, k)))
    return Q


@given(trained_products())
def test_factors_are_orthonormal_with_the_requested_sign(case) -> None:
    M, d_head, sign, _ = case
    Q, lam = nearest_signed_factors(M, d_head, sign)
    assert Q.shape == (M.shape[0], d_head)
    assert lam.shape == (d_head,)
    assert_allclose(Q.T @ Q, np.eye(d_head), atol=tol.ORTHONORMAL_ATOL)
    low, _ = feasible_range(M, sign)
    if sign == "plus":
        assert np.all(lam > 0)
        assert np.all(lam >= low * (1 - tol.BOUND_RTOL))
        top = max(np.linalg.eigvalsh((M + M.T) / 2).max(), low)
        assert lam.max() <= top * (1 + tol.BOUND_RTOL)
    else:
        assert np.all((lam >= -1.0) & (lam <= -NEGATIVE_CLIP))


@given(trained_products())
def test_factors_are_nearer_than_random_feasible_competitors(case) -> None:
    M, d_head, sign, rng = case
    Q, lam = nearest_signed_factors(M, d_head, sign)
    best = distance(M, Q, lam)
    low, high = feasible_range(M, sign)
    slack = tol.BOUND_RTOL * (np.linalg.norm(M) + 1.0)
    for _ in range(20):
        other = random_orthonormal(rng, M.shape[0], d_head)
        assert best <= distance(M, other, rng.uniform(low, high, d_head)) + slack


@given(trained_products(), st.sampled_from([1e-1, 1e-3, 1e-6]))
def test_factors_are_nearer_than_small_feasible_perturbations(case, step: float) -> None:
    M, d_head, sign, rng = case
    Q, lam = nearest_signed_factors(M, d_head, sign)
    best = distance(M, Q, lam)
    low, high = feasible_range(M, sign)
    slack = tol.BOUND_RTOL * (np.linalg.norm(M) + 1.0)
    for _ in range(10):
        moved, _ = np.linalg.qr(Q + step * rng.standard_normal(Q.shape))
        shifted = np.clip(lam + step * rng.standard_normal(d_head), low, high)
        assert best <= distance(M, moved, shifted) + slack


@given(trained_products())
def test_the_skew_part_does_not_change_the_answer(case) -> None:
    """The skew part of M is orthogonal to every symmetric matrix: only sym(M) matters."""
    M, d_head, sign, rng = case
    K = rng.standard_normal(M.shape)
    Q, lam = nearest_signed_factors(M, d_head, sign)
    Q2, lam2 = nearest_signed_factors(M + K - K.T, d_head, sign)
    assert_allclose((Q2 * lam2) @ Q2.T, (Q * lam) @ Q.T, atol=tol.EIG_TOL * (1 + np.abs(M).max()))


@given(st.integers(0, 2**32 - 1), st.integers(2, 10), st.sampled_from(["plus", "minus"]))
def test_a_feasible_product_is_its_own_nearest(seed: int, d: int, sign: str) -> None:
    rng = np.random.default_rng(seed)
    d_head = int(rng.integers(1, d + 1))
    Q = random_orthonormal(rng, d, d_head)
    lam = -rng.uniform(0.1, 1.0, d_head) if sign == "minus" else rng.uniform(1.0, 3.0, d_head)
    M = (Q * lam) @ Q.T
    Q2, lam2 = nearest_signed_factors(M, d_head, sign)
    assert_allclose((Q2 * lam2) @ Q2.T, M, atol=tol.EIG_TOL)


@pytest.mark.parametrize(
    ("args", "argument"),
    [
        ((np.eye(3), 4, "plus"), "d_head"),
        ((np.eye(3), 0, "plus"), "d_head"),
        ((np.ones((2, 3)), 1, "minus"), "M"),
        ((np.eye(3), 2, "positive"), "sign"),
    ],
)
def test_nearest_signed_factors_names_a_bad_argument(args: tuple, argument: str) -> None:
    with pytest.raises(InputError, match=f"`{argument}`"):
        nearest_signed_factors(*args)


# -- reparameterize on the builder models ----------------------------------------------------------


@pytest.mark.parametrize("h", ["effective", "stored"])
@pytest.mark.parametrize("sign", ["plus", "minus"])
@pytest.mark.parametrize("name", REPARAM_VARIANTS)
def test_reparameterized_heads_have_the_signed_spectrum(
    model_dir: Path, name: str, sign: str, h: str
):
    """Plumbing check: the transform sets the spectrum of the product ``h`` names."""
    blocks = weights_of(_reparameterized(model_dir, name, sign, h))
    rtol = tol.FLOAT16_RTOL if name.startswith("fp16") else tol.FLOAT32_RTOL
    for block in blocks:
        for head in range(block.n_heads):
            eig = head_eigenvalues(block, head, h=h)
            radius = np.abs(eig).max()
            assert np.all(np.abs(eig.imag) <= rtol * radius), (block.index, head)
            if sign == "plus":
                assert np.all(eig.real > 0), (block.index, head)
            else:
                assert np.all(eig.real < 0), (block.index, head)
                assert np.all(eig.real >= -1 - rtol), (block.index, head)


@pytest.mark.parametrize("sign", ["plus", "minus"])
@pytest.mark.parametrize("name", FLOAT32_VARIANTS)
def test_reparameterized_heads_are_the_nearest_signed_products(
    model_dir: Path, name: str, sign: str
) -> None:
    """The effective left factor C diag(γ) W_V^h is Q (orthonormal, inside 𝟙^⊥ where the input is
    centred) and the effective product the nearest Q Λ Qᵀ to the trained one."""
    before = weights_of(saved(model_dir, name))
    after = weights_of(_reparameterized(model_dir, name, sign))
    for old, new in zip(before, after, strict=True):
        basis = centred_basis(old.d_model) if old.centred else None
        for head in range(new.n_heads):
            left, _ = new.effective_value_head(head)
            assert_allclose(left.T @ left, np.eye(new.d_head), atol=tol.FLOAT32_ATOL)
            trained = value_product(old, head, "effective")
            Q, lam = nearest_signed_factors(trained, old.d_head, sign, basis)
            expected = (Q * lam) @ Q.T
            scale = np.abs(expected).max()
            got = value_product(new, head, "effective")
            assert_allclose(got, expected, atol=tol.FLOAT32_ATOL * scale)


@pytest.mark.parametrize("name", FLOAT32_VARIANTS)
def test_reparameterize_changes_only_the_value_and_output_weights(model_dir: Path, name: str):
    before = weights_of(saved(model_dir, name))
    after = weights_of(_reparameterized(model_dir, name, "minus"))
    for old, new in zip(before, after, strict=True):
        for key in ("W_Q", "W_K", "b_Q", "b_K", "b_V", "b_O", "gamma", "beta", "layer_scale"):
            a, b = getattr(old, key), getattr(new, key)
            assert (a is None) == (b is None), key
            if a is not None:
                np.testing.assert_array_equal(a, b, err_msg=key)
        assert not np.array_equal(old.W_V, new.W_V)
        assert not np.array_equal(old.W_O, new.W_O)
    original = onnx.load(saved(model_dir, name))
    changed = onnx.load(_reparameterized(model_dir, name, "minus"))
    assert [n.SerializeToString() for n in changed.graph.node] == [
        n.SerializeToString() for n in original.graph.node
    ]


@pytest.mark.parametrize(("sign", "perron"), [("plus", 1.0), ("minus", 0.0)])
@pytest.mark.parametrize("name", REPARAM_VARIANTS)
def test_reparameterized_builder_model_dominance(
    model_dir: Path, name: str, sign: str, perron: float
) -> None:
    path = _reparameterized(model_dir, name, sign)
    result = audit(path, builder_inputs(assemble(name, SEED)), provider="cpu")
    assert result.dominance_summary().perron == perron


def test_reparameterize_refuses_shared_value_heads(model_dir: Path) -> None:
    out = model_dir / "gqa-plus.onnx"
    with pytest.raises(TransformError, match="GQA"):
        reparameterize(saved(model_dir, "llama_rmsnorm_rope_gqa"), "plus", out)
    assert not out.exists()


def test_reparameterize_names_a_bad_sign(model_dir: Path) -> None:
    with pytest.raises(InputError, match="`sign`"):
        reparameterize(saved(model_dir, "bert_legacy"), "positive", model_dir / "x.onnx")


# -- quantised models are refused -------------------------------------------------------------------


def transform(how: str, source: Path, out: Path) -> Path:
    """``random_init`` for ``how == "random"``, else ``reparameterize`` with sign ``how``."""
    if how == "random":
        return random_init(source, out)
    return reparameterize(source, how, out)


def _only_inputs_left(folder: Path, inputs: set[str]) -> bool:
    return {path.name for path in folder.iterdir()} == inputs


@pytest.mark.parametrize("how", ["plus", "minus", "random"])
@pytest.mark.parametrize("name", QUANTISED_VARIANTS)
def test_quantised_builder_models_are_refused(tmp_path: Path, name: str, how: str) -> None:
    source = saved(tmp_path, name)
    out = tmp_path / "out.onnx"
    with pytest.raises(TransformError, match="quantised"):
        transform(how, source, out)
    assert _only_inputs_left(tmp_path, {source.name})


@pytest.mark.realmodel
@pytest.mark.parametrize("how", ["plus", "random"])
def test_real_int8_model_is_refused(tmp_path: Path, how: str) -> None:
    source = require_real_model("minilm-l6-int8")
    out = tmp_path / "out.onnx"
    with pytest.raises(TransformError, match="quantised"):
        transform(how, source, out)
    assert list(tmp_path.iterdir()) == []


# -- random init ------------------------------------------------------------------------------------


def _is_matrix(tensor: onnx.TensorProto) -> bool:
    return len(tensor.dims) >= 2 and int(np.prod(tensor.dims)) > 1


def _float(tensor: onnx.TensorProto) -> bool:
    return numpy_helper.to_array(tensor).dtype.kind == "f"


@pytest.mark.parametrize("name", ["bert_legacy", "fp16_weights", "vit_prenorm_layerscale"])
def test_random_init_redraws_matrices_and_resets_vectors(model_dir: Path, name: str) -> None:
    """Matrices redrawn; every float vector a Mul or a norm scales by is 1, every one an Add or a
    norm shifts by is 0 (what a freshly built model holds); scalars and integers unchanged."""
    original = onnx.load(saved(model_dir, name))
    redrawn = onnx.load(random_init(saved(model_dir, name), model_dir / f"{name}-r.onnx", seed=3))
    for field in ("node", "input", "output", "value_info"):
        assert [v.SerializeToString() for v in getattr(redrawn.graph, field)] == [
            v.SerializeToString() for v in getattr(original.graph, field)
        ], field
    assert list(redrawn.opset_import) == list(original.opset_import)
    pairs = list(zip(original.graph.initializer, redrawn.graph.initializer, strict=True))
    assert any(_is_matrix(old) and _float(old) for old, _ in pairs)
    for old, new in pairs:
        assert (old.name, list(old.dims), old.data_type) == (
            new.name,
            list(new.dims),
            new.data_type,
        )
        before, after = numpy_helper.to_array(old), numpy_helper.to_array(new)
        fresh = vector_init(original, old.name) if before.ndim == 1 and before.size > 1 else None
        if _is_matrix(old) and _float(old):
            assert not np.array_equal(before, after), old.name
        elif fresh is not None and _float(old):
            np.testing.assert_array_equal(after, np.full_like(before, fresh), err_msg=old.name)
        else:
            np.testing.assert_array_equal(before, after, err_msg=old.name)
    vectors = [old for old, _ in pairs if len(old.dims) == 1 and old.dims[0] > 1 and _float(old)]
    assert vectors
    assert all(vector_init(original, v.name) is not None for v in vectors)  # biases, γ, β, ls


def test_vector_init_follows_casts_and_refuses_disagreeing_consumers() -> None:
    vector = numpy_helper.from_array(np.arange(3, dtype=np.float32) + 2, "v")
    nodes = [
        onnx.helper.make_node("Cast", ["v"], ["v16"], to=onnx.TensorProto.FLOAT16),
        onnx.helper.make_node("Mul", ["x", "v16"], ["y"]),
    ]
    graph = onnx.helper.make_graph(nodes, "g", [], [], [vector])
    assert vector_init(onnx.helper.make_model(graph), "v") == 1.0
    nodes.append(onnx.helper.make_node("Add", ["y", "v"], ["z"]))  # a scale and a shift at once
    graph = onnx.helper.make_graph(nodes, "g", [], [], [vector])
    assert vector_init(onnx.helper.make_model(graph), "v") is None


def _matrices(path: Path) -> dict[str, np.ndarray]:
    model = onnx.load(path)
    return {t.name: numpy_helper.to_array(t) for t in model.graph.initializer if _is_matrix(t)}


def test_random_init_is_reproducible_by_seed(model_dir: Path) -> None:
    source = saved(model_dir, "bert_legacy")
    first = _matrices(random_init(source, model_dir / "seed1-a.onnx", seed=1))
    again = _matrices(random_init(source, model_dir / "seed1-b.onnx", seed=1))
    other = _matrices(random_init(source, model_dir / "seed2.onnx", seed=2))
    for name, values in first.items():
        np.testing.assert_array_equal(values, again[name], err_msg=name)
        assert not np.array_equal(values, other[name]), name


@pytest.mark.parametrize("std", [0.02, 0.5])
def test_random_init_draws_with_the_requested_std(model_dir: Path, std: float) -> None:
    out = random_init(saved(model_dir, "bert_legacy"), model_dir / f"std-{std}.onnx", std=std)
    drawn = np.concatenate([m.ravel() for m in _matrices(out).values()]).astype(np.float64)
    standard_error = std / np.sqrt(2 * drawn.size)
    assert abs(drawn.std() - std) <= tol.SAMPLE_STD_SIGMAS * standard_error
    assert abs(drawn.mean()) <= tol.SAMPLE_STD_SIGMAS * std / np.sqrt(drawn.size)


@pytest.mark.parametrize("std", [0.0, -1.0, float("nan")])
def test_random_init_refuses_a_bad_std(tmp_path: Path, std: float) -> None:
    source = saved(tmp_path, "bert_legacy")
    with pytest.raises(TransformError, match="`std`"):
        random_init(source, tmp_path / "out.onnx", std=std)
    assert _only_inputs_left(tmp_path, {source.name})


def test_random_init_model_runs(model_dir: Path) -> None:
    out = random_init(saved(model_dir, "bert_legacy"), model_dir / "runs.onnx", seed=4)
    result = audit(out, builder_inputs(assemble("bert_legacy", SEED)), provider="cpu")
    assert all(np.all(np.isfinite(values)) for values in result.metrics.values())


# -- the real ViT ----------------------------------------------------------------------------------


@pytest.fixture(scope="module")
def vit_images():
    path = require_real_model("dinov2-vits14")
    return path, bundled_inputs("image", graph=load_model(path).inputs).subset([0, 1])


@pytest.mark.realmodel
@pytest.mark.parametrize(("sign", "perron"), [("plus", 1.0), ("minus", 0.0)])
def test_real_vit_reparameterized_dominance(
    tmp_path: Path, vit_images, sign: str, perron: float
) -> None:
    """ViT⁺: every dominating eigenvalue Perron-type (S6); ViT⁻: none (S5)."""
    path, images = vit_images
    out = reparameterize(path, sign, tmp_path / f"vit-{sign}.onnx")
    result = audit(out, images, batch_size=2, provider="cpu")
    summary = result.dominance_summary()
    assert summary.cases == 2 * 12 * 6
    assert summary.perron == perron
