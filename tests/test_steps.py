"""The engine's public steps (``shardvi.vi.steps``): a loop of one's own over them gives ``optimize_kl``'s bits."""

import jax
import jax.numpy as jnp
import numpy as np
from _small_problem import exp_problem

import shardvi as sv
from shardvi.vi import steps
from shardvi.vi.samples import interleave_pairs

CG = sv.CGConfig(tol=1e-8, maxiter=50)
NEWTON = sv.NewtonCGConfig(xtol=1e-6, maxiter=5)
KL = sv.NewtonCGConfig(xtol=1e-6, maxiter=4)
MODES = ("linear_resample", "nonlinear_resample", "nonlinear_resample")


def _own_loop(lh, pos, key, n):
    """MGVI, then geoVI: the driver's key and sign conventions (``shardvi.vi.steps``), written out."""
    strategy = sv.parallel.Vmap()
    jit = sv.parallel.reproducible_jit
    draw = jit(steps.draw_samples, static_argnames=("config", "strategy"))
    update = jit(steps.update_samples, static_argnames=("config", "strategy"))
    minimize = jit(steps.minimize_kl, static_argnames=("config", "strategy"))
    key = jax.random.key_data(key) if jnp.issubdtype(key.dtype, jax.dtypes.prng_key) else key
    history = []
    for mode in MODES:
        key, k_samples = jax.random.split(key)
        keys = jax.random.split(k_samples, n)
        r, info = draw(lh, pos, keys, config=CG, strategy=strategy)
        assert bool(info.finite) and info.nit.shape == (n,)
        r = interleave_pairs(r)  # r_0, -r_0, r_1, -r_1, ...
        if mode == "nonlinear_resample":
            signs = np.tile([1.0, -1.0], n)
            r, info = update(lh, pos, r, jnp.repeat(keys, 2, axis=0), signs, config=NEWTON, strategy=strategy)
        res, finite = minimize(lh, pos, r, config=KL, strategy=strategy)
        assert bool(finite)
        pos = res.x
        history.append(float(res.fun))
    return pos, r, history


def test_own_loop_over_the_public_steps_equals_optimize_kl():
    lh, pos = exp_problem()
    key = jax.random.PRNGKey(8)
    samples, state = sv.optimize_kl(
        lh,
        pos,
        key=key,
        n_total_iterations=len(MODES),
        n_samples=2,
        sample_mode=lambda i: MODES[i],
        linear_sampling=CG,
        nonlinear_update=NEWTON,
        kl_minimization=KL,
        progress=False,
    )
    own_pos, own_res, own_kl = _own_loop(lh, pos, key, 2)
    for a, b in zip(jax.tree.leaves((samples.pos, samples.residuals)), jax.tree.leaves((own_pos, own_res))):
        np.testing.assert_array_equal(np.asarray(a), np.asarray(b))
    assert [r.kl_energy for r in state.history] == own_kl
