"""Hostile inputs to the model pieces (priors, shapes, latents, keys, grids) and the plot helpers.

Each bad input is refused at construction (or at the call, before any work) with a
``TypeError`` / ``ValueError`` naming the argument; the inputs at the edges of the
accepted ranges still work.
"""

import math

import jax
import jax.numpy as jnp
import matplotlib

matplotlib.use("Agg")  # tests only: the library never selects a backend

import matplotlib.pyplot as plt
import numpy as np
import pytest
import scipy.special as ss

import shardvi as sv
from shardvi import plot
from shardvi.models import (
    InvGamma,
    LogNormal,
    Normal,
    NUFFTResponse,
    RegularGrid,
    Sampling,
    gamma_quantile_from_normal,
    nufft2d_type1,
    prior_model,
)

F64 = jnp.float64
XI = jnp.linspace(-8.0, 8.0, 33)


@pytest.fixture(autouse=True)
def _close_figures():
    yield
    plt.close("all")


def _field(shape=(8,)):
    cfm = sv.CorrelatedFieldMaker("s")
    cfm.set_amplitude_total_offset(0.0, (1.0, 0.1))
    return cfm.add_fluctuations(shape, 1.0, (1.0, 0.1), (-2.0, 0.1)).finalize()


# ----------------------------------------------------------------------------- InvGamma: extreme shapes
@pytest.mark.parametrize("a", [1e16, 1e14, 2e5, 1e-300, 5e-4])
def test_inv_gamma_shape_outside_the_accurate_range_is_refused(a):
    with pytest.raises(ValueError, match=r"\ba must be in \[0\.001, 100000\]"):
        InvGamma(a, 1.0)
    with pytest.raises(ValueError, match=r"\ba must be in \[0\.001, 100000\]"):
        gamma_quantile_from_normal(a, 0.0)


def test_inv_gamma_values_beyond_float64_are_refused_naming_a_and_scale():
    with pytest.raises(ValueError, match=r"InvGamma\(a=0\.03, scale=1\.0\).*increase a or decrease scale"):
        InvGamma(0.03, 1.0)  # values up to about exp(35 / a) = exp(1167) at xi = 8
    with pytest.raises(ValueError, match=r"InvGamma\(a=1\.0, scale=1e-306\).*increase scale"):
        InvGamma(1.0, 1e-306)  # values down to about 1e-306 / 85 at xi = -8


def test_inv_gamma_at_the_edges_of_the_range_is_accurate():
    xi = np.linspace(-8.0, 8.0, 65)
    # the largest shape: the quantile function against scipy, each tail from its own side
    a = 1e5
    got = np.asarray(InvGamma(a, 2.0)(jnp.asarray(xi)))
    g = np.where(xi > 0, ss.gammaincinv(a, ss.ndtr(-xi)), ss.gammainccinv(a, ss.ndtr(xi)))
    np.testing.assert_allclose(got, 2.0 / g, rtol=1e-10)
    # a small shape with a small scale: 1 / g overflows, scale / g does not (computed in log space)
    ig = InvGamma(0.03, 1e-250)
    v = np.asarray(ig(jnp.asarray(xi)))
    assert np.all(np.isfinite(v)) and np.all(v > 0) and np.all(np.diff(v) > 0)
    log_g = np.asarray(gamma_quantile_from_normal(0.03, jnp.asarray(-xi), log=True))
    np.testing.assert_allclose(np.log(v), math.log(1e-250) - log_g, rtol=1e-13)
    # the smallest shape of the gamma quantile: log g finite where g itself underflows
    log_g = np.asarray(gamma_quantile_from_normal(1e-3, jnp.asarray(xi), log=True))
    assert np.all(np.isfinite(log_g)) and np.all(np.diff(log_g) > 0)
    assert np.all(np.isfinite(jax.vmap(jax.grad(InvGamma(0.05, 3.0).__call__))(XI)))


# ----------------------------------------------------------------------------- shapes must be integers
@pytest.mark.parametrize(
    "make",
    [
        lambda: Sampling((np.array([0, 3]),), (8.5,)),
        lambda: Sampling((np.array([0, 3]),), (8.0,)),
        lambda: prior_model(Normal(0.0, 1.0), (2.5,)),
        lambda: prior_model(Normal(0.0, 1.0), (True, 2)),
        lambda: prior_model(Normal(0.0, 1.0), 2.0),
        lambda: prior_model(Normal(0.0, 1.0), "3"),
        lambda: Normal(0.0, 1.0).domain((np.float64(3.0),)),
        lambda: RegularGrid((8.5,)),
        lambda: sv.CorrelatedFieldMaker("s").add_fluctuations((8.0, 8), 1.0, 1.0, -2.0),
        lambda: NUFFTResponse(np.ones(4), np.ones(4), (4.5, 4), 1e-5),
        lambda: nufft2d_type1(jnp.ones(3, jnp.complex128), jnp.ones(3), jnp.ones(3), (4, 4.0)),
    ],
)
def test_non_integer_shapes_are_refused(make):
    with pytest.raises(TypeError, match=r"(shape|image_shape) must be an int or a sequence of ints"):
        make()


