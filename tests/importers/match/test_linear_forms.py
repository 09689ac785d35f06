"""Projections of other linear forms (``oversmooth.importers.match.linear_forms``): an ``Einsum`` that
contracts the data's trailing axes with a constant weight, and a 1×1 ``Conv`` of a channel-first
stream, each the same ``y = x @ W + b`` as a MatMul once its axes are undone; anything else is no
projection."""

from __future__ import annotations

import numpy as np
import pytest
from onnx import helper

from oversmooth.importers.graph.node import Node
from oversmooth.importers.match.linear_forms import conv_linear, dense_weight, einsum_linear

RNG = np.random.default_rng(0)


def _node(op: str, inputs: list[str], **attributes: object) -> Node:
    return Node(0, helper.make_node(op, inputs, ["y"], name=op.lower(), **attributes))


@pytest.mark.parametrize(
    ("equation", "x_shape", "w_shape"),
    [
        ("abc,cde->abde", (2, 5, 6), (6, 3, 4)),  # Keras' EinsumDense Q/K/V: heads out
        ("abcd,cde->abe", (2, 5, 3, 4), (3, 4, 6)),  # Keras' output dense: heads in
        ("...c,dc->...d", (2, 5, 6), (7, 6)),  # a weight stored (out, in)
        ("btc,ce->bte", (2, 5, 6), (6, 7)),
    ],
)
def test_an_einsum_projection_is_its_matrix_product(
    equation: str, x_shape: tuple[int, ...], w_shape: tuple[int, ...]
) -> None:
    weight = RNG.normal(size=w_shape)
    x = RNG.normal(size=x_shape)
    linear = einsum_linear(_node("Einsum", ["x", "w"], equation=equation), weight, "y")
    assert linear is not None
    expected = np.einsum(equation, x, weight)
    flat_x = x.reshape(*x.shape[: x.ndim - linear.in_axes], -1)
    found = flat_x @ dense_weight(linear, weight)
    np.testing.assert_allclose(found.reshape(expected.shape), expected, rtol=1e-12)
    assert expected.shape[-len(linear.out_dims) or None :] == (linear.out_dims or (linear.d_out,))


@pytest.mark.parametrize(
    ("equation", "w_shape"),
    [
        ("abc,cde->abed", (6, 3, 4)),  # output axes out of the weight's order
        ("abc,cde->aebd", (6, 3, 4)),  # the weight's axes moved between the data's
        ("abc,bcd->abd", (5, 6, 4)),  # a token axis contracted with the weight
        ("abc,abd->acd", (2, 5, 4)),  # no weight-only output axis of the features
        ("abc,cd", (6, 4)),  # implicit output
    ],
)
def test_other_einsums_are_no_projection(equation: str, w_shape: tuple[int, ...]) -> None:
    node = _node("Einsum", ["x", "w"], equation=equation)
    assert einsum_linear(node, RNG.normal(size=w_shape), "y") is None


@pytest.mark.parametrize("groups", [1, 2, 4])
def test_a_grouped_pointwise_conv_is_a_block_diagonal_product(groups: int) -> None:
    channels, out, tokens = 8, 12, 5
    weight = RNG.normal(size=(out, channels // groups, 1))
    x = RNG.normal(size=(2, channels, tokens))
    linear = conv_linear(_node("Conv", ["x", "w"], group=groups), weight, "y")
    assert linear is not None
    assert (linear.d_in, linear.d_out, linear.channel_axis) == (channels, out, 1)
    per_in, per_out = channels // groups, out // groups
    expected = np.concatenate(
        [
            np.einsum(
                "oi,bit->bot",
                weight[g * per_out : (g + 1) * per_out, :, 0],
                x[:, g * per_in : (g + 1) * per_in],
            )
            for g in range(groups)
        ],
        axis=1,
    )
    found = np.moveaxis(np.moveaxis(x, 1, -1) @ dense_weight(linear, weight), -1, 1)
    np.testing.assert_allclose(found, expected, rtol=1e-12)


@pytest.mark.parametrize(
    ("attributes", "w_shape"),
    [
        ({}, (8, 8, 3)),  # a kernel wider than one position mixes tokens
        ({"strides": [2]}, (8, 8, 1)),
        ({"pads": [1, 1]}, (8, 8, 1)),
        ({"dilations": [2]}, (8, 8, 1)),
    ],
)
def test_other_convs_are_no_projection(attributes: dict, w_shape: tuple[int, ...]) -> None:
    node = _node("Conv", ["x", "w"], **attributes)
    assert conv_linear(node, RNG.normal(size=w_shape), "y") is None
