"""``oversmooth audit``: the main job.

The measurement lives in :mod:`oversmooth.importers.audit.pipeline`, the pictures in :mod:`oversmooth.figures.audit_report`,
the report folder in :mod:`oversmooth.report`; this command turns the arguments into those calls
and prints a summary.
"""

from __future__ import annotations

import argparse
import sys
from collections.abc import Sequence
from pathlib import Path
from typing import TYPE_CHECKING

from oversmooth.commands.common import add_scheduler_options, count_or_rule, positive_int
from oversmooth.importers.defaults import (
    AUTO_EVERY,
    AUTO_FIRST,
    AUTO_WIDTH,
    BATCH_SIZE,
    DEPTH_INPUTS,
    DOMINANCE_MODES,
    H_CHOICES,
    OPERATOR_INPUTS,
    PROVIDERS,
    RANDOM_SEQ_LEN,
    RANDOM_VOCAB_SIZE,
)
from oversmooth.importers.errors import ImporterInputError
from oversmooth.importers.zoo import ZooModel, lookup

if TYPE_CHECKING:  # types only: the audit's modules (onnx, the matcher) load when the command runs
    from oversmooth.importers.audit import AuditResult
    from oversmooth.importers.audit.pipeline import AuditOptions
    from oversmooth.importers.graph import GraphInput
    from oversmooth.importers.inputs import Inputs

DEFAULT_MODEL = "dinov2-vits14"


def register(subparsers: argparse._SubParsersAction) -> None:
    """Add the ``audit`` subcommand."""
    p = subparsers.add_parser(
        "audit",
        help="run a model on real inputs: per-layer smoothing, dominating eigenvalues, spectra, report",
        description="Audit an ONNX Transformer (default: the embedded dinov2-vits14 on bundled photographs).",
    )
    p.add_argument(
        "model",
        nargs="?",
        default=DEFAULT_MODEL,
        help=f"ONNX file or zoo name (default {DEFAULT_MODEL}; see `oversmooth models`)",
    )
    p.add_argument(
        "--out",
        type=Path,
        help="report folder (default audit-NAME); an earlier report there is replaced atomically",
    )
    p.add_argument(
        "--force", action="store_true", help="replace a non-empty --out folder that is not a report"
    )
    source = p.add_mutually_exclusive_group()
    source.add_argument(
        "--inputs",
        type=Path,
        metavar="X.npz",
        help="feeds keyed by graph input name, batch first (or a folder of such .npz shards)",
    )
    source.add_argument(
        "--images", type=Path, metavar="DIR", help="a folder of images (resized, normalised)"
    )
    source.add_argument(
        "--text", type=Path, metavar="FILE", help="one sentence per line (needs --tokenizer)"
    )
    source.add_argument(
        "--random",
        type=positive_int,
        metavar="N",
        help="N random inputs (labelled random in the report)",
    )
    p.add_argument(
        "--tokenizer", type=Path, metavar="tokenizer.json", help="Hugging Face tokenizer for --text"
    )
    p.add_argument(
        "--image-size", type=positive_int, help="image side in pixels (default: the model's)"
    )
    p.add_argument(
        "--mean",
        type=float,
        nargs=3,
        help="RGB mean for --images (default: the model's, else ImageNet's)",
    )
    p.add_argument(
        "--std",
        type=float,
        nargs=3,
        help="RGB std for --images (default: the model's, else ImageNet's)",
    )
    p.add_argument(
        "--seq-len",
        type=positive_int,
        help="size of every open axis after the first in random inputs: the tokens of a text "
        f"input, the side of an image whose size the graph leaves open (default {RANDOM_SEQ_LEN})",
    )
    p.add_argument(
        "--vocab-size",
        type=positive_int,
        help=f"random token ids are drawn below this (default {RANDOM_VOCAB_SIZE}; keep it within the "
        "model's vocabulary)",
    )
    p.add_argument("--seed", type=int, help="seed of --random inputs (default 0)")
    p.add_argument("--provider", choices=PROVIDERS, default="auto")
    p.add_argument(
        "--batch-size",
        type=positive_int,
        default=BATCH_SIZE,
        help=f"inputs per onnxruntime call (default {BATCH_SIZE}; bounds memory, changes no number)",
    )
    p.add_argument(
        "--exclude-prefix",
        nargs="?",
        type=int,
        const=True,
        default=0,
        metavar="N",
        help="leave the first N tokens (default: the model's CLS/register count) out of the metrics",
    )
    p.add_argument(
        "--dominance",
        choices=DOMINANCE_MODES,
        default="head",
        help="H per head (default) or whole layer for the dominance table, or skip it; "
        "operator: per head plus the exact dominance of each block's whole multi-head operator "
        "on the first --operator-inputs inputs (operator.csv); operating: per head plus the "
        "sublayer frozen at each of those inputs' norm, X + sum_h A_h D X M_h (operating.csv)",
    )
    p.add_argument(
        "--dominance-inputs",
        type=count_or_rule,
        default="auto",
        metavar="N|all|auto",
        help=f"inputs of the dominance table and its shares: the first N, all, or (default) the "
        f"first whose four shares' 95%% intervals over inputs are all at most "
        f"{AUTO_WIDTH * 100:g} points wide, looked at after {AUTO_FIRST} inputs and every "
        f"{AUTO_EVERY} after that (fewer: all); the layer metrics cover every input",
    )
    p.add_argument(
        "--operator-inputs",
        type=positive_int,
        metavar="N",
        help=f"inputs of --dominance operator/operating and of the attribution (attribution.csv; "
        f"default {OPERATOR_INPUTS}; the operator on DINOv2, 2 CPU cores: about 6 s per input and "
        "block)",
    )
    p.add_argument(
        "--depth-inputs",
        type=positive_int,
        default=DEPTH_INPUTS,
        metavar="N",
        help=f"inputs of the depth step's attention spectra: |λ₂(A_h)| and each head's predicted "
        f"growth of HFC/LFC (default {DEPTH_INPUTS}; DINOv2 on 2 CPU cores: about 1.8 s of CPU "
        "per input)",
    )
    p.add_argument(
        "--h",
        choices=H_CHOICES,
        default="effective",
        help="H of the dominance step: the effective product of every linear factor between the "
        "stream and the attention branch's output (pre-LayerNorm centring and γ, W_V W_O, "
        "LayerScale; default), or W_V W_O as the checkpoint stores it (the paper's protocol)",
    )
    p.add_argument(
        "--no-spectral",
        action="store_true",
        help="skip sigma_ratio, rank1_residual and effective_rank (their Gram matrices are most of "
        "what a GPU audit copies back)",
    )
    p.add_argument(
        "--spectral-hfc",
        action="store_true",
        help="also HFC/LFC in the spectral norm (hfc_lfc_spectral in layers.csv and "
        "attention.csv: the poster's variant), from the Gram matrices the spectral metrics reduce",
    )
    p.add_argument(
        "--partial",
        action="store_true",
        help="audit a model whose attention is only partly matched (the output says first what "
        "is missing)",
    )
    p.add_argument(
        "--threads",
        type=positive_int,
        metavar="N",
        help="cores to use: onnxruntime's threads and the host work's (default: every usable core; "
        "on a cluster, each worker's share of its host's cores)",
    )
    add_scheduler_options(p, "the inputs are split into shards of whole batches, one per worker")
    p.add_argument("--no-progress", action="store_true", help="no progress bar")
    p.add_argument(
        "--no-cache",
        action="store_true",
        help="compute the value spectra afresh: neither read nor write the per-user cache",
    )
    p.set_defaults(func=run)


