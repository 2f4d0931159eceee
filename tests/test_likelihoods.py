"""Likelihoods: energies against scipy.stats, Fisher metrics against closed forms and dense Jacobians."""

from collections.abc import Callable
from typing import NamedTuple

import jax
import jax.numpy as jnp
import numpy as np
import pytest
import scipy.stats as st
from jax.flatten_util import ravel_pytree

import shardvi as sv
from shardvi.vi.likelihood import AmendedLikelihood

N_LAT = 5
M = 4
RNG = np.random.default_rng(20240601)
W = RNG.normal(size=(M, N_LAT)) * 0.5
W2 = RNG.normal(size=(M, N_LAT)) * 0.5
C = RNG.normal(size=M) * 0.3
DOM = jax.ShapeDtypeStruct((N_LAT,), jnp.float64)
XI_TRUE = RNG.normal(size=N_LAT)
XI1 = jnp.asarray(RNG.normal(size=N_LAT))
XI2 = jnp.asarray(RNG.normal(size=N_LAT))


def exp_signal(xi):
    return jnp.exp(jnp.asarray(W) @ xi + jnp.asarray(C))


EXP_MODEL = sv.Model(exp_signal, DOM)
S_TRUE = np.asarray(exp_signal(jnp.asarray(XI_TRUE)))


# ---------------------------------------------------------------------------------------------------
# dense helpers
# ---------------------------------------------------------------------------------------------------
def flat(tree):
    return np.asarray(ravel_pytree(tree)[0])


def _to_real(tree):
    """Flatten a pytree to real coordinates (complex leaves -> interleaved real, imag)."""
    parts = []
    for leaf in jax.tree_util.tree_leaves(tree):
        leaf = jnp.ravel(leaf)
        parts.append(jnp.stack([leaf.real, leaf.imag], axis=1).reshape(-1) if jnp.iscomplexobj(leaf) else leaf)
    return jnp.concatenate(parts)


def _from_real(vec, template):
    leaves, treedef = jax.tree_util.tree_flatten(template)
    out, i = [], 0
    for d in leaves:
        n = int(np.prod(d.shape))
        if jnp.issubdtype(d.dtype, jnp.complexfloating):
            pair = vec[i : i + 2 * n].reshape(n, 2)
            out.append((pair[:, 0] + 1j * pair[:, 1]).astype(d.dtype).reshape(d.shape))
            i += 2 * n
        else:
            out.append(vec[i : i + n].astype(d.dtype).reshape(d.shape))
            i += n
    return jax.tree_util.tree_unflatten(treedef, out)


def dense_linear(op, in_tree):
    """Matrix (out x in, real coordinates) of the linear map ``op`` on pytrees shaped like ``in_tree``
    (ShapeDtypeStructs). Complex leaves count as two real coordinates (real part, imaginary part)."""
    n = sum(
        int(np.prod(d.shape)) * (2 if jnp.issubdtype(d.dtype, jnp.complexfloating) else 1)
        for d in jax.tree_util.tree_leaves(in_tree)
    )
    cols = jax.jit(jax.vmap(lambda v: _to_real(op(_from_real(v, in_tree)))))(jnp.eye(n))
    return np.asarray(cols).T


def real_jacobian(fn, x):
    """Jacobian of ``fn`` at the real vector ``x`` in real output coordinates."""

    def f(v):
        out = fn(v)
        leaves = [jnp.ravel(leaf) for leaf in jax.tree_util.tree_leaves(out)]
        parts = [
            jnp.stack([leaf.real, leaf.imag], axis=1).reshape(-1) if jnp.iscomplexobj(leaf) else leaf for leaf in leaves
        ]
        return jnp.concatenate(parts)

    return np.asarray(jax.jacfwd(f)(x))


def finite_difference_grad(f, x, h=1e-6):
    x = np.asarray(x, dtype=float)
    g = np.zeros_like(x)
    for i in range(x.size):
        e = np.zeros_like(x)
        e[i] = h
        g[i] = (float(f(jnp.asarray(x + e))) - float(f(jnp.asarray(x - e)))) / (2 * h)
    return g


# ---------------------------------------------------------------------------------------------------
# the likelihood cases: each with its Fisher matrix and negative log-pdf written out independently
# ---------------------------------------------------------------------------------------------------
class Case(NamedTuple):
    lh: sv.Likelihood  # on signal space
    model: sv.Model
    fisher: Callable  # s (pytree) -> dense Fisher matrix on flat signal
    nll: Callable  # s -> -log p(d|s) from scipy.stats (numpy)
    nll_jnp: Callable  # s -> -log p(d|s) up to a constant, in jnp
    nres: Callable  # s -> normalized residual (numpy, flat)


SIGMA = 0.3
SIGMA_ARR = np.array([0.1, 0.4, 0.25, 1.3])
GAUSS_DATA = S_TRUE + SIGMA_ARR * RNG.normal(size=M)
_Q, _ = np.linalg.qr(RNG.normal(size=(M, M)))
NCOV = (_Q * np.array([0.05, 0.2, 0.5, 1.0])) @ _Q.T
_w, _v = np.linalg.eigh(NCOV)
NCOV_INV = (_v / _w) @ _v.T
NCOV_INV_SQRT = (_v / np.sqrt(_w)) @ _v.T
COUNTS = np.array([0, 3, 1, 7])
DOF = 3.5
STUDENT_DATA = S_TRUE + SIGMA * RNG.standard_t(DOF, size=M)
VCG_DATA = RNG.normal(size=M)


def vcg_signal(xi):
    return (jnp.asarray(W) @ xi, jnp.exp(0.5 * jnp.asarray(W2) @ xi - 0.5))


VCG_MODEL = sv.Model(vcg_signal, DOM)


