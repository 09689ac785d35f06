"""A post-LN block's residual sum before its norm (importers.audit.pre_norm_sums): which blocks
want it, what the runner is asked to read late, how the plan grows by the sums found, and the note
naming the blocks whose sum was not found, on the plain and the fused (``SkipLayerNormalization``)
post-LN graphs of tests/importers/stream_graphs.py."""

from __future__ import annotations

import dataclasses

import pytest

from oversmooth.importers.audit.layers import layer_tensors
from oversmooth.importers.audit.pre_norm_sums import PreNormSums, pre_norm_notes
from oversmooth.importers.match import AttentionBlock, find_attention_blocks
from oversmooth.importers.runtime.reductions import plan_reductions
from tests.importers.stream_graphs import build


def sums_of(layout: str, sublayers: list[int]) -> tuple[PreNormSums, list[AttentionBlock]]:
    """The sums of the two-block graph ``layout``, wanted for the blocks ``sublayers``."""
    model, _, _ = build(layout)
    blocks = find_attention_blocks(model).blocks
    plan = plan_reductions(model, layer_tensors(blocks))
    return PreNormSums(model, blocks, sublayers, plan), blocks


@pytest.mark.parametrize("layout", ["post", "skip_post"])
def test_post_ln_blocks_ask_for_each_sum_before_its_norm(layout: str) -> None:
    sums, blocks = sums_of(layout, [0, 1])
    assert sums.wanted == [0, 1]
    late = sums.outputs()
    assert late is not None
    assert dict(late.sums) == {block.residual_name: block.norm_output_name for block in blocks}
    assert sums.blocks == []  # nothing is known before the runner looked


def test_only_blocks_with_an_attention_sublayer_are_wanted() -> None:
    sums, blocks = sums_of("post", [1])
    assert sums.wanted == [1]
    assert list(sums.outputs().sums) == [blocks[1].residual_name]  # type: ignore[union-attr]


def test_pre_ln_blocks_want_nothing() -> None:
    sums, _ = sums_of("pre", [0, 1])
    assert sums.wanted == []
    assert sums.outputs() is None


def test_the_sums_found_extend_the_plan_after_its_layers() -> None:
    sums, blocks = sums_of("post", [0, 1])
    layers = sums.plan.layers
    late = sums.outputs()
    assert late is not None
    extension = late.extension([None, blocks[1].residual_name])  # block 0's sum was not found
    assert sums.blocks == [1]
    assert sums.plan.layers == (*layers, blocks[1].residual_name)
    assert extension is sums.plan.late
    assert extension.outputs  # the late statistics' outputs


def test_a_sum_not_found_is_noted_naming_its_block() -> None:
    _, blocks = sums_of("post", [0, 1])
    missing = {"not_found_after_optimisation": [blocks[1].residual_name]}
    (note,) = pre_norm_notes(blocks, missing)
    assert note.kind == "layers"
    assert note.text.startswith(
        "the attention sublayer of post-LN block(s) 1 is measured after the norm"
    )
    assert pre_norm_notes(blocks, {}) == []
    renumbered = [dataclasses.replace(block, index=block.index + 4) for block in blocks]
    both = {"not_found_after_optimisation": [block.residual_name for block in blocks]}
    assert "block(s) 4, 5 is measured" in pre_norm_notes(renumbered, both)[0].text
