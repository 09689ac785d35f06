"""``oversmooth transform MODEL (--random-init | --reparam plus|minus) --out NEW.onnx``.

``--random-init [--std 0.02] [--seed S]`` re-initialises every trained parameter (matrices from
N(0, std²), scale vectors to 1, shift vectors to 0: the "random init" column of Table 1);
``--reparam plus|minus`` makes every head's effective product C diag(γ) W_V^h W_O^h diag(s) = Q Λ Q^T
with Λ > 0 or Λ in [-1, 0), the nearest such matrix to the trained one (the ViT⁺ / ViT⁻ columns;
``--h stored`` sets W_V^h W_O^h itself, the paper's protocol). Quantised weights are refused. The new
file is written atomically.
"""

from __future__ import annotations

import argparse
from typing import Literal

from oversmooth.commands.common import add_force_argument, add_model_argument
from oversmooth.importers.defaults import H_CHOICES


def register(subparsers: argparse._SubParsersAction) -> None:
    """Add ``transform`` to the dispatcher."""
    parser = subparsers.add_parser(
        "transform",
        help="write a random-init or ± reparameterised copy of a model",
        description=__doc__.splitlines()[0],
    )
    add_model_argument(parser)
    how = parser.add_mutually_exclusive_group(required=True)
    how.add_argument("--random-init", action="store_true", help="redraw every float weight matrix")
    how.add_argument(
        "--reparam",
        choices=("plus", "minus"),
        help="each head's effective product = Q Λ Q^T, Λ > 0 or in [-1, 0)",
    )
    parser.add_argument(
        "--h",
        choices=H_CHOICES,
        default=None,
        help="for --reparam: the product given the spectrum, the effective one (default: γ and "
        "LayerScale absorbed into W_V and W_O) or W_V^h W_O^h as stored",
    )
    parser.add_argument(
        "--std", type=float, default=None, help="standard deviation for --random-init (0.02)"
    )
    parser.add_argument("--seed", type=int, default=None, help="seed for --random-init (0)")
    parser.add_argument("--out", required=True, metavar="NEW.onnx", help="output file")
    add_force_argument(parser)
    parser.set_defaults(func=run)


def run(args: argparse.Namespace) -> int:
    from oversmooth.importers.errors import ImporterInputError
    from oversmooth.importers.transform import random_init, reparameterize

    if args.reparam and (args.std is not None or args.seed is not None):
        raise ImporterInputError(
            "`--std` and `--seed` apply to --random-init only; got them with --reparam"
        )
    if args.random_init and args.h is not None:
        raise ImporterInputError("`--h` applies to --reparam only; got it with --random-init")
    if args.random_init:
        args.std = 0.02 if args.std is None else args.std
        args.seed = 0 if args.seed is None else args.seed
        out = random_init(args.model, args.out, std=args.std, seed=args.seed, force=args.force)
        print(
            f"wrote {out}: every float weight matrix redrawn from N(0, {args.std}^2), seed "
            f"{args.seed}; scale vectors set to 1, shift vectors to 0"
        )
    else:
        h: Literal["effective", "stored"] = args.h or "effective"
        out = reparameterize(args.model, args.reparam, args.out, force=args.force, h=h)
        product = "effective product" if h == "effective" else "W_V W_O"
        spectrum = "> 0" if args.reparam == "plus" else "in [-1, 0)"
        print(f"wrote {out}: every head's {product} replaced by Q Λ Q^T with Λ {spectrum}")
    return 0
