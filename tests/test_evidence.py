"""estimate_evidence_lower_bound against the exact log-evidence of Wiener-filter problems."""

import jax
import jax.numpy as jnp
import numpy as np
import pytest
import scipy.stats

import shardvi as sv

N_LAT, N_DATA, NOISE, OFFSET = 30, 20, 0.4, 0.5


def linear_problem(prior_scale=1.0, seed=2, data_scale=1.0, data_blocks=None):
    """``d = R (scale * xi) + offset + n``: lh, the exact log-evidence ``log p(d)``, metric.

    ``data_blocks``: the rows of ``R`` as the model's ``data_inputs``, the data amended in that many blocks."""
    rng = np.random.default_rng(seed)
    R = rng.normal(size=(N_DATA, N_LAT)) / np.sqrt(N_LAT)
    d = R @ (data_scale * rng.normal(size=N_LAT)) + OFFSET + NOISE * rng.normal(size=N_DATA)
    domain = jax.ShapeDtypeStruct((N_LAT,), jnp.float64)
    if data_blocks is None:
        Rj = jnp.asarray(R)
        lh = sv.Gaussian(d, noise_std=NOISE).amend(sv.Model(lambda xi: prior_scale * (Rj @ xi) + OFFSET, domain))
    else:
        call = lambda xi, inp: prior_scale * (inp["row"] @ xi) + OFFSET  # noqa: E731
        model = sv.Model(call, domain, data_inputs={"row": R})
        lh = sv.Gaussian(d, noise_std=NOISE).amend(model, data_blocks=data_blocks)
    cov = prior_scale**2 * R @ R.T + NOISE**2 * np.eye(N_DATA)
    log_z = scipy.stats.multivariate_normal(mean=np.full(N_DATA, OFFSET), cov=cov).logpdf(d)
    metric = np.eye(N_LAT) + prior_scale**2 * R.T @ R / NOISE**2
    return lh, log_z, metric


@pytest.fixture(scope="module")
def exact():
    lh, log_z, metric = linear_problem()
    samples, _ = sv.wiener_filter_posterior(lh, key=jax.random.PRNGKey(1), n_samples=40)
    return lh, log_z, metric, samples


def test_dense_is_exact_log_evidence(exact):
    lh, log_z, metric, samples = exact
    elbo = sv.estimate_evidence_lower_bound(lh, samples)
    assert elbo.method == "dense" and elbo.n_latent == N_LAT and elbo.n_relevant == N_DATA
    np.testing.assert_allclose(elbo.log_det_metric, np.linalg.slogdet(metric)[1], rtol=1e-12)
    np.testing.assert_allclose(elbo.eigenvalues, np.flip(np.linalg.eigvalsh(metric)), rtol=1e-10)
    # per sample: -H(xi_i) - c + n/2 - log det M / 2, c = log det(2 pi N) / 2
    c = 0.5 * N_DATA * np.log(2 * np.pi * NOISE**2)
    assert elbo.normalization == pytest.approx(c, rel=1e-14)
    h = np.array([float(sv.vi.hamiltonian(lh, x)) for x in samples])
    np.testing.assert_allclose(elbo.per_sample, -h - c + N_LAT / 2 - elbo.log_det_metric / 2, rtol=1e-12)
    # exact posterior samples: the bound is the evidence, up to the Monte-Carlo error of E_q[H]
    assert abs(elbo.value - log_z) < 4 * elbo.std
    # antithetic pairs around the exact mean: H(m +- r) = H(m) + r.M.r / 2, r.M.r ~ chi^2_n; the standard error
    # of the mean over 40 pairs is sqrt(2 n) / 2 / sqrt(40)
    assert 0.6 < elbo.std / (np.sqrt(2 * N_LAT) / 2 / np.sqrt(40)) < 1.6
    assert elbo.lower == elbo.value - elbo.std and elbo.upper == elbo.value + elbo.std


