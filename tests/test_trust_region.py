"""Trust-region Newton-CG (Steihaug-Toint) against scipy's trust-ncg, closed forms and Newton-CG in the driver.

Every distinct (objective, configuration, shapes) compiles the solver once: the tests
share configurations and pass the quadratics' matrices as arguments so that few programs cover them.
"""

import dataclasses
import functools
import logging

import jax
import jax.numpy as jnp
import numpy as np
import pytest
import scipy.optimize as so
from _small_problem import exp_problem

import shardvi as sv
from shardvi.minimizers import (
    Minimizer,
    NewtonCGConfig,
    Solution,
    Status,
    TrustRegionConfig,
    check_minimizer,
)

TIGHT = TrustRegionConfig(gtol=1e-10, xtol=None, maxiter=400)  # scipy's radius rules and forcing term


def rosen(x):
    return jnp.sum(100.0 * (x[1:] - x[:-1] ** 2) ** 2 + (1.0 - x[:-1]) ** 2)


def double_well(x):
    """``(x0^2 - 1)^2 + x1^2``: minima at ``(+-1, 0)``, a saddle at 0, negative curvature for ``|x0| < 1/sqrt(3)``."""
    return (x[0] ** 2 - 1.0) ** 2 + x[1] ** 2


def double_well_np(x):
    return (x[0] ** 2 - 1.0) ** 2 + x[1] ** 2, np.array([4 * x[0] * (x[0] ** 2 - 1.0), 2 * x[1]])


def double_well_hessp_np(x, v):
    return np.array([(12 * x[0] ** 2 - 4.0) * v[0], 2 * v[1]])


def hessp_of(f):
    return lambda x, v: jax.jvp(jax.grad(f), (x,), (v,))[1]


TRIALS = []  # the points where a recording objective was evaluated, in order


def recording(f):
    """``value_and_grad(f)`` that first hands its argument to the host (the solver's trial points)."""
    fg = jax.value_and_grad(f)

    def rec(x):
        jax.debug.callback(lambda v: TRIALS.append(jax.tree.map(np.array, v)), x, ordered=True)
        return fg(x)

    return rec


ROSEN, ROSEN_HP = recording(rosen), hessp_of(rosen)
WELL, WELL_HP = recording(double_well), hessp_of(double_well)
_solve = jax.jit(lambda fg, hp, x0, cfg: cfg.minimize(fg, hp, x0), static_argnums=(0, 1, 3))


def run(fg, hp, x0, cfg=TIGHT):
    """The solution and the trial points of its run."""
    TRIALS.clear()
    res = jax.block_until_ready(_solve(fg, hp, jax.tree.map(jnp.asarray, x0), cfg))
    jax.effects_barrier()
    trials = list(TRIALS)
    TRIALS.clear()
    return res, trials


def scipy_trust_ncg(fun_and_grad, hessp, x0, gtol=1e-10):
    """scipy's trust-ncg on numpy callables and the points where it evaluated ``f`` (in order)."""
    points = []

    def fun(x):
        points.append(np.array(x))
        return fun_and_grad(x)[0]

    res = so.minimize(
        fun,
        x0,
        jac=lambda x: fun_and_grad(x)[1],
        hessp=hessp,
        method="trust-ncg",
        options=dict(gtol=gtol, maxiter=400),
    )
    assert res.success, res.message
    return res, points


def scipy_rosen(x0):
    return scipy_trust_ncg(lambda x: (so.rosen(x), so.rosen_der(x)), so.rosen_hess_prod, x0)


# ---------------------------------------------------------------------------------------------------
# standard test functions, against scipy's trust-ncg (the same algorithm) trial point by trial point
# ---------------------------------------------------------------------------------------------------
ROSEN_STARTS = {
    "2d": np.array([-1.2, 1.0]),
    "2d-indefinite": np.array([0.0, 1.0]),  # H = diag(-398, 200): negative curvature at the start
    "5d": np.array([-1.2, 1.0, -0.5, 0.8, 1.1]),
}


