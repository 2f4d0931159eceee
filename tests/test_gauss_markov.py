"""Gauss-Markov processes: exact covariances on irregular grids, gradients, Wiener filter, bad input.

Each process is affine in its latent for fixed parameters, ``x = x(0) + J xi``, so
its covariance is exactly ``J J^T`` (``J`` by ``jax.jacfwd``): compared with the
closed forms of the continuous processes at the grid times.
"""

import jax
import jax.numpy as jnp
import numpy as np
import pytest

import shardvi as sv
from shardvi.models import (
    IntegratedWienerProcess,
    LogNormal,
    Normal,
    OrnsteinUhlenbeckProcess,
    WienerProcess,
    discrete_gauss_markov,
    integrated_wiener_process,
    ornstein_uhlenbeck_process,
    prior_model,
    wiener_process,
)

N = 25
DT = np.random.default_rng(0).uniform(0.05, 0.6, size=N - 1)  # irregular grid
T = np.concatenate([[0.0], np.cumsum(DT)])  # times from t_0
RTOL = 1e-12


def latent(model, seed, scale=1.0):
    """A standard-normal latent drawn with NumPy (no compiled random-number program per shape)."""
    rng = np.random.default_rng(seed)
    return jax.tree.map(lambda d: scale * rng.normal(size=d.shape).astype(d.dtype), model.domain)


def flat(tree):
    return np.concatenate([np.ravel(a) for a in jax.tree.leaves(tree)])


def affine_parts(*models):
    """``[(x(0), J)]`` of models that are affine in their (raveled) latents; checks they are affine.

    One compiled program for all of them (XLA's fixed cost per program dominates these small ones).
    """
    zeros = [jax.tree.map(lambda d: np.zeros(d.shape, d.dtype), m.domain) for m in models]
    zs = [latent(m, 1) for m in models]

    @jax.jit
    def parts(zs):
        out = []
        for m, zero, z in zip(models, zeros, zs):
            f = lambda z, m=m: jnp.ravel(m(z))  # noqa: E731
            out.append((f(zero), jax.jacfwd(f)(zero), f(z)))
        return out

    result = []
    for (offset, jac, at_z), z in zip(parts(zs), zs):
        offset = np.asarray(offset)
        jac = np.concatenate([np.reshape(j, (offset.size, -1)) for j in jax.tree.leaves(jac)], axis=1)
        np.testing.assert_allclose(np.asarray(at_z), offset + jac @ flat(z), rtol=RTOL, atol=RTOL)
        result.append((offset, jac))
    return result


def assert_cov(jac, cov):
    np.testing.assert_allclose(jac @ jac.T, cov, rtol=RTOL, atol=RTOL * np.abs(cov).max())


# ------------------------------------------------------------------------------------------ exact covariances
def test_wiener_covariance_fixed_and_random_start():
    sigma = 0.8
    wp = WienerProcess(DT, sigma)
    assert sorted(wp.domain) == ["wpxi"] and wp.target.shape == (N,)
    np.testing.assert_allclose(wp.times, T, rtol=1e-15)
    wp_random = WienerProcess(DT, sigma, x0=(0.3, 0.7), prefix="w")
    assert sorted(wp_random.domain) == ["wx0", "wxi"]
    (offset, jac), (offset_random, jac_random) = affine_parts(wp, wp_random)
    np.testing.assert_array_equal(offset, 0.0)
    assert_cov(jac, sigma**2 * np.minimum.outer(T, T))
    offset, jac = offset_random, jac_random
    np.testing.assert_allclose(offset, 0.3, rtol=RTOL)
    assert_cov(jac, sigma**2 * np.minimum.outer(T, T) + 0.7**2)


def test_wiener_covariance_with_one_scale_per_step():
    """``Cov(x_i, x_j) = V(min(t_i, t_j))`` with ``V(t_i) = sum_{k < i} sigma_k^2 dt_k``."""
    sigma = np.linspace(0.2, 1.5, N - 1)
    ((_, jac),) = affine_parts(WienerProcess(DT, sigma))
    v = np.concatenate([[0.0], np.cumsum(sigma**2 * DT)])
    assert_cov(jac, v[np.minimum.outer(np.arange(N), np.arange(N))])


