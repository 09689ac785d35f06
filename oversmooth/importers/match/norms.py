"""Norms found by structure, for :mod:`oversmooth.importers.match.stream` (the residual stream around a block).

Norms are fused ``LayerNormalization``, the decomposed LayerNorm chain, RMSNorm
(Pow/ReduceMean/Add/Sqrt/Reciprocal-or-Div/Mul/Mul), ``SimplifiedLayerNormalization``,
``RMSNormalization``, or onnxruntime's fused ``SkipLayerNormalization`` /
``SkipSimplifiedLayerNormalization`` (the norm of ``input + skip (+ bias)``; its input is the sum, the
node's optional fourth output, see :meth:`NormMatcher.skip_sum`).
"""

from __future__ import annotations

import numpy as np

from oversmooth.importers.graph import Node
from oversmooth.importers.match.limits import NORM_SEARCH_DEPTH, STRIP_RESHAPE_STEPS
from oversmooth.importers.match.results import NormKind, NormMatch
from oversmooth.importers.match.walker import GraphWalker

#: onnxruntime's fused ``norm(input + skip (+ bias))`` ops and the norm each applies.
SKIP_NORMS: dict[str, NormKind] = {
    "SkipLayerNormalization": "layernorm",
    "SkipSimplifiedLayerNormalization": "rmsnorm",
}
#: Ops that may read a (tokens, batch) view of the stream made for the projections alone.
_PROJECTION_READERS = frozenset(
    "MatMul Gemm FusedMatMul MatMulNBits MatMulInteger DynamicQuantizeLinear DequantizeLinear "
    "Reshape Flatten Cast".split()
)
#: The position of the optional ``input + skip (+ bias)`` output of a fused skip norm.
SKIP_SUM_OUTPUT = 3


def leading_permutation(node: Node) -> tuple[int, ...] | None:
    """The perm of a Transpose that moves leading axes only (the last stays), else None."""
    if node.op_type != "Transpose":
        return None
    perm = tuple(int(axis) for axis in node.attr("perm") or ())
    if len(perm) < 3 or perm[-1] != len(perm) - 1 or perm == tuple(range(len(perm))):
        return None
    return perm


def channels_last(rank: int) -> tuple[int, ...]:
    """The perm that moves axis 1 (the channels of a channel-first tensor) last."""
    return (0, *range(2, rank), 1) if rank >= 3 else ()


def channels_first(rank: int) -> tuple[int, ...]:
    """The perm that moves the last axis to axis 1 (:func:`channels_last` undone)."""
    return (0, rank - 1, *range(1, rank - 1)) if rank >= 3 else ()