@pytest.mark.parametrize("start", list(ROSEN_STARTS))
def test_rosenbrock_trial_points_match_scipy(start):
    x0 = ROSEN_STARTS[start]
    res, trials = run(ROSEN, ROSEN_HP, x0)
    ref, ref_points = scipy_rosen(x0)
    assert int(res.status) == Status.CONVERGED, res.message
    np.testing.assert_allclose(res.x, np.ones(x0.size), rtol=0, atol=1e-9)
    np.testing.assert_allclose(res.x, ref.x, rtol=0, atol=1e-12)
    # every trial point (accepted or not), in order: the same radius decisions and the same steps
    assert len(trials) == len(ref_points) == int(res.nfev) == int(res.nit) + 1
    assert int(res.nit) == ref.nit
    np.testing.assert_allclose(np.stack(trials), np.stack(ref_points), rtol=0, atol=1e-10)
    assert float(np.linalg.norm(res.grad)) <= 1e-10 and abs(float(res.fun)) <= 1e-20
    np.testing.assert_allclose(res.grad, so.rosen_der(np.asarray(res.x)), rtol=0, atol=1e-14)
    assert int(res.ncg) >= int(res.nit)


def test_vmap_over_starting_points():
    """Each batch member keeps its own iterations and status (one at its minimum from the start)."""
    x0s = np.stack([ROSEN_STARTS["2d"], ROSEN_STARTS["2d-indefinite"], np.ones(2), np.array([2.0, -1.0])])
    batched = jax.jit(jax.vmap(lambda x: TIGHT.minimize(ROSEN, ROSEN_HP, x)))(jnp.asarray(x0s))
    jax.effects_barrier()
    TRIALS.clear()
    for i, x0 in enumerate(x0s):
        single, _ = run(ROSEN, ROSEN_HP, x0)
        assert int(batched.nit[i]) == int(single.nit) and int(batched.status[i]) == int(single.status) == 0
        np.testing.assert_allclose(batched.x[i], single.x, rtol=0, atol=1e-13)
    assert int(batched.nit[2]) == 0 and len({int(k) for k in batched.nit}) == 4


def test_negative_curvature_ends_on_the_boundary_and_matches_scipy():
    """Near the saddle the first CG direction has negative curvature: the step ends on ``|p| = radius``."""
    x0 = np.array([0.1, 0.02])
    h0 = np.array([double_well_hessp_np(x0, e) for e in np.eye(2)])
    g0 = double_well_np(x0)[1]
    assert g0 @ h0 @ g0 < 0  # along -g, CG-Steihaug's first direction
    res, trials = run(WELL, WELL_HP, x0)
    ref, ref_points = scipy_trust_ncg(double_well_np, double_well_hessp_np, x0)
    assert int(res.status) == Status.CONVERGED, res.message
    np.testing.assert_allclose(res.x, [1.0, 0.0], rtol=0, atol=1e-10)
    assert len(trials) == len(ref_points)
    np.testing.assert_allclose(np.stack(trials), np.stack(ref_points), rtol=0, atol=1e-12)
    # the boundary point along -g (the root with the lower model value), not the one along +g
    np.testing.assert_allclose(trials[1], x0 - TIGHT.initial_radius * g0 / np.linalg.norm(g0), rtol=1e-13)
    # from the saddle itself: a stationary point, nothing to do
    at_saddle, _ = run(WELL, WELL_HP, np.zeros(2))
    assert int(at_saddle.status) == Status.CONVERGED and int(at_saddle.nit) == 0 and int(at_saddle.nfev) == 1


# convex quadratics with the matrices as arguments: f = x.Af.x/2 - b.x, grad = Ag x - bg, H = Ah
N = 6
_rng = np.random.default_rng(7)
_Q, _ = np.linalg.qr(_rng.normal(size=(N, N)))
A = (_Q * np.geomspace(1.0, 50.0, N)) @ _Q.T
B = _rng.normal(size=N)
EXACT = np.linalg.solve(A, B)


