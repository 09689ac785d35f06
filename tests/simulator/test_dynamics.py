"""Deep iteration: renormalisation to depth 10^4, explicit stops, batching, rows and rate fits."""

from __future__ import annotations

import warnings

import numpy as np
import pytest
from hypothesis import given
from hypothesis import strategies as st

from oversmooth.simulator.dynamics import FLOOR, STOP_REASONS, fit_rate, iterate
from oversmooth.simulator.errors import InputError, NumericalFloorWarning
from oversmooth.simulator.metrics import METRICS, hfc_lfc, rank1_residual
from oversmooth.simulator.spectra import (
    attention_general,
    attention_symmetric_scores,
    h_symmetric,
    random_tokens,
)
from oversmooth.simulator.theory import predict
from oversmooth.simulator.tolerances import (
    LIMIT_RTOL,
    RATE_RTOL,
    STEP_ATOL,
    STEP_RTOL,
    iterated_atol,
)
from oversmooth.simulator.updates import (
    LinearRule,
    NeuTRENORule,
    PostLNRule,
    SoftmaxAttentionRule,
    ValueResidualRule,
    rule_from_system,
)

seeds = st.integers(min_value=0, max_value=2**32 - 1)


def _linear(n, d, low, high, seed, *, batch=(), a=attention_symmetric_scores):
    """LinearRule with H = Q diag(U(low, high)) Q^T (W_V = I, W_proj = H^T), and X0."""
    rng = np.random.default_rng(seed)
    size = (batch,) if isinstance(batch, int) else batch
    A = a(n, batch=batch, rng=rng)
    H = h_symmetric(rng.uniform(low, high, (*size, d)), rng=rng)
    X0 = random_tokens(n, d, batch=batch, rng=rng)
    return LinearRule(A, np.eye(d), np.swapaxes(H, -1, -2)), X0, A, H


# ---------------------------------------------------------------------------------------------
# depth and scale
# ---------------------------------------------------------------------------------------------


def test_depth_ten_thousand_stays_finite_with_log_scale():
    """n = d = 16, 10^4 layers: ||X_L|| ~ e^4000 is far beyond float64, log_norm carries it."""
    rule, X0, _, H = _linear(16, 16, 0.05, 0.5, seed=1)
    traj = iterate(rule, X0, 10_000, metrics=("hfc_lfc", "cosine"), floor=None)
    assert traj.stop_reason == "completed"
    assert traj.layers_run == 10_000
    assert traj.metrics["hfc_lfc"].shape == (10_001,)
    assert all(np.all(np.isfinite(v)) for v in traj.metrics.values())
    assert np.all(np.isfinite(traj.log_norm))
    assert np.all(np.isfinite(traj.final))
    np.testing.assert_allclose(np.linalg.norm(traj.final), 1.0, rtol=STEP_RTOL)
    # The Perron eigenvalue 1 + lambda_max(H) dominates: the log-norm grows by its log per layer.
    growth = np.log(1.0 + np.linalg.eigvalsh(H).max())
    assert traj.log_norm[-1] > 1000.0
    np.testing.assert_allclose(np.diff(traj.log_norm[-100:]), growth, rtol=LIMIT_RTOL)
    np.testing.assert_allclose(traj.log_scale, traj.log_norm[-1], rtol=STEP_RTOL)


def test_renormalised_trajectory_equals_the_raw_one():
    """Metrics are scale invariant, so renormalising changes nothing but the stored scale."""
    rule, X0, _, _ = _linear(6, 4, -1.0, 1.0, seed=4)
    raw = iterate(rule, X0, 40, renormalize=False, floor=None)
    scaled = iterate(rule, X0, 40, floor=None)
    assert scaled.renormalized
    assert not raw.renormalized
    for name in METRICS:
        np.testing.assert_allclose(
            scaled.metrics[name], raw.metrics[name], rtol=iterated_atol(40, 1.0), atol=STEP_ATOL
        )
    np.testing.assert_allclose(scaled.log_norm, raw.log_norm, rtol=iterated_atol(40, 1.0))
    np.testing.assert_allclose(
        np.exp(scaled.log_scale) * scaled.final,
        raw.final,
        atol=iterated_atol(40, float(np.linalg.norm(raw.final))),
    )


