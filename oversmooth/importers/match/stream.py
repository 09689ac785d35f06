"""The residual stream around an attention block: where it enters, where each branch closes, where
it leaves. These are the audit's layer tensors (:func:`oversmooth.importers.audit.pipeline.layer_tensors`).

Every residual sub-block has the same shape, whatever the exporter: a *stream* tensor S feeds a
branch (directly, or through a norm) and a *sum* adds the branch's result back to S. A sum is an
``Add`` of two non-constant tensors, or onnxruntime's fused ``SkipLayerNormalization`` /
``SkipSimplifiedLayerNormalization`` (``input + skip (+ bias)``, then normalised; the sum is its
optional fourth output, named in the loaded graph when the graph leaves it out). Casts, Reshape and
Flatten are *views*: the same stream in another dtype or layout.

From the attention branch's output the walk goes forward through sums until one adds the stream
the attention read (the attention input, or the input of the norm before it): that is the
attention residual. An extra summand on the way is a parallel branch (GPT-J, Falcon): it must be
computed from the same stream without attention. Pre-LN and norm-free blocks continue on the sum,
post-LN blocks on its norm; the MLP residual is the next sum on that stream whose other summand is
a branch computed from it (or, for parallel blocks, none is sought), and the block output is that
sum (pre-LN) or its norm (post-LN), in the layout of the block input. A branch is told from the
next block's attention by walking back from it: a branch reaches the stream without meeting an
attention Softmax (scores from a product of two activations); a mixture-of-experts router's Softmax
(scores ``x W``), TopK, gathers and scatters are part of the MLP branch. What cannot be established
is recorded in ``stream_error``, one line naming what was not found; the audit refuses such a block
instead of reading a guess.

A decoder layer's cross-attention (its queries read the stream, its keys and values another
sequence that is not computed from it: the encoder's output) is a sub-layer of the block like the
MLP: a branch whose Softmax reads the stream only through its queries is passed, so the block's
output is the stream after the whole decoder layer (self-attention, cross-attention, MLP), as
Hugging Face's ``hidden_states`` count it; the matcher skips the cross-attention itself by design
(:data:`~oversmooth.importers.match.codes.DISPOSITIONS`), and the block names the sum in a note.

Two variations are followed. A norm reading the attention output itself (Gemma-2, OLMo-2:
``h + norm(attention(h))``) is passed before the residual sum is sought, and the block lists it in
``departures``: the update is then not linear in the stream. A block whose input adds terms that do
not depend on the graph inputs to a stream (YOLOS adds position embeddings between blocks) records
that stream as ``input_base``, which the layer check accepts as the previous block's output.
"""

from __future__ import annotations

from dataclasses import dataclass, replace
from typing import Any

from oversmooth.importers.graph import Node
from oversmooth.importers.match.coverage import is_attention_softmax, score_operands, score_product
from oversmooth.importers.match.limits import (
    MAX_BRANCH_NODES,
    MAX_SUM_CHAIN,
    VIEW_FORWARD_DEPTH,
    VIEW_STEPS,
)
from oversmooth.importers.match.norms import (
    SKIP_NORMS,
    SKIP_SUM_OUTPUT,
    NormMatcher,
    channels_first,
    channels_last,
)
from oversmooth.importers.match.results import LinearMatch, NormKind, NormMatch, NormPosition

#: Ops that keep a tensor's values (dtype or layout only): the same stream.
VIEWS = frozenset({"Cast", "Identity", "Reshape", "Flatten", "Dropout", "Squeeze", "Unsqueeze"})


@dataclass(frozen=True)
class ResidualSum:
    """A residual sum: an ``Add`` of two non-constant tensors or a fused skip norm.

    ``terms`` are its two summands; ``output`` is the sum (for a skip norm, its optional fourth
    output, possibly still to be named); ``normed`` the skip norm's normalised output; ``branch``
    what the summand it closes is (:meth:`StreamMatcher.branch_kind`: ``"branch"``, or
    ``"cross-attention"`` for a decoder's cross-attention sub-layer).
    """

    node: Node
    terms: tuple[str, str]
    output: str
    normed: str | None
    branch: str = "branch"


