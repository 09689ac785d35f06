"""Rotary embeddings on the walk back from an attention operand to its projection.

``Add(Mul(x, cos), Mul(rotate(x), sin))`` where ``rotate`` is rotate-half (``Concat(-x2, x1)``) or
GPT-J's interleaved rotate-every-two (``Concat(Unsqueeze(-x[1::2]), Unsqueeze(x[::2]))`` flattened
by a ``Reshape``) is a step from ``x`` (:meth:`RotaryMatcher.rope_match`). A partial rotary
embedding (GPT-NeoX, Phi, Phi-3, GPT-J: only the first ``rotary_dim`` columns of each head are
rotated) is a ``Concat`` of the rotated slice and the pass-through slice of the same head-split
tensor; it is a step from that tensor when re-assembling a probe of it through the Concat's pieces
(the rotary ``Add`` taken as identity) gives the tensor back unchanged
(:meth:`RotaryMatcher.partial_rotary`). The same re-assembly along the token axis (the scores'
rows) is a rotary embedding applied to some tokens only (EVA rotates the patch tokens and
concatenates the class token back unrotated). ONNX's and onnxruntime's ``RotaryEmbedding`` operators
rotate in place (:meth:`RotaryMatcher.rotary_op`), also as the rotated piece of a partial rotary
embedding (onnxruntime's optimizer fuses Phi-3's rotation of the sliced head into one). :mod:`oversmooth.importers.match.projections` takes these
steps; W_Q and W_K are the weights before the rotation.
"""

from __future__ import annotations

import numpy as np

from oversmooth.importers.graph import Node
from oversmooth.importers.match.codes import RejectCode
from oversmooth.importers.match.layout_ops import apply_layout
from oversmooth.importers.match.limits import MAX_WALK
from oversmooth.importers.match.walker import GraphWalker, RejectError

#: Ops followed back from the pieces of a partial rotary embedding's Concat.
_ROTARY_PATH_OPS = frozenset(
    "Slice Cast Identity Transpose Reshape Squeeze Unsqueeze Flatten".split()
)