def test_ornstein_uhlenbeck_covariance_stationary_and_fixed_start():
    sigma, gamma = 1.3, 0.7
    ou = OrnsteinUhlenbeckProcess(DT, sigma, gamma)
    assert sorted(ou.domain) == ["oux0", "ouxi"]
    ou_fixed = OrnsteinUhlenbeckProcess(DT, sigma, gamma, x0=0.5)
    (offset, jac), (offset_fixed, jac_fixed) = affine_parts(ou, ou_fixed)
    np.testing.assert_array_equal(offset, 0.0)
    lag = np.abs(np.subtract.outer(T, T))
    assert_cov(jac, sigma**2 / (2 * gamma) * np.exp(-gamma * lag))
    np.testing.assert_allclose(ou.stationary_std({}), sigma / np.sqrt(2 * gamma), rtol=1e-15)

    np.testing.assert_allclose(offset_fixed, 0.5 * np.exp(-gamma * T), rtol=RTOL)
    s, t = np.meshgrid(T, T, indexing="ij")
    assert_cov(jac_fixed, sigma**2 / (2 * gamma) * (np.exp(-gamma * lag) - np.exp(-gamma * (s + t))))


def _iwp_cov(sigma):
    """Closed-form joint covariance of ``(x, v)`` at the grid times, ``x0 = v0 = 0``: a ``(N, 2, N, 2)`` array."""
    s, t = np.meshgrid(T, T, indexing="ij")
    lo, hi = np.minimum(s, t), np.maximum(s, t)
    cov = np.empty((N, 2, N, 2))
    cov[:, 0, :, 0] = lo**2 * hi / 2 - lo**3 / 6
    # Cov(x(s), v(t)) = int_0^s min(u, t) du
    cov[:, 0, :, 1] = np.where(s <= t, s**2 / 2, s * t - t**2 / 2)
    cov[:, 1, :, 0] = cov[:, 0, :, 1].T
    cov[:, 1, :, 1] = lo
    return sigma**2 * cov


def test_integrated_wiener_covariance_position_velocity_and_cross_terms():
    sigma = 0.9
    iwp = IntegratedWienerProcess(DT, sigma, return_velocity=True)
    assert sorted(iwp.domain) == ["iwpxi"] and iwp.domain["iwpxi"].shape == (N - 1, 2)
    assert iwp.target.shape == (N, 2)
    # and the x-x block on its own: sigma^2 (s^2 t / 2 - s^3 / 6) for s <= t
    (offset, jac), (_, jac_x) = affine_parts(iwp, IntegratedWienerProcess(DT, sigma))
    np.testing.assert_array_equal(offset, 0.0)
    cov = _iwp_cov(sigma).reshape(2 * N, 2 * N)  # raveled (N, 2) state: x_0, v_0, x_1, v_1, ...
    assert_cov(jac, cov)
    assert_cov(jac_x, cov[0::2, 0::2])


def test_integrated_wiener_covariance_with_random_initial_state():
    """Random ``x0``, ``v0`` add ``Var(x0) + Var(v0) s t`` (x-x), ``Var(v0) s`` (x(s)-v(t)), ``Var(v0)`` (v-v)."""
    sigma, (mx, sx), (mv, sv_) = 0.9, (0.2, 0.5), (-0.1, 0.3)
    iwp = IntegratedWienerProcess(DT, sigma, x0=(mx, sx), v0=Normal(mv, sv_), return_velocity=True)
    assert sorted(iwp.domain) == ["iwpv0", "iwpx0", "iwpxi"]
    ((offset, jac),) = affine_parts(iwp)
    np.testing.assert_allclose(offset.reshape(N, 2), np.stack([mx + mv * T, np.full(N, mv)], -1), rtol=RTOL)
    cov = _iwp_cov(sigma)
    s, t = np.meshgrid(T, T, indexing="ij")
    cov[:, 0, :, 0] += sx**2 + sv_**2 * s * t
    cov[:, 0, :, 1] += sv_**2 * s
    cov[:, 1, :, 0] += sv_**2 * t
    cov[:, 1, :, 1] += sv_**2
    assert_cov(jac, cov.reshape(2 * N, 2 * N))


