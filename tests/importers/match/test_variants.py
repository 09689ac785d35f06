"""The importer on every test-model variant and near miss of ``tests/importers/builders.py``.

Each variant is a small exported-looking Transformer with known weights: the importer must find
every block with the right structure and return the weights *exactly*; the tensor names it reports
must let onnxruntime's own intermediate values be recomputed from those weights. Each near miss
breaks one attention candidate on purpose: it must be rejected with a reason naming what broke.
"""

from __future__ import annotations

import functools
import itertools
import math
from collections.abc import Callable

import numpy as np
import onnx
import pytest
from numpy.testing import assert_allclose, assert_array_equal

from oversmooth.importers.audit.dominance import attention_by_head
from oversmooth.importers.graph import model_from_proto
from oversmooth.importers.match import MatchFailure, NoAttentionBlocksError, find_attention_blocks
from oversmooth.importers.value_spectra import head_eigenvalues, layer_eigenvalues
from oversmooth.importers.weights import BlockWeights, extract
from oversmooth.simulator import tolerances as tol
from oversmooth.simulator.attention import layer_norm, rms_norm, softmax
from tests.importers.builders import NEAR_MISSES, VARIANTS, Built, assemble

STRUCTURE = ("index", "n_heads", "n_kv_heads", "d_model", "d_head", "norm", "norm_kind")
ARRAYS = ("W_Q", "W_K", "W_V", "W_O", "b_Q", "b_K", "b_V", "b_O", "gamma", "beta", "layer_scale")
SEEDS = (0, 11)

#: What each near miss's rejection reason must mention (the part that was broken).
EXPECTED_REASON = {
    "value_matmul_missing": "value MatMul not found",
    "softmax_axis": "Softmax axis is 1",
    "q_weight_not_constant": "Q projection weight is not a constant",
    "no_output_projection": "output projection not found",
    "head_reshape_mismatch": "head split mixes projection features into the token axis",
    "not_qk_product": "not a query-key product",
    "k_not_transposed": "K is not transposed",
    "qkv_split_axis": "-> Split",
    "kv_from_other_input": "Q reads 'layernormalization_42'; K and V read 'encoder_hidden_states'",
    "value_not_projected": "V projection not found",
    "score_scale_not_constant": "scaled by a non-constant factor",
    "int8_scale_not_constant": "Q projection weight is not a constant",
}

#: Variants whose activations onnxruntime quantises at run time: the float recomputation differs
#: from the graph by the activation quantisation error, so only the run itself is checked.
RUNTIME_QUANTISED = {"dynamic_quant"}


@functools.cache
def built(name: str, seed: int) -> Built:
    return VARIANTS[name](seed)


@functools.cache
def extracted(name: str, seed: int) -> tuple[BlockWeights, ...]:
    return tuple(extract(model_from_proto(built(name, seed).model)))


def run_exposed(model: onnx.ModelProto, feeds: dict, names: list[str]) -> dict[str, np.ndarray]:
    """Run ``model`` in onnxruntime (CPU, no graph rewrites) returning the named tensors."""
    import onnxruntime as ort

    exposed = onnx.ModelProto()
    exposed.CopyFrom(model)
    outputs = {value.name for value in exposed.graph.output}
    for name in dict.fromkeys(names):
        if name not in outputs:
            exposed.graph.output.append(onnx.ValueInfoProto(name=name))
    options = ort.SessionOptions()
    options.graph_optimization_level = ort.GraphOptimizationLevel.ORT_DISABLE_ALL
    options.intra_op_num_threads = 1
    session = ort.InferenceSession(
        exposed.SerializeToString(), options, providers=["CPUExecutionProvider"]
    )
    unique = list(dict.fromkeys(names))
    return dict(zip(unique, session.run(unique, feeds), strict=True))


