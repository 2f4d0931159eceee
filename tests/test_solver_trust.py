"""Solvers that report CONVERGED are near their root / minimum; non-positive curvature is never silent.

With default settings, Newton-CG (geoVI update, KL minimization, plain use) is
compared with tightly solved roots and minima; a step made small by an inner CG cut short, by the
gradient fallback or by backtracking must not pass for convergence. Non-positive curvature of a metric
that must be positive definite raises (naming stage and iteration); unconverged sample solves are
recorded per sample in the iteration report and logged.
"""

import json
import re
import warnings

import jax
import jax.numpy as jnp
import numpy as np
import pytest
import scipy.optimize as so

import shardvi as sv
from shardvi.minimizers import CGConfig, NewtonCGConfig, Status, newton_cg, status_message
from shardvi.minimizers.cg import cg_solve
from shardvi.parallel.strategy import get_strategy
from shardvi.vi.diagnostics import IterationReport
from shardvi.vi.kl import kl_metric, kl_value_and_grad
from shardvi.vi.settings import DEFAULT_KL_MINIMIZATION, DEFAULT_LINEAR_SAMPLING, DEFAULT_NONLINEAR_UPDATE


def lognormal(n, noise, seed, amp=1.0):
    """``d = exp(amp xi_true) + noise``: the likelihood on the latent space and ``xi_true``."""
    rng = np.random.default_rng(seed)
    xi_true = rng.normal(size=n)
    data = np.exp(amp * xi_true) + noise * rng.normal(size=n)
    model = sv.Model(lambda xi: jnp.exp(amp * xi), jax.ShapeDtypeStruct((n,), jnp.float64))
    return sv.Gaussian(data, noise_std=noise).amend(model), xi_true


# ---------------------------------------------------------------------------------------------------
# CONVERGED means close to the root / minimum
# ---------------------------------------------------------------------------------------------------
@pytest.mark.slow
def test_geovi_update_with_default_config_reaches_the_tight_root():
    """1-D log-normal, 32 pixels, at the truth (MAP-ish): the default geoVI update equals the root.

    The root of ``delta(r) = g(p + r) - g(p) - y`` is found independently by scipy (MINPACK's hybrid
    method, dense Jacobian). A solver that judges convergence on the step it took would stop its inner
    CG after one iteration (energy rule, miniter 0), take a tiny step and declare convergence by ``xtol``
    with ``|delta|^2 / 2`` still ~0.2.
    """
    lh, xi_true = lognormal(32, 0.1, 0)
    pos = jnp.asarray(xi_true)
    x_bar, vjp = jax.vjp(lh.transformation, pos)

    def delta(r, y):
        return r + vjp(lh.transformation(pos + r) - x_bar)[0] - y

    def solve(key, sign):
        r_lin, _ = sv.draw_linear_residual(lh, pos, key, DEFAULT_LINEAR_SAMPLING)
        r, res = sv.nonlinearly_update_residual(lh, pos, r_lin, key, sign, DEFAULT_NONLINEAR_UPDATE)
        y = sign * sv.vi.metric_sample(lh, pos, key)
        return r_lin, r, res.status, y

    keys = jax.random.split(jax.random.PRNGKey(0), 3).repeat(2, axis=0)
    signs = jnp.tile(jnp.array([1.0, -1.0]), 3)
    r_lin, r, status, y = jax.jit(jax.vmap(solve))(keys, signs)
    fun, jac = jax.jit(delta), jax.jit(jax.jacfwd(delta))
    for i, yi in enumerate(y):
        root = so.root(
            lambda v, yi=yi: np.asarray(fun(jnp.asarray(v), yi)),
            np.asarray(r_lin[i]),
            jac=lambda v, yi=yi: np.asarray(jac(jnp.asarray(v), yi)),
            method="hybr",
            tol=1e-13,
        )
        assert np.max(np.abs(root.fun)) < 1e-9 * np.max(np.abs(yi)), root.message
        if int(status[i]) == Status.CONVERGED:  # CONVERGED means: at the root
            np.testing.assert_allclose(np.asarray(r[i]), root.x, rtol=0, atol=1e-6)
            assert float(jnp.max(jnp.abs(fun(r[i], yi)))) <= 1e-6 * float(jnp.max(jnp.abs(yi)))
    assert np.all(np.asarray(status) == Status.CONVERGED), [status_message(s) for s in status]


