"""Update rules against their hand-written formulas, and the algebra of the paper's claims 1, 5, 22
and 25-29 on single layers."""

from __future__ import annotations

import math
from math import comb

import numpy as np
import pytest
from hypothesis import given
from hypothesis import strategies as st

from oversmooth.simulator.errors import InputError
from oversmooth.simulator.spectra import (
    attention_doubly_stochastic,
    attention_symmetric_scores,
    h_symmetric,
)
from oversmooth.simulator.tolerances import (
    CLOSED_FORM_RTOL,
    EIG_TOL,
    STEP_ATOL,
    STEP_RTOL,
)
from oversmooth.simulator.updates import (
    MLP,
    RULES,
    SYSTEM_RULES,
    AttnScaleRule,
    FeatScaleRule,
    LinearRule,
    NeuTRENORule,
    PostLNRule,
    PreLNRule,
    SimilarityRemovalRule,
    SoftmaxAttentionRule,
    UpdateRule,
    ValueResidualRule,
    rule_from_system,
)

sizes = st.integers(min_value=2, max_value=7)
features = st.integers(min_value=1, max_value=6)
seeds = st.integers(min_value=0, max_value=2**32 - 1)


def _system(n: int, d: int, d_v: int, seed: int, scale: float = 1.0):
    """A row-stochastic A, value and projection weights of norm ~1, and tokens."""
    rng = np.random.default_rng(seed)
    A = attention_symmetric_scores(n, rng=rng)
    W_V = rng.standard_normal((d, d_v)) / np.sqrt(d)
    W_proj = rng.standard_normal((d_v, d)) / np.sqrt(d_v)
    X = scale * rng.standard_normal((n, d))
    return A, W_V, W_proj, X, rng


def _close(actual, expected, scale: float = 1.0) -> None:
    np.testing.assert_allclose(actual, expected, rtol=STEP_RTOL, atol=STEP_ATOL * scale)


def _ln(X, gamma, beta, eps=1e-5):
    """LayerNorm written out: biased variance, eps inside the square root."""
    mean = X.sum(axis=-1, keepdims=True) / X.shape[-1]
    var = ((X - mean) ** 2).sum(axis=-1, keepdims=True) / X.shape[-1]
    return (X - mean) / np.sqrt(var + eps) * gamma + beta


def _softmax_rows(S):
    E = np.exp(S - S.max(axis=-1, keepdims=True))
    return E / E.sum(axis=-1, keepdims=True)


# ---------------------------------------------------------------------------------------------
# the linear rule and the paper's identities
# ---------------------------------------------------------------------------------------------


@given(n=sizes, d=features, d_v=features, seed=seeds)
def test_linear_rule_is_x_plus_a_x_wv_wproj(n, d, d_v, seed):
    A, W_V, W_proj, X, _ = _system(n, d, d_v, seed)
    rule = LinearRule(A, W_V, W_proj)
    _close(rule(X, 0, {}), X + A @ X @ W_V @ W_proj)
    _close(LinearRule(A, W_V, W_proj, skip=False)(X, 0, {}), A @ X @ W_V @ W_proj)


@given(n=sizes, d=features, seed=seeds)
def test_claim1_vec_identity(n, d, seed):
    """vec(X + A X M) = (I + M^T ⊗ A) vec(X), column stacking (claim 1)."""
    A, W_V, W_proj, X, _ = _system(n, d, d, seed)
    rule = LinearRule(A, W_V, W_proj)
    M = W_V @ W_proj
    lhs = rule(X, 0, {}).flatten(order="F")
    rhs = (np.eye(n * d) + np.kron(M.T, A)) @ X.flatten(order="F")
    _close(lhs, rhs)
    np.testing.assert_array_equal(rule.H, M.T)


@given(n=sizes, d=features, seed=seeds, L=st.integers(min_value=1, max_value=30))
def test_claim5_closed_form(n, d, seed, L):
    """X_L = sum_k binom(L, k) A^k X_0 M^k for the linear rule (claim 5)."""
    A, _, _, X0, rng = _system(n, d, d, seed)
    # A positive spectrum keeps the binomial sum free of cancellation (it is then well conditioned).
    W_V, W_proj = np.eye(d), h_symmetric(rng.uniform(0.05, 1.0, d), rng=rng)
    rule = LinearRule(A, W_V, W_proj)
    X = X0
    for layer in range(L):
        X = rule(X, layer, {})
    M = W_V @ W_proj
    closed = sum(
        comb(L, k) * np.linalg.matrix_power(A, k) @ X0 @ np.linalg.matrix_power(M, k)
        for k in range(L + 1)
    )
    assert np.linalg.norm(X - closed) <= CLOSED_FORM_RTOL * np.linalg.norm(closed)