def test_blocked_data_exact_log_evidence():
    """The same problem with its data in 4 blocks (the model-parallel data axis), split over 2 model shards:
    the exact log det of the metric, and the bound is the evidence within its Monte-Carlo error."""
    lh, log_z, metric = linear_problem(data_blocks=4)
    strat = sv.parallel.ShardMap(devices=jax.devices()[:4], model_shards=2)
    samples, _ = sv.wiener_filter_posterior(lh, key=jax.random.PRNGKey(1), n_samples=40, sample_map=strat)
    elbo = sv.estimate_evidence_lower_bound(lh, samples, sample_map=strat)
    np.testing.assert_allclose(elbo.log_det_metric, np.linalg.slogdet(metric)[1], rtol=1e-12)
    assert abs(elbo.value - log_z) < 4 * elbo.std


def test_a_worse_mean_lowers_the_bound_by_the_kl(exact):
    """Shifting the variational mean by delta lowers the bound by delta.M.delta/2 (mirrored residuals)."""
    lh, _, metric, samples = exact
    delta = 0.3 * np.sin(np.arange(N_LAT))
    shifted = samples.at(samples.pos + delta)
    e0 = sv.estimate_evidence_lower_bound(lh, samples)
    e1 = sv.estimate_evidence_lower_bound(lh, shifted)
    np.testing.assert_allclose(e0.value - e1.value, 0.5 * delta @ metric @ delta, rtol=1e-9)


def test_slq_and_eigsh(exact):
    lh, _, metric, samples = exact
    log_det = np.linalg.slogdet(metric)[1]
    slq = sv.estimate_evidence_lower_bound(lh, samples, method="slq", n_probes=64, key=jax.random.PRNGKey(3))
    assert slq.method == "slq" and slq.log_det_std > 0
    assert abs(slq.log_det_metric - log_det) < 4 * slq.log_det_std
    # the largest k eigenvalues, and bounds for the rest: found <= log det <= found + truncation
    part = sv.estimate_evidence_lower_bound(lh, samples, n_eigenvalues=8)
    assert part.method == "eigsh"
    np.testing.assert_allclose(part.eigenvalues, np.flip(np.linalg.eigvalsh(metric))[:8], rtol=1e-8)
    assert part.log_det_metric <= log_det <= part.log_det_metric + part.log_det_truncation
    dense = sv.estimate_evidence_lower_bound(lh, samples)
    assert part.lower <= dense.value <= part.upper


def test_model_comparison_picks_the_true_prior():
    """The ELBO of MGVI samples ranks two priors as the exact evidences do, with their difference."""
    values, exact_values = [], []
    for scale in (1.0, 6.0):
        lh, log_z, _ = linear_problem(prior_scale=scale, data_scale=1.0, seed=4)
        samples, _ = sv.optimize_kl(
            lh,
            jnp.zeros(N_LAT),
            key=jax.random.PRNGKey(0),
            n_total_iterations=1,
            n_samples=20,
            sample_mode="linear_resample",
            linear_sampling=sv.CGConfig(tol=1e-10),
            kl_minimization=sv.NewtonCGConfig(xtol=1e-12, cg=sv.CGConfig(tol=1e-12)),
            progress=False,
        )
        elbo = sv.estimate_evidence_lower_bound(lh, samples)
        assert abs(elbo.value - log_z) < 5 * elbo.std
        values.append(elbo.value)
        exact_values.append(log_z)
    assert exact_values[0] > exact_values[1] + 3  # the true prior is the better model, decisively
    assert values[0] > values[1] + 3


def test_nifty_convention_leaves_out_the_normalization(exact):
    """normalized=False: the value of NIFTy.re's convention, exactly c above the true bound's."""
    lh, _, _, samples = exact
    full = sv.estimate_evidence_lower_bound(lh, samples)
    bare = sv.estimate_evidence_lower_bound(lh, samples, normalized=False)
    assert bare.normalization == 0.0
    assert bare.value - full.value == pytest.approx(full.normalization, rel=1e-12)


