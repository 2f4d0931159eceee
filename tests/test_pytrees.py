"""Likelihoods, models, responses and fields are pytrees; the engine passes them as arguments."""

import re
import tomllib
import warnings
from pathlib import Path

import jax
import jax.extend
import jax.numpy as jnp
import numpy as np
import pytest
from jax import tree_util as jtu

import shardvi as sv
from shardvi.module import Module
from shardvi.parallel import reproducible
from shardvi.vi.optimize_kl import OptimizeVI

RNG = np.random.default_rng(11)


def _contains(leaves, x) -> bool:
    return any(np.shape(leaf) == np.shape(x) and np.array_equal(np.asarray(leaf), np.asarray(x)) for leaf in leaves)


# -- the classes and their leaves ---------------------------------------------------------------
def test_gaussian_is_a_class_whose_data_is_a_leaf():
    d, s = RNG.normal(size=5), 0.5 + RNG.random(5)
    lh = sv.Gaussian(d, noise_std=s)
    assert isinstance(lh, sv.Gaussian) and isinstance(lh, sv.Likelihood) and isinstance(lh, Module)
    leaves = jtu.tree_leaves(lh)
    assert _contains(leaves, d) and _contains(leaves, s) and _contains(leaves, 1.0 / s)
    assert all(isinstance(x, jax.Array) for x in leaves)


@pytest.mark.parametrize(
    "make, arrays",
    [
        (lambda d: sv.Poisson(np.round(np.abs(d) * 3)), lambda d: [np.round(np.abs(d) * 3)]),
        (lambda d: sv.StudentT(d, dof=3.0, noise_std=0.5), lambda d: [d, np.full(d.shape, 3.0)]),
        (lambda d: sv.VariableCovarianceGaussian(d), lambda d: [d]),
        (
            lambda d: sv.Gaussian(d, noise_cov_inv=4.0),
            lambda d: [d, np.asarray(4.0), np.asarray(2.0)],
        ),  # scalars stay scalars
    ],
)
def test_every_likelihood_holds_its_arrays_as_leaves(make, arrays):
    d = RNG.normal(size=6)
    lh = make(d)
    leaves = jtu.tree_leaves(lh)
    for a in arrays(d):
        assert _contains(leaves, a)
    assert type(lh).__name__ in ("Poisson", "StudentT", "VariableCovarianceGaussian", "Gaussian")


def test_amended_and_summed_likelihoods_carry_the_model_arrays():
    mask = RNG.random((4, 5)) < 0.5
    mask[0, 0] = True
    resp = sv.Mask(mask)
    model = sv.Model(resp, jax.ShapeDtypeStruct((4, 5), jnp.float64))
    d = RNG.normal(size=resp.size)
    lh = sv.Gaussian(d, noise_std=1.0).amend(model)
    assert isinstance(lh, sv.vi.likelihood.AmendedLikelihood)
    leaves = jtu.tree_leaves(lh)
    assert _contains(leaves, d) and _contains(leaves, mask) and _contains(leaves, np.flatnonzero(mask))
    both = sv.Gaussian(d, noise_std=1.0) + sv.Poisson(np.ones(resp.size))
    assert _contains(jtu.tree_leaves(both), d) and _contains(jtu.tree_leaves(both), np.ones(resp.size))


def test_correlated_field_grids_and_nufft_points_are_leaves():
    mk = sv.CorrelatedFieldMaker("cf", dtype=jnp.float64)
    mk.set_amplitude_total_offset(0.0, (1.0, 0.1))
    mk.add_fluctuations((8, 6), 0.1, (1.0, 0.3), (-3.0, 0.5), (0.5, 0.2), (0.3, 0.1))
    cf = mk.finalize()
    leaves = jtu.tree_leaves(cf)
    g = cf.grids[0]
    for a in (g.mode_lengths, g.power_index, g.multiplicity, g.log_mode_lengths):
        assert _contains(leaves, a)
    # rebuilt from its leaves it keeps every attribute, those set after __init__ traced it (target) too
    rebuilt = jtu.tree_map(lambda x: x, cf)
    assert set(vars(rebuilt)) == set(vars(cf)) and rebuilt.target == cf.target
    u, v = RNG.normal(size=7), RNG.normal(size=7)
    resp = sv.NUFFTResponse(u, v, (8, 6), 0.01)
    assert _contains(jtu.tree_leaves(resp), u) and _contains(jtu.tree_leaves(resp), v)