@pytest.mark.slow
def test_kl_minimization_with_default_config_reaches_the_tight_minimum():
    """The engine's default KL Newton-CG converges only within ``xtol`` of the KL minimum (same residuals).

    A solver that judges convergence on the step it took reports CONVERGED 3.7e-3 away from it
    (``xtol=1e-6``).
    """
    n = 16
    lh, _ = lognormal(n, 0.03, 2)
    with warnings.catch_warnings():
        warnings.simplefilter("error", sv.ConvergenceWarning)  # every sampling CG converges: no warning
        smp, state = sv.optimize_kl(
            lh,
            jnp.zeros(n),
            key=jax.random.PRNGKey(2),
            n_total_iterations=2,
            n_samples=2,
            sample_mode="linear_resample",
            progress=False,
        )
    report = state.history[-1]
    assert report.kl_status == Status.CONVERGED, status_message(report.kl_status)
    # every sampling CG converged: recorded per sample
    assert [r.sampling_status for r in state.history] == [[Status.CONVERGED] * 2] * 2
    strategy = get_strategy("vmap", "kl_map", None)
    res_ = smp.residuals
    tight = newton_cg(
        lambda x: kl_value_and_grad(lh, x, res_, strategy),
        lambda x, t: kl_metric(lh, x, res_, t, strategy),
        smp.pos,
        NewtonCGConfig(xtol=1e-13, gtol=1e-11, maxiter=200, cg=CGConfig(tol=1e-12, maxiter=1000)),
    )
    assert int(tight.status) == Status.CONVERGED
    # mean |x - x*| <= xtol bounds the largest entry by n * xtol
    assert float(jnp.max(jnp.abs(smp.pos - tight.x))) <= n * DEFAULT_KL_MINIMIZATION.xtol
    assert 0 <= report.kl_energy - float(tight.fun) <= 1e-9


def rosen(x):
    return jnp.sum(100.0 * (x[1:] - x[:-1] ** 2) ** 2 + (1.0 - x[:-1]) ** 2)


ROSEN_FG = jax.value_and_grad(rosen)
newton_rosen = jax.jit(
    lambda x0, cfg: newton_cg(ROSEN_FG, lambda x, v: jax.jvp(jax.grad(rosen), (x,), (v,))[1], x0, cfg), static_argnums=1
)


@pytest.mark.parametrize(
    "config,x0",
    [
        (DEFAULT_KL_MINIMIZATION, [1.3, 0.7, 0.8, 1.9, 1.2]),  # old: CONVERGED 6.9e-5 from the minimum
        (NewtonCGConfig(), [0.0, 0.0, 0.0, 0.0, 0.0]),  # old: CONVERGED 2.8e-7 from it (xtol 1e-8)
    ],
    ids=["engine-KL-default", "NewtonCGConfig()"],
)
def test_newton_cg_default_config_rosenbrock_matches_scipy(config, x0):
    x0 = np.asarray(x0)
    res = newton_rosen(jnp.asarray(x0), config)
    assert int(res.status) == Status.CONVERGED, status_message(res.status)
    sp = so.minimize(
        so.rosen,
        x0,
        jac=so.rosen_der,
        hessp=so.rosen_hess_prod,
        method="Newton-CG",
        options=dict(xtol=1e-12, maxiter=1000),
    )
    assert sp.success
    np.testing.assert_allclose(sp.x, np.ones(5), atol=1e-6)
    np.testing.assert_allclose(np.asarray(res.x), np.ones(5), rtol=0, atol=config.xtol)


def spd(seed, n, lo=1.0, hi=10.0):
    rng = np.random.default_rng(seed)
    q, _ = np.linalg.qr(rng.normal(size=(n, n)))
    return (q * np.geomspace(lo, hi, n)) @ q.T