def attention_branch(block: BlockWeights, x: np.ndarray, A: np.ndarray) -> np.ndarray:
    """The residual Add output ``x + ls ⊙ (concat_h A_h N(x) W_V^h) W_O`` in float64.

    ``x`` is the block input (B, T, d), ``A`` the attention probabilities (B, H, T, T) taken from
    the graph, N the pre-LN norm (identity for post-LN blocks).
    """
    u = normed(block, x) if block.norm == "pre" else x
    batch, tokens, _ = x.shape
    values = u @ block.W_V + (0.0 if block.b_V is None else block.b_V)
    values = values.reshape(batch, tokens, block.n_kv_heads, block.d_head).transpose(0, 2, 1, 3)
    values = np.repeat(values, block.kv_group, axis=1)
    heads = (A @ values).transpose(0, 2, 1, 3).reshape(batch, tokens, -1)
    branch = heads @ block.W_O + (0.0 if block.b_O is None else block.b_O)
    if block.layer_scale is not None:
        branch = branch * block.layer_scale
    return x + branch


def attention_probabilities(block: BlockWeights, x: np.ndarray) -> np.ndarray:
    """Unmasked ``softmax(Q Kᵀ / sqrt(d_head))`` per head from the extracted weights (B, H, T, T)."""
    u = normed(block, x) if block.norm == "pre" else x
    batch, tokens, _ = x.shape

    def split(W: np.ndarray, b: np.ndarray | None, n: int) -> np.ndarray:
        y = u @ W + (0.0 if b is None else b)
        return y.reshape(batch, tokens, n, block.d_head).transpose(0, 2, 1, 3)

    q = split(block.W_Q, block.b_Q, block.n_heads)
    k = np.repeat(split(block.W_K, block.b_K, block.n_kv_heads), block.kv_group, axis=1)
    return softmax(q @ k.swapaxes(-1, -2) / math.sqrt(block.d_head))


def normed(block: BlockWeights, x: np.ndarray) -> np.ndarray:
    if block.norm_kind == "rmsnorm":
        return rms_norm(x, block.gamma, eps=block.eps)
    return layer_norm(x, block.gamma, block.beta, eps=block.eps)


def freeze_shapes(model: onnx.ModelProto, feeds: dict, *, fix_inputs: bool) -> onnx.ModelProto:
    """A copy whose Reshape/Expand shapes are the constants they evaluate to on ``feeds`` (an
    export without dynamic axes); ``fix_inputs`` also gives the graph inputs those feeds' sizes."""
    frozen = onnx.ModelProto()
    frozen.CopyFrom(model)
    graph = frozen.graph
    produced = {output for node in graph.node for output in node.output}
    nodes = [n for n in graph.node if n.op_type in ("Reshape", "Expand") and n.input[1] in produced]
    assert nodes, "the model has no computed shapes to freeze"
    values = run_exposed(model, feeds, [node.input[1] for node in nodes])
    for position, node in enumerate(nodes):
        name = f"frozen_shape_{position}"
        graph.initializer.append(onnx.numpy_helper.from_array(values[node.input[1]], name))
        node.input[1] = name
    for value in graph.input if fix_inputs else ():
        dims = value.type.tensor_type.shape.dim
        for dim, size in zip(dims, feeds[value.name].shape, strict=True):
            dim.ClearField("dim_param")
            dim.dim_value = size
    return frozen


def rename_everything(model: onnx.ModelProto, rng: np.random.Generator) -> onnx.ModelProto:
    """A copy with every node unnamed and every internal tensor renamed to a shuffled opaque name."""
    renamed = onnx.ModelProto()
    renamed.CopyFrom(model)
    graph = renamed.graph
    keep = {value.name for value in graph.input} | {value.name for value in graph.output}
    names = [t.name for t in graph.initializer] + [o for n in graph.node for o in n.output]
    internal = [name for name in dict.fromkeys(names) if name and name not in keep]
    order = rng.permutation(len(internal))
    mapping = {name: f"t{order[i]}" for i, name in enumerate(internal)}
    for tensor in graph.initializer:
        tensor.name = mapping.get(tensor.name, tensor.name)
    for node in graph.node:
        node.name = ""
        node.input[:] = [mapping.get(name, name) for name in node.input]
        node.output[:] = [mapping.get(name, name) for name in node.output]
    del graph.value_info[:]
    return renamed


