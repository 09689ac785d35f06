"""``oversmooth spectra MODEL --out spectra.csv``: eigenvalues of W_V W_O per head and per layer.

Writes tidy rows ``layer,head,kind,real,imag``. ``kind`` is ``head`` (the d_head eigenvalues of
W_O^h W_V^h, i.e. the nonzero ones of W_V^h W_O^h), ``layer`` (the d eigenvalues of W_V W_O),
and for pre-LN blocks also ``head-gamma`` and ``layer-gamma`` (diag(γ) folded in front of W_V).
Layer-level rows have ``head`` = -1. ``--summary`` also prints, per kind, the count, the fraction
with negative real part, the skewness of the real parts and the spectral radius. The CSV is
written atomically.
"""

from __future__ import annotations

import argparse

from oversmooth.commands.common import add_force_argument, add_model_argument, open_model


def register(subparsers: argparse._SubParsersAction) -> None:
    """Add ``spectra`` to the dispatcher."""
    parser = subparsers.add_parser(
        "spectra",
        help="write the eigenvalues of W_V W_O per head and per layer to CSV",
        description=__doc__.splitlines()[0],
    )
    add_model_argument(parser)
    parser.add_argument("--out", required=True, metavar="spectra.csv", help="output CSV")
    add_force_argument(parser)
    parser.add_argument(
        "--summary",
        action="store_true",
        help="print negative fraction, skewness and spectral radius per kind",
    )
    parser.set_defaults(func=run)


def run(args: argparse.Namespace) -> int:
    from importers.value_spectra import SPECTRA_COLUMNS, model_spectra, summarize_spectra
    from importers.weights import extract
    from simulator.output import write_tidy_csv

    blocks = extract(open_model(args.model))
    rows = model_spectra(blocks)
    cells = ((r.layer, r.head, r.kind, r.real, r.imag) for r in rows)
    write_tidy_csv(args.out, SPECTRA_COLUMNS, cells, label="--out", replace_any=args.force)
    print(f"wrote {args.out}: {len(rows)} eigenvalues from {len(blocks)} block(s)")
    if args.summary:
        print(f"{'kind':<12} {'count':>6} {'negative':>9} {'skewness':>9} {'radius':>10}")
        for summary in summarize_spectra(rows).values():
            print(
                f"{summary.kind:<12} {summary.count:>6} {summary.negative_fraction:>9.3f} "
                f"{summary.skewness:>9.3f} {summary.spectral_radius:>10.4g}"
            )
    return 0
