"""A post-LN block's residual sum before its norm (importers.audit.pre_norm_sums): which blocks
want it, what the runner is asked to read late, how the plan grows by the sums found (whose
blocks' norm outputs are then no longer measured, only returned row by row), and the note
naming the blocks whose sum was not found, on the plain and the fused (``SkipLayerNormalization``)
post-LN graphs of tests/importers/stream_graphs.py."""

from __future__ import annotations

import dataclasses

import numpy as np
import onnx
import pytest

from oversmooth.importers.audit.layers import layer_tensors
from oversmooth.importers.audit.pre_norm_sums import PreNormSums, pre_norm_notes
from oversmooth.importers.audit.session import attention_sublayer_tensor
from oversmooth.importers.match import AttentionBlock, find_attention_blocks
from oversmooth.importers.runtime.reductions import plan_reductions
from oversmooth.importers.runtime.runner import Runner
from tests.importers.stream_graphs import build


def sums_of(layout: str, sublayers: list[int]) -> tuple[PreNormSums, list[AttentionBlock]]:
    """The sums of the two-block graph ``layout``, wanted for the blocks ``sublayers``, whose
    norm outputs follow the layers in the plan (as the audit's session plans them)."""
    model, _, _ = build(layout)
    blocks = find_attention_blocks(model).blocks
    layers = layer_tensors(blocks)
    mids = [str(attention_sublayer_tensor(blocks[i])) for i in sublayers]
    plan = plan_reductions(model, [*layers, *mids], token_rows=True)
    return PreNormSums(model, blocks, sublayers, plan, first_sublayer=len(layers)), blocks


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
    found = [None, blocks[1].residual_name]  # block 0's sum was not found
    extension = late.extension(found, onnx.GraphProto())
    assert sums.blocks == [1]
    assert sums.plan.layers == (*layers, blocks[1].residual_name)
    assert extension is sums.plan.late
    assert extension.outputs  # the late statistics' outputs
    # block 1's norm output (plan layer 4: three layers, then blocks 0 and 1) is not measured
    # any more, but its rows still come back; block 0's stays measured after its norm
    plan = sums.plan
    assert plan.replaced == {4}
    assert not plan.computes(4)
    assert plan.computes(3)
    assert set(extension.replaces) == {plan.scalars_name(4), plan.gram_name(4)}
    assert plan.tokens_name(4) in plan.extension.output_names


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


def test_not_measuring_the_replaced_norm_outputs_changes_no_reported_number(
    monkeypatch: pytest.MonkeyPatch, tmp_path
) -> None:
    """A post-LN builder model audited as it is, and with the norm outputs still measured (the
    late plan told to replace nothing): the first session's graph loses the nodes of the
    replaced statistics, and every metric, every attention-sublayer figure and every dominance
    case is the same, bit for bit."""
    import numpy as np
    import onnx

    from oversmooth.importers.audit import pre_norm_sums
    from oversmooth.importers.audit.pipeline import audit
    from oversmooth.importers.runtime import graph_edits
    from tests.importers.audited import builder_model_and_inputs

    removed: list[int] = []
    drop = graph_edits.drop_outputs
    monkeypatch.setattr(
        graph_edits, "drop_outputs", lambda graph, names: removed.append(drop(graph, names))
    )
    model, inputs = builder_model_and_inputs("bert_legacy")
    path = tmp_path / "post_ln.onnx"
    onnx.save(model.proto, path)
    lean = audit(path, inputs, provider="cpu", cache=False)
    extend = pre_norm_sums.extend_plan

    def replacing_nothing(*args, **kwargs):  # type: ignore[no-untyped-def]
        return extend(*args, **{**kwargs, "replacing": ()})

    monkeypatch.setattr(pre_norm_sums, "extend_plan", replacing_nothing)
    full = audit(path, inputs, provider="cpu", cache=False)
    assert removed[0] > 0  # the lean session's replaced statistics were never computed
    assert removed[1:] == [0]
    for name in full.metrics:
        np.testing.assert_array_equal(lean.metrics[name], full.metrics[name], err_msg=name)
        np.testing.assert_array_equal(
            lean.attention_part[name], full.attention_part[name], err_msg=name
        )
    assert [c.row() for c in lean.dominance] == [c.row() for c in full.dominance]


@pytest.mark.parametrize("layout", ["post", "skip_post"])
def test_the_late_gram_matrices_are_the_optimisers_product_of_one_tensor_with_itself(
    layout: str,
) -> None:
    """The late nodes run unoptimised: their Gram matrices are written in the form onnxruntime
    gave the first extension's (a ``FusedMatMul`` reading ``Xm`` twice, not a ``Transpose`` pass
    and a ``MatMul``), with every late output the same bits as the plain form's."""
    model, x, _ = build(layout)
    runs = {}
    for form in ("optimised", "plain"):
        sums, _ = sums_of(layout, [0, 1])
        late = sums.outputs()
        assert late is not None
        if form == "plain":  # as if onnxruntime had kept the MatMul of a transposed copy
            late = dataclasses.replace(
                late, extension=lambda found, _, own=sums._extension: own(found, onnx.GraphProto())
            )
        runner = Runner(model, expose=[], extension=sums.plan.extension, late=late, provider="cpu")
        grams = [n for n in sums.plan.late.nodes if n.output[0].endswith(".gram")]
        feeds = {"x": x, **sums.plan.rows_feed(np.ones(len(x)))}
        runs[form] = (runner.collect(feeds), sums.plan.late, grams)
    (optimised, late, grams), (plain, plain_late, plain_grams) = runs["optimised"], runs["plain"]
    assert len(grams) == len(sums.blocks) > 0
    assert {(n.op_type, n.domain) for n in grams} == {("FusedMatMul", "com.microsoft")}
    assert all(n.input[0] == n.input[1] for n in grams)
    assert {n.op_type for n in plain_grams} == {"MatMul"}
    assert len(late.nodes) == len(plain_late.nodes) - len(grams)  # one Transpose fewer each
    for name in late.output_names:
        np.testing.assert_array_equal(optimised[name], plain[name])
