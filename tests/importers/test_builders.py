"""The test models are valid, run in onnxruntime, and their expected blocks are the truth.

The ground truth is checked by a NumPy forward pass built from the ``ExpectedBlock`` weights (and
the reference data for embeddings and MLPs): it must reproduce onnxruntime's output.
"""

from __future__ import annotations

from collections import Counter
from dataclasses import replace

import numpy as np
import onnx
import pytest
from onnx import numpy_helper

from oversmooth.simulator import tolerances as tol
from tests.importers._builder_parts import BATCH
from tests.importers.builders import (
    NEAR_MISS_SPECS,
    NEAR_MISSES,
    RECIPES,
    VARIANTS,
    Assembly,
    assemble,
    assemble_near_miss,
)
from tests.importers.reference import reference_forward

ort = pytest.importorskip("onnxruntime")

SEED = 7
#: Variants whose activations are quantised at run time: no float reference applies.
ACTIVATION_QUANTISED = {"dynamic_quant"}
FLOAT_VARIANTS = sorted(set(VARIANTS) - ACTIVATION_QUANTISED)


def _session(model: onnx.ModelProto, *, optimise: bool) -> ort.InferenceSession:
    options = ort.SessionOptions()
    options.intra_op_num_threads = 1
    options.log_severity_level = 3
    if not optimise:
        options.graph_optimization_level = ort.GraphOptimizationLevel.ORT_DISABLE_ALL
    return ort.InferenceSession(
        model.SerializeToString(), options, providers=["CPUExecutionProvider"]
    )


def _run(assembly: Assembly, *, optimise: bool = False) -> np.ndarray:
    session = _session(assembly.built.model, optimise=optimise)
    return session.run([assembly.reference.output], assembly.built.inputs)[0]


@pytest.fixture(scope="module", params=sorted(VARIANTS))
def variant(request: pytest.FixtureRequest) -> tuple[str, Assembly]:
    return request.param, assemble(request.param, SEED)


# -- variants -----------------------------------------------------------------------------------


def test_variants_cover_the_required_list() -> None:
    required = {
        "bert_legacy",
        "bert_dynamo",
        "bert_decomposed_ln",
        "vit_prenorm_layerscale",
        "gpt2_fused_qkv",
        "gpt2_slice_qkv",
        "gemm_transb",
        "llama_rmsnorm_rope_gqa",
        "fp16_weights",
        "int8_weight_only",
        "dynamic_quant",
        "scale_mul_scores",
        "where_mask",
    }
    assert required <= set(VARIANTS)


def test_variant_passes_onnx_checker(variant: tuple[str, Assembly]) -> None:
    onnx.checker.check_model(variant[1].built.model, full_check=True)


def test_variant_runs_in_onnxruntime_with_optimisations(variant: tuple[str, Assembly]) -> None:
    name, assembly = variant
    out = _run(assembly, optimise=True)
    first = assembly.built.blocks[0]
    assert out.shape == (BATCH, assembly.reference.recipe.n_tokens, first.d_model), name
    assert np.all(np.isfinite(out)), name


def test_variant_batch_axis_is_dynamic(variant: tuple[str, Assembly]) -> None:
    name, assembly = variant
    single = {key: value[:1] for key, value in assembly.built.inputs.items()}
    session = _session(assembly.built.model, optimise=False)
    out = session.run([assembly.reference.output], single)[0]
    assert out.shape[0] == 1, name


def test_expected_block_shapes_are_consistent(variant: tuple[str, Assembly]) -> None:
    name, assembly = variant
    blocks = assembly.built.blocks
    assert [b.index for b in blocks] == [0, 1], name
    for b in blocks:
        width, kv_width = b.n_heads * b.d_head, b.n_kv_heads * b.d_head
        assert b.n_heads % b.n_kv_heads == 0, name
        assert 2 <= b.n_heads <= 4, name
        assert 16 <= b.d_model <= 32, name
        assert (b.W_Q.shape, b.W_K.shape, b.W_V.shape) == (
            (b.d_model, width),
            (b.d_model, kv_width),
            (b.d_model, kv_width),
        ), name
        assert b.W_O.shape == (width, b.d_model), name
        for bias, size in (
            (b.b_Q, width),
            (b.b_K, kv_width),
            (b.b_V, kv_width),
            (b.b_O, b.d_model),
        ):
            assert bias is None or bias.shape == (size,), name
        for vector in (b.gamma, b.beta, b.layer_scale):
            assert vector is None or vector.shape == (b.d_model,), name
        assert b.norm in ("pre", "post", "none"), name
        assert b.norm_kind in ("layernorm", "rmsnorm", None), name
        assert (b.beta is None) == (b.norm_kind == "rmsnorm"), name
        arrays = [b.W_Q, b.W_K, b.W_V, b.W_O, b.b_Q, b.gamma, b.layer_scale]
        assert all(a.dtype == np.float64 for a in arrays if a is not None), name


