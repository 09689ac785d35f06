"""The small ViT of the training experiments (:mod:`oversmooth.training.model`): its configuration's
checks, attention and blocks against a direct computation, seeded construction, and the
materialised copy an ONNX export needs."""

from __future__ import annotations

import math

import pytest

torch = pytest.importorskip(
    "torch", reason="needs the train extra: pip install 'oversmooth[train]'"
)

from oversmooth.simulator.errors import InputError  # noqa: E402
from oversmooth.training.model import ViTConfig, build_model  # noqa: E402


# Moved from tests/training/test_parametrisation.py.
def test_materialised_copy_computes_the_same_function():
    torch.set_num_threads(1)
    model = build_model(ViTConfig(width=16, heads=2, depth=2, variant="minus"), seed=3).eval()
    plain = model.materialised().eval()
    assert plain.config.variant == "standard"
    images = torch.rand(5, 1, 8, 8, generator=torch.Generator().manual_seed(0))
    with torch.no_grad():
        torch.testing.assert_close(plain(images), model(images))


# Moved from tests/training/test_parametrisation.py.
def test_init_depends_on_the_seed_only():
    config = ViTConfig(width=16, heads=2, depth=1, variant="plus")
    first, again, other = (build_model(config, seed) for seed in (0, 0, 1))
    state, state_again = first.state_dict(), again.state_dict()
    assert all(torch.equal(state[k], state_again[k]) for k in state)
    assert not torch.equal(
        state["blocks.0.attention.theta"], other.state_dict()["blocks.0.attention.theta"]
    )


@pytest.mark.parametrize(
    ("changes", "message"),
    [
        ({"variant": "sideways"}, "variant must be one of standard, plus, minus"),
        ({"norm": "middle"}, "norm must be pre or post"),
        ({"depth": 0}, "depth must be a positive integer"),
        ({"width": 10, "heads": 4}, "width 10 does not split into 4 heads"),
        ({"patch": 3}, "patch 3 does not tile images of 8×8 pixels"),
        ({"mlp_ratio": 0.0}, "mlp_ratio must be positive"),
        ({"mlp_ratio": math.inf}, "mlp_ratio must be positive"),
        ({"psi_init": math.nan}, "psi_init must be finite"),
    ],
)
def test_a_config_that_cannot_build_a_model_is_one_line(changes: dict, message: str) -> None:
    with pytest.raises(InputError, match=message):
        ViTConfig(**changes)


def test_tokens_are_the_patches_and_the_cls_token() -> None:
    config = ViTConfig(image_size=(8, 12), patch=4, width=24, heads=3)
    assert config.tokens == 1 + 2 * 3
    assert config.d_head == 8
    assert config.to_dict()["image_size"] == (8, 12)
    assert ViTConfig(**config.to_dict()) == config


def _attention_by_hand(attention, x):
    """Softmax(q_h k_hᵀ / √d_h) (x W_V)_h per head, concatenated, then W_O and the bias."""
    W_V, W_O = attention.value_output()
    q, k, v = attention.query(x), attention.key(x), x @ W_V
    d = attention.d_head
    heads = []
    for h in range(attention.heads):
        part = slice(h * d, (h + 1) * d)
        scores = q[..., part] @ k[..., part].transpose(-1, -2) / math.sqrt(d)
        heads.append(torch.softmax(scores, dim=-1) @ v[..., part])
    return torch.cat(heads, dim=-1) @ W_O + attention.b_O


@pytest.mark.parametrize("variant", ["standard", "plus"])
def test_attention_mixes_each_heads_values_by_its_own_scores(variant: str) -> None:
    model = build_model(ViTConfig(width=12, heads=3, depth=1, variant=variant), seed=2)
    attention = model.attentions()[0]
    x = torch.randn(2, 5, 12, generator=torch.Generator().manual_seed(1))
    with torch.no_grad():
        torch.testing.assert_close(attention(x), _attention_by_hand(attention, x))


@pytest.mark.parametrize("norm", ["pre", "post"])
def test_a_block_is_pre_or_post_ln(norm: str) -> None:
    model = build_model(ViTConfig(width=8, heads=2, depth=1, norm=norm), seed=4)
    block = model.blocks[0]
    x = torch.randn(3, 4, 8, generator=torch.Generator().manual_seed(2))
    with torch.no_grad():
        if norm == "pre":
            y = x + block.attention(block.norm1(x))
            expected = y + block.mlp(block.norm2(y))
        else:
            y = block.norm1(x + block.attention(x))
            expected = block.norm2(y + block.mlp(y))
        torch.testing.assert_close(block(x), expected)
    # a post-LN model has no final norm; a pre-LN one normalises before the head
    assert isinstance(model.norm, torch.nn.Identity) == (norm == "post")


def test_the_classifier_gives_each_image_its_own_logits() -> None:
    model = build_model(ViTConfig(width=8, heads=2, depth=1), seed=5).eval()
    images = torch.rand(4, 1, 8, 8, generator=torch.Generator().manual_seed(3))
    with torch.no_grad():
        logits = model(images)
        assert logits.shape == (4, 10)
        # a second image changes nothing of the first's logits (no mixing across the batch)
        torch.testing.assert_close(model(images[:1]), logits[:1])


def test_building_leaves_the_global_random_state_alone() -> None:
    before = torch.random.get_rng_state()
    build_model(ViTConfig(width=8, heads=2, depth=1), seed=6)
    assert torch.equal(torch.random.get_rng_state(), before)
