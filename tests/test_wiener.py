"""Wiener-filter oracle: linear Gaussian model, closed-form posterior."""

import types

import jax
import jax.numpy as jnp
import numpy as np
import pytest

import shardvi as sv
from shardvi import tree_math

N_LAT, N_DATA, NOISE = 12, 9, 0.3


@pytest.fixture(scope="module")
def problem():
    rng = np.random.default_rng(7)
    R = rng.normal(size=(N_DATA, N_LAT))
    L = np.tril(rng.normal(size=(N_LAT, N_LAT))) * 0.4 + np.eye(N_LAT)  # prior S = L L^T
    xi_true = rng.normal(size=N_LAT)
    d = R @ L @ xi_true + NOISE * rng.normal(size=N_DATA)
    model = sv.Model(lambda xi: jnp.asarray(R) @ (jnp.asarray(L) @ xi), jax.ShapeDtypeStruct((N_LAT,), jnp.float64))
    lh = sv.Gaussian(d, noise_std=NOISE).amend(model)
    M = L.T @ R.T @ R @ L / NOISE**2
    post_cov = np.linalg.inv(np.eye(N_LAT) + M)
    post_mean = post_cov @ (L.T @ R.T @ d / NOISE**2)
    return lh, post_mean, post_cov


TIGHT_KL = sv.NewtonCGConfig(xtol=1e-14, maxiter=20, cg=sv.CGConfig(tol=1e-13, maxiter=200))


@pytest.mark.parametrize("mode", ["linear_sample", "linear_resample", "nonlinear_sample", "nonlinear_resample"])
@pytest.mark.slow
def test_kl_minimum_is_posterior_mean(problem, mode):
    lh, post_mean, _ = problem
    samples, state = sv.optimize_kl(
        lh,
        jnp.zeros(N_LAT),
        key=jax.random.PRNGKey(1),
        n_total_iterations=2,
        n_samples=3,
        sample_mode=mode,
        linear_sampling=sv.CGConfig(tol=1e-13, maxiter=200),
        nonlinear_update=sv.NewtonCGConfig(xtol=1e-14),
        kl_minimization=TIGHT_KL,
    )
    assert np.max(np.abs(np.asarray(samples.pos) - post_mean)) <= 1e-8
    assert len(samples) == 6 and state.nit == 2
    # antithetic pairs: residuals come as +r, -r (geoVI curves each one separately: equal to round-off)
    r = np.asarray(samples.residuals)
    if mode.startswith("linear"):
        np.testing.assert_array_equal(r[0::2], -r[1::2])
    else:
        np.testing.assert_allclose(r[0::2], -r[1::2], rtol=0, atol=1e-10)


def test_map_is_posterior_mean(problem):
    lh, post_mean, _ = problem
    samples, _ = sv.optimize_kl(
        lh,
        jnp.zeros(N_LAT),
        key=jax.random.PRNGKey(0),
        n_total_iterations=1,
        n_samples=0,
        sample_mode="linear_resample",
        kl_minimization=TIGHT_KL,
    )
    assert len(samples) == 0
    assert np.max(np.abs(np.asarray(samples.pos) - post_mean)) <= 1e-8


@pytest.mark.slow
def test_geovi_of_linear_model_equals_mgvi(problem):
    """For a linear model the geoVI update leaves the linear residual unchanged."""
    lh, post_mean, _ = problem
    pos = jnp.asarray(post_mean)
    key = jax.random.PRNGKey(5)
    r_lin, info = sv.draw_linear_residual(lh, pos, key, sv.CGConfig(tol=1e-13))
    assert bool(info.converged)
    for sign in (1.0, -1.0):
        r_nl, res = sv.nonlinearly_update_residual(lh, pos, sign * r_lin, key, sign, sv.NewtonCGConfig(xtol=1e-14))
        np.testing.assert_allclose(np.asarray(r_nl), sign * np.asarray(r_lin), rtol=0, atol=1e-10)


