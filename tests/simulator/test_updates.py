"""Update rules as a family (simulator.updates): what holds across the rule modules.

The rules' linear ones are homogeneous; every system rule runs a batch of systems as it runs each
alone; every rule refuses a bad argument naming it. Each rule against its own hand-written formula
(and the paper's claims 1, 5, 22 and 25-29 on single layers) is tested in tests/simulator/updates/,
one file per module.
"""

from __future__ import annotations

import numpy as np
import pytest
from hypothesis import given
from hypothesis import strategies as st

from oversmooth.simulator.errors import InputError
from oversmooth.simulator.spectra import attention_symmetric_scores
from oversmooth.simulator.updates import (
    MLP,
    SYSTEM_RULES,
    FeatScaleRule,
    LinearRule,
    NeuTRENORule,
    PostLNRule,
    PreLNRule,
    SoftmaxAttentionRule,
    ValueResidualRule,
    rule_from_system,
)
from tests.simulator.updates.formulas import close, features, seeds, sizes, small_system


@given(n=sizes, d=features, seed=seeds, c=st.floats(min_value=0.1, max_value=10.0))
def test_linear_rules_are_homogeneous(n, d, seed, c):
    A, W_V, W_proj, X, _ = small_system(n, d, d, seed)
    for name in ("linear", "no-skip", "similarity-removal", "attnscale", "featscale"):
        rule = rule_from_system(name, A=A, W_V=W_V, W_proj=W_proj)
        assert rule.homogeneous
        close(rule(c * X, 0, {}), c * rule(X, 0, {}), scale=c)


@pytest.mark.parametrize("name", SYSTEM_RULES)
def test_batched_systems_equal_looping(name):
    rng = np.random.default_rng(11)
    B, n, d = 4, 5, 3
    A = attention_symmetric_scores(n, batch=B, rng=rng)
    W_V, W_proj = rng.standard_normal((B, d, d)), rng.standard_normal((B, d, d))
    X0, X1 = rng.standard_normal((B, n, d)), rng.standard_normal((B, n, d))
    batched = rule_from_system(name, A=A, W_V=W_V, W_proj=W_proj)
    assert batched.batch_shape == (B,)
    cache: dict = {}
    out0, out1 = batched(X0, 0, cache), batched(X1, 1, cache)
    for b in range(B):
        single = rule_from_system(name, A=A[b], W_V=W_V[b], W_proj=W_proj[b])
        single_cache: dict = {}
        close(out0[b], single(X0[b], 0, single_cache), scale=10.0)
        close(out1[b], single(X1[b], 1, single_cache), scale=10.0)


def _bad_cases():
    A, W_V, W_proj, _, _ = small_system(4, 3, 2, 0)
    not_stochastic = A * 1.5
    with_nan = W_V.copy()
    with_nan[0, 0] = np.nan
    return [
        pytest.param(lambda: LinearRule(not_stochastic, W_V, W_proj), "`A`", id="A-not-stochastic"),
        pytest.param(lambda: LinearRule(A[:, :3], W_V, W_proj), "`A`", id="A-not-square"),
        pytest.param(lambda: LinearRule(A, with_nan, W_proj), "`W_V`", id="W_V-nan"),
        pytest.param(lambda: LinearRule(A, W_V, W_proj.T), "`W_proj`", id="W_proj-shape"),
        pytest.param(lambda: PreLNRule(A, W_V, W_proj, gamma=np.ones(5)), "`gamma`", id="gamma"),
        pytest.param(lambda: PostLNRule(A, W_V, W_proj, eps=0.0), "`eps`", id="eps"),
        pytest.param(lambda: ValueResidualRule(A, W_V, W_proj, mode="other"), "`mode`", id="mode"),
        pytest.param(lambda: NeuTRENORule(A, W_V, W_proj, lam=np.inf), "`lam`", id="lam"),
        pytest.param(
            lambda: FeatScaleRule(A, W_V, W_proj, np.ones(4), 0.0), "`s_d`", id="featscale"
        ),
        pytest.param(
            lambda: LinearRule(A[None].repeat(2, 0), W_V[None].repeat(3, 0), W_proj),
            "batch",
            id="batch-mismatch",
        ),
        pytest.param(
            lambda: SoftmaxAttentionRule(np.eye(3), np.eye(3), np.eye(3), np.eye(3), n_heads=2),
            "`W_Q`",
            id="heads-divide",
        ),
        pytest.param(
            lambda: SoftmaxAttentionRule(np.eye(3), np.eye(3), np.eye(3), np.eye(3), norm="mid"),
            "`norm`",
            id="norm",
        ),
        pytest.param(
            lambda: LinearRule(A, W_V, W_proj, mlp=MLP(np.eye(4), None, np.eye(4), None)),
            "`mlp`",
            id="mlp-size",
        ),
        pytest.param(
            lambda: MLP(np.eye(3), None, np.eye(3), None, "tanh"), "`activation`", id="act"
        ),
        pytest.param(
            lambda: rule_from_system("nope", A=A, W_V=W_V, W_proj=W_proj), "`rule`", id="rule"
        ),
        pytest.param(
            lambda: rule_from_system("linear", A=A, W_V=W_V, W_proj=W_proj, lam=1.0),
            "`lam`",
            id="rule-option",
        ),
    ]


@pytest.mark.parametrize(("build", "named"), _bad_cases())
def test_bad_arguments_raise_input_error_naming_them(build, named):
    with pytest.raises(InputError, match=named):
        build()
