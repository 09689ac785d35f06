"""Projections written as other linear ops than a 2-D matrix product: ``Einsum`` and the 1×1
``Conv`` of a channel-first stream.

Each form is a :class:`~oversmooth.importers.match.results.LinearMatch` with the same meaning as a
``MatMul``: ``y = x @ W + b`` on the features, ``W`` (d_in, d_out) in the row-vector
convention. What differs is only where the features sit, which the match records so the layout
probe (:mod:`oversmooth.importers.match.layout`) and the weight reader (:mod:`oversmooth.importers.weights`) can undo it:

- ``Einsum`` (Keras' ``EinsumDense``): ``L C, C R -> L R`` contracts the trailing axes ``C`` of the
  data with the weight and writes the weight's other axes ``R`` as the trailing output axes,
  e.g. ``abc,cde->abde`` (Q/K/V, one axis in, heads × head size out) or ``abcd,cde->abe`` (W_O,
  heads × head size in). ``in_axes = len(C)``, ``out_dims`` = the sizes of ``R``, and
  ``weight_axes`` orders the stored weight as ``C`` then ``R``.
- ``Conv`` with a kernel of ones (SqueezeBERT's ``Conv1d(kernel_size=1, groups=g)``): on a
  (batch, channels, tokens) stream the features are axis 1 (``channel_axis``), and ``W`` is the
  block-diagonal matrix of the ``groups`` kernels.

Public API
----------
einsum_linear, conv_linear
    The :class:`LinearMatch` of an ``Einsum`` or ``Conv`` node, or None when it is no projection.
dense_weight
    ``W`` (d_in, d_out) from a stored Einsum or Conv weight.
"""

from __future__ import annotations

import math

import numpy as np

from oversmooth.importers.graph import Node
from oversmooth.importers.match.results import LinearMatch

__all__ = ["conv_linear", "dense_weight", "einsum_linear"]


def _text(value: object) -> str:
    """A string attribute (ONNX stores them as bytes)."""
    return value.decode() if isinstance(value, bytes) else str(value)


def _einsum_terms(equation: str) -> tuple[str, str, str] | None:
    """``(data, weight, output)`` subscripts of a two-operand explicit equation, ``...`` as one
    letter; else None."""
    text = equation.replace(" ", "").replace("...", ".")
    if text.count("->") != 1:
        return None
    inputs, output = text.split("->")
    terms = inputs.split(",")
    if len(terms) != 2 or any(len(set(term)) != len(term) for term in (*terms, output)):
        return None
    return terms[0], terms[1], output


def einsum_linear(node: Node, weight: np.ndarray, name: str) -> LinearMatch | None:
    """The projection an ``Einsum(x, W)`` computes, when it contracts the trailing axes of ``x``
    with ``W`` and writes ``W``'s other axes last, in order: ``L C, C R -> L R`` with ``C`` and ``R``
    non-empty and ``W`` of rank ``len(C) + len(R)`` (its axes in any order); else None."""
    terms = _einsum_terms(_text(node.attr("equation", "")))
    if terms is None:
        return None
    data, stored, output = terms
    contracted = "".join(letter for letter in data if letter in stored and letter not in output)
    kept = "".join(letter for letter in stored if letter not in contracted)
    lead = data[: len(data) - len(contracted)]
    if (
        not contracted
        or not kept
        or "." in stored
        or data != lead + contracted
        or output != lead + kept
        or weight.ndim != len(stored)
        or set(stored) != set(contracted + kept)
    ):
        return None
    axes = tuple(stored.index(letter) for letter in contracted + kept)
    sizes = [weight.shape[axis] for axis in axes]
    return LinearMatch(
        kind="einsum",
        x=node.input(0),
        weight=node.input(1),
        output=name,
        d_in=math.prod(sizes[: len(contracted)]),
        d_out=math.prod(sizes[len(contracted) :]),
        out_dims=tuple(int(size) for size in sizes[len(contracted) :]),
        in_axes=len(contracted),
        weight_axes=axes,
        nodes=(node.label,),
    )


def conv_linear(node: Node, weight: np.ndarray, name: str) -> LinearMatch | None:
    """The projection a ``Conv(x, W, b?)`` with a kernel of ones computes on a channel-first
    ``x`` (batch, channels, positions...): every position's channels times the block-diagonal
    matrix of the ``group`` kernels; else None (a wider kernel, strides, dilations or pads that
    move positions)."""
    groups = int(node.attr("group", 1))
    spatial = weight.shape[2:]
    moved = any(
        any(int(value) != default for value in node.attr(attribute) or ())
        for attribute, default in (("strides", 1), ("dilations", 1), ("pads", 0))
    )
    if weight.ndim < 3 or any(size != 1 for size in spatial) or moved or groups < 1:
        return None
    if _text(node.attr("auto_pad", "NOTSET")) not in ("NOTSET", "VALID"):
        return None
    d_out, per_group = int(weight.shape[0]), int(weight.shape[1])
    if d_out % groups:
        return None
    return LinearMatch(
        kind="conv",
        x=node.input(0),
        weight=node.input(1),
        output=name,
        d_in=per_group * groups,
        d_out=d_out,
        bias=node.input(2) or None,
        channel_axis=1,
        groups=groups,
        nodes=(node.label,),
    )


def dense_weight(linear: LinearMatch, raw: np.ndarray) -> np.ndarray:
    """``W`` (d_in, d_out) of an ``einsum`` or ``conv`` projection from its stored weight."""
    if linear.kind == "einsum":
        return np.transpose(raw, linear.weight_axes).reshape(linear.d_in, linear.d_out)
    kernels = raw.reshape(raw.shape[0], raw.shape[1])  # (d_out, d_in / groups)
    dense = np.zeros((linear.d_in, linear.d_out), dtype=raw.dtype)
    per_in, per_out = linear.d_in // linear.groups, linear.d_out // linear.groups
    for group in range(linear.groups):
        rows = slice(group * per_in, (group + 1) * per_in)
        columns = slice(group * per_out, (group + 1) * per_out)
        dense[rows, columns] = kernels[columns].T
    return dense