@pytest.mark.slow
def test_linear_sample_covariance(problem):
    """Empirical covariance of 4000 MGVI residuals matches (I + M)^{-1}."""
    lh, post_mean, post_cov = problem
    n = 4000
    keys = jax.random.split(jax.random.PRNGKey(11), n)
    draw = jax.jit(
        jax.vmap(lambda k: sv.draw_linear_residual(lh, jnp.asarray(post_mean), k, sv.CGConfig(tol=1e-12))[0])
    )
    r = np.asarray(draw(keys))
    emp = r.T @ r / n  # the residual mean is exactly zero
    # standard error of each entry of a Wishart estimate: sqrt((C_ii C_jj + C_ij^2) / n)
    se = np.sqrt((np.outer(np.diag(post_cov), np.diag(post_cov)) + post_cov**2) / n)
    z = np.abs(emp - post_cov) / se
    assert z.max() < 5.0, f"max z-score {z.max():.2f}"
    # and the mean z is what a correct sampler gives (E|Z| = 0.8 for a standard normal)
    assert 0.5 < z.mean() < 1.1
    # whitened check: C^{-1/2} emp C^{-1/2} ~ I
    w = np.linalg.cholesky(np.linalg.inv(post_cov))
    white = w.T @ emp @ w
    assert np.max(np.abs(white - np.eye(N_LAT))) < 6 * np.sqrt(2.0 / n)


def test_linear_sample_traces_the_model_once():
    """An MGVI draw holds one copy of the model's forward pass and one operator call site in its CG.

    The metric sample ``J^T L e1`` and the CG's metric share the model's
    linearization at ``pos`` (``Likelihood.sampling_operators``), and the CG's
    start at ``e2`` applies the metric in the loop's first pass, so the program
    is one forward pass, one transpose for the sample and one ``J``/``J^T`` pair
    in the loop (a 2-D correlated field: 4 FFTs where 7 were).
    """
    calls = []
    inner = sv.Model(lambda xi: jnp.exp(0.3 * xi), jax.ShapeDtypeStruct((N_LAT,), jnp.float64))
    model = sv.Model(lambda xi: (calls.append(1), inner(xi))[1], inner.domain)
    lh = sv.Gaussian(jnp.ones(N_LAT), noise_std=NOISE).amend(model)
    calls.clear()
    jax.make_jaxpr(lambda p, k: sv.draw_linear_residual(lh, p, k, sv.CGConfig(tol=1e-8))[0])(
        jnp.zeros(N_LAT), jax.random.PRNGKey(0)
    )
    assert len(calls) == 1


@pytest.mark.slow
def test_linear_sample_cg_starts_at_prior_part():
    """The sampling CG starts at ``e2``: directions the data do not see keep the exact prior draw.

    The model reads only the first half of the latent vector, so ``M = I`` on the
    second half and the exact residual there is ``e2``. Started at ``e2`` every CG
    iterate has it exactly, even after one iteration; started at 0 a single CG step
    would give ``alpha * e2`` (a shrunken, i.e. too narrow, sample).
    """
    half = N_LAT // 2
    rng = np.random.default_rng(3)
    R = jnp.asarray(rng.normal(size=(N_DATA, half)))
    model = sv.Model(lambda xi: R @ xi[:half], jax.ShapeDtypeStruct((N_LAT,), jnp.float64))
    lh = sv.Gaussian(jnp.asarray(rng.normal(size=N_DATA)), noise_std=NOISE).amend(model)
    pos = jnp.zeros(N_LAT)
    keys = jax.random.split(jax.random.PRNGKey(11), 2000)
    one_step = sv.CGConfig(tol=None, miniter=1, maxiter=1)
    draw = jax.jit(jax.vmap(lambda k: sv.draw_linear_residual(lh, pos, k, one_step)[0]))
    r = np.asarray(draw(keys))
    dom = jax.ShapeDtypeStruct((N_LAT,), jnp.float64)
    e2 = np.asarray(jax.vmap(lambda k: tree_math.random_like(jax.random.split(k)[1], dom))(keys))
    np.testing.assert_array_equal(r[:, half:], e2[:, half:])
    # and so the unseen half has the prior's unit variance (4 sigma for 2000 samples x 6 entries)
    var = np.var(r[:, half:], axis=0)
    assert np.all(np.abs(var - 1.0) <= 4 * np.sqrt(2.0 / 2000))


