"""Routes of issue 26 beyond the corpus check (``test_families``): each structure the walk now
passes is passed only in the form that keeps every entry in place, and its note says so.

The fixtures are the corpus's own (``tests/fixtures/families/``, docs/fixtures.md); a test here
edits one of them where it shows that a look-alike graph is still refused.
"""

from __future__ import annotations

import onnx
import pytest

from importers.graph import model_from_proto
from importers.match import NoAttentionBlocksError, find_attention_blocks
from tests.importers.family_corpus import FIXTURES, fixture_proto, load_fixture


def _per_head_concats(proto: onnx.ModelProto) -> list[onnx.NodeProto]:
    """The Concats joining one LayerNormalization per head (StableLM's qk_layernorm)."""
    producers = {output: node for node in proto.graph.node for output in node.output}
    return [
        node
        for node in proto.graph.node
        if node.op_type == "Concat"
        and len(node.input) > 1
        and all(
            name in producers and producers[name].op_type == "LayerNormalization"
            for name in node.input
        )
    ]


@pytest.mark.parametrize("variant", ["legacy_eager", "dynamo_eager"])
def test_per_head_qk_norms_are_passed_and_noted(variant: str) -> None:
    """StableLM's qk_layernorm (a Split into heads, one LayerNorm each, a Concat) is a Q/K norm:
    both blocks are found and both say that W_Q and W_K are read before a per-head norm."""
    report = find_attention_blocks(load_fixture(f"stablelm/{variant}.onnx.xz"))
    assert len(report.blocks) == 2
    assert not report.unmatched
    for block in report.blocks:
        notes = [note for note in block.notes if note.startswith("Q/K normalised")]
        assert len(notes) == 1, block.notes
        assert notes[0].count("per-head layernorm") == 2, block.notes


def test_per_head_norms_joined_out_of_order_are_refused() -> None:
    """The same Concat with two heads swapped moves entries between heads: not a norm step, so
    the Q projection is not found (one line naming the Concat), never read as if in place."""
    file = "stablelm/legacy_eager.onnx.xz"
    proto = fixture_proto(file)
    concats = _per_head_concats(proto)
    assert len(concats) == 4  # Q and K of two blocks
    for concat in concats:
        concat.input[0], concat.input[1] = concat.input[1], concat.input[0]
    with pytest.raises(NoAttentionBlocksError, match="reached Concat"):
        find_attention_blocks(model_from_proto(proto, path=FIXTURES / file))