def test_expected_weights_are_exact_in_float32(variant: tuple[str, Assembly]) -> None:
    """Every reported value is a float32 number, except dynamic_quant's exact (q - zp) * scale."""
    name, assembly = variant
    for b in assembly.built.blocks:
        matrices = () if name in ACTIVATION_QUANTISED else (b.W_Q, b.W_K, b.W_V, b.W_O)
        for W in (*matrices, b.b_Q, b.b_O, b.gamma, b.beta, b.layer_scale):
            if W is not None:
                np.testing.assert_array_equal(
                    W.astype(np.float32).astype(np.float64), W, err_msg=name
                )


def _stored_values(model: onnx.ModelProto) -> set[bytes]:
    return {numpy_helper.to_array(t).tobytes() for t in model.graph.initializer}


def test_fp16_expected_weights_are_the_stored_halves() -> None:
    assembly = assemble("fp16_weights", SEED)
    stored = _stored_values(assembly.built.model)
    for b in assembly.built.blocks:
        for W in (b.W_Q, b.W_K, b.W_V, b.W_O, b.b_Q, b.b_O):
            assert W.astype(np.float16).tobytes() in stored


def test_variant_seed_determines_model(variant: tuple[str, Assembly]) -> None:
    name, assembly = variant
    again = VARIANTS[name](SEED)
    other = VARIANTS[name](SEED + 1)
    assert again.model.SerializeToString() == assembly.built.model.SerializeToString(), name
    assert not np.array_equal(other.blocks[0].W_Q, assembly.built.blocks[0].W_Q), name


@pytest.mark.parametrize("name", FLOAT_VARIANTS)
def test_variant_output_matches_numpy_reference(name: str) -> None:
    assembly = assemble(name, SEED)
    expected = reference_forward(assembly)
    actual = _run(assembly).astype(np.float64)
    np.testing.assert_allclose(
        actual,
        expected,
        rtol=tol.ORT_RTOL,
        atol=tol.ORT_ATOL,
        err_msg=f"{name}: onnxruntime output differs from the forward pass of the expected blocks",
    )


def test_reference_detects_a_transposed_weight() -> None:
    """The forward-pass check has teeth: a transposed W_O (square here) is far outside tolerance."""
    assembly = assemble("bert_legacy", SEED)
    first, second = assembly.built.blocks
    wrong = [replace(first, W_O=first.W_O.T.copy()), second]
    broken = replace(assembly, built=replace(assembly.built, blocks=wrong))
    with pytest.raises(AssertionError, match="Mismatched elements"):
        np.testing.assert_allclose(
            _run(assembly), reference_forward(broken), rtol=tol.ORT_RTOL, atol=tol.ORT_ATOL
        )


def test_dynamic_quant_weights_are_within_half_a_step_of_the_float_ones() -> None:
    quantised, original = assemble("dynamic_quant", SEED), assemble("bert_dynamo", SEED)
    ops = Counter(node.op_type for node in quantised.built.model.graph.node)
    assert ops["MatMulInteger"] >= 8
    assert ops["DynamicQuantizeLinear"] >= 2
    for q, f in zip(quantised.built.blocks, original.built.blocks, strict=True):
        for Wq, Wf in ((q.W_Q, f.W_Q), (q.W_K, f.W_K), (q.W_V, f.W_V), (q.W_O, f.W_O)):
            step = np.max(np.abs(Wf)) / 127
            assert 0 < np.max(np.abs(Wq - Wf)) <= step / 2 * (1 + tol.QUANT_STEP_RTOL)
            assert len(np.unique(np.rint(Wq / step))) > 2
    stored = _stored_values(quantised.built.model)
    for block in quantised.built.blocks:
        for vector in (block.b_Q, block.b_K, block.b_V, block.b_O, block.gamma, block.beta):
            assert vector.astype(np.float32).tobytes() in stored, "float parameters stay verbatim"


# -- near misses --------------------------------------------------------------------------------


@pytest.fixture(scope="module", params=sorted(NEAR_MISSES))
def near_miss(request: pytest.FixtureRequest) -> tuple[str, Assembly]:
    return request.param, assemble_near_miss(request.param, SEED)


