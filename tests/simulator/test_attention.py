"""Softmax, LayerNorm (against the ONNX reference implementation), RMSNorm and attention matrices."""

from __future__ import annotations

import numpy as np
import pytest
from hypothesis import given
from hypothesis import strategies as st
from onnx import TensorProto, helper
from onnx.reference import ReferenceEvaluator

from oversmooth.simulator.attention import attention_matrix, layer_norm, rms_norm, softmax
from oversmooth.simulator.errors import InputError
from oversmooth.simulator.tolerances import FLOAT32_ATOL, FLOAT32_RTOL, STEP_ATOL, STEP_RTOL

sizes = st.integers(min_value=1, max_value=8)
seeds = st.integers(min_value=0, max_value=2**32 - 1)


@given(rows=sizes, cols=sizes, seed=seeds, spread=st.floats(0.1, 50.0))
def test_softmax_rows_are_distributions(rows, cols, seed, spread):
    S = spread * np.random.default_rng(seed).standard_normal((rows, cols))
    P = softmax(S)
    assert np.all(P >= 0)
    np.testing.assert_allclose(P.sum(axis=-1), 1.0, rtol=0, atol=STEP_ATOL)


@given(rows=sizes, cols=sizes, seed=seeds, shift=st.floats(-1e3, 1e3))
def test_softmax_is_shift_invariant_per_row(rows, cols, seed, shift):
    rng = np.random.default_rng(seed)
    S = rng.standard_normal((rows, cols))
    shifts = shift * rng.standard_normal((rows, 1))
    np.testing.assert_allclose(softmax(S + shifts), softmax(S), rtol=STEP_RTOL, atol=STEP_ATOL)


def test_softmax_does_not_overflow():
    P = softmax(np.array([[1e300, 0.0, -1e300]]))
    np.testing.assert_array_equal(P, [[1.0, 0.0, 0.0]])


def _onnx_layer_norm(X, gamma, beta, eps):
    """One LayerNormalization node run by onnx.reference (the operator's reference semantics)."""
    shape = list(X.shape)
    node = helper.make_node(
        "LayerNormalization", ["X", "scale", "bias"], ["Y"], axis=-1, epsilon=eps
    )
    graph = helper.make_graph(
        [node],
        "layer_norm",
        [
            helper.make_tensor_value_info("X", TensorProto.FLOAT, shape),
            helper.make_tensor_value_info("scale", TensorProto.FLOAT, [shape[-1]]),
            helper.make_tensor_value_info("bias", TensorProto.FLOAT, [shape[-1]]),
        ],
        [helper.make_tensor_value_info("Y", TensorProto.FLOAT, shape)],
    )
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])
    return ReferenceEvaluator(model).run(None, {"X": X, "scale": gamma, "bias": beta})[0]


@given(
    n=sizes,
    d=st.integers(min_value=2, max_value=16),
    seed=seeds,
    sign=st.sampled_from([1.0, -1.0]),
    eps=st.sampled_from([1e-5, 1e-6, 1e-12]),
)
def test_layer_norm_matches_onnx_reference(n, d, seed, sign, eps):
    rng = np.random.default_rng(seed)
    X = (3.0 * rng.standard_normal((n, d)) + rng.standard_normal()).astype(np.float32)
    gamma = (sign * np.abs(rng.standard_normal(d))).astype(np.float32)
    beta = rng.standard_normal(d).astype(np.float32)
    expected = _onnx_layer_norm(X, gamma, beta, eps)
    got = layer_norm(X.astype(np.float64), gamma, beta, eps=eps)
    # The float32 reference rounds x and its mean to ε₃₂|x| before subtracting, so its error is
    # amplified by each row's κ = max|x| / sqrt(var + eps) (two nearly equal entries of d = 2
    # gave κ = 625 and an error of 5.9e-5): the tolerance grows with κ, a few ε₃₂ per unit.
    X64 = X.astype(np.float64)
    kappa = np.abs(X64).max(axis=-1, keepdims=True) / np.sqrt(X64.var(axis=-1, keepdims=True) + eps)
    rounding = 8 * np.finfo(np.float32).eps * kappa * np.abs(gamma)
    assert np.all(
        np.abs(got - expected) <= FLOAT32_ATOL + rounding + FLOAT32_RTOL * np.abs(expected)
    )


@given(n=sizes, d=st.integers(min_value=2, max_value=8), seed=seeds, c=st.floats(0.01, 10.0))
def test_layer_norm_gamma_sign_flips_the_output(n, d, seed, c):
    rng = np.random.default_rng(seed)
    X = rng.standard_normal((n, d))
    gamma = c * np.abs(rng.standard_normal(d))
    np.testing.assert_array_equal(layer_norm(X, -gamma), -layer_norm(X, gamma))
    np.testing.assert_array_equal(layer_norm(-X, gamma), -layer_norm(X, gamma))


def test_layer_norm_uses_the_biased_variance(rng):
    X = rng.standard_normal((3, 5))
    Y = layer_norm(X, eps=0.0)
    np.testing.assert_allclose(Y.mean(axis=-1), 0.0, atol=STEP_ATOL)
    np.testing.assert_allclose(Y.var(axis=-1), 1.0, rtol=STEP_RTOL)


@given(n=sizes, d=sizes, seed=seeds)
def test_rms_norm_formula(n, d, seed):
    rng = np.random.default_rng(seed)
    X = rng.standard_normal((n, d))
    gamma = rng.standard_normal(d)
    expected = X / np.sqrt((X**2).sum(axis=-1, keepdims=True) / d + 1e-5) * gamma
    np.testing.assert_allclose(rms_norm(X, gamma), expected, rtol=STEP_RTOL, atol=STEP_ATOL)


@given(n=st.integers(2, 8), d=sizes, k=sizes, seed=seeds)
def test_attention_matrix_is_row_stochastic_softmax(n, d, k, seed):
    rng = np.random.default_rng(seed)
    X = rng.standard_normal((n, d))
    W_Q, W_K = rng.standard_normal((d, k)), rng.standard_normal((d, k))
    A = attention_matrix(X, W_Q, W_K)
    assert np.all(A > 0)
    np.testing.assert_allclose(A.sum(axis=-1), 1.0, rtol=0, atol=STEP_ATOL)
    S = X @ W_Q @ (X @ W_K).T / np.sqrt(k)
    E = np.exp(S - S.max(axis=-1, keepdims=True))
    np.testing.assert_allclose(A, E / E.sum(axis=-1, keepdims=True), rtol=STEP_RTOL, atol=STEP_ATOL)


def test_attention_mask_forbids_entries(rng):
    X = rng.standard_normal((4, 3))
    mask = np.triu(np.full((4, 4), -np.inf), k=1)  # causal
    A = attention_matrix(X, np.eye(3), np.eye(3), mask=mask)
    np.testing.assert_array_equal(A[np.triu_indices(4, k=1)], 0.0)
    np.testing.assert_allclose(A.sum(axis=-1), 1.0, rtol=0, atol=STEP_ATOL)


def test_attention_and_norm_reject_bad_shapes(rng):
    X = rng.standard_normal((4, 3))
    with pytest.raises(InputError, match="`W_Q`"):
        attention_matrix(X, np.eye(2), np.eye(3))
    with pytest.raises(InputError, match="`gamma`"):
        layer_norm(X, np.ones(4))
    with pytest.raises(InputError, match="finite"):
        layer_norm(np.full((2, 3), np.nan))
