"""The head layout probe's arithmetic (:mod:`oversmooth.importers.match.layout`): the encoded
probe, the decoding of (batch, head) from its positions, the key/value head grouping, static
head-split sizes, and the feature-axis moves of Einsum and Conv projections.

Whole graphs through the probe are tested in ``test_variants`` (every builder variant's heads and
W_O row order are the builder's own).
"""

from __future__ import annotations

import numpy as np
import pytest
from numpy.testing import assert_array_equal

from oversmooth.importers.graph import model_from_proto
from oversmooth.importers.match.layout import (
    LayoutProbe,
    _group_heads,
    _Heads,
    _static_sizes,
    features_last,
    placed,
)
from oversmooth.importers.match.limits import PROBE_BATCH, PROBE_SEQUENCE
from oversmooth.importers.match.results import LinearMatch
from oversmooth.importers.match.walker import MatchBasis, RejectError
from tests.importers.small_graph import SmallGraph


@pytest.fixture(scope="module")
def probe() -> LayoutProbe:
    """A layout probe over a one-op graph (head_columns reads nothing of the graph)."""
    g = SmallGraph()
    model = g.model(g.op("Identity", "x"), 4)
    basis = MatchBasis(model_from_proto(model).index, PROBE_BATCH, PROBE_SEQUENCE)
    return LayoutProbe(basis, basis.shapes.context())


def _heads(columns: list[list[int]]) -> _Heads:
    rows = len(columns)
    return _Heads(np.array(columns), np.arange(rows), np.zeros(rows, np.int64))


def test_the_encoded_probe_numbers_position_then_column() -> None:
    """Entry (b, t, c) of a (2, 3) x 4 probe is (3b + t) * 4 + c: every entry distinct."""
    value = LayoutProbe.encoded((2, 3), 4)
    assert value.shape == (2, 3, 4)
    assert value.dtype == np.float64
    b, t, c = np.meshgrid(np.arange(2), np.arange(3), np.arange(4), indexing="ij")
    assert_array_equal(value, (3 * b + t) * 4 + c)


def test_untransposed_tells_where_the_columns_run() -> None:
    """True exactly when the column index (entry mod width) is constant along the last axis, i.e.
    the features sit on axis -2: an encoded (tokens, 4) probe is not, its swap (4, tokens) is."""
    value = LayoutProbe.encoded((1, 3), 4)
    assert not LayoutProbe.untransposed(value, 4)
    assert LayoutProbe.untransposed(np.swapaxes(value, -1, -2), 4)


def test_grouped_query_heads_share_key_value_heads_in_order(probe: LayoutProbe) -> None:
    """Four query heads of width 2 over two K/V heads: heads 0-1 use K/V head 0, heads 2-3 head 1."""
    q = _heads([[0, 1], [2, 3], [4, 5], [6, 7]])
    kv = _heads([[0, 1], [0, 1], [2, 3], [2, 3]])
    found = probe.head_columns(q, kv, kv)
    assert found["n_kv_heads"] == 2
    assert_array_equal(found["q"], np.arange(8))
    assert_array_equal(found["k"], [0, 1, 2, 3])
    assert_array_equal(found["v"], [0, 1, 2, 3])


@pytest.mark.parametrize(
    ("q", "k", "v", "reason"),
    [
        ([[0, 1], [2, 3]], [[0, 1, 2], [3, 4, 5]], [[0, 1], [2, 3]], "head sizes differ"),
        ([[0, 1], [1, 2]], [[0, 1], [2, 3]], [[0, 1], [2, 3]], "query heads read overlapping"),
        (
            [[0, 1], [2, 3], [4, 5], [6, 7]],
            [[0, 1], [2, 3], [0, 1], [2, 3]],
            [[0, 1], [2, 3], [0, 1], [2, 3]],
            "not grouped contiguously",
        ),
        (
            [[0, 1], [2, 3], [4, 5]],
            [[0, 1], [0, 1], [2, 3]],
            [[0, 1], [0, 1], [2, 3]],
            "cannot share 2 K heads evenly",
        ),
        (
            [[0, 1], [2, 3]],
            [[0, 1], [2, 3]],
            [[0, 1], [0, 1]],
            "K has 2 distinct heads but V has 1",
        ),
    ],
)
def test_a_head_layout_the_theory_cannot_read_is_refused(
    probe: LayoutProbe, q: list, k: list, v: list, reason: str
) -> None:
    with pytest.raises(RejectError, match=reason):
        probe.head_columns(_heads(q), _heads(k), _heads(v))


def test_placed_and_features_last_undo_each_other_for_a_conv() -> None:
    """A 1x1 Conv writes its 6 features on axis 1 of (batch, channels, tokens); features_last
    moves them back, so a probe placed and read again is the probe."""
    conv = LinearMatch("conv", "x", "w", "y", 6, 6, channel_axis=1)
    value = np.arange(2 * 3 * 6, dtype=np.float64).reshape(2, 3, 6)
    written = placed(value, conv)
    assert_array_equal(written, value.transpose(0, 2, 1))
    assert_array_equal(features_last(written, conv), value)


def test_an_einsum_writes_its_features_in_the_shape_it_names() -> None:
    """``...d,dhk->...hk`` writes 6 features as (2 heads, 3); read back over two axes they are
    the 6 features in order."""
    einsum = LinearMatch("einsum", "x", "w", "y", 4, 6, out_dims=(2, 3), in_axes=2)
    value = np.arange(5 * 6, dtype=np.float64).reshape(5, 6)
    written = placed(value, einsum)
    assert_array_equal(written, value.reshape(5, 2, 3))
    assert_array_equal(features_last(written, einsum), value)


# Moved from tests/importers/match/test_variants.py.
def test_a_time_major_stream_is_decoded_and_a_mixed_one_refused():
    """A stream kept as (tokens, batch, features) (nn.TransformerEncoder without batch_first)
    numbers its positions t·B + b: each attention row is still one sequence's tokens in order, so
    it decodes, flagged time-major; positions that are neither layout are refused."""
    batch, heads, tokens = 2, 2, 3
    item = np.repeat(np.arange(batch), heads)
    columns = np.tile(np.arange(heads * 4).reshape(heads, 4), (batch, 1))
    time_major = np.arange(tokens)[None, :] * batch + item[:, None]
    decoded = _group_heads(columns, time_major, tokens, "Q")
    assert decoded.time_major
    assert_array_equal(decoded.batch_of, item)
    assert_array_equal(decoded.head_of, np.tile(np.arange(heads), batch))
    assert not _group_heads(
        columns, item[:, None] * tokens + np.arange(tokens), tokens, "Q"
    ).time_major
    mixed = (item[:, None] * tokens + np.arange(tokens)[None, :])[:, ::-1]
    with pytest.raises(RejectError, match="mixes tokens"):
        _group_heads(columns, mixed, tokens, "Q")


@pytest.mark.parametrize(
    ("target", "width", "sizes"),
    [([1, 197, 12, 64], 768, (1, 197)), ([8, 8, 8], 32, (8, 2)), ([8, 8, 8], 24, None)],
)
def test_static_head_split_targets_spell_out_the_probe_sizes(target, width, sizes):
    """(batch, sequence) read off a head split baked at the traced sizes: (B, T, H, dh), or
    nn.MultiheadAttention's (T, B·H, dh) with the heads folded into the second axis (in the
    projection's layout; the probe swaps them back for a (tokens, batch) view)."""
    value = np.zeros((2, 3, width))
    assert _static_sizes(np.array(target), value) == sizes
