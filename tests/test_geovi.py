"""geoVI beats MGVI on a strongly nonlinear 1-D problem (exact answer by quadrature)."""
import jax
import jax.numpy as jnp
import numpy as np
import pytest

import shardvi as sv

A, SIGMA, DATA = 2.0, 1.0, 1.0   # s = exp(A xi), d ~ N(s, SIGMA^2), xi ~ N(0, 1)


def exact_moments():
    x = np.linspace(-12, 12, 600001)
    logp = -0.5 * (DATA - np.exp(A * x)) ** 2 / SIGMA**2 - 0.5 * x**2
    p = np.exp(logp - logp.max())
    p /= np.trapezoid(p, x)
    m = np.trapezoid(x * p, x)
    return m, np.sqrt(np.trapezoid((x - m) ** 2 * p, x))


@pytest.fixture(scope="module")
def results():
    model = sv.Model(lambda xi: jnp.exp(A * xi), jax.ShapeDtypeStruct((1,), jnp.float64))
    lh = sv.Gaussian(jnp.array([DATA]), noise_std=SIGMA).amend(model)
    out = {}
    for mode in ("linear_resample", "nonlinear_resample"):
        smp, state = sv.optimize_kl(
            lh, jnp.zeros(1), key=jax.random.PRNGKey(3), n_total_iterations=8, n_samples=200, sample_mode=mode,
            linear_sampling=sv.CGConfig(tol=1e-10), nonlinear_update=sv.NewtonCGConfig(xtol=1e-10, maxiter=50),
            kl_minimization=sv.NewtonCGConfig(xtol=1e-10, maxiter=50))
        m, s = smp.mean_and_std()
        out[mode] = (float(m[0]), float(s[0]), state)
    return out


def test_geovi_closer_to_exact_than_mgvi(results):
    m_ex, s_ex = exact_moments()
    m_lin, s_lin, _ = results["linear_resample"]
    m_nl, s_nl, _ = results["nonlinear_resample"]
    err_lin = abs(m_lin - m_ex) + abs(s_lin - s_ex)
    err_nl = abs(m_nl - m_ex) + abs(s_nl - s_ex)
    assert err_nl < 0.5 * err_lin, (err_nl, err_lin)
    assert abs(m_nl - m_ex) < 0.1 and abs(s_nl - s_ex) < 0.15


def test_geovi_updates_converged(results):
    state = results["nonlinear_resample"][2]
    rep = state.history[-1]
    assert rep.sample_mode == "nonlinear_resample"
    assert len(rep.nonlinear_nit) == 400 and max(rep.nonlinear_nit) < 50


def test_nonlinear_update_solves_geovi_equation():
    """After the update, g(pos + r) - g(pos) equals the metric sample (the geoVI equation)."""
    model = sv.Model(lambda xi: jnp.exp(0.8 * xi), jax.ShapeDtypeStruct((3,), jnp.float64))
    lh = sv.Gaussian(jnp.array([1.0, 2.0, 0.5]), noise_std=0.5).amend(model)
    pos = jnp.array([0.1, 0.5, -0.3])
    key = jax.random.PRNGKey(2)
    r_lin, _ = sv.draw_linear_residual(lh, pos, key, sv.CGConfig(tol=1e-12))
    r, res = sv.nonlinearly_update_residual(lh, pos, r_lin, key, 1.0, sv.NewtonCGConfig(xtol=1e-13, maxiter=50))
    y = sv.vi.metric_sample(lh, pos, key)
    x_bar, vjp = jax.vjp(lh.transformation, pos)
    g = r + vjp(lh.transformation(pos + r) - x_bar)[0]
    np.testing.assert_allclose(np.asarray(g), np.asarray(y), rtol=0, atol=1e-9)
    assert not np.allclose(np.asarray(r), np.asarray(r_lin), atol=1e-3)  # it really curved
