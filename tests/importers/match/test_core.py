"""The Softmax-anchored walk (:mod:`oversmooth.importers.match.core`): one hand-built block read
whole, the walk forward to the ·V MatMul, the Softmax axis check, and the notes on the score
scale and rotary form, each against an answer worked out by hand.

The builder variants (``test_variants``) and the attempt semantics (``test_attempts``) test the
walk on many exporters' forms.
"""

from __future__ import annotations

import math

import numpy as np
import onnx
import pytest
from numpy.testing import assert_array_equal
from onnx import helper

from oversmooth.importers.graph import Node, model_from_proto
from oversmooth.importers.match.codes import RejectCode
from oversmooth.importers.match.core import SCALE_RTOL, Matcher
from oversmooth.importers.match.limits import PROBE_BATCH, PROBE_SEQUENCE
from oversmooth.importers.match.projections import Trace
from oversmooth.importers.match.results import LinearMatch
from oversmooth.importers.match.scores import ScoreBias
from oversmooth.importers.match.walker import MatchBasis, RejectError
from tests.importers.small_graph import SmallGraph

D, HEADS, D_HEAD = 8, 2, 4
NO_BIAS = ScoreBias("none", False, 0, ())


def _matcher(model: onnx.ModelProto) -> Matcher:
    return Matcher(MatchBasis(model_from_proto(model).index, PROBE_BATCH, PROBE_SEQUENCE))


def _heads(g: SmallGraph, weight: np.ndarray, perm: list[int]) -> str:
    split = g.op(
        "Reshape", g.op("MatMul", "x", g.const(weight)), g.const([0, 0, HEADS, D_HEAD], np.int64)
    )
    return g.op("Transpose", split, perm=perm)


def _block(scale: float) -> tuple[onnx.ModelProto, dict[str, np.ndarray]]:
    """``x + merge(Softmax(scale · Q Kᵀ) V) W_O`` with two heads of four."""
    rng = np.random.default_rng(7)
    weights = {key: rng.standard_normal((D, D)) for key in ("Q", "K", "V", "O")}
    g = SmallGraph()
    q = _heads(g, weights["Q"], [0, 2, 1, 3])
    k = _heads(g, weights["K"], [0, 2, 3, 1])
    v = _heads(g, weights["V"], [0, 2, 1, 3])
    scores = g.op("Mul", g.op("MatMul", q, k), g.const(scale))
    out = g.attend(scores, v, weights["O"], D)
    return g.model(out, D), weights


def test_a_hand_built_block_is_read_whole() -> None:
    model, weights = _block(1 / math.sqrt(D_HEAD))
    matcher = _matcher(model)
    (softmax,) = matcher.index.nodes_of_type("Softmax")
    block = matcher.match(softmax, 0)
    assert (block.n_heads, block.n_kv_heads, block.d_head, block.d_model) == (2, 2, 4, 8)
    assert block.scale == pytest.approx(0.5, rel=1e-7)
    assert (block.norm, block.rotary, block.score_bias, block.causal) == (
        "none",
        "none",
        "none",
        False,
    )
    assert block.notes == ()
    for key in ("Q", "K", "V", "O"):
        stored = matcher.const(block.sources[f"W_{key}"])
        assert_array_equal(stored, weights[key].astype(np.float32))
    assert_array_equal(block.q_columns, np.arange(D))
    assert_array_equal(block.o_rows, np.arange(D))
    assert block.attention_name == softmax.outputs[0]


def test_a_scale_off_one_over_root_d_head_is_noted() -> None:
    model, _ = _block(1.0)
    matcher = _matcher(model)
    (softmax,) = matcher.index.nodes_of_type("Softmax")
    (note,) = matcher.match(softmax, 0).notes
    assert note.startswith("score scale 1 differs from 1/sqrt(d_head) = 0.5")


