"""Input validation shared by the likelihood constructors.

The checks run in NumPy on the host: validating concrete user data needs no
XLA compilation (each eager JAX operation would compile a small program and
keep it in memory).
"""
from __future__ import annotations

import jax
import jax.numpy as jnp
import numpy as np
from jax import tree_util as jtu

__all__ = ["finite_data", "positive_like", "to_device", "domain_of"]


def finite_data(data, argname: str = "data"):
    """Convert leaves to arrays and reject non-finite or non-numeric entries."""
    leaves, treedef = jtu.tree_flatten(data)
    if not leaves:
        raise ValueError(f"{argname} must be a non-empty array or pytree of arrays")
    out = []
    for leaf in leaves:
        try:
            arr = jnp.asarray(leaf)
        except TypeError as err:
            raise TypeError(f"{argname} must contain numeric arrays, got {type(leaf).__name__}") from err
        if not (jnp.issubdtype(arr.dtype, jnp.number)):
            raise TypeError(f"{argname} must be numeric, got dtype {arr.dtype}")
        host = np.asarray(arr)
        if not jnp.issubdtype(arr.dtype, jnp.inexact):
            host = host.astype(jnp.result_type(float))
            arr = jnp.asarray(host)
        n_bad = int(np.sum(~np.isfinite(host)))
        if n_bad:
            raise ValueError(f"{argname} contains {n_bad} non-finite value(s) (nan or inf)")
        out.append(arr)
    return jtu.tree_unflatten(treedef, out)


def positive_like(value, data, argname: str):
    """Broadcast a scalar/array/pytree of strictly positive finite numbers to ``data``'s leaves."""
    d_leaves, treedef = jtu.tree_flatten(data)
    if jtu.tree_structure(value) == treedef:  # per-leaf values (also for single-leaf pytrees)
        v_leaves = jtu.tree_leaves(value)
    else:
        v_leaves = [value] * len(d_leaves)
    out = []
    for v, d in zip(v_leaves, d_leaves):
        if isinstance(v, bool) or v is None:
            raise TypeError(f"{argname} must be a positive number or array, got {v!r}")
        try:
            arr = jnp.asarray(v, dtype=jnp.finfo(d.dtype).dtype)
        except TypeError as err:
            raise TypeError(f"{argname} must be a positive number or array, got {type(v).__name__}") from err
        host = np.asarray(arr)
        if not bool(np.all(np.isfinite(host) & (host > 0))):
            raise ValueError(f"{argname} must be strictly positive and finite everywhere")
        try:
            host = np.broadcast_to(host, d.shape)
        except ValueError as err:
            raise ValueError(f"{argname} has shape {arr.shape}, which does not broadcast to the data "
                             f"shape {d.shape}") from err
        out.append(host)
    return jtu.tree_unflatten(treedef, out)


def to_device(tree):
    """NumPy leaves as JAX arrays (a transfer, no compilation)."""
    return jtu.tree_map(jnp.asarray, tree)


def domain_of(data):
    """ShapeDtypeStruct pytree of ``data``."""
    return jtu.tree_map(lambda x: jax.ShapeDtypeStruct(x.shape, x.dtype), data)
