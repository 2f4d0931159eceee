"""Variable-covariance likelihoods: the noise level is part of the signal ``(mean, std)``.

``VariableCovarianceStudentT`` against ``scipy.stats.t``; both Fisher metrics against the expected
outer product of the score (``scipy.integrate.quad``); the geoVI coordinates' metric in expectation
over the data, square roots (dot tests), pytree data for
``VariableCovarianceGaussian`` against the concatenated single array, blocked data, an
``optimize_kl`` run that recovers a noise level from data with outliers, and bad inputs.
"""

from __future__ import annotations

import functools
import math

import jax
import jax.numpy as jnp
import numpy as np
import pytest
import scipy.integrate as si
import scipy.stats as st
from jax.flatten_util import ravel_pytree

import shardvi as sv
from shardvi import tree_math as tm
from shardvi.vi import VariableCovarianceGaussian, VariableCovarianceStudentT

RNG = np.random.default_rng(20260311)
M = 4
N_LAT = 5
DOM = jax.ShapeDtypeStruct((N_LAT,), jnp.float64)
W = RNG.normal(size=(M, N_LAT)) * 0.5
W2 = RNG.normal(size=(M, N_LAT)) * 0.5
XI1 = jnp.asarray(RNG.normal(size=N_LAT))
XI2 = jnp.asarray(RNG.normal(size=N_LAT))
DATA = RNG.normal(size=M) + np.array([0.0, 4.0, 0.0, -3.0])  # two outliers
DOF_ARR = np.array([1.0, 2.5, 4.0, 30.0])


def vc_signal(xi):
    return (jnp.asarray(W) @ xi, jnp.exp(0.5 * jnp.asarray(W2) @ xi - 0.5))


VC_MODEL = sv.Model(vc_signal, DOM)


def dense_traced(op, in_tree):
    """Matrix (flat out x flat in) of the linear map ``op`` on real pytrees shaped like ``in_tree``."""
    zero = jax.tree.map(lambda d: jnp.zeros(d.shape, d.dtype), in_tree)
    vec, unravel = ravel_pytree(zero)
    return jax.vmap(lambda v: ravel_pytree(op(unravel(v)))[0])(jnp.eye(vec.size, dtype=vec.dtype)).T


def dense(op, in_tree):
    """:func:`dense_traced` in one compiled program, as a NumPy array."""
    return np.asarray(jax.jit(lambda: dense_traced(op, in_tree))())


def fisher_st(mean, std, dof):
    """Dense closed-form Fisher matrix of the Student-t on flat ``(mean, std)`` (independent of the code)."""
    del mean
    return np.diag(np.concatenate([(dof + 1) / ((dof + 3) * std**2), 2 * dof / ((dof + 3) * std**2)]))


def fisher_gauss(mean, std):
    del mean
    return np.diag(np.concatenate([1 / std**2, 2 / std**2]))


# ---------------------------------------------------------------------------------------------------
# energy
# ---------------------------------------------------------------------------------------------------
@pytest.mark.parametrize("dof", [3.5, DOF_ARR], ids=["scalar_dof", "array_dof"])
def test_student_t_energy_differences_match_scipy(dof):
    lh = VariableCovarianceStudentT(DATA, dof)
    amended = lh.amend(VC_MODEL)
    xis = jnp.stack([XI1, XI2, 0.3 * XI1, jnp.zeros(N_LAT)])
    h = 1e-6
    steps = jnp.concatenate([h * jnp.eye(N_LAT), -h * jnp.eye(N_LAT)])

    @jax.jit
    def compute(lh, amended):
        signals = jax.vmap(VC_MODEL)(xis)
        return (
            signals,
            jax.vmap(lh.energy)(signals),
            jax.vmap(amended.energy)(xis),
            jax.grad(amended.energy)(XI1),
            jax.vmap(amended.energy)(XI1 + steps),
        )

    signals, e_sig, e_lat, g, e_fd = compute(lh, amended)
    nll = np.array(
        [-st.t.logpdf(DATA, df=dof, loc=np.asarray(m), scale=np.asarray(sd)).sum() for m, sd in zip(*signals)]
    )
    e_sig, e_lat = np.asarray(e_sig), np.asarray(e_lat)
    for a, b in ((0, 1), (1, 2), (3, 0)):
        np.testing.assert_allclose(e_sig[a] - e_sig[b], nll[a] - nll[b], rtol=1e-11, atol=1e-12)
        np.testing.assert_allclose(e_lat[a] - e_lat[b], nll[a] - nll[b], rtol=1e-11, atol=1e-12)
    # the constant dropped does not depend on (mean, std): H + log p is the same at every point
    np.testing.assert_allclose(e_sig - nll, e_sig[0] - nll[0], rtol=1e-12, atol=1e-12)
    # gradient of the amended energy (the chain rule through the model) against central differences
    e_fd = np.asarray(e_fd)
    np.testing.assert_allclose(np.asarray(g), (e_fd[:N_LAT] - e_fd[N_LAT:]) / (2 * h), rtol=1e-6, atol=1e-7)