# ------------------------------------------------------------------------------------------ pure functions
def test_discrete_gauss_markov_is_the_recursion():
    rng = np.random.default_rng(1)
    n, d, k = 7, 3, 2
    xi, x0 = rng.normal(size=(n, k)), rng.normal(size=d)
    a, lsq = rng.normal(size=(n, d, d)), rng.normal(size=(n, d, k))
    want = [x0]
    for i in range(n):
        want.append(a[i] @ want[-1] + lsq[i] @ xi[i])
    np.testing.assert_allclose(discrete_gauss_markov(xi, x0, a, lsq), np.stack(want), rtol=1e-13)
    # shared matrices broadcast over the steps; a scalar state is the 1x1 case
    got = discrete_gauss_markov(xi, x0, a[0], lsq[0])
    want = [x0]
    for i in range(n):
        want.append(a[0] @ want[-1] + lsq[0] @ xi[i])
    np.testing.assert_allclose(got, np.stack(want), rtol=1e-13)
    got = discrete_gauss_markov(xi[:, 0], 0.4, a[:, 0, 0], 1.5)
    want = [0.4]
    for i in range(n):
        want.append(a[i, 0, 0] * want[-1] + 1.5 * xi[i, 0])
    assert got.shape == (n + 1,)
    np.testing.assert_allclose(got, want, rtol=1e-13)


def test_pure_functions_match_their_closed_form_steps_and_differentiate_in_every_argument():
    rng = np.random.default_rng(2)
    xi = jnp.asarray(rng.normal(size=N - 1))
    sigma, gamma = 0.6, 1.7
    want = np.concatenate([[0.2], 0.2 + np.cumsum(sigma * np.sqrt(DT) * np.asarray(xi))])
    np.testing.assert_allclose(wiener_process(xi, 0.2, sigma, DT), want, rtol=1e-13)
    x = np.asarray(ornstein_uhlenbeck_process(xi, 0.2, sigma, gamma, DT))
    q = np.sqrt(sigma**2 / (2 * gamma) * (1 - np.exp(-2 * gamma * DT)))
    np.testing.assert_allclose(x[1:], np.exp(-gamma * DT) * x[:-1] + q * np.asarray(xi), rtol=1e-13)
    assert x[0] == 0.2
    # gradients of every argument (reverse mode through the scan) against central differences
    args = (xi, jnp.asarray(0.2), jnp.asarray(sigma), jnp.asarray(gamma), jnp.asarray(DT))
    dirs = tuple(jnp.asarray(rng.normal(size=np.shape(a))) for a in args)
    w = jnp.asarray(rng.normal(size=N))
    f = lambda *a: jnp.vdot(w, ornstein_uhlenbeck_process(*a))  # noqa: E731

    @jax.jit
    def check(args, dirs, eps=1e-6):
        grads = jax.grad(f, argnums=tuple(range(5)))(*args)
        out = []
        for i, (g, d) in enumerate(zip(grads, dirs)):
            plus = [a + eps * d if j == i else a for j, a in enumerate(args)]
            minus = [a - eps * d if j == i else a for j, a in enumerate(args)]
            out.append((jnp.vdot(g, d), (f(*plus) - f(*minus)) / (2 * eps)))
        return out

    for i, (ad, fd) in enumerate(check(args, dirs)):
        np.testing.assert_allclose(ad, fd, rtol=1e-7, err_msg=f"argument {i}")
    # integrated Wiener: A = [[1, dt], [0, 1]] and L L^T = Q = sigma^2 [[dt^3/3, dt^2/2], [dt^2/2, dt]] per step
    xi2 = rng.normal(size=(N - 1, 2))
    state = np.asarray(integrated_wiener_process(xi2, np.array([0.1, -0.2]), sigma, DT))
    np.testing.assert_array_equal(state[0], [0.1, -0.2])
    for i, dt in enumerate(DT):
        q = sigma**2 * np.array([[dt**3 / 3, dt**2 / 2], [dt**2 / 2, dt]])
        want = np.array([[1.0, dt], [0.0, 1.0]]) @ state[i] + np.linalg.cholesky(q) @ xi2[i]
        np.testing.assert_allclose(state[i + 1], want, rtol=1e-13, atol=1e-15)


