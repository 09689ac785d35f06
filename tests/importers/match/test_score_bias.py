"""Terms added to the attention scores (issue 11, cause G, and the block's score contract).

One hand-built block whose scores are QKᵀ plus one kind of term: ALiBi computed from the attention
mask (BLOOM's form), a relative position table gathered by j - i (T5's), a disentangled
content-to-position term (DeBERTa's), masks (padding, causal, a Where fill, one that is not
causal), a constant bias of no known form, a mask fed as a graph input, and a term computed from
the hidden states (declined). The block must report ``score_bias`` and ``causal`` as built, keep
W_Q and W_K the content projections, and say why a term is declined.
"""

from __future__ import annotations

import json

import numpy as np
import onnx
import pytest
from onnx import TensorProto, helper

from oversmooth.cli import main
from oversmooth.importers.graph import model_from_proto
from oversmooth.importers.match import NoAttentionBlocksError, find_attention_blocks
from oversmooth.importers.match import score_values as values
from oversmooth.importers.weights import block_weights
from tests.importers.small_graph import SmallGraph

D, HEADS, D_HEAD, T = 8, 2, 4, 4
FINFO_MIN = float(np.finfo(np.float32).min)


class _Graph(SmallGraph):
    def heads(self, x: str, weight: str) -> str:
        """``x @ W`` split into heads: (B, H, T, d_head)."""
        split = self.op("Reshape", self.op("MatMul", x, weight), self.ints(0, 0, HEADS, D_HEAD))
        return self.op("Transpose", split, perm=[0, 2, 1, 3])

    def ints(self, *values: int) -> str:
        return self.const(list(values), np.int64)


def _relative_index() -> np.ndarray:
    """(T, T) index of key j relative to query i into a table of 2T - 1 rows."""
    i, j = np.meshgrid(np.arange(T), np.arange(T), indexing="ij")
    return (j - i + T - 1).astype(np.int64)


def _term(g: _Graph, kind: str, q: str, rng: np.random.Generator) -> tuple[str, str, float]:
    """(how the term is applied: "add" or "where", the term tensor, the score scale)."""
    scale = D_HEAD**-0.5
    if kind == "alibi":  # BLOOM: slopes x (cumsum(mask) - 1), with a causal mask added too
        positions = g.op("Sub", g.op("CumSum", "attention_mask", g.const(1, np.int64)), g.ints(1))
        keys = g.op("Unsqueeze", g.op("Cast", positions, to=TensorProto.FLOAT), g.ints(1))
        alibi = g.op("Mul", g.const([[0.25], [0.0625]]), keys)  # (B, H, T)
        lower = np.tril(np.ones((T, T), dtype=bool))
        causal = g.const(np.where(lower, 0.0, FINFO_MIN)[None, None])
        return "add", g.op("Add", g.op("Unsqueeze", alibi, g.ints(2)), causal), scale
    if kind == "relative":  # T5: a learned table gathered by j - i
        table = g.const(rng.normal(size=(2 * T - 1, HEADS)))
        gathered = g.op("Gather", table, g.const(_relative_index(), np.int64), axis=0)
        bias = g.op("Transpose", gathered, perm=[2, 0, 1])
        return "add", g.op("Unsqueeze", bias, g.ints(0)), scale
    if kind == "disentangled":  # DeBERTa: Q times projected position embeddings, by j - i
        scale = (2 * D_HEAD) ** -0.5
        positions = g.op("MatMul", g.const(rng.normal(size=(2 * T - 1, D))), g.const(_w(rng)))
        split = g.op("Reshape", positions, g.ints(2 * T - 1, HEADS, D_HEAD))
        by_position = g.op("MatMul", q, g.op("Transpose", split, perm=[1, 2, 0]))
        target = g.op("Concat", g.op("Shape", by_position, start=0, end=3), g.ints(T), axis=0)
        index = g.op("Expand", g.const(_relative_index()[None, None], np.int64), target)
        c2p = g.op("GatherElements", by_position, index, axis=3)
        return "add", g.op("Mul", c2p, g.const(scale)), scale
    if kind == "position_product":  # BERT's relative_key-like: Q times position embeddings
        table = g.const(rng.normal(size=(T, D_HEAD)))
        length = g.op("Squeeze", g.op("Shape", "x", start=1, end=2), g.ints(0))
        positions = g.op("Range", g.const(0, np.int64), length, g.const(1, np.int64))
        embeddings = g.op("Gather", table, positions, axis=0)  # not a constant: a second product
        return "add", g.op("MatMul", q, g.op("Transpose", embeddings, perm=[1, 0])), scale
    if kind == "two_contents":  # a second query-key product of the same stream
        k_t = g.op("Transpose", g.heads("x", g.const(_w(rng))), perm=[0, 1, 3, 2])
        return "add", g.op("MatMul", q, k_t), scale
    if kind == "padding":  # BERT: (1 - mask) * finfo.min on (B, 1, 1, T)
        keep = g.op("Cast", g.op("Unsqueeze", "attention_mask", g.ints(1, 2)), to=1)
        return "add", g.op("Mul", g.op("Sub", g.const(1.0), keep), g.const(FINFO_MIN)), scale
    if kind == "causal_where":  # GPT-2: Where(tril, scores, finfo.min)
        return "where", g.const(np.tril(np.ones((T, T), dtype=bool))[None, None], np.bool_), scale
    if kind == "anticausal":  # a mask hiding the keys before the query: not causal
        upper = np.triu(np.ones((T, T), dtype=bool))
        return "add", g.const(np.where(upper, 0.0, -1e9)[None, None]), scale
    if kind == "other":  # a constant bias of no known form
        return "add", g.const(rng.uniform(-2.0, 2.0, size=(1, HEADS, T, T))), scale
    if kind == "non_finite":  # a broken export: +inf and NaN where a bias should be finite
        bias = rng.uniform(-2.0, 2.0, size=(1, HEADS, T, T))
        bias[0, 0, :, 1], bias[0, 1, 0, 0] = np.inf, np.nan
        return "add", g.const(bias), scale
    if kind == "mask_input":  # an additive mask the caller feeds
        return "add", "additive_mask", scale
    if kind == "hidden":  # a per-key bias computed from the hidden states
        per_key = g.op(
            "Transpose", g.op("MatMul", "x", g.const(_w(rng)[:, :HEADS])), perm=[0, 2, 1]
        )
        return "add", g.op("Unsqueeze", per_key, g.ints(2)), scale
    raise ValueError(kind)