@functools.partial(jax.jit, static_argnames=("cfg",))
def solve_quadratic(x0, a, b, a_grad=None, b_grad=None, a_hess=None, *, cfg=TIGHT):
    a_grad = a if a_grad is None else a_grad
    b_grad = b if b_grad is None else b_grad
    a_hess = a if a_hess is None else a_hess

    def fg(x):
        jax.debug.callback(lambda v: TRIALS.append(np.array(v)), x, ordered=True)
        return 0.5 * x @ (a @ x) - b @ x, a_grad @ x - b_grad

    # A >= I: every quadratic here runs with the driver's declaration (the metric is >= I)
    return cfg.minimize(fg, lambda x, v: a_hess @ v, x0, min_curvature=1.0)


def run_quadratic(x0, *, cfg=TIGHT, **kw):
    """The solution and the trial points of a quadratic (``quadratic_args(**kw)``)."""
    TRIALS.clear()
    res = solve_quadratic(jnp.asarray(x0), **quadratic_args(**kw), cfg=cfg)
    jax.block_until_ready(res)
    jax.effects_barrier()
    trials = list(TRIALS)
    TRIALS.clear()
    return res, trials


def quadratic_args(a=A, b=B, **kw):
    args = dict(a=a, b=b, a_grad=a, b_grad=b, a_hess=a) | kw
    return {k: jnp.asarray(v) for k, v in args.items()}


EXACT_CG = TrustRegionConfig(gtol=1e-9, xtol=None, initial_radius=100.0, max_radius=1000.0, cg_tol=1e-14)


def test_convex_quadratic_exact_in_one_cg_solve_and_as_scipy():
    res, _ = run_quadratic(np.zeros(N), cfg=EXACT_CG)
    assert int(res.status) == Status.CONVERGED and int(res.nit) == 1 and int(res.nfev) == 2
    assert N <= int(res.ncg) <= N + 1  # CG on an n x n SPD system: exact in n steps (up to rounding)
    np.testing.assert_allclose(res.x, EXACT, rtol=0, atol=1e-12 * float(np.linalg.norm(EXACT)))
    np.testing.assert_allclose(float(res.fun), -0.5 * B @ EXACT, rtol=1e-13)
    # scipy's trust-ncg (forcing term 0.5, radius 1) takes more steps to the same minimum; so do we, the same
    ref, ref_points = scipy_trust_ncg(lambda x: (0.5 * x @ A @ x - B @ x, A @ x - B), lambda x, v: A @ v, np.zeros(N))
    loose, trials = run_quadratic(np.zeros(N))
    assert int(loose.status) == Status.CONVERGED and int(loose.nit) == ref.nit > 1
    np.testing.assert_allclose(np.stack(trials), np.stack(ref_points), rtol=0, atol=1e-12)
    np.testing.assert_allclose(loose.x, ref.x, rtol=0, atol=1e-12)
    np.testing.assert_allclose(loose.x, EXACT, rtol=0, atol=1e-10)


def test_far_minimum_boundary_steps_double_up_to_max_radius():
    """The minimum ~ 3700 away: boundary steps of the radius, doubled (rho ~ 1) up to max_radius, then exact."""
    b = 8000.0 * B
    assert np.linalg.norm(np.linalg.solve(A, b)) > 2500.0
    res, trials = run_quadratic(np.zeros(N), b=b, cfg=EXACT_CG)
    assert int(res.status) == Status.CONVERGED, res.message
    np.testing.assert_allclose(res.x, np.linalg.solve(A, b), rtol=1e-12)
    steps = np.linalg.norm(np.diff(np.stack(trials), axis=0), axis=1)  # all accepted: a quadratic's rho is 1
    radii = np.minimum(100.0 * 2.0 ** np.arange(len(steps) - 1), 1000.0)
    assert len(steps) >= 6 and int(res.nit) == len(steps)
    np.testing.assert_allclose(steps[:-1], radii, rtol=1e-12)  # 100, 200, 400, 800, 1000, ...
    assert steps[-1] < radii[-1] * (1 - 1e-6)  # the last one inside: the exact minimum