def make_case(name) -> Case:
    d = GAUSS_DATA
    if name == "gauss_scalar_std":
        return Case(
            sv.Gaussian(d, noise_std=SIGMA),
            EXP_MODEL,
            lambda s: np.eye(M) / SIGMA**2,
            lambda s: -st.norm.logpdf(d, loc=np.asarray(s), scale=SIGMA).sum(),
            lambda s: 0.5 * jnp.sum((d - s) ** 2) / SIGMA**2,
            lambda s: (d - np.asarray(s)) / SIGMA,
        )
    if name == "gauss_array_std":
        return Case(
            sv.Gaussian(d, noise_std=SIGMA_ARR),
            EXP_MODEL,
            lambda s: np.diag(1 / SIGMA_ARR**2),
            lambda s: -st.norm.logpdf(d, loc=np.asarray(s), scale=SIGMA_ARR).sum(),
            lambda s: 0.5 * jnp.sum(((d - s) / SIGMA_ARR) ** 2),
            lambda s: (d - np.asarray(s)) / SIGMA_ARR,
        )
    if name == "gauss_diag_cov_inv":
        return Case(
            sv.Gaussian(d, noise_cov_inv=1 / SIGMA_ARR**2),
            EXP_MODEL,
            lambda s: np.diag(1 / SIGMA_ARR**2),
            lambda s: -st.norm.logpdf(d, loc=np.asarray(s), scale=SIGMA_ARR).sum(),
            lambda s: 0.5 * jnp.sum(((d - s) / SIGMA_ARR) ** 2),
            lambda s: (d - np.asarray(s)) / SIGMA_ARR,
        )
    if name == "gauss_dense_cov_inv":
        ninv, nis = jnp.asarray(NCOV_INV), jnp.asarray(NCOV_INV_SQRT)
        return Case(
            sv.Gaussian(d, noise_cov_inv=lambda r: ninv @ r, noise_std_inv=lambda r: nis @ r),
            EXP_MODEL,
            lambda s: NCOV_INV,
            lambda s: -st.multivariate_normal(mean=np.asarray(s), cov=NCOV).logpdf(d),
            lambda s: 0.5 * (d - s) @ ninv @ (d - s),
            lambda s: NCOV_INV_SQRT @ (d - np.asarray(s)),
        )
    if name == "poisson":
        return Case(
            sv.Poisson(COUNTS),
            EXP_MODEL,
            lambda s: np.diag(1 / np.asarray(s)),
            lambda s: -st.poisson.logpmf(COUNTS, np.asarray(s)).sum(),
            lambda s: jnp.sum(s - COUNTS * jnp.log(s)),
            lambda s: (COUNTS - np.asarray(s)) / np.sqrt(np.asarray(s)),
        )
    if name == "student_t":
        return Case(
            sv.StudentT(STUDENT_DATA, DOF, SIGMA),
            EXP_MODEL,
            lambda s: np.eye(M) * (DOF + 1) / ((DOF + 3) * SIGMA**2),
            lambda s: -st.t.logpdf(STUDENT_DATA, DOF, loc=np.asarray(s), scale=SIGMA).sum(),
            lambda s: 0.5 * (DOF + 1) * jnp.sum(jnp.log1p(((STUDENT_DATA - s) / SIGMA) ** 2 / DOF)),
            lambda s: (STUDENT_DATA - np.asarray(s)) / SIGMA,
        )
    if name == "student_t_array":
        dof = np.array([1.0, 2.5, 4.0, 30.0])
        return Case(
            sv.StudentT(STUDENT_DATA, dof, SIGMA_ARR),
            EXP_MODEL,
            lambda s: np.diag((dof + 1) / ((dof + 3) * SIGMA_ARR**2)),
            lambda s: -st.t.logpdf(STUDENT_DATA, dof, loc=np.asarray(s), scale=SIGMA_ARR).sum(),
            lambda s: 0.5 * jnp.sum((dof + 1) * jnp.log1p(((STUDENT_DATA - s) / SIGMA_ARR) ** 2 / dof)),
            lambda s: (STUDENT_DATA - np.asarray(s)) / SIGMA_ARR,
        )
    if name == "variable_covariance":

        def fisher(s):
            std = np.asarray(s[1])
            return np.diag(np.concatenate([1 / std**2, 2 / std**2]))

        return Case(
            sv.VariableCovarianceGaussian(VCG_DATA),
            VCG_MODEL,
            fisher,
            lambda s: -st.norm.logpdf(VCG_DATA, loc=np.asarray(s[0]), scale=np.asarray(s[1])).sum(),
            lambda s: jnp.sum(0.5 * ((VCG_DATA - s[0]) / s[1]) ** 2 + jnp.log(s[1])),
            lambda s: (VCG_DATA - np.asarray(s[0])) / np.asarray(s[1]),
        )
    raise KeyError(name)


CASES = [
    "gauss_scalar_std",
    "gauss_array_std",
    "gauss_diag_cov_inv",
    "gauss_dense_cov_inv",
    "poisson",
    "student_t",
    "student_t_array",
    "variable_covariance",
]


@pytest.fixture(scope="module", params=CASES)
def case(request):
    c = make_case(request.param)
    return c, c.lh.amend(c.model)


def test_metric_is_pullback_of_closed_form_fisher(case):
    c, lh = case
    for xi in (XI1, XI2):
        s = c.model(xi)
        j = real_jacobian(c.model, xi)
        expected = j.T @ c.fisher(s) @ j
        got = dense_linear(lambda t: lh.metric(xi, t), DOM)
        np.testing.assert_allclose(got, expected, rtol=1e-12, atol=1e-12 * np.abs(expected).max())
        np.testing.assert_allclose(got, got.T, rtol=1e-13, atol=1e-13 * np.abs(expected).max())
        assert np.linalg.eigvalsh(got).min() > -1e-10 * np.abs(expected).max()
        # signal space
        got_s = dense_linear(lambda t: c.lh.metric(s, t), c.model.target)
        np.testing.assert_allclose(got_s, c.fisher(s), rtol=1e-13, atol=1e-14)


def test_left_sqrt_metric_squares_to_metric(case):
    c, lh = case
    xi = XI1
    s = c.model(xi)
    m = dense_linear(lambda t: lh.metric(xi, t), DOM)
    big_l = dense_linear(lambda e: lh.left_sqrt_metric(xi, e), lh.lsm_tangents_shape)
    assert big_l.shape[0] == N_LAT
    np.testing.assert_allclose(big_l @ big_l.T, m, rtol=1e-12, atol=1e-12 * np.abs(m).max())
    ls = dense_linear(lambda e: c.lh.left_sqrt_metric(s, e), c.lh.lsm_tangents_shape)
    np.testing.assert_allclose(ls @ ls.T, c.fisher(s), rtol=1e-12, atol=1e-14)
    # the amended left square root is J^T L_s
    j = real_jacobian(c.model, xi)
    np.testing.assert_allclose(big_l, j.T @ ls, rtol=1e-12, atol=1e-13)


def test_energy_differences_match_scipy(case):
    c, lh = case
    for xa, xb in ((XI1, XI2), (XI1, jnp.asarray(XI_TRUE)), (XI2, 0.5 * XI1)):
        sa, sb = c.model(xa), c.model(xb)
        expected = c.nll(sa) - c.nll(sb)
        got = float(lh.energy(xa) - lh.energy(xb))
        np.testing.assert_allclose(got, expected, rtol=1e-10, atol=1e-11)
        np.testing.assert_allclose(float(c.lh.energy(sa) - c.lh.energy(sb)), expected, rtol=1e-10, atol=1e-11)
        np.testing.assert_allclose(float(lh(xa)), float(lh.energy(xa)), rtol=0)


def test_energy_gradient(case):
    c, lh = case
    for xi in (XI1, XI2):
        g = np.asarray(jax.grad(lh.energy)(xi))
        g_ref = np.asarray(jax.grad(lambda x: c.nll_jnp(c.model(x)))(xi))
        np.testing.assert_allclose(g, g_ref, rtol=1e-11, atol=1e-11 * np.abs(g_ref).max())
        g_fd = finite_difference_grad(lh.energy, xi)
        np.testing.assert_allclose(g, g_fd, rtol=1e-6, atol=1e-6 * np.abs(g).max())
        g_jit = np.asarray(jax.jit(jax.grad(lh.energy))(xi))
        np.testing.assert_allclose(g_jit, g, rtol=1e-13, atol=1e-14)