@pytest.mark.slow
def test_newton_cg_default_config_float32_pytree_quadratic():
    """float32, condition number 10: default settings reach the minimum to float32 accuracy.

    A solver that judges convergence on the step it took stops 1.8e-4 away: at float32 rounding the
    Armijo test fails, backtracking makes the step tiny and ``xtol`` takes that for convergence.
    """
    n, k = 12, 4

    def flat(p):
        return jnp.concatenate([p["a"], p["b"].ravel()])

    def unflat(x):
        return {"a": x[:k], "b": x[k:].reshape(-1, 1)}

    @jax.jit
    def solve(a, b):
        def fg(p):
            x = flat(p)
            ax = a @ x
            return 0.5 * x @ ax - b @ x, unflat(ax - b)

        return newton_cg(fg, lambda p, t: unflat(a @ flat(t)), unflat(jnp.zeros(n, jnp.float32)))

    for seed in range(5):
        a, b = spd(seed, n), np.random.default_rng(100 + seed).normal(size=n)
        res = solve(jnp.asarray(a, jnp.float32), jnp.asarray(b, jnp.float32))
        assert res.x["a"].dtype == jnp.float32 and res.x["b"].dtype == jnp.float32
        assert int(res.status) == Status.CONVERGED, status_message(res.status)
        # float32 accuracy: a few eps times the condition number
        np.testing.assert_allclose(np.asarray(flat(res.x), np.float64), np.linalg.solve(a, b), rtol=0, atol=2e-6)


@pytest.mark.slow
def test_newton_step_cut_short_by_the_inner_cg_is_not_convergence():
    """A tiny step from an inner CG stopped at maxiter says nothing about the distance to the minimum.

    ``H = diag(1e6, 1)`` with the error in the soft direction: one CG iteration moves along the stiff
    gradient component only (step ~2e-9 < xtol) while ``x`` is 1e-3 from the minimum.
    """
    h = jnp.array([1e6, 1.0])

    def fg(x):
        return 0.5 * jnp.sum(h * x**2), h * x

    x0 = jnp.array([1e-9, 1e-3])
    cfg = NewtonCGConfig(maxiter=5, cg=CGConfig(tol=0.5, maxiter=1))
    res = newton_cg(fg, lambda x, v: h * v, x0, cfg)
    assert int(res.status) == Status.MAX_ITERATIONS, status_message(res.status)  # old: CONVERGED at nit 1
    # with the curvature floor of a metric (H >= I), the unsolved CG residual bounds the Newton step: same answer
    floor = newton_cg(fg, lambda x, v: h * v, x0, cfg, min_curvature=1.0)
    assert int(floor.status) == Status.MAX_ITERATIONS
    # a converged inner solve finds it
    ok = newton_cg(fg, lambda x, v: h * v, x0, NewtonCGConfig())
    assert int(ok.status) == Status.CONVERGED and float(jnp.max(jnp.abs(ok.x))) <= 1e-8


@pytest.mark.slow
def test_newton_cg_energy_rule_is_opt_in_and_never_convergence():
    """NIFTy's inner energy rule (``energy_reduction_factor``) is off by default; on, it only saves CG work."""
    h = jnp.asarray(np.geomspace(1.0, 1e4, 20))

    def fg(x):
        return 0.5 * jnp.sum(h * (x - 1) ** 2), h * (x - 1)

    for erf in (None, 0.1):
        res = newton_cg(fg, lambda x, v: h * v, jnp.zeros(20), NewtonCGConfig(energy_reduction_factor=erf))
        if int(res.status) == Status.CONVERGED:
            assert float(jnp.max(jnp.abs(res.x - 1))) <= 20 * 1e-8, erf
    assert NewtonCGConfig().energy_reduction_factor is None


# ---------------------------------------------------------------------------------------------------
# non-positive curvature
# ---------------------------------------------------------------------------------------------------
def test_cg_curvature_at_rounding_level_is_nonpositive():
    """``d.A.d = 1e-20`` with ``|d| = |A d| = 1``: rounding noise, not curvature (old: a 1e20 step)."""
    a = jnp.array([[1e-20, 1.0], [1.0, 0.0]])
    res = sv.minimizers.conjugate_gradient(lambda v: a @ v, jnp.array([1.0, 0.0]))
    assert int(res.status) == Status.NONPOSITIVE_CURVATURE and int(res.nit) == 1
    np.testing.assert_array_equal(np.asarray(res.x), [0.0, 0.0])


