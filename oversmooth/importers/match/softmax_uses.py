"""Where a Softmax's probabilities go: to the A of an A·V product, or only elsewhere.

:mod:`oversmooth.importers.match.coverage` asks this of a Softmax the matcher rejected, to tell token
attention left unmatched from a Softmax that is no attention at all. The walk goes forward from
the Softmax output through what still carries the probabilities — value-preserving ops (Cast,
Dropout, Identity), views (Reshape, Squeeze, Unsqueeze, Flatten, Transpose, Expand, Tile, Gather,
Slice, Split), ``Where`` fills and guards, a ``Mul``/``Div`` by anything and an ``Add``/``Sub`` of
a term computed without reading the graph inputs — a superset of the matcher's own walk to the ·V
``MatMul`` (:meth:`oversmooth.importers.match.core.Matcher.value_matmul`), and ends at each :class:`Use`:

- ``value_product``: the probabilities are the left operand of a product with an activation
  (``MatMul``, ``Gemm``, ``FusedMatMul``; a right operand after the (query, key) axes were swapped,
  ``Vᵀ Aᵀ``), or any operand of an ``Einsum`` with an activation: an A·V product, attention;
- ``unknown``: an op that is none of the uses below, reached without a gate, or a walk past
  :data:`~oversmooth.importers.match.limits.SOFTMAX_USE_TENSORS` tensors: attention (the safe answer);
- ``weighted_sum``: a reduction after a ``Mul`` by another activation, the A·V product written
  out as ``Mul`` + ``ReduceSum`` — attention when the probabilities are a square (query, key)
  matrix at the probe's sizes (the long probe's where the default one leaves their shape
  unknown), or of unknown shape; a pooling otherwise (one row per learned or
  pooled query, or a weight vector);
- ``reduced``: a reduction (``Reduce*``, ``ArgMax``, ``ArgMin``) without a gate: reduced away;
- ``graph_output``: the probabilities are a graph output;
- ``gate``: after a ``Mul`` by another activation, anything but an A·V product or a reduction;
- ``right_operand``: the right operand of a product with an activation (X·P, not A·V);
- ``constant_product``: a product with a constant (or input-free) operand;
- ``nothing``: the probabilities feed nothing.

A Softmax is attention when any use is; only when every use is one of the last six (or a
pooling weighted sum) is it not, and the uses' descriptions are the reason.
"""

from __future__ import annotations

from dataclasses import dataclass, replace
from typing import Literal

import numpy as np

from oversmooth.importers.graph import Node
from oversmooth.importers.match.limits import SOFTMAX_USE_TENSORS
from oversmooth.importers.match.walker import GraphWalker, MatchBasis

__all__ = ["SoftmaxUses", "Use", "UseKind"]

#: What a Softmax's probabilities are used for (see the module docstring).
UseKind = Literal[
    "value_product",
    "unknown",
    "weighted_sum",
    "reduced",
    "graph_output",
    "gate",
    "right_operand",
    "constant_product",
    "nothing",
]

_PRODUCTS = frozenset({"MatMul", "Gemm", "FusedMatMul", "MatMulInteger", "Einsum"})
_REDUCTIONS = frozenset(
    {
        "ReduceSum",
        "ReduceMean",
        "ReduceMax",
        "ReduceMin",
        "ReduceProd",
        "ReduceL1",
        "ReduceL2",
        "ReduceLogSum",
        "ReduceLogSumExp",
        "ReduceSumSquare",
        "ArgMax",
        "ArgMin",
    }
)
#: Ops whose output is the probabilities' values unchanged (output 0 only).
_SAME_VALUES = frozenset({"Identity", "Cast", "CastLike", "Dropout"})
#: Views and selections of the data input 0 (every output).
_VIEWS = frozenset(
    {"Reshape", "Squeeze", "Unsqueeze", "Flatten", "Expand", "Tile", "Gather", "Slice", "Split"}
)
#: A guard's condition on the probabilities (IsNaN → Where), not a use of their values.
_CHECKS = frozenset({"IsNaN", "IsInf"})


@dataclass(frozen=True)
class Use:
    """One end of the walk forward from a Softmax: what its probabilities are used for.

    ``attention`` says whether this use makes the Softmax attention (or leaves it possibly so);
    ``text`` describes the use in words, for the reason a Softmax is not attention.
    """

    kind: UseKind
    text: str
    attention: bool = False


@dataclass(frozen=True)
class _Reach:
    """The probabilities as they reach ``tensor``: the ``gate`` passed on the way (a ``Mul`` by
    another activation, described) and whether the (query, key) axes are swapped (``flipped``;
    None where the views passed leave it unknown)."""

    tensor: str
    gate: str | None = None
    flipped: bool | None = False