class RotaryMatcher(GraphWalker):
    """Recognise rotary embeddings (full, partial, interleaved, operators) by structure."""

    def rope_match(self, node: Node) -> tuple[str, str] | None:
        """(x, style) for ``Add(Mul(x, cos), Mul(rotate(x), sin))``, else None; style is
        ``"rotate-half"`` or ``"interleaved"`` (GPT-J's rotate-every-two)."""
        if node.op_type != "Add":
            return None
        muls = [self.producer(operand) for operand in node.inputs]
        pair = [mul for mul in muls if mul is not None and mul.op_type == "Mul"]
        if len(muls) != 2 or len(pair) != 2:
            return None
        for plain, rotated in (pair, pair[::-1]):
            for x in plain.inputs:
                for operand in rotated.inputs:
                    style = self.rotation_style(operand, x)
                    if style:
                        return x, style
        return None

    def rotation_style(self, name: str, x: str) -> str:
        """How ``name`` rotates ``x``: ``"rotate-half"`` (``Concat(-x2, x1)``), ``"interleaved"``
        (``Reshape(Concat(Unsqueeze(-x[1::2]), Unsqueeze(x[::2])))``), or "" for neither.

        Where ``x = Transpose(y)`` and the rotation is ``Transpose(rotate(y))`` with the same
        permutation, keeping the last axis (onnxruntime's transpose optimizer moves the head
        transpose past the rotation: ESM), it rotates ``x`` too.
        """
        node = self.producer(self.strip_casts(name))
        if node is not None and node.op_type == "Transpose":
            perm = node.attr("perm")
            before = self.producer(x)
            if (
                perm is None
                or list(perm)[-1] != len(perm) - 1
                or before is None
                or before.op_type != "Transpose"
                or list(before.attr("perm") or []) != list(perm)
            ):
                return ""
            node, x = self.producer(self.strip_casts(node.input(0))), before.input(0)
        style = "rotate-half"
        if node is not None and node.op_type in ("Reshape", "Flatten"):
            node, style = self.producer(self.strip_casts(node.input(0))), "interleaved"
        if node is None or node.op_type != "Concat" or len(node.inputs) != 2:
            return ""
        negated = False
        for part in node.inputs:
            current = self.producer(part)
            while (
                part != x
                and current is not None
                and current.op_type
                in (
                    "Neg",
                    "Slice",
                    "Split",
                    "Cast",
                    "Identity",
                    "Unsqueeze",
                )
            ):
                negated |= current.op_type == "Neg"
                part = current.input(0)
                current = self.producer(part)
            if part != x:
                return ""
        return style if negated else ""

    def rotary_op(self, node: Node) -> tuple[str, int | None]:
        """(style, rotated width or None for all columns) of a ``RotaryEmbedding`` operator.

        ONNX's (opset 23) and onnxruntime's operator rotate the first ``rotary_embedding_dim``
        columns of each head (all when 0) by position, rotate-half or ``interleaved``; either way
        a value-preserving step for the layout probe, so W_Q and W_K are read before it.
        """
        style = self.operator_style(node)
        width = int(node.attr("rotary_embedding_dim", 0))
        if width:
            return f"partial {style} on the first {width} columns of each head (operator)", width
        return f"full {style} (operator)", None

    def operator_style(self, node: Node) -> str:
        """``"interleaved"`` or ``"rotate-half"``: the rotation of a ``RotaryEmbedding`` operator
        that only rotates (one that also scales is rejected)."""
        if float(node.attr("scale", 1.0)) != 1.0:
            raise RejectError(
                RejectCode.ROTARY_SCALE,
                f"RotaryEmbedding {node.label!r} also scales by {node.attr('scale')}; expected a "
                f"plain rotation",
                (node.label,),
            )
        return "interleaved" if int(node.attr("interleaved", 0)) else "rotate-half"

    def rotation(self, node: Node) -> tuple[str, str] | None:
        """(x, style) when ``node`` rotates ``x`` in place: a decomposed rotary ``Add``
        (:meth:`rope_match`) or a ``RotaryEmbedding`` operator (:meth:`rotary_op`; onnxruntime's
        optimizer fuses Phi-3's rotation of the sliced head into one), else None."""
        if node.op_type != "RotaryEmbedding":
            return self.rope_match(node)
        if not node.input(0) or int(node.attr("rotary_embedding_dim", 0)):
            return None  # a partial operator inside a partial slice: its width is not the slice's
        return node.input(0), self.operator_style(node)

    def partial_rotary(self, node: Node) -> tuple[str, str, int | None] | None:
        """(x, description, columns rotated per head) when the Concat ``node`` re-assembles ``x``
        from slices of it, some passed through a rotary embedding (a partial rotary embedding),
        else None; the width is None when every column is rotated.

        The pieces are followed back through value-preserving layout ops and rotary ``Add`` s to
        their nearest common ancestor; with a probe in its place (the rotary ``Add`` s taken as
        identity), ``x`` is the tensor on the rotated piece's path, nearest the Concat, whose
        probe value is the Concat's (an optimiser may move a Transpose onto one piece only).
        """
        if len(node.inputs) < 2:
            return None
        chains: list[list[tuple[str, bool]]] = []
        for part in node.inputs:
            chain, rotated, name = [], False, part
            for _ in range(MAX_WALK):
                chain.append((name, rotated))
                producer = self.producer(name)
                if producer is None:
                    break
                if producer.op_type in _ROTARY_PATH_OPS and producer.input(0):
                    name = producer.input(0)
                    continue
                match = self.rotation(producer)
                if match is None:
                    break
                rotated, name = True, match[0]
            chains.append(chain)
        common = [
            name
            for name, _ in chains[0]
            if all(any(name == other for other, _ in chain) for chain in chains[1:])
        ]
        if not common:
            return None
        ancestor = common[0]
        rotated_parts = [
            (part, chain)
            for part, chain in zip(node.inputs, chains, strict=True)
            if dict(chain)[ancestor]
        ]
        if not rotated_parts or len(rotated_parts) == len(node.inputs):
            return None
        shape = self.context.shape(ancestor)
        if not shape:
            return None
        probe = np.arange(int(np.prod(shape)), dtype=np.float64).reshape(shape)
        memo: dict[str, np.ndarray | None] = {}
        try:
            assembled = self.reassemble(node.outputs[0], ancestor, probe, memo)
            if assembled is None:
                return None
            x = ""
            for name, rotated in rotated_parts[0][1]:
                if rotated:
                    value = self.reassemble(name, ancestor, probe, memo)
                    if value is not None and value.shape == assembled.shape:
                        if (value == assembled).all():
                            x = name
                            break
        except (ValueError, TypeError, IndexError):
            return None
        if not x:
            return None
        axis = int(node.attr("axis", 0)) % assembled.ndim
        widths = [memo.get(part) for part, _ in rotated_parts]
        if axis < assembled.ndim - 2 or any(w is None for w in widths):
            return None
        width = sum(int(w.shape[axis]) for w in widths if w is not None)
        styles = {
            match[1]
            for _, chain in rotated_parts
            for name, _ in chain
            if (producer := self.producer(name)) is not None
            and (match := self.rotation(producer)) is not None
        }
        if axis == assembled.ndim - 2:  # EVA: the patch tokens rotated, the class token not
            return (
                x,
                f"full {'/'.join(sorted(styles))} on {width} of {assembled.shape[axis]} tokens "
                f"(the others, such as a class token, are not rotated)",
                None,
            )
        if width == assembled.shape[-1]:  # Phi-3: the pass-through slice is empty
            return x, f"full {'/'.join(sorted(styles))}", None
        return (
            x,
            f"partial {'/'.join(sorted(styles))} on the first {width} of "
            f"{assembled.shape[-1]} columns of each head",
            width,
        )

    def rotated_copy(self, name: str, x: str) -> str:
        """The rotary style when ``name`` is ``x`` rotated in place: reached back from ``name``
        through value-preserving layout ops and at least one rotary ``Add``, and equal to ``x``
        with those taken as identity (wav2vec2-conformer rotates the stream before its Q/K
        projections); else ""."""
        styles, current = [], name
        for _ in range(MAX_WALK):
            producer = self.producer(current)
            if current == x or producer is None:
                break
            if producer.op_type in _ROTARY_PATH_OPS and producer.input(0):
                current = producer.input(0)
                continue
            match = self.rope_match(producer)
            if match is None:
                return ""
            styles.append(match[1])
            current = match[0]
        shape = self.context.shape(x)
        if current != x or not styles or not shape:
            return ""
        probe = np.arange(int(np.prod(shape)), dtype=np.float64).reshape(shape)
        try:
            value = self.reassemble(name, x, probe, {})
        except (ValueError, TypeError, IndexError):
            return ""
        if value is None or value.shape != probe.shape or not (value == probe).all():
            return ""
        return "/".join(sorted(set(styles)))

    def reassemble(
        self, name: str, x: str, probe: np.ndarray, memo: dict[str, np.ndarray | None]
    ) -> np.ndarray | None:
        """The value of ``name`` when ``x`` is ``probe``, through value-preserving layout ops and
        Concat, a rotary ``Add`` taken as identity; None for any other op."""
        if name == x:
            return probe
        if name in memo:
            return memo[name]
        node = self.producer(name)
        result: np.ndarray | None = None
        if node is not None:
            if node.op_type in ("Cast", "Identity"):
                result = self.reassemble(node.input(0), x, probe, memo)
            elif node.op_type in _ROTARY_PATH_OPS:
                data = self.reassemble(node.input(0), x, probe, memo)
                values = [
                    self.context.value(operand) if operand else None for operand in node.inputs[1:]
                ]
                if data is not None:
                    result = apply_layout(node, data, values, node.outputs.index(name))
            elif node.op_type == "Concat":
                parts = [self.reassemble(part, x, probe, memo) for part in node.inputs]
                if all(part is not None for part in parts):
                    result = np.concatenate(
                        [part for part in parts if part is not None],
                        axis=int(node.attr("axis", 0)),
                    )
            else:
                match = self.rotation(node)
                if match is not None:
                    result = self.reassemble(match[0], x, probe, memo)
        memo[name] = result
        return result
