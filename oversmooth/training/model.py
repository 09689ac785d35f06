"""A small Vision Transformer in three variants: standard, ⁺ and ⁻ (value–output by QR).

Patches of ``patch×patch`` pixels are embedded by a strided convolution, a learned CLS token is
prepended and learned positions added; ``depth`` blocks follow, pre-LN
(``x + Attn(LN(x))``, ``x + MLP(LN(x))``, a final LN) or post-LN (``LN(x + Attn(x))``,
``LN(x + MLP(x))``); the class is read from the CLS token. Attention is written out with explicit
matrices (``x @ W_V`` …) so the ONNX export is the plain pattern ``oversmooth audit`` matches.

The variants differ only in W_V, W_O: ``standard`` learns them freely (d×d each, no value bias,
an output bias); ``plus``/``minus`` compute them from Θ_h, ψ_h per head
(:mod:`oversmooth.training.parametrisation`). Queries, keys, MLPs and norms are the same.

Shapes: images (B, C, H, W) → tokens (B, 1 + (H/p)(W/p), d) → logits (B, classes).
"""

from __future__ import annotations

import copy
import math
from dataclasses import asdict, dataclass
from typing import cast

import torch
from torch import nn

from oversmooth.simulator.errors import InputError
from oversmooth.training.parametrisation import SIGNS, value_output

__all__ = ["VARIANTS", "ViT", "ViTConfig", "build_model"]

VARIANTS = ("standard", "plus", "minus")
NORMS = ("pre", "post")


