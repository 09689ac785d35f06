"""``oversmooth transform MODEL (--random-init | --reparam plus|minus) --out NEW.onnx``.

``--random-init [--std 0.02] [--seed S]`` redraws every float weight matrix (the "random init" column of
Table 1); ``--reparam plus|minus`` makes every head's W_V^h W_O^h = Q Λ Q^T with Λ > 0 or Λ in [-1, 0),
the nearest such matrix to the trained one (the ViT⁺ / ViT⁻ columns). Quantised weights are refused.
The new file is written atomically.
"""

from __future__ import annotations

import argparse

from oversmooth.commands.common import add_force_argument, add_model_argument


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
        "--reparam", choices=("plus", "minus"), help="W_V^h W_O^h = Q Λ Q^T, Λ > 0 or in [-1, 0)"
    )
    parser.add_argument(
        "--std", type=float, default=None, help="standard deviation for --random-init (0.02)"
    )
    parser.add_argument("--seed", type=int, default=None, help="seed for --random-init (0)")
    parser.add_argument("--out", required=True, metavar="NEW.onnx", help="output file")
    add_force_argument(parser)
    parser.set_defaults(func=run)


def run(args: argparse.Namespace) -> int:
    from importers.errors import ImporterInputError
    from importers.transform import random_init, reparameterize

    if args.reparam and (args.std is not None or args.seed is not None):
        raise ImporterInputError(
            "`--std` and `--seed` apply to --random-init only; got them with --reparam"
        )
    if args.random_init:
        args.std = 0.02 if args.std is None else args.std
        args.seed = 0 if args.seed is None else args.seed
        out = random_init(args.model, args.out, std=args.std, seed=args.seed, force=args.force)
        print(
            f"wrote {out}: every float weight matrix redrawn from N(0, {args.std}^2), seed {args.seed}"
        )
    else:
        out = reparameterize(args.model, args.reparam, args.out, force=args.force)
        print(
            f"wrote {out}: every head's W_V W_O replaced by Q Λ Q^T with Λ {'> 0' if args.reparam == 'plus' else 'in [-1, 0)'}"
        )
    return 0
