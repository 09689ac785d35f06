"""Shared footing of the attention matcher: the graph-walking helpers and the rejection signal.

:class:`MatchBasis` is what every match attempt over one graph at one pair of probe sizes shares,
and nothing an attempt learns: the graph index, the shape basis and memos of pure functions of the
graph (the values of mask and bias terms, declared ranks). :class:`GraphWalker` holds a basis and
one match attempt's own :class:`~oversmooth.importers.graph.ShapeContext` (its pinned shapes) and answers the
small questions every part of the match asks (constant value, producer, consumers, scalar factor,
where a tensor comes from). The parts of the matcher (:mod:`oversmooth.importers.match.projections`,
:mod:`oversmooth.importers.match.layout`, :mod:`oversmooth.importers.match.norms`, :mod:`oversmooth.importers.match.core`) extend
it over one attempt's basis and context. :class:`RejectError` abandons the attempt with a reason.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Iterable
from typing import TypeVar

import numpy as np

from oversmooth.importers.graph import GraphIndex, Node, ShapeBasis, ShapeContext
from oversmooth.importers.match.codes import RejectCode
from oversmooth.importers.match.limits import MAX_ANCESTRY

_T = TypeVar("_T")

VALUE_PRESERVING = frozenset({"Identity", "Cast", "Dropout"})


class RejectError(Exception):
    """Internal: abandon the current Softmax candidate with a reason."""

    def __init__(
        self,
        code: RejectCode,
        reason: str,
        nodes: Iterable[str] = (),
        probe_sizes: tuple[int, int] | None = None,
    ) -> None:
        super().__init__(reason)
        self.code = code
        self.reason = reason
        self.nodes = tuple(nodes)
        self.probe_sizes = probe_sizes  # (batch, sequence) a static Reshape asks for


class MatchBasis:
    """What every match attempt over one graph at one pair of probe sizes shares.

    The graph index, the :class:`~oversmooth.importers.graph.ShapeBasis` at the probe's (batch, sequence)
    sizes, and memos of functions of the graph alone (:meth:`remembered`): nothing here depends on
    what an attempt pins or learns, so the order in which Softmaxes are matched cannot change an
    answer.
    """

    def __init__(self, index: GraphIndex, batch: int, sequence: int) -> None:
        self.index = index
        self.sizes = (batch, sequence)
        self.shapes = ShapeBasis(index, batch=batch, sequence=sequence)
        self._memos: dict[str, dict[str, object]] = {}

    def remembered(self, memo: str, key: str, compute: Callable[[], _T]) -> _T:
        """``compute()`` once per (``memo``, ``key``): for a value that depends on the graph and
        the probe's sizes alone (never on a shape an attempt pinned)."""
        entries = self._memos.setdefault(memo, {})
        if key not in entries:
            entries[key] = compute()
        return entries[key]  # type: ignore[return-value]


