"""A post-LN block's attention sublayer as the theory defines it: the residual sum before its norm.

A post-LN block computes ``Y = LN(X + branch(X))``; the theory's update is the sum
``X + branch(X)`` (docs/theory.md §6.6), and the norm after it rescales every token. onnxruntime fuses
the sum and the norm into one ``SkipLayerNormalization``: reading the sum as a graph output would
stop that fusion and change the block's output in its last bits. So the sum is read from the graph
onnxruntime has already optimised (:mod:`oversmooth.importers.runtime.graph_edits`): the fused
node's own sum output, or the ``Add`` where nothing was fused. Where the sum is found, the norm
output's statistics are not computed (they would be measured and never reported): only its rows
stay in the plan (the operating point and the attribution read them); where it is not, the norm
output is measured instead, as a note says.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

from oversmooth.importers.graph import OnnxModel
from oversmooth.importers.match import AttentionBlock
from oversmooth.importers.notes import Note
from oversmooth.importers.runtime.graph_edits import LateOutputs, optimised_product_of_itself
from oversmooth.importers.runtime.reductions import GraphExtension, ReductionPlan, extend_plan

__all__ = ["PreNormSums", "pre_norm_notes"]


class PreNormSums:
    """The post-LN blocks' residual sums before their norm, read after onnxruntime optimised the
    graph (:class:`LateOutputs`).

    Attributes
    ----------
    wanted : list of int
        The positions of the post-LN blocks among ``blocks`` that have both a residual sum and a
        norm output (and an attention sublayer: one of ``sublayers``).
    blocks : list of int
        Those whose sum was found in the optimised graph, once the runner has looked
        (:meth:`outputs`); their statistics are the last layers of :attr:`plan`, in this order.
    plan : ReductionPlan
        The plan given, extended by the found sums (:func:`extend_plan`), which replace the
        statistics of those blocks' norm outputs (:attr:`ReductionPlan.replaced`).
    """

    def __init__(
        self,
        graph: OnnxModel,
        blocks: Sequence[AttentionBlock],
        sublayers: Sequence[int],
        plan: ReductionPlan,
        first_sublayer: int,
    ) -> None:
        """``sublayers``: the blocks whose norm output (the stream after the attention sublayer)
        is layer ``first_sublayer + j`` of ``plan``, j its position here."""
        self.graph, self.all_blocks, self.plan = graph, blocks, plan
        self._sublayer_layer = {i: first_sublayer + j for j, i in enumerate(sublayers)}
        self.wanted = [
            i
            for i in sublayers
            if blocks[i].norm == "post" and blocks[i].residual_name and blocks[i].norm_output_name
        ]
        self.blocks: list[int] = []

    def outputs(self) -> LateOutputs | None:
        """What the :class:`~oversmooth.importers.runtime.runner.Runner` reads late, or None."""
        if not self.wanted:
            return None
        sums = {
            str(self.all_blocks[i].residual_name): str(self.all_blocks[i].norm_output_name)
            for i in self.wanted
        }
        return LateOutputs(sums, self._extension)

    def _extension(self, found: Sequence[str | None], optimised: Any) -> GraphExtension:
        """The late statistics of the sums ``found`` in the ``optimised`` graph, their Gram
        matrices written as onnxruntime wrote the first extension's there."""
        kept = [(i, name) for i, name in zip(self.wanted, found, strict=True) if name is not None]
        self.blocks = [i for i, _ in kept]
        time_major = [self.all_blocks[i].time_major for i, _ in kept]
        plan = self.plan
        grams = [plan.gram_name(k) for k in range(len(plan.layers)) if plan.computes(k)]
        self.plan = extend_plan(
            plan,
            self.graph,
            [name for _, name in kept],
            time_major=time_major,
            replacing=[self._sublayer_layer[i] for i in self.blocks],
            gram_as=optimised_product_of_itself(optimised, grams) if plan.gram != "none" else None,
        )
        return self.plan.late


def pre_norm_notes(blocks: Sequence[AttentionBlock], runner: Mapping[str, Any]) -> list[Note]:
    """One note naming the post-LN blocks whose sum before the norm the session did not find
    (``runner``: :meth:`~oversmooth.importers.runtime.runner.Runner.provenance`): their attention
    sublayer is measured after the norm."""
    unread = set(runner.get("not_found_after_optimisation", ()))
    found = [block.index for block in blocks if block.residual_name in unread]
    if not found:
        return []
    return [
        Note(
            "layers",
            f"the attention sublayer of post-LN block(s) {', '.join(map(str, found))} is "
            "measured after the norm: the residual sum before it was not found in the graph "
            "onnxruntime optimised (a model with external data, or a fusion without a sum output)",
        )
    ]
