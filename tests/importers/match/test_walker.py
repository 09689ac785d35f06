"""The matcher's graph queries (:mod:`oversmooth.importers.match.walker`), on one hand-built graph.

The graph reads ``x`` (batch, sequence, 8) and holds, besides the data path, the shape arithmetic an
SDPA export applies (``1 / sqrt(Cast(Shape(x)[-1]))``), a Softmax and constants: each answer below
is worked out by hand from it.
"""

from __future__ import annotations

import math

import numpy as np
import pytest

from oversmooth.importers.graph import model_from_proto
from oversmooth.importers.match.codes import RejectCode
from oversmooth.importers.match.limits import PROBE_BATCH, PROBE_SEQUENCE
from oversmooth.importers.match.walker import GraphWalker, MatchBasis, RejectError
from tests.importers.small_graph import SmallGraph

D_MODEL = 8


def _walker_and_names() -> tuple[GraphWalker, dict[str, str]]:
    g = SmallGraph()
    n: dict[str, str] = {}
    n["three"] = g.const(3.0)
    n["pair"] = g.const([1.0, 2.0])
    n["inf"] = g.const(np.inf)
    n["zero"] = g.const(0.0)
    n["cast"] = g.op("Cast", "x", to=1)
    n["identity"] = g.op("Identity", n["cast"])
    n["shape"] = g.op("Shape", "x")
    width = g.op("Cast", g.op("Gather", n["shape"], g.const(-1, np.int64), axis=0), to=1)
    n["inv_sqrt"] = g.op("Reciprocal", g.op("Sqrt", width))
    n["mul_right"] = g.op("Mul", "x", n["three"])
    n["mul_left"] = g.op("Mul", n["three"], n["identity"])
    n["mul_shape"] = g.op("Mul", "x", n["inv_sqrt"])
    n["div"] = g.op("Div", "x", n["three"])
    n["div_zero"] = g.op("Div", "x", n["zero"])
    n["mul_data"] = g.op("Mul", "x", n["cast"])
    n["mul_consts"] = g.op("Mul", n["three"], n["pair"])
    n["softmax"] = g.op("Softmax", n["mul_right"], axis=-1)
    n["after_softmax"] = g.op("Add", n["softmax"], n["three"])
    n["size"] = g.op("Size", "x")
    model = g.model(n["after_softmax"], D_MODEL)
    basis = MatchBasis(model_from_proto(model).index, PROBE_BATCH, PROBE_SEQUENCE)
    return GraphWalker(basis, basis.shapes.context()), n


@pytest.fixture(scope="module")
def graph() -> tuple[GraphWalker, dict[str, str]]:
    return _walker_and_names()


def test_consumers_leave_out_reads_of_a_shape(graph) -> None:
    """``x`` is read by Cast, Shape, three Muls, two Divs and Size: Shape and Size read no value."""
    walker, _ = graph
    ops = sorted(node.op_type for node in walker.consumers("x"))
    assert ops == ["Cast", "Div", "Div", "Mul", "Mul", "Mul"]
    assert {node.op_type for node in walker.index.consumers("x")} >= {"Shape", "Size"}


def test_strip_casts_walks_back_through_casts_and_identities(graph) -> None:
    walker, n = graph
    assert walker.strip_casts(n["identity"]) == "x"
    assert walker.strip_casts(n["mul_right"]) == n["mul_right"]


def test_scalar_is_a_one_element_constant_or_shape_arithmetic(graph) -> None:
    """1/sqrt(8) comes from the probe's shape of ``x``; a graph input, a two-element constant and
    an infinite one have no scalar value."""
    walker, n = graph
    assert walker.scalar(n["three"]) == 3.0
    assert walker.scalar(n["inv_sqrt"]) == pytest.approx(1 / math.sqrt(D_MODEL), rel=1e-7)
    assert walker.scalar("x") is None
    assert walker.scalar(n["pair"]) is None
    assert walker.scalar(n["inf"]) is None
    assert walker.scalar("") is None


