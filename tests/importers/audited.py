"""Builder models audited the way the audit tests need them: saved once per folder, fed their own
inputs, audited on the CPU and cached per options. Shared by the audit, runtime, figure and graph
tests (the folder itself is the ``model_dir`` fixture of ``tests/conftest.py``)."""

from __future__ import annotations

import functools
from pathlib import Path

import numpy as np
import onnx

from oversmooth.importers.audit.pipeline import audit
from oversmooth.importers.audit.records import AuditResult
from oversmooth.importers.graph import OnnxModel, model_from_proto
from oversmooth.importers.inputs.feeds import Inputs
from oversmooth.simulator.operator import HeadFactors
from tests.importers.builders import Assembly, assemble

#: The seed every audit test builds its models with.
SEED = 5


@functools.cache
def assembly_of(name: str) -> Assembly:
    """The builder model ``name`` at the audit tests' seed (built once)."""
    return assemble(name, SEED)


def saved_model(folder: Path, name: str) -> Path:
    """The builder model ``name`` written to ``folder`` (once)."""
    path = folder / f"{name}.onnx"
    if not path.exists():
        onnx.save(assembly_of(name).built.model, path)
    return path


def builder_inputs(assembly: Assembly, feeds: dict[str, np.ndarray] | None = None) -> Inputs:
    """The builder's feeds (or ``feeds``) as audit inputs, the padding mask as the token mask."""
    feeds = dict(assembly.built.inputs if feeds is None else feeds)
    mask = feeds.get("attention_mask")
    batch = next(iter(feeds.values())).shape[0]
    return Inputs(
        feeds=feeds,
        token_mask=None if mask is None else mask.astype(bool),
        labels=tuple(f"item-{i}" for i in range(batch)),
        source="test",
    )


def real_tokens(assembly: Assembly, feeds: dict[str, np.ndarray] | None = None) -> np.ndarray:
    """``(B, T)`` True on the tokens that are not padding."""
    feeds = assembly.built.inputs if feeds is None else feeds
    if "attention_mask" in feeds:
        return feeds["attention_mask"].astype(bool)
    first = next(iter(feeds.values()))
    return np.ones(first.shape[:2], dtype=bool)


@functools.cache
def _audited(folder: Path, name: str, **options: object) -> AuditResult:
    assembly = assembly_of(name)
    return audit(saved_model(folder, name), builder_inputs(assembly), provider="cpu", **options)


def audited(folder: Path, name: str, **options: object) -> AuditResult:
    """The audit of builder model ``name`` on its own feeds (CPU; cached per options)."""
    return _audited(folder, name, **options)


def builder_model_and_inputs(name: str, seed: int = SEED) -> tuple[OnnxModel, Inputs]:
    """The builder model ``name`` (built at ``seed``) read in memory, with its own feeds as audit
    inputs."""
    assembly = assembly_of(name) if seed == SEED else assemble(name, seed)
    return model_from_proto(assembly.built.model), builder_inputs(assembly)


def effective_factors(block) -> HeadFactors:
    """Every head's ``C diag(γ) W_V^h`` and ``W_O^h diag(s)`` from the builder's own parameters."""
    d = block.d_head
    lefts, rights = [], []
    for head in range(block.n_heads):
        kv = head // (block.n_heads // block.n_kv_heads)
        left = block.gamma[:, None] * block.W_V[:, kv * d : (kv + 1) * d]
        lefts.append(left - left.mean(axis=0, keepdims=True))
        rights.append(block.W_O[head * d : (head + 1) * d, :] * block.layer_scale[None, :])
    return HeadFactors(np.stack(lefts), np.stack(rights))
