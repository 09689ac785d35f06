"""``oversmooth spectra MODEL --out spectra.csv``: eigenvalues of the value products per head and layer.

Writes tidy rows ``layer,head,kind,real,imag``. ``kind`` is ``head`` (the d_head eigenvalues of
W_O^h W_V^h, i.e. the nonzero ones of W_V^h W_O^h, as stored), ``layer`` (the d eigenvalues of
W_V W_O), and ``head-effective``/``layer-effective``, the same of the effective H (the pre-norm's
centring and γ before W_V, LayerScale after W_O: :mod:`oversmooth.importers.value_spectra`). Layer-level rows
have ``head`` = -1. ``--summary`` also prints, per kind, the count, the share with negative real
part, the median real part, the share inside |1 + λ| < 1 and the spectral radius. The CSV is
written atomically.
"""

from __future__ import annotations

import argparse

from oversmooth.commands.common import add_force_argument, add_model_argument, open_model


def register(subparsers: argparse._SubParsersAction) -> None:
    """Add ``spectra`` to the dispatcher."""
    parser = subparsers.add_parser(
        "spectra",
        help="write the eigenvalues of the value products per head and per layer, stored and "
        "effective, to CSV",
        description=__doc__.splitlines()[0],
    )
    add_model_argument(parser)
    parser.add_argument("--out", required=True, metavar="spectra.csv", help="output CSV")
    add_force_argument(parser)
    parser.add_argument(
        "--summary",
        action="store_true",
        help="print negative share, median real part, share in |1+λ|<1 and spectral radius per kind",
    )
    parser.set_defaults(func=run)


def run(args: argparse.Namespace) -> int:
    from oversmooth.importers.value_spectra import SPECTRA_COLUMNS, model_spectra, summarize_spectra
    from oversmooth.importers.weights import extract
    from oversmooth.simulator.output import write_tidy_csv

    blocks = extract(open_model(args.model))
    rows = model_spectra(blocks)
    cells = ((r.block, r.head, r.kind, r.real, r.imag) for r in rows)
    write_tidy_csv(args.out, SPECTRA_COLUMNS, cells, label="--out", replace_any=args.force)
    print(f"wrote {args.out}: {len(rows)} eigenvalues from {len(blocks)} block(s)")
    if args.summary:
        print(
            f"{'kind':<16} {'count':>6} {'negative':>9} {'median':>9} {'in_disk':>8} {'radius':>10}"
        )
        for summary in summarize_spectra(rows).values():
            print(
                f"{summary.kind:<16} {summary.count:>6} {summary.negative_fraction:>9.3f} "
                f"{summary.median_real:>9.3g} {summary.inside_unit_disk:>8.3f} "
                f"{summary.spectral_radius:>10.4g}"
            )
    return 0