def test_gaussian_energy_and_residual_unchanged_for_one_array():
    lh = VariableCovarianceGaussian(DATA)
    sds = jax.ShapeDtypeStruct((M,), jnp.float64)
    assert lh.domain == (sds, sds) and lh.lsm_tangents_shape == (sds, sds)
    s = VC_MODEL(XI1)
    mean, std = (np.asarray(v) for v in s)
    np.testing.assert_allclose(float(lh.energy(s)), np.sum(0.5 * ((DATA - mean) / std) ** 2 + np.log(std)), rtol=1e-13)
    np.testing.assert_allclose(np.asarray(lh.normalized_residual(s)), (DATA - mean) / std, rtol=1e-13)
    assert jax.tree.leaves(lh) == [lh.data]


# ---------------------------------------------------------------------------------------------------
# Fisher metric = E_d[score score^T] (quadrature), closed forms, transformation, square root
# ---------------------------------------------------------------------------------------------------
@jax.jit
def _score(lh_one, d, loc, scale):
    """``dH/d(mean, std)`` at ``(loc, scale)`` of the one-datum likelihood ``lh_one`` with its datum set to ``d``."""
    lh = lh_one._replaced(data=jnp.reshape(d, (1,)))
    gm, gs = jax.grad(lh.energy)((jnp.reshape(loc, (1,)), jnp.reshape(scale, (1,))))
    return jnp.concatenate([gm, gs])


def _t_pdf(x, dof):
    """Standard Student-t density (``scipy.stats.t.pdf`` costs ~0.5 ms a call inside ``quad``)."""
    c = math.lgamma((dof + 1) / 2) - math.lgamma(dof / 2) - 0.5 * math.log(dof * math.pi)
    return math.exp(c - (dof + 1) / 2 * math.log1p(x * x / dof))


def _norm_pdf(x):
    return math.exp(-0.5 * x * x) / math.sqrt(2 * math.pi)


def _expected_score_outer(lh_one, pdf, loc, scale):
    """``E[g g^T]`` with ``g = dH/d(mean, std)`` at ``(loc, scale)`` of one datum ``d ~ pdf``, by quadrature.

    ``g`` comes from ``jax.grad`` of the likelihood's energy; ``d = loc + scale * x``, ``x ~ pdf``.
    """

    @functools.cache
    def g(x):
        return np.asarray(_score(lh_one, loc + scale * x, loc, scale))

    def integral(fn):
        val, err = si.quad(fn, -np.inf, np.inf, epsabs=1e-13, epsrel=1e-12, limit=400)
        assert err < 1e-9
        return val

    np.testing.assert_allclose(integral(pdf), 1.0, rtol=1e-11)
    out = np.empty((2, 2))
    for i in range(2):
        for j in range(i, 2):
            out[i, j] = out[j, i] = integral(lambda x, i=i, j=j: pdf(x) * g(x)[i] * g(x)[j])
    return out