@pytest.mark.parametrize(
    ("scale", "bias", "expected"),
    [
        (1 / 8, NO_BIAS, None),
        (1 / 8 * (1 + SCALE_RTOL / 2), NO_BIAS, None),
        (1 / 8 * (1 + 3 * SCALE_RTOL), NO_BIAS, "differs from 1/sqrt(d_head) = 0.125"),
        (1 / math.sqrt(64 * 3), NO_BIAS, "; it is 1/sqrt(d_head * 3)"),
        (
            1 / math.sqrt(64 * 3),
            ScoreBias("disentangled", False, 2, ()),
            "disentangled attention with 2 position terms",
        ),
        (1.0, NO_BIAS, "(d_head 64 taken from the head-split Reshape)"),
    ],
)
def test_scale_notes_by_hand(scale: float, bias: ScoreBias, expected: str | None) -> None:
    """d_head 64: 1/8 is expected (within SCALE_RTOL); 1/sqrt(192) is named as d_head * 3, and
    as DeBERTa's scale when two disentangled position terms are added."""
    notes = Matcher.scale_notes(scale, 64, bias)
    if expected is None:
        assert notes == ()
    else:
        (note,) = notes
        assert expected in note
    if scale == 1.0:
        assert "it is 1/sqrt" not in notes[0]


def _trace(rope: bool, width: int | None = None) -> Trace:
    linear = LinearMatch("matmul", "x", "w", "y", D, D)
    return Trace("Q", linear, (), 1.0, rope, "full rotate-half" if rope else "", width)


@pytest.mark.parametrize(
    ("q", "k", "form"),
    [
        (_trace(False), _trace(False), ("none", 0)),
        (_trace(True), _trace(True), ("full", 64)),
        (_trace(True, 16), _trace(True, 32), ("partial", 32)),
        (_trace(False), _trace(True, 16), ("partial", 16)),
    ],
)
def test_rotary_form_by_hand(q: Trace, k: Trace, form: tuple) -> None:
    assert Matcher.rotary_form(q, k, 64) == form


@pytest.mark.parametrize(
    ("axis", "code"),
    [(-1, None), (3, None), (1, RejectCode.SOFTMAX_AXIS), (-2, RejectCode.SOFTMAX_AXIS)],
)
def test_only_a_softmax_over_the_keys_is_attention(axis: int, code) -> None:
    model, _ = _block(0.5)
    matcher = _matcher(model)
    softmax = Node(0, helper.make_node("Softmax", ["s"], ["a"], axis=axis), 17)
    if code is None:
        matcher.check_softmax_axis(softmax, 4)
    else:
        with pytest.raises(RejectError, match=f"Softmax axis is {axis}") as raised:
            matcher.check_softmax_axis(softmax, 4)
        assert raised.value.code == code


def test_a_softmax_axis_that_is_no_integer_is_malformed() -> None:
    model, _ = _block(0.5)
    softmax = Node(0, helper.make_node("Softmax", ["s"], ["a"], axis=1.5), 17)
    with pytest.raises(RejectError, match="expected an integer axis") as raised:
        _matcher(model).check_softmax_axis(softmax, 4)
    assert raised.value.code == RejectCode.MALFORMED


def test_the_walk_to_v_passes_casts_and_dropout_and_names_what_it_found() -> None:
    g = SmallGraph()
    probs = g.op("Softmax", "x", axis=-1)
    passed = g.op("Dropout", g.op("Cast", probs, to=1))
    g.op("MatMul", passed, "x")
    matcher = _matcher(g.model(g.nodes[-1].output[0], D))
    (softmax,) = matcher.index.nodes_of_type("Softmax")
    path = matcher.value_matmul(softmax)
    assert [step.split()[0] for step in path.passed] == ["Cast", "Dropout"]
    assert (path.attention, path.mix) == (probs, None)
    assert path.matmul.input(0) == passed
    g = SmallGraph()
    out = g.op("ReduceSum", g.op("Softmax", "x", axis=-1), keepdims=0)
    matcher = _matcher(g.model(out, D))
    (softmax,) = matcher.index.nodes_of_type("Softmax")
    with pytest.raises(RejectError, match=r"goes to ReduceSum 'ReduceSum#1'") as raised:
        matcher.value_matmul(softmax)
    assert raised.value.code == RejectCode.VALUE_MATMUL_MISSING