# -- variants ---------------------------------------------------------------------------------


@pytest.mark.parametrize("name", sorted(VARIANTS))
def test_variant_blocks_have_expected_structure(name):
    expected = built(name, 0).blocks
    got = extracted(name, 0)
    assert len(got) == len(expected), f"{name}: block count"
    for block, want in zip(got, expected, strict=True):
        for field in STRUCTURE:
            assert getattr(block, field) == getattr(want, field), (
                f"{name} block {want.index}: {field}"
            )
        assert (block.layer_scale is not None) == (want.layer_scale is not None)


@pytest.mark.parametrize("seed", SEEDS)
@pytest.mark.parametrize("name", sorted(VARIANTS))
def test_variant_weights_equal_the_builders_exactly(name, seed):
    for block, want in zip(extracted(name, seed), built(name, seed).blocks, strict=True):
        for key in ARRAYS:
            value, expected = getattr(block, key), getattr(want, key)
            assert (value is None) == (expected is None), (
                f"{name} block {want.index}: {key} presence"
            )
            if expected is not None:
                assert value.dtype == np.float64
                assert_array_equal(value, expected, err_msg=f"{name} block {want.index}: {key}")


@pytest.mark.parametrize("name", sorted(VARIANTS))
def test_variant_blocks_chain_in_depth_order(name):
    blocks = extracted(name, 0)
    assert [block.index for block in blocks] == list(range(len(blocks)))
    for block, following in itertools.pairwise(blocks):
        assert block.output_name == following.input_name, f"{name}: block {block.index} output"


@pytest.mark.parametrize("name", sorted(VARIANTS))
def test_variant_matching_needs_no_names(name, rng):
    model = built(name, 0).model
    blind = extract(model_from_proto(rename_everything(model, rng)))
    for block, want in zip(blind, extracted(name, 0), strict=True):
        for field in STRUCTURE:
            assert getattr(block, field) == getattr(want, field)
        for key, value in want.arrays().items():
            assert_array_equal(block.arrays()[key], value, err_msg=f"{name}: {key} without names")


@pytest.mark.parametrize("name", sorted(VARIANTS))
def test_variant_runs_and_its_residual_is_recomputed_from_the_weights(name):
    case = built(name, 0)
    blocks = extracted(name, 0)
    names = [n for b in blocks for n in (b.input_name, b.attention_name, b.residual_name)]
    names += [b.norm_output_name for b in blocks if b.norm_output_name]
    values = run_exposed(case.model, case.inputs, names)
    assert all(np.all(np.isfinite(value)) for value in values.values())
    if name in RUNTIME_QUANTISED:
        return
    for block in blocks:
        x = values[block.input_name]
        A = attention_by_head(values[block.attention_name], block.attention_name, block.n_heads)
        scale = float(np.max(np.abs(values[block.residual_name])))
        assert_allclose(
            attention_branch(block, x, A),
            values[block.residual_name],
            rtol=tol.ORT_RTOL,
            atol=tol.ORT_ATOL * scale,
            err_msg=f"{name} block {block.index}: residual from extracted W_V, W_O",
        )
        if block.norm == "post":
            assert_allclose(
                normed(block, values[block.residual_name]),
                values[block.norm_output_name],
                rtol=tol.ORT_RTOL,
                atol=tol.ORT_ATOL,
                err_msg=f"{name} block {block.index}: post-LN from extracted gamma, beta",
            )


@pytest.mark.parametrize("name", ["vit_prenorm_layerscale", "gpt2_gemm_conv1d", "bert_legacy"])
def test_variant_attention_is_recomputed_from_query_and_key_weights(name):
    case = built(name, 0)
    blocks = extracted(name, 0)
    if "attention_mask" in case.inputs:
        case = Built(
            case.model,
            case.blocks,
            {**case.inputs, "attention_mask": np.ones_like(case.inputs["attention_mask"])},
        )
    names = [n for b in blocks for n in (b.input_name, b.attention_name)]
    values = run_exposed(case.model, case.inputs, names)
    for block in blocks:
        expected = values[block.attention_name]
        got = attention_probabilities(block, values[block.input_name])
        if name.startswith("gpt2"):  # causal: compare the unmasked lower triangle renormalised
            got = np.tril(got)
            got = got / got.sum(axis=-1, keepdims=True)
        assert_allclose(
            got,
            expected,
            rtol=tol.ORT_RTOL,
            atol=tol.ORT_ATOL,
            err_msg=f"{name} block {block.index}: A",
        )