# ---------------------------------------------------------------------------------------------------
# pytrees, float32, stopping rules, statuses
# ---------------------------------------------------------------------------------------------------
def test_pytree_position_matches_scipy_and_absdelta_stops():
    """A dict position; ``absdelta`` ends the run on the first Newton step that decreases f by at most it."""
    x0_flat = ROSEN_STARTS["5d"]
    tree0 = {"a": x0_flat[:1], "b": x0_flat[1:].reshape(2, 2)}

    def f_tree(t):  # the objective may flatten; the solver never does
        return rosen(jnp.concatenate([t["a"], t["b"].reshape(-1)]))

    cfg = TrustRegionConfig(xtol=None, absdelta=1e-6, maxiter=400)
    res, trials = run(recording(f_tree), hessp_of(f_tree), tree0, cfg)
    assert jax.tree_util.tree_structure(res.x) == jax.tree_util.tree_structure(tree0)
    assert jax.tree_util.tree_structure(res.grad) == jax.tree_util.tree_structure(tree0)
    assert res.x["b"].shape == (2, 2) and res.x["a"].shape == (1,)
    flat = np.stack([np.concatenate([t["a"], t["b"].ravel()]) for t in trials])
    ref, ref_points = scipy_rosen(x0_flat)  # gtol 1e-10: the same steps, a few more of them
    assert int(res.status) == Status.CONVERGED and len(flat) < len(ref_points)
    np.testing.assert_allclose(flat, np.stack(ref_points[: len(flat)]), rtol=0, atol=1e-10)
    decreases = -np.diff([so.rosen(x) for x in flat])
    assert 0 <= decreases[-1] <= 1e-6 < decreases[-2]
    x = np.concatenate([res.x["a"], np.ravel(res.x["b"])])
    np.testing.assert_array_equal(x, flat[-1])  # that last step was taken
    np.testing.assert_allclose(x, ref.x, rtol=0, atol=1e-3)  # f(x) - f* ~ 1e-8


def test_float32_stays_float32_and_stops_at_the_precision_floor():
    x0 = ROSEN_STARTS["2d"].astype(np.float32)
    res, _ = run(ROSEN, ROSEN_HP, x0)  # gtol 1e-10: below float32's reach, the rounding floor ends the run
    assert res.x.dtype == res.grad.dtype == res.fun.dtype == jnp.float32
    assert int(res.status) == Status.CONVERGED, res.message
    np.testing.assert_allclose(res.x, [1.0, 1.0], rtol=0, atol=1e-3)


DEFAULT = TrustRegionConfig()  # xtol 1e-8
STEPS = TrustRegionConfig(miniter=3, maxiter=20, name="tr")  # and xtol 1e-8


def test_xtol_stops_on_a_small_newton_step():
    x0 = np.array([1.2, 1.5])
    res, trials = run(ROSEN, ROSEN_HP, x0, STEPS)
    _, full = run(ROSEN, ROSEN_HP, x0)  # the same steps, stopped by gtol 1e-10 only
    common = min(len(trials), len(full))
    np.testing.assert_array_equal(np.stack(trials[:common]), np.stack(full[:common]))
    steps = np.abs(np.diff(np.stack(trials), axis=0)).mean(axis=1)
    assert int(res.status) == Status.CONVERGED and steps[-1] <= 1e-8 < steps[-2]  # the first Newton step below xtol
    np.testing.assert_allclose(res.x, np.ones(2), rtol=0, atol=1e-12)
    bad, _ = run(ROSEN, ROSEN_HP, np.array([np.nan, 1.0]), STEPS)
    assert int(bad.status) == Status.NONFINITE and int(bad.nit) == 0