@given(n=sizes, d=features, seed=seeds, c=st.floats(min_value=0.1, max_value=10.0))
def test_linear_rules_are_homogeneous(n, d, seed, c):
    A, W_V, W_proj, X, _ = _system(n, d, d, seed)
    for name in ("linear", "no-skip", "similarity-removal", "attnscale", "featscale"):
        rule = rule_from_system(name, A=A, W_V=W_V, W_proj=W_proj)
        assert rule.homogeneous
        _close(rule(c * X, 0, {}), c * rule(X, 0, {}), scale=c)


def test_layer_norm_rules_are_not_homogeneous():
    A, W_V, W_proj, X, _ = _system(6, 4, 4, 1)
    for rule in (PreLNRule(A, W_V, W_proj), PostLNRule(A, W_V, W_proj)):
        assert not rule.homogeneous
        assert not np.allclose(rule(3.0 * X, 0, {}), 3.0 * rule(X, 0, {}))


# ---------------------------------------------------------------------------------------------
# LayerNorm rules
# ---------------------------------------------------------------------------------------------


@given(n=sizes, d=st.integers(min_value=2, max_value=6), seed=seeds)
def test_pre_and_post_ln_match_hand_formulas(n, d, seed):
    A, W_V, W_proj, X, rng = _system(n, d, d, seed)
    gamma = rng.standard_normal(d)
    beta = rng.standard_normal(d)
    M = W_V @ W_proj
    pre = PreLNRule(A, W_V, W_proj, gamma=gamma, beta=beta)
    post = PostLNRule(A, W_V, W_proj, gamma=gamma, beta=beta)
    _close(pre(X, 0, {}), X + A @ _ln(X, gamma, beta) @ M)
    _close(post(X, 0, {}), _ln(X + A @ X @ M, gamma, beta))


@given(
    n=sizes,
    d=st.integers(min_value=2, max_value=6),
    seed=seeds,
    c=st.floats(min_value=0.1, max_value=5.0),
)
def test_claim22_post_ln_sign_flip_alternates_exactly(n, d, seed, c):
    """X_l(gamma = -c) = (-1)^l X_l(gamma = c) exactly when beta = 0 (claim 22)."""
    A, W_V, W_proj, X0, _ = _system(n, d, d, seed)
    plus = PostLNRule(A, W_V, W_proj, gamma=c)
    minus = PostLNRule(A, W_V, W_proj, gamma=-c)
    X_plus, X_minus = X0, X0
    for layer in range(20):
        X_plus, X_minus = plus(X_plus, layer, {}), minus(X_minus, layer, {})
        np.testing.assert_array_equal(X_minus, (-1) ** (layer + 1) * X_plus)


def test_pre_ln_negative_gamma_flips_the_effective_product():
    """Pre-LN branch with gamma = -c equals the branch with gamma = c negated (claim 21 mechanism)."""
    A, W_V, W_proj, X, _ = _system(6, 4, 4, 3)
    plus = PreLNRule(A, W_V, W_proj, gamma=2.0)
    minus = PreLNRule(A, W_V, W_proj, gamma=-2.0)
    _close(minus(X, 0, {}) - X, -(plus(X, 0, {}) - X))


# ---------------------------------------------------------------------------------------------
# softmax attention and the MLP
# ---------------------------------------------------------------------------------------------


def _hand_attention(Z, W_Q, W_K, W_V, W_proj, heads):
    k = W_Q.shape[1] // heads
    v = W_V.shape[1] // heads
    out = np.zeros_like(Z)
    for h in range(heads):
        q = Z @ W_Q[:, h * k : (h + 1) * k]
        key = Z @ W_K[:, h * k : (h + 1) * k]
        P = _softmax_rows(q @ key.T / math.sqrt(k))
        out += P @ Z @ W_V[:, h * v : (h + 1) * v] @ W_proj[h * v : (h + 1) * v, :]
    return out


