"""A small nonlinear problem shared by the compile-cache and precompile tests (not a test module)."""

import jax
import jax.numpy as jnp

import shardvi as sv


def exp_problem():
    """``exp(0.3 a) + tile(b, 2)`` on two latent leaves, Gaussian noise 0.2: ``(likelihood, start position)``."""
    domain = {"a": jax.ShapeDtypeStruct((6,), jnp.float64), "b": jax.ShapeDtypeStruct((3,), jnp.float64)}
    model = sv.Model(lambda xi: jnp.exp(0.3 * xi["a"]) + jnp.tile(xi["b"], 2), domain)
    truth = model.init(jax.random.PRNGKey(0))
    data = model(truth) + 0.2 * jax.random.normal(jax.random.PRNGKey(1), (6,))
    lh = sv.Gaussian(data, noise_std=0.2).amend(model)
    return lh, jax.tree.map(lambda x: 0.1 * x, model.init(jax.random.PRNGKey(2)))