@pytest.mark.slow
def test_compiler_options_reach_the_engine_steps(problem, monkeypatch):
    """``compiler_options`` are merged over the defaults for every compiled step; the posterior stays exact."""
    import importlib

    from shardvi.parallel import reproducible

    okl = importlib.import_module("shardvi.vi.engine")  # the engine module (it compiles the steps)
    seen = []

    def recording_jit(fn, **kw):
        seen.append(dict(kw.get("compiler_options") or {}))
        return sv.parallel.reproducible_jit(fn, **kw)

    monkeypatch.setattr(okl, "reproducible_jit", recording_jit)
    lh, post_mean, _ = problem
    kw = dict(
        key=jax.random.PRNGKey(3),
        n_total_iterations=1,
        n_samples=2,
        sample_mode="nonlinear_resample",
        linear_sampling=sv.CGConfig(tol=1e-13, maxiter=200),
        nonlinear_update=sv.NewtonCGConfig(xtol=1e-14),
        kl_minimization=TIGHT_KL,
    )
    # XLA:CPU's fusion emitters where this XLA still has its classic ones (jax 0.10.2), else (jax 0.12: the
    # option is gone, and naming it is an error) another option that changes the arithmetic: LLVM level 3
    emitters = reproducible.option_supported("xla_cpu_use_fusion_emitters", True, "cpu")
    option = {"xla_cpu_use_fusion_emitters": True} if emitters else {"xla_backend_optimization_level": 3}
    if not emitters:
        with pytest.raises(ValueError, match="compiler_options rejected by XLA"):
            sv.optimize_kl(lh, jnp.zeros(N_LAT), compiler_options={"xla_cpu_use_fusion_emitters": True}, **kw)
        seen.clear()
    fused, _ = sv.optimize_kl(lh, jnp.zeros(N_LAT), compiler_options=option, **kw)
    assert seen == [option] * 3  # draw_linear, curve, minimize
    assert dict(sv.parallel.REPRODUCIBLE_COMPILER_OPTIONS)["xla_cpu_use_fusion_emitters"] is False
    assert ("xla_cpu_use_fusion_emitters" in reproducible.engine_compiler_options(platform="cpu")) == emitters
    with pytest.raises(TypeError):  # the defaults are read-only
        sv.parallel.REPRODUCIBLE_COMPILER_OPTIONS["xla_cpu_use_fusion_emitters"] = True
    classic, _ = sv.optimize_kl(lh, jnp.zeros(N_LAT), **kw)
    assert np.max(np.abs(np.asarray(fused.pos) - post_mean)) <= 1e-8
    # other emitters, other rounding: the same samples to solver precision
    np.testing.assert_allclose(np.asarray(fused.residuals), np.asarray(classic.residuals), rtol=0, atol=1e-9)


def test_default_options_unknown_to_this_xla_are_left_out(problem, monkeypatch):
    """A default engine option the running XLA does not know (jax 0.11's XLA lacks
    ``xla_cpu_use_fusion_emitters``) is dropped, not passed on to fail every compile; one the user
    names is still rejected with a clear error."""
    from shardvi.parallel import reproducible

    bogus = "xla_shardvi_test_no_such_option"
    monkeypatch.setattr(
        reproducible,
        "REPRODUCIBLE_COMPILER_OPTIONS",
        types.MappingProxyType({**reproducible.REPRODUCIBLE_COMPILER_OPTIONS, bogus: True}),
    )
    assert not reproducible.option_supported(bogus, True, "cpu")
    assert reproducible.option_supported("xla_disable_hlo_passes", "cse", "cpu")
    opts = reproducible.engine_compiler_options(platform="cpu")
    assert bogus not in opts and "cse" in opts["xla_disable_hlo_passes"].split(",")
    lh, post_mean, _ = problem
    samples, _ = sv.optimize_kl(
        lh,
        jnp.zeros(N_LAT),
        key=jax.random.PRNGKey(3),
        n_total_iterations=1,
        n_samples=1,
        sample_mode="linear_resample",
        linear_sampling=sv.CGConfig(tol=1e-13, maxiter=200),
        kl_minimization=TIGHT_KL,
    )
    assert np.max(np.abs(np.asarray(samples.pos) - post_mean)) <= 1e-8
    with pytest.raises(ValueError, match="compiler_options rejected by XLA"):
        sv.optimize_kl(
            lh,
            jnp.zeros(N_LAT),
            key=jax.random.PRNGKey(3),
            n_total_iterations=1,
            n_samples=1,
            compiler_options={bogus: True},
        )