def test_maxiter_miniter_and_logging(caplog):
    with caplog.at_level(logging.INFO, logger="shardvi.minimizers"):
        capped, _ = run(ROSEN, ROSEN_HP, ROSEN_STARTS["2d"], STEPS)
        lines = [r.getMessage() for r in caplog.records if r.getMessage().startswith("tr: ")]
        forced, _ = run(ROSEN, ROSEN_HP, np.ones(2), STEPS)  # stationary at the start, miniter asks for 3 more
    assert int(capped.status) == Status.MAX_ITERATIONS and int(capped.nit) == 20 and int(capped.nfev) == 21
    assert "maxiter" in capped.message and float(capped.fun) < so.rosen(ROSEN_STARTS["2d"])
    assert len(lines) == 20 and "rho=" in lines[0] and "radius=" in lines[0] and "cg_nit=" in lines[0]
    assert int(forced.status) == Status.CONVERGED and int(forced.nit) == 3
    np.testing.assert_array_equal(forced.x, np.ones(2))
    # without miniter: converged at once (the 2-d Rosenbrock programs of TIGHT)
    at_min, _ = run(ROSEN, ROSEN_HP, np.ones(2))
    assert int(at_min.status) == Status.CONVERGED and int(at_min.nit) == 0


# one-dimensional objectives with a domain (nan outside), the coefficients as arguments:
# f = a x + b x^2 - c log(x) on x >= lo
@jax.jit
def solve_1d(x0, a, b, c, lo):
    def f(x):
        return jnp.sum(a * x + b * x**2 - c * jnp.log(x) + jnp.where(x >= lo, 0.0, jnp.nan))

    cfg = TrustRegionConfig(gtol=1e-12, xtol=None, initial_radius=100.0)
    return cfg.minimize(recording(f), hessp_of(f), x0)


def run_1d(x0, a=0.0, b=0.0, c=0.0, lo=-np.inf):
    TRIALS.clear()
    res = jax.block_until_ready(solve_1d(jnp.asarray(np.full(1, x0)), a, b, c, lo))
    jax.effects_barrier()
    trials = np.concatenate(TRIALS)
    TRIALS.clear()
    return res, trials


def test_nonfinite_trial_points_shrink_the_radius():
    """``x - 2 log x`` (minimum at 2): from 10 the Newton step goes to x < 0, where f is nan."""
    res, trials = run_1d(10.0, a=1.0, c=2.0)
    assert int(res.status) == Status.CONVERGED, res.message
    np.testing.assert_allclose(res.x, [2.0], rtol=1e-12)
    # radius 100 (the Newton step, -40, is inside), then 25 and 6.25 on the boundary
    np.testing.assert_allclose(trials[:4], [10.0, -30.0, -15.0, 3.75], rtol=1e-12)
    # near the minimum f resolves no decrease (~1e-21 against |f| ~ 0.6): the gradients decide, gtol is met
    assert abs(np.asarray(res.grad)[0]) <= 1e-12


def test_broken_operators():
    nan_op, _ = run_quadratic(np.zeros(N), a_hess=np.full((N, N), np.nan))
    assert int(nan_op.status) == Status.NONFINITE and np.array_equal(nan_op.x, np.zeros(N))
    # a declared metric (>= I) with negative curvature, or below the floor: broken, stop where we are
    x0 = B
    for h in (-np.eye(N), 0.5 * np.eye(N)):
        broken, _ = run_quadratic(x0, a_hess=h)
        assert int(broken.status) == Status.NONPOSITIVE_CURVATURE and np.array_equal(broken.x, B)
    good, _ = run_quadratic(x0)  # A >= I: nothing to report
    assert int(good.status) == Status.CONVERGED
    np.testing.assert_allclose(good.x, EXACT, rtol=0, atol=1e-10)


def test_minimum_outside_the_domain_collapses_the_radius():
    """``x^2`` on ``x >= 1`` (nan outside) from 1: every step leaves the domain, the radius shrinks until the
    step no longer changes x: no decrease found."""
    res, trials = run_1d(1.0, b=1.0, lo=1.0)
    assert int(res.status) == Status.LINE_SEARCH_FAILED and np.array_equal(res.x, np.ones(1)), res.message
    # the Newton step (-1) while inside the radius (100, 25, 6.25, 1.5625), then boundary steps of the radius
    np.testing.assert_allclose(trials[1:7], [0.0, 0.0, 0.0, 0.0, 1 - 0.390625, 1 - 0.390625 / 4], rtol=1e-15)
    assert trials[-1] == 1.0 and 20 < int(res.nit) < 40  # 100 * 4^-k: below eps / 4 in ~31 rejections


