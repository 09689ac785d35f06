"""The rotary-embedding operators (ONNX opset 23, onnxruntime's ``com.microsoft`` one) on Q and K.

The operator rotates Q and K in place, by position; like the decomposed rotary forms it is a
value-preserving step for the layout probe, so W_Q and W_K are read before it, and the block
reports ``rotary`` full or partial with the rotated width.
"""

from __future__ import annotations

import numpy as np
import onnx
import onnxruntime as ort
import pytest
from onnx import TensorProto, helper

from oversmooth.importers.graph import OnnxModel, model_from_proto
from oversmooth.importers.match import AttentionBlock, NoAttentionBlocksError, find_attention_blocks
from oversmooth.importers.weights import block_weights
from tests.importers.small_graph import SmallGraph

D, HEADS, D_HEAD, POSITIONS = 8, 2, 4, 16


def _model(width: int, interleaved: int, domain: str, **extra: float):
    rng = np.random.default_rng(width + interleaved)
    weights = {role: rng.normal(size=(D, D)).astype(np.float32) for role in "qkvo"}
    g = SmallGraph()
    half = (width or D_HEAD) // 2
    angles = np.arange(POSITIONS)[:, None] * 0.3 ** np.arange(half)[None, :]
    cos, sin = g.const(np.cos(angles)), g.const(np.sin(angles))
    heads = g.const([0, 0, HEADS, D_HEAD], np.int64)

    def rotated(role: str) -> str:
        x = g.op("MatMul", "x", g.const(weights[role]))
        inputs = [x, cos, sin, "position_ids"] if domain == "" else [x, "position_ids", cos, sin]
        g.count += 1
        out = f"rope{g.count}"
        g.nodes.append(
            helper.make_node(
                "RotaryEmbedding",
                inputs,
                [out],
                domain=domain,
                num_heads=HEADS,
                rotary_embedding_dim=width,
                interleaved=interleaved,
                **extra,
            )
        )
        return g.op("Reshape", out, heads)

    q = g.op("Transpose", rotated("q"), perm=[0, 2, 1, 3])
    k_t = g.op("Transpose", rotated("k"), perm=[0, 2, 3, 1])
    v = g.op(
        "Transpose",
        g.op("Reshape", g.op("MatMul", "x", g.const(weights["v"])), heads),
        perm=[0, 2, 1, 3],
    )
    scores = g.op("Mul", g.op("MatMul", q, k_t), g.const(D_HEAD**-0.5))
    opsets = [("", 23)] if domain == "" else [("", 17), (domain, 1)]
    positions = helper.make_tensor_value_info(
        "position_ids", TensorProto.INT64, ["batch", "sequence"]
    )
    proto = g.model(
        g.attend(scores, v, weights["o"], D), D, opsets=opsets, inputs=[positions], ir_version=10
    )
    return proto, weights


def _runs_and_matches(proto: onnx.ModelProto) -> tuple[OnnxModel, AttentionBlock]:
    """The graph runs in onnxruntime (finite outputs) and has exactly one matched block."""
    session = ort.InferenceSession(proto.SerializeToString(), providers=["CPUExecutionProvider"])
    feeds = {
        "x": np.random.default_rng(0).normal(size=(2, 5, D)).astype(np.float32),
        "position_ids": np.tile(np.arange(5), (2, 1)).astype(np.int64),
    }
    assert np.all(np.isfinite(session.run(None, feeds)[0]))  # a graph onnxruntime runs
    model = model_from_proto(proto)
    report = find_attention_blocks(model)
    assert not report.failures
    (block,) = report.blocks
    return model, block


@pytest.mark.parametrize("domain", ["", "com.microsoft"])
@pytest.mark.parametrize(("width", "interleaved"), [(0, 0), (0, 1), (2, 0)])
def test_a_rotary_operator_is_walked_and_reported(domain, width, interleaved) -> None:
    proto, weights = _model(width, interleaved, domain)
    model, block = _runs_and_matches(proto)
    assert (block.rotary, block.rotary_width) == (("partial", width) if width else ("full", D_HEAD))
    read = block_weights(model, block)
    for role in "qkvo":  # W_Q and W_K as they were before the rotation
        np.testing.assert_allclose(getattr(read, f"W_{role.upper()}"), weights[role], rtol=1e-6)


def test_a_rotary_operator_that_also_scales_is_declined_by_name() -> None:
    proto, _ = _model(0, 0, "com.microsoft", scale=0.5)
    with pytest.raises(
        NoAttentionBlocksError, match=r"also scales by 0\.5; expected a plain rotation"
    ):
        find_attention_blocks(model_from_proto(proto))


def _sliced_model(kept: int) -> tuple[object, dict[str, np.ndarray]]:
    """onnxruntime's optimizer on Phi-3: the operator rotates the first ``D_HEAD - kept`` columns
    of each head-split (B, N, S, H) Q/K, concatenated back with the other ``kept`` (Phi-3's full
    rotary leaves that slice empty)."""
    rng = np.random.default_rng(kept)
    weights = {role: rng.normal(size=(D, D)).astype(np.float32) for role in "qkvo"}
    g = SmallGraph()
    width = D_HEAD - kept
    angles = np.arange(POSITIONS)[:, None] * 0.3 ** np.arange(width // 2)[None, :]
    cos, sin = g.const(np.cos(angles)), g.const(np.sin(angles))
    heads = g.const([0, 0, HEADS, D_HEAD], np.int64)
    axis, cut, end = (g.const([value], np.int64) for value in (3, width, 2**62))

    def split(role: str) -> str:
        projected = g.op("MatMul", "x", g.const(weights[role]))
        return g.op("Transpose", g.op("Reshape", projected, heads), perm=[0, 2, 1, 3])

    def rotated(role: str) -> str:
        x = split(role)
        g.count += 1
        out = f"rope{g.count}"
        g.nodes.append(
            helper.make_node(
                "RotaryEmbedding",
                [g.op("Slice", x, g.const([0], np.int64), cut, axis), "position_ids", cos, sin],
                [out],
                domain="com.microsoft",
                num_heads=HEADS,
            )
        )
        return g.op("Concat", out, g.op("Slice", x, cut, end, axis), axis=-1)

    k_t = g.op("Transpose", rotated("k"), perm=[0, 1, 3, 2])
    scores = g.op("Mul", g.op("MatMul", rotated("q"), k_t), g.const(D_HEAD**-0.5))
    positions = helper.make_tensor_value_info(
        "position_ids", TensorProto.INT64, ["batch", "sequence"]
    )
    proto = g.model(
        g.attend(scores, split("v"), weights["o"], D),
        D,
        opsets=[("", 17), ("com.microsoft", 1)],
        inputs=[positions],
        ir_version=10,
    )
    return proto, weights


@pytest.mark.parametrize(("kept", "expected"), [(0, ("full", D_HEAD)), (2, ("partial", 2))])
def test_a_rotary_operator_on_a_head_slice_is_a_rotary_embedding(kept, expected) -> None:
    """Phi-3 after onnxruntime's optimizer (opt level 0): ``Concat(RotaryEmbedding(x[..., :w]),
    x[..., w:])`` is a full (empty pass-through) or partial rotary embedding of x."""
    proto, weights = _sliced_model(kept)
    model, block = _runs_and_matches(proto)
    assert (block.rotary, block.rotary_width) == expected
    read = block_weights(model, block)
    for role in "qkvo":
        np.testing.assert_allclose(getattr(read, f"W_{role.upper()}"), weights[role], rtol=1e-6)
