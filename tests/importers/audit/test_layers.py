"""Which tensors an audit records as layers (importers.audit.layers): block 0's input, then every
block's output, checked against the chain of blocks.

On the stream tests' two-block graphs (tests/importers/stream_graphs.py), with block records
changed where a case needs it: a broken chain is refused (noted with ``partial``), a chain broken
by a block skipped by design (a windowed layer) is noted, layers that begin before earlier
residual sub-layers are noted, and two layers on one tensor are refused. That the layers are the
residual stream a forward pass computes is tested in match/test_stream.py. A batch item left with
fewer than 2 counted tokens is refused by its label; the metrics per layer (``measure_layers``)
are tested through the audits of runtime/test_reductions.py and audit/test_session.py.
"""

from __future__ import annotations

import dataclasses

import numpy as np
import pytest

from oversmooth.importers.audit.layers import check_counted_tokens, layer_tensors
from oversmooth.importers.errors import ImporterInputError, LayerStreamError
from oversmooth.importers.graph import OnnxModel, model_from_proto
from oversmooth.importers.match import find_attention_blocks
from oversmooth.importers.weights import BlockWeights, block_weights
from tests.importers.head_split_blocks import windowed_decoder
from tests.importers.stream_graphs import build


def _blocks(model: OnnxModel) -> list[BlockWeights]:
    return [block_weights(model, block) for block in find_attention_blocks(model).blocks]


def test_the_layers_are_block_zeros_input_then_every_blocks_output() -> None:
    model, _, _ = build("post")
    blocks = _blocks(model)
    notes: list[str] = []
    assert layer_tensors(blocks, notes) == [
        blocks[0].input_name,
        blocks[0].output_name,
        blocks[1].output_name,
    ]
    assert notes == []  # a plain chain says nothing


def test_a_layer_that_is_not_the_next_blocks_input_is_refused() -> None:
    model, _, _ = build("pre")
    blocks = _blocks(model)
    wrong = [dataclasses.replace(blocks[0], output_name=blocks[0].residual_name), blocks[1]]
    with pytest.raises(LayerStreamError, match="layer 1 would not be the residual stream"):
        layer_tensors(wrong)
    notes: list[str] = []
    assert layer_tensors(wrong, notes, partial=True)[1] == blocks[0].residual_name
    assert "block 1 reads" in notes[0]
    assert LayerStreamError.exit_code == 1


def test_a_block_skipped_by_design_between_two_blocks_is_noted_not_refused() -> None:
    """The windowed middle block is declined: the chain from block 0 to block 2 breaks across it."""
    model = model_from_proto(windowed_decoder())
    report = find_attention_blocks(model)
    skipped = [failure.softmax for failure in report.skipped]
    assert len(report.blocks) == 2
    assert len(skipped) == 1
    with pytest.raises(LayerStreamError, match="layer 1 would not be the residual stream"):
        layer_tensors(report.blocks)
    with pytest.raises(LayerStreamError):  # the graph is needed to see what lies between
        layer_tensors(report.blocks, skipped=skipped)
    notes: list[str] = []
    names = layer_tensors(report.blocks, notes, skipped=skipped, index=model.index)
    assert names[1] == report.blocks[0].output_name  # "the latter" of the mismatch
    assert len(notes) == 1
    assert f"the block(s) skipped by design {skipped[0]!r} lie between them" in notes[0]
    assert notes[0].endswith("outside every layer; layer 1 uses the latter")


def test_layers_that_begin_before_earlier_sub_layers_are_noted() -> None:
    model, _, _ = build("pre")
    blocks = _blocks(model)
    conformer = [
        dataclasses.replace(blocks[0], attention_input_name="half_step_ffn_out"),
        blocks[1],
    ]
    notes: list[str] = []
    assert layer_tensors(conformer, notes) == layer_tensors(blocks)
    (note,) = notes
    assert note.startswith("residual sub-layers come before the attention inside each layer")
    assert "'half_step_ffn_out' in block 0" in note


def test_two_layers_on_one_tensor_are_refused() -> None:
    model, _, _ = build("pre")
    blocks = _blocks(model)
    same = [blocks[0], dataclasses.replace(blocks[1], output_name=blocks[0].output_name)]
    with pytest.raises(LayerStreamError, match="two layers would read the same tensor"):
        layer_tensors(same)


def test_a_block_whose_stream_is_unknown_is_refused_before_the_chain() -> None:
    model, _, _ = build("pre")
    blocks = _blocks(model)
    lost = [blocks[0], dataclasses.replace(blocks[1], stream_error="its MLP sum was not found")]
    with pytest.raises(LayerStreamError) as info:
        layer_tensors(lost, partial=True)
    assert str(info.value) == (
        "layer 2 (the output of block 1) cannot be read: its MLP sum was not found"
    )


def test_an_item_with_fewer_than_two_counted_tokens_is_refused_by_its_label() -> None:
    check_counted_tokens(np.array([2.0, 5.0]), ["a", "b"])
    long = "x" * 50
    with pytest.raises(ImporterInputError, match=r"input 'xxx.*\.\.\.' keeps 1 token\(s\)"):
        check_counted_tokens(np.array([3.0, 1.0]), ["a", long])