def test_negative_shape_entries_are_refused():
    with pytest.raises(ValueError, match=r"shape entries must be >= 0, got \(3, -1\)"):
        prior_model(Normal(0.0, 1.0), (3, -1))


def test_numpy_integer_shapes_are_accepted():
    m = prior_model(Normal(0.0, 1.0), (np.int64(3), np.int32(2)))
    assert m.domain == {"x": jax.ShapeDtypeStruct((3, 2), F64)}
    assert type(m.domain["x"].shape[0]) is int
    r = Sampling((np.array([0, 3]),), np.array([8]))
    assert r.shape == (8,) and r(jnp.arange(8.0)).tolist() == [0.0, 3.0]
    assert RegularGrid(np.int64(8)).shape == (8,)
    assert NUFFTResponse(np.ones(4), np.ones(4), np.array([4, 6]), 1e-5).image_shape == (4, 6)


# ----------------------------------------------------------------------------- latent leaves without elements
def test_latent_leaves_without_elements_are_refused():
    with pytest.raises(ValueError, match=r"domain has shape \(0,\): it has no elements"):
        sv.Model(lambda x: jnp.ones(8) * jnp.sum(x), jax.ShapeDtypeStruct((0,), F64))
    domain = {"a": jax.ShapeDtypeStruct((3,), F64), "b": jax.ShapeDtypeStruct((2, 0), F64)}
    with pytest.raises(ValueError, match=r"domain\['b'\] has shape \(2, 0\): it has no elements"):
        sv.Model(lambda x: x["a"], domain)
    with pytest.raises(ValueError, match=r"shape \(0,\) has no elements"):
        prior_model(Normal(0.0, 1.0), (0,))
    with pytest.raises(ValueError, match=r"shape \(4, 0\) has no elements"):
        prior_model(Normal(0.0, 1.0), (4, 0))
    with pytest.raises(ValueError, match=r"domain has shape \(0,\): it has no elements"):  # a likelihood's domain
        sv.Likelihood(lambda s: jnp.sum(s**2), domain=jax.ShapeDtypeStruct((0,), F64))


def test_smallest_latents_still_work():
    for shape in ((), (1,), 1):
        m = prior_model(Normal(1.0, 2.0), shape)
        x = m.init(jax.random.PRNGKey(0))
        np.testing.assert_allclose(m(x), 1.0 + 2.0 * x["x"])


# ----------------------------------------------------------------------------- Model.init(key)
@pytest.mark.parametrize(
    "key, match",
    [
        (0, r"key must be a jax.random key .* got int"),
        (None, r"key is required"),
        (np.zeros(2, np.float32), r"key must be one threefry2x32 jax.random key .* float32"),
        (jax.random.split(jax.random.PRNGKey(0), 2), r"key must be one .*\(a batch of keys: pass one key\)"),
        (jax.random.split(jax.random.key(0), 2), r"key must be one key, got a batch of shape \(2,\)"),
    ],
)
def test_model_init_checks_its_key(key, match):
    m = sv.Model(lambda x: x, jax.ShapeDtypeStruct((4,), F64))
    with pytest.raises(TypeError, match=match):
        m.init(key)


def test_model_init_with_good_keys_under_jit_and_vmap():
    m = sv.Model(lambda x: x, {"a": jax.ShapeDtypeStruct((4,), F64), "b": jax.ShapeDtypeStruct((), F64)})
    x = m.init(jax.random.PRNGKey(3))
    typed = m.init(jax.random.key(3))
    np.testing.assert_array_equal(x["a"], typed["a"])
    np.testing.assert_array_equal(jax.jit(m.init)(jax.random.PRNGKey(3))["a"], x["a"])
    batch = jax.vmap(m.init)(jax.random.split(jax.random.PRNGKey(3), 5))
    assert batch["a"].shape == (5, 4) and batch["b"].shape == (5,)


