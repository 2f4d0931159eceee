"""Priors: standard-normal latent -> distribution; moments, quantiles, tails, gradients vs scipy.stats."""

import math

import jax
import jax.numpy as jnp
import numpy as np
import pytest
import scipy.special as ss
import scipy.stats as st

import shardvi as sv
from shardvi.models import InvGamma, Laplace, LogNormal, Normal, Uniform, gamma_quantile_from_normal, prior_model

N_SAMPLES = 100_000
Z = 5.0  # tolerance in standard errors (deterministic keys: no flakiness, generous margin)

CASES = [
    (Normal(1.5, 0.7), st.norm(1.5, 0.7)),
    (LogNormal(2.0, 0.5), st.lognorm(s=math.sqrt(math.log1p(0.25**2)), scale=2.0 / math.sqrt(1 + 0.25**2))),
    (Uniform(-1.0, 3.0), st.uniform(-1.0, 4.0)),
    (InvGamma(6.0, 2.0), st.invgamma(6.0, scale=2.0)),
    (Laplace(0.5, 1.3), st.laplace(0.5, 1.3)),
]
IDS = [type(p).__name__ for p, _ in CASES]
PROBS = np.array([0.01, 0.1, 0.25, 0.5, 0.75, 0.9, 0.99])


@pytest.fixture(scope="module")
def white():
    return jax.random.normal(jax.random.PRNGKey(7), (N_SAMPLES,), jnp.float64)


@pytest.mark.parametrize("prior,ref", CASES, ids=IDS)
@pytest.mark.slow
def test_moments_and_quantiles_match_scipy(prior, ref, white):
    x = np.asarray(jax.jit(prior.__call__)(white))
    assert np.all(np.isfinite(x))
    mean, var, _, kurt = (float(v) for v in ref.stats(moments="mvsk"))
    std = math.sqrt(var)
    # standard errors: mean sigma/sqrt(n); sample std sigma*sqrt((kappa - 1)/(4n)), kappa = kurt + 3
    assert abs(x.mean() - mean) < Z * std / math.sqrt(N_SAMPLES)
    assert abs(x.std() - std) < Z * std * math.sqrt((kurt + 2) / (4 * N_SAMPLES))
    q = np.quantile(x, PROBS)
    se = np.sqrt(PROBS * (1 - PROBS) / N_SAMPLES) / ref.pdf(ref.ppf(PROBS))
    np.testing.assert_array_less(np.abs(q - ref.ppf(PROBS)), Z * se)


@pytest.mark.parametrize("prior,ref", CASES, ids=IDS)
@pytest.mark.slow
def test_map_is_the_exact_quantile_function(prior, ref):
    """prior(xi) == ppf(Phi(xi)) to near machine precision, tails included."""
    xi = np.linspace(-8, 8, 161)
    got = np.asarray(prior(jnp.asarray(xi)))
    lower = xi <= 0
    want = np.where(lower, ref.ppf(ss.ndtr(np.where(lower, xi, 0.0))), ref.isf(ss.ndtr(-np.where(lower, 0.0, xi))))
    np.testing.assert_allclose(got, want, rtol=1e-9, atol=1e-12)


@pytest.mark.parametrize("a", [0.05, 0.3, 1.0, 2.5, 40.0, 1e4])
@pytest.mark.slow
def test_gamma_quantile_accuracy_over_shapes(a):
    """Newton inversion of the regularized incomplete gamma vs scipy's gammaincinv/gammainccinv."""
    xi = np.linspace(-8, 8, 97)
    want = np.where(xi <= 0, ss.gammaincinv(a, ss.ndtr(xi)), ss.gammainccinv(a, ss.ndtr(-xi)))
    got = np.asarray(gamma_quantile_from_normal(a, jnp.asarray(xi)))
    np.testing.assert_allclose(got, want, rtol=1e-11)
    logg = np.asarray(gamma_quantile_from_normal(a, jnp.asarray(xi), log=True))
    np.testing.assert_allclose(logg, np.log(want), rtol=1e-11, atol=1e-12)
    ig = np.asarray(InvGamma(a, 3.0)(jnp.asarray(xi)))
    ref = st.invgamma(a, scale=3.0)
    want_ig = np.where(xi <= 0, ref.ppf(ss.ndtr(np.minimum(xi, 0))), ref.isf(ss.ndtr(-np.maximum(xi, 0))))
    np.testing.assert_allclose(ig, want_ig, rtol=1e-9)


