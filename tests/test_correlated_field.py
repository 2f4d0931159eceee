"""Correlated field: grids and Hartley transforms, spectra vs realized fields, Matern, products, MGVI."""

import math

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from jax.flatten_util import ravel_pytree

import shardvi as sv
from shardvi.models import (
    CorrelatedFieldMaker,
    LogNormal,
    RegularGrid,
    harmonic_to_position,
    hartley,
    position_to_harmonic,
    power_analyze,
)
from shardvi.models.correlated_field import prefix_sum

Z = 5.0  # tolerance in standard errors (fixed keys: deterministic)
N_DRAWS = 200


def init(model, key):
    """A standard-normal latent from one flat draw (one threefry program instead of one per leaf: faster
    to compile than ``model.init``, which the engine tests cover)."""
    zeros = jax.tree.map(lambda d: jnp.zeros(d.shape, d.dtype), model.domain)
    flat, unravel = ravel_pytree(zeros)
    return unravel(jax.random.normal(key, flat.shape, flat.dtype))


def make_field(config, dtype=jnp.float64):
    cf = CorrelatedFieldMaker("cf", dtype=dtype)
    cf.set_amplitude_total_offset(0.3, (0.5, 0.1))
    full = dict(fluctuations=(0.7, 0.2), loglogavgslope=(-2.0, 0.5), flexibility=(0.8, 0.3), asperity=(0.2, 0.1))
    if config == "1d":
        cf.add_fluctuations(64, 0.5, **full, prefix="x")
    elif config == "2d":
        cf.add_fluctuations((16, 24), (1.0, 0.5), **full, prefix="x")
    elif config == "3d":
        cf.add_fluctuations((8, 8, 6), 1.0, fluctuations=(0.7, 0.2), loglogavgslope=(-3.0, 0.5), prefix="x")
    elif config == "product":
        cf.add_fluctuations((16, 16), 1.0, **full, prefix="sp")
        cf.add_fluctuations_matern(8, 0.25, scale=(0.4, 0.1), cutoff=(1.0, 0.2), loglogslope=(-4.0, 0.5), prefix="nu")
    return cf.finalize()


EXPECTED = {
    "1d": (
        (64,),
        {
            "cfzeromode": (),
            "cfxfluctuations": (),
            "cfxloglogavgslope": (),
            "cfxflexibility": (),
            "cfxasperity": (),
            "cfxspectrum": (2, 31),
            "cfxi": (64,),
        },
    ),
    "2d": (
        (16, 24),
        {
            "cfzeromode": (),
            "cfxfluctuations": (),
            "cfxloglogavgslope": (),
            "cfxflexibility": (),
            "cfxasperity": (),
            "cfxspectrum": (2, None),
            "cfxi": (16, 24),
        },
    ),
    "3d": ((8, 8, 6), {"cfzeromode": (), "cfxfluctuations": (), "cfxloglogavgslope": (), "cfxi": (8, 8, 6)}),
    "product": (
        (16, 16, 8),
        {
            "cfzeromode": (),
            "cfspfluctuations": (),
            "cfsploglogavgslope": (),
            "cfspflexibility": (),
            "cfspasperity": (),
            "cfspspectrum": (2, None),
            "cfnuscale": (),
            "cfnucutoff": (),
            "cfnuloglogslope": (),
            "cfxi": (16, 16, 8),
        },
    ),
}


# ----------------------------------------------------------------------------- structure
@pytest.mark.parametrize("dtype", [jnp.float64, jnp.float32])
@pytest.mark.parametrize("config", ["1d", "2d", "3d", "product"])
@pytest.mark.slow
def test_shapes_dtypes_and_latent_names(config, dtype):
    model = make_field(config, dtype)
    shape, names = EXPECTED[config]
    assert isinstance(model, sv.Model)
    assert set(model.domain) == set(names)
    for name, s in names.items():
        assert model.domain[name].dtype == dtype
        if s is not None and None not in s:
            assert model.domain[name].shape == s, name
    if config != "3d":  # spectrum excitations: (2, number of non-zero |k| nodes - 1)
        spec = next(n for n in names if n.endswith("spectrum"))
        assert model.domain[spec].shape == (2, len(model.grids[0].mode_lengths) - 2)
    assert model.target.shape == shape and model.target.dtype == dtype
    field = jax.jit(model)(init(model, jax.random.PRNGKey(0)))
    assert field.shape == shape and field.dtype == dtype and np.all(np.isfinite(field))