def test_float32_stays_float32():
    xi32 = jnp.ones(N - 1, jnp.float32)
    assert wiener_process(xi32, 0.0, 1.0, 0.1).dtype == jnp.float32
    assert ornstein_uhlenbeck_process(xi32, 0.0, 1.0, 2.0, 0.1).dtype == jnp.float32
    sigma, gamma = 1.3, 0.7
    ou = OrnsteinUhlenbeckProcess(DT, sigma, gamma, x0=0.4, dtype=jnp.float32)
    iwp = IntegratedWienerProcess(DT, sigma, v0=0.2, dtype=jnp.float32, return_velocity=True)
    assert all(d.dtype == jnp.float32 for m in (ou, iwp) for d in jax.tree.leaves(m.domain))
    pos_ou, pos_iwp = latent(ou, 3), latent(iwp, 3)
    x_ou, x_iwp = ou(pos_ou), iwp(pos_iwp)
    assert x_ou.dtype == x_iwp.dtype == jnp.float32
    # float64 references in NumPy
    want_ou, want_iwp = [0.4], [np.array([0.0, 0.2])]
    for i, dt in enumerate(DT):
        q = np.sqrt(sigma**2 / (2 * gamma) * -np.expm1(-2 * gamma * dt))
        want_ou.append(np.exp(-gamma * dt) * want_ou[-1] + q * float(pos_ou["ouxi"][i]))
        chol = sigma * np.sqrt(dt) * np.array([[dt / np.sqrt(3), 0.0], [np.sqrt(3) / 2, 0.5]])
        want_iwp.append(np.array([[1.0, dt], [0.0, 1.0]]) @ want_iwp[-1] + chol @ pos_iwp["iwpxi"][i])
    np.testing.assert_allclose(x_ou, want_ou, rtol=1e-5, atol=1e-5)
    np.testing.assert_allclose(x_iwp, np.stack(want_iwp), rtol=1e-5, atol=1e-5)


# ------------------------------------------------------------------------------------------ inferred parameters
def test_inferred_parameters_are_differentiable():
    models = [
        WienerProcess(DT, LogNormal(1.0, 0.5), x0=(0.0, 1.0)),
        OrnsteinUhlenbeckProcess(DT, (1.0, 0.5), (0.8, 0.3)),
        IntegratedWienerProcess(DT, (1.0, 0.5), v0=(0.0, 1.0)),
    ]

    rng = np.random.default_rng(4)
    pos = [latent(m, 4) for m in models]
    dirs = [latent(m, 10) for m in models]
    cots = [rng.normal(size=m.target.shape) for m in models]

    @jax.jit  # one program for all checks
    def check(pos, dirs, cots, eps=1e-6):
        """Forward (jvp) against central differences, reverse (vjp) against forward (adjoint identity)."""
        out = []
        for m, p, d, w in zip(models, pos, dirs, cots):
            y, jd = jax.jvp(m, (p,), (d,))
            (jtw,) = jax.vjp(m, p)[1](w)
            shift = lambda c: jax.tree.map(lambda a, b: a + c * b, p, d)  # noqa: E731
            fd = (m(shift(eps)) - m(shift(-eps))) / (2 * eps)
            inner = sum(jnp.vdot(a, b) for a, b in zip(jax.tree.leaves(jtw), jax.tree.leaves(d)))
            out.append((y, jd, fd, jnp.vdot(w, jd), inner))
        return out

    for model, (y, jd, fd, wjd, jtwd) in zip(models, check(pos, dirs, cots)):
        assert np.all(np.isfinite(y)) and np.all(np.isfinite(jd))
        np.testing.assert_allclose(jd, fd, rtol=1e-6, atol=1e-8, err_msg=repr(model))
        np.testing.assert_allclose(jtwd, wjd, rtol=1e-12, err_msg=repr(model))
    # realized parameters: sigma = LogNormal(1, 0.5)(xi), the stationary OU start has no parameter
    wp, ou = models[0], models[1]
    pos = latent(wp, 5)
    hyper = wp.hyperparameters(pos)
    np.testing.assert_allclose(hyper["wpsigma"], LogNormal(1.0, 0.5)(pos["wpsigma"]), rtol=1e-15)
    assert set(ou.hyperparameters(latent(ou, 5))) == {"ousigma", "ougamma"}


