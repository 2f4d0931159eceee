"""RNG keys as the engine stores them: one threefry2x32 key as its raw ``uint32[2]`` data."""

from __future__ import annotations

import jax
import jax.numpy as jnp
import numpy as np

__all__ = ["raw_key"]


def raw_key(key, argname="key"):
    """One threefry2x32 key as its raw ``uint32[2]`` data (typed keys are unwrapped).

    Only threefry2x32 keys are supported: the host-side key splitting and the
    stored per-pair keys (``Samples.keys``, checkpoints) are threefry data, and
    samples must be bitwise reproducible from them.
    """
    if key is None:
        raise TypeError(f"{argname} is required (e.g. jax.random.PRNGKey(0))")
    if not isinstance(key, (jax.Array, np.ndarray)):
        raise TypeError(
            f"{argname} must be a jax.random key (PRNGKey(seed) or jax.random.key(seed)), got {type(key).__name__}"
        )
    if jnp.issubdtype(key.dtype, jax.dtypes.prng_key):
        impl = str(jax.random.key_impl(key))
        if impl != "threefry2x32":
            raise TypeError(
                f"{argname} is a {impl!r} key; only threefry2x32 keys are supported (the default: "
                f"jax.random.key(seed) or jax.random.PRNGKey(seed)), so that samples are bitwise "
                f"reproducible from their stored keys"
            )
        if key.shape != ():
            raise TypeError(f"{argname} must be one key, got a batch of shape {key.shape}")
        key = jax.random.key_data(key)
    if key.dtype != np.uint32 or key.shape != (2,):
        hint = ""
        if key.dtype == np.uint32 and key.ndim == 2 and key.shape[1] == 2:
            hint = " (a batch of keys: pass one key)"
        elif key.dtype == np.uint32 and key.shape == (4,):
            hint = " (an 'rbg' key? only threefry2x32 keys are supported)"
        raise TypeError(
            f"{argname} must be one threefry2x32 jax.random key (PRNGKey(seed) or "
            f"jax.random.key(seed)), got dtype {key.dtype} shape {key.shape}{hint}"
        )
    return jnp.asarray(key)