def test_grid_modes():
    g = RegularGrid(8, 0.5)
    np.testing.assert_allclose(g.mode_lengths, np.arange(5) / 4.0)
    np.testing.assert_array_equal(g.multiplicity, [1, 2, 2, 2, 1])
    assert g.total_volume == 4.0 and g.harmonic_distances == (0.25,)
    g2 = RegularGrid((6, 10), (1.0, 0.3))
    kx, ky = np.meshgrid(np.fft.fftfreq(6, 1.0), np.fft.fftfreq(10, 0.3), indexing="ij")
    k = np.hypot(kx, ky)
    np.testing.assert_allclose(g2.k_lengths, k, rtol=1e-12)
    np.testing.assert_allclose(g2.mode_lengths, np.unique(np.round(k, 12)), rtol=1e-9)
    assert g2.multiplicity.sum() == 60
    np.testing.assert_allclose(g2.log_mode_lengths, np.log(g2.mode_lengths[1:] / g2.mode_lengths[1]))


@pytest.mark.parametrize(
    "shape,dist", [((7,), 0.3), ((16, 16), 1.0), ((12, 20), 1.0), ((15, 32), (1 / 15, 1 / 32)), ((9, 6, 10), 0.5)]
)
def test_power_index_bins_every_mode_by_its_length(shape, dist):
    """The |k| bins against a direct construction: the sorted distinct |k| (rounded to 1e-10 of the largest
    pixel), every harmonic pixel's bin and the bins' counts."""
    g = RegularGrid(shape, dist)
    k = np.sqrt(
        sum(f**2 for f in np.meshgrid(*[np.fft.fftfreq(n, d) for n, d in zip(shape, g.distances)], indexing="ij"))
    )
    key = np.round(k / max(g.harmonic_distances), 8)
    uniq, inv = np.unique(key, return_inverse=True)
    np.testing.assert_array_equal(g.power_index, inv.reshape(shape))
    assert g.power_index.dtype == np.int32
    np.testing.assert_array_equal(g.multiplicity, np.bincount(inv.ravel()))
    np.testing.assert_allclose(g.mode_lengths, uniq * max(g.harmonic_distances), rtol=1e-7)
    np.testing.assert_allclose(g.k_lengths, k, rtol=1e-9)  # anisotropic grids bin |k|^2 rounded to 1e-10


@pytest.mark.parametrize("shape,dist", [((40, 30), 1.0), ((40, 30), (0.5, 2.0)), ((11, 4, 6), 0.5), ((300,), 1.0)])
def test_power_index_built_in_row_blocks_and_by_rows(monkeypatch, shape, dist):
    """Binned in row blocks of a few pixels (the build of a large grid) the grid is the one binned in one
    block; any rows of the index built alone are those rows of the whole index (what each process of a
    field split over processes builds). A long 1-D axis has sparse ``|n|^2`` keys (bisection, no table)."""
    from shardvi.models import harmonic

    whole = RegularGrid(shape, dist)
    monkeypatch.setattr(harmonic, "_CHUNK_PIXELS", 7)  # blocks of one or a few rows
    blocked = RegularGrid(shape, dist)
    for name in ("mode_lengths", "power_index", "multiplicity", "log_mode_lengths"):
        a, b = getattr(whole, name), getattr(blocked, name)
        assert a.dtype == b.dtype and np.array_equal(a, b), name
    for rows in (slice(0, shape[0]), slice(3, 9), slice(shape[0] - 1, shape[0]), slice(5, 5)):
        part = blocked.power_index_rows(rows)
        assert part.dtype == np.int32 and np.array_equal(part, whole.power_index[rows]), rows