# ---------------------------------------------------------------------------------------------------
# configuration and the Minimizer protocol
# ---------------------------------------------------------------------------------------------------
@pytest.mark.parametrize(
    "kw,exc,match",
    [
        (dict(initial_radius=0.0), ValueError, "initial_radius must be > 0"),
        (dict(initial_radius=-1.0), ValueError, "initial_radius must be a finite number >= 0"),
        (dict(max_radius=float("inf")), ValueError, "max_radius must be a finite number"),
        (dict(initial_radius=10.0, max_radius=5.0), ValueError, r"initial_radius \(10.0\) must be <= max_radius"),
        (dict(eta=0.25), ValueError, r"eta must be in \[0, 0.25\)"),
        (dict(eta=-0.1), ValueError, "eta must be a finite number >= 0"),
        (dict(eta=None), ValueError, "eta must be a positive finite number"),
        (dict(cg_tol=0.0), ValueError, "cg_tol must be > 0"),
        (dict(cg_tol=1.5), ValueError, "cg_tol must be <= 1.0"),
        (dict(cg_maxiter=0), ValueError, "cg_maxiter must be >= 1"),
        (dict(cg_maxiter=2.0), TypeError, "cg_maxiter must be an int"),
        (dict(gtol=-1.0), ValueError, "gtol must be a finite number >= 0"),
        (dict(xtol="1e-8"), TypeError, "xtol must be a float or None"),
        (dict(absdelta=float("nan")), ValueError, "absdelta must be a finite number"),
        (dict(maxiter=0), ValueError, "maxiter must be >= 1"),
        (dict(miniter=3, maxiter=2), ValueError, r"miniter \(3\) must be <= maxiter"),
        (dict(name=3), TypeError, "name must be a str or None"),
    ],
)
def test_bad_config_values_are_rejected(kw, exc, match):
    with pytest.raises(exc, match=f"TrustRegionConfig.{match}"):
        TrustRegionConfig(**kw)


def test_config_is_a_hashable_minimizer():
    cfg = DEFAULT
    assert (
        isinstance(cfg, Minimizer)
        and check_minimizer(cfg, "kl_minimization", params=jax.ShapeDtypeStruct((2,), jnp.float64)) is cfg
    )
    assert hash(cfg) == hash(TrustRegionConfig(xtol=1e-8)) and cfg == TrustRegionConfig() != TIGHT
    with pytest.raises(dataclasses.FrozenInstanceError):
        cfg.eta = 0.1  # pyright: ignore[reportAttributeAccessIssue]
    x0 = jnp.asarray(ROSEN_STARTS["2d"])
    fg = jax.value_and_grad(rosen)
    via = jax.make_jaxpr(lambda x: cfg.minimize(fg, ROSEN_HP, x, min_curvature=0.5))(x0)
    other = jax.make_jaxpr(lambda x: cfg.minimize(fg, ROSEN_HP, x, min_curvature=None))(x0)
    assert str(via) != str(other)  # the curvature bound reaches the solver (nothing compiled)
    assert isinstance(jax.eval_shape(lambda x: cfg.minimize(fg, ROSEN_HP, x), x0), Solution)
    with pytest.raises(ValueError, match="TrustRegionConfig.minimize.min_curvature must be a finite number >= 0"):
        cfg.minimize(ROSEN, ROSEN_HP, x0, min_curvature=-1.0)