#: Options that shape one input source, and the source they need (given without it, they would
#: be ignored: an audit of other inputs than the user asked for).
SOURCE_OPTIONS = {
    "image_size": "images",
    "mean": "images",
    "std": "images",
    "tokenizer": "text",
    "seq_len": "random",
    "vocab_size": "random",
    "seed": "random",
}


def check_source_options(args: argparse.Namespace) -> None:
    """Refuse an option of one input source given without that source (:data:`SOURCE_OPTIONS`)."""
    for option, source in SOURCE_OPTIONS.items():
        if getattr(args, option) is not None and getattr(args, source) is None:
            flag, needed = (f"--{name.replace('_', '-')}" for name in (option, source))
            raise ImporterInputError(f"`{flag}` applies to `{needed}` inputs; got no `{needed}`")


def _inputs(
    args: argparse.Namespace, graph: Sequence[GraphInput], entry: ZooModel | None
) -> Inputs | None:
    from oversmooth.importers.inputs import sources

    if args.inputs:
        return sources.from_npz(args.inputs, graph)
    if args.images:
        return sources.from_images(
            args.images,
            size=args.image_size,
            mean=args.mean,
            std=args.std,
            graph=graph,
            entry=entry,
        )
    if args.text:
        if not args.tokenizer:
            raise ImporterInputError(
                "`--text` needs `--tokenizer tokenizer.json`; got no tokenizer"
            )
        return sources.from_text(args.text, args.tokenizer, graph=graph)
    if args.random is not None:
        _check_random_options(args, graph)
        return sources.random_inputs(
            graph,
            seed=0 if args.seed is None else args.seed,
            batch=args.random,
            seq=args.seq_len or RANDOM_SEQ_LEN,
            vocab_size=args.vocab_size or RANDOM_VOCAB_SIZE,
        )
    return None