@pytest.mark.parametrize("kind", ["student_t", "gauss"])
def test_fisher_metric_is_expected_score_outer_product(kind):
    xs = np.linspace(-30.0, 30.0, 61)
    for loc, scale, dof in ((0.3, 0.7, 3.5), (-1.2, 2.0, 1.0), (0.0, 0.25, 12.0)):
        if kind == "student_t":
            lh_one = VariableCovarianceStudentT(np.zeros(1), dof)
            pdf = functools.partial(_t_pdf, dof=dof)
            np.testing.assert_allclose([pdf(x) for x in xs], st.t.pdf(xs, df=dof), rtol=1e-13, atol=0)
            expected = np.diag([(dof + 1) / ((dof + 3) * scale**2), 2 * dof / ((dof + 3) * scale**2)])
        else:
            lh_one = VariableCovarianceGaussian(np.zeros(1))
            pdf = _norm_pdf
            np.testing.assert_allclose([pdf(x) for x in xs], st.norm.pdf(xs), rtol=1e-13, atol=0)
            expected = np.diag([1 / scale**2, 2 / scale**2])
        got = _expected_score_outer(lh_one, pdf, loc, scale)
        np.testing.assert_allclose(got, expected, rtol=1e-9, atol=1e-9 * expected.max())
        s = (jnp.array([loc]), jnp.array([scale]))
        np.testing.assert_allclose(dense(lambda t: lh_one.metric(s, t), lh_one.domain), got, rtol=1e-9, atol=1e-9)
        if kind == "gauss":
            break  # no dof: one (loc, scale) is enough (the Fisher matrix scales with 1/scale^2 exactly)


@pytest.mark.parametrize("kind", ["student_t", "gauss"])
def test_metric_closed_form_signal_and_latent_space(kind):
    lh = VariableCovarianceStudentT(DATA, DOF_ARR) if kind == "student_t" else VariableCovarianceGaussian(DATA)
    fisher = functools.partial(fisher_st, dof=DOF_ARR) if kind == "student_t" else fisher_gauss
    amended = lh.amend(VC_MODEL)

    @jax.jit
    def compute(lh, amended, xi):
        s = VC_MODEL(xi)
        return (
            s,
            dense_traced(functools.partial(lh.metric, s), lh.domain),
            dense_traced(lh.metric_operator(s), lh.domain),
            jax.jacfwd(lambda x: jnp.concatenate(vc_signal(x)))(xi),
            dense_traced(functools.partial(amended.metric, xi), DOM),
            dense_traced(amended.sampling_operators(xi)[1], DOM),
        )

    for xi in (XI1, XI2):
        s, m_s, op_s, j, m_xi, op_xi = (jax.tree.map(np.asarray, v) for v in compute(lh, amended, xi))
        f = fisher(*s)
        np.testing.assert_allclose(m_s, f, rtol=1e-13, atol=0)
        np.testing.assert_allclose(op_s, f, rtol=1e-13, atol=0)
        expected = j.T @ f @ j
        np.testing.assert_allclose(m_xi, expected, rtol=1e-12, atol=1e-12 * np.abs(expected).max())
        np.testing.assert_allclose(op_xi, expected, rtol=1e-12, atol=1e-12 * np.abs(expected).max())


def _gram(transformation, s):
    """``J^T J`` of ``transformation`` (on the flat real ``s``) at ``s``: the metric it pulls back."""
    flat, unravel = ravel_pytree(s)
    jt = np.asarray(jax.jacfwd(lambda v: ravel_pytree(transformation(unravel(v)))[0])(flat))
    return jt.T @ jt


DOF_EXP = np.array([0.5, 1.0, 2.5, 30.0])  # below 1 (atan coordinates), at 1, heavy and light tails


def _location_scale(kind, data):
    """``(likelihood, density)``: the likelihood on ``data`` and the density of ``delta = (mean - d)/std``."""
    if kind == "student_t":
        return VariableCovarianceStudentT(data, DOF_EXP), lambda delta: st.t.pdf(delta, DOF_EXP)
    return VariableCovarianceGaussian(data), lambda delta: np.full(M, st.norm.pdf(delta))


def _gram_entries(lh, data, std):
    """``mean -> (G_mm, G_ms, G_ss)`` per datum: the Gram matrix of the coordinates' Jacobian at ``(mean, std)``
    on flat ``(mean, std)`` (each datum's map depends on its own pair only)."""

    @jax.jit
    def at(mean):
        s = (mean, jnp.asarray(std))
        one, zero = jnp.ones(M), jnp.zeros(M)
        _, (dm_m, dm_s) = jax.jvp(lh.transformation, (s,), ((one, zero),))
        _, (ds_m, ds_s) = jax.jvp(lh.transformation, (s,), ((zero, one),))
        return jnp.stack([dm_m**2 + dm_s**2, dm_m * ds_m + dm_s * ds_s, ds_m**2 + ds_s**2])

    return at