def _hand_mlp(Y, W_1, b_1, W_2, b_2):
    Z = Y @ W_1 + b_1
    gelu = 0.5 * Z * (1.0 + np.vectorize(math.erf)(Z / math.sqrt(2.0)))
    return gelu @ W_2 + b_2


@given(
    n=sizes,
    heads=st.integers(min_value=1, max_value=3),
    d_head=st.integers(min_value=1, max_value=3),
    d=st.integers(min_value=2, max_value=6),
    norm=st.sampled_from([None, "pre", "post"]),
    with_mlp=st.booleans(),
    skip=st.booleans(),
    seed=seeds,
)
def test_softmax_attention_rule_matches_hand_formula(
    n, heads, d_head, d, norm, with_mlp, skip, seed
):
    rng = np.random.default_rng(seed)
    X = rng.standard_normal((n, d))
    W_Q, W_K, W_V = (rng.standard_normal((d, heads * d_head)) for _ in range(3))
    W_proj = rng.standard_normal((heads * d_head, d)) / heads
    gamma, beta = rng.standard_normal(d), rng.standard_normal(d)
    W_1, b_1 = rng.standard_normal((d, 5)), rng.standard_normal(5)
    W_2, b_2 = rng.standard_normal((5, d)), rng.standard_normal(d)
    mlp = MLP(W_1, b_1, W_2, b_2) if with_mlp else None
    rule = SoftmaxAttentionRule(
        W_Q, W_K, W_V, W_proj, n_heads=heads, norm=norm, gamma=gamma, beta=beta, mlp=mlp, skip=skip
    )

    def attend(Z):
        return _hand_attention(Z, W_Q, W_K, W_V, W_proj, heads)

    def ln(Z):
        return _ln(Z, gamma, beta)

    r = 1.0 if skip else 0.0
    if norm == "pre":
        Y = r * X + attend(ln(X))
        expected = r * Y + _hand_mlp(ln(Y), W_1, b_1, W_2, b_2) if with_mlp else Y
    elif norm == "post":
        Y = ln(r * X + attend(X))
        expected = ln(r * Y + _hand_mlp(Y, W_1, b_1, W_2, b_2)) if with_mlp else Y
    else:
        Y = r * X + attend(X)
        expected = r * Y + _hand_mlp(Y, W_1, b_1, W_2, b_2) if with_mlp else Y
    assert not rule.homogeneous
    _close(rule(X, 0, {}), expected, scale=float(np.abs(expected).max()))


def test_softmax_attention_heads_are_stochastic_and_batched(rng):
    W = [rng.standard_normal((4, 6)) for _ in range(3)]
    rule = SoftmaxAttentionRule(*W, rng.standard_normal((6, 4)), n_heads=3)
    X = rng.standard_normal((5, 7, 4))
    P = rule.attention(X)
    assert P.shape == (5, 3, 7, 7)
    np.testing.assert_allclose(P.sum(axis=-1), 1.0, rtol=0, atol=STEP_ATOL)
    batched = rule(X, 0, {})
    for b in range(X.shape[0]):
        _close(batched[b], rule(X[b], 0, {}))


def test_mlp_relu_and_gelu(rng):
    W_1, W_2 = rng.standard_normal((4, 8)), rng.standard_normal((8, 4))
    b_1, b_2 = rng.standard_normal(8), rng.standard_normal(4)
    Y = rng.standard_normal((6, 4))
    _close(MLP(W_1, b_1, W_2, b_2)(Y), _hand_mlp(Y, W_1, b_1, W_2, b_2))
    relu = MLP(W_1, None, W_2, None, activation="relu")
    _close(relu(Y), np.maximum(Y @ W_1, 0.0) @ W_2)
    assert relu.homogeneous
    assert not MLP(W_1, b_1, W_2, b_2, activation="relu").homogeneous
    assert not MLP(W_1, None, W_2, None).homogeneous


def test_linear_rule_with_mlp(rng):
    A, W_V, W_proj, X, _ = _system(5, 4, 4, 7)
    mlp = MLP(rng.standard_normal((4, 6)), None, rng.standard_normal((6, 4)), None, "relu")
    rule = LinearRule(A, W_V, W_proj, mlp=mlp)
    Y = X + A @ X @ W_V @ W_proj
    _close(rule(X, 0, {}), Y + np.maximum(Y @ mlp.W_1, 0) @ mlp.W_2)
    assert rule.homogeneous


# ---------------------------------------------------------------------------------------------
# mitigations
# ---------------------------------------------------------------------------------------------