def test_parameters_from_models():
    """A model parameter: a dict-domain model shares the latent, any other domain is nested under the name."""
    per_step = prior_model(LogNormal(1.0, 0.3), shape=(N - 1,), name="logsig")
    wp = WienerProcess(DT, per_step)
    assert sorted(wp.domain) == ["logsig", "wpxi"]
    pos = latent(wp, 6)
    want = wiener_process(pos["wpxi"], 0.0, LogNormal(1.0, 0.3)(pos["logsig"]), DT)
    np.testing.assert_allclose(wp(pos), want, rtol=1e-14)

    rate = sv.Model(lambda z: jnp.exp(z), jax.ShapeDtypeStruct((), jnp.float64))
    ou = OrnsteinUhlenbeckProcess(DT, 1.0, rate, x0=0.0)
    assert sorted(ou.domain) == ["ougamma", "ouxi"]
    pos = latent(ou, 7)
    want = ornstein_uhlenbeck_process(pos["ouxi"], 0.0, 1.0, np.exp(float(pos["ougamma"])), DT)
    np.testing.assert_allclose(ou(pos), want, rtol=1e-14)


def test_model_is_a_pytree_with_the_grid_as_a_leaf():
    wp = WienerProcess(0.1, (1.0, 0.5), n_points=N)
    leaves, treedef = jax.tree_util.tree_flatten(wp)
    assert len(leaves) == 1 and leaves[0].shape == (N - 1,) and np.all(leaves[0] == 0.1)
    rebuilt = jax.tree_util.tree_unflatten(treedef, [np.asarray(DT)])
    pos = latent(wp, 8)
    assert rebuilt.target == wp.target and rebuilt.n_points == N
    np.testing.assert_allclose(rebuilt(pos), WienerProcess(DT, (1.0, 0.5))(pos), rtol=1e-15)


# ------------------------------------------------------------------------------------------ optimize_kl
# The engine's compiled steps dominate this file's run time; their compile time grows with the number of
# latent leaves: the problems below keep to one or two.
def test_optimize_kl_with_inferred_scale():
    n = 12
    wp = WienerProcess(np.full(n - 1, 0.2), LogNormal(1.0, 0.5), x0=0.5)
    assert sorted(wp.domain) == ["wpsigma", "wpxi"]
    data = np.asarray(wp(latent(wp, 9))) + 0.1 * np.random.default_rng(10).normal(size=n)
    lh = sv.Gaussian(jnp.asarray(data), noise_std=0.1).amend(wp)
    start = latent(wp, 11, scale=0.1)
    samples, state = sv.optimize_kl(
        lh,
        start,
        key=jax.random.PRNGKey(12),
        n_total_iterations=2,
        n_samples=1,
        sample_mode="linear_resample",
        kl_minimization=sv.NewtonCGConfig(maxiter=5),
    )
    assert state.nit == 2 and len(samples) == 2
    assert all(np.all(np.isfinite(a)) for a in jax.tree.leaves(samples.pos))
    assert np.all(np.isfinite(np.asarray(samples.residuals["wpsigma"])))
    misfit = lambda p: float(np.mean((np.asarray(wp(p)) - data) ** 2))  # noqa: E731
    assert misfit(samples.pos) < 0.1 * misfit(start)