def _data_and_scales():
    """Data and noise scales with ``|mean| >> std``, ``|mean| << std`` and extreme scales."""
    rng = np.random.default_rng(3)
    std = np.exp(rng.normal(size=M))
    return [
        (DATA, std),
        (1e3 * std * rng.choice([-1, 1], M), std),
        (1e-3 * std * rng.normal(size=M), std),
        (rng.normal(size=M) * 1e4, np.full(M, 1e-3)),
        (rng.normal(size=M) * 1e-4, np.full(M, 1e3)),
    ]


@pytest.mark.parametrize("kind", ["student_t", "gauss"])
def test_geovi_coordinates_reproduce_the_metric_in_expectation_over_the_data(kind):
    """``E_d[J_T^T J_T] = F`` at every ``(mean, std)``, the expectation over data drawn there.

    The Fisher geometry of a location-scale family is a hyperbolic plane: no map is exact on a
    neighbourhood, so the coordinates match the metric on average over the data (quadrature to
    1e-8 relative); the Gram matrix itself depends on ``(mean - d)/std`` alone, so ``|mean| >> std``
    is no harder than ``|mean| << std``.
    """
    for data, std in _data_and_scales():
        lh, density = _location_scale(kind, data)
        at = _gram_entries(lh, data, std)
        entries = jax.jit(lambda delta: at(jnp.asarray(data) + jnp.asarray(std) * delta))
        expected, _ = si.quad_vec(
            lambda delta: np.asarray(entries(delta)) * density(delta), -np.inf, np.inf, epsabs=0, epsrel=1e-10
        )
        f = np.diag(fisher_st(None, std, DOF_EXP) if kind == "student_t" else fisher_gauss(None, std))
        np.testing.assert_allclose(expected[0], f[:M], rtol=1e-8)
        np.testing.assert_allclose(expected[2], f[M:], rtol=1e-8)
        np.testing.assert_allclose(expected[1] / np.sqrt(f[:M] * f[M:]), 0.0, atol=1e-8)


def test_gaussian_geovi_coordinates_have_the_stated_gram_matrix():
    """``[[1/std^2, -r/std^2], [-r/std^2, (r^2 + 1)/std^2]]`` on ``(mean, std)``, ``r = (mean - d)/std``.

    No cross term where the model fits the data; the residuals ``r = +-1`` average it to ``F`` (to the digits
    that ``d + std r`` keeps where ``|d| >> std``).
    """
    for data, std in _data_and_scales():
        at = _gram_entries(VariableCovarianceGaussian(data), data, std)
        pm = []
        for delta in (0.0, 1.0, -1.0, 2.5):
            mean = data + std * delta  # on the host: the same rounding on every JAX
            r = (mean - data) / std
            got = np.asarray(at(jnp.asarray(mean)))
            want = np.stack([np.ones(M), -r, r**2 + 1]) / std**2
            np.testing.assert_allclose(got * std**2, want * std**2, rtol=1e-13, atol=1e-15)
            if abs(delta) == 1:
                pm.append(got)
        f = np.diag(fisher_gauss(None, std))
        np.testing.assert_allclose(
            (pm[0] + pm[1]) / 2 * std**2, np.stack([f[:M], np.zeros(M), f[M:]]) * std**2, rtol=1e-8, atol=1e-8
        )


