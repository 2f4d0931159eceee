"""Field parallelism in the engine: ``amend(model, field_blocks=B)`` with ``ShardMap(model_shards=k)``.

A 2-D correlated field with pixel-wise Gaussian data, split into 4 blocks of
rows: a whole MGVI + geoVI + KL iteration (CG and Newton-CG on slabs of the
latent) gives bitwise the one-device (``Vmap``) result on the mesh layout
(samples, model) = (1, 4), every device one block (the layouts (2, 2) and
(4, 1) were checked when the engine changed, ``python
tests/_field_split_worker.py 1x4 2x2 4x1``; left out here for the suite's
time), in a fresh process at the shipped compiler level; the split likelihood
equals the unsplit one to rounding (energy, gradient, metric, metric square
root); bad configurations raise clear errors.
"""

import functools
import json
import os
import subprocess
import sys

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from _model_parallel_problem import run_layout

import shardvi as sv
from shardvi.parallel import JitSharding, ShardMap, Vmap

HERE = os.path.dirname(os.path.abspath(__file__))
N = 8  # grid rows and columns: 4 blocks of 2 rows, 4 devices along either axis of the slab transform


@functools.cache
def problem():
    cf = sv.CorrelatedFieldMaker("cf")
    cf.set_amplitude_total_offset(0.0, (0.5, 0.1))
    cf.add_fluctuations(
        (N, N),
        1.0 / N,
        fluctuations=(0.7, 0.2),
        loglogavgslope=(-3.0, 0.5),
        flexibility=(0.8, 0.3),
        asperity=(0.2, 0.1),
        prefix="x",
    )
    cf = cf.finalize()
    model = sv.Model(lambda xi: jnp.exp(cf(xi)), cf.domain)
    rng = np.random.default_rng(0)
    d = np.asarray(model(model.init(jax.random.PRNGKey(1)))) + 0.1 * rng.normal(size=(N, N))
    std = 0.1 * (1 + 0.5 * rng.random((N, N)))
    pos = jax.tree.map(lambda v: 0.1 * v, model.init(jax.random.PRNGKey(5)))
    return model, d, std, pos


def split_likelihood(blocks=4):
    model, d, std, _ = problem()
    return sv.Gaussian(d, noise_std=std).amend(model, field_blocks=blocks)


def run(strategy):
    """One MGVI + geoVI + KL iteration (the model-parallel tests' :func:`run_layout`): (arrays, KL energy)."""
    arrays, kl, _ = run_layout(split_likelihood(), problem()[3], strategy)
    return arrays, kl[0]


@functools.cache
def one_device():
    return run(Vmap())


def test_mgvi_geovi_kl_bitwise_equal_to_one_device_on_every_mesh_layout():
    """In a fresh process with the shipped compiler settings (tests/_field_split_worker.py)."""
    env = {k: v for k, v in os.environ.items() if k != "XLA_FLAGS"}  # not the session's LLVM level 0
    env["PYTHONPATH"] = os.pathsep.join([os.path.dirname(HERE), HERE, os.environ.get("PYTHONPATH", "")])
    proc = subprocess.run(
        [sys.executable, os.path.join(HERE, "_field_split_worker.py"), "1x4"],
        env=env,
        capture_output=True,
        text=True,
        timeout=400,
    )
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    result = json.loads(proc.stdout.strip().splitlines()[-1])
    assert result == {"nonzero": True, "1x4": True}


def test_split_likelihood_is_the_whole_likelihood():
    """Energy, gradient, metric and metric square root of the split likelihood (one device: all blocks
    local, block-order sums) equal those of the plain amended likelihood to rounding."""
    model, d, std, pos = problem()
    split, whole = split_likelihood(), sv.Gaussian(d, noise_std=std).amend(model)
    t = jax.tree.map(lambda v: 0.3 * v, model.init(jax.random.PRNGKey(7)))
    e = jnp.asarray(np.random.default_rng(3).normal(size=(N, N)))

    def parts(lh):
        v, g = jax.value_and_grad(lh.energy)(pos)
        return v, g, lh.metric_operator(pos)(t), lh.left_sqrt_metric(pos, e), lh.normalized_residual(pos)

    for a, b in zip(jax.tree.leaves(jax.jit(parts)(split)), jax.tree.leaves(jax.jit(parts)(whole))):
        np.testing.assert_allclose(a, b, rtol=1e-11, atol=1e-12)


def test_bad_configurations_raise_clear_errors():
    model, d, std, pos = problem()
    with pytest.raises(ValueError, match="does not divide the grid's 8 rows"):
        sv.Gaussian(d, noise_std=std).amend(model, field_blocks=3)
    with pytest.raises(ValueError, match="field_blocks must be an int >= 1"):
        sv.Gaussian(d, noise_std=std).amend(model, field_blocks=0)
    with pytest.raises(ValueError, match="not both"):
        sv.Gaussian(d, noise_std=std).amend(model, field_blocks=4, data_blocks=4)
    flat = sv.Model(lambda xi: jnp.exp(xi["a"]), {"a": jax.ShapeDtypeStruct((N * N,), jnp.float64)})
    with pytest.raises(ValueError, match="pixel-wise data on a grid of at least 2 axes"):
        sv.Gaussian(d.ravel(), noise_std=0.1).amend(flat, field_blocks=4)
    lh = split_likelihood(blocks=2)
    kw = dict(key=jax.random.PRNGKey(0), n_total_iterations=1, n_samples=1, progress=False)
    with pytest.raises(ValueError, match="model_shards=4 does not divide field_blocks=2"):
        strat = ShardMap(devices=jax.devices()[:4], model_shards=4)
        sv.optimize_kl(lh, pos, sample_map=strat, kl_map=strat, **kw)
    with pytest.raises(NotImplementedError, match="does not split the field yet"):
        strat = JitSharding(devices=jax.devices()[:4], model_shards=2)
        sv.optimize_kl(lh, pos, sample_map=strat, kl_map=strat, **kw)


@pytest.mark.parametrize("kind", ["Poisson", "StudentT"])
def test_likelihoods_that_sum_themselves_give_the_whole_grid_energy_on_every_device(kind):
    """A pixel-wise likelihood whose energy is its own ``jnp.sum`` (not the tree-math inner product) is
    evaluated block by block, so the sample-averaged KL, its gradient and its metric are those of the
    unsplit likelihood on the model axis of 4 devices, where each device holds a quarter of the grid."""
    from shardvi.vi.kl import kl_metric, kl_value_and_grad

    model, d, std, pos = problem()
    rng = np.random.default_rng(11)
    if kind == "Poisson":
        lh = sv.Poisson(rng.poisson(np.asarray(model(pos))).astype(np.float64))
    else:
        lh = sv.StudentT(d, dof=3.0, noise_std=std)
    split, whole = lh.amend(model, field_blocks=4), lh.amend(model)
    res = jax.tree.map(lambda v: 0.2 * jnp.stack([v, -v]), model.init(jax.random.PRNGKey(2)))
    t = jax.tree.map(lambda v: 0.3 * v, model.init(jax.random.PRNGKey(7)))

    def kl(lik, strategy):
        f = jax.jit(lambda p, r, t: (kl_value_and_grad(lik, p, r, strategy), kl_metric(lik, p, r, t, strategy)))
        return jax.tree.leaves(f(pos, res, t))

    want = kl(whole, Vmap())
    for strategy in (Vmap(), ShardMap(devices=jax.devices()[:4], model_shards=4)):
        for a, b in zip(kl(split, strategy), want):
            np.testing.assert_allclose(a, b, rtol=1e-11, atol=1e-12)