def test_wiener_filter_posterior_mean_is_exact():
    """Fixed parameters: a linear Gaussian problem; the KL minimum is the closed-form posterior mean."""
    sigma, noise = 0.8, 0.1
    wp = WienerProcess(DT, sigma, x0=0.3)
    idx = np.array([0, 2, 3, 7, 8, 11, 15, 16, 20, 24])
    model = sv.Model(lambda xi: wp(xi)[idx], wp.domain)
    prior_mean, prior_cov = np.full(N, 0.3), sigma**2 * np.minimum.outer(T, T)
    rng = np.random.default_rng(13)
    truth = prior_mean + np.linalg.cholesky(prior_cov + 1e-12 * np.eye(N)) @ rng.normal(size=N)
    data = truth[idx] + noise * rng.normal(size=idx.size)
    # signal-space Wiener filter: m = m0 + S R^T (R S R^T + N)^{-1} (d - R m0), D = S - S R^T (...)^{-1} R S
    srt = prior_cov[:, idx]
    gain = srt @ np.linalg.inv(prior_cov[np.ix_(idx, idx)] + noise**2 * np.eye(idx.size))
    post_mean, post_cov = prior_mean + gain @ (data - prior_mean[idx]), prior_cov - gain @ srt.T

    lh = sv.Gaussian(jnp.asarray(data), noise_std=noise).amend(model)
    samples, _ = sv.optimize_kl(
        lh,
        latent(wp, 0, scale=0.0),
        key=jax.random.PRNGKey(14),
        n_total_iterations=2,
        n_samples=1,
        sample_mode="linear_sample",
        linear_sampling=sv.CGConfig(tol=1e-13, maxiter=200),
        kl_minimization=sv.NewtonCGConfig(xtol=1e-14, maxiter=20, cg=sv.CGConfig(tol=1e-13, maxiter=200)),
    )
    np.testing.assert_allclose(np.asarray(wp(samples.pos)), post_mean, rtol=0, atol=1e-8)
    # and the latent posterior (I + J^T R^T R J / noise^2)^{-1} maps to the signal-space one
    ((_, jac),) = affine_parts(wp)
    jr = jac[idx]
    latent_cov = np.linalg.inv(np.eye(jac.shape[1]) + jr.T @ jr / noise**2)
    np.testing.assert_allclose(jac @ latent_cov @ jac.T, post_cov, rtol=0, atol=1e-11)