@pytest.mark.parametrize("kind", ["student_t", "gauss"])
def test_left_sqrt_metric_is_the_square_root(kind):
    lh = VariableCovarianceStudentT(DATA, DOF_ARR) if kind == "student_t" else VariableCovarianceGaussian(DATA)
    amended = lh.amend(VC_MODEL)
    rng = np.random.default_rng(5)
    s = VC_MODEL(XI1)

    def checks(space, x, tangent_dom, e, t):
        lsm = functools.partial(space.left_sqrt_metric, x)
        (lt_t,) = jax.linear_transpose(lsm, e)(t)
        return (
            (tm.vdot(lsm(e), t), tm.vdot(e, lt_t)),  # dot test <L e, t> == <e, L^T t>
            (tm.vdot(t, space.metric(x, t)), tm.vdot(lt_t, lt_t)),  # <t, F t> == |L^T t|^2
            dense_traced(lsm, space.lsm_tangents_shape),
            dense_traced(functools.partial(space.metric, x), tangent_dom),
        )

    @jax.jit
    def compute(lh, amended, s, es, ts):
        return (
            checks(lh, s, lh.domain, es[0], ts[0]),
            checks(amended, XI1, DOM, es[1], ts[1]),
            jax.jacfwd(lambda x: jnp.concatenate(vc_signal(x)))(XI1),
            # the amended square root from sampling_operators (one model linearization shared with the metric)
            dense_traced(amended.sampling_operators(XI1)[0], amended.lsm_tangents_shape),
        )

    es = [jax.tree.map(lambda d: jnp.asarray(rng.normal(size=d.shape)), lh.lsm_tangents_shape) for _ in range(2)]
    ts = [jax.tree.map(lambda d: jnp.asarray(rng.normal(size=d.shape)), dom) for dom in (lh.domain, DOM)]
    signal, latent, j, big_l_op = jax.tree.map(np.asarray, compute(lh, amended, s, es, ts))
    for dot, norm, big_l, m in (signal, latent):
        np.testing.assert_allclose(*dot, rtol=1e-12)
        np.testing.assert_allclose(*norm, rtol=1e-12)
        np.testing.assert_allclose(big_l @ big_l.T, m, rtol=1e-12, atol=1e-12 * np.abs(m).max())
    # the amended square root is J^T L
    ls = signal[2]
    np.testing.assert_allclose(latent[2], j.T @ ls, rtol=1e-12, atol=1e-13)
    np.testing.assert_allclose(big_l_op, j.T @ ls, rtol=1e-12, atol=1e-13)


def test_student_t_normalized_residual_and_leaves():
    lh = VariableCovarianceStudentT(DATA, DOF_ARR)
    s = VC_MODEL(XI2)
    mean, std = (np.asarray(v) for v in s)
    np.testing.assert_allclose(np.asarray(lh.normalized_residual(s)), (DATA - mean) / std, rtol=1e-13)
    np.testing.assert_allclose(np.asarray(lh.amend(VC_MODEL).normalized_residual(XI2)), (DATA - mean) / std, rtol=1e-13)
    leaves = jax.tree.leaves(lh)
    assert any(np.array_equal(x, DATA) for x in leaves) and any(np.array_equal(x, DOF_ARR) for x in leaves)
    scalar = VariableCovarianceStudentT(DATA, 3.0)
    np.testing.assert_array_equal(np.asarray(scalar.dof), np.full(M, 3.0))  # broadcast per datum
    fp = scalar.data_leaves["VariableCovarianceStudentT"]
    assert set(fp) == {"data", "dof"}
    # float32 data: domain, dof and energy stay float32
    lh32 = VariableCovarianceStudentT(DATA.astype(np.float32), 3.0)
    assert all(d.dtype == jnp.float32 for d in jax.tree.leaves(lh32.domain))
    assert lh32.dof.dtype == jnp.float32
    s32 = jax.tree.map(lambda v: v.astype(jnp.float32), s)
    assert lh32.energy(s32).dtype == jnp.float32


# ---------------------------------------------------------------------------------------------------
# pytree data
# ---------------------------------------------------------------------------------------------------
TREE_DATA = {"a": RNG.normal(size=3), "b": RNG.normal(size=(2, 2)) + 1.0}
FLAT_DATA, UNRAVEL = ravel_pytree(TREE_DATA)  # keys sorted: a, then b
N_FLAT = FLAT_DATA.size
W3 = RNG.normal(size=(N_FLAT, N_LAT)) * 0.5
W4 = RNG.normal(size=(N_FLAT, N_LAT)) * 0.3


def flat_signal(xi):
    return (jnp.asarray(W3) @ xi, jnp.exp(jnp.asarray(W4) @ xi - 0.3))


def tree_signal(xi):
    mean, std = flat_signal(xi)
    return (UNRAVEL(mean), UNRAVEL(std))