def test_normalized_residual(case):
    c, lh = case
    assert lh.has_normalized_residual
    for xi in (XI1, XI2):
        s = c.model(xi)
        np.testing.assert_allclose(flat(lh.normalized_residual(xi)), c.nres(s), rtol=1e-12, atol=1e-14)
        np.testing.assert_allclose(flat(c.lh.normalized_residual(s)), c.nres(s), rtol=1e-12, atol=1e-14)


@pytest.mark.parametrize("name", ["gauss_scalar_std", "gauss_array_std", "gauss_dense_cov_inv"])
def test_gaussian_energy_is_half_squared_normalized_residual(name):
    c = make_case(name)
    lh = c.lh.amend(c.model)
    for xi in (XI1, XI2):
        r = flat(lh.normalized_residual(xi))
        np.testing.assert_allclose(float(lh.energy(xi)), 0.5 * r @ r, rtol=1e-12)


def test_metric_and_sqrt_are_jittable_and_vmappable(case):
    c, lh = case
    ts = jnp.asarray(np.random.default_rng(1).normal(size=(3, N_LAT)))
    out = jax.jit(jax.vmap(lambda t: lh.metric(XI1, t)))(ts)
    for i in range(3):
        np.testing.assert_allclose(out[i], lh.metric(XI1, ts[i]), rtol=1e-12, atol=1e-13)
    keys = jax.random.split(jax.random.PRNGKey(0), 3)
    es = jax.vmap(lambda k: sv.tree_math.random_like(k, lh.lsm_tangents_shape))(keys)
    out = jax.jit(jax.vmap(lambda e: lh.left_sqrt_metric(XI1, e)))(es)
    for i in range(3):
        e = jax.tree_util.tree_map(lambda x: x[i], es)
        np.testing.assert_allclose(out[i], lh.left_sqrt_metric(XI1, e), rtol=1e-12, atol=1e-13)


# ---------------------------------------------------------------------------------------------------
# the closed-form Fisher matrices themselves: F = E_d[score score^T] by quadrature
# ---------------------------------------------------------------------------------------------------
@pytest.mark.slow
def test_closed_form_fisher_matches_expected_score_outer_product():
    # Gaussian: Gauss-Hermite expectation
    mu, sig = 0.7, 0.3
    x, w = np.polynomial.hermite_e.hermegauss(40)
    w = w / w.sum()
    d = mu + sig * x
    g = np.asarray(jax.grad(sv.Gaussian(d, noise_std=sig).energy)(jnp.full(d.size, mu)))
    np.testing.assert_allclose(np.sum(w * g**2), 1 / sig**2, rtol=1e-12)
    f = float(sv.Gaussian(d[:1], noise_std=sig).metric(jnp.array([mu]), jnp.array([1.0]))[0])
    np.testing.assert_allclose(f, np.sum(w * g**2), rtol=1e-12)

    # Poisson: exact sum over counts
    rate = 2.3
    k = np.arange(0, 80)
    pk = st.poisson.pmf(k, rate)
    g = np.asarray(jax.grad(sv.Poisson(k).energy)(jnp.full(k.size, rate)))
    np.testing.assert_allclose(np.sum(pk * g**2), 1 / rate, rtol=1e-12)
    f = float(sv.Poisson(k[:1]).metric(jnp.array([rate]), jnp.array([1.0]))[0])
    np.testing.assert_allclose(f, 1 / rate, rtol=1e-14)

    # Student-t: E over quantiles u ~ U(0, 1), Gauss-Legendre in u
    nu, sig, loc = 3.5, 0.4, -0.2
    u, wu = np.polynomial.legendre.leggauss(400)
    u, wu = 0.5 * (u + 1), 0.5 * wu
    d = st.t.ppf(u, nu, loc=loc, scale=sig)
    g = np.asarray(jax.grad(sv.StudentT(d, nu, sig).energy)(jnp.full(d.size, loc)))
    expected = (nu + 1) / ((nu + 3) * sig**2)
    np.testing.assert_allclose(np.sum(wu * g**2), expected, rtol=1e-6)
    f = float(sv.StudentT(d[:1], nu, sig).metric(jnp.array([loc]), jnp.array([1.0]))[0])
    np.testing.assert_allclose(f, expected, rtol=1e-14)

    # variable-covariance Gaussian, parameters (mean, std): 2x2 Fisher diag(1/std^2, 2/std^2)
    mean, std = 0.3, 0.7
    x, w = np.polynomial.hermite_e.hermegauss(40)
    w = w / w.sum()
    d = mean + std * x
    lh = sv.VariableCovarianceGaussian(d)
    gm, gs = jax.grad(lh.energy)((jnp.full(d.size, mean), jnp.full(d.size, std)))
    gm, gs = np.asarray(gm), np.asarray(gs)
    fisher = np.array([[np.sum(w * gm * gm), np.sum(w * gm * gs)], [np.sum(w * gs * gm), np.sum(w * gs * gs)]])
    np.testing.assert_allclose(fisher, np.diag([1 / std**2, 2 / std**2]), rtol=1e-12, atol=1e-12)
    one = sv.VariableCovarianceGaussian(d[:1])
    s1 = (jnp.array([mean]), jnp.array([std]))
    dense = dense_linear(lambda t: one.metric(s1, t), one.domain)
    np.testing.assert_allclose(dense, fisher, rtol=1e-12, atol=1e-12)


@pytest.mark.parametrize("name", [n for n in CASES if n != "variable_covariance"])
def test_geovi_coordinates_reproduce_fisher_metric(name):
    """Every likelihood with a flat Fisher metric: ``transformation`` pulls back ``F(s)`` exactly, everywhere.

    The variable-covariance likelihoods' metric is curved; their coordinates match it in expectation
    over the data (``test_variable_covariance.py``).
    """
    c = make_case(name)
    for s in [c.model(XI1), c.model(XI2)]:
        flat, unravel = ravel_pytree(s)
        for t in (c.lh.transformation_at(s), c.lh.transformation):
            jt = real_jacobian(lambda v, t=t: t(unravel(v)), flat)
            np.testing.assert_allclose(jt.T @ jt, c.fisher(s), rtol=1e-12, atol=1e-14)


# ---------------------------------------------------------------------------------------------------
# default metric derived from the transformation
# ---------------------------------------------------------------------------------------------------
def _trafo_real(s):
    return {"a": 0.5 * s**2 + jnp.sin(s), "b": jnp.array([s[0] * s[1], jnp.exp(s[2]) - s[1]])}


def _trafo_complex(s):
    return s * jnp.exp(1j * s) + 0.3j * s**2