class NormMatcher(GraphWalker):
    """Recognise norms by structure, and the stream tensor behind a projection input."""

    def stream_tensor(self, name: str) -> str:
        """The residual-stream tensor behind a projection input: undo Casts, for 2-D (Gemm)
        projections the Reshape/Flatten that flattened the tokens, and a Transpose of the leading
        axes (PyTorch's ``nn.MultiheadAttention`` projects a (tokens, batch, features) view of a
        batch-first stream: a projection acts on the last axis alone, so it commutes with that
        Transpose; :meth:`stream_permutation` gives the layout probe the permutation)."""
        name = self.strip_token_reshape(name)
        permuted = self.leading_transpose(name)
        return self.strip_casts(permuted[0]) if permuted is not None else name

    def stream_permutation(self, name: str) -> tuple[int, ...] | None:
        """The permutation of the stream's leading axes a projection input ``name`` carries (see
        :meth:`stream_tensor`), None when it carries none."""
        permuted = self.leading_transpose(self.strip_token_reshape(name))
        return permuted[1] if permuted is not None else None

    def leading_transpose(self, name: str) -> tuple[str, tuple[int, ...]] | None:
        """(input, perm) of a Transpose producing ``name`` that moves leading axes only and whose
        output only projections read (a stream kept in that layout, residual sums and norms
        included, is a time-major stream, not a view of a batch-first one)."""
        node = self.producer(name)
        if node is not None and node.op_type == "DequantizeLinear":
            return self.dequantized_transpose(node)
        perm = leading_permutation(node) if node is not None else None
        if perm is None or node is None:
            return None
        if not all(user.op_type in _PROJECTION_READERS for user in self.consumers(name)):
            return None
        return node.input(0), perm

    def dequantized_transpose(self, node: Node) -> tuple[str, tuple[int, ...]] | None:
        """(stream, perm) for ``DequantizeLinear(Transpose(codes))`` with a one-element scale and
        zero point, when the codes' own ``DequantizeLinear`` with the same ones is the stream: the
        two then commute (``quantize_dynamic`` of an embedding table that block 0 reads through
        ``nn.MultiheadAttention``'s (tokens, batch) view)."""
        permuted = self.leading_transpose(node.input(0))
        scales = [name for name in node.inputs[1:] if name]
        if permuted is None or any(
            (value := self.const(name)) is None or value.size != 1 for name in scales
        ):
            return None
        codes, perm = permuted
        twin = next(
            (
                user
                for user in self.consumers(codes)
                if user.op_type == "DequantizeLinear" and user.inputs[1:] == node.inputs[1:]
            ),
            None,
        )
        return (twin.outputs[0], perm) if twin is not None else None

    def strip_token_reshape(self, name: str) -> str:
        """Undo Casts and the Reshape/Flatten to 2-D that flattened the tokens for a Gemm."""
        name = self.strip_casts(name)
        node = self.producer(name)
        if node is not None and node.op_type in ("Reshape", "Flatten"):
            shape = self.context.shape(name)
            target = self.context.value(node.input(1)) if node.op_type == "Reshape" else None
            if (
                (shape is not None and len(shape) == 2)
                or (target is not None and target.size == 2)
                or node.op_type == "Flatten"
            ):
                return self.strip_casts(node.input(0))
        return name

    def strip_reshapes_forward(self, name: str) -> str:
        for _ in range(STRIP_RESHAPE_STEPS):
            users = self.consumers(name)
            if len(users) == 1 and (
                users[0].op_type in ("Reshape", "Cast", "Identity", "Dropout")
                or leading_permutation(users[0]) is not None
            ):
                name = users[0].outputs[0]
            else:
                break
        return name

    def layer_scale_after(self, name: str, d_model: int) -> tuple[str | None, str]:
        users = self.consumers(name)
        if len(users) == 1 and users[0].op_type == "Mul":
            other = next((operand for operand in users[0].inputs if operand != name), "")
            value = self.const(other)
            if value is not None and value.size in (1, d_model):
                return other, self.strip_reshapes_forward(users[0].outputs[0])
        return None, name

    def norm_starting_at(self, name: str) -> NormMatch | None:
        """The outermost norm (LayerNorm or RMSNorm) that reads ``name``, searching forward."""
        frontier, seen, best = [name], set(), None
        for _ in range(NORM_SEARCH_DEPTH):
            next_frontier = []
            for tensor in frontier:
                for node in self.consumers(tensor):
                    if node.position in seen:
                        continue
                    seen.add(node.position)
                    for output in node.outputs:
                        match = self.norm_reading(output, name)
                        if match is not None:
                            if best is None or len(match.nodes) > len(best.nodes):
                                best = match
                        next_frontier.append(output)
            frontier = next_frontier
        return best

    def norm_reading(self, output: str, name: str) -> NormMatch | None:
        """The norm with output ``output`` when it reads ``name``, or the channels of a
        channel-first ``name`` (a last-axis norm of its :func:`channels_last` Transpose, whose
        output then stays channels-last: the last block of SqueezeBERT); else None."""
        match = self.norm_ending_at(output)
        if match is None:
            return None
        source = self.strip_casts(match.input)
        if source == self.strip_casts(name):
            return match
        node = self.producer(source)
        rank = len(node.attr("perm") or ()) if node is not None else 0
        if node is None or node.op_type != "Transpose" or node.input(0) != name:
            return None
        if tuple(node.attr("perm")) != channels_last(rank):
            return None
        return NormMatch(
            match.kind,
            name,
            match.output,
            match.gamma,
            match.beta,
            match.eps,
            (node.label, *match.nodes),
        )

    def norm_ending_at(self, name: str) -> NormMatch | None:
        """The norm whose output is ``name`` (fused op or decomposed chain, or either between a
        Transpose that moves the channels of a channel-first tensor last and its inverse,
        :meth:`channel_norm`), else None."""
        node = self.producer(self.strip_casts(name))
        if node is not None and node.op_type == "Transpose":
            return self.channel_norm(node, name)
        return self.last_axis_norm(name)

    def channel_norm(self, back: Node, name: str) -> NormMatch | None:
        """A last-axis norm of ``Transpose(x)`` transposed back, ``name`` its output: for a
        channel-first ``x`` (batch, channels, tokens...) the norm over its channels, as
        SqueezeBERT's LayerNorm applies it (permute, LayerNorm, permute back); else None."""
        inner = self.last_axis_norm(back.input(0))
        forth = self.producer(self.strip_casts(inner.input)) if inner is not None else None
        if inner is None or forth is None or forth.op_type != "Transpose":
            return None
        rank = len(back.attr("perm") or ())
        if tuple(forth.attr("perm") or ()) != channels_last(rank) or tuple(
            back.attr("perm") or ()
        ) != channels_first(rank):
            return None
        nodes = (forth.label, *inner.nodes, back.label)
        return NormMatch(
            inner.kind, forth.input(0), name, inner.gamma, inner.beta, inner.eps, nodes
        )

    def last_axis_norm(self, name: str) -> NormMatch | None:
        """The norm over the last axis whose output is ``name``, else None."""
        output, passed = name, []
        node = self.producer(self.strip_casts(name))
        if node is None:
            return None
        fused = self.fused_norm(node, output)
        if fused is not None:
            return fused
        beta = gamma = None
        if node.op_type == "Add":
            beta, inner = self.constant_operand(node)
            if beta is not None:
                passed.append(node.label)
                node = self.producer(self.strip_casts(inner))
        if node is not None and node.op_type == "Mul":
            gamma, inner = self.constant_operand(node)
            if gamma is not None:
                passed.append(node.label)
                node = self.producer(self.strip_casts(inner))
        if node is None:
            return None
        core = self.norm_core(node)
        if core is None:
            return None
        kind, x, eps, nodes = core
        if kind == "rmsnorm" and beta is not None:
            return None
        return NormMatch(kind, x, output, gamma, beta, eps, tuple(nodes) + tuple(reversed(passed)))

    def split_norms(self, concat: Node) -> tuple[str, NormMatch] | None:
        """``(tensor split, first norm)`` for a ``Concat`` that joins, in order, one last-axis norm
        of each output of one ``Split`` along the same axis, which is not the last: per-head
        norms (StableLM's ``qk_layernorm``: the heads split apart, each normalised with its own γ,
        joined again). Every entry keeps its place, so the ``Concat`` is a step from the ``Split``
        input; else None.
        """
        found = [self.norm_ending_at(operand) for operand in concat.inputs]
        norms = [norm for norm in found if norm is not None]
        if not norms or len(norms) != len(found):
            return None
        split = self.producer(self.strip_casts(norms[0].input))
        rank = len(self.context.shape(concat.outputs[0]) or ())
        if split is None or split.op_type != "Split" or not rank:
            return None
        axes = {int(node.attr("axis", 0)) % rank for node in (split, concat)}
        inputs = tuple(self.strip_casts(norm.input) for norm in norms)
        if len(axes) != 1 or axes == {rank - 1} or inputs != tuple(split.outputs):
            return None
        return split.input(0), norms[0]

    def skip_sum(self, node: Node) -> str:
        """The sum ``input + skip (+ bias)`` of a fused skip norm: its optional fourth output.

        Where the graph leaves that output out, this is the name it gets when requested with
        :meth:`oversmooth.importers.graph.GraphIndex.name_output` (see :meth:`StreamMatcher.requested`).
        """
        outputs = node.outputs
        if len(outputs) > SKIP_SUM_OUTPUT and outputs[SKIP_SUM_OUTPUT]:
            return outputs[SKIP_SUM_OUTPUT]
        name, suffix = f"{node.label}/input_skip_bias_sum", 0
        while self.index.is_defined(name):
            suffix += 1
            name = f"{node.label}/input_skip_bias_sum_{suffix}"
        return name

    def fused_norm(self, node: Node, output: str) -> NormMatch | None:
        if node.op_type in SKIP_NORMS and node.outputs and output == node.outputs[0]:
            return NormMatch(
                SKIP_NORMS[node.op_type],
                self.skip_sum(node),
                output,
                node.input(2) or None,
                (node.input(3) or None) if node.op_type == "SkipLayerNormalization" else None,
                float(node.attr("epsilon", 1e-12)),
                (node.label,),
            )
        kinds: dict[str, NormKind] = {
            "LayerNormalization": "layernorm",
            "SimplifiedLayerNormalization": "rmsnorm",
            "RMSNormalization": "rmsnorm",
        }
        if node.op_type not in kinds:
            return None
        axis = int(node.attr("axis", -1))
        shape = self.context.shape(node.input(0))
        if axis != -1 and (shape is None or axis != len(shape) - 1):
            return None
        return NormMatch(
            kinds[node.op_type],
            node.input(0),
            output,
            node.input(1) or None,
            node.input(2) or None,
            float(node.attr("epsilon", 1e-5)),
            (node.label,),
        )

    def constant_operand(self, node: Node) -> tuple[str | None, str]:
        """(constant, other) for a binary node with one scalar or vector constant operand."""
        for const_pos in (1, 0):
            value = self.const(node.input(const_pos))
            if value is None or self.const(node.input(1 - const_pos)) is not None:
                continue
            if value.size == 1 or value.size == value.shape[-1]:
                return node.input(const_pos), node.input(1 - const_pos)
        return None, ""

    def norm_core(self, node: Node) -> tuple[NormKind, str, float | None, list[str]] | None:
        """``(x - mean) / sqrt(var + eps)`` (layernorm) or ``x / sqrt(mean(x²) + eps)`` (rmsnorm)."""
        if node.op_type == "Div":
            numerator, root = node.input(0), self.producer(node.input(1))
            root_nodes = [node.label]
        elif node.op_type == "Mul":
            numerator, root, root_nodes = None, None, [node.label]
            for pos in (0, 1):
                candidate = self.producer(node.input(pos))
                inner = self.reciprocal_root(candidate)
                if inner is not None and candidate is not None:
                    numerator, root = node.input(1 - pos), inner
                    root_nodes.append(candidate.label)
                    break
        else:
            return None
        if root is None or root.op_type != "Sqrt" or numerator is None:
            return None
        variance = self.variance(root.input(0))
        if variance is None:
            return None
        squared, eps, variance_nodes = variance
        numerator = self.strip_casts(numerator)
        centred = self.producer(numerator)
        if centred is not None and centred.op_type == "Sub":
            mean = self.producer(centred.input(1))
            if mean is None or mean.op_type != "ReduceMean" or mean.input(0) != centred.input(0):
                return None
            if not self.last_axis(mean) or self.strip_casts(squared) != numerator:
                return None
            nodes = [mean.label, centred.label, *variance_nodes, root.label, *root_nodes]
            return "layernorm", centred.input(0), eps, nodes
        if self.strip_casts(squared) != numerator:
            return None
        return "rmsnorm", numerator, eps, [*variance_nodes, root.label, *root_nodes]

    def reciprocal_root(self, node: Node | None) -> Node | None:
        if node is None:
            return None
        if node.op_type == "Reciprocal":
            return self.producer(node.input(0))
        if node.op_type == "Div":
            one = self.const(node.input(0))
            if one is not None and one.size == 1 and float(one.ravel()[0]) == 1.0:
                return self.producer(node.input(1))
        return None

    def variance(self, name: str) -> tuple[str, float | None, list[str]] | None:
        """``ReduceMean(Pow(y, 2) | Mul(y, y)) + eps`` → (y, eps, nodes)."""
        add = self.producer(name)
        if add is None or add.op_type != "Add":
            return None
        eps_name, mean_name = self.constant_operand(add)
        if eps_name is None:
            return None
        mean = self.producer(mean_name)
        if mean is None or mean.op_type != "ReduceMean" or not self.last_axis(mean):
            return None
        square = self.producer(mean.input(0))
        if square is None:
            return None
        if square.op_type == "Pow":
            exponent = self.const(square.input(1))
            if exponent is None or exponent.size != 1 or float(exponent.ravel()[0]) != 2.0:
                return None
        elif not (square.op_type == "Mul" and square.input(0) == square.input(1)):
            return None
        eps_value = self.const(eps_name)
        if eps_value is None:
            return None
        eps = float(eps_value.ravel()[0])
        return square.input(0), eps, [square.label, mean.label, add.label]

    def last_axis(self, reduce: Node) -> bool:
        axes = self.const(reduce.input(1)) if reduce.input(1) else reduce.attr("axes")
        if axes is None or len(np.ravel(axes)) != 1:
            return False
        axis = int(np.ravel(axes)[0])
        if axis == -1:
            return True
        shape = self.context.shape(reduce.input(0))
        return (shape is not None and axis == len(shape) - 1) or (shape is None and axis == 2)