# ----------------------------------------------------------------------------- grid distances
def test_grid_distances_whose_derived_scales_overflow_are_refused():
    cfm = sv.CorrelatedFieldMaker("s")
    cfm.set_amplitude_total_offset(0.0, (0.1, 0.05))
    with pytest.raises(ValueError, match=r"distances \(1e-200,\) .* give squared harmonic distance inf"):
        cfm.add_fluctuations((8,), 1e-200, fluctuations=(0.6, 0.1), loglogavgslope=(-2.0, 0.3))
    with pytest.raises(ValueError, match=r"distances \(1e\+200,\) .* give squared harmonic distance 0"):
        RegularGrid((8,), 1e200)
    with pytest.raises(ValueError, match=r"distances .* give .*largest squared \|k\| inf"):
        RegularGrid((1024,), 1e-156)  # dk^2 = 9.5e305 fits, (512 dk)^2 = 2.5e311 does not


def test_grid_distances_at_the_edge_still_work():
    g = RegularGrid((8,), 1e-150)  # dk^2 = 1.6e298, largest |k|^2 = 2.5e299
    assert np.all(np.isfinite(g.mode_lengths)) and np.all(np.isfinite(g.log_mode_lengths))
    np.testing.assert_allclose(g.mode_lengths, np.arange(5) / 8e-150, rtol=1e-15)


# ----------------------------------------------------------------------------- LogNormal (mean, std)
@pytest.mark.parametrize(
    "mean, std, match",
    [
        (1e-200, 1.0, r"LogNormal\(mean=1e-200, std=1\.0\): the relative variance \(std / mean\)\^2"),
        (1.0, 1e200, r"LogNormal\(mean=1\.0, std=1e\+200\): the relative variance"),
        (1e-305, 1e-305, r"LogNormal\(mean=1e-305, std=1e-305\): .* outside the float64 range"),
        (1e300, 1e302, r"LogNormal\(mean=1e\+300, std=1e\+302\): .* outside the float64 range"),
    ],
)
def test_lognormal_parameters_beyond_float64_are_refused(mean, std, match):
    with pytest.raises(ValueError, match=match):
        LogNormal(mean, std)


def test_lognormal_pairs_of_the_correlated_field_are_checked():
    cfm = sv.CorrelatedFieldMaker("s")
    with pytest.raises(ValueError, match=r"^offset_std: LogNormal\(mean=1\.0, std=1e\+200\)"):
        cfm.set_amplitude_total_offset(0.0, (1.0, 1e200))
    cfm.set_amplitude_total_offset(0.0, (1.0, 0.1))
    with pytest.raises(ValueError, match=r"^fluctuations: LogNormal\(mean=1e-200, std=1\.0\)"):
        cfm.add_fluctuations((8,), 1.0, fluctuations=(1e-200, 1.0), loglogavgslope=(-2.0, 0.3))
    with pytest.raises(ValueError, match=r"^cutoff: LogNormal"):
        cfm.add_fluctuations_matern((8,), 1.0, scale=1.0, cutoff=(1e-300, 1.0), loglogslope=-3.0)


def test_lognormal_at_the_edges_still_works():
    for p in (LogNormal(1e-300, 1e-300), LogNormal(1.0, 1e150), LogNormal(1e300, 1e299)):
        v, g = p(XI), jax.vmap(jax.grad(p.__call__))(XI)
        assert np.all(np.isfinite(v)) and np.all(v > 0) and np.all(np.isfinite(g)), p
    tiny = LogNormal(1.0, 1e-200)  # (std / mean)^2 underflows: sigma is std / mean, not 0
    assert tiny.sigma == 1e-200 and float(jax.grad(tiny.__call__)(0.0)) == pytest.approx(1e-200, rel=1e-12)


# ----------------------------------------------------------------------------- calls with bad inputs
def test_prior_model_accepts_an_int_shape():
    m = prior_model(Normal(0.0, 1.0), 3)
    assert m.domain == {"x": jax.ShapeDtypeStruct((3,), F64)} and m.target.shape == (3,)


@pytest.mark.parametrize("bad", ["a", None, object(), [1.0, "b"], jnp.ones(2, jnp.complex128), np.ones(2, bool)])
def test_prior_call_with_a_non_real_input_names_xi(bad):
    with pytest.raises(TypeError, match=r"^xi must be a real number or array"):
        Normal(0.0, 1.0)(bad)


def test_correlated_field_checks_its_latent_shapes():
    f = _field()
    x = f.init(jax.random.PRNGKey(0))
    bad = dict(x, sxi=jnp.zeros(9))
    with pytest.raises(ValueError, match=r"xi\['sxi'\] has shape \(9,\), expected \(8,\)"):
        f(bad)
    with pytest.raises(ValueError, match=r"xi\['sxi'\] has shape \(9,\), expected \(8,\)"):
        f.power_spectrum(bad)
    with pytest.raises(ValueError, match=r"xi\['sfluctuations'\] has shape \(1,\), expected \(\)"):
        f.fluctuations(dict(x, sfluctuations=jnp.zeros(1)))
    with pytest.raises(ValueError, match=r"xi has no entry 'szeromode'"):
        f({k: v for k, v in x.items() if k != "szeromode"})
    with pytest.raises(TypeError, match=r"xi must be a dict of latent arrays"):
        f(x["sxi"])
    with pytest.raises(TypeError, match=r"xi\['sxi'\] must be a real array"):
        f(dict(x, sxi="abc"))
    with pytest.raises(ValueError, match=r"xi\['sxi'\] has shape \(3, 8\), expected \(8,\).*jax.vmap"):
        f(dict(x, sxi=jnp.zeros((3, 8))))  # a batch without vmap