@pytest.mark.parametrize("trafo", [_trafo_real, _trafo_complex], ids=["real", "complex"])
@pytest.mark.slow
def test_default_metric_from_transformation(trafo):
    dom = jax.ShapeDtypeStruct((3,), jnp.float64)
    lh = sv.Likelihood(lambda s: 0.5 * jnp.sum(jnp.abs(ravel_pytree(trafo(s))[0]) ** 2), trafo, domain=dom)
    assert lh.has_transformation and not lh.has_normalized_residual
    assert jax.tree_util.tree_structure(lh.lsm_tangents_shape) == jax.tree_util.tree_structure(
        jax.eval_shape(trafo, dom)
    )
    s = jnp.array([0.3, -1.1, 0.8])
    jt = real_jacobian(trafo, s)
    m = dense_linear(lambda t: lh.metric(s, t), dom)
    np.testing.assert_allclose(m, jt.T @ jt, rtol=1e-12, atol=1e-13)
    big_l = dense_linear(lambda e: lh.left_sqrt_metric(s, e), lh.lsm_tangents_shape)
    np.testing.assert_allclose(big_l, jt.T, rtol=1e-12, atol=1e-13)
    if trafo is _trafo_complex:  # the real metric is Re(J^H J) of the complex Jacobian
        jc = np.asarray(jax.jacfwd(trafo)(s))
        np.testing.assert_allclose(m, np.real(jc.conj().T @ jc), rtol=1e-12, atol=1e-13)
    # pulled back through a nonlinear model: J^T J_T^T J_T J
    model = sv.Model(lambda xi: jnp.tanh(jnp.asarray(W[:3]) @ xi), DOM)
    amended = lh.amend(model)
    jm = real_jacobian(model, XI1)
    jt = real_jacobian(trafo, model(XI1))
    m = dense_linear(lambda t: amended.metric(XI1, t), DOM)
    np.testing.assert_allclose(m, jm.T @ jt.T @ jt @ jm, rtol=1e-12, atol=1e-13)
    big_l = dense_linear(lambda e: amended.left_sqrt_metric(XI1, e), amended.lsm_tangents_shape)
    np.testing.assert_allclose(big_l @ big_l.T, m, rtol=1e-12, atol=1e-13)
    # geoVI transformation of the amended likelihood is T(model(xi))
    np.testing.assert_allclose(flat(amended.transformation(XI1)), flat(trafo(model(XI1))), rtol=1e-14)


def test_likelihood_without_transformation_or_residual():
    dom = jax.ShapeDtypeStruct((2,), jnp.float64)
    lh = sv.Likelihood(lambda s: jnp.sum(s**2), domain=dom, metric=lambda s, t: 2 * t)
    assert not lh.has_transformation
    with pytest.raises(NotImplementedError, match="transformation"):
        lh.transformation(jnp.zeros(2))
    with pytest.raises(NotImplementedError, match="normalized_residual"):
        lh.normalized_residual(jnp.zeros(2))
    with pytest.raises(ValueError, match="lsm_tangents_shape"):
        sv.Likelihood(lambda s: jnp.sum(s**2), domain=dom, left_sqrt_metric=lambda s, e: e)
    with pytest.raises(TypeError, match="energy"):
        sv.Likelihood(3.0, domain=dom)
    # a metric-only likelihood can still be amended and summed (it just has no left square root)
    model = sv.Model(lambda xi: xi[:2] ** 2, DOM)
    amended = lh.amend(model)
    assert not amended.has_transformation and not amended.has_normalized_residual
    assert amended.lsm_tangents_shape is None
    j = real_jacobian(model, XI1)
    np.testing.assert_allclose(dense_linear(lambda t: amended.metric(XI1, t), DOM), 2 * j.T @ j, rtol=1e-13)
    np.testing.assert_allclose(float(amended.energy(XI1)), float(jnp.sum(XI1[:2] ** 4)), rtol=1e-14)
    with pytest.raises(NotImplementedError, match="transformation"):
        amended.left_sqrt_metric(XI1, jnp.zeros(2))
    total = lh + sv.Gaussian(np.zeros(2), noise_std=0.5)
    assert total.lsm_tangents_shape is None
    np.testing.assert_allclose(total.metric(jnp.ones(2), jnp.array([1.0, -1.0])), [6.0, -6.0], rtol=1e-14)


# ---------------------------------------------------------------------------------------------------
# complex data
# ---------------------------------------------------------------------------------------------------
MC = 3
WC = RNG.normal(size=(MC, N_LAT)) * 0.5
SIGMA_C = np.array([0.2, 0.5, 1.1])


def complex_signal(xi):
    z = jnp.asarray(WC) @ xi
    return jnp.exp(1j * z) * (1.0 + 0.2 * z**2) + 0.1j * z


COMPLEX_MODEL = sv.Model(complex_signal, DOM)
COMPLEX_DATA = np.asarray(complex_signal(jnp.asarray(XI_TRUE))) + SIGMA_C * (
    RNG.normal(size=MC) + 1j * RNG.normal(size=MC)
)


@pytest.fixture(scope="module")
def complex_lh():
    lh = sv.Gaussian(COMPLEX_DATA, noise_std=SIGMA_C)
    return lh, lh.amend(COMPLEX_MODEL)


def test_complex_gaussian_energy(complex_lh):
    lh_s, lh = complex_lh

    def nll(s):  # independent real and imaginary noise
        s = np.asarray(s)
        return -(
            st.norm.logpdf(COMPLEX_DATA.real, s.real, SIGMA_C).sum()
            + st.norm.logpdf(COMPLEX_DATA.imag, s.imag, SIGMA_C).sum()
        )

    s1, s2 = COMPLEX_MODEL(XI1), COMPLEX_MODEL(XI2)
    np.testing.assert_allclose(float(lh.energy(XI1) - lh.energy(XI2)), nll(s1) - nll(s2), rtol=1e-11)
    np.testing.assert_allclose(
        float(lh.energy(XI1)), 0.5 * np.sum(np.abs(COMPLEX_DATA - s1) ** 2 / SIGMA_C**2), rtol=1e-13
    )
    assert jnp.isrealobj(lh.energy(XI1))
    g = np.asarray(jax.grad(lh.energy)(XI1))
    np.testing.assert_allclose(g, finite_difference_grad(lh.energy, XI1), rtol=1e-6, atol=1e-7)
    np.testing.assert_allclose(lh.normalized_residual(XI1), (COMPLEX_DATA - np.asarray(s1)) / SIGMA_C, rtol=1e-13)


def test_complex_gaussian_metric_is_real_pullback(complex_lh):
    _, lh = complex_lh
    jr = real_jacobian(COMPLEX_MODEL, XI1)  # (2*MC, N_LAT), rows interleaved (re, im)
    f = np.diag(np.repeat(1 / SIGMA_C**2, 2))
    expected = jr.T @ f @ jr
    m = dense_linear(lambda t: lh.metric(XI1, t), DOM)
    np.testing.assert_allclose(m, expected, rtol=1e-12, atol=1e-13)
    assert np.isrealobj(m)
    big_l = dense_linear(lambda e: lh.left_sqrt_metric(XI1, e), lh.lsm_tangents_shape)
    assert big_l.shape == (N_LAT, 2 * MC)
    np.testing.assert_allclose(big_l @ big_l.T, expected, rtol=1e-12, atol=1e-13)