def _w(rng: np.random.Generator) -> np.ndarray:
    return rng.normal(scale=0.4, size=(D, D)).astype(np.float32)


def _model(kind: str) -> tuple[onnx.ModelProto, dict[str, np.ndarray]]:
    rng = np.random.default_rng(0)
    weights = {role: _w(rng) for role in ("q", "k", "v", "o")}
    g = _Graph()
    q = g.heads("x", g.const(weights["q"]))
    k_t = g.op("Transpose", g.heads("x", g.const(weights["k"])), perm=[0, 1, 3, 2])
    how, term, scale = _term(g, kind, q, rng)
    scores = g.op("Mul", g.op("MatMul", q, k_t), g.const(scale))
    if how == "add":
        scores = g.op("Add", scores, term)
    else:
        scores = g.op("Where", term, scores, g.const(FINFO_MIN))
    probs = g.op("Softmax", scores, axis=-1)
    mixed = g.op(
        "Transpose", g.op("MatMul", probs, g.heads("x", g.const(weights["v"]))), perm=[0, 2, 1, 3]
    )
    merged = g.op("Reshape", mixed, g.ints(0, 0, D))
    out = g.op("Add", "x", g.op("MatMul", merged, g.const(weights["o"])))
    inputs = [helper.make_tensor_value_info("x", TensorProto.FLOAT, ["batch", T, D])]
    used = {name for node in g.nodes for name in node.input}
    if "attention_mask" in used:
        inputs.append(
            helper.make_tensor_value_info("attention_mask", TensorProto.INT64, ["batch", T])
        )
    if "additive_mask" in used:
        inputs.append(
            helper.make_tensor_value_info("additive_mask", TensorProto.FLOAT, ["batch", 1, T, T])
        )
    graph = helper.make_graph(
        g.nodes,
        kind,
        inputs,
        [helper.make_tensor_value_info(out, TensorProto.FLOAT, None)],
        g.inits,
    )
    return helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)]), weights


EXPECTED = {  # kind: (score_bias, causal)
    "alibi": ("alibi", True),
    "relative": ("relative", False),
    "disentangled": ("disentangled", False),
    "position_product": ("disentangled", False),
    "padding": ("none", False),
    "causal_where": ("none", True),
    "anticausal": ("none", False),
    "other": ("other", False),
    "non_finite": ("other", False),
    "mask_input": ("none", False),
}


@pytest.mark.parametrize("kind", sorted(EXPECTED))
def test_score_terms_are_classified_and_weights_stay_the_content_projections(kind: str) -> None:
    proto, weights = _model(kind)
    model = model_from_proto(proto)
    report = find_attention_blocks(model)
    assert not report.failures
    (block,) = report.blocks
    assert (block.score_bias, block.causal) == EXPECTED[kind]
    assert (block.rotary, block.rotary_width) == ("none", 0)
    read = block_weights(model, block)
    for role in ("q", "k", "v", "o"):
        np.testing.assert_allclose(getattr(read, f"W_{role.upper()}"), weights[role], rtol=1e-6)
    record = block.to_dict()
    assert (record["score_bias"], record["causal"]) == EXPECTED[kind]
    assert (record["rotary"], record["rotary_width"]) == ("none", 0)