def test_cg_min_curvature_floor():
    """``min_curvature=1``: a PD operator below the floor (a metric J^T F J + I with F < 0) is flagged."""
    rng = np.random.default_rng(0)
    j = rng.normal(size=(6, 6)) * 0.3
    b = jnp.asarray(rng.normal(size=6))
    broken = jnp.asarray(np.eye(6) - j.T @ j)  # I + J^T F J with F = -I: still PD here
    assert np.all(np.linalg.eigvalsh(np.asarray(broken)) > 0)
    plain = cg_solve(lambda v: broken @ v, b, tol=1e-12, maxiter=100)
    assert int(plain.status) == Status.CONVERGED  # positive definite: plain CG cannot tell
    floor = cg_solve(lambda v: broken @ v, b, tol=1e-12, maxiter=100, min_curvature=1.0)
    assert int(floor.status) == Status.NONPOSITIVE_CURVATURE and int(floor.nit) == 1
    good = jnp.asarray(np.eye(6) + j.T @ j)
    ref = cg_solve(lambda v: good @ v, b, tol=1e-12, maxiter=100)
    checked = cg_solve(lambda v: good @ v, b, tol=1e-12, maxiter=100, min_curvature=1.0)
    assert int(checked.status) == Status.CONVERGED and int(checked.nit) == int(ref.nit)
    np.testing.assert_array_equal(np.asarray(checked.x), np.asarray(ref.x))


def test_newton_cg_metric_with_nonpositive_curvature_stops():
    """A declared metric (``min_curvature``) that is not PD stops at once, at the starting point."""

    def fg(x):
        return 0.5 * jnp.sum(x**2), x

    x0 = jnp.array([1.0, -2.0, 0.5])
    res = newton_cg(fg, lambda x, v: -v, x0, NewtonCGConfig(), min_curvature=1.0)
    assert int(res.status) == Status.NONPOSITIVE_CURVATURE and int(res.nit) == 1
    np.testing.assert_array_equal(np.asarray(res.x), np.asarray(x0))
    assert int(res.nfev) == 2 and "curvature" in status_message(res.status)


def test_newton_cg_gradient_fallback_to_maxiter_reports_nonpositive_curvature():
    """Without a declared metric a non-PD ``hessp`` falls back to gradient steps, but the result says so."""
    a = jnp.array([1.0, 10.0])

    def fg(x):
        return 0.5 * jnp.sum(a * (x - 1) ** 2), a * (x - 1)

    res = newton_cg(fg, lambda x, v: -v, jnp.zeros(2), NewtonCGConfig(maxiter=20))
    assert int(res.status) == Status.NONPOSITIVE_CURVATURE, status_message(res.status)
    assert float(res.fun) < float(fg(jnp.zeros(2))[0])  # the gradient steps still went downhill


def broken_noise_likelihood(scale):
    """A linear model under a likelihood built from functions whose metric is ``-I`` (not positive definite).

    (``sv.Gaussian`` refuses such noise callables when it is built: see the test below.)"""
    n = 8
    rng = np.random.default_rng(0)
    r = rng.normal(size=(n, n)) * scale
    d = jnp.asarray(rng.normal(size=n))
    model = sv.Model(lambda xi: jnp.asarray(r) @ xi, jax.ShapeDtypeStruct((n,), jnp.float64))
    lh = sv.Likelihood(
        lambda s: -0.5 * jnp.sum((d - s) ** 2),
        domain=jax.ShapeDtypeStruct((n,), jnp.float64),
        metric=lambda s, t: -t,
        left_sqrt_metric=lambda s, e: e,
        lsm_tangents_shape=jax.ShapeDtypeStruct((n,), jnp.float64),
    )
    return lh.amend(model), n