# ---------------------------------------------------------------------------------------------------
# through the driver
# ---------------------------------------------------------------------------------------------------
def test_optimize_kl_linear_gaussian_reaches_the_posterior_mean():
    """Wiener filter: the MAP objective of a linear Gaussian model is a quadratic minimized by the posterior mean.

    (The sample-averaged KL, with the metric's lower bound declared, runs in the nonlinear tests below.)"""
    rng = np.random.default_rng(7)
    n_lat, n_data, noise = 12, 9, 0.3
    R = rng.normal(size=(n_data, n_lat))
    L = np.tril(rng.normal(size=(n_lat, n_lat))) * 0.4 + np.eye(n_lat)
    d = R @ L @ rng.normal(size=n_lat) + noise * rng.normal(size=n_data)
    model = sv.Model(lambda xi: jnp.asarray(R) @ (jnp.asarray(L) @ xi), jax.ShapeDtypeStruct((n_lat,), jnp.float64))
    lh = sv.Gaussian(d, noise_std=noise).amend(model)
    post_mean = np.linalg.solve(np.eye(n_lat) + L.T @ R.T @ R @ L / noise**2, L.T @ R.T @ d / noise**2)
    samples, state = sv.optimize_kl(
        lh,
        jnp.zeros(n_lat),
        key=jax.random.PRNGKey(1),
        n_total_iterations=1,
        n_samples=0,
        sample_mode="linear_resample",
        kl_minimization=TrustRegionConfig(gtol=1e-11, xtol=None, initial_radius=0.5),
    )
    assert len(samples) == 0 and np.max(np.abs(np.asarray(samples.pos) - post_mean)) <= 1e-9
    assert state.history[0].kl_status == int(Status.CONVERGED) and state.history[0].kl_nit > 1


EXP_TR = TrustRegionConfig(gtol=1e-10, xtol=None)


@functools.cache
def exp_run(kl, strategy="vmap"):
    """``(samples, state)`` of one MGVI iteration on the small exp problem (cached: product_compiler tests only)."""
    lh, pos0 = exp_problem()
    strategy = sv.parallel.ShardMap(devices=jax.devices()[:4]) if strategy == "shard_map4" else strategy
    return sv.optimize_kl(
        lh,
        pos0,
        key=jax.random.PRNGKey(3),
        n_total_iterations=1,
        n_samples=2,
        sample_mode="linear_resample",
        linear_sampling=sv.CGConfig(tol=1e-10, maxiter=100),
        kl_minimization=kl,
        sample_map=strategy,
        kl_map=strategy,
    )


@pytest.mark.product_compiler  # shares its trust-region run with the bitwise test below
def test_optimize_kl_nonlinear_matches_newton_cg():
    tr, tr_state = exp_run(EXP_TR)
    ncg, ncg_state = exp_run(NewtonCGConfig(gtol=1e-10, xtol=None, cg=sv.CGConfig(tol=1e-8)))
    assert tr_state.history[0].kl_status == ncg_state.history[0].kl_status == int(Status.CONVERGED)
    for a, b in zip(jax.tree.leaves(tr.pos), jax.tree.leaves(ncg.pos)):
        np.testing.assert_allclose(a, b, rtol=0, atol=1e-9)
    np.testing.assert_allclose(tr_state.history[0].kl_energy, ncg_state.history[0].kl_energy, rtol=1e-13)
    # the samples were drawn at the same start with the same keys: the same residuals
    for a, b in zip(jax.tree.leaves(tr.residuals), jax.tree.leaves(ncg.residuals)):
        np.testing.assert_array_equal(a, b)


@pytest.mark.slow
@pytest.mark.product_compiler
def test_optimize_kl_bitwise_on_one_and_four_devices():
    one, one_state = exp_run(EXP_TR)
    four, four_state = exp_run(EXP_TR, "shard_map4")
    assert one_state.history[0].kl_status == int(Status.CONVERGED)
    got = jax.tree.leaves((four.pos, four.residuals)) + [np.asarray(four_state.history[0].kl_energy)]
    ref = jax.tree.leaves((one.pos, one.residuals)) + [np.asarray(one_state.history[0].kl_energy)]
    for a, b in zip(got, ref):
        a, b = np.asarray(a), np.asarray(b)
        assert a.dtype == b.dtype and a.shape == b.shape and a.tobytes() == b.tobytes()