# ------------------------------------------------------------------------------------------ bad input
XI = np.zeros(N - 1)
BAD = [
    (lambda: wiener_process(XI, 0.0, 1.0, -0.1), ValueError, "dt must be > 0"),
    (lambda: wiener_process(XI, 0.0, 1.0, np.where(np.arange(N - 1) == 3, 0.0, DT)), ValueError, "dt must be > 0"),
    (lambda: wiener_process(XI, 0.0, 1.0, np.where(np.arange(N - 1) == 3, np.nan, DT)), ValueError, "dt must be fin"),
    (lambda: wiener_process(XI, 0.0, 1.0, np.inf), ValueError, "dt must be finite"),
    (lambda: wiener_process(XI, 0.0, 1.0, DT[:-1]), ValueError, "dt must be a scalar or have shape"),
    (lambda: wiener_process(XI, 0.0, 1.0, DT[None]), ValueError, "dt must be a scalar or have shape"),
    (lambda: wiener_process(XI, 0.0, 1.0, True), TypeError, "dt must be a real"),
    (lambda: wiener_process(XI[None], 0.0, 1.0, 0.1), ValueError, "xi must have shape"),
    (lambda: wiener_process(XI + 0j, 0.0, 1.0, 0.1), TypeError, "xi must be real"),
    (lambda: wiener_process(XI, np.zeros(2), 1.0, 0.1), ValueError, "x0 must have shape"),
    (lambda: wiener_process(XI, np.nan, 1.0, 0.1), ValueError, "x0 must be finite"),
    (lambda: wiener_process(XI, 0.0, 0.0, 0.1), ValueError, "sigma must be > 0"),
    (lambda: wiener_process(XI, 0.0, "1", 0.1), TypeError, "sigma must be a real"),
    (lambda: ornstein_uhlenbeck_process(XI, 0.0, 1.0, 0.0, DT), ValueError, "gamma must be > 0"),
    (lambda: ornstein_uhlenbeck_process(XI, 0.0, 1.0, -2.0, DT), ValueError, "gamma must be > 0"),
    (lambda: ornstein_uhlenbeck_process(XI, 0.0, 1.0, np.nan, DT), ValueError, "gamma must be finite"),
    (lambda: ornstein_uhlenbeck_process(XI, 0.0, 1.0, np.ones(3), DT), ValueError, "gamma must be a scalar or"),
    (lambda: integrated_wiener_process(np.zeros((N - 1, 3)), np.zeros(2), 1.0, DT), ValueError, "xi must have"),
    (lambda: integrated_wiener_process(np.zeros((N - 1, 2)), 0.0, 1.0, DT), ValueError, "x0 must have shape"),
    (lambda: integrated_wiener_process(np.zeros((N - 1, 2)), np.zeros(2), 1.0, -DT), ValueError, "dt must be > 0"),
    (lambda: discrete_gauss_markov(np.zeros((3, 2)), np.zeros(2), np.eye(3), np.eye(2)), ValueError, "drift must"),
    (lambda: discrete_gauss_markov(np.zeros((3, 2)), np.zeros(2), np.eye(2), np.eye(3)), ValueError, "cov_sqrt must"),
    (lambda: discrete_gauss_markov(np.zeros(3), 0.0, np.ones(2), 1.0), ValueError, "drift must have shape"),
    (lambda: discrete_gauss_markov(np.zeros(3), np.zeros((2, 2)), 1.0, 1.0), ValueError, "x0 must be a scalar or"),
    (lambda: WienerProcess(-DT, 1.0), ValueError, "dt must be > 0"),
    (lambda: WienerProcess(np.where(np.arange(N - 1) == 3, np.nan, DT), 1.0), ValueError, "dt must be finite"),
    (lambda: WienerProcess(1e-50, 1.0, n_points=4, dtype=jnp.float32), ValueError, "dt must be > 0 in float32"),
    (lambda: WienerProcess(0.1, 1.0), ValueError, "n_points is needed"),
    (lambda: WienerProcess(0.1, 1.0, n_points=1), ValueError, "n_points must be >= 2"),
    (lambda: WienerProcess(0.1, 1.0, n_points=3.0), TypeError, "n_points must be an int"),  # pyright: ignore[reportArgumentType]
    (lambda: WienerProcess(DT, 1.0, n_points=N + 1), ValueError, "dt must have shape"),
    (lambda: WienerProcess(np.zeros((2, 2)) + 1, 1.0), ValueError, "dt must be a scalar or"),
    (lambda: WienerProcess(DT, -1.0), ValueError, "sigma must be > 0"),
    (lambda: WienerProcess(DT, np.ones(3)), ValueError, "sigma must be a scalar or"),
    (lambda: WienerProcess(DT, (-1.0, 0.5)), ValueError, "sigma: mean must be > 0"),
    (lambda: WienerProcess(DT, "big"), TypeError, "sigma must be a real"),  # pyright: ignore[reportArgumentType]
    (lambda: WienerProcess(DT, 1.0, x0=np.zeros(2)), ValueError, "x0 must be a scalar"),
    (lambda: WienerProcess(DT, prior_model(Normal(0, 1), shape=(3,))), ValueError, "sigma: the model must return"),
    (lambda: WienerProcess(DT, prior_model(Normal(1, 0.1), name="wpxi")), ValueError, "'wpxi' clashes"),
    (lambda: WienerProcess(DT, 1.0, prefix=3), TypeError, "prefix must be a str"),  # pyright: ignore[reportArgumentType]
    (lambda: WienerProcess(DT, 1.0, dtype=jnp.int32), TypeError, "dtype must be float32 or float64"),
    (lambda: OrnsteinUhlenbeckProcess(DT, 1.0, 0.0), ValueError, "gamma must be > 0"),
    (lambda: OrnsteinUhlenbeckProcess(DT, 1.0, -1.0), ValueError, "gamma must be > 0"),
    (lambda: OrnsteinUhlenbeckProcess(DT, 1.0, (-1.0, 1.0)), ValueError, "gamma: mean must be > 0"),
    (lambda: OrnsteinUhlenbeckProcess(DT, 1.0, 1.0, x0="steady"), ValueError, "x0 must be 'stationary'"),
    (lambda: IntegratedWienerProcess(DT, 1.0, return_velocity=1), TypeError, "return_velocity must be a bool"),  # pyright: ignore[reportArgumentType]
    (lambda: IntegratedWienerProcess(DT, 1.0, v0=np.inf), ValueError, "v0 must be finite"),
]


@pytest.mark.parametrize("make,exc,match", BAD, ids=[f"{i}-{m}" for i, (_, _, m) in enumerate(BAD)])
def test_bad_input_names_the_argument(make, exc, match):
    with pytest.raises(exc, match=match):
        make()