def test_gaussian_noise_callables_that_are_no_square_root_pair_are_refused():
    """``noise_std_inv`` must be self-adjoint with ``S S = N^{-1}`` (and ``N^{-1}`` self-adjoint): checked at two
    random residuals when the likelihood is built; a consistent dense pair passes, in float64 and float32."""
    d = np.ones(8)
    for cov_inv, std_inv, match in [
        (lambda v: -v, lambda v: v, "not the square root"),  # N^{-1} = -I: no real square root
        (lambda v: 4.0 * v, lambda v: v, "not the square root"),
        (lambda v: jnp.cumsum(v), lambda v: v, "noise_cov_inv is not self-adjoint"),
        (lambda v: 4.0 * v, lambda v: 2.0 * jnp.cumsum(v), "noise_std_inv is not self-adjoint"),
    ]:
        with pytest.raises(ValueError, match=match):
            sv.Gaussian(d, noise_cov_inv=cov_inv, noise_std_inv=std_inv)
    a = np.random.default_rng(1).normal(size=(8, 8))
    w, v = np.linalg.eigh(np.linalg.inv(a @ a.T + 8 * np.eye(8)))
    for dtype in (np.float64, np.float32):
        prec, sqrt = (jnp.asarray(v @ np.diag(p) @ v.T, dtype) for p in (w, np.sqrt(w)))
        lh = sv.Gaussian(d.astype(dtype), noise_cov_inv=lambda r, m=prec: m @ r, noise_std_inv=lambda r, m=sqrt: m @ r)
        want = 0.5 * d @ np.asarray(prec, np.float64) @ d
        np.testing.assert_allclose(lh.energy(jnp.zeros(8, dtype)), want, rtol=1e-5)


@pytest.mark.parametrize(
    "scale,n_samples,stage",
    [
        (2.0, 2, "sampling (MGVI linear CG)"),
        (0.1, 2, "sampling (MGVI linear CG)"),  # weak data: M = I - J^T J is still PD, but below its floor I
        (2.0, 0, "KL minimization"),  # MAP: no sampling, the KL Newton-CG meets it
    ],
)
@pytest.mark.slow
def test_non_positive_definite_noise_raises_naming_stage_and_iteration(scale, n_samples, stage):
    lh, n = broken_noise_likelihood(scale)
    with pytest.raises(
        sv.NonPositiveCurvatureError,
        match=rf"non-positive curvature in {re.escape(stage)} at "
        r"iteration 0.*noise_cov_inv",
    ) as info:
        sv.optimize_kl(
            lh,
            jnp.zeros(n),
            key=jax.random.PRNGKey(0),
            n_total_iterations=2,
            n_samples=n_samples,
            sample_mode="linear_resample",
            progress=False,
        )
    assert info.value.iteration == 0 and info.value.stage == stage
    assert isinstance(info.value, ValueError)
    if n_samples:
        assert info.value.samples == [0, 1]


@pytest.mark.slow
def test_unconverged_sample_solves_are_recorded_and_warned_once_per_stage():
    lh, xi_true = lognormal(16, 0.1, 1)
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        _, state = sv.optimize_kl(
            lh,
            jnp.asarray(xi_true),
            key=jax.random.PRNGKey(1),
            n_total_iterations=2,
            n_samples=2,
            sample_mode=lambda i: "linear_resample" if i == 0 else "nonlinear_resample",
            linear_sampling=CGConfig(tol=1e-12, maxiter=2),
            nonlinear_update=NewtonCGConfig(maxiter=1),
            progress=False,
        )
    first, second = state.history
    assert first.sampling_status == [Status.MAX_ITERATIONS] * 2 and first.nonlinear_status == []
    assert second.sampling_status == [Status.MAX_ITERATIONS] * 2
    assert second.nonlinear_status == [Status.MAX_ITERATIONS] * 4  # one per sample of the antithetic pairs
    msgs = [str(w.message) for w in caught if issubclass(w.category, sv.ConvergenceWarning)]
    # one per stage, at its first unconverged iteration, numbered like the iteration's log line
    assert len(msgs) == 2, msgs
    assert msgs[0].startswith("sampling (MGVI linear CG) at iteration 1/2: 2 of 2 sample solves did not converge")
    assert "linear_sampling.maxiter (now 2), e.g. linear_sampling=sv.CGConfig(..., maxiter=4)" in msgs[0]
    assert msgs[1].startswith("sampling (geoVI update) at iteration 2/2: 4 of 4")
    assert "nonlinear_update.maxiter (now 1)" in msgs[1]
    with warnings.catch_warnings():  # the documented switch
        warnings.filterwarnings("error")
        warnings.filterwarnings("ignore", category=sv.ConvergenceWarning)
        sv.optimize_kl(
            lh,
            jnp.asarray(xi_true),
            key=jax.random.PRNGKey(1),
            n_total_iterations=1,
            n_samples=2,
            sample_mode="linear_resample",
            linear_sampling=CGConfig(tol=1e-12, maxiter=2),
            progress=False,
        )
    # JSON-serializable (checkpoint metadata) and the iteration line counts them
    assert json.loads(json.dumps(second._asdict()))["nonlinear_status"] == [1, 1, 1, 1]
    from shardvi.vi.reporting import format_report as _format_report

    assert "(2 unconverged)" in _format_report(second, 2) and "(4 unconverged)" in _format_report(second, 2)