@given(n=sizes, d=features, d_v=features, seed=seeds, lam=st.floats(0.0, 1.0))
def test_neutreno_layers(n, d, d_v, seed, lam):
    """Layer 0 is standard; later layers add lam (V_0 - V_l) before W_proj (§7.3)."""
    A, W_V, W_proj, X0, _rng = _system(n, d, d_v, seed)
    rule = NeuTRENORule(A, W_V, W_proj, lam=lam)
    cache: dict = {}
    X1 = rule(X0, 0, cache)
    _close(X1, X0 + A @ X0 @ W_V @ W_proj)
    X2 = rule(X1, 1, cache)
    V0, V1 = X0 @ W_V, X1 @ W_V
    _close(X2, X1 + (A @ V1 + lam * (V0 - V1)) @ W_proj, scale=float(np.abs(X2).max()))


@given(n=sizes, d=features, d_v=features, seed=seeds, w=st.tuples(st.floats(0, 2), st.floats(0, 2)))
def test_claim28_resformer_and_svformer(n, d, d_v, seed, w):
    A, W_V, W_proj, X0, rng = _system(n, d, d_v, seed)
    X1 = rng.standard_normal(X0.shape)
    V1, Vn = X0 @ W_V, X1 @ W_V
    standard = X0 + A @ V1 @ W_proj
    res = ValueResidualRule(A, W_V, W_proj, mode="resformer", weights=w)
    sv = ValueResidualRule(A, W_V, W_proj, mode="svformer")
    res_cache, sv_cache = {}, {}
    _close(res(X0, 0, res_cache), standard)
    _close(sv(X0, 0, sv_cache), standard)
    _close(res(X1, 1, res_cache), X1 + A @ (w[0] * V1 + w[1] * Vn) @ W_proj, scale=3.0)
    _close(sv(X1, 1, sv_cache), X1 + A @ V1 @ W_proj)


@given(n=sizes, d=features, seed=seeds, tau=st.floats(0.0, 2.0))
def test_claim29_similarity_removal(n, d, seed, tau):
    """The branch's LFC is scaled by (1 - tau) and its HFC is kept."""
    A, W_V, W_proj, X, _ = _system(n, d, d, seed)
    branch = SimilarityRemovalRule(A, W_V, W_proj, tau=tau)(X, 0, {}) - X
    plain = A @ X @ W_V @ W_proj
    mean = plain.mean(axis=0)
    _close(branch.mean(axis=0), (1 - tau) * mean)
    _close(branch - branch.mean(axis=0), plain - mean)


@given(n=sizes, d=features, seed=seeds, omega=st.floats(-0.9, 3.0))
def test_claim25_attnscale(n, d, seed, omega):
    rng = np.random.default_rng(seed)
    A = attention_doubly_stochastic(n, rng=rng)
    W_V, W_proj = rng.standard_normal((d, d)), rng.standard_normal((d, d))
    rule = AttnScaleRule(A, W_V, W_proj, omega)
    _close(rule.A_hat.sum(axis=1), np.ones(n))
    expected = np.sort(np.linalg.eigvalsh(A))[:-1] * (1 + omega)
    got = np.sort(np.linalg.eigvalsh(0.5 * (rule.A_hat + rule.A_hat.T)))
    mask = np.abs(got - 1.0) > EIG_TOL
    np.testing.assert_allclose(np.sort(got[mask])[: n - 1], np.sort(expected), atol=EIG_TOL)
    X = rng.standard_normal((n, d))
    _close(rule(X, 0, {}), X + rule.A_hat @ X @ W_V @ W_proj, scale=10.0)
    identity = AttnScaleRule(A, W_V, W_proj, 0.0)
    _close(identity.A_hat, A)


@given(n=sizes, d=features, seed=seeds)
def test_claim26_featscale(n, d, seed):
    A, W_V, W_proj, X, rng = _system(n, d, d, seed)
    s_d, s_h = rng.standard_normal(d), rng.standard_normal(d)
    Y = A @ X @ W_V @ W_proj
    dc = np.broadcast_to(Y.mean(axis=0), Y.shape)
    hc = Y - dc
    paper = FeatScaleRule(A, W_V, W_proj, s_d, s_h)
    code = FeatScaleRule(A, W_V, W_proj, s_d, s_h, code_faithful=True)
    _close(paper(X, 0, {}), X + Y + s_d * dc + s_h * hc)
    _close(code(X, 0, {}), FeatScaleRule(A, W_V, W_proj, 2 * s_d, 2 * s_h)(X, 0, {}))
    _close(FeatScaleRule(A, W_V, W_proj, 0.0, 0.0)(X, 0, {}), LinearRule(A, W_V, W_proj)(X, 0, {}))


