"""Partial and interleaved rotary embeddings (issue 11, cause D).

GPT-NeoX, Phi and Phi-3 rotate only the first ``rotary_dim`` columns of each head (``Slice`` →
rotate-half → ``Concat`` with the pass-through slice); GPT-J rotates every two columns
(``Concat(Unsqueeze(-x[1::2]), Unsqueeze(x[::2]))`` flattened by a ``Reshape``). The walk back from
Q and K passes both and reads W_Q / W_K before the rotary embedding; a Concat whose pieces do not
re-assemble the head-split tensor is not taken for a rotary embedding.
"""

from __future__ import annotations

import numpy as np
import pytest

from oversmooth.importers.graph import model_from_proto
from oversmooth.importers.match import NoAttentionBlocksError, find_attention_blocks
from oversmooth.importers.weights import block_weights
from tests.importers.small_graph import SmallGraph

D, HEADS, D_HEAD, ROTARY = 8, 2, 4, 2
BIG = 2**62


class _Graph(SmallGraph):
    def slice(self, x: str, start: int, end: int, step: int = 1) -> str:
        ints = [self.const([value], np.int64) for value in (start, end, 3, step)]
        return self.op("Slice", x, *ints)

    def rotate(self, x: str, style: str) -> str:
        if style == "half":
            half = ROTARY // 2
            first, second = self.slice(x, 0, half), self.slice(x, half, BIG)
            return self.op("Concat", self.op("Neg", second), first, axis=-1)
        axis = self.const([-1], np.int64)
        even, odd = self.slice(x, 0, BIG, 2), self.slice(x, 1, BIG, 2)
        stacked = self.op(
            "Concat",
            self.op("Unsqueeze", self.op("Neg", odd), axis),
            self.op("Unsqueeze", even, axis),
            axis=-1,
        )
        return self.op("Reshape", stacked, self.const([0, 0, 0, -1], np.int64))

    def rope(self, x: str, style: str, swap: bool) -> str:
        """Rotary embedding on the first ROTARY columns of the heads of ``x`` (b, h, s, d)."""
        angles = np.linspace(0.1, 0.7, ROTARY)
        rotated_part, passed = self.slice(x, 0, ROTARY), self.slice(x, ROTARY, BIG)
        rotated = self.op(
            "Add",
            self.op("Mul", rotated_part, self.const(np.cos(angles))),
            self.op("Mul", self.rotate(rotated_part, style), self.const(np.sin(angles))),
        )
        pieces = (passed, rotated) if swap else (rotated, passed)
        return self.op("Concat", *pieces, axis=-1)


def _model(style: str, swap: bool = False) -> tuple[object, dict[str, np.ndarray]]:
    rng = np.random.default_rng(0)
    weights = {
        role: rng.normal(scale=0.4, size=(D, D)).astype(np.float32) for role in ("q", "k", "v", "o")
    }
    g = _Graph()
    heads = g.const([0, 0, HEADS, D_HEAD], np.int64)

    def project(role: str) -> str:
        split = g.op("Reshape", g.op("MatMul", "x", g.const(weights[role])), heads)
        return g.op("Transpose", split, perm=[0, 2, 1, 3])

    q = g.rope(project("q"), style, swap)
    k_t = g.op("Transpose", g.rope(project("k"), style, swap), perm=[0, 1, 3, 2])
    v = project("v")
    scores = g.op("Mul", g.op("MatMul", q, k_t), g.const(D_HEAD**-0.5))
    proto = g.model(g.attend(scores, v, weights["o"], D), D)
    return model_from_proto(proto), weights


@pytest.mark.parametrize("style", ["half", "interleaved"])
def test_partial_rotary_is_walked(style: str) -> None:
    model, weights = _model(style)
    report = find_attention_blocks(model)
    assert len(report.blocks) == 1
    assert not report.failures
    block = report.blocks[0]
    assert (block.n_heads, block.d_head) == (HEADS, D_HEAD)
    expected = "rotate-half" if style == "half" else "interleaved"
    assert any(
        f"partial {expected} on the first {ROTARY} of {D_HEAD} columns" in note
        for note in block.notes
    ), block.notes
    read = block_weights(model, block)
    for role in ("q", "k", "v", "o"):  # W_Q and W_K before the rotary embedding
        np.testing.assert_allclose(getattr(read, f"W_{role.upper()}"), weights[role], rtol=1e-6)


def test_concat_that_reorders_the_head_is_declined() -> None:
    model, _weights = _model("half", swap=True)
    with pytest.raises(NoAttentionBlocksError, match="Q projection not found"):
        find_attention_blocks(model)
