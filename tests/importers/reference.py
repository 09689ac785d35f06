"""A NumPy float64 forward pass of the builder models, from their known weights.

It is the independent recomputation the importer and the audit are checked against: the attention
and norms use the simulator's ``softmax``, ``layer_norm`` and ``rms_norm``; every weight comes from
the builders' ground truth (``ExpectedBlock`` and ``Reference``), never from the importer.

Public API
----------
Trace
    Hidden states entering each block and leaving the last one, attention probabilities, output.
forward_trace
    Run an ``Assembly`` on its own feeds (or on other feeds with at most ``n_tokens`` tokens).
reference_forward
    The model's graph output ``(B, T, d)`` (after any final norm).
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass

import numpy as np
from scipy.special import erf, expit

from oversmooth.simulator.attention import layer_norm, rms_norm, softmax
from tests.importers.builders import Assembly, ExpectedBlock, MlpReference, Reference

__all__ = ["Trace", "forward_trace", "reference_forward"]


@dataclass(frozen=True)
class Trace:
    """Intermediate values of one forward pass (float64).

    Attributes
    ----------
    hidden : list of (B, T, d) ndarray
        ``hidden[0]`` is the stream entering block 0 (after the embeddings and any embedding
        norm); ``hidden[i]`` is the output of block ``i - 1`` (before any final norm).
    attention : list of (B, H, T, T) ndarray
        Each block's attention probabilities (masked keys get exactly 0).
    after_attention : list of (B, T, d) ndarray
        Each block's stream right after its attention sublayer, before its MLP: ``N1(x + attn)``
        (post-LN) or ``x + ls1 attn(N1(x))`` (pre-LN).
    attention_sum : list of (B, T, d) ndarray
        Each block's attention sublayer as the theory defines it: the residual sum ``x + attn``
        (before a post-LN norm), ``x + ls1 attn(N1(x))`` (pre-LN).
    output : (B, T, d) ndarray
        The graph output: the last hidden state after any final norm.
    """

    hidden: list[np.ndarray]
    attention: list[np.ndarray]
    output: np.ndarray
    after_attention: list[np.ndarray]
    attention_sum: list[np.ndarray]


def _norm(
    x: np.ndarray, gamma: np.ndarray, beta: np.ndarray | None, kind: str, eps: float
) -> np.ndarray:
    if kind == "rmsnorm":
        return rms_norm(x, gamma, eps=eps)
    return layer_norm(x, gamma, beta, eps=eps)


def _affine(x: np.ndarray, W: np.ndarray, b: np.ndarray | None) -> np.ndarray:
    return x @ W if b is None else x @ W + b


def _heads(x: np.ndarray, n_heads: int) -> np.ndarray:
    """``(B, T, H*dh) -> (B, H, T, dh)``."""
    batch, tokens, width = x.shape
    return x.reshape(batch, tokens, n_heads, width // n_heads).transpose(0, 2, 1, 3)


def _rotate(x: np.ndarray, angles: np.ndarray) -> np.ndarray:
    """RoPE with rotate-half: ``x cos + [-x2, x1] sin``."""
    first, second = np.split(x, 2, axis=-1)
    return x * np.cos(angles) + np.concatenate([-second, first], axis=-1) * np.sin(angles)


def _keep(reference: Reference, feeds: Mapping[str, np.ndarray], tokens: int) -> np.ndarray:
    """Boolean ``(B|1, 1, T|1, T)``: which keys each query may attend to."""
    recipe = reference.recipe
    if recipe.mask.startswith("padding"):
        return feeds["attention_mask"][:, None, None, :].astype(bool)
    if recipe.mask.startswith("causal"):
        return np.tril(np.ones((tokens, tokens), dtype=bool))[None, None]
    return np.ones((1, 1, 1, tokens), dtype=bool)


def _attention(
    x: np.ndarray, blk: ExpectedBlock, reference: Reference, keep: np.ndarray
) -> tuple[np.ndarray, np.ndarray]:
    """``softmax(Q K^T / sqrt(dh) + mask) V W_O + b_O`` per head; kv head ``h // (H / Hkv)``.

    Returns the branch output ``(B, T, d)`` and the probabilities ``(B, H, T, T)``.
    """
    q = _heads(_affine(x, blk.W_Q, blk.b_Q), blk.n_heads)
    k = _heads(_affine(x, blk.W_K, blk.b_K), blk.n_kv_heads)
    v = _heads(_affine(x, blk.W_V, blk.b_V), blk.n_kv_heads)
    if reference.rope_angles is not None:
        angles = reference.rope_angles[: x.shape[1]]
        q, k = _rotate(q, angles), _rotate(k, angles)
    group = blk.n_heads // blk.n_kv_heads
    k, v = np.repeat(k, group, axis=1), np.repeat(v, group, axis=1)
    scores = np.where(keep, q @ np.swapaxes(k, -1, -2) / np.sqrt(blk.d_head), -np.inf)
    probs = softmax(scores)
    context = (probs @ v).transpose(0, 2, 1, 3)
    return _affine(context.reshape(*x.shape[:2], -1), blk.W_O, blk.b_O), probs


def _mlp(x: np.ndarray, mlp: MlpReference) -> np.ndarray:
    up = _affine(x, mlp.W_up, mlp.b_up)
    if mlp.W_gate is None:
        hidden = 0.5 * up * (1 + erf(up / np.sqrt(2)))
    else:
        gate = x @ mlp.W_gate
        hidden = gate * expit(gate) * up
    return _affine(hidden, mlp.W_down, mlp.b_down)


def _block(
    x: np.ndarray, blk: ExpectedBlock, mlp: MlpReference, reference: Reference, keep: np.ndarray
) -> tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray]:
    """Post-LN ``N2(h + mlp(h)), h = N1(x + attn(x))`` or pre-LN ``h + ls2 mlp(N2(h)),
    h = x + ls1 attn(N1(x))``; returns the block output, the attention probabilities, h and the
    residual sum the attention sublayer ends with (``x + attn(x)`` before a post-LN norm, h)."""
    eps = reference.recipe.eps

    def norm(y: np.ndarray, gamma: np.ndarray, beta: np.ndarray | None) -> np.ndarray:
        return _norm(y, gamma, beta, blk.norm_kind, eps)

    if blk.norm == "post":
        attended, probs = _attention(x, blk, reference, keep)
        total = x + attended
        h = norm(total, blk.gamma, blk.beta)
        return norm(h + _mlp(h, mlp), mlp.norm_gamma, mlp.norm_beta), probs, h, total
    attended, probs = _attention(norm(x, blk.gamma, blk.beta), blk, reference, keep)
    h = x + (attended if blk.layer_scale is None else attended * blk.layer_scale)
    update = _mlp(norm(h, mlp.norm_gamma, mlp.norm_beta), mlp)
    return h + (update if mlp.layer_scale is None else update * mlp.layer_scale), probs, h, h


def _embed(reference: Reference, feeds: Mapping[str, np.ndarray]) -> np.ndarray:
    if reference.word_embeddings is None:
        return feeds["embeddings"].astype(np.float64)
    ids = feeds["input_ids"]
    x = reference.word_embeddings[ids]
    if reference.position_embeddings is not None:
        x = x + reference.position_embeddings[: ids.shape[1]]
    if reference.embed_norm is not None:
        x = _norm(x, *reference.embed_norm, reference.recipe.norm_kind, reference.recipe.eps)
    return x


def forward_trace(assembly: Assembly, feeds: Mapping[str, np.ndarray] | None = None) -> Trace:
    """Run the model in float64 from the expected weights, keeping every block boundary.

    Parameters
    ----------
    assembly : Assembly
        A builder model with its reference data.
    feeds : mapping of str to ndarray, optional
        Default: the builder's own batch-2 feeds. Other feeds may have fewer tokens than the
        graph's ``n_tokens`` (position embeddings and RoPE angles are truncated), which lets a
        padded sequence be compared with the same sequence alone.

    Returns
    -------
    Trace
    """
    reference = assembly.reference
    feeds = assembly.built.inputs if feeds is None else feeds
    x = _embed(reference, feeds)
    keep = _keep(reference, feeds, x.shape[1])
    hidden, attention, after_attention, sums = [x], [], [], []
    for blk, mlp in zip(assembly.built.blocks, reference.mlps, strict=True):
        x, probs, mid, total = _block(x, blk, mlp, reference, keep)
        sums.append(total)
        hidden.append(x)
        attention.append(probs)
        after_attention.append(mid)
    if reference.final_norm is not None:
        x = _norm(x, *reference.final_norm, reference.recipe.norm_kind, reference.recipe.eps)
    return Trace(
        hidden=hidden,
        attention=attention,
        output=x,
        after_attention=after_attention,
        attention_sum=sums,
    )


def reference_forward(assembly: Assembly) -> np.ndarray:
    """The model's last hidden state ``(B, T, d)`` in float64 from the expected weights."""
    return forward_trace(assembly).output