@pytest.mark.parametrize("kind", ["gauss", "student_t"])
def test_pytree_data_equal_concatenated_array(kind):
    if kind == "gauss":
        lh_tree, lh_flat = VariableCovarianceGaussian(TREE_DATA), VariableCovarianceGaussian(FLAT_DATA)
    else:
        dof_tree = {"a": 2.0, "b": np.array([[1.5, 3.0], [7.0, 20.0]])}
        dof_flat = np.concatenate([np.full(3, 2.0), dof_tree["b"].ravel()])
        lh_tree = VariableCovarianceStudentT(TREE_DATA, dof_tree)
        lh_flat = VariableCovarianceStudentT(FLAT_DATA, dof_flat)
    tree_dom = jax.tree.map(lambda x: jax.ShapeDtypeStruct(x.shape, x.dtype), TREE_DATA)
    assert lh_tree.domain == (tree_dom, tree_dom) and lh_tree.lsm_tangents_shape == (tree_dom, tree_dom)
    a_tree = lh_tree.amend(sv.Model(tree_signal, DOM))
    a_flat = lh_flat.amend(sv.Model(flat_signal, DOM))

    def everything(lh, amended, s, xi):
        """Energies, dense metric and square root, transformation, residual; on signal and latent space."""
        return (
            lh.energy(s),
            dense_traced(functools.partial(lh.metric, s), lh.domain),
            dense_traced(functools.partial(lh.left_sqrt_metric, s), lh.lsm_tangents_shape),
            ravel_pytree(lh.transformation(s))[0],
            ravel_pytree(lh.normalized_residual(s))[0],
            amended.energy(xi),
            jax.grad(amended.energy)(xi),
            dense_traced(functools.partial(amended.metric, xi), DOM),
        )

    @jax.jit
    def both(xi):
        return everything(lh_tree, a_tree, tree_signal(xi), xi), everything(lh_flat, a_flat, flat_signal(xi), xi)

    for xi in (XI1, XI2):
        got, want = both(xi)
        for a, b in zip(got, want, strict=True):
            np.testing.assert_allclose(np.asarray(a), np.asarray(b), rtol=1e-13, atol=1e-14 * np.abs(b).max())


def test_pytree_model_must_match_the_data_structure():
    lh = VariableCovarianceGaussian(TREE_DATA)
    with pytest.raises(ValueError, match="model"):  # (mean, std) as flat arrays
        lh.amend(sv.Model(flat_signal, DOM))
    with pytest.raises(ValueError, match="model"):  # one tree instead of the pair
        lh.amend(sv.Model(lambda xi: tree_signal(xi)[0], DOM))
    with pytest.raises(ValueError, match="model"):  # a list instead of the tuple
        lh.amend(sv.Model(lambda xi: list(tree_signal(xi)), DOM))
    with pytest.raises(ValueError, match="model"):  # a key missing
        lh.amend(sv.Model(lambda xi: tuple({"a": v["a"]} for v in tree_signal(xi)), DOM))


# ---------------------------------------------------------------------------------------------------
# blocked data (amend(model, data_blocks=B)): as unblocked
# ---------------------------------------------------------------------------------------------------
N_BLK = 8
X_IN = np.linspace(-1.0, 1.0, N_BLK)
BLK_DOM = jax.ShapeDtypeStruct((4,), jnp.float64)


def _blk_call(xi, x):
    return (xi[0] + xi[1] * x, jnp.exp(0.4 * xi[2] + 0.3 * xi[3] * x - 0.5))


def _blk_tree_call(xi, x):
    m, s = _blk_call(xi, x)
    return ({"u": m, "v": jnp.stack([m, 2 * m], axis=1)}, {"u": s, "v": jnp.stack([s, 0.5 * s], axis=1)})