def test_modules_are_immutable_and_rebuild_without_init():
    lh = sv.Gaussian(np.arange(3.0), noise_std=1.0)
    with pytest.raises(AttributeError, match="immutable"):
        lh.data = np.zeros(3)
    doubled = jtu.tree_map(lambda x: 2 * x, lh)  # rebuilt from leaves, no validation re-run
    assert isinstance(doubled, sv.Gaussian)
    np.testing.assert_array_equal(doubled.data, 2 * np.arange(3.0))
    # JAX may put anything at the leaves (placeholders, None); the structure is kept
    assert jtu.tree_structure(jtu.tree_map(lambda _: object(), lh)) == jtu.tree_structure(lh)
    treedef = jtu.tree_structure(lh)
    assert treedef.flatten_up_to(jtu.tree_map(lambda _: None, lh)) == [None] * treedef.num_leaves


def test_one_compiled_program_for_likelihoods_of_equal_shapes():
    """The data are arguments: new data with the same shapes reuse the compiled program, bitwise."""

    @jax.jit
    def energy(lh, s):
        return lh.energy(s)

    s = RNG.normal(size=50)
    vals = []
    for seed in range(3):
        d = np.random.default_rng(seed).normal(size=50)
        lh = sv.Gaussian(d, noise_std=0.3)
        vals.append(float(energy(lh, s)))
        assert vals[-1] == pytest.approx(0.5 * np.sum((d - s) ** 2) / 0.09, rel=1e-12)
    assert energy._cache_size() == 1
    assert len(set(vals)) == 3


def test_function_likelihood_still_built_from_functions():
    dom = jax.ShapeDtypeStruct((3,), jnp.float64)
    lh = sv.Likelihood(lambda s: jnp.sum(s**2), lambda s: 2 * s, domain=dom)
    assert isinstance(lh, sv.Likelihood) and type(lh).__name__ == "FunctionLikelihood"
    t = jnp.arange(3.0)
    np.testing.assert_allclose(lh.metric(jnp.ones(3), t), 4 * t)
    assert jtu.tree_leaves(lh) == []
    with pytest.raises(TypeError, match="metric must be callable"):
        sv.Likelihood(lambda s: s, domain=dom, metric=3.0)


