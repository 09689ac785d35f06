"""Norms found by structure (:mod:`oversmooth.importers.match.norms`), on hand-built graphs whose
outputs onnxruntime computes: what is recognised as a LayerNorm or an RMSNorm is one (the
simulator's ``layer_norm``/``rms_norm`` give the same numbers), with its γ, β and ε, and a
reduction over another axis is no norm. The permutation helpers are checked by hand.
"""

from __future__ import annotations

import numpy as np
import onnx
import onnxruntime as ort
import pytest
from onnx import helper

from oversmooth.importers.graph import Node, model_from_proto
from oversmooth.importers.match.limits import PROBE_BATCH, PROBE_SEQUENCE
from oversmooth.importers.match.norms import (
    NormMatcher,
    channels_first,
    channels_last,
    leading_permutation,
)
from oversmooth.importers.match.walker import MatchBasis
from oversmooth.simulator import tolerances as tol
from oversmooth.simulator.attention import layer_norm, rms_norm
from tests.importers.small_graph import SmallGraph

D = 8
EPS = 1e-6
GAMMA = np.linspace(0.5, 2.0, D)
BETA = np.linspace(-1.0, 1.0, D)


def _layer_norm(g: SmallGraph, x: str, axis: int = -1) -> str:
    """``(x - mean) / sqrt(mean((x - mean)^2) + eps) * γ + β``, opset 17 (axes as attributes)."""
    centred = g.op("Sub", x, g.op("ReduceMean", x, axes=[axis]))
    variance = g.op("ReduceMean", g.op("Pow", centred, g.const(2.0)), axes=[axis])
    normed = g.op("Div", centred, g.op("Sqrt", g.op("Add", variance, g.const(EPS))))
    return g.op("Add", g.op("Mul", normed, g.const(GAMMA)), g.const(BETA))


def _rms_norm(g: SmallGraph, x: str, *, div: bool = False) -> str:
    """Llama's ``x * 1/sqrt(mean(x·x) + eps) * γ``: Reciprocal, or ``Div(1, ·)`` where ``div``."""
    mean = g.op("ReduceMean", g.op("Mul", x, x), axes=[-1])
    root = g.op("Sqrt", g.op("Add", mean, g.const(EPS)))
    inverse = g.op("Div", g.const(1.0), root) if div else g.op("Reciprocal", root)
    return g.op("Mul", g.op("Mul", x, inverse), g.const(GAMMA))


def _norm_matcher(model: onnx.ModelProto) -> NormMatcher:
    basis = MatchBasis(model_from_proto(model).index, PROBE_BATCH, PROBE_SEQUENCE)
    return NormMatcher(basis, basis.shapes.context())


def _matcher(g: SmallGraph, out: str) -> tuple[NormMatcher, tuple[np.ndarray, np.ndarray]]:
    """The matcher over ``g``, a fixed input and onnxruntime's ``out`` for it."""
    model = g.model(out, D, ir_version=8)
    x = np.random.default_rng(3).standard_normal((2, 3, D)).astype(np.float32) * 3 + 1
    session = ort.InferenceSession(model.SerializeToString(), providers=["CPUExecutionProvider"])
    (value,) = session.run(None, {"x": x})
    return _norm_matcher(model), (x.astype(np.float64), value)


def test_a_decomposed_layer_norm_is_recognised_with_gamma_beta_and_eps() -> None:
    g = SmallGraph()
    out = _layer_norm(g, "x")
    matcher, (x, value) = _matcher(g, out)
    np.testing.assert_allclose(
        value, layer_norm(x, GAMMA, BETA, eps=EPS), rtol=tol.ORT_RTOL, atol=tol.ORT_ATOL
    )
    found = matcher.norm_ending_at(out)
    assert found is not None
    assert (found.kind, found.input, found.output) == ("layernorm", "x", out)
    np.testing.assert_array_equal(matcher.const(found.gamma), GAMMA.astype(np.float32))
    np.testing.assert_array_equal(matcher.const(found.beta), BETA.astype(np.float32))
    assert found.eps == pytest.approx(EPS, rel=1e-6)
    assert [node.split("#")[0] for node in found.nodes] == (
        "ReduceMean Sub Pow ReduceMean Add Sqrt Div Mul Add".split()
    )
    assert matcher.norm_starting_at("x") == found