@pytest.mark.parametrize(
    ("name", "batch", "fix_inputs"),
    [
        ("bert_legacy", 2, True),
        ("gpt2_slice_qkv", 2, True),
        ("vit_prenorm_layerscale", 1, True),
        # Inputs still symbolic but every head split fixed at batch 1: the matcher must take the
        # probe sizes from the static Reshape target.
        ("vit_prenorm_layerscale", 1, False),
        ("bert_legacy", 1, False),
    ],
)
def test_variant_exported_with_static_shapes_gives_the_same_weights(name, batch, fix_inputs):
    case = built(name, 0)
    feeds = {key: value[:batch] for key, value in case.inputs.items()}
    frozen = freeze_shapes(case.model, feeds, fix_inputs=fix_inputs)
    for block, want in zip(extract(model_from_proto(frozen)), extracted(name, 0), strict=True):
        for field in STRUCTURE:
            assert getattr(block, field) == getattr(want, field)
        for key, value in want.arrays().items():
            assert_array_equal(block.arrays()[key], value, err_msg=f"{name} static: {key}")


@pytest.mark.parametrize("name", sorted(VARIANTS))
def test_variant_spectra_traces_match_the_builders_weights(name):
    """Σ eig(W_O^h W_V^h) = tr(W_O^h W_V^{h // group}) per head (GQA: shared key/value heads), and
    Σ eig(W_V W_O) over the layer = Σ_h of those traces, from the builder's ground truth."""
    for block, want in zip(extracted(name, 0), built(name, 0).blocks, strict=True):
        d, group = want.d_head, want.n_heads // want.n_kv_heads
        traces = []
        for head in range(want.n_heads):
            kv = head // group
            W_V, W_O = want.W_V[:, kv * d : (kv + 1) * d], want.W_O[head * d : (head + 1) * d]
            values = head_eigenvalues(block, head)
            traces.append(np.trace(W_O @ W_V))
            scale = max(float(np.max(np.abs(values))), 1.0)
            assert abs(values.sum() - traces[-1]) <= tol.HEAD_SPECTRUM_RTOL * scale, (name, head)
        layer = layer_eigenvalues(block)
        assert layer.shape == (want.d_model,)
        scale = max(float(np.max(np.abs(layer))), 1.0)
        assert abs(layer.sum() - sum(traces)) <= tol.HEAD_SPECTRUM_RTOL * scale * want.n_heads