@pytest.mark.parametrize(
    "make",
    [
        lambda A, W_V, W_proj: NeuTRENORule(A, W_V, W_proj, lam=0.6),
        lambda A, W_V, W_proj: ValueResidualRule(A, W_V, W_proj, mode="resformer"),
        lambda A, W_V, W_proj: ValueResidualRule(A, W_V, W_proj, mode="svformer"),
    ],
    ids=["neutreno", "resformer", "svformer"],
)
def test_cached_first_layer_values_are_rescaled_with_the_state(make):
    """NeuTRENO and ResFormer are homogeneous jointly in (X, V_0): renormalising is exact."""
    rng = np.random.default_rng(8)
    A = attention_symmetric_scores(6, rng=rng)
    W_V, W_proj = rng.standard_normal((4, 3)), rng.standard_normal((3, 4))
    X0 = 5.0 * rng.standard_normal((6, 4))
    rule = make(A, W_V, W_proj)
    raw = iterate(rule, X0, 25, renormalize=False, floor=None)
    scaled = iterate(rule, X0, 25, floor=None)
    assert scaled.renormalized
    for name in ("hfc_lfc", "cosine", "sigma_ratio"):
        np.testing.assert_allclose(
            scaled.metrics[name], raw.metrics[name], rtol=iterated_atol(25, 1.0), atol=STEP_ATOL
        )
    np.testing.assert_allclose(scaled.log_norm, raw.log_norm, rtol=iterated_atol(25, 1.0))


def test_growing_rule_stops_for_overflow_before_inf():
    """Without renormalisation a growing rule stops while every recorded value is finite."""
    rule, X0, _, _ = _linear(6, 4, 1.0, 2.0, seed=2)
    with pytest.warns(RuntimeWarning, match="overflow"):
        traj = iterate(rule, X0, 5_000, renormalize=False, floor=None)
    assert traj.stop_reason == "overflow"
    assert 0 < traj.layers_run < 5_000
    assert np.all(np.isfinite(traj.log_norm))
    assert np.all(np.isfinite(traj.final))
    assert all(np.all(np.isfinite(v)) for v in traj.metrics.values())


def test_softmax_attention_is_not_renormalised_and_stops_for_overflow():
    rng = np.random.default_rng(5)
    d = 4
    W = 3.0 * np.eye(d)
    rule = SoftmaxAttentionRule(0.1 * W, 0.1 * W, W, W)
    with pytest.warns(RuntimeWarning, match="overflow"):
        traj = iterate(rule, rng.standard_normal((5, d)), 2_000, floor=None)
    assert not traj.renormalized
    assert traj.stop_reason == "overflow"
    assert np.all(np.isfinite(traj.log_norm))


class _BreaksAtLayer:
    """A homogeneous rule that produces NaN at one layer."""

    homogeneous = True

    def __init__(self, layer: int):
        self.layer = layer

    def __call__(self, X, layer, cache):
        return X * np.nan if layer == self.layer else 2.0 * X


def test_nonfinite_layer_stops_the_run_and_is_not_recorded():
    X0 = np.random.default_rng(0).standard_normal((4, 3))
    with pytest.warns(RuntimeWarning, match="nonfinite"):
        traj = iterate(_BreaksAtLayer(3), X0, 10)
    assert traj.stop_reason == "nonfinite"
    assert traj.layers_run == 3
    assert traj.metrics["hfc_lfc"].shape == (4,)
    np.testing.assert_allclose(
        traj.log_norm, np.log(np.linalg.norm(X0)) + np.log(2.0) * np.arange(4)
    )


# ---------------------------------------------------------------------------------------------
# the numerical floor
# ---------------------------------------------------------------------------------------------


def test_floor_stop_is_explicit():
    """Positive H oversmooths (S6): the run stops at the floor, says so, and warns."""
    rule, X0, _, _ = _linear(8, 4, 0.5, 1.0, seed=3)
    with pytest.warns(NumericalFloorWarning, match="floor"):
        traj = iterate(rule, X0, 10_000)
    assert traj.stop_reason == "floor"
    assert traj.layers_run < 10_000
    assert int(traj.floor_layer) == traj.layers_run
    ratio = traj.metrics["hfc_lfc"][-1]
    at_floor = ratio / np.hypot(1.0, ratio) < FLOOR or traj.metrics["rank1_residual"][-1] < FLOOR
    assert at_floor
    before = traj.metrics["hfc_lfc"][-2] / np.hypot(1.0, traj.metrics["hfc_lfc"][-2])
    assert before >= FLOOR or traj.metrics["rank1_residual"][-2] >= FLOOR


def test_floor_none_runs_every_layer_silently():
    rule, X0, _, _ = _linear(8, 4, 0.5, 1.0, seed=3)
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        traj = iterate(rule, X0, 300, floor=None)
    assert traj.stop_reason == "completed"
    assert traj.layers_run == 300
    assert int(traj.floor_layer) == -1


def test_hfc_only_floor_ignores_rank_when_no_svd_metric_is_recorded():
    """Without singular-value metrics only the HFC criterion applies, so the run goes further."""
    rule, X0, _, _ = _linear(8, 4, 0.5, 1.0, seed=3)
    with pytest.warns(NumericalFloorWarning):
        full = iterate(rule, X0, 10_000)
    with pytest.warns(NumericalFloorWarning):
        hfc_only = iterate(rule, X0, 10_000, metrics=("hfc_lfc",))
    assert hfc_only.layers_run >= full.layers_run
    final = hfc_only.metrics["hfc_lfc"][-1]
    assert final / np.hypot(1.0, final) < FLOOR