def test_near_misses_cover_the_required_tags() -> None:
    required = {
        "value_matmul_missing",
        "softmax_axis",
        "q_weight_not_constant",
        "no_output_projection",
        "head_reshape_mismatch",
        "not_qk_product",
    }
    assert required <= set(NEAR_MISSES)
    for tag, build in NEAR_MISSES.items():
        miss = build(SEED)
        assert miss.broken == tag
        assert len(miss.description) > 40


def test_near_miss_passes_checker_and_runs(near_miss: tuple[str, Assembly]) -> None:
    tag, assembly = near_miss
    onnx.checker.check_model(assembly.built.model, full_check=True)
    out = _run(assembly, optimise=True)
    recipe = assembly.reference.recipe
    assert out.shape == (BATCH, recipe.n_tokens, recipe.d_model), tag
    assert np.all(np.isfinite(out)), tag


def _graph_facts(model: onnx.ModelProto) -> dict[str, object]:
    """Name-free facts about a graph that each near miss must change."""
    graph = model.graph
    producers = {out: node for node in graph.node for out in node.output}
    constants = {t.name for t in graph.initializer} | {
        n.output[0] for n in graph.node if n.op_type == "Constant"
    }
    inputs = {i.name for i in graph.input}

    def consumers(tensor: str) -> list[str]:
        return [n.op_type for n in graph.node if tensor in n.input]

    softmax = [n for n in graph.node if n.op_type == "Softmax"]
    perms = Counter(tuple(a.ints) for n in graph.node for a in n.attribute if a.name == "perm")
    return {
        "softmax_axes": sorted(a.i for n in softmax for a in n.attribute if a.name == "axis"),
        "after_softmax": sorted(op for n in softmax for op in consumers(n.output[0])),
        "weight_matmuls": sum(
            n.op_type == "MatMul" and n.input[1] in constants for n in graph.node
        ),
        "matmul_inputs": Counter(
            (
                src.op_type if (src := producers.get(n.input[0])) else "input",
                n.input[1] in constants,
            )
            for n in graph.node
            if n.op_type == "MatMul"
        ),
        "input_consumers": sorted(op for name in inputs for op in consumers(name)),
        "split_axes": [
            a.i for n in graph.node if n.op_type == "Split" for a in n.attribute if a.name == "axis"
        ],
        "key_transposes": perms[(0, 2, 3, 1)] + perms[(0, 1, 3, 2)],
        "reduce_max": sum(n.op_type == "ReduceMax" for n in graph.node),
        "n_softmax": len(softmax),
    }


def _changed_facts(tag: str) -> set[str]:
    broken = _graph_facts(assemble_near_miss(tag, SEED).built.model)
    base = _graph_facts(assemble(NEAR_MISS_SPECS[tag][0], SEED).built.model)
    return {key for key in base if base[key] != broken[key]}


#: tag -> the graph facts its break must change (and that nothing else explains).
EXPECTED_CHANGES = {
    "value_matmul_missing": {"after_softmax", "matmul_inputs"},
    "softmax_axis": {"softmax_axes"},
    "q_weight_not_constant": {"weight_matmuls", "matmul_inputs", "input_consumers"},
    "no_output_projection": {"weight_matmuls", "matmul_inputs"},
    "not_qk_product": {"n_softmax", "softmax_axes", "weight_matmuls", "matmul_inputs"},
    "k_not_transposed": {"key_transposes"},
    "qkv_split_axis": {"split_axes"},
    "kv_from_other_input": {"input_consumers", "matmul_inputs"},
    # One projection MatMul fewer, one probabilities-times-constant MatMul more.
    "value_not_projected": {"matmul_inputs"},
    "score_scale_not_constant": {"reduce_max"},
    "int8_scale_not_constant": {"input_consumers"},
}


@pytest.mark.parametrize("tag", sorted(EXPECTED_CHANGES))
def test_near_miss_changes_only_the_broken_part(tag: str) -> None:
    assert _changed_facts(tag) == EXPECTED_CHANGES[tag]


def test_head_reshape_mismatch_targets_half_the_head_width() -> None:
    assembly = assemble_near_miss("head_reshape_mismatch", SEED)
    recipe = RECIPES[NEAR_MISS_SPECS["head_reshape_mismatch"][0]]
    targets = [
        numpy_helper.to_array(n.attribute[0].t).tolist()
        for n in assembly.built.model.graph.node
        if n.op_type == "Constant"
    ]
    assert targets.count([0, -1, recipe.n_heads, recipe.d_head // 2]) == 3
