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


def _run(lh, pos, strategy="vmap", **kw):
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
            **kw,
        )
    return samples.to_host()


def _sigma_distance(signal, got, ref):
    m, _ = got.mean_and_std(signal)
    m0, s0 = ref.mean_and_std(signal)
    return float(np.max(np.abs(np.asarray(m) - np.asarray(m0)) / np.asarray(s0)))


@pytest.mark.parametrize("dtype", [jnp.float64, jnp.float32])
def test_row_normal_is_jax_random_normal_of_the_whole_array_on_any_cut_into_blocks(dtype):
    """Counter-based on the global index: blocks of rows drawn with their offsets (also traced, as inside the
    engine's block loops) are the rows of ``jax.random.normal(key, whole_shape)``, bitwise, on this JAX (its
    partitionable threefry, the default): so an unsplit run draws what NIFTy.re's ``random_like`` draws."""
    assert jax.config.jax_threefry_partitionable
    key = jax.random.PRNGKey(5)
    for shape, rows in [((12, 3), 5), ((7,), 3), ((5, 2, 3), 2)]:
        whole = jax.random.normal(key, shape, dtype)
        np.testing.assert_array_equal(sv.tree_math.row_normal(key, shape, dtype), whole)
        # every block (the last one running past the end) at its offset, the offset traced
        blocks = jax.jit(jax.vmap(lambda o, s=(rows,) + shape[1:]: sv.tree_math.row_normal(key, s, dtype, o)))
        parts = blocks(jnp.arange(0, shape[0], rows))
        np.testing.assert_array_equal(np.concatenate(parts)[: shape[0]], whole)
    np.testing.assert_array_equal(sv.tree_math.row_normal(key, (), dtype), jax.random.normal(key, (), dtype))
    typed = jax.random.key(5)  # a typed threefry key: its two words
    np.testing.assert_array_equal(sv.tree_math.row_normal(typed, (4,), dtype), jax.random.normal(typed, (4,), dtype))
    # rows far out (global indices beyond 2**32): the index's two words carry
    far = jax.jit(lambda o: sv.tree_math.row_normal(key, (2, 3), dtype, o))(2**31 - 1)
    assert np.all(np.isfinite(far)) and not np.array_equal(far[0], far[1])
    c = sv.tree_math.row_normal(key, (6,), jnp.complex128)
    assert np.iscomplexobj(c) and abs(np.std(np.asarray(c).real) - 1) < 1


def _gaussian_data_problem():
    """24 data of an exp-linked linear model, Gaussian noise: ``(whole likelihood, blocked model, start)``."""
    rng = np.random.default_rng(0)
    r = rng.normal(size=(24, 10)) / 3
    dom = jax.ShapeDtypeStruct((10,), jnp.float64)
    d = np.exp(r @ rng.normal(size=10)) + 0.3 * rng.normal(size=24)
    whole = sv.Gaussian(d, noise_std=0.3).amend(sv.Model(lambda x: jnp.exp(jnp.asarray(r) @ x), dom))
    model = sv.Model(lambda x, inp: jnp.exp(inp["row"] @ x), dom, data_inputs={"row": r})
    return whole, lambda blocks: sv.Gaussian(d, noise_std=0.3).amend(model, data_blocks=blocks), jnp.zeros(10)


def _noise_learning_problem():
    """26 data, the noise scale learned (``VariableCovarianceGaussian``): ``(whole, blocked model, start)``."""
    rng = np.random.default_rng(1)
    r = rng.normal(size=(26, 6)) / 3
    dom = {"x": jax.ShapeDtypeStruct((6,), jnp.float64), "s": jax.ShapeDtypeStruct((), jnp.float64)}

    def signal(x, rows):
        return jnp.exp(rows @ x["x"]), jnp.broadcast_to(0.3 * jnp.exp(0.3 * x["s"]), rows.shape[:1])

    d = np.exp(r @ rng.normal(size=6)) + 0.3 * rng.normal(size=26)
    whole = sv.VariableCovarianceGaussian(d).amend(sv.Model(lambda x: signal(x, jnp.asarray(r)), dom))
    model = sv.Model(lambda x, inp: signal(x, inp["row"]), dom, data_inputs={"row": r})
    start = {"x": jnp.zeros(6), "s": jnp.zeros(())}
    return whole, lambda blocks: sv.VariableCovarianceGaussian(d).amend(model, data_blocks=blocks), start


@pytest.mark.parametrize(
    "case",
    ["1x4-jit", "2x2-shard_map-padded"],
)
def test_data_blocks_agree_with_the_unsplit_run(case):
    """MGVI then geoVI, 3 iterations, against the unsplit run: 24 data in 4 blocks, each on its own device of a
    1x4 JitSharding mesh; 26 data with the noise scale learned in 6 blocks of 5 (4 of them inert padding),
    ShardMap on 2x2. The blocks draw the unsplit run's noise; other layouts of the same blocks give the same bits
    (tests/test_model_parallel.py)."""
    if case == "1x4-jit":
        whole, blocked, pos = _gaussian_data_problem()
        lh, strategy = blocked(4), JitSharding(devices=jax.devices()[:4], model_shards=4)
        signal = lambda x: x  # noqa: E731
    else:
        whole, blocked, pos = _noise_learning_problem()
        lh, strategy = blocked(6), ShardMap(devices=jax.devices()[:4], model_shards=2)
        assert lh.padded and lh.n_data == 26 and lh.block_size == 5
        signal = lambda x: jnp.append(x["x"], x["s"])  # noqa: E731
    ref = _run(whole, pos)
    got = _run(lh, pos, strategy)
    assert _sigma_distance(signal, got, ref) <= 1e-6


def test_field_blocks_agree_with_the_unsplit_run():
    """The data of an ``sv.Sampling`` (60 % of the pixels, in scrambled order) of a field of 8 rows in 6 blocks of 2
    (4 padding rows, unobserved, zero in the latent; blocks that divide the rows are the case without padding of the
    same code, their draws compared in tests/test_field_split.py), on one device (every layout of the same blocks
    gives its bits: tests/test_field_split.py): each datum's noise is drawn on its pixel with the unsplit run's
    number of that datum, so both agree with the unsplit run to rounding."""
    sys.path.insert(0, __file__.rsplit("/", 1)[0])
    from test_field_split import masked, problem

    _, _, _, pos = problem()
    model, d, std = masked("Sampling")
    ref = _run(sv.Gaussian(d, noise_std=std).amend(model), pos)
    lh = sv.Gaussian(d, noise_std=std).amend(model, field_blocks=6)
    assert lh.padding_rows == 4
    seen = []  # a callback sees the grid's own shape (the padding rows stay inside the engine)
    got = _run(lh, pos, callback=lambda s, _: seen.append(jax.tree.map(np.shape, s.samples)))
    assert seen[-1] == jax.tree.map(np.shape, got.samples) == jax.tree.map(np.shape, ref.samples)
    assert _sigma_distance(model, got, ref) <= 1e-6