def test_disentangled_scale_is_named_in_a_note() -> None:
    (block,) = find_attention_blocks(model_from_proto(_model("disentangled")[0])).blocks
    assert block.scale == pytest.approx((2 * D_HEAD) ** -0.5)
    assert any(
        "1/sqrt(d_head * 2)" in note and "1 position terms" in note for note in block.notes
    ), block.notes


@pytest.mark.parametrize(
    ("kind", "says"),
    [
        ("other", "neither a mask, ALiBi"),
        ("non_finite", "holds +inf or NaN outside its masked entries"),
        ("mask_input", "fed by graph input 'additive_mask'"),
    ],
)
def test_unrecognised_or_fed_terms_get_a_note(kind: str, says: str) -> None:
    (block,) = find_attention_blocks(model_from_proto(_model(kind)[0])).blocks
    assert any(says in note for note in block.notes), block.notes


def test_a_bias_computed_from_the_hidden_states_is_declined_by_name() -> None:
    with pytest.raises(NoAttentionBlocksError) as caught:
        find_attention_blocks(model_from_proto(_model("hidden")[0]))
    (failure,) = caught.value.failures
    assert failure.code == "score_bias_hidden"
    assert "score bias depending on the hidden states other than a disentangled" in failure.reason


def test_two_query_key_products_of_one_stream_are_declined() -> None:
    with pytest.raises(NoAttentionBlocksError, match="2 of them multiply Q and K projections"):
        find_attention_blocks(model_from_proto(_model("two_contents")[0]))


def test_a_reshape_that_splits_the_key_axis_is_declined() -> None:
    proto, _ = _model("padding")
    graph = proto.graph
    softmax = next(node for node in graph.node if node.op_type == "Softmax")
    split = helper.make_node("Reshape", [softmax.input[0], "pairs"], ["split_scores"])
    graph.initializer.append(
        onnx.numpy_helper.from_array(np.array([0, HEADS, T * T // 2, 2], np.int64), "pairs")
    )
    softmax.input[0] = "split_scores"
    graph.node.insert(list(graph.node).index(softmax), split)
    with pytest.raises(NoAttentionBlocksError, match="axes are not kept"):
        find_attention_blocks(model_from_proto(proto))


def test_inspect_shows_causal_rotary_and_score_bias(capsys, tmp_path) -> None:
    path = tmp_path / "alibi.onnx"
    onnx.save(_model("alibi")[0], path)
    assert main(["inspect", str(path)]) == 0
    header, row = capsys.readouterr().out.splitlines()[1:3]
    assert header.split()[-3:] == ["causal", "rotary", "score_bias"]
    assert row.split()[-3:] == ["yes", "none", "alibi"]
    assert main(["inspect", str(path), "--json"]) == 0
    (block,) = json.loads(capsys.readouterr().out)["blocks"]
    assert (block["causal"], block["rotary"], block["score_bias"]) == (True, "none", "alibi")


# -- the value tests ------------------------------------------------------------------------------
def test_linear_in_key_position_with_masked_entries_is_alibi() -> None:
    slopes = np.array([0.5, 0.125])[:, None, None]
    keys = np.arange(5.0)
    value = slopes * keys + np.arange(5.0)[:, None]  # a per-row constant does not matter
    value = np.where(np.tril(np.ones((5, 5), bool)), value, -np.inf)
    assert values.is_linear_in_key(values.bias_part(value))
    bent = value.copy()
    bent[0, 4, 2] += 0.5
    assert not values.is_linear_in_key(values.bias_part(bent))
    assert not values.is_linear_in_key(values.bias_part(np.zeros((2, 5, 5))))  # no slope


def test_relative_values_are_diagonal_constant_or_drawn_from_a_small_table() -> None:
    table = np.random.default_rng(1).normal(size=9)
    toeplitz = table[_index(5)]
    assert values.is_relative(values.bias_part(toeplitz))
    repeated = np.random.default_rng(2).choice(table[:4], size=(6, 6))
    assert values.is_relative(values.bias_part(repeated))
    noise = np.random.default_rng(3).normal(size=(6, 6))
    assert not values.is_relative(values.bias_part(noise))


def _index(n: int) -> np.ndarray:
    i, j = np.meshgrid(np.arange(n), np.arange(n), indexing="ij")
    return j - i + n - 1


def test_causal_pattern_needs_every_later_key_hidden_and_the_diagonal_kept() -> None:
    later = np.triu(np.ones((3, 3), bool), k=1)
    assert values.causal_pattern([later[None]], 3, 3)
    assert values.causal_pattern([later[:2], later], 3, 3)  # union of masks
    assert not values.causal_pattern([np.triu(np.ones((3, 3), bool))], 3, 3)  # diagonal hidden
    assert not values.causal_pattern([later[:, :2].any(axis=1, keepdims=True)], 3, 3)
    assert not values.causal_pattern([], 3, 3)
    one_head_only = np.stack([later, np.zeros_like(later)])  # every slice must hide them
    assert not values.causal_pattern([one_head_only], 3, 3)