def test_x0_at_the_floor_stops_at_layer_zero():
    X0 = np.ones((5, 3))  # no high-frequency part at all
    rule, _, _, _ = _linear(5, 3, 0.5, 1.0, seed=0)
    with pytest.warns(NumericalFloorWarning):
        traj = iterate(rule, X0, 10)
    assert traj.layers_run == 0
    assert traj.stop_reason == "floor"


# ---------------------------------------------------------------------------------------------
# batches, rows, theory
# ---------------------------------------------------------------------------------------------


@given(seed=seeds, layers=st.integers(min_value=1, max_value=40))
def test_batch_of_systems_equals_looping(seed, layers):
    rule, X0, A, H = _linear(5, 3, -1.0, -0.05, seed, batch=3, a=attention_general)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", NumericalFloorWarning)
        batched = iterate(rule, X0, layers)
        for b in range(3):
            single = iterate(LinearRule(A[b], np.eye(3), H[b].T), X0[b], layers)
            depth = single.layers_run + 1
            assert batched.layers_run >= single.layers_run
            for name in METRICS:
                np.testing.assert_allclose(
                    batched.metrics[name][:depth, b],
                    single.metrics[name],
                    rtol=iterated_atol(layers, 1.0),
                    atol=iterated_atol(layers, 1.0),
                )
            np.testing.assert_allclose(
                batched.log_norm[:depth, b], single.log_norm, rtol=iterated_atol(layers, 1.0)
            )


def test_batched_floor_layers_are_per_system():
    """A batch stops only when every system is at the floor; each system's first layer is kept."""
    rule, X0, _, _ = _linear(6, 3, 0.2, 1.0, seed=9, batch=4)
    with pytest.warns(NumericalFloorWarning):
        traj = iterate(rule, X0, 10_000)
    assert traj.stop_reason == "floor"
    assert traj.floor_layer.shape == (4,)
    assert np.all(traj.floor_layer >= 0)
    assert traj.layers_run == traj.floor_layer.max()


def test_to_rows_is_tidy():
    rule, X0, _, _ = _linear(5, 3, -1.0, -0.05, seed=6)
    traj = iterate(rule, X0, 7, metrics=("hfc_lfc", "cosine"))
    rows = traj.to_rows()
    assert len(rows) == 8 * 3
    assert rows[0] == (0, "hfc_lfc", float(traj.metrics["hfc_lfc"][0]))
    np.testing.assert_allclose(rows[0][2], hfc_lfc(X0), rtol=STEP_RTOL)
    assert rows[2] == (0, "log_norm", float(traj.log_norm[0]))
    assert {row[1] for row in rows} == {"hfc_lfc", "cosine", "log_norm"}
    assert [row[0] for row in rows] == sorted(row[0] for row in rows)
    rule_b, X0_b, _, _ = _linear(5, 3, -1.0, -0.05, seed=6, batch=2)
    rows_b = iterate(rule_b, X0_b, 3, metrics=("cosine",)).to_rows()
    assert len(rows_b) == 4 * 2 * 2
    assert {row[3] for row in rows_b} == {0, 1}


def test_non_perron_limit_matches_theory():
    """Negative H, A not doubly stochastic: HFC/LFC -> ||(I - Pi) u_1|| / ||Pi u_1|| (claim 14)."""
    rule, X0, A, H = _linear(8, 4, -1.0, -0.05, seed=12)
    prediction = predict(A, H)
    assert prediction.dominance.kind == "non-perron"
    # Recording only HFC/LFC, the rank-one floor (reached first, S3c) does not stop the run.
    traj = iterate(rule, X0, 20_000, metrics=("hfc_lfc",))
    assert traj.stop_reason == "completed"
    assert prediction.hfc_lfc_limit is not None
    np.testing.assert_allclose(
        traj.metrics["hfc_lfc"][-1], prediction.hfc_lfc_limit, rtol=LIMIT_RTOL
    )


def test_post_ln_sign_flip_gives_identical_metrics():
    """Claim 22 through the iterator: gamma = -c and gamma = +c give the same metrics."""
    rng = np.random.default_rng(2)
    A = attention_symmetric_scores(6, rng=rng)
    W_V, W_proj = rng.standard_normal((4, 4)), rng.standard_normal((4, 4))
    X0 = rng.standard_normal((6, 4))
    plus = iterate(PostLNRule(A, W_V, W_proj, gamma=1.5), X0, 30)
    minus = iterate(PostLNRule(A, W_V, W_proj, gamma=-1.5), X0, 30)
    for name in METRICS:
        np.testing.assert_array_equal(plus.metrics[name], minus.metrics[name])