class GraphWalker:
    """Graph queries for one match attempt: a shared :class:`MatchBasis` and the attempt's own
    shape context.

    The parts of one attempt share its ``context``, so a shape one part pins is the shape every
    other part of the same attempt reads; no other attempt sees it.
    """

    def __init__(self, basis: MatchBasis, context: ShapeContext) -> None:
        self.basis = basis
        self.index = basis.index
        self.context = context

    # -- helpers ----------------------------------------------------------------------------------
    def const(self, name: str) -> np.ndarray | None:
        return self.index.constant_value(name) if name else None

    def producer(self, name: str) -> Node | None:
        return self.index.producer(name) if name else None

    def consumers(self, name: str) -> list[Node]:
        """Consumers other than Shape (shape arithmetic reads tensors without using values)."""
        return [
            node for node in self.index.consumers(name) if node.op_type not in ("Shape", "Size")
        ]

    def strip_casts(self, name: str) -> str:
        node = self.producer(name)
        while node is not None and node.op_type in ("Cast", "Identity"):
            name = node.input(0)
            node = self.producer(name)
        return name

    def scalar(self, name: str) -> float | None:
        """The value of a one-element tensor known without running the graph, else None.

        A constant, or a value the shape context evaluates from the graph's own arithmetic at the
        probe's concrete sizes (constants folded plus shape arithmetic, e.g. the
        ``Sqrt(1/Sqrt(Cast(Shape(q)[-1])))`` an SDPA export applies to Q and K): never a value that
        depends on the input data, whose graph inputs have no value.
        """
        if not name:
            return None
        value = self.const(name)
        if value is None:
            value = self.context.value(name)
        if value is None or np.size(value) != 1:
            return None
        try:
            number = float(np.ravel(value)[0])
        except (TypeError, ValueError):
            return None
        return number if math.isfinite(number) else None

    def scalar_factor(self, node: Node) -> tuple[float | None, str]:
        """(factor, data input) for a Mul/Div by a one-element value known without running the
        graph (:meth:`scalar`: a constant or shape arithmetic), else (None, "")."""
        if node.op_type == "Mul":
            for const_pos in (1, 0):
                value = self.scalar(node.input(const_pos))
                if value is not None and self.scalar(node.input(1 - const_pos)) is None:
                    if self.const(node.input(1 - const_pos)) is None:
                        return value, node.input(1 - const_pos)
        if node.op_type == "Div":
            value = self.scalar(node.input(1))
            if value is not None and value != 0.0 and self.scalar(node.input(0)) is None:
                return 1.0 / value, node.input(0)
        return None, ""

    def depends_on(self, name: str, hidden: set[str]) -> bool:
        """Whether the value of ``name`` is computed from a ``hidden`` tensor or a Softmax output
        (reads of a tensor's shape do not count; past :data:`MAX_ANCESTRY` tensors, it does)."""
        return self.computed_from(name, hidden, through_softmax=False)

    def computed_from(self, name: str, sources: set[str], *, through_softmax: bool = True) -> bool:
        """Whether the value of ``name`` is computed from one of ``sources`` (or is one), through
        any op (a Softmax output counts as such a source unless ``through_softmax``); reads of a
        tensor's shape do not count. Past :data:`MAX_ANCESTRY` tensors it is taken to be."""
        frontier, seen = [name], set()
        while frontier:
            tensor = frontier.pop()
            if tensor in sources:
                return True
            node = self.producer(tensor)
            if node is None or tensor in seen or self.const(tensor) is not None:
                continue
            seen.add(tensor)
            if len(seen) > MAX_ANCESTRY or (node.op_type == "Softmax" and not through_softmax):
                return True
            if node.op_type not in ("Shape", "Size"):
                frontier.extend(operand for operand in node.inputs if operand)
        return False

    def input_free(self, name: str) -> bool:
        """Whether the value of ``name`` is computed without reading a graph input's values (reads
        of shapes do not count; past :data:`MAX_ANCESTRY` tensors, it is taken to read one)."""
        data = {
            tensor for tensor in self.index.graph_inputs if tensor not in self.index.initializers
        }
        return not self.computed_from(name, data)

    def origin(self, name: str) -> str:
        """Where a tensor comes from, for messages (graph inputs it is computed from, if few)."""
        if name in self.index.graph_inputs:
            return f"graph input {name!r}"
        if self.const(name) is not None:
            return f"constant {name!r}"
        inputs = self.input_ancestors(name, depth=6)
        if inputs:
            return f"tensor {name!r}, computed from graph input {', '.join(map(repr, inputs))}"
        return f"tensor {name!r}"

    def input_ancestors(self, name: str, depth: int) -> list[str]:
        frontier, found = [name], []
        for _ in range(depth):
            next_frontier: list[str] = []
            for tensor in frontier:
                if tensor in self.index.graph_inputs and tensor not in found:
                    found.append(tensor)
                node = self.producer(tensor)
                if node is not None:
                    next_frontier.extend(operand for operand in node.inputs if operand)
            frontier = next_frontier
        return found