# ---------------------------------------------------------------------------------------------
# batching, registry and validation
# ---------------------------------------------------------------------------------------------


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
        _close(out0[b], single(X0[b], 0, single_cache), scale=10.0)
        _close(out1[b], single(X1[b], 1, single_cache), scale=10.0)


def test_registry_names_build_rules():
    A, W_V, W_proj, _, _ = _system(4, 3, 3, 0)
    for name in SYSTEM_RULES:
        rule = rule_from_system(name, A=A, W_V=W_V, W_proj=W_proj, gamma=np.ones(3))
        assert isinstance(rule, tuple(RULES.values()))
    assert rule_from_system("neutreno", A=A, W_V=W_V, W_proj=W_proj, lam=0.4).lam == 0.4


def _one_of_each(cls: type, rng: np.random.Generator):
    """An instance of a registry class on a small system, with the arguments it requires."""
    A, W_V, W_proj, _, _ = _system(4, 3, 2, 0)
    if cls is SoftmaxAttentionRule:
        W_Q, W_K, W_V = rng.standard_normal((3, 3, 4))
        return cls(W_Q, W_K, W_V, rng.standard_normal((4, 3)), n_heads=2, norm="pre")
    required = {AttnScaleRule: {"omega": 0.5}, FeatScaleRule: {"s_d": 0.1, "s_h": 0.2}}
    return cls(A, W_V, W_proj, **required.get(cls, {}))


@pytest.mark.parametrize("name", RULES)
def test_every_registry_rule_is_an_update_rule(name, rng):
    rule = _one_of_each(RULES[name], rng)
    assert isinstance(rule, UpdateRule)
    X = rule.check_tokens(rng.standard_normal((4, 3)))
    assert rule.batch_shape == ()
    assert isinstance(rule.homogeneous, bool)
    assert rule(X, 0, {}).shape == X.shape


def test_update_rule_check_can_fail(rng):
    """The protocol check itself can fail: an MLP is callable but is not a rule."""
    assert not isinstance(MLP(np.eye(3), None, np.eye(3), None), UpdateRule)
    assert not isinstance(lambda X, layer, cache: X, UpdateRule)


def _bad_cases():
    A, W_V, W_proj, _, _ = _system(4, 3, 2, 0)
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


def test_check_tokens_names_the_mismatch():
    A, W_V, W_proj, X, _ = _system(4, 3, 2, 0)
    rule = LinearRule(A, W_V, W_proj)
    with pytest.raises(InputError, match="4 tokens"):
        rule.check_tokens(X[:3], "X0")
    with pytest.raises(InputError, match="3 features"):
        rule.check_tokens(X[:, :2], "X0")
    np.testing.assert_array_equal(rule.check_tokens(X), X)


@pytest.mark.parametrize(
    ("build", "message"),
    [
        (lambda A, W: NeuTRENORule(A, W, W, lam=-0.1), "`lam` must be at least 0"),
        (lambda A, W: AttnScaleRule(A, W, W, omega=-1.5), "`omega` must be at least -1"),
    ],
    ids=["neutreno-lam", "attnscale-omega"],
)
def test_rule_parameters_outside_the_methods_domain_are_refused(build, message) -> None:
    A = np.full((3, 3), 1 / 3)
    with pytest.raises(InputError, match=message):
        build(A, np.eye(2))


def test_similarity_removal_accepts_any_real_tau() -> None:
    """Stated, not refused: the (1 - tau) scaling of the token mean holds for every real tau."""
    A = np.full((3, 3), 1 / 3)
    X = np.arange(6.0).reshape(3, 2)
    for tau in (-5.0, 0.0, 1.0, 2.5):
        Y = SimilarityRemovalRule(A, np.eye(2), np.eye(2), tau=tau)(X, 0, {}) - X
        branch = LinearRule(A, np.eye(2), np.eye(2))(X, 0, {}) - X
        np.testing.assert_allclose(Y.mean(axis=0), (1 - tau) * branch.mean(axis=0), atol=STEP_ATOL)