# ---------------------------------------------------------------------------------------------
# fit_rate and validation
# ---------------------------------------------------------------------------------------------


@given(
    rho=st.floats(min_value=0.05, max_value=1.5),
    c=st.floats(min_value=1e-3, max_value=1e3),
    start=st.integers(0, 50),
)
def test_fit_rate_recovers_a_geometric_factor(rho, c, start):
    layers = np.arange(start, start + 20)
    np.testing.assert_allclose(fit_rate(c * rho**layers, layers), rho, rtol=STEP_RTOL)


def test_fit_rate_on_a_perron_trajectory_matches_the_predicted_rate():
    """S2 / claim 12: the fitted decay of HFC/LFC is the theory's rate."""
    rule, X0, A, H = _linear(6, 3, 0.3, 1.0, seed=21)
    prediction = predict(A, H)
    with pytest.warns(NumericalFloorWarning):
        traj = iterate(rule, X0, 5_000, metrics=("hfc_lfc",))
    values = traj.metrics["hfc_lfc"]
    half = traj.layers_run // 2
    layers = np.arange(half, traj.layers_run + 1)
    assert traj.layers_run > 20
    # Well separated instance: the next non-Perron mode decays much faster than the leading one.
    np.testing.assert_allclose(fit_rate(values[half:], layers), prediction.rate, rtol=RATE_RTOL)


@pytest.mark.parametrize(
    ("kwargs", "named"),
    [
        pytest.param({"n_layers": 0}, "`n_layers`", id="layers-zero"),
        pytest.param({"metrics": ("hfc_lfc", "nope")}, "`metrics`", id="metric"),
        pytest.param({"floor": 2.0}, "`floor`", id="floor"),
        pytest.param({"renormalize": "sometimes"}, "`renormalize`", id="renormalize"),
        pytest.param({"X0": np.zeros((5, 3))}, "`X0`", id="zero-X0"),
        pytest.param({"X0": np.ones((4, 3))}, "`X0`", id="X0-tokens"),
        pytest.param({"X0": np.full((5, 3), np.nan)}, "`X0`", id="X0-nan"),
    ],
)
def test_iterate_rejects_bad_arguments(kwargs, named):
    rule, X0, _, _ = _linear(5, 3, -1.0, -0.05, seed=0)
    arguments = {"X0": X0, "n_layers": 5, **kwargs}
    X = arguments.pop("X0")
    with pytest.raises(InputError, match=named):
        iterate(rule, X, **arguments)


def test_renormalize_true_needs_a_homogeneous_rule():
    rng = np.random.default_rng(0)
    A = attention_symmetric_scores(4, rng=rng)
    rule = PostLNRule(A, np.eye(3), np.eye(3))
    with pytest.raises(InputError, match="`renormalize`"):
        iterate(rule, rng.standard_normal((4, 3)), 3, renormalize=True)
    assert not iterate(rule, rng.standard_normal((4, 3)), 3).renormalized


def test_fit_rate_needs_two_usable_points():
    with pytest.raises(InputError, match="`values`"):
        fit_rate([1.0, 0.0, np.nan])
    with pytest.raises(InputError, match="`layers`"):
        fit_rate([1.0, 0.5], [0, 1, 2])


def test_stop_reasons_are_documented():
    assert STOP_REASONS == ("completed", "floor", "overflow", "nonfinite")


def test_rank_floor_uses_the_recorded_rank1_residual():
    """The rank-one criterion is the metric rank1_residual itself (never re-implemented)."""
    rule, X0, _, _ = _linear(6, 3, -1.0, -0.05, seed=31, a=attention_general)
    with pytest.warns(NumericalFloorWarning):
        traj = iterate(rule, X0, 20_000, metrics=("rank1_residual",))
    assert traj.stop_reason == "floor"
    np.testing.assert_allclose(
        traj.metrics["rank1_residual"][-1],
        rank1_residual(traj.final),
        rtol=STEP_RTOL,
        atol=STEP_ATOL,
    )
    assert traj.metrics["rank1_residual"][-1] < FLOOR


def test_rule_from_system_names_all_iterate():
    rng = np.random.default_rng(1)
    A = attention_symmetric_scores(5, rng=rng)
    W_V, W_proj = rng.standard_normal((3, 3)) / 2, rng.standard_normal((3, 3)) / 2
    X0 = rng.standard_normal((5, 3))
    for name in ("linear", "pre-ln", "neutreno", "resformer", "svformer", "featscale"):
        rule = rule_from_system(name, A=A, W_V=W_V, W_proj=W_proj)
        with warnings.catch_warnings():
            warnings.simplefilter("ignore", NumericalFloorWarning)
            traj = iterate(rule, X0, 20)
        assert traj.stop_reason in STOP_REASONS
        assert all(np.all(np.isfinite(v)) for v in traj.metrics.values())
