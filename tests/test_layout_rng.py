"""Random numbers are a function of the global index: a run split into data or field blocks draws the numbers of
the unsplit run, so the two agree to rounding (the order of sums over blocks), whatever the blocks and layout."""

import sys
import warnings

import jax
import jax.numpy as jnp
import numpy as np
import pytest

import shardvi as sv
from shardvi.parallel import JitSharding, ShardMap

TIGHT = dict(
    linear_sampling=sv.CGConfig(tol=1e-13, maxiter=500),
    nonlinear_update=sv.NewtonCGConfig(xtol=1e-12, maxiter=50, cg=sv.CGConfig(tol=1e-10, maxiter=500)),
    kl_minimization=sv.NewtonCGConfig(xtol=1e-12, maxiter=50, cg=sv.CGConfig(tol=1e-10, maxiter=500)),
)


def _run(lh, pos, strategy="vmap"):
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", sv.ConvergenceWarning)
        samples, _ = sv.optimize_kl(
            lh,
            pos,
            key=jax.random.PRNGKey(0),
            n_total_iterations=3,
            n_samples=2,
            sample_mode=lambda i: "linear_resample" if i < 2 else "nonlinear_resample",
            sample_map=strategy,
            kl_map=strategy,
            progress=False,
            **TIGHT,
        )
    return samples.to_host()


def _sigma_distance(signal, got, ref):
    m, _ = got.mean_and_std(signal)
    m0, s0 = ref.mean_and_std(signal)
    return float(np.max(np.abs(np.asarray(m) - np.asarray(m0)) / np.asarray(s0)))


def test_row_normal_is_the_same_on_any_cut_into_blocks():
    key = jax.random.PRNGKey(5)
    whole = sv.tree_math.row_normal(key, (12, 3), jnp.float64)
    for rows in (1, 3, 4, 6):
        parts = [sv.tree_math.row_normal(key, (rows, 3), jnp.float64, b * rows) for b in range(12 // rows)]
        np.testing.assert_array_equal(np.concatenate(parts), whole)
    c = sv.tree_math.row_normal(key, (6,), jnp.complex128)
    assert np.iscomplexobj(c) and abs(np.std(np.asarray(c).real) - 1) < 1


@pytest.mark.parametrize("layout", [(4, 1), (2, 2)], ids=["4x1", "2x2"])
def test_data_blocks_agree_with_the_unsplit_run(layout):
    rng = np.random.default_rng(0)
    r = rng.normal(size=(24, 10)) / 3
    dom = jax.ShapeDtypeStruct((10,), jnp.float64)
    d = np.exp(r @ rng.normal(size=10)) + 0.3 * rng.normal(size=24)
    whole = sv.Gaussian(d, noise_std=0.3).amend(sv.Model(lambda x: jnp.exp(jnp.asarray(r) @ x), dom))
    model = sv.Model(lambda x, inp: jnp.exp(inp["row"] @ x), dom, data_inputs={"row": r})
    ref = _run(whole, jnp.zeros(10))
    rows, k = layout
    cls = ShardMap if k == 2 else JitSharding
    got = _run(
        sv.Gaussian(d, noise_std=0.3).amend(model, data_blocks=6 if k == 2 else 4),
        jnp.zeros(10),
        cls(devices=jax.devices()[: rows * k], model_shards=k),
    )
    assert _sigma_distance(lambda x: x, got, ref) <= 1e-6


def test_field_blocks_agree_with_the_unsplit_run():
    sys.path.insert(0, __file__.rsplit("/", 1)[0])
    from test_field_split import problem

    model, d, std, pos = problem()
    ref = _run(sv.Gaussian(d, noise_std=std).amend(model), pos)
    # one device holding the 4 blocks: every layout of these blocks gives its bits (tests/test_field_split.py)
    got = _run(sv.Gaussian(d, noise_std=std).amend(model, field_blocks=4), pos)
    assert _sigma_distance(model, got, ref) <= 1e-6