class SoftmaxUses(GraphWalker):
    """The uses of one Softmax's probabilities (see the module docstring).

    Shapes are read at ``basis``'s probe sizes, or, where those leave one unknown (an audio
    front end leaves no frame of 3 samples), all at ``long``'s (the long probe), when given.
    """

    def __init__(self, basis: MatchBasis, softmax: Node, long: MatchBasis | None = None) -> None:
        super().__init__(basis, basis.shapes.context())
        self.softmax = softmax
        self.contexts = [self.context, *([long.shapes.context()] if long is not None else [])]

    def not_attention(self) -> str | None:
        """Why the Softmax is not attention, in one line (its uses, described); None when some
        use makes it attention or leaves it possibly so."""
        uses = self.uses()
        if any(use.attention for use in uses):
            return None
        return "; ".join(dict.fromkeys(use.text for use in uses))

    def uses(self) -> list[Use]:
        """Every use the walk forward from the Softmax output ends at."""
        frontier, seen, found = [_Reach(self.softmax.outputs[0])], set[str](), list[Use]()
        while frontier:
            reach = frontier.pop()
            if reach.tensor in seen:
                continue
            seen.add(reach.tensor)
            if len(seen) > SOFTMAX_USE_TENSORS:
                return [Use("unknown", "too many tensors to follow", attention=True)]
            users = self.consumers(reach.tensor)
            found += self.ends(reach, bool(users))
            for node in users:
                step = self.step(node, reach)
                if isinstance(step, Use):
                    found.append(step)
                else:
                    frontier += step
        return found

    def ends(self, reach: _Reach, used: bool) -> list[Use]:
        """The graph output ``reach.tensor`` is, or that it feeds nothing."""
        if reach.tensor in self.index.graph_outputs:
            if reach.gate is not None:
                return [self.gate_use(reach)]
            return [Use("graph_output", f"it is the graph output {reach.tensor!r}")]
        if used:
            return []
        where = "" if reach.tensor == self.softmax.outputs[0] else f" past {reach.tensor!r}"
        return [Use("nothing", f"it feeds nothing{where}")]

    def step(self, node: Node, reach: _Reach) -> Use | list[_Reach]:
        """The use ``node`` makes of the probabilities at ``reach``, or where they go on."""
        if node.op_type in _PRODUCTS:
            return self.product_use(node, reach)
        if node.op_type in _REDUCTIONS and node.input(0) == reach.tensor:
            return self.reduction_use(node, reach)
        if node.op_type in _CHECKS:
            return []
        carried = self.carried(node, reach)
        if carried is not None:
            return carried
        return self.gate_use(reach) if reach.gate is not None else self.other_use(node)

    # -- uses --------------------------------------------------------------------------------
    @staticmethod
    def gate_use(reach: _Reach) -> Use:
        return Use("gate", f"it gates another activation ({reach.gate})")

    @staticmethod
    def other_use(node: Node) -> Use:
        return Use("unknown", f"it feeds {node.op_type} {node.label!r}", attention=True)

    def product_use(self, node: Node, reach: _Reach) -> Use:
        """A product reading the probabilities: A·V, a right operand or a constant product."""
        tensor, op = reach.tensor, node.op_type
        operands = [x for x in (node.inputs if op == "Einsum" else node.inputs[:2]) if x]
        if tensor not in operands:  # Gemm's bias C, an integer product's zero point
            return self.gate_use(reach) if reach.gate is not None else self.other_use(node)
        others = [x for x in operands if x != tensor]
        if others and all(self.input_free(x) for x in others):
            if reach.gate is not None:
                return self.gate_use(reach)
            return Use(
                "constant_product",
                f"it feeds {op} {node.label!r} with a constant ({others[0]!r}), not with values "
                f"computed from the tokens",
            )
        if not others or self.as_left(node, reach) is not False:
            return Use("value_product", f"it is the A of {op} {node.label!r}", attention=True)
        if reach.gate is not None:
            return self.gate_use(reach)
        return Use(
            "right_operand",
            f"it is the right operand of {op} {node.label!r} (X·P, not the A of A·V)",
        )

    def as_left(self, node: Node, reach: _Reach) -> bool | None:
        """Whether the probabilities are, in effect, the left factor of the 2-D product ``node``
        (their own (query, key) axes, transposes counted); None when that is not known."""
        if node.op_type == "Einsum" or reach.flipped is None:
            return None
        position = node.inputs.index(reach.tensor)
        flipped = reach.flipped
        if node.op_type in ("Gemm", "FusedMatMul"):
            if node.attr("transBatchA", 0) or node.attr("transBatchB", 0):
                return None
            flipped ^= bool(node.attr("transA" if position == 0 else "transB", 0))
        return (position == 0) != flipped

    def reduction_use(self, node: Node, reach: _Reach) -> Use:
        """A reduction: the probabilities reduced away, or a weighted sum when a gate came
        first (attention when the probabilities are a token-by-token matrix)."""
        where = f"{node.op_type} {node.label!r} over {self.reduced_axes(node)}"
        if reach.gate is None:
            return Use("reduced", f"its output is reduced away ({where})")
        (shape,) = self.shapes(self.softmax.outputs[0])
        square = shape is None or (len(shape) >= 2 and shape[-1] == shape[-2])
        return Use(
            "weighted_sum",
            f"it weights another activation that is then summed away ({reach.gate}; {where}): "
            f"a pooling, its probabilities {shape} not a square (query, key) matrix",
            attention=square,
        )

    def reduced_axes(self, node: Node) -> str:
        """``the last axis``, ``axis 1``, ``axes [1, 2]`` or ``all axes``, for messages."""
        if node.op_type in ("ArgMax", "ArgMin"):
            axes = [int(node.attr("axis", 0))]
        else:
            found = self.const(node.input(1)) if node.input(1) else node.attr("axes")
            axes = [] if found is None else [int(axis) for axis in np.ravel(found)]
        if not axes:
            return "all axes"
        (shape,) = self.shapes(node.input(0)) if axes != [-1] else (None,)
        if len(axes) == 1 and (axes == [-1] or (shape is not None and axes[0] == len(shape) - 1)):
            return "the last axis"
        return f"axis {axes[0]}" if len(axes) == 1 else f"axes {axes}"

    # -- where the probabilities go on --------------------------------------------------------
    def carried(self, node: Node, reach: _Reach) -> list[_Reach] | None:
        """Where ``node`` carries the probabilities on (its outputs, with the gate and
        orientation updated); None when it does not carry them."""
        op, tensor = node.op_type, reach.tensor
        data = node.input(0) == tensor
        if op in _SAME_VALUES and data:
            return [replace(reach, tensor=node.outputs[0])]
        if op == "Transpose" and data:
            return [replace(reach, tensor=node.outputs[0], flipped=self.transposed(node, reach))]
        if op in _VIEWS and data:
            return [
                replace(reach, tensor=output, flipped=self.viewed(tensor, output, reach))
                for output in node.outputs
                if output
            ]
        if op == "Where" and tensor in node.inputs[1:] and node.input(0) != tensor:
            return [replace(reach, tensor=node.outputs[0])]
        if op == "Mul" or (op == "Div" and data):
            other = node.input(1) if data else node.input(0)
            if self.input_free(other):
                return [replace(reach, tensor=node.outputs[0])]
            gate = reach.gate or f"{op} {node.label!r} with {other!r}"
            return [replace(reach, tensor=node.outputs[0], gate=gate)]
        if op in ("Add", "Sub"):
            other = node.input(1) if data else node.input(0)
            if other != tensor and self.input_free(other):
                return [replace(reach, tensor=node.outputs[0])]
        return None

    def transposed(self, node: Node, reach: _Reach) -> bool | None:
        """The orientation after a Transpose: swapped when it swaps the last two axes, kept when
        it keeps them, unknown otherwise."""
        if reach.flipped is None:
            return None
        perm = node.attr("perm")
        if perm is None:
            (shape,) = self.shapes(node.input(0))
            perm = None if shape is None else list(range(len(shape)))[::-1]
        if perm is None or len(perm) < 2:
            return None
        rank, tail = len(perm), [int(axis) for axis in perm[-2:]]
        if tail == [rank - 2, rank - 1]:
            return reach.flipped
        return not reach.flipped if tail == [rank - 1, rank - 2] else None

    def viewed(self, before: str, after: str, reach: _Reach) -> bool | None:
        """The orientation after a view: kept when the last two axes keep their sizes."""
        if reach.flipped is None:
            return None
        shapes = self.shapes(before, after)
        if any(shape is None or len(shape) < 2 for shape in shapes):
            return None
        return reach.flipped if shapes[0][-2:] == shapes[1][-2:] else None  # type: ignore[index]

    def shapes(self, *names: str) -> tuple[tuple[int, ...] | None, ...]:
        """The shapes of ``names``, all read at the first probe sizes that know every one (None
        for each where none does, or where the graph's shapes cannot be evaluated)."""
        for context in self.contexts:
            try:
                found = tuple(context.shape(name) for name in names)
            except (ValueError, TypeError, IndexError, KeyError, OverflowError):
                continue
            if all(shape is not None for shape in found):
                return found
        return tuple(None for _ in names)