def test_iteration_report_of_an_older_checkpoint_loads():
    """Histories written before the per-sample statuses existed still load (``IterationReport(**old)``)."""
    old = dict(
        iteration=1,
        sample_mode="linear_resample",
        n_samples=2,
        kl_energy=1.0,
        sampling_nit=[3, 4],
        nonlinear_nit=[],
        kl_nit=2,
        kl_cg_nit=5,
        kl_status=0,
        chi2_likelihood=1.0,
        chi2_prior=1.0,
        wall_time=0.1,
    )
    rep = IterationReport(**old)
    assert rep.sampling_status is None and rep.nonlinear_status is None
    from shardvi.vi.reporting import format_report as _format_report

    assert "unconverged" not in _format_report(rep, 1)


def test_sample_status_raises_and_the_warning_names_the_field():
    """Sampling CG (metric >= I): non-positive curvature raises; geoVI: unconverged solves are one message
    naming the configuration field and a suggested value."""
    from shardvi.vi.reporting import sample_status as _sample_status
    from shardvi.vi.reporting import unconverged_message

    codes = np.array([0, 1, 0, 2, 4], np.int32)
    with pytest.raises(
        sv.NonPositiveCurvatureError,
        match=r"sampling \(MGVI linear CG\) at iteration 3 "
        r"\(sample solves \[3\]\)",
    ) as info:
        _sample_status(codes, 3, "sampling (MGVI linear CG)", metric_must_be_pd=True)
    assert info.value.samples == [3] and info.value.iteration == 3
    got = _sample_status(codes, 3, "sampling (geoVI update)", metric_must_be_pd=False)
    assert got == [0, 1, 0, 2, 4]
    msg = unconverged_message(got, 3, 5, "sampling (geoVI update)", "nonlinear_update", NewtonCGConfig(maxiter=7))
    assert msg.startswith(
        "sampling (geoVI update) at iteration 4/5: 3 of 5 sample solves did not converge (1 at maxiter "
        "(samples [1]), 1 at non-positive curvature (samples [3]), 1 at a failed line search "
        "(samples [4]))."
    )
    assert "raise nonlinear_update.maxiter (now 7), e.g. nonlinear_update=sv.NewtonCGConfig(..., maxiter=14)" in msg
    assert "category=sv.ConvergenceWarning" in msg
    # where the samples go: an early iteration's feed its KL step only, the last iteration's are the result
    assert "the next iteration draws or updates its own" in msg and "They are among" not in msg
    last = unconverged_message(got, 4, 5, "sampling (geoVI update)", "nonlinear_update", NewtonCGConfig(maxiter=7))
    assert "They are among the samples the run returns." in last and "next iteration" not in last
    kl = unconverged_message(got, 3, 5, "KL minimization", "kl_minimization", NewtonCGConfig(maxiter=7))
    assert "next iteration" not in kl and "samples the run returns" not in kl
    assert unconverged_message([0, 0], 3, 5, "sampling (geoVI update)", "nonlinear_update", None) is None
    # a failed line search alone: the precision floor, and for the geoVI update a fold of the coordinate map
    msg = unconverged_message([0, 4], 3, 5, "sampling (geoVI update)", "nonlinear_update", NewtonCGConfig())
    assert "precision floor of nonlinear_update" in msg and "fold of the sample's coordinate map" in msg
    msg = unconverged_message([0, 4], 3, 5, "KL minimization", "kl_minimization", NewtonCGConfig())
    assert "precision floor of kl_minimization" in msg and "fold" not in msg
