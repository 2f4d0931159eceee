"""``Likelihood.normalization``: energy + normalization is -log p(d | s) of scipy's distributions."""

import jax
import jax.numpy as jnp
import numpy as np
import pytest
import scipy.stats

import shardvi as sv

RNG = np.random.default_rng(3)
D = RNG.normal(size=7)
S = RNG.normal(size=7)
SD = RNG.uniform(0.3, 2.0, size=7)
COUNTS = RNG.poisson(3.0, size=7).astype(float)
RATE = RNG.uniform(0.5, 5.0, size=7)


def _neg_log_lh(lh, s):
    return float(lh.energy(s)) + lh.normalization()


@pytest.mark.parametrize(
    "lh, s, want",
    [
        (sv.Gaussian(D, noise_std=SD), S, -scipy.stats.norm(S, SD).logpdf(D).sum()),
        (sv.Gaussian(D, noise_std=0.7), S, -scipy.stats.norm(S, 0.7).logpdf(D).sum()),
        (sv.Gaussian(D, noise_cov_inv=1 / SD**2), S, -scipy.stats.norm(S, SD).logpdf(D).sum()),
        (sv.Gaussian({"a": D, "b": D[:3]}, noise_std=0.5), {"a": S, "b": S[:3]},
         -scipy.stats.norm(S, 0.5).logpdf(D).sum() - scipy.stats.norm(S[:3], 0.5).logpdf(D[:3]).sum()),
        (sv.Poisson(COUNTS), RATE, -scipy.stats.poisson(RATE).logpmf(COUNTS).sum()),
        (sv.StudentT(D, 2.5, SD), S, -scipy.stats.t(2.5, S, SD).logpdf(D).sum()),
        (sv.VariableCovarianceGaussian(D), (S, SD), -scipy.stats.norm(S, SD).logpdf(D).sum()),
        (sv.VariableCovarianceStudentT(D, 4.0), (S, SD), -scipy.stats.t(4.0, S, SD).logpdf(D).sum()),
    ],
    ids=["gauss-std", "gauss-scalar", "gauss-prec", "gauss-dict", "poisson", "student", "vcg", "vcstudent"],
)  # fmt: skip
def test_energy_plus_normalization_is_the_negative_log_likelihood(lh, s, want):
    np.testing.assert_allclose(_neg_log_lh(lh, s), want, rtol=1e-13)


def test_complex_gaussian_counts_both_components():
    d = D + 1j * D[::-1]
    s = S + 0.2j
    lh = sv.Gaussian(d, noise_std=SD)
    want = -(scipy.stats.norm(s.real, SD).logpdf(d.real) + scipy.stats.norm(s.imag, SD).logpdf(d.imag)).sum()
    np.testing.assert_allclose(_neg_log_lh(lh, s), want, rtol=1e-13)


def test_callable_noise_needs_its_log_det():
    prec = 1 / SD**2
    bare = sv.Gaussian(D, noise_cov_inv=lambda r: r * prec, noise_std_inv=lambda r: r * np.sqrt(prec))
    assert bare.normalization() is None
    given = sv.Gaussian(
        D,
        noise_cov_inv=lambda r: r * prec,
        noise_std_inv=lambda r: r * np.sqrt(prec),
        noise_log_det=np.sum(np.log(SD**2)),
    )
    np.testing.assert_allclose(_neg_log_lh(given, S), -scipy.stats.norm(S, SD).logpdf(D).sum(), rtol=1e-13)
    with pytest.raises(ValueError, match="noise_log_det is for a callable"):
        sv.Gaussian(D, noise_std=SD, noise_log_det=1.0)


def test_amended_summed_and_blocked_keep_the_data_normalization():
    dom = jax.ShapeDtypeStruct((7,), jnp.float64)
    g, p = sv.Gaussian(D, noise_std=SD), sv.Poisson(COUNTS)
    ident = sv.Model(lambda x: x, dom)
    assert g.amend(ident).normalization() == g.normalization()
    assert (g + sv.Gaussian(D, noise_std=0.5)).normalization() == pytest.approx(
        g.normalization() + sv.Gaussian(D, noise_std=0.5).normalization(), rel=1e-15
    )
    model = sv.Model(lambda x, inp: jnp.exp(x[inp["i"]]), dom, data_inputs={"i": np.arange(7)})
    assert p.amend(model, data_blocks=7).normalization() == pytest.approx(p.normalization(), rel=1e-14)


def test_poisson_refuses_fractional_counts():
    with pytest.raises(ValueError, match="counts must be whole numbers"):
        sv.Poisson(np.full(8, 2.5))