def test_complex_gaussian_left_sqrt_dot_test(complex_lh):
    _, lh = complex_lh
    rng = np.random.default_rng(5)
    for _ in range(3):
        e = jnp.asarray(rng.normal(size=MC) + 1j * rng.normal(size=MC))
        v = jnp.asarray(rng.normal(size=N_LAT))
        le = lh.left_sqrt_metric(XI1, e)
        assert jnp.isrealobj(le)
        # L^T v = N^{-1/2} J v (J the complex Jacobian of the model)
        lt_v = jax.jvp(COMPLEX_MODEL, (XI1,), (v,))[1] / SIGMA_C
        lhs = float(jnp.vdot(le, v))
        rhs = float(jnp.real(jnp.vdot(e, lt_v)))
        np.testing.assert_allclose(lhs, rhs, rtol=1e-12)
        # and <M v, v> = |L^T v|^2
        np.testing.assert_allclose(float(jnp.vdot(v, lh.metric(XI1, v))), float(jnp.vdot(lt_v, lt_v).real), rtol=1e-12)


@pytest.mark.slow
def test_complex_gaussian_sample_covariance(complex_lh):
    # e with unit-variance real and imaginary parts gives L e ~ N(0, M)
    _, lh = complex_lh
    n = 20000
    keys = jax.random.split(jax.random.PRNGKey(3), n)
    es = jax.vmap(lambda k: sv.tree_math.random_like(k, lh.lsm_tangents_shape))(keys)
    samples = np.asarray(jax.jit(jax.vmap(lambda e: lh.left_sqrt_metric(XI1, e)))(es))
    m = dense_linear(lambda t: lh.metric(XI1, t), DOM)
    cov = samples.T @ samples / n
    scale = np.sqrt(np.outer(np.diag(m), np.diag(m)))
    assert np.max(np.abs(cov - m) / scale) < 0.06


# ---------------------------------------------------------------------------------------------------
# sums of likelihoods
# ---------------------------------------------------------------------------------------------------
def test_sum_same_domain():
    lh1 = sv.Gaussian(GAUSS_DATA, noise_std=SIGMA_ARR).amend(EXP_MODEL)
    lh2 = sv.Poisson(COUNTS).amend(sv.Model(lambda xi: jnp.exp(jnp.asarray(W2) @ xi), DOM))
    lh = lh1 + lh2
    assert isinstance(lh, sv.Likelihood)
    for xi in (XI1, XI2):
        np.testing.assert_allclose(float(lh.energy(xi)), float(lh1.energy(xi) + lh2.energy(xi)), rtol=1e-14)
        m = dense_linear(lambda t: lh.metric(xi, t), DOM)
        m1 = dense_linear(lambda t: lh1.metric(xi, t), DOM)
        m2 = dense_linear(lambda t: lh2.metric(xi, t), DOM)
        np.testing.assert_allclose(m, m1 + m2, rtol=1e-13, atol=1e-13)
        big_l = dense_linear(lambda e: lh.left_sqrt_metric(xi, e), lh.lsm_tangents_shape)
        np.testing.assert_allclose(big_l @ big_l.T, m, rtol=1e-12, atol=1e-12)
        np.testing.assert_allclose(
            jax.grad(lh.energy)(xi), jax.grad(lh1.energy)(xi) + jax.grad(lh2.energy)(xi), rtol=1e-13, atol=1e-14
        )
        r = lh.normalized_residual(xi)
        np.testing.assert_allclose(r[0], lh1.normalized_residual(xi), rtol=0)
        np.testing.assert_allclose(r[1], lh2.normalized_residual(xi), rtol=0)
        t = lh.transformation(xi)
        np.testing.assert_allclose(t[1], lh2.transformation(xi), rtol=0)


def test_sum_of_three_and_signal_space():
    lh = sv.Gaussian(GAUSS_DATA, noise_std=SIGMA) + sv.StudentT(STUDENT_DATA, DOF, SIGMA) + sv.Poisson(COUNTS)
    s = jnp.asarray(S_TRUE)
    expected = make_case("gauss_scalar_std").nll(s) + make_case("student_t").nll(s) + make_case("poisson").nll(s)
    s2 = 1.3 * s
    expected2 = make_case("gauss_scalar_std").nll(s2) + make_case("student_t").nll(s2) + make_case("poisson").nll(s2)
    np.testing.assert_allclose(float(lh.energy(s) - lh.energy(s2)), expected - expected2, rtol=1e-10)
    m = dense_linear(lambda t: lh.metric(s, t), lh.domain)
    f = np.eye(M) / SIGMA**2 + np.eye(M) * (DOF + 1) / ((DOF + 3) * SIGMA**2) + np.diag(1 / S_TRUE)
    np.testing.assert_allclose(m, f, rtol=1e-13)
    lhm = lh.amend(EXP_MODEL)
    j = real_jacobian(EXP_MODEL, XI1)
    f = np.eye(M) / SIGMA**2 + np.eye(M) * (DOF + 1) / ((DOF + 3) * SIGMA**2) + np.diag(1 / np.asarray(EXP_MODEL(XI1)))
    m = dense_linear(lambda t: lhm.metric(XI1, t), DOM)
    np.testing.assert_allclose(m, j.T @ f @ j, rtol=1e-12)
    big_l = dense_linear(lambda e: lhm.left_sqrt_metric(XI1, e), lhm.lsm_tangents_shape)
    np.testing.assert_allclose(big_l @ big_l.T, m, rtol=1e-12)


