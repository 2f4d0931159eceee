"""wiener_filter_posterior: the exact posterior of a linear-Gaussian problem in signal and data space."""

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from _model_parallel_problem import linear_blocked_problem

import shardvi as sv
from shardvi import tree_math as tm
from shardvi.parallel import JitSharding, ShardMap
from shardvi.vi.sampling import metric_sample

N_LAT, N_DATA, NOISE, OFFSET = 14, 9, 0.3, 0.7


@pytest.fixture(scope="module")
def problem():
    """An affine model ``s = R L xi + offset`` with dict-structured latent, its posterior in closed form."""
    rng = np.random.default_rng(11)
    R = rng.normal(size=(N_DATA, N_LAT))
    L = np.tril(rng.normal(size=(N_LAT, N_LAT))) * 0.3 + np.eye(N_LAT)
    d = R @ L @ rng.normal(size=N_LAT) + NOISE * rng.normal(size=N_DATA) + OFFSET
    Rj, Lj = jnp.asarray(R), jnp.asarray(L)
    domain = {"a": jax.ShapeDtypeStruct((5,), jnp.float64), "b": jax.ShapeDtypeStruct((N_LAT - 5,), jnp.float64)}
    model = sv.Model(lambda xi: Rj @ (Lj @ jnp.concatenate([xi["a"], xi["b"]])) + OFFSET, domain)
    lh = sv.Gaussian(d, noise_std=NOISE).amend(model)
    A = R @ L / NOISE  # whitened response
    D = np.linalg.inv(np.eye(N_LAT) + A.T @ A)
    m = D @ A.T @ ((d - OFFSET) / NOISE)
    return lh, A, D, m


def flat(x):
    return np.concatenate([np.asarray(x["a"]), np.asarray(x["b"])], axis=-1)


@pytest.mark.parametrize("space", ["signal", "data"])
def test_mean_and_samples_are_exact(problem, space):
    lh, A, D, m = problem
    key = jax.random.PRNGKey(3)
    samples, info = sv.wiener_filter_posterior(lh, key=key, n_samples=3, space=space)
    assert info.converged and info.space == space and info.nonlinearity < 1e-14
    np.testing.assert_allclose(flat(samples.pos), m, rtol=0, atol=1e-10)
    r = flat(samples.residuals)
    assert r.shape == (6, N_LAT)
    np.testing.assert_array_equal(r[0::2], -r[1::2])
    # each pair is r = D (A^T e1 + e2) ~ N(0, D) with e1, e2 the white draws of its key (as MGVI's samples)
    for i, k in enumerate(jax.random.split(key, 3)):
        k1, k2 = jax.random.split(k)
        e2 = flat(tm.random_like(k2, lh.domain))
        e1 = np.asarray(tm.random_like(k1, lh.lsm_tangents_shape))
        np.testing.assert_allclose(r[2 * i], D @ (A.T @ e1 + e2), rtol=0, atol=1e-9)


def test_signal_and_data_space_agree(problem):
    lh = problem[0]
    key = jax.random.PRNGKey(8)
    s_sig, _ = sv.wiener_filter_posterior(lh, key=key, n_samples=2, space="signal", mirror_samples=False)
    s_dat, _ = sv.wiener_filter_posterior(lh, key=key, n_samples=2, space="data", mirror_samples=False)
    assert len(s_sig) == 2
    np.testing.assert_allclose(flat(s_sig.residuals), flat(s_dat.residuals), rtol=0, atol=1e-9)
    np.testing.assert_allclose(flat(s_sig.pos), flat(s_dat.pos), rtol=0, atol=1e-10)


def test_posterior_covariance_from_many_samples(problem):
    """The sample covariance of 2000 exact draws matches D (Monte-Carlo error ~ 1/sqrt(2000) of the scale)."""
    lh, _, D, _ = problem
    samples, _ = sv.wiener_filter_posterior(lh, key=jax.random.PRNGKey(0), n_samples=1000, space="data")
    r = flat(samples.residuals)
    cov = r.T @ r / r.shape[0]
    scale = np.sqrt(np.outer(np.diag(D), np.diag(D)))
    assert np.max(np.abs(cov - D) / scale) < 0.12


def test_map_only_and_position(problem):
    lh, _, _, m = problem
    pos = jax.tree_util.tree_map(lambda d: jnp.full(d.shape, 2.0, d.dtype), lh.domain)
    samples, info = sv.wiener_filter_posterior(lh, pos, key=jax.random.PRNGKey(0), n_samples=0)
    assert len(samples) == 0 and info.sample_status == ()
    np.testing.assert_allclose(flat(samples.pos), m, rtol=0, atol=1e-10)


@pytest.mark.product_compiler
@pytest.mark.parametrize("space, strategy", [("signal", "shard_map"), ("data", "pmap")])
def test_bitwise_across_devices(problem, space, strategy):
    lh = problem[0]
    key = jax.random.PRNGKey(5)
    one, _ = sv.wiener_filter_posterior(lh, key=key, n_samples=4, space=space)
    many, _ = sv.wiener_filter_posterior(lh, key=key, n_samples=4, space=space, sample_map=strategy)
    np.testing.assert_array_equal(flat(many.residuals), flat(one.residuals))
    np.testing.assert_array_equal(flat(many.pos), flat(one.pos))