@pytest.mark.parametrize(
    ("tensor", "factor", "data"),
    [
        ("mul_right", 3.0, "x"),
        ("mul_left", 3.0, "identity"),
        ("mul_shape", 1 / math.sqrt(D_MODEL), "x"),
        ("div", 1 / 3.0, "x"),
        ("div_zero", None, ""),
        ("mul_data", None, ""),
        ("mul_consts", None, ""),
        ("cast", None, ""),
    ],
)
def test_scalar_factor_by_hand(graph, tensor: str, factor: float | None, data: str) -> None:
    """A Mul by a known scalar on either side, or a Div by a non-zero one, is (factor, data); a
    product of two data tensors or of two constants, a Div by zero, or another op is not."""
    walker, n = graph
    found, operand = walker.scalar_factor(walker.producer(n[tensor]))
    expected_operand = n.get(data, data)
    assert operand == expected_operand
    if factor is None:
        assert found is None
    else:
        assert found == pytest.approx(factor, rel=1e-7)


def test_shape_reads_are_not_dependencies(graph) -> None:
    """The scale 1/sqrt(8) reads only the shape of ``x``: it is input-free and does not depend on
    ``x``; the scaled scores do."""
    walker, n = graph
    assert walker.input_free(n["inv_sqrt"])
    assert walker.input_free(n["three"])
    assert not walker.input_free(n["mul_shape"])
    assert not walker.computed_from(n["inv_sqrt"], {"x"})
    assert walker.computed_from(n["mul_shape"], {"x"})
    assert walker.computed_from("x", {"x"})


def test_a_softmax_output_counts_as_hidden_for_depends_on_only(graph) -> None:
    """``depends_on`` stops at a Softmax (its output is taken as hidden); ``computed_from`` walks
    through it to ``x`` unless told not to."""
    walker, n = graph
    assert walker.depends_on(n["after_softmax"], set())
    assert not walker.computed_from(n["after_softmax"], set())
    assert walker.computed_from(n["after_softmax"], set(), through_softmax=False)
    assert walker.computed_from(n["after_softmax"], {"x"})
    assert not walker.depends_on(n["three"], {"x"})


def test_origin_names_where_a_tensor_comes_from(graph) -> None:
    walker, n = graph
    assert walker.origin("x") == "graph input 'x'"
    assert walker.origin(n["three"]) == f"constant {n['three']!r}"
    assert walker.origin(n["mul_right"]) == (
        f"tensor {n['mul_right']!r}, computed from graph input 'x'"
    )
    assert walker.input_ancestors(n["after_softmax"], depth=2) == []
    assert walker.input_ancestors(n["after_softmax"], depth=4) == ["x"]


def test_a_basis_remembers_each_key_once() -> None:
    walker, _ = _walker_and_names()
    calls: list[str] = []

    def compute(key: str) -> str:
        calls.append(key)
        return key.upper()

    for key in ("a", "b", "a", "b", "a"):
        assert walker.basis.remembered("memo", key, lambda key=key: compute(key)) == key.upper()
    assert walker.basis.remembered("other", "a", lambda: compute("a")) == "A"
    assert calls == ["a", "b", "a"]
    assert walker.basis.sizes == (PROBE_BATCH, PROBE_SEQUENCE)


def test_a_reject_error_carries_its_code_reason_nodes_and_sizes() -> None:
    err = RejectError(RejectCode.HEAD_RESHAPE, "no split", iter(["n1", "n2"]), (1, 197))
    assert str(err) == err.reason == "no split"
    assert err.code is RejectCode.HEAD_RESHAPE
    assert err.nodes == ("n1", "n2")
    assert err.probe_sizes == (1, 197)
    assert RejectError(RejectCode.OTHER, "r").probe_sizes is None


def test_a_walk_past_its_bound_takes_the_tensor_to_depend(monkeypatch: pytest.MonkeyPatch) -> None:
    """A chain of 12 Negs from ``x``: with the bound at 5 tensors, the walk gives up and answers
    "depends" (and "reads an input") though nothing hidden is on it; with the bound at 13 it
    reaches ``x`` and answers truthfully."""
    from oversmooth.importers.match import walker as walker_module

    g = SmallGraph()
    tensor = "x"
    for _ in range(12):
        tensor = g.op("Neg", tensor)
    model = g.model(tensor, D_MODEL)
    basis = MatchBasis(model_from_proto(model).index, PROBE_BATCH, PROBE_SEQUENCE)
    walker = GraphWalker(basis, basis.shapes.context())
    assert not walker.depends_on(tensor, set())
    assert walker.computed_from(tensor, {"x"})
    monkeypatch.setattr(walker_module, "MAX_ANCESTRY", 5)
    assert walker.depends_on(tensor, set())
    assert walker.computed_from(tensor, {"unrelated"})
    monkeypatch.setattr(walker_module, "MAX_ANCESTRY", 13)
    assert not walker.depends_on(tensor, set())