def _check_random_options(args: argparse.Namespace, graph: Sequence[GraphInput]) -> None:
    """Refuse ``--seq-len`` or ``--vocab-size`` where the model's inputs leave them nothing to set."""
    from oversmooth.importers.inputs import sources

    inputs = "; ".join(spec.describe() for spec in graph)
    if args.seq_len is not None and not sources.random_sizes_open_axes(graph):
        raise ImporterInputError(
            f"`--seq-len` sizes the open axes after the first of random inputs; this model fixes "
            f"them all ({inputs})"
        )
    if args.vocab_size is not None and not sources.random_draws_token_ids(graph):
        raise ImporterInputError(
            f"`--vocab-size` bounds random token ids; no input of this model takes token ids "
            f"({inputs})"
        )


def _summary(result: AuditResult, out: Path) -> str:
    rows = {(r["layer"], r["metric"]): r["mean"] for r in result.layer_rows()}
    model, inputs, provider = result.model, result.inputs, result.provider
    partial = [note for note in result.notes if note.kind in ("partial", "skipped")]
    lines = [
        *(note.text for note in partial),
        f"model {model.name} ({model.n_blocks} blocks), "
        f"{inputs.n_inputs} inputs from {inputs.source}" + (" [RANDOM]" if inputs.random else ""),
        f"provider: {', '.join(provider.used)} ({provider.note})",
        "layer  hfc_lfc   cosine  sigma_ratio",
    ]
    lines += [
        f"{layer:5d}  {rows[layer, 'hfc_lfc']:8.4g}  {rows[layer, 'cosine']:7.3f}  "
        f"{rows[layer, 'sigma_ratio']:.4g}"
        for layer in range(result.n_layers)
    ]
    dom = result.dominance_summary()
    if dom.cases:
        lines.append(
            f"dominating eigenvalue over {dom.cases} (input, block, head) cases, "
            f"{result.config.h} H: "
            f"{100 * (dom.perron or 0):.2f}% perron, {100 * (dom.non_perron or 0):.2f}% non-perron, "
            f"{100 * (dom.contracting or 0):.2f}% contracting"
        )
    lines += [f"note: {note.text}" for note in result.notes if note not in partial]
    lines.append(f"report: {out / 'report.md'}")
    return "\n".join(lines)


def audit_options(args: argparse.Namespace) -> AuditOptions:
    """The :class:`~oversmooth.importers.audit.pipeline.AuditOptions` the command line asks for."""
    from oversmooth.importers.audit.pipeline import AuditOptions

    if args.operator_inputs is not None and args.dominance == "none":
        raise ImporterInputError(
            "`--operator-inputs` applies to the operator, operating point and attribution of a "
            "dominance step; got dominance 'none'"
        )
    return AuditOptions(
        provider=args.provider,
        batch_size=args.batch_size,
        exclude_prefix=args.exclude_prefix,
        dominance=args.dominance,
        dominance_inputs=args.dominance_inputs,
        operator_inputs=args.operator_inputs or OPERATOR_INPUTS,
        depth_inputs=args.depth_inputs,
        h=args.h,
        spectral=not args.no_spectral,
        spectral_norm=args.spectral_hfc,
        partial=args.partial,
        progress=not args.no_progress and sys.stderr.isatty(),
        cache=not args.no_cache,
        threads=args.threads,
    )


def run(args: argparse.Namespace) -> int:
    """Audit, draw, write the report folder atomically, print a summary."""
    from oversmooth.executor import open_executor
    from oversmooth.figures.audit_report import render
    from oversmooth.importers.audit.pipeline import run_audit
    from oversmooth.importers.graph import load_model
    from oversmooth.report import replaceable_folder, save_audit
    from oversmooth.sharding import sharded_audit
    from oversmooth.simulator.output import check_output_folder

    check_source_options(args)
    options = audit_options(args)  # checked once, before any work
    ref = lookup(args.model)
    out = args.out or Path(f"audit-{ref.name}")
    # refused before any work, by the same rule save_audit applies at the end
    check_output_folder(out, ours=replaceable_folder(args.force), label="--out")
    model = load_model(ref.path)  # parsed once: inputs, matching and the runner share it
    inputs = _inputs(args, model.inputs, ref.entry)
    if args.scheduler is None and args.workers is None:
        result = run_audit(model, inputs, options, entry=ref.entry)
    else:
        with open_executor(args.scheduler, workers=args.workers) as executor:
            result = sharded_audit(model, inputs, options, executor=executor, entry=ref.entry)
    save_audit(result, out, figures=render, label="--out", force=args.force)
    print(_summary(result, out))
    return 0