@pytest.mark.slow
def test_sum_on_partly_overlapping_dict_domains():
    da = {"a": jax.ShapeDtypeStruct((2,), jnp.float64), "b": jax.ShapeDtypeStruct((3,), jnp.float64)}
    db = {"b": jax.ShapeDtypeStruct((3,), jnp.float64), "c": jax.ShapeDtypeStruct((), jnp.float64)}
    m1 = sv.Model(lambda x: jnp.exp(jnp.concatenate([x["a"], x["b"][:2]]) * 0.5 + jnp.sum(x["b"]) * 0.1), da)
    m2 = sv.Model(lambda x: jnp.tanh(x["b"] * x["c"]) + x["c"], db)
    lh1 = sv.Poisson(np.array([1, 0, 4, 2])).amend(m1)
    lh2 = sv.Gaussian(np.array([0.1, -0.4, 0.9]), noise_std=np.array([0.3, 0.5, 0.2])).amend(m2)
    lh = lh1 + lh2
    assert set(lh.domain) == {"a", "b", "c"}
    rng = np.random.default_rng(9)
    x = {"a": jnp.asarray(rng.normal(size=2)), "b": jnp.asarray(rng.normal(size=3)), "c": jnp.asarray(0.7)}
    xa = {k: x[k] for k in ("a", "b")}
    xb = {k: x[k] for k in ("b", "c")}
    np.testing.assert_allclose(float(lh.energy(x)), float(lh1.energy(xa) + lh2.energy(xb)), rtol=1e-14)
    # embed the two dense metrics into the union's flat coordinates (ravel order: a, b, c)
    idx = {"a": [0, 1], "b": [2, 3, 4], "c": [5]}
    ia = idx["a"] + idx["b"]
    ib = idx["b"] + idx["c"]
    full = np.zeros((6, 6))
    full[np.ix_(ia, ia)] += dense_linear(lambda t: lh1.metric(xa, t), lh1.domain)
    full[np.ix_(ib, ib)] += dense_linear(lambda t: lh2.metric(xb, t), lh2.domain)
    got = dense_linear(lambda t: lh.metric(x, t), lh.domain)
    np.testing.assert_allclose(got, full, rtol=1e-13, atol=1e-14)
    # closed form: J1^T diag(1/s1) J1 + J2^T diag(1/sigma^2) J2 on the union coordinates
    flat_x, unravel = ravel_pytree(x)
    j1 = real_jacobian(lambda v: m1(unravel(v)), flat_x)
    j2 = real_jacobian(lambda v: m2(unravel(v)), flat_x)
    s1 = np.asarray(m1(xa))
    expected = j1.T @ np.diag(1 / s1) @ j1 + j2.T @ np.diag(1 / np.array([0.3, 0.5, 0.2]) ** 2) @ j2
    np.testing.assert_allclose(got, expected, rtol=1e-12, atol=1e-13)
    big_l = dense_linear(lambda e: lh.left_sqrt_metric(x, e), lh.lsm_tangents_shape)
    np.testing.assert_allclose(big_l @ big_l.T, got, rtol=1e-12, atol=1e-13)
    g = jax.grad(lh.energy)(x)
    np.testing.assert_allclose(
        flat(g), finite_difference_grad(lambda v: lh.energy(unravel(v)), flat_x), rtol=1e-6, atol=1e-7
    )
    # order does not matter
    got_rev = dense_linear(lambda t: (lh2 + lh1).metric(x, t), lh.domain)
    np.testing.assert_allclose(got_rev, got, rtol=1e-14, atol=1e-15)


def test_sum_rejects_incompatible_domains():
    a = sv.Gaussian(np.zeros(3), noise_std=1.0)
    b = sv.Gaussian(np.zeros(4), noise_std=1.0)
    with pytest.raises(ValueError, match="different domains"):
        a + b
    da = {"x": jax.ShapeDtypeStruct((2,), jnp.float64)}
    db = {"x": jax.ShapeDtypeStruct((3,), jnp.float64)}
    la = sv.Gaussian(np.zeros(2), noise_std=1.0).amend(sv.Model(lambda p: p["x"], da))
    lb = sv.Gaussian(np.zeros(3), noise_std=1.0).amend(sv.Model(lambda p: p["x"], db))
    with pytest.raises(ValueError, match="'x'"):
        la + lb
    with pytest.raises(TypeError):
        a + 1.0


# ---------------------------------------------------------------------------------------------------
# pytree data
# ---------------------------------------------------------------------------------------------------
def test_pytree_data_and_noise():
    data = {"u": np.array([0.5, 1.5]), "v": np.array([[1.0, -1.0], [0.2, 0.0]])}
    std = {"u": 0.5, "v": np.array([0.1, 0.2])}
    lh = sv.Gaussian(data, noise_std=std)
    s = {"u": jnp.array([0.4, 1.0]), "v": jnp.zeros((2, 2))}
    expected = -(
        st.norm.logpdf(data["u"], np.asarray(s["u"]), 0.5).sum()
        + st.norm.logpdf(data["v"], 0.0, np.array([0.1, 0.2])).sum()
    )
    s0 = jax.tree_util.tree_map(lambda d: jnp.asarray(d), data)
    const = -(
        st.norm.logpdf(data["u"], data["u"], 0.5).sum()
        + st.norm.logpdf(data["v"], data["v"], np.array([0.1, 0.2])).sum()
    )
    np.testing.assert_allclose(float(lh.energy(s) - lh.energy(s0)), expected - const, rtol=1e-12)
    m = dense_linear(lambda t: lh.metric(s, t), lh.domain)
    np.testing.assert_allclose(
        np.diag(m), np.concatenate([[4.0, 4.0], 1 / np.array([0.1, 0.2, 0.1, 0.2]) ** 2]), rtol=1e-13
    )


def test_a_scalar_noise_is_held_as_a_scalar_and_acts_as_its_broadcast():
    """``noise_std`` / ``noise_cov_inv`` given as one number stay 0-d arrays (no data-sized copies); energy,
    metric, its square root and the residual are bitwise those with the noise given at every datum, and the
    checkpoint fingerprint is that of the broadcast noise (a checkpoint of either resumes with the other)."""
    from shardvi.vi.checkpoint.fingerprints import fingerprint

    d = RNG.normal(size=(6, 5))
    x, t = jnp.asarray(RNG.normal(size=d.shape)), jnp.asarray(RNG.normal(size=d.shape))
    for kw in ({"noise_std": 0.3}, {"noise_cov_inv": 7.0}):
        ((name, value),) = kw.items()
        one, full = sv.Gaussian(d, **kw), sv.Gaussian(d, **{name: np.full(d.shape, value)})
        assert all(np.ndim(a) == 0 for a in jax.tree.leaves(one) if a is not one.data)
        assert sum(np.size(a) for a in jax.tree.leaves(one)) == d.size + 2

        def parts(lh):
            return lh.energy(x), lh.metric(x, t), lh.left_sqrt_metric(x, t), lh.normalized_residual(x)

        for a, b in zip(jax.jit(parts)(one), jax.jit(parts)(full)):
            np.testing.assert_array_equal(np.asarray(a), np.asarray(b))
        assert fingerprint(one, x) == fingerprint(full, x)
    assert fingerprint(sv.Gaussian(d, noise_std=0.3), x) != fingerprint(sv.Gaussian(d, noise_std=0.31), x)


def test_single_leaf_pytree_noise():
    # a noise pytree with the data's structure must be used leaf by leaf, also for one leaf
    lh = sv.Gaussian({"a": np.ones(3)}, noise_std={"a": 0.5})
    np.testing.assert_allclose(lh.metric({"a": jnp.ones(3)}, {"a": jnp.ones(3)})["a"], 4.0)
    lh = sv.Gaussian({"a": np.ones(3)}, noise_std={"a": np.array([0.5, 1.0, 2.0])})
    np.testing.assert_allclose(lh.metric({"a": jnp.ones(3)}, {"a": jnp.ones(3)})["a"], [4.0, 1.0, 0.25])
    lh = sv.StudentT([np.ones(2)], dof=[3.0], noise_std=[0.5])
    np.testing.assert_allclose(lh.metric([jnp.ones(2)], [jnp.ones(2)])[0], 4.0 * 4 / 6)