@dataclass(frozen=True)
class ViTConfig:
    """The architecture: image shape, patch, width d_model, heads, depth, MLP ratio, norm, variant.

    ``psi_init`` is ψ's starting value in the ⁺/⁻ variants (every entry): ψ² = 0.36 at 0.6.
    """

    image_size: tuple[int, int] = (8, 8)
    channels: int = 1
    classes: int = 10
    patch: int = 2
    width: int = 64
    heads: int = 4
    depth: int = 6
    mlp_ratio: float = 2.0
    norm: str = "pre"
    variant: str = "standard"
    psi_init: float = 0.6

    def __post_init__(self) -> None:
        if self.variant not in VARIANTS:
            raise InputError(f"variant must be one of {', '.join(VARIANTS)}; got {self.variant!r}")
        if self.norm not in NORMS:
            raise InputError(f"norm must be pre or post; got {self.norm!r}")
        for name in ("channels", "classes", "patch", "width", "heads", "depth"):
            if int(getattr(self, name)) < 1:
                raise InputError(f"{name} must be a positive integer; got {getattr(self, name)}")
        if self.width % self.heads:
            raise InputError(f"width {self.width} does not split into {self.heads} heads")
        height, width = self.image_size
        if height % self.patch or width % self.patch:
            raise InputError(f"patch {self.patch} does not tile images of {height}×{width} pixels")
        if not (self.mlp_ratio > 0 and math.isfinite(self.mlp_ratio)):
            raise InputError(f"mlp_ratio must be positive; got {self.mlp_ratio}")
        if not math.isfinite(self.psi_init):
            raise InputError(f"psi_init must be finite; got {self.psi_init}")

    @property
    def tokens(self) -> int:
        """Patches plus the CLS token."""
        return 1 + (self.image_size[0] // self.patch) * (self.image_size[1] // self.patch)

    @property
    def d_head(self) -> int:
        return self.width // self.heads

    def to_dict(self) -> dict:
        return asdict(self)


class Attention(nn.Module):
    """Multi-head self-attention with W_V, W_O free (standard) or from Θ, ψ (plus/minus)."""

    def __init__(self, config: ViTConfig) -> None:
        super().__init__()
        d, h, k = config.width, config.heads, config.d_head
        self.heads, self.d_head, self.variant = h, k, config.variant
        self.query = nn.Linear(d, d)
        self.key = nn.Linear(d, d)
        if config.variant == "standard":
            bound = 1.0 / math.sqrt(d)
            self.W_V = nn.Parameter(torch.empty(d, d).uniform_(-bound, bound))
            self.W_O = nn.Parameter(torch.empty(d, d).uniform_(-bound, bound))
        else:
            self.theta = nn.Parameter(torch.randn(h, d, k))
            self.psi = nn.Parameter(torch.full((h, k), float(config.psi_init)))
        self.b_O = nn.Parameter(torch.zeros(d))

    def value_output(self) -> tuple[torch.Tensor, torch.Tensor]:
        """W_V (d×d) and W_O (d×d), row-vector convention, heads as contiguous blocks."""
        if self.variant == "standard":
            return self.W_V, self.W_O
        return value_output(self.theta, self.psi, SIGNS[self.variant])

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        batch, tokens, d = x.shape
        W_V, W_O = self.value_output()

        def split(t: torch.Tensor) -> torch.Tensor:
            return t.reshape(batch, tokens, self.heads, self.d_head).transpose(1, 2)

        q, k, v = split(self.query(x)), split(self.key(x)), split(x @ W_V)
        scores = (q @ k.transpose(-1, -2)) / math.sqrt(self.d_head)
        mixed = torch.softmax(scores, dim=-1) @ v
        return mixed.transpose(1, 2).reshape(batch, tokens, d) @ W_O + self.b_O


class Block(nn.Module):
    """One Transformer block, pre- or post-LN."""

    def __init__(self, config: ViTConfig) -> None:
        super().__init__()
        hidden = max(1, round(config.width * config.mlp_ratio))
        self.pre = config.norm == "pre"
        self.norm1 = nn.LayerNorm(config.width)
        self.attention = Attention(config)
        self.norm2 = nn.LayerNorm(config.width)
        self.mlp = nn.Sequential(
            nn.Linear(config.width, hidden), nn.GELU(), nn.Linear(hidden, config.width)
        )

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        if self.pre:
            x = x + self.attention(self.norm1(x))
            return x + self.mlp(self.norm2(x))
        x = self.norm1(x + self.attention(x))
        return self.norm2(x + self.mlp(x))


class ViT(nn.Module):
    """The classifier: patch embedding, CLS token, positions, blocks, head."""

    def __init__(self, config: ViTConfig) -> None:
        super().__init__()
        self.config = config
        d = config.width
        self.embed = nn.Conv2d(config.channels, d, config.patch, stride=config.patch)
        self.cls = nn.Parameter(0.02 * torch.randn(1, 1, d))
        self.positions = nn.Parameter(0.02 * torch.randn(1, config.tokens, d))
        self.blocks = nn.ModuleList(Block(config) for _ in range(config.depth))
        self.norm = nn.LayerNorm(d) if config.norm == "pre" else nn.Identity()
        self.head = nn.Linear(d, config.classes)

    def forward(self, images: torch.Tensor) -> torch.Tensor:
        x = self.embed(images).flatten(2).transpose(1, 2)
        x = torch.cat([self.cls.expand(x.shape[0], -1, -1), x], dim=1) + self.positions
        for block in self.blocks:
            x = block(x)
        return self.head(self.norm(x)[:, 0])

    def attentions(self) -> list[Attention]:
        return [cast(Block, block).attention for block in self.blocks]

    def materialised(self) -> ViT:
        """A standard-variant copy with the same function: every W_V, W_O computed once and
        stored (what an ONNX export needs: ONNX has no QR)."""
        standard = ViT(ViTConfig(**{**self.config.to_dict(), "variant": "standard"}))
        state = {
            key: value
            for key, value in copy.deepcopy(self.state_dict()).items()
            if not key.endswith((".theta", ".psi"))
        }
        with torch.no_grad():
            for index, attention in enumerate(self.attentions()):
                W_V, W_O = attention.value_output()
                state[f"blocks.{index}.attention.W_V"] = W_V.detach().clone()
                state[f"blocks.{index}.attention.W_O"] = W_O.detach().clone()
        standard.load_state_dict(state)
        return standard.to(next(self.parameters()).device)


def build_model(config: ViTConfig, seed: int) -> ViT:
    """The model with every parameter drawn from ``seed`` (the global RNG is left as it was)."""
    with torch.random.fork_rng(devices=[]):
        torch.manual_seed(seed)
        return ViT(config)