@dataclass(frozen=True)
class BlockStream:
    """What :meth:`StreamMatcher.block_stream` found of one block's stream and norm.

    The first thirteen fields become :class:`~oversmooth.importers.match.results.AttentionBlock`'s of the same
    names; ``roles``, ``notes`` and ``departures`` are added to the block's own.
    """

    norm: NormPosition
    norm_kind: NormKind | None
    norm_match: NormMatch | None
    has_layer_scale: bool
    layer_scale_name: str | None
    input_name: str
    input_base: str | None
    residual_name: str | None
    norm_output_name: str | None
    output_name: str
    parallel: bool
    stream_error: str | None
    further_sums: int
    roles: dict[str, str]
    notes: tuple[str, ...]
    departures: tuple[str, ...]


def cross_attention_notes(sums: list[str]) -> tuple[str, ...]:
    """The note of a block whose layer holds cross-attention sub-layers (their residual sums)."""
    if not sums:
        return ()
    return (
        f"cross-attention sub-layer(s) inside this block's layer (residual sum "
        f"{', '.join(map(repr, sums))}): skipped by design, outside the theory; the block's "
        f"output is the stream after the whole layer",
    )


class StreamError(Exception):
    """Internal: the residual stream around a block could not be established (one line)."""


class StreamMatcher(NormMatcher):
    """Trace the residual stream through one block (see the module docstring)."""

    # -- views and sums ---------------------------------------------------------------------------
    def view_source(self, name: str) -> str:
        """``name`` with views (Cast, Reshape, ...) of a non-constant tensor undone, backwards."""
        for _ in range(VIEW_STEPS):
            node = self.producer(name)
            if node is None or node.op_type not in VIEWS or self.const(node.input(0)) is not None:
                break
            name = node.input(0)
        return name

    def views_forward(self, name: str) -> list[str]:
        """``name`` and the tensors that are views of it, forwards (breadth first)."""
        found, frontier = [name], [name]
        for _ in range(VIEW_FORWARD_DEPTH):
            frontier = [
                node.outputs[0]
                for tensor in frontier
                for node in self.consumers(tensor)
                if node.op_type in VIEWS and node.input(0) == tensor and node.outputs
            ]
            found += [tensor for tensor in frontier if tensor not in found]
        return found

    def as_sum(self, node: Node) -> ResidualSum | None:
        if node.op_type == "Add" and len(node.inputs) == 2:
            a, b = node.inputs
            if self.const(a) is None and self.const(b) is None:
                return ResidualSum(node, (a, b), node.outputs[0], None)
        if node.op_type in SKIP_NORMS and node.input(0) and node.input(1):
            return ResidualSum(
                node, (node.input(0), node.input(1)), self.skip_sum(node), node.outputs[0]
            )
        return None

    def sums_reading(self, name: str) -> list[tuple[ResidualSum, str]]:
        """(sum, its other summand) for every residual sum of ``name`` or one of its views."""
        found = []
        for view in self.views_forward(name):
            for node in self.consumers(view):
                total = self.as_sum(node)
                if total is not None and view in total.terms:
                    other = total.terms[1] if total.terms[0] == view else total.terms[0]
                    found.append((total, other))
        return found

    def rank(self, name: str) -> int | None:
        """The rank of ``name``: from the probe's shapes, else from the graph's value_info."""
        shape = self.context.shape(name)
        if shape is not None:
            return len(shape)
        return self.basis.remembered("declared ranks", "", self.declared_ranks).get(name)

    def declared_ranks(self) -> dict[str, int]:
        """The rank the graph's value_info (or outputs, which win) declares per tensor."""
        values = [*self.index.graph.value_info, *self.index.graph.output]
        return {
            value.name: len(value.type.tensor_type.shape.dim)
            for value in values
            if value.type.tensor_type.HasField("shape")
        }

    def in_layout_of(self, name: str, reference: str) -> str:
        """A view of ``name`` with the rank of ``reference`` (a 2-D MLP sum back in 3-D)."""
        want, have = self.rank(reference), self.rank(name)
        if want is None or have is None or have == want:
            return name
        for view in self.views_forward(name)[1:]:
            if self.rank(view) == want:
                return view
        raise StreamError(f"no view of {name!r} has the rank {want} of the block input")

    def branch_kind(self, term: str, streams: set[str]) -> str:
        """Whether ``term`` is computed from ``streams`` without self-attention: ``"branch"``,
        ``"cross-attention"`` (a branch through a cross-attention), ``"attention"`` (a Softmax
        on the way), ``"other"`` (it never reaches them) or ``"unknown"`` (too long to tell).
        Attention is a Softmax of scores from a product of two activations (``Q Kᵀ``,
        :func:`~oversmooth.importers.match.coverage.is_attention_softmax`); one whose keys are not computed
        from ``streams`` while its queries are (:meth:`queries_only`) is a cross-attention, part
        of the branch; a Softmax of scores ``x W`` (a mixture-of-experts router) is part of the
        branch, as is whatever else it contains (TopK, gathers, scatters, shared experts). Shape
        arithmetic is not followed; a fused skip norm whose sum is one of ``streams`` counts as
        reaching it (the branch reads its norm)."""
        frontier, seen, reached, cross = [term], set(), False, False
        while frontier:
            tensor = frontier.pop()
            if tensor in streams or self.view_source(tensor) in streams:
                reached = True
                continue
            node = self.producer(tensor)
            if node is None or node.position in seen or self.const(tensor) is not None:
                continue
            if node.op_type in SKIP_NORMS and self.skip_sum(node) in streams:
                reached = True
                continue
            seen.add(node.position)
            if node.op_type == "Softmax" and is_attention_softmax(self.index, node):
                if not self.queries_only(node, streams):
                    return "attention"
                cross = True
            if len(seen) > MAX_BRANCH_NODES:
                return "unknown"
            if node.op_type not in ("Shape", "Size"):
                frontier.extend(operand for operand in node.inputs if operand)
        if not reached:
            return "other"
        return "cross-attention" if cross else "branch"

    def queries_only(self, softmax: Node, streams: set[str]) -> bool:
        """Whether the attention of ``softmax`` reads ``streams`` only through its queries: the
        first factor of its score product (Q) is computed from them, the second (Kᵀ: another
        sequence, such as the encoder's output a decoder's cross-attention reads) is not."""
        product = score_product(self.index, softmax)
        if product is None:
            return False
        operands = score_operands(product)
        reading = [self.computed_from(operand, streams) for operand in operands]
        return reading == [True, False]

    # -- the block -------------------------------------------------------------------------------
    def attention_residual(
        self, branch: str, candidates: list[str]
    ) -> tuple[ResidualSum, str, list[str]]:
        """The sum closing the attention branch on one of ``candidates`` (the stream it read):
        (sum, that stream, summands passed on the way: parallel branches)."""
        wanted = {self.view_source(name): name for name in candidates}
        current, extra = branch, list[str]()
        for _ in range(MAX_SUM_CHAIN):
            sums = self.sums_reading(current)
            for total, other in sums:
                if self.view_source(other) in wanted:
                    return total, wanted[self.view_source(other)], extra
            if len(sums) != 1:
                break
            total, other = sums[0]
            extra.append(other)
            current = total.output
        raise StreamError(
            f"the residual sum adding the attention output {branch!r} to the stream it read "
            f"({', '.join(map(repr, candidates))}) was not found"
        )

    def mlp_residual(self, stream: str, streams: set[str]) -> ResidualSum | None:
        """The sum closing a non-attention branch (the MLP, or a cross-attention sub-layer:
        :attr:`ResidualSum.branch`) on ``stream``; None if it has none."""
        found, unknown = [], []
        for total, other in self.sums_reading(stream):
            kind = self.branch_kind(other, streams)
            if kind in ("branch", "cross-attention"):
                found.append(replace(total, branch=kind))
            elif kind == "unknown":
                unknown.append(total.node.label)
        if len(found) == 1:
            return found[0]
        if found:
            names = ", ".join(repr(total.node.label) for total in found)
            raise StreamError(f"the stream {stream!r} has several MLP residual sums ({names})")
        if unknown:
            raise StreamError(
                f"what the residual sum {unknown[0]!r} adds to the stream {stream!r} could not be "
                f"traced (over {MAX_BRANCH_NODES} nodes)"
            )
        return None

    def further_sublayers(
        self,
        output: str,
        streams: set[str],
        roles: dict[str, str],
        crossed: list[str],
        post_ln: bool = False,
    ) -> tuple[str, int]:
        """The stream after the residual sub-layers that follow before the next attention: more
        sums closing non-attention branches on it, each possibly after a norm of the stream (a
        Conformer's macaron block: the convolution module, the second half-step FFN, the layer's
        final LayerNorm and the next layer's first half-step FFN all lie between two
        attentions; a decoder layer: the MLP after its cross-attention); ``output`` itself where
        none follows (every encoder family). A post-LN block's stream continues on each sum's
        norm. The labels of the cross-attention sums passed are appended to ``crossed``. Returns
        that stream and the number of sums passed."""
        passed: list[str] = []
        count = 0
        for _ in range(MAX_SUM_CHAIN):
            streams = streams | {output, self.view_source(output)}
            total = self.mlp_residual(output, streams)
            if total is None:
                norm = self.norm_starting_at(output)
                if norm is None or post_ln:
                    break
                total = self.mlp_residual(norm.output, streams | {norm.output})
                if total is None:
                    break
                passed.append(f"{norm.kind} {', '.join(norm.nodes)}")
            passed.append(self.sum_label(total, crossed))
            count += 1
            output = self.post_norm(total).output if post_ln else self.requested(total.output)
        if passed:
            roles["further sub-layers"] = "; ".join(passed)
        return output, count

    @staticmethod
    def sum_label(total: ResidualSum, crossed: list[str]) -> str:
        """``Add 'name'`` (with `` (cross-attention)`` for a cross-attention sub-layer's sum,
        whose label is then appended to ``crossed``)."""
        label = f"{total.node.op_type} {total.node.label!r}"
        if total.branch != "cross-attention":
            return label
        crossed.append(total.node.label)
        return f"{label} (cross-attention)"

    def continues_on_sum(self, total: ResidualSum, norm: NormMatch, streams: set[str]) -> bool:
        """Whether the MLP residual adds its branch to the attention sum, not to the norm after it.

        Then that norm opens the MLP branch (a pre-LN MLP after an attention that reads the stream
        unnormalised, as in ModernBERT's first layer) and the block is not post-LN, whose MLP
        residual closes on the norm's output. Where neither closes an MLP (an attention-only
        post-LN model) or the sums cannot be traced, the norm stays post-LN.
        """
        on_sum = self.requested(total.output)
        try:
            if self.mlp_residual(norm.output, streams | {norm.output}) is not None:
                return False
            return (
                self.mlp_residual(on_sum, streams | {on_sum, self.view_source(on_sum)}) is not None
            )
        except StreamError:
            return False

    def before_constant_terms(self, name: str) -> str:
        """The stream ``name`` adds terms to that do not depend on the graph inputs' values.

        YOLOS adds position embeddings between blocks: block i reads block i-1's output plus a
        term computed from constants (and shapes) only. ``name`` itself when it adds none.
        """
        data = {name for name in self.index.graph_inputs if name not in self.index.initializers}
        for _ in range(MAX_SUM_CHAIN):
            node = self.producer(name)
            if node is None or node.op_type != "Add" or len(node.inputs) != 2:
                break
            varying = [operand for operand in node.inputs if self.depends_on(operand, data)]
            if len(varying) != 1:
                break
            name = varying[0]
        return name

    def post_norm(self, total: ResidualSum) -> NormMatch:
        """The norm of a post-LN sum (a skip norm's own, or the norm reading the sum)."""
        if total.normed is not None:
            norm = self.norm_ending_at(total.normed)
        else:
            norm = self.norm_starting_at(total.output)
        if norm is None:
            raise StreamError(f"no norm after the post-LN residual sum {total.node.label!r}")
        return norm

    def requested(self, name: str) -> str:
        """``name``; a fused skip norm's sum output that the graph left out is named now."""
        node = self.producer(name)
        if node is None and not self.index.is_defined(name):
            for candidate in self.index.nodes:
                if candidate.op_type in SKIP_NORMS and self.skip_sum(candidate) == name:
                    return self.index.name_output(candidate, SKIP_SUM_OUTPUT, name)
        return name

    def block_stream(self, x: str, o: LinearMatch) -> BlockStream:
        """Norm position and kind, LayerScale, and the block's stream tensors (see the module
        docstring); ``stream_error`` says what was not found, if anything. A norm reading the
        attention output itself (a branch norm before the residual sum) is passed, with a note."""
        attention_input = self.stream_tensor(x)
        branch = self.strip_reshapes_forward(o.output)
        layer_scale, branch = self.layer_scale_after(branch, o.d_out)
        roles: dict[str, str] = {}
        notes: tuple[str, ...] = ()
        if layer_scale is not None:
            roles["layer scale"] = f"Mul by constant {layer_scale!r}"
        branch_norm = self.norm_starting_at(branch)
        if branch_norm is not None:  # Gemma-2, OLMo-2: h + norm(attention(h))
            nodes = ", ".join(branch_norm.nodes)
            roles["branch norm"] = f"{branch_norm.kind}: {nodes}"
            notes = (
                f"the attention output is normalised before the residual sum ({branch_norm.kind} "
                f"{nodes}): the update is X + norm(A X W_V W_O), not linear in X",
            )
            branch = self.strip_reshapes_forward(branch_norm.output)
        pre = self.norm_ending_at(attention_input)
        candidates = ([self.strip_casts(pre.input)] if pre is not None else []) + [attention_input]
        result: dict[str, Any] = {
            "norm": "none",
            "norm_kind": None,
            "norm_match": None,
            "has_layer_scale": layer_scale is not None,
            "layer_scale_name": layer_scale,
            "input_name": candidates[0],
            "input_base": None,
            "residual_name": None,
            "norm_output_name": None,
            "output_name": o.output,
            "parallel": False,
            "stream_error": None,
            "further_sums": 0,
        }
        try:
            traced = self.trace_stream(branch, candidates, pre, roles)
            notes += cross_attention_notes(traced.pop("crossed"))
            result.update(traced)
            if o.channel_axis != -1:
                views = self.tokens_last(result, roles)
                notes += views.pop("notes")
                result.update(views)
        except StreamError as err:
            result["stream_error"] = str(err)
        norm_match = result["norm_match"]
        if isinstance(norm_match, NormMatch):
            result["norm_kind"] = norm_match.kind
            roles["norm"] = f"{result['norm']}-LN {norm_match.kind}: {', '.join(norm_match.nodes)}"
        departures = ("branch-norm",) if branch_norm is not None else ()
        return BlockStream(**result, roles=roles, notes=notes, departures=departures)

    def tokens_last(self, found: dict, roles: dict[str, str]) -> dict:
        """The stream tensors of a block whose stream is channel-first, (batch, features,
        tokens) (SqueezeBERT: W_O a 1×1 Conv writing the channels), as the graph's
        (batch, tokens, features) views of them, the layout the audit's layers take; a tensor
        the graph has no such view of is a :class:`StreamError`."""
        keys = ("input_name", "input_base", "residual_name", "norm_output_name", "output_name")
        views = {}
        for key in keys:
            if found.get(key) is None:
                continue
            view = self.channels_last_view(found[key])
            if view is None:
                raise StreamError(
                    f"the stream is channel-first and {found[key]!r} has no (batch, tokens, "
                    f"features) view in the graph"
                )
            views[key] = view
        roles["channel-first stream"] = "layers read as the graph's (batch, tokens, features) views"
        return views | {
            "notes": (
                "the residual stream is channel-first, (batch, features, tokens), its projections "
                "1×1 convolutions (SqueezeBERT): the layers are read as the graph's (batch, "
                "tokens, features) views of it",
            )
        }

    def channels_last_view(self, name: str) -> str | None:
        """The (batch, tokens, features) view of a channel-first stream tensor: the input of the
        Transpose that made it, the output of one that reads it, or ``name`` itself when it is
        the channels-last output of a norm of one (:meth:`norm_reading`); else None."""
        node = self.producer(name)
        rank = self.rank(name) or 0
        if node is not None and node.op_type == "Transpose":
            if tuple(node.attr("perm") or ()) == channels_first(rank):
                return node.input(0)
        for user in self.consumers(name):
            if user.op_type == "Transpose" and user.input(0) == name:
                if tuple(user.attr("perm") or ()) == channels_last(rank):
                    return user.outputs[0]
        norm = self.last_axis_norm(name)
        source = self.producer(norm.input) if norm is not None else None
        if source is not None and source.op_type == "Transpose":
            return name if tuple(source.attr("perm") or ()) == channels_last(rank) else None
        return None

    def trace_stream(
        self, branch: str, candidates: list[str], pre: NormMatch | None, roles: dict[str, str]
    ) -> dict:
        """The stream tensors of one block, or :class:`StreamError`."""
        residual, stream_in, extra = self.attention_residual(branch, candidates)
        stream_in = self.requested(stream_in)
        base = self.before_constant_terms(stream_in)
        found: dict = {"input_name": stream_in, "input_base": base if base != stream_in else None}
        streams = {stream_in, self.view_source(stream_in)}
        for term in extra:
            if self.branch_kind(term, streams) != "branch":
                raise StreamError(
                    f"the attention output is added to {term!r}, which is neither the stream "
                    f"nor a branch computed from it"
                )
        roles["residual"] = f"{residual.node.op_type} {residual.node.label!r}"
        if pre is not None and stream_in != candidates[-1]:
            found.update(norm="pre", norm_match=pre)
        if "norm" not in found and (residual.normed is not None or not extra):
            post = self.post_norm(residual) if residual.normed is not None else None
            post = post or self.norm_starting_at(residual.output)
            if post is not None and not self.continues_on_sum(residual, post, streams):
                found.update(norm="post", norm_match=post, norm_output_name=post.output)
        post_ln = found.get("norm") == "post"
        after = found.get("norm_output_name") or self.requested(residual.output)
        found["residual_name"] = self.requested(residual.output)
        if extra:
            found["parallel"] = True
            roles["parallel"] = f"attention and {len(extra)} other branch(es) read one stream"
            mlp: ResidualSum | None = residual
        else:
            streams |= {after, self.view_source(after)}
            mlp = self.mlp_residual(after, streams)
        crossed: list[str] = []
        found["further_sums"] = 0
        if mlp is None:
            output = after
            roles["MLP residual"] = "none (the next sum on the stream is attention)"
        else:
            if mlp is not residual:
                role = (
                    "cross-attention residual"
                    if mlp.branch == "cross-attention"
                    else "MLP residual"
                )
                roles[role] = self.sum_label(mlp, crossed)
            output = self.post_norm(mlp).output if post_ln else self.requested(mlp.output)
            if not extra:
                output, found["further_sums"] = self.further_sublayers(
                    output, streams, roles, crossed, post_ln
                )
        found["output_name"] = self.in_layout_of(output, stream_in)
        found["crossed"] = crossed
        return found