# ---------------------------------------------------------------------------------------------------
# bad input
# ---------------------------------------------------------------------------------------------------
BAD = [
    ("nan data", lambda: sv.Gaussian(np.array([1.0, np.nan]), noise_std=1.0), ValueError, "data"),
    ("inf data", lambda: sv.Gaussian({"x": np.array([np.inf])}, noise_std=1.0), ValueError, "data"),
    ("string data", lambda: sv.Gaussian(np.array(["a"]), noise_std=1.0), TypeError, "data"),
    ("zero noise_std", lambda: sv.Gaussian(np.ones(3), noise_std=0.0), ValueError, "noise_std"),
    (
        "negative noise_std",
        lambda: sv.Gaussian(np.ones(3), noise_std=np.array([1.0, -1.0, 1.0])),
        ValueError,
        "noise_std",
    ),
    ("nan noise_std", lambda: sv.Gaussian(np.ones(3), noise_std=np.nan), ValueError, "noise_std"),
    ("inf noise_std", lambda: sv.Gaussian(np.ones(3), noise_std=np.inf), ValueError, "noise_std"),
    ("bool noise_std", lambda: sv.Gaussian(np.ones(3), noise_std=True), TypeError, "noise_std"),
    (
        "both noises",
        lambda: sv.Gaussian(np.ones(3), noise_std=1.0, noise_cov_inv=1.0),
        ValueError,
        "noise_std and noise_cov_inv",
    ),
    ("no noise", lambda: sv.Gaussian(np.ones(3)), ValueError, "noise_std and noise_cov_inv"),
    ("noise shape", lambda: sv.Gaussian(np.ones(3), noise_std=np.ones(2)), ValueError, "noise_std.*shape"),
    (
        "noise_cov_inv shape",
        lambda: sv.Gaussian(np.ones((2, 3)), noise_cov_inv=np.ones((3, 2))),
        ValueError,
        "noise_cov_inv.*shape",
    ),
    ("negative noise_cov_inv", lambda: sv.Gaussian(np.ones(3), noise_cov_inv=-1.0), ValueError, "noise_cov_inv"),
    (
        "callable cov without sqrt",
        lambda: sv.Gaussian(np.ones(3), noise_cov_inv=lambda r: r),
        ValueError,
        "noise_std_inv",
    ),
    ("negative counts", lambda: sv.Poisson(np.array([1, -1, 2])), ValueError, "counts"),
    ("nan counts", lambda: sv.Poisson(np.array([1.0, np.nan])), ValueError, "counts"),
    ("student zero dof", lambda: sv.StudentT(np.ones(3), 0.0, 1.0), ValueError, "dof"),
    ("student negative dof", lambda: sv.StudentT(np.ones(3), np.array([1.0, -2.0, 1.0]), 1.0), ValueError, "dof"),
    ("student bad noise", lambda: sv.StudentT(np.ones(3), 3.0, -1.0), ValueError, "noise_std"),
    ("student nan data", lambda: sv.StudentT(np.array([np.nan]), 3.0, 1.0), ValueError, "data"),
    ("student complex", lambda: sv.StudentT(np.ones(2) * 1j, 3.0, 1.0), TypeError, "real"),
    ("vcg nan", lambda: sv.VariableCovarianceGaussian(np.array([0.0, np.inf])), ValueError, "data"),
    (
        "vcg complex leaf",
        lambda: sv.VariableCovarianceGaussian({"a": np.ones(2), "b": 1j * np.ones(2)}),
        TypeError,
        "real",
    ),
    ("empty data", lambda: sv.Gaussian({}, noise_std=1.0), ValueError, "data"),
]


@pytest.mark.parametrize("make,exc,match", [b[1:] for b in BAD], ids=[b[0] for b in BAD])
def test_bad_input(make, exc, match):
    with pytest.raises(exc, match=match):
        make()


def test_amend_rejects_mismatched_model_and_plain_function():
    lh = sv.Gaussian(np.ones(M), noise_std=1.0)
    with pytest.raises(ValueError, match="model"):
        lh.amend(sv.Model(lambda xi: xi, DOM))  # output (5,) vs data (4,)
    with pytest.raises(ValueError, match="model"):
        lh.amend(sv.Model(lambda xi: {"x": xi[:M]}, DOM))  # structure differs
    with pytest.raises(ValueError, match="model"):
        sv.Gaussian(np.ones(M) + 0j, noise_std=1.0).amend(EXP_MODEL)  # real model, complex data
    with pytest.raises(ValueError, match="model"):
        sv.VariableCovarianceGaussian(np.ones(M)).amend(EXP_MODEL)  # needs (mean, std)
    with pytest.raises(TypeError, match="Model"):
        lh.amend(exp_signal)
    with pytest.raises(TypeError, match="Model"):
        lh.amend(3)


def test_metric_operator_equals_closed_form(case):
    """``metric_operator(x)`` (model linearized once) is the same operator as ``metric(x, .)``."""
    c, lh = case
    for xi in (XI1, XI2):
        op = lh.metric_operator(xi)
        j = real_jacobian(c.model, xi)
        expected = j.T @ c.fisher(c.model(xi)) @ j
        got = dense_linear(op, DOM)
        np.testing.assert_allclose(got, expected, rtol=1e-12, atol=1e-12 * np.abs(expected).max())
        np.testing.assert_allclose(
            got, dense_linear(lambda t: lh.metric(xi, t), DOM), rtol=1e-13, atol=1e-14 * np.abs(expected).max()
        )
        s = c.model(xi)
        np.testing.assert_allclose(
            dense_linear(c.lh.metric_operator(s), c.model.target), c.fisher(s), rtol=1e-13, atol=1e-14
        )


def test_linearize_with_adjoint_dot_test():
    """``<J^T u, v> = Re <u, J v>`` for a complex-valued map (FFT of a nonlinear function)."""
    from shardvi import tree_math as tm

    f = lambda x: jnp.fft.fft(jnp.sin(x["a"]) * x["b"])  # noqa: E731
    rng = np.random.default_rng(3)
    x = {"a": jnp.asarray(rng.normal(size=6)), "b": jnp.asarray(rng.normal(size=6))}
    y, jvp, adj = tm.linearize_with_adjoint(f, x)
    np.testing.assert_allclose(np.asarray(y), np.asarray(f(x)), rtol=1e-15)
    v = {"a": jnp.asarray(rng.normal(size=6)), "b": jnp.asarray(rng.normal(size=6))}
    u = jnp.asarray(rng.normal(size=6) + 1j * rng.normal(size=6))
    np.testing.assert_allclose(np.asarray(jvp(v)), np.asarray(jax.jvp(f, (x,), (v,))[1]), rtol=1e-14, atol=1e-14)
    lhs = float(tm.vdot(adj(u), v))
    rhs = float(np.real(np.vdot(np.asarray(u), np.asarray(jvp(v)))))
    np.testing.assert_allclose(lhs, rhs, rtol=1e-13)