def reencode(model: onnx.ModelProto, name: str, how: str) -> tuple[onnx.ModelProto, np.ndarray]:
    """Store the float32 initializer ``name`` another way a graph may hold a weight; returns the
    new model and the weight value the graph now computes (float64)."""
    changed = onnx.ModelProto()
    changed.CopyFrom(model)
    graph = changed.graph
    position = next(i for i, t in enumerate(graph.initializer) if t.name == name)
    W = onnx.numpy_helper.to_array(graph.initializer[position])
    del graph.initializer[position]
    make = onnx.helper.make_node
    if how == "constant_node":
        nodes = [make("Constant", [], [name], value=onnx.numpy_helper.from_array(W))]
        value = W
    elif how == "transposed":
        graph.initializer.append(
            onnx.numpy_helper.from_array(np.ascontiguousarray(W.T), f"{name}_t")
        )
        nodes = [make("Transpose", [f"{name}_t"], [name], perm=[1, 0])]
        value = W
    elif how == "identity":
        graph.initializer.append(onnx.numpy_helper.from_array(W, f"{name}_src"))
        nodes = [make("Identity", [f"{name}_src"], [name])]
        value = W
    else:  # DequantizeLinear, per output column or per tensor, with a nonzero zero point
        per_column = how == "dequantize_per_column"
        scale = (np.abs(W).max(axis=0) if per_column else np.abs(W).max()) / np.float32(100)
        scale = scale.astype(np.float32)
        zero = np.full(scale.shape, 3, dtype=np.int8)
        q = (np.clip(np.round(W / scale), -100, 100) + 3).astype(np.int8)
        graph.initializer.extend(
            [
                onnx.numpy_helper.from_array(q, f"{name}_q"),
                onnx.numpy_helper.from_array(scale, f"{name}_scale"),
                onnx.numpy_helper.from_array(zero, f"{name}_zero"),
            ]
        )
        nodes = [
            make("DequantizeLinear", [f"{name}_q", f"{name}_scale", f"{name}_zero"], [name], axis=1)
        ]
        value = (q.astype(np.int32) - zero.astype(np.int32)).astype(np.float32) * scale
    for node in reversed(nodes):
        graph.node.insert(0, node)
    onnx.checker.check_model(changed)
    return changed, value.astype(np.float64)


@pytest.mark.parametrize(
    "how",
    ["constant_node", "transposed", "identity", "dequantize_per_column", "dequantize_per_tensor"],
)
def test_weight_stored_as_a_constant_chain_is_folded(how):
    assembly = assemble("bert_legacy", 0)
    model, W_q = reencode(assembly.built.model, assembly.weight_names[0]["q"], how)
    block = extract(model_from_proto(model))[0]
    assert_array_equal(block.W_Q, W_q, err_msg=f"W_Q stored as {how}")
    assert_array_equal(block.W_K, assembly.built.blocks[0].W_K)


@pytest.mark.parametrize(
    ("floor", "found"), [(float(np.finfo(np.float32).min), True), (0.0, False)]
)
def test_a_floor_on_the_scores_is_passed_only_at_a_masking_level(floor, found):
    """XGLM floors its scores at finfo.min (a no-op on every unmasked score); a floor at 0 is a
    nonlinearity on the scores and must not be walked past as if it were one."""
    model = onnx.ModelProto()
    model.CopyFrom(built("batched_3d_scores", 0).model)
    for node in model.graph.node:
        if node.op_type == "Max":
            floor_name = node.input[1]
            for constant in model.graph.node:
                if constant.output[0] == floor_name:
                    constant.attribute[0].t.CopyFrom(
                        onnx.numpy_helper.from_array(np.array(floor, np.float32))
                    )
    if found:
        assert len(find_attention_blocks(model_from_proto(model)).blocks) == 2
    else:
        with pytest.raises(NoAttentionBlocksError, match="QK\\^T MatMul not found"):
            find_attention_blocks(model_from_proto(model))


def _clipped_projections(roles: str) -> onnx.ModelProto:
    """bert_legacy with block 0's projections ``roles`` (of "qkv") clipped to ±0.5, as OLMo's
    ``clip_qkv`` does: a Clip between each projection (bias included) and its head split."""
    assembly = assemble("bert_legacy", 0)
    model = onnx.ModelProto()
    model.CopyFrom(assembly.built.model)
    nodes = list(model.graph.node)
    for name, value in (("clip.low", -0.5), ("clip.high", 0.5)):
        model.graph.initializer.append(onnx.numpy_helper.from_array(np.float32(value), name))
    for role in roles:
        weight = assembly.weight_names[0][role]
        end = next(n for n in nodes if n.op_type == "MatMul" and weight in n.input).output[0]
        end = next((n.output[0] for n in nodes if n.op_type == "Add" and end in n.input), end)
        clipped = f"{end}.clipped"
        for node in nodes:
            node.input[:] = [clipped if x == end else x for x in node.input]
        position = next(i for i, n in enumerate(nodes) if end in n.output)
        nodes.insert(
            position + 1,
            onnx.helper.make_node("Clip", [end, "clip.low", "clip.high"], [clipped], name=role),
        )
    del model.graph.node[:]
    model.graph.node.extend(nodes)
    onnx.checker.check_model(model)
    return model