@pytest.mark.parametrize("kind", ["student_t", "gauss_tree"])
def test_blocked_equals_unblocked(kind):
    """Energy, gradient, metric, metric sample, geoVI map and chi^2 of the blocked likelihood as unblocked.

    The pytree case checks energy, gradient and metric: the rest is the same generic code on the blocks'
    leaves, and every blocked operator is a compiled per-block loop of its own (the metric sample's random
    draws are the most expensive to compile).
    """
    rng = np.random.default_rng(11)
    if kind == "student_t":
        call = _blk_call
        lh = VariableCovarianceStudentT(rng.standard_t(3.0, size=N_BLK), np.linspace(1.0, 5.0, N_BLK))
    else:
        call = _blk_tree_call
        lh = VariableCovarianceGaussian({"u": rng.normal(size=N_BLK), "v": rng.normal(size=(N_BLK, 2))})
    all_ops = kind == "student_t"
    model = sv.Model(call, BLK_DOM, data_inputs=X_IN)
    full, blocked = lh.amend(model), lh.amend(model, data_blocks=2)
    assert isinstance(blocked, sv.BlockedLikelihood)
    x = jnp.asarray([0.2, -0.4, 0.3, 0.5])
    t = jnp.asarray([1.0, 0.5, -0.7, 0.2])
    key = jax.random.PRNGKey(6)

    @jax.jit
    def both(blocked, full, x, t):
        got = [blocked.energy_and_grad(x), blocked.metric_operator(x)(t)]
        want = [(full.energy(x), jax.grad(full.energy)(x)), full.metric_operator(x)(t)]
        if all_ops:
            e1 = tm.random_like(key, full.lsm_tangents_shape)  # the unblocked draw, cut into the blocks
            geovi_t = full.transformation_at(x)
            xbar, vjp = jax.vjp(geovi_t, x)
            got += [blocked.left_sqrt_metric(x, key), blocked.geovi_operators(x)[0](t), blocked.chi2_sum(x)[0]]
            want += [
                full.left_sqrt_metric(x, e1),
                tm.linear_adjoint(vjp)(tm.sub(geovi_t(tm.add(x, t)), xbar)),
                sum(jnp.sum(r**2) for r in jax.tree.leaves(full.normalized_residual(x))),
            ]
        return got, want

    # the reduced chi^2 divides by the residual's entries: the data's, not the signal's (mean, std) pairs
    n_res = sum(r.size for r in jax.tree.leaves(jax.eval_shape(full.normalized_residual, x)))
    assert blocked.chi2_sum_dof == n_res == sum(d.size for d in jax.tree.leaves(lh.data))
    got, want = both(blocked, full, x, t)
    for a, b in zip(jax.tree.leaves(got), jax.tree.leaves(want), strict=True):
        np.testing.assert_allclose(np.asarray(a), np.asarray(b), rtol=1e-12, atol=1e-12 * np.abs(np.asarray(b)).max())


# ---------------------------------------------------------------------------------------------------
# inference: the noise level of data with outliers
# ---------------------------------------------------------------------------------------------------
def test_optimize_kl_recovers_the_noise_level_despite_outliers():
    # 1000 data: the standard error of the scale is ~3 % (sqrt((dof + 3) / (2 dof n))), the 10 % band ~3 of them
    n, dof, mean_true, std_true = 1000, 2.5, 0.3, 0.5
    d = mean_true + std_true * np.random.default_rng(7).standard_t(dof, size=n)
    # outliers: a Gaussian fit's std would be far off, many points beyond 5 scales
    assert np.std(d) > 1.4 * std_true and np.sum(np.abs(d - mean_true) > 5 * std_true) >= 10
    dom = {"m": jax.ShapeDtypeStruct((), jnp.float64), "s": jax.ShapeDtypeStruct((), jnp.float64)}
    # std = exp(xi_s): the prior's median std is 1, twice the truth
    model = sv.Model(lambda xi: (jnp.full(n, xi["m"]), jnp.full(n, jnp.exp(xi["s"]))), dom)
    lh = VariableCovarianceStudentT(d, dof).amend(model)
    samples, state = sv.optimize_kl(
        lh,
        {"m": jnp.zeros(()), "s": jnp.zeros(())},
        key=jax.random.PRNGKey(0),
        n_total_iterations=4,
        n_samples=2,
        sample_mode="nonlinear_resample",
        linear_sampling=sv.CGConfig(tol=1e-8, maxiter=50),
        nonlinear_update=sv.NewtonCGConfig(xtol=1e-8, maxiter=10),
        kl_minimization=sv.NewtonCGConfig(xtol=1e-8, maxiter=20),
    )
    assert state.nit == 4 and len(samples) == 4
    std_est = float(samples.mean(lambda x: jnp.exp(x["s"])))
    mean_est = float(samples.mean(lambda x: x["m"]))
    assert abs(std_est / std_true - 1) < 0.1, std_est
    assert abs(mean_est - mean_true) < 0.1, mean_est
    # the maximum-likelihood scale of the same data, for reference: the posterior sits next to it
    loc_ml, scale_ml = st.t.fit(d, fdf=dof)[1:]
    assert abs(std_est / scale_ml - 1) < 0.05 and abs(mean_est - loc_ml) < 0.05


