"""n-bit block-quantised weights: our dequantisation against onnxruntime's own MatMulNBits kernel.

The oracle multiplies the identity by the quantised weight in onnxruntime itself: with ``A = I_K``,
``Y = A @ Ŵᵀ`` is the (K, N) weight as the runtime uses it.
"""

from __future__ import annotations

import numpy as np
import onnxruntime as ort
import pytest
from onnx import TensorProto, helper, numpy_helper

from oversmooth.importers.graph import model_from_proto
from oversmooth.importers.match import find_attention_blocks
from oversmooth.importers.nbits import dequantize_nbits, unpack_codes
from tests.importers.family_corpus import fixture_proto


def _nbits_model(K: int, N: int, bits: int, block_size: int, inits: dict[str, np.ndarray]):
    names = ["B", "scales", "zero_points"]
    node = helper.make_node(
        "MatMulNBits",
        ["A", *[name if name in inits else "" for name in names]],
        ["Y"],
        domain="com.microsoft",
        K=K,
        N=N,
        bits=bits,
        block_size=block_size,
    )
    while node.input and not node.input[-1]:
        node.input.pop()
    graph = helper.make_graph(
        [node],
        "nbits",
        [helper.make_tensor_value_info("A", TensorProto.FLOAT, [K, K])],
        [helper.make_tensor_value_info("Y", TensorProto.FLOAT, [K, N])],
        [numpy_helper.from_array(value, name) for name, value in inits.items()],
    )
    return helper.make_model(
        graph,
        ir_version=10,
        opset_imports=[helper.make_opsetid("", 17), helper.make_opsetid("com.microsoft", 1)],
    )


def _runtime_weight(K, N, bits, block_size, inits) -> np.ndarray:
    model = _nbits_model(K, N, bits, block_size, inits)
    session = ort.InferenceSession(model.SerializeToString(), providers=["CPUExecutionProvider"])
    (Y,) = session.run(None, {"A": np.eye(K, dtype=np.float32)})
    return Y


@pytest.mark.parametrize(
    ("K", "N", "bits", "block_size", "zero_points"),
    [
        (32, 24, 4, 16, "packed"),
        (32, 24, 4, 32, None),
        (40, 8, 4, 16, "packed"),  # K not a multiple of the block: the last block is cut
        (48, 16, 4, 16, "packed"),  # 3 blocks: zero points of a row fill 2 bytes, half the last
        (32, 16, 8, 16, "packed"),
        (32, 16, 8, 32, None),
        (32, 16, 2, 16, "packed"),
        (32, 24, 4, 16, "float"),
    ],
)
def test_dequantised_weight_is_what_onnxruntime_multiplies_by(K, N, bits, block_size, zero_points):
    rng = np.random.default_rng(K * N + bits + block_size)
    n_blocks = -(-K // block_size)
    blob = block_size * bits // 8
    inits: dict[str, np.ndarray] = {
        "B": rng.integers(0, 256, size=(N, n_blocks, blob), dtype=np.uint8),
        "scales": rng.uniform(0.01, 0.2, size=(N * n_blocks,)).astype(np.float32),
    }
    if zero_points == "packed":
        inits["zero_points"] = rng.integers(
            0, 256, size=(N * -(-n_blocks * bits // 8),), dtype=np.uint8
        )
    elif zero_points == "float":
        inits["zero_points"] = rng.uniform(-4, 12, size=(N * n_blocks,)).astype(np.float32)
    expected = _runtime_weight(K, N, bits, block_size, inits)
    found = dequantize_nbits(
        inits["B"],
        inits["scales"],
        inits.get("zero_points"),
        bits=bits,
        block_size=block_size,
        K=K,
        N=N,
    )
    assert found.shape == (K, N)
    np.testing.assert_allclose(found, expected, rtol=1e-6, atol=1e-6)


def test_codes_unpack_low_bits_first() -> None:
    packed = np.array([[0x21, 0xF3]], np.uint8)
    assert unpack_codes(packed, 4, 4).tolist() == [[1, 2, 3, 15]]
    assert unpack_codes(packed, 2, 8).tolist() == [[1, 0, 2, 0, 3, 0, 3, 3]]


@pytest.mark.parametrize("bits", [3, 16])
def test_undefined_code_widths_are_refused(bits) -> None:
    with pytest.raises(ValueError, match="codes are not defined"):
        unpack_codes(np.zeros((1, 2), np.uint8), bits, 1)


def test_sizes_that_disagree_with_the_attributes_are_refused() -> None:
    codes = np.zeros((8, 2, 8), np.uint8)
    with pytest.raises(ValueError, match="B has 128 bytes"):
        dequantize_nbits(codes, np.ones(16), None, bits=4, block_size=16, K=48, N=8)


def test_an_nbits_projection_with_act_order_indices_is_declined_by_name() -> None:
    """``g_idx`` (act-order quantisation) permutes the blocks: declined, never read as if absent."""
    proto = fixture_proto("bert/nbits.onnx.xz")
    node = next(n for n in proto.graph.node if n.op_type == "MatMulNBits" and "query" in n.name)
    K = next(a.i for a in node.attribute if a.name == "K")
    proto.graph.initializer.append(numpy_helper.from_array(np.zeros(K, np.int32), "g_idx_for_test"))
    while len(node.input) < 4:
        node.input.append("")
    node.input.append("g_idx_for_test")
    report = find_attention_blocks(model_from_proto(proto))
    assert len(report.blocks) == 1
    assert "has a g_idx input (act-order quantisation)" in report.failures[0].reason