def test_correlated_field_still_works_under_jit_vmap_grad():
    f = _field()
    x = f.init(jax.random.PRNGKey(0))
    ref = f(x)
    np.testing.assert_allclose(jax.jit(f.__call__)(x), ref, rtol=1e-14)
    batch = jax.vmap(f.init)(jax.random.split(jax.random.PRNGKey(1), 3))
    out = jax.vmap(f)(batch)
    assert out.shape == (3, 8)
    np.testing.assert_allclose(out[0], f(jax.tree_util.tree_map(lambda v: v[0], batch)), rtol=1e-14)
    assert jax.vmap(f.power_spectrum)(batch).shape == (3, len(f.k_lengths[0]))
    grad = jax.grad(lambda z: jnp.sum(f(z) ** 2))(x)
    assert all(np.all(np.isfinite(v)) for v in jax.tree_util.tree_leaves(grad))
    np.testing.assert_array_equal(f(dict(x, other=jnp.zeros(5))), ref)  # further entries are ignored
    assert jax.eval_shape(f, f.domain).shape == (8,)


# ----------------------------------------------------------------------------- plot helpers
def test_plot_reconstruction_refuses_mismatched_maps():
    with pytest.raises(ValueError, match=r"std has shape \(5, 5\), expected \(4, 4\) \(the shape of mean\)"):
        plot.plot_reconstruction(np.ones((4, 4)), np.ones((5, 5)))
    with pytest.raises(ValueError, match=r"truth has shape \(7,\), expected \(8,\)"):
        plot.plot_reconstruction(np.ones(8), np.ones(8), truth=np.ones(7))
    with pytest.raises(ValueError, match=r"data has shape \(4, 3\), expected \(4, 4\)"):
        plot.plot_reconstruction(np.ones((4, 4)), np.ones((4, 4)), data=np.ones((4, 3)))
    with pytest.raises(ValueError, match=r"data_coords has shape \(4,\), expected \(5,\)"):
        plot.plot_reconstruction(np.ones(8), np.ones(8), data=np.ones(5), data_coords=np.arange(4))
    with pytest.raises(ValueError, match=r"mean must be 1-D or 2-D"):
        plot.plot_reconstruction(np.ones((2, 2, 2)), np.ones((2, 2, 2)))
    with pytest.raises(ValueError, match=r"mean has shape \(5,\), expected \(6,\) \(the shape of one sample\)"):
        plot.plot_samples(np.ones((3, 6)), mean=np.ones(5))
    assert plot.plot_reconstruction(np.ones((4, 4)), np.ones((4, 4)), truth=np.zeros((4, 4))) is not None


def test_plot_power_spectra_refuses_mismatched_sizes():
    with pytest.raises(ValueError, match=r"spectra must have shape \(4,\) or \(n_samples, 4\) .* got \(3, 7\)"):
        plot.plot_power_spectra(np.arange(1.0, 5.0), np.ones((3, 7)))
    with pytest.raises(ValueError, match=r"truth has shape \(3,\), expected \(4,\) \(the shape of k\)"):
        plot.plot_power_spectra(np.arange(1.0, 5.0), np.ones(4), truth=np.ones(3))
    with pytest.raises(ValueError, match=r"k must be 1-D"):
        plot.plot_power_spectra(np.ones((2, 2)), np.ones(4))
    assert plot.plot_power_spectra(np.arange(0.0, 4.0), np.ones(4), truth=np.ones(4)) is not None


def test_plot_convergence_wants_iteration_reports():
    with pytest.raises(TypeError, match=r"history must be a sequence of iteration reports .*history\[0\] is a int"):
        plot.plot_convergence([1, 2, 3])
    with pytest.raises(TypeError, match=r"history must be a sequence of iteration reports .*got int"):
        plot.plot_convergence(3)
    state = sv.OptimizeVIState(0, jax.random.PRNGKey(0))
    with pytest.raises(TypeError, match=r"got OptimizeVIState \(pass state.history\)"):
        plot.plot_convergence(state)
    assert plot.plot_convergence([]) is not None