# ---------------------------------------------------------------------------------------------------
# bad inputs
# ---------------------------------------------------------------------------------------------------
BAD = [
    ("st complex", lambda: VariableCovarianceStudentT(np.ones(2) * 1j, 3.0), TypeError, "real"),
    ("st nan", lambda: VariableCovarianceStudentT(np.array([0.0, np.nan]), 3.0), ValueError, "data"),
    ("st empty", lambda: VariableCovarianceStudentT(np.ones(0), 3.0), ValueError, "data"),
    ("st strings", lambda: VariableCovarianceStudentT(np.array(["a"]), 3.0), TypeError, "data"),
    ("st zero dof", lambda: VariableCovarianceStudentT(np.ones(3), 0.0), ValueError, "dof"),
    ("st negative dof", lambda: VariableCovarianceStudentT(np.ones(3), np.array([1.0, -2.0, 1.0])), ValueError, "dof"),
    ("st inf dof", lambda: VariableCovarianceStudentT(np.ones(3), np.inf), ValueError, "dof"),
    ("st nan dof", lambda: VariableCovarianceStudentT(np.ones(3), np.nan), ValueError, "dof"),
    ("st bool dof", lambda: VariableCovarianceStudentT(np.ones(3), True), TypeError, "dof"),
    ("st None dof", lambda: VariableCovarianceStudentT(np.ones(3), None), TypeError, "dof"),
    ("st string dof", lambda: VariableCovarianceStudentT(np.ones(3), "3"), TypeError, "dof"),
    ("st dof shape", lambda: VariableCovarianceStudentT(np.ones(3), np.ones(2)), ValueError, "dof"),
    ("st dof tree", lambda: VariableCovarianceStudentT({"a": np.ones(3)}, {"b": 1.0}), ValueError, "dof"),
    ("st missing dof", lambda: VariableCovarianceStudentT(np.ones(3)), TypeError, "dof"),  # pyright: ignore[reportCallIssue]
    ("vcg complex", lambda: VariableCovarianceGaussian({"a": np.ones(2), "b": np.ones(2) * 1j}), TypeError, "real"),
    ("vcg inf", lambda: VariableCovarianceGaussian({"a": np.array([0.0, np.inf])}), ValueError, "data"),
    ("vcg empty tree", lambda: VariableCovarianceGaussian({}), ValueError, "data"),
]


@pytest.mark.parametrize("make,exc,match", [b[1:] for b in BAD], ids=[b[0] for b in BAD])
def test_bad_input(make, exc, match):
    with pytest.raises(exc, match=match):
        make()


def test_amend_rejects_a_model_without_std():
    with pytest.raises(ValueError, match="model"):
        VariableCovarianceStudentT(DATA, 3.0).amend(sv.Model(lambda xi: jnp.asarray(W) @ xi, DOM))
    with pytest.raises(TypeError, match="dtype"):  # a float32 model on float64 data: no implicit cast
        VariableCovarianceStudentT(DATA, 3.0).amend(
            sv.Model(lambda xi: tuple(v.astype(jnp.float32) for v in vc_signal(xi)), DOM)
        )


def test_a_sum_forwards_its_parts_geovi_coordinates():
    """``a + b``: each part's coordinates on its own data; the Gram matrices add, exactly."""
    s_bar = (jnp.asarray(DATA + 50.0), jnp.full(M, 0.1))  # |mean - d| >> std
    a, b = VariableCovarianceGaussian(DATA), VariableCovarianceStudentT(DATA, DOF_ARR)
    g = _gram((a + b).transformation_at(s_bar), s_bar)
    want = _gram(a.transformation, s_bar) + _gram(b.transformation, s_bar)
    np.testing.assert_allclose(g, want, rtol=1e-13, atol=1e-13 * np.abs(want).max())