@pytest.mark.parametrize(
    "prior",
    [p for p, _ in CASES] + [InvGamma(0.1, 1.0), InvGamma(300.0, 1.0)],
    ids=IDS + ["InvGamma-small-a", "InvGamma-large-a"],
)
@pytest.mark.slow
def test_tails_and_gradients_finite(prior):
    tails = jnp.linspace(-8.0, 8.0, 321)
    x = jnp.linspace(-5.0, 5.0, 23) + 0.0123  # finite differences away from the extreme tails
    h = 1e-6
    values_and_grads = jax.jit(lambda z: (prior(z), jax.vmap(jax.grad(prior.__call__))(z)))
    v, g = (np.asarray(a) for a in values_and_grads(jnp.concatenate([tails, x - h, x + h, x])))
    n = tails.size
    assert np.all(np.isfinite(v)) and np.all(np.isfinite(g))
    assert np.all(g[:n] > 0), "every map is increasing in xi"
    assert np.all(np.diff(v[:n]) >= 0)
    fd = (v[n + 23 : n + 46] - v[n : n + 23]) / (2 * h)
    np.testing.assert_allclose(g[n + 46 :], fd, rtol=1e-6, atol=1e-9)


def test_laplace_gradient_at_zero():
    p = Laplace(0.0, 2.0)
    # d/dxi [F^{-1}(Phi(xi))] = phi(xi) / f(x); at 0: phi(0) / (1 / (2 * scale))
    np.testing.assert_allclose(jax.grad(p.__call__)(0.0), 2 * 2.0 * st.norm.pdf(0.0), rtol=1e-12)


@pytest.mark.parametrize("prior", [p for p, _ in CASES], ids=IDS)
@pytest.mark.slow
def test_float32_and_jit_vmap(prior):
    xi32 = jnp.linspace(-4, 4, 33, dtype=jnp.float32)
    v32 = jax.jit(jax.vmap(prior.__call__))(xi32)
    assert v32.dtype == jnp.float32 and np.all(np.isfinite(v32))
    np.testing.assert_allclose(v32, prior(xi32.astype(jnp.float64)), rtol=2e-5, atol=1e-6)
    assert prior(2).dtype == jnp.result_type(float)  # integer input is promoted


def test_domain_helper_and_prior_model():
    p = LogNormal(1.0, 0.3)
    assert p.domain((3, 2)) == jax.ShapeDtypeStruct((3, 2), jnp.float64)
    assert p.domain(dtype=jnp.float32) == jax.ShapeDtypeStruct((), jnp.float32)
    with pytest.raises(TypeError, match="dtype"):
        p.domain((2,), jnp.int32)
    m = prior_model(p, (4,), name="amp")
    assert isinstance(m, sv.Model) and set(m.domain) == {"amp"} and m.target.shape == (4,)
    xi = m.init(jax.random.PRNGKey(0))
    np.testing.assert_allclose(m(xi), p(xi["amp"]))
    with pytest.raises(TypeError, match="prior"):
        prior_model((1.0, 0.3))


@pytest.mark.parametrize(
    "make,param",
    [
        (lambda: Normal(0.0, 0.0), "std"),
        (lambda: Normal(float("nan"), 1.0), "mean"),
        (lambda: LogNormal(-1.0, 1.0), "mean"),
        (lambda: LogNormal(1.0, -0.1), "std"),
        (lambda: Uniform(1.0, 1.0), "high"),
        (lambda: Uniform(float("inf"), 2.0), "low"),
        (lambda: InvGamma(0.0, 1.0), "a"),
        (lambda: InvGamma(1.0, -2.0), "scale"),
        (lambda: Laplace(0.0, 0.0), "scale"),
        (lambda: gamma_quantile_from_normal(-1.0, 0.0), "a"),
    ],
)
def test_bad_parameters_name_the_parameter(make, param):
    with pytest.raises(ValueError, match=rf"\b{param}\b"):
        make()


def test_bad_parameter_types():
    with pytest.raises(TypeError, match="mean"):
        Normal("a", 1.0)
    with pytest.raises(TypeError, match="std"):
        LogNormal(1.0, True)
    p = Normal(0.0, 1.0)
    with pytest.raises(Exception):  # noqa: B017 -- frozen: FrozenInstanceError or AttributeError
        p.mean = 2.0  # frozen