def test_power_index_of_a_long_one_dimensional_grid():
    """``2**17`` pixels: the ``|n|^2`` keys reach ``2**32`` (a lookup table over them would be 4 GiB); every
    distinct ``|n|`` is a bin, ``n`` and ``-n`` share it."""
    n = 2**17
    g = RegularGrid(n, 1.0 / n)
    freq = np.fft.fftfreq(n, 1.0 / n).round().astype(np.int64)
    np.testing.assert_array_equal(g.power_index, np.abs(freq))
    np.testing.assert_array_equal(g.mode_lengths, np.arange(n // 2 + 1, dtype=np.float64))
    assert g.multiplicity[0] == 1 and g.multiplicity[-1] == 1 and np.all(g.multiplicity[1:-1] == 2)


@pytest.mark.parametrize("rows", [slice(0, 5, 2), slice(-1, 3), slice(2, 41), slice(3, 2), (0, 4), slice(0.0, 2)])
def test_power_index_rows_refuses_what_is_no_row_range(rows):
    g = RegularGrid((40, 30), 1.0)
    with pytest.raises((TypeError, ValueError), match="rows must be"):
        g.power_index_rows(rows)


@pytest.mark.parametrize("shape,dist", [((32,), 0.3), ((12, 10), (0.5, 2.0)), ((6, 8, 5), (1.0, 0.2, 3.0))])
@pytest.mark.slow
def test_hartley_roundtrip_and_parseval(shape, dist):
    grid = RegularGrid(shape, dist)
    s = jax.random.normal(jax.random.PRNGKey(1), (3,) + shape)  # a leading batch axis
    S = position_to_harmonic(s, grid)
    np.testing.assert_allclose(harmonic_to_position(S, grid), s, atol=1e-12)
    np.testing.assert_allclose(hartley(hartley(s[0])), grid.size * s[0], atol=1e-10)
    dx, dk = math.prod(grid.distances), math.prod(grid.harmonic_distances)
    np.testing.assert_allclose(
        jnp.sum(s**2, axis=tuple(range(1, s.ndim))) * dx, jnp.sum(S**2, axis=tuple(range(1, s.ndim))) * dk, rtol=1e-12
    )
    # Hartley == Re + Im of numpy's FFT; binned power: sum(mult * P) / V == mean(s^2)
    f = np.fft.fftn(np.asarray(s[0]))
    np.testing.assert_allclose(hartley(s[0]), f.real + f.imag, atol=1e-10)
    p = power_analyze(s, grid)
    np.testing.assert_allclose(
        p @ grid.multiplicity / grid.total_volume, jnp.mean(s**2, axis=tuple(range(1, s.ndim))), rtol=1e-12
    )


@pytest.mark.slow
def test_field_is_harmonic_to_position_of_sqrt_vp_xi():
    """One sub-domain: field = offset + harmonic_to_position(sqrt(V P(|k|)) xi), P[0] = V azm^2."""
    model = make_field("2d")
    xi = init(model, jax.random.PRNGKey(3))
    g = model.grids[0]
    p = model.power_spectrum(xi)
    np.testing.assert_allclose(p[0], g.total_volume * model.zero_mode_std(xi) ** 2)
    want = 0.3 + harmonic_to_position(jnp.sqrt(g.total_volume * p[g.power_index]) * xi["cfxi"], g)
    np.testing.assert_allclose(model(xi), want, rtol=1e-12, atol=1e-12)
    np.testing.assert_allclose(model.amplitude_spectrum(xi) ** 2, p, rtol=1e-12)


# ----------------------------------------------------------------------------- statistics
def _realize(model, xi0, keys, vary="xi"):
    """Fields for many draws: only ``cfxi`` redrawn (vary="xi") or all latents (vary="all")."""

    def one(k):
        if vary == "all":
            return model(init(model, k))
        x = dict(xi0)
        x["cfxi"] = jax.random.normal(k, xi0["cfxi"].shape, xi0["cfxi"].dtype)
        return model(x)

    return jax.jit(jax.vmap(one))(keys)


@pytest.mark.parametrize("config", ["1d", "2d"])
@pytest.mark.slow
def test_empirical_power_spectrum_follows_model(config):
    """Bin-averaged |FFT|^2 of 200 fields (fixed hyperparameters) vs the model spectrum, per |k| bin."""
    model = make_field(config)
    xi0 = init(model, jax.random.PRNGKey(11))
    g = model.grids[0]
    fields = np.asarray(_realize(model, xi0, jax.random.split(jax.random.PRNGKey(12), N_DRAWS)))
    # independent estimator: numpy FFT with volume factors, |S_k|^2 / V
    S = math.prod(g.distances) * np.fft.fftn(fields, axes=tuple(range(1, fields.ndim)))
    s2 = (np.abs(S) ** 2).reshape(N_DRAWS, -1)
    emp = np.bincount(g.power_index.ravel(), weights=s2.mean(0)) / g.multiplicity / g.total_volume
    hart = np.asarray(power_analyze(jnp.asarray(fields), g).mean(0))
    # for a real field |S_k|^2 = (H_k^2 + H_-k^2) / 2 and bins are symmetric in k: both estimators agree
    np.testing.assert_allclose(emp, hart, rtol=1e-9)
    ratio = (hart / np.asarray(model.power_spectrum(xi0)))[1:]
    # independent Hartley excitations: P_hat / P is a mean of D * m_j chi^2_1 / (D * m_j)
    sigma = np.sqrt(2.0 / (N_DRAWS * g.multiplicity[1:]))
    assert np.all(np.abs(ratio - 1) < Z * sigma), np.max(np.abs(ratio - 1) / sigma)
    chi2 = np.mean(((ratio - 1) / sigma) ** 2)
    assert abs(chi2 - 1) < Z * math.sqrt(2 / ratio.size), chi2


@pytest.mark.slow
def test_field_std_matches_fluctuations():
    """Pixel variance about each draw's mean (zero mode removed) == fluctuations^2, all latents random."""
    cf = CorrelatedFieldMaker("cf")
    cf.set_amplitude_total_offset(2.0, (0.5, 0.2))
    cf.add_fluctuations(
        (32, 32),
        0.1,
        fluctuations=(0.7, 1e-6),
        loglogavgslope=(-3.0, 0.5),
        flexibility=(0.8, 0.3),
        asperity=(0.2, 0.1),
        prefix="x",
    )
    model = cf.finalize()
    fields = _realize(model, None, jax.random.split(jax.random.PRNGKey(5), N_DRAWS), vary="all")
    v = np.asarray(jnp.mean((fields - fields.mean(axis=(1, 2), keepdims=True)) ** 2, axis=(1, 2)))
    se = v.std() / math.sqrt(N_DRAWS)
    assert abs(v.mean() - 0.49) < Z * se, (v.mean(), se)
    xi = init(model, jax.random.PRNGKey(0))
    np.testing.assert_allclose(model.fluctuations(xi), 0.7, rtol=1e-5)
    np.testing.assert_allclose(model.total_fluctuations(xi), model.fluctuations(xi), rtol=1e-12)


@pytest.mark.slow
def test_product_field_variances():
    """Product of a 2-D and a 1-D sub-domain: total variance and the spectral-axis-only sub-field."""
    azm, f_sp, f_nu = 0.5, 0.6, 0.3
    cf = CorrelatedFieldMaker("cf")
    cf.set_amplitude_total_offset(0.0, (azm, 1e-7))
    cf.add_fluctuations(
        (16, 16), 1.0, fluctuations=(f_sp, 1e-7), loglogavgslope=(-3.0, 0.5), flexibility=(0.5, 0.2), prefix="sp"
    )
    cf.add_fluctuations_matern(16, 0.25, scale=(f_nu, 1e-7), cutoff=(1.0, 0.2), loglogslope=(-4.0, 0.5), prefix="nu")
    model = cf.finalize()
    fields = _realize(model, None, jax.random.split(jax.random.PRNGKey(6), N_DRAWS), vary="all")
    v = np.asarray(jnp.var(fields.reshape(N_DRAWS, -1), axis=1))
    total2 = azm**2 * ((1 + (f_sp / azm) ** 2) * (1 + (f_nu / azm) ** 2) - 1)
    assert abs(v.mean() - total2) < Z * v.std() / math.sqrt(N_DRAWS), (v.mean(), total2)
    xi = init(model, jax.random.PRNGKey(0))
    np.testing.assert_allclose(model.total_fluctuations(xi) ** 2, total2, rtol=1e-5)
    # averaging over the spatial axes keeps the modes (0, 0, k_nu): their std is f_nu
    spec = fields.mean(axis=(1, 2))
    w = np.asarray(jnp.var(spec, axis=1))
    assert abs(w.mean() - f_nu**2) < Z * w.std() / math.sqrt(N_DRAWS), (w.mean(), f_nu**2)


def _pinned_iwp_var(t, T, sigma, asp):
    """Variance of y(t) - y(T) t / T for an integrated Wiener process (plus Brownian asperity part)."""

    def cov(s, u):
        s, u = min(s, u), max(s, u)
        return sigma**2 * (s * s * u / 2 - s**3 / 6 + asp * s)

    return cov(t, t) - 2 * t / T * cov(t, T) + (t / T) ** 2 * cov(T, T)


@pytest.mark.parametrize("n", [1, 2, 31, 32, 33, 1023, 1619, 40000])
def test_prefix_sum_is_cumsum(n):
    """The blocked prefix sum the log-spectrum uses equals ``np.cumsum`` (up to the order of the
    additions), under ``vmap`` too, and its transpose is the reversed cumulative sum."""
    rng = np.random.default_rng(n)
    x = rng.standard_normal(n)
    got = np.asarray(jax.jit(prefix_sum)(jnp.asarray(x)))
    want = np.cumsum(x)
    np.testing.assert_allclose(got, want, rtol=0, atol=1e-13 * np.sqrt(n) * np.abs(x).max() * max(1, np.log2(n)))
    batch = rng.standard_normal((3, n))
    np.testing.assert_allclose(
        np.asarray(jax.vmap(prefix_sum)(jnp.asarray(batch))), np.cumsum(batch, axis=1), rtol=0, atol=1e-10
    )
    ct = rng.standard_normal(n)
    # under jit: eagerly, each of the function's operations would be compiled on its own
    transposed = jax.jit(lambda x, ct: jax.vjp(prefix_sum, x)[1](ct)[0])(jnp.asarray(x), jnp.asarray(ct))
    np.testing.assert_allclose(np.asarray(transposed), np.cumsum(ct[::-1])[::-1], rtol=0, atol=1e-10)
    assert prefix_sum(jnp.zeros((0,))).shape == (0,)
    x32 = np.asarray(x, np.float32)
    got32 = jax.jit(prefix_sum)(jnp.asarray(x32))
    assert got32.dtype == jnp.float32
    np.testing.assert_allclose(np.asarray(got32), np.cumsum(x, dtype=np.float64), rtol=0, atol=1e-5 * np.sqrt(n) * 4)


@pytest.mark.parametrize("asperity", [None, 0.5])
@pytest.mark.slow
def test_log_spectrum_is_a_pinned_integrated_wiener_process(asperity):
    flex, n_draws = 0.8, 4000
    cf = CorrelatedFieldMaker("cf")
    cf.set_amplitude_total_offset(0.0, 1.0)
    cf.add_fluctuations(
        64, 1.0, fluctuations=1.0, loglogavgslope=-2.0, flexibility=flex, asperity=asperity, prefix="x", kind="power"
    )
    model = cf.finalize()
    amp = model.amplitudes[0]
    t = amp.grid.log_mode_lengths
    exc = jax.random.normal(jax.random.PRNGKey(8), (n_draws,) + model.domain["cfxspectrum"].shape)
    logp = jax.jit(jax.vmap(lambda e: amp.log_power({"cfxspectrum": e}, jnp.float64)))(exc)
    dev = np.asarray(logp - logp[:, :1]) - (-2.0) * t  # y(t) - y(0), y(0) = 0
    np.testing.assert_allclose(dev[:, -1], 0.0, atol=1e-10)  # end point pinned: slope is the average slope
    for j in (3, 10, 20, 28):
        want = _pinned_iwp_var(t[j], t[-1], flex, asperity or 0.0)
        got = dev[:, j].var()
        assert abs(got / want - 1) < Z * math.sqrt(2 / n_draws), (j, got, want)


@pytest.mark.parametrize("kind,factor", [("amplitude", 2.0), ("power", 1.0)])
def test_power_law_slope(kind, factor):
    cf = CorrelatedFieldMaker("cf")
    cf.set_amplitude_total_offset(0.0, 1.0)
    cf.add_fluctuations((32, 32), 0.5, fluctuations=0.4, loglogavgslope=-1.5, prefix="x", kind=kind)
    model = cf.finalize()
    xi = init(model, jax.random.PRNGKey(0))
    k, p = model.k_lengths[0][1:], np.asarray(model.power_spectrum(xi))[1:]
    np.testing.assert_allclose(np.diff(np.log(p)) / np.diff(np.log(k)), factor * -1.5, rtol=1e-10)
    g = model.grids[0]
    np.testing.assert_allclose(g.multiplicity[1:] @ p / g.total_volume, 0.4**2, rtol=1e-12)


@pytest.mark.parametrize("renormalize", [True, False])
def test_matern_spectrum_closed_form(renormalize):
    scale, cutoff, slope = 0.8, 0.2, -5.0
    cf = CorrelatedFieldMaker("cf")
    cf.set_amplitude_total_offset(0.0, 1.0)
    cf.add_fluctuations_matern(
        (24, 24),
        0.7,
        scale=(scale, 1e-9),
        cutoff=(cutoff, 1e-9),
        loglogslope=(slope, 1e-9),
        renormalize_amplitude=renormalize,
        prefix="m",
    )
    model = cf.finalize()
    assert set(model.domain) == {"cfmscale", "cfmcutoff", "cfmloglogslope", "cfxi"}  # offset_std fixed
    xi = init(model, jax.random.PRNGKey(0))
    g = model.grids[0]
    k = g.mode_lengths[1:]
    p = np.asarray(model.power_spectrum(xi))[1:]
    shape = (1 + (k / cutoff) ** 2) ** (slope / 2)
    np.testing.assert_allclose(p / p[0], shape / shape[0], rtol=1e-6)
    var = g.multiplicity[1:] @ p / g.total_volume
    if renormalize:
        np.testing.assert_allclose(var, scale**2, rtol=1e-6)
    else:
        np.testing.assert_allclose(p, scale**2 * shape, rtol=1e-6)
    np.testing.assert_allclose(model.fluctuations(xi), math.sqrt(var), rtol=1e-6)


@pytest.mark.slow
def test_float32_matches_float64():
    x64, x32 = make_field("product"), make_field("product", jnp.float32)
    xi = init(x64, jax.random.PRNGKey(2))
    xi32 = jax.tree.map(lambda a: a.astype(jnp.float32), xi)
    np.testing.assert_allclose(x32(xi32), x64(xi), rtol=1e-4, atol=1e-4)


# ----------------------------------------------------------------------------- autodiff / inference
@pytest.mark.slow
def test_differentiable_and_jittable():
    model = make_field("product")
    xi = init(model, jax.random.PRNGKey(4))
    data = model(init(model, jax.random.PRNGKey(5)))

    def loss(x):
        return jnp.sum((model(x) - data) ** 2)

    np.testing.assert_allclose(jax.jit(model)(xi), model(xi), rtol=1e-12, atol=1e-12)
    grad = jax.jit(jax.grad(loss))(xi)
    assert all(np.all(np.isfinite(g)) for g in jax.tree.leaves(grad))
    assert all(float(jnp.max(jnp.abs(g))) > 0 for g in jax.tree.leaves(grad))
    # directional derivative vs central differences
    d = init(model, jax.random.PRNGKey(6))
    h = 1e-5

    def shifted(sign):
        return loss(jax.tree.map(lambda a, b: a + sign * h * b, xi, d))

    fd = (shifted(1.0) - shifted(-1.0)) / (2 * h)
    ad = sum(jnp.vdot(g, b) for g, b in zip(jax.tree.leaves(grad), jax.tree.leaves(d)))
    np.testing.assert_allclose(ad, fd, rtol=1e-6)


# ----------------------------------------------------------------------------- validation
def test_bad_parameters():
    cf = CorrelatedFieldMaker("cf")
    ok = dict(fluctuations=(1.0, 0.1), loglogavgslope=(-2.0, 0.5))
    with pytest.raises(ValueError, match="distances"):
        cf.add_fluctuations(16, 0.0, **ok)
    with pytest.raises(ValueError, match="distances has 1"):
        cf.add_fluctuations((16, 16), (1.0,), **ok)
    with pytest.raises(ValueError, match="shape"):
        cf.add_fluctuations((16, 16, 16, 16), 1.0, **ok)
    with pytest.raises(ValueError, match="shape"):
        cf.add_fluctuations(1, 1.0, **ok)
    with pytest.raises(ValueError, match="asperity"):
        cf.add_fluctuations(16, 1.0, **ok, asperity=(0.1, 0.1))
    with pytest.raises(ValueError, match="kind"):
        cf.add_fluctuations(16, 1.0, **ok, kind="log")
    with pytest.raises(ValueError, match="fluctuations"):
        cf.add_fluctuations(16, 1.0, fluctuations=-1.0, loglogavgslope=-2.0)
    with pytest.raises(ValueError, match="flexibility: std"):
        cf.add_fluctuations(16, 1.0, **ok, flexibility=(1.0, 0.0))
    with pytest.raises(TypeError, match="loglogavgslope"):
        cf.add_fluctuations(16, 1.0, fluctuations=(1.0, 0.1), loglogavgslope="steep")
    with pytest.raises(ValueError, match="cutoff"):
        cf.add_fluctuations_matern(16, 1.0, scale=1.0, cutoff=(-1.0, 0.1), loglogslope=-3.0)
    with pytest.raises(ValueError, match="flexibility needs"):
        cf.add_fluctuations(2, 1.0, **ok, flexibility=(1.0, 0.1))
    with pytest.raises(ValueError, match="set_amplitude_total_offset"):
        CorrelatedFieldMaker("cf").add_fluctuations(16, 1.0, **ok).finalize()
    with pytest.raises(ValueError, match="at least one"):
        CorrelatedFieldMaker("cf").set_amplitude_total_offset(0.0, 1.0).finalize()
    with pytest.raises(ValueError, match="offset_std"):
        CorrelatedFieldMaker("cf").set_amplitude_total_offset(0.0, 0.0)
    with pytest.raises(TypeError, match="dtype"):
        CorrelatedFieldMaker("cf", dtype=jnp.int32)
    twice = CorrelatedFieldMaker("cf").set_amplitude_total_offset(0.0, 1.0)
    twice.add_fluctuations(8, 1.0, **ok, prefix="x").add_fluctuations(8, 1.0, **ok, prefix="x")
    with pytest.raises(ValueError, match="prefix"):
        twice.finalize()
    model = make_field("1d")
    with pytest.raises(IndexError, match="component"):
        model.power_spectrum(init(model, jax.random.PRNGKey(0)), 1)


@pytest.mark.slow
def test_prior_objects_accepted():
    cf = CorrelatedFieldMaker("cf")
    cf.set_amplitude_total_offset(0.0, LogNormal(1.0, 0.1))
    cf.add_fluctuations(
        16, 1.0, fluctuations=sv.models.InvGamma(5.0, 4.0), loglogavgslope=sv.models.Uniform(-4, -1), prefix="x"
    )
    model = cf.finalize()
    xi = {k: jnp.zeros(v.shape) for k, v in model.domain.items()}
    hp = model.hyperparameters(xi)
    np.testing.assert_allclose(hp["cfxloglogavgslope"], -2.5)
    np.testing.assert_allclose(hp["cfxfluctuations"], sv.models.InvGamma(5.0, 4.0)(0.0))