def test_bad_inputs(problem):
    lh = problem[0]
    key = jax.random.PRNGKey(0)
    dom = jax.ShapeDtypeStruct((4,), jnp.float64)
    nonlinear = sv.Gaussian(np.ones(4), noise_std=1.0).amend(sv.Model(lambda x: jnp.exp(x), dom))
    with pytest.raises(ValueError, match="affine in the latent"):
        sv.wiener_filter_posterior(nonlinear, key=key, n_samples=1)
    poisson = sv.Poisson(np.ones(4, np.int64)).amend(sv.Model(lambda x: jnp.exp(x), dom))
    with pytest.raises(TypeError, match="linear-Gaussian"):
        sv.wiener_filter_posterior(poisson, key=key, n_samples=1)
    with pytest.raises(ValueError, match="space"):
        sv.wiener_filter_posterior(lh, key=key, n_samples=1, space="harmonic")
    with pytest.raises(ValueError, match="n_samples"):
        sv.wiener_filter_posterior(lh, key=key, n_samples=-1)
    with pytest.raises(TypeError, match="n_samples"):
        sv.wiener_filter_posterior(lh, key=key, n_samples=1.5)
    with pytest.raises(TypeError, match="cg"):
        sv.wiener_filter_posterior(lh, key=key, n_samples=1, cg=sv.NewtonCGConfig())
    with pytest.raises(ValueError, match="position"):
        sv.wiener_filter_posterior(lh, {"a": jnp.zeros(5), "b": jnp.zeros(3)}, key=key, n_samples=1)


@pytest.fixture(scope="module")
def blocked_problem():
    return linear_blocked_problem()


def test_blocked_data_mean_and_samples_are_exact(blocked_problem):
    """Data blocks (the model-parallel data axis): the exact mean, and each residual ``D y`` with ``y`` the metric
    sample of its key (its data-space noise drawn per block, as optimize_kl's)."""
    lh, D, m = blocked_problem
    key = jax.random.PRNGKey(1)
    samples, info = sv.wiener_filter_posterior(lh, key=key, n_samples=3)
    assert info.converged and info.nonlinearity < 1e-14
    np.testing.assert_allclose(np.asarray(samples.pos["x"]), m, rtol=0, atol=1e-12)
    r = np.asarray(samples.residuals["x"])
    np.testing.assert_array_equal(r[0::2], -r[1::2])
    for i, k in enumerate(jax.random.split(key, 3)):
        y = np.asarray(metric_sample(lh, samples.pos, k)["x"])
        np.testing.assert_allclose(r[2 * i], D @ y, rtol=0, atol=1e-10)


@pytest.mark.product_compiler
def test_blocked_data_bitwise_on_every_model_axis(blocked_problem):
    """Mean and samples with the blocks split over 2 or 4 model shards (shard_map, jit) are bitwise the
    one-device run's."""
    lh = blocked_problem[0]
    key = jax.random.PRNGKey(5)
    one, _ = sv.wiener_filter_posterior(lh, key=key, n_samples=3)
    devs = jax.devices()[:4]
    for strat in (ShardMap(devices=devs, model_shards=2), JitSharding(devices=devs, model_shards=4)):
        many, _ = sv.wiener_filter_posterior(lh, key=key, n_samples=3, sample_map=strat)
        np.testing.assert_array_equal(np.asarray(many.pos["x"]), np.asarray(one.pos["x"]))
        np.testing.assert_array_equal(np.asarray(many.residuals["x"]), np.asarray(one.residuals["x"]))


def test_blocked_data_bad_inputs(blocked_problem):
    lh = blocked_problem[0]
    key = jax.random.PRNGKey(0)
    with pytest.raises(ValueError, match="space='data' needs the whitened response on the whole data"):
        sv.wiener_filter_posterior(lh, key=key, n_samples=1, space="data")
    with pytest.raises(ValueError, match="model_shards=3 does not divide data_blocks=4"):
        sv.wiener_filter_posterior(
            lh, key=key, n_samples=1, sample_map=ShardMap(devices=jax.devices()[:3], model_shards=3)
        )
    rows = lh.blocks["inputs"]["row"]
    model = sv.Model(lambda xi, inp: jnp.exp(inp["row"] @ xi["x"]), lh.domain, data_inputs={"row": rows})
    counts = np.ones(rows.shape[0])
    with pytest.raises(TypeError, match="linear-Gaussian problem.*got BlockedLikelihood of Poisson"):
        sv.wiener_filter_posterior(sv.Poisson(counts).amend(model, data_blocks=2), key=key, n_samples=1)
    nonlinear = sv.Gaussian(counts, noise_std=1.0).amend(model, data_blocks=2)
    with pytest.raises(ValueError, match="affine in the latent"):
        sv.wiener_filter_posterior(nonlinear, key=key, n_samples=1)


def test_field_split_likelihood_is_refused_clearly():
    model = sv.Model(lambda xi: 2.0 * xi["f"], {"f": jax.ShapeDtypeStruct((4, 4), jnp.float64)})
    lh = sv.Gaussian(np.ones((4, 4)), noise_std=1.0).amend(model, field_blocks=2)
    with pytest.raises(NotImplementedError, match="amended with field_blocks"):
        sv.wiener_filter_posterior(lh, key=jax.random.PRNGKey(0), n_samples=1)
