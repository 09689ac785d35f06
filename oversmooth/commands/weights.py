"""``oversmooth weights MODEL --out W.npz``: every attention block's weights as float64 arrays.

Keys are ``blocks.{i}.W_Q`` (d_model × n_heads·d_head), ``.W_K``, ``.W_V`` (d_model × n_kv_heads·d_head),
``.W_O`` (n_heads·d_head × d_model), and when present ``.b_Q``, ``.b_K``, ``.b_V``, ``.b_O``, ``.gamma``,
``.beta``, ``.layer_scale``, in the row-vector convention ``y = x @ W`` with heads as contiguous
column blocks (rows for W_O). The file is written atomically: on any error nothing is left behind.
"""

from __future__ import annotations

import argparse
from pathlib import Path
from typing import Any

from oversmooth.commands.common import add_force_argument, add_model_argument, open_model


def register(subparsers: argparse._SubParsersAction) -> None:
    """Add ``weights`` to the dispatcher."""
    parser = subparsers.add_parser(
        "weights",
        help="write every attention block's weights to an .npz file",
        description=__doc__.splitlines()[0],
    )
    add_model_argument(parser)
    parser.add_argument("--out", required=True, metavar="W.npz", help="output file")
    add_force_argument(parser)
    parser.add_argument(
        "--partial",
        action="store_true",
        help="accept a model whose attention is only partly matched (says first what is missing)",
    )
    parser.set_defaults(func=run)


def run(args: argparse.Namespace) -> int:
    import numpy as np

    from oversmooth.importers.match import (
        check_complete,
        find_attention_blocks,
        missing_blocks_note,
        skipped_blocks_note,
    )
    from oversmooth.importers.weights import block_weights
    from oversmooth.simulator.output import atomic_output

    model = open_model(args.model)
    report = find_attention_blocks(model)
    check_complete(report, partial=args.partial)
    if report.unmatched:
        print(missing_blocks_note(report))
    if report.skipped:
        print(skipped_blocks_note(report))
    blocks = [block_weights(model, block) for block in report.blocks]
    arrays: dict[str, Any] = {
        f"blocks.{block.index}.{key}": value
        for block in blocks
        for key, value in block.arrays().items()
    }
    ours = None if args.force else _is_weights_file
    with atomic_output(args.out, "wb", label="--out", ours=ours) as handle:
        np.savez(handle, **arrays)
    print(f"wrote {args.out}: {len(blocks)} block(s), {len(arrays)} arrays")
    return 0


def _is_weights_file(path: Path) -> bool:
    """Whether ``path`` is an earlier ``oversmooth weights`` archive (only ``blocks.*`` arrays)."""
    from oversmooth.simulator.output import npz_members

    members = npz_members(path)
    return members is not None and bool(members) and all(n.startswith("blocks.") for n in members)