# -- no data array is a constant of any engine step ----------------------------------------------
def _constants(text: str) -> list:
    """``(bytes, type)`` of every constant in a lowered (StableHLO) program."""
    out = []
    for m in re.finditer(r"stablehlo\.constant dense<.*?> : tensor<([0-9x]*)([a-z]+)([0-9]+)>", text):
        dims = [int(x) for x in m.group(1).split("x") if x]
        out.append((int(np.prod(dims)) * int(m.group(3)) // 8, m.group(2) + m.group(3)))
    return out


@pytest.mark.slow
def test_no_engine_step_embeds_the_data_as_a_constant():
    n = 32
    mk = sv.CorrelatedFieldMaker("cf", dtype=jnp.float64)
    mk.set_amplitude_total_offset(0.0, (1.0, 0.1))
    mk.add_fluctuations((n, n), 1.0 / n, (1.0, 0.3), (-3.0, 0.5), (0.5, 0.2), (0.3, 0.1))
    cf = mk.finalize()
    mask = RNG.random((n, n)) < 0.7
    resp = sv.Mask(mask)
    model = sv.Model(jtu.Partial(lambda r, f, xi: r(f(xi)), resp, cf), cf.domain)
    d = RNG.normal(size=resp.size)
    lh = sv.Gaussian(d, noise_std=0.1 + 0.01 * RNG.random(resp.size)).amend(model)
    opt = OptimizeVI(lh, 1, n_samples=1, progress=False)
    pos = jtu.tree_map(lambda s: jnp.zeros(s.shape, s.dtype), lh.domain)
    keys = jax.random.split(jax.random.PRNGKey(0), 1)
    res = jtu.tree_map(lambda x: jnp.zeros((2,) + x.shape), pos)
    steps = {
        "draw_linear": opt._draw_linear.lower(pos, keys, config=sv.CGConfig()),
        "curve": opt._curve.lower(pos, res, jnp.repeat(keys, 2, 0), jnp.array([1.0, -1.0]), config=sv.NewtonCGConfig()),
        "minimize": opt._minimize.lower(pos, res, config=sv.NewtonCGConfig()),
        "diagnostics": opt._diagnostics.lower(pos, res),
    }
    data_bytes = d.nbytes
    for name, lowered in steps.items():
        consts = _constants(lowered.as_text())
        assert consts, f"{name}: the constant pattern matched nothing (the HLO text format changed?)"
        largest = max(consts)
        assert largest[0] <= 1024, f"{name} embeds a constant of {largest[0]} bytes ({largest[1]})"
        assert largest[0] < data_bytes // 8
    # the data are program inputs: the lowered program's arguments include every likelihood leaf
    n_args = len(jtu.tree_leaves(steps["minimize"].args_info))
    assert n_args >= len(jtu.tree_leaves(lh)) + len(jtu.tree_leaves(pos))


@pytest.mark.product_compiler  # two different programs, bitwise (tests/conftest.py)
@pytest.mark.slow
def test_engine_results_do_not_depend_on_the_data_being_arguments():
    """A likelihood whose data a closure captures (constants) gives the same samples as the pytree one."""
    n = 12
    d, std = RNG.normal(size=n), 0.4
    model = sv.Model(lambda xi: jnp.exp(0.3 * xi["x"]), {"x": jax.ShapeDtypeStruct((n,), jnp.float64)})
    as_leaves = sv.Gaussian(d, noise_std=std).amend(model)
    dj = jnp.asarray(d)
    closure = sv.Likelihood(
        lambda s: 0.5 * jnp.sum((dj - s) ** 2) / std**2,
        lambda s: s / std,
        domain=jax.ShapeDtypeStruct((n,), jnp.float64),
    ).amend(model)
    out = []
    for lh in (as_leaves, closure):
        s, _ = sv.optimize_kl(
            lh,
            {"x": jnp.zeros(n)},
            key=jax.random.PRNGKey(3),
            n_total_iterations=2,
            n_samples=1,
            sample_mode="linear_resample",
            progress=False,
        )
        out.append(np.asarray(s.samples["x"]))
    np.testing.assert_allclose(out[0], out[1], rtol=1e-10, atol=1e-12)


# -- reproducibility guards ----------------------------------------------------------------------
def test_tested_jax_versions_are_declared_in_pyproject_and_checked():
    cfg = tomllib.loads((Path(__file__).parents[1] / "pyproject.toml").read_text())
    assert tuple(cfg["tool"]["shardvi"]["bitwise-tested-jax"]) == reproducible.TESTED_JAX_VERSIONS
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        assert reproducible.check_jax_version(reproducible.TESTED_JAX_VERSIONS[0])
    with pytest.warns(reproducible.ReproducibilityWarning, match="0.0.1 is not among"):
        assert not reproducible.check_jax_version("0.0.1")
    with warnings.catch_warnings():  # once per version
        warnings.simplefilter("error")
        reproducible.check_jax_version("0.0.1")


def test_a_failed_rewrite_warns_instead_of_passing_silently(monkeypatch):
    def broken(jaxpr):
        raise TypeError("unknown equation")

    monkeypatch.setattr(reproducible, "_rewrite_jaxpr", broken)
    f = reproducible.reproducible_jit(lambda x: 0.8 * x)
    with pytest.warns(reproducible.ReproducibilityWarning, match="rewrite failed.*unknown equation"):
        np.testing.assert_allclose(f(jnp.ones(3)), 0.8)


def test_every_division_by_a_scalar_becomes_a_reciprocal_multiplication():
    """``x / s`` with a scalar ``s`` is ``x * (1 / s)`` in every compiled program, scalar ``x`` included.

    A program that maps the per-sample code over a batch (``Vmap(chunk_size>1)``) turns a
    per-sample ``scalar / 3.0`` into an ``array / scalar``: both forms must be rewritten alike (an
    unrewritten scalar division makes the batched and the unbatched program differ in the last bit).
    """
    fn = reproducible.opaque_constants(lambda x, s: (x / s, x[0] / s, jnp.sum(x) / 3.0, x / x))
    x = jnp.asarray([0.3, 1.7, -2.9])
    jaxpr = jax.make_jaxpr(fn)(x, jnp.asarray(0.7))

    def divisions(jx):
        for eqn in jx.eqns:
            if eqn.primitive.name == "div":
                yield eqn
            for sub in jax.extend.core.jaxprs_in_params(eqn.params):
                yield from divisions(sub)

    divs = list(divisions(jaxpr.jaxpr))
    # three reciprocals 1 / s (their numerator a barrier-wrapped literal 1) and the array / array division
    assert sorted(tuple(e.invars[0].aval.shape) for e in divs) == [(), (), (), (3,)]
    got = jax.jit(fn)(x, jnp.asarray(0.7))
    want = (x * (1 / 0.7), x[0] * (1 / 0.7), jnp.sum(x) * (1 / 3.0), x / x)
    for g, w in zip(got, want):
        np.testing.assert_array_equal(g, w)