def test_sampling_operators_equal_closed_form_and_share_the_model(case):
    """``sampling_operators(xi)``: ``J^T L`` and ``J^T F J`` from one evaluation and linearization of the model."""
    c, lh = case
    xi = XI1
    lsm, metric = lh.sampling_operators(xi)
    j = real_jacobian(c.model, xi)
    s = c.model(xi)
    m = j.T @ c.fisher(s) @ j
    np.testing.assert_allclose(dense_linear(metric, DOM), m, rtol=1e-12, atol=1e-12 * np.abs(m).max())
    ls = dense_linear(lambda e: c.lh.left_sqrt_metric(s, e), c.lh.lsm_tangents_shape)
    big_l = dense_linear(lsm, lh.lsm_tangents_shape)
    np.testing.assert_allclose(big_l, j.T @ ls, rtol=1e-12, atol=1e-13)
    # traced: the model's forward pass once for both (the separate methods evaluate it once each)
    calls = []
    counted = sv.Model(lambda x: (calls.append(1), c.model(x))[1], c.model.domain)
    clh = c.lh.amend(counted)
    e = jax.tree.map(lambda d: jnp.ones(d.shape, d.dtype), clh.lsm_tangents_shape)
    t = jax.tree.map(lambda d: jnp.ones(d.shape, d.dtype), clh.domain)
    calls.clear()  # building the model and amending evaluate its shapes

    def shared(x):
        op_l, op_m = clh.sampling_operators(x)
        return op_l(e), op_m(t)

    jax.make_jaxpr(shared)(xi)
    assert len(calls) == 1
    calls.clear()
    jax.make_jaxpr(lambda x: (clh.left_sqrt_metric(x, e), clh.metric_operator(x)(t)))(xi)
    assert len(calls) == 2


def test_sampling_operators_of_sums_and_overriding_subclasses():
    """A sum combines its parts' shared operators; a subclass overriding a method gets the default pairing."""
    dom = jax.ShapeDtypeStruct((3,), jnp.float64)
    m1 = sv.Model(lambda x: jnp.exp(0.5 * x), dom)
    m2 = sv.Model(lambda x: jnp.tanh(x) + x, dom)
    lh1 = sv.Poisson(np.array([1, 0, 4])).amend(m1)
    lh2 = sv.Gaussian(np.array([0.1, -0.4, 0.9]), noise_std=0.3).amend(m2)
    lh = lh1 + lh2
    x = jnp.asarray([0.3, -0.2, 0.8])
    lsm, metric = lh.sampling_operators(x)
    np.testing.assert_allclose(
        dense_linear(metric, dom), dense_linear(lambda t: lh.metric(x, t), dom), rtol=1e-13, atol=1e-14
    )
    np.testing.assert_allclose(
        dense_linear(lsm, lh.lsm_tangents_shape),
        dense_linear(lambda e: lh.left_sqrt_metric(x, e), lh.lsm_tangents_shape),
        rtol=1e-13,
        atol=1e-14,
    )

    class Doubled(AmendedLikelihood):  # a user's override of the square root (here: of the metric 4 J^T F J)
        def left_sqrt_metric(self, xi, e):
            return 2.0 * super().left_sqrt_metric(xi, e)

    d = Doubled(sv.Gaussian(np.array([0.1, -0.4, 0.9]), noise_std=0.3), m2)
    lsm_d, _ = d.sampling_operators(x)
    e = jnp.asarray([1.0, -2.0, 0.5])
    np.testing.assert_allclose(lsm_d(e), 2.0 * lh2.left_sqrt_metric(x, e), rtol=1e-14)


def test_declared_transformation_square_roots_are_the_transformations_vjp(case):
    """``_lsm_from_transformation`` holds exactly where ``left_sqrt_metric`` is ``(dT/ds)^T`` (geoVI relies on it)."""
    c, lh = case
    xi = XI1
    big_l = dense_linear(lambda e: lh.left_sqrt_metric(xi, e), lh.lsm_tangents_shape)
    _, vjp = jax.vjp(lh.transformation, xi)
    jt = dense_linear(lambda e: vjp(e)[0], lh.lsm_tangents_shape)
    same = np.allclose(big_l, jt, rtol=1e-12, atol=1e-13 * np.abs(big_l).max())
    assert lh._lsm_from_transformation == c.lh._lsm_from_transformation == same
    # the variable-covariance Gaussian's square root is not its transformation's (the others' are)
    assert same == (not isinstance(c.lh, sv.VariableCovarianceGaussian))


@pytest.mark.parametrize("dof", [3.0, 150.0, 1e6, 1e14, 1e16])
def test_student_t_normalization_is_scipys_for_any_dof(dof):
    """Energy + normalization is ``-sum log t.pdf``; for large ``dof`` the ``log Gamma`` difference of the
    normalization comes from its series (it cancels to nothing in float64 at 1e16)."""
    d = np.array([0.3, -1.2, 2.5, 0.1])
    lh = sv.StudentT(d, dof, 0.5)
    want = -st.t.logpdf(d, dof, scale=0.5).sum()
    np.testing.assert_allclose(float(lh.energy(jnp.zeros(4))) + lh.normalization(), want, rtol=1e-13)
    vc = sv.VariableCovarianceStudentT(d, dof)
    got = float(vc.energy((jnp.zeros(4), jnp.full(4, 0.5)))) + vc.normalization()
    np.testing.assert_allclose(got, want, rtol=1e-13)


def test_student_t_energy_is_finite_where_the_squared_residual_overflows():
    """``log1p(r^2 / dof)`` from ``log|r|`` where ``r^2`` overflows: finite energy and gradient, equal to the
    closed form; the bits elsewhere are the plain expression's."""
    d = np.array([1e200, 1.0, -2.0, 0.5])
    lh = sv.StudentT(d, 3.0, 2.0)
    r = d / 2.0
    want = 0.5 * 4 * (2 * np.log(np.abs(r[0])) - np.log(3.0)) + 0.5 * 4 * np.sum(np.log1p(r[1:] ** 2 / 3))
    np.testing.assert_allclose(float(lh.energy(jnp.zeros(4))), want, rtol=1e-14)
    g = np.asarray(jax.grad(lh.energy)(jnp.zeros(4)))
    np.testing.assert_allclose(g[0], -4.0 / d[0], rtol=1e-12)
    small = sv.StudentT(d[1:], 3.0, 2.0)
    plain = 0.5 * 4 * jnp.log1p((jnp.asarray(d[1:]) / 2.0) ** 2 / 3.0)
    assert float(small.energy(jnp.zeros(3))) == float(jnp.sum(plain))
    vc = sv.VariableCovarianceStudentT(d, 3.0)
    assert np.isfinite(float(vc.energy((jnp.zeros(4), jnp.full(4, 2.0)))))
    f32 = sv.StudentT(np.array([1e17, 1.0], np.float32), 3.0, 1e-3)  # r = 1e20: r^2 overflows float32
    assert np.isfinite(float(f32.energy(jnp.zeros(2, jnp.float32))))


def test_positive_parameters_must_be_normal_numbers_of_the_data_dtype():
    """A subnormal float32 dof or noise flushes to 0 in XLA (energy inf or 0): refused like an underflow."""
    for make in (
        lambda: sv.StudentT(np.ones(2, np.float32), 1e-40, 1.0),
        lambda: sv.Gaussian(np.ones(2, np.float32), noise_cov_inv=1e-45),
    ):
        with pytest.raises(ValueError, match="not representable in the data's dtype float32"):
            make()
    assert np.isfinite(float(sv.StudentT(np.ones(2, np.float32), 2e-38, 1.0).energy(jnp.zeros(2, jnp.float32))))