@pytest.mark.parametrize(("roles", "departs"), [("qk", False), ("v", True), ("qkv", True)])
def test_clipped_projections_are_walked_and_clipped_values_are_a_departure(roles, departs):
    """OLMo's clip_qkv: a clipped Q or K changes only how A is computed (a note); clipped values
    make the update X + A clip(X W_V) W_O (a departure). Weights are those before the Clip."""
    report = find_attention_blocks(model_from_proto(_clipped_projections(roles)))
    first, second = report.blocks
    assert first.departures == (("value-clip",) if departs else ())
    assert second.departures == ()
    assert not any("clipped" in n for n in second.notes)
    note = next(n for n in first.notes if n.startswith("projections clipped"))
    assert all(f"{role.upper()}: Clip" in note for role in roles)
    weights = extract(model_from_proto(_clipped_projections(roles)))[0]
    for key in ("W_Q", "W_K", "W_V", "W_O"):
        assert_array_equal(getattr(weights, key), getattr(built("bert_legacy", 0).blocks[0], key))


# -- near misses ------------------------------------------------------------------------------


def test_every_near_miss_has_an_expected_reason():
    assert set(EXPECTED_REASON) == set(NEAR_MISSES)


def failures_of(model: onnx.ModelProto) -> tuple[int, list[MatchFailure]]:
    try:
        report = find_attention_blocks(model_from_proto(model))
    except NoAttentionBlocksError as err:
        return 0, list(err.failures)
    return len(report.blocks), report.failures


@pytest.mark.parametrize("tag", sorted(NEAR_MISSES))
def test_near_miss_is_rejected_with_a_reason_naming_the_broken_part(tag):
    near_miss = NEAR_MISSES[tag](0)
    n_blocks, failures = failures_of(near_miss.model)
    reasons = [failure.reason for failure in failures]
    assert any(EXPECTED_REASON[tag] in reason for reason in reasons), (tag, reasons)
    intact = 2 if tag == "not_qk_product" else 1
    assert n_blocks <= intact, f"{tag}: the broken candidate was matched"


def _attempts(answers: dict[tuple[int, int], object]) -> Callable[[tuple[int, int]], object]:
    """A stand-in match attempt per probe sizes: returns the answer or raises it."""

    def attempt(sizes: tuple[int, int]) -> object:
        if isinstance(answer := answers[sizes], Exception):
            raise answer
        return answer

    return attempt


@pytest.mark.parametrize("long_probe_finds_it", [True, False])
def test_a_failed_head_split_is_probed_once_more_with_long_open_axes(
    long_probe_finds_it: bool,
) -> None:
    """At 3 samples a HuBERT front end leaves no frame; at LONG_PROBE_SEQUENCE it does. When the
    long probe fails too, the default probe's reason is the one reported."""
    from oversmooth.importers.match import match_softmax
    from oversmooth.importers.match.limits import LONG_PROBE_SEQUENCE, PROBE_BATCH, PROBE_SEQUENCE
    from oversmooth.importers.match.walker import RejectError

    first = RejectError("head_reshape", "cannot reshape Q of shape (2, 0, 32)")
    found = object()
    later = found if long_probe_finds_it else RejectError("head_reshape", "at the long probe")
    answers = {(PROBE_BATCH, PROBE_SEQUENCE): first, (PROBE_BATCH, LONG_PROBE_SEQUENCE): later}
    if long_probe_finds_it:
        assert match_softmax(_attempts(answers)) is found  # type: ignore[arg-type]
    else:
        with pytest.raises(RejectError) as raised:
            match_softmax(_attempts(answers))  # type: ignore[arg-type]
        assert raised.value is first
    other = RejectError("softmax_axis", "not a head split")  # other reasons are not retried
    answers[(PROBE_BATCH, PROBE_SEQUENCE)] = other
    with pytest.raises(RejectError) as raised:
        match_softmax(_attempts(answers))  # type: ignore[arg-type]
    assert raised.value is other