def test_exact_log_evidence_of_a_complex_gaussian_with_a_diagonal_precision():
    """Complex data (independent real and imaginary noise) and per-datum noise_cov_inv: the bound of the
    exact posterior is log p(d) of the real and imaginary parts, a Gaussian of twice the data size."""
    rng = np.random.default_rng(7)
    n_lat, n_data = 12, 9
    a = rng.normal(size=(n_data, n_lat)) + 1j * rng.normal(size=(n_data, n_lat))
    var = rng.uniform(0.1, 0.5, size=n_data)  # per real component
    d = a @ rng.normal(size=n_lat) + np.sqrt(var) * (rng.normal(size=n_data) + 1j * rng.normal(size=n_data))
    aj = jnp.asarray(a)
    model = sv.Model(lambda xi: aj @ xi.astype(jnp.complex128), jax.ShapeDtypeStruct((n_lat,), jnp.float64))
    lh = sv.Gaussian(d, noise_cov_inv=1.0 / var).amend(model)
    samples, _ = sv.wiener_filter_posterior(lh, key=jax.random.PRNGKey(2), n_samples=200)
    real = np.concatenate([a.real, a.imag])
    cov = real @ real.T + np.diag(np.concatenate([var, var]))
    log_z = scipy.stats.multivariate_normal(mean=np.zeros(2 * n_data), cov=cov).logpdf(np.concatenate([d.real, d.imag]))
    elbo = sv.estimate_evidence_lower_bound(lh, samples)
    assert abs(elbo.value - log_z) < 4 * elbo.std


def test_refuses_a_point_estimate_and_an_unknown_normalization(exact):
    lh, _, _, samples = exact
    with pytest.raises(ValueError, match="no posterior samples.*n_samples"):
        sv.estimate_evidence_lower_bound(lh, sv.Samples(samples.pos, jnp.zeros((0, N_LAT))))
    dom = jax.ShapeDtypeStruct((N_LAT,), jnp.float64)
    own = sv.Likelihood(lambda s: 0.5 * jnp.sum(s**2), lambda s: s, domain=dom)
    own_samples = sv.Samples(jnp.zeros(N_LAT), samples.residuals)
    with pytest.raises(ValueError, match="does not know its normalization.*normalized=False"):
        sv.estimate_evidence_lower_bound(own, own_samples)
    assert np.isfinite(sv.estimate_evidence_lower_bound(own, own_samples, normalized=False).value)
    given = sv.Likelihood(lambda s: 0.5 * jnp.sum(s**2), lambda s: s, domain=dom, normalization=1.5)
    assert sv.estimate_evidence_lower_bound(given, own_samples).normalization == 1.5


@pytest.mark.product_compiler
def test_device_maps_agree(exact):
    lh, _, _, samples = exact
    one = sv.estimate_evidence_lower_bound(lh, samples, method="slq", n_probes=4, lanczos_order=10)
    many = sv.estimate_evidence_lower_bound(
        lh, samples, method="slq", n_probes=4, lanczos_order=10, sample_map="shard_map"
    )
    assert one.log_det_metric == many.log_det_metric
    np.testing.assert_array_equal(one.per_sample, many.per_sample)


def test_bad_inputs(exact):
    lh, _, _, samples = exact
    with pytest.raises(ValueError, match="method"):
        sv.estimate_evidence_lower_bound(lh, samples, method="exact")
    with pytest.raises(ValueError, match="n_eigenvalues"):
        sv.estimate_evidence_lower_bound(lh, samples, n_eigenvalues=N_DATA + 1)
    with pytest.raises(ValueError, match="needs n_eigenvalues"):
        sv.estimate_evidence_lower_bound(lh, samples, method="eigsh")
    with pytest.raises(TypeError, match="samples"):
        sv.estimate_evidence_lower_bound(lh, samples.pos)
    with pytest.raises(ValueError, match="n_probes"):
        sv.estimate_evidence_lower_bound(lh, samples, method="slq", n_probes=0)
    with pytest.raises(TypeError, match="likelihood must be"):
        sv.estimate_evidence_lower_bound(samples, samples)
