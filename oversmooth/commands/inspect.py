"""``oversmooth inspect MODEL``: the attention blocks found in an ONNX graph, and why others were not.

Prints one row per block (index, heads, key/value heads, d_model, d_head, norm position, norm kind,
LayerScale, causal mask, rotary embedding — ``partial W/d_head`` when W columns per head are
rotated — and what else is added to the scores: ``score_bias`` none, alibi, relative,
disentangled or other). ``--json`` prints ``{"model", "opset", "n_softmax", "blocks": [...], "failures": [...]}``
instead (each block as :meth:`~oversmooth.importers.match.AttentionBlock.to_dict`, the same record as in
``audit.json``; each failure with ``attention`` and ``not_attention``, the reason a Softmax is
no attention at all, or null);
``--explain`` adds, for every Softmax, the nodes matched or the reason it was rejected. Attention
skipped by design, outside the theory (cross-attention, windowed attention), is listed first,
each block with its reason, and counts as no unmatched block. A Softmax
that is not attention (:func:`oversmooth.importers.match.coverage.not_attention_reason`: a classifier's, a
pooling, a gate, class probabilities returned as an output...) is listed as ``Softmax 'name': not
attention: <reason>`` and counts neither as a block nor as an unmatched one. Exit status 1
when no block matched (the message names the most common reasons), 2 for an unreadable model.
"""

from __future__ import annotations

import argparse
from typing import TYPE_CHECKING

from oversmooth.commands.common import add_model_argument, open_model
from oversmooth.simulator.output import to_json

if TYPE_CHECKING:
    from oversmooth.importers.graph import OnnxModel
    from oversmooth.importers.match import AttentionBlock, MatchReport

_COLUMNS = (
    "block",
    "heads",
    "kv_heads",
    "d_model",
    "d_head",
    "norm",
    "norm_kind",
    "layer_scale",
    "causal",
    "rotary",
    "score_bias",
)


def register(subparsers: argparse._SubParsersAction) -> None:
    """Add ``inspect`` to the dispatcher."""
    parser = subparsers.add_parser(
        "inspect",
        help="list the attention blocks found in an ONNX model",
        description=__doc__.splitlines()[0],
    )
    add_model_argument(parser)
    parser.add_argument("--json", action="store_true", help="print JSON instead of a table")
    parser.add_argument(
        "--explain",
        action="store_true",
        help="show, for each Softmax, the nodes matched or why it was rejected",
    )
    parser.set_defaults(func=run)


def run(args: argparse.Namespace) -> int:
    from oversmooth.importers.match import (
        MatchReport,
        NoAttentionBlocksError,
        find_attention_blocks,
    )

    model = open_model(args.model)
    try:
        report = find_attention_blocks(model)
    except NoAttentionBlocksError as err:
        if args.json:
            print(_as_json(model, MatchReport([], list(err.failures), len(err.failures))))
        elif args.explain:
            print(MatchReport([], list(err.failures), len(err.failures)).explain())
        raise
    if args.json:
        print(_as_json(model, report))
        return 0
    total = len(report.blocks) + len(report.unmatched) + len(report.skipped)
    if report.unmatched:  # said first: audit and weights refuse such a model without --partial
        print(
            f"{len(report.unmatched)} of {total} attention blocks NOT matched "
            f"({', '.join(repr(f.softmax) for f in report.unmatched)}): audit and weights refuse "
            "this model unless --partial (reasons: --explain)"
        )
    if report.skipped:  # outside the theory: the audit reads the other blocks and names these
        print(
            f"{len(report.skipped)} of {total} attention blocks skipped by design, outside the "
            "theory of self-attention (audit and weights read the others):"
        )
        for failure in report.skipped:
            print(f"  Softmax {failure.softmax!r} [{failure.code}]: {failure.reason}")
    print(f"model: {model.path} (opset {model.opset})")
    print(_table(report.blocks))
    for block in report.blocks:  # the rewrite of fused operators is said, never silent
        if block.defused_from is not None:
            print(f"block {block.index}: {block.defused_from}")
    from oversmooth.importers.match import departures_note

    departed = departures_note(report.blocks)
    if departed:
        print(departed)
    if model.read_through is not None:
        print(model.read_through.note())
    if args.explain:
        print(report.explain())
        return 0
    for failure in report.not_attention:  # counted neither as a block nor as a missing one
        print(f"Softmax {failure.softmax!r}: not attention: {failure.not_attention}")
    if report.unmatched:
        print(f"{len(report.unmatched)} other Softmax node(s) rejected (see --explain)")
    return 0


def _row(block: AttentionBlock) -> tuple[str, ...]:
    return (
        str(block.index),
        str(block.n_heads),
        str(block.n_kv_heads),
        str(block.d_model),
        str(block.d_head),
        block.norm,
        block.norm_kind or "-",
        "yes" if block.has_layer_scale else "no",
        "yes" if block.causal else "no",
        block.rotary_text,
        block.score_bias,
    )


def _table(blocks: list[AttentionBlock]) -> str:
    rows = [_COLUMNS, *(_row(block) for block in blocks)]
    widths = [max(len(row[i]) for row in rows) for i in range(len(_COLUMNS))]
    return "\n".join(
        "  ".join(cell.ljust(width) for cell, width in zip(row, widths, strict=True)).rstrip()
        for row in rows
    )


def _as_json(model: OnnxModel, report: MatchReport) -> str:
    return to_json({"model": model.path, "opset": model.opset, **report.to_dict()})