@pytest.mark.parametrize("div", [False, True])
def test_an_rms_norm_is_recognised_with_gamma_and_no_beta(div: bool) -> None:
    g = SmallGraph()
    out = _rms_norm(g, "x", div=div)
    matcher, (x, value) = _matcher(g, out)
    np.testing.assert_allclose(
        value, rms_norm(x, GAMMA, eps=EPS), rtol=tol.ORT_RTOL, atol=tol.ORT_ATOL
    )
    found = matcher.norm_ending_at(out)
    assert found is not None
    assert (found.kind, found.input, found.beta) == ("rmsnorm", "x", None)
    np.testing.assert_array_equal(matcher.const(found.gamma), GAMMA.astype(np.float32))
    assert matcher.norm_starting_at("x") == found


def test_an_rms_norm_with_a_shift_is_no_norm_the_matcher_knows() -> None:
    """RMSNorm has no β: ``rms(x)·γ + β`` is neither of the two kinds."""
    g = SmallGraph()
    out = g.op("Add", _rms_norm(g, "x"), g.const(BETA))
    matcher, _ = _matcher(g, out)
    assert matcher.norm_ending_at(out) is None


def test_a_reduction_over_tokens_is_no_norm() -> None:
    """The same chain over axis 1 normalises each feature over the tokens: not a per-token norm."""
    g = SmallGraph()
    out = _layer_norm(g, "x", axis=1)
    matcher, _ = _matcher(g, out)
    assert matcher.norm_ending_at(out) is None
    assert matcher.norm_starting_at("x") is None


@pytest.mark.parametrize(
    ("op", "axis", "kind"),
    [
        ("LayerNormalization", -1, "layernorm"),
        ("LayerNormalization", 2, "layernorm"),
        ("LayerNormalization", 1, None),
        ("SimplifiedLayerNormalization", -1, "rmsnorm"),
    ],
)
def test_a_fused_norm_counts_over_the_last_axis_only(op: str, axis: int, kind: str | None) -> None:
    g = SmallGraph()
    out = g.op(op, "x", g.const(GAMMA), axis=axis)
    found = _norm_matcher(g.model(out, D)).norm_ending_at(out)
    assert (found.kind if found else None) == kind
    if found is not None:
        assert found.eps == 1e-5  # the operator's default
        assert found.beta is None


def test_a_skip_norms_unnamed_sum_gets_a_fresh_name() -> None:
    """SkipLayerNormalization's fourth output (input + skip) is named where the graph left it
    out, under a name no tensor of the graph has."""
    g = SmallGraph()
    skip = helper.make_node(
        "SkipLayerNormalization",
        ["x", "x", g.const(GAMMA), g.const(BETA)],
        ["normed"],
        domain="com.microsoft",
        name="skip",
    )
    taken = helper.make_node("Identity", ["normed"], ["skip/input_skip_bias_sum"])
    g.nodes += [skip, taken]
    model = g.model("skip/input_skip_bias_sum", D, opsets=(("", 17), ("com.microsoft", 1)))
    matcher = _norm_matcher(model)
    found = matcher.norm_ending_at("normed")
    assert found is not None
    assert (found.kind, found.input) == ("layernorm", "skip/input_skip_bias_sum_1")
    assert found.eps == 1e-12


@pytest.mark.parametrize(
    ("rank", "last", "first"),
    [(2, (), ()), (3, (0, 2, 1), (0, 2, 1)), (4, (0, 2, 3, 1), (0, 3, 1, 2))],
)
def test_channel_permutations_by_hand(rank: int, last: tuple, first: tuple) -> None:
    assert channels_last(rank) == last
    assert channels_first(rank) == first
    if rank >= 3:
        probe = np.arange(np.prod(range(2, rank + 2))).reshape(range(2, rank + 2))
        moved = probe.transpose(channels_last(rank)).transpose(channels_first(rank))
        np.testing.assert_array_equal(moved, probe)
        assert probe.transpose(channels_last(rank)).shape[-1] == probe.shape[1]


@pytest.mark.parametrize(
    ("op", "perm", "expected"),
    [
        ("Transpose", [1, 0, 2], (1, 0, 2)),
        ("Transpose", [2, 0, 1, 3], (2, 0, 1, 3)),
        ("Transpose", [0, 2, 1], None),
        ("Transpose", [0, 1, 2], None),
        ("Transpose", [1, 0], None),
        ("Identity", [1, 0, 2], None),
    ],
)
def test_leading_permutation_keeps_the_feature_axis_last(op, perm, expected) -> None:
    node = Node(0, helper.make_node(op, ["x"], ["y"], perm=perm))
    assert leading_permutation(node) == expected
