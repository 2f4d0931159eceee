"""Subprocess body for the fault-injection test: a resumable optimize_kl run.

usage: python _fault_worker.py CHECKPOINT_DIR OUTPUT_NPZ CACHE_DIR
"""

import os
import sys

os.environ["JAX_PLATFORMS"] = "cpu"
import jax

jax.config.update("jax_enable_x64", True)
jax.config.update("jax_compilation_cache_dir", sys.argv[3])
jax.config.update("jax_persistent_cache_min_compile_time_secs", 0.0)
jax.config.update("jax_persistent_cache_min_entry_size_bytes", 0)

import jax.numpy as jnp  # noqa: E402
import numpy as np  # noqa: E402

import shardvi as sv  # noqa: E402

N_ITER = 8


def main(ckpt_dir, out):
    rng = np.random.default_rng(0)
    n = 16
    model = sv.Model(
        lambda x: jnp.exp(0.6 * x["f"]) + 0.1 * x["g"],
        {"f": jax.ShapeDtypeStruct((n,), jnp.float64), "g": jax.ShapeDtypeStruct((), jnp.float64)},
    )
    lh = sv.Gaussian(np.exp(0.5 * rng.normal(size=n)), noise_std=0.3).amend(model)
    samples, state = sv.optimize_kl(
        lh,
        {"f": jnp.zeros(n), "g": jnp.zeros(())},
        key=jax.random.PRNGKey(5),
        n_total_iterations=N_ITER,
        n_samples=2,
        sample_mode=lambda i: "nonlinear_resample" if i % 3 else "linear_resample",
        linear_sampling=sv.CGConfig(tol=1e-8),
        nonlinear_update=sv.NewtonCGConfig(xtol=1e-8, maxiter=5),
        kl_minimization=sv.NewtonCGConfig(xtol=1e-8, maxiter=5),
        checkpoint_dir=ckpt_dir if ckpt_dir != "-" else None,
        resume=ckpt_dir != "-",
    )
    leaves = jax.tree_util.tree_leaves((samples.pos, samples.residuals, samples.keys))
    np.savez(out, *[np.asarray(x) for x in leaves], nit=state.nit)


if __name__ == "__main__":
    main(sys.argv[1], sys.argv[2])
