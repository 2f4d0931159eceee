"""Generative model: a function of a standard-normal latent pytree."""
from __future__ import annotations

import math
from typing import Callable

import jax
import jax.numpy as jnp
import numpy as np
from jax import tree_util as jtu

__all__ = ["Model", "check_latent", "normalize_domain"]


def normalize_domain(domain, argname: str = "domain"):
    """Validate a pytree of ``jax.ShapeDtypeStruct`` (arrays are turned into their shape/dtype)."""
    leaves, treedef = jtu.tree_flatten(domain)
    if not leaves:
        raise ValueError(f"{argname} must contain at least one jax.ShapeDtypeStruct leaf, got {domain!r}")
    out = []
    for leaf in leaves:
        if isinstance(leaf, jax.ShapeDtypeStruct):
            sds = leaf
        elif hasattr(leaf, "shape") and hasattr(leaf, "dtype"):
            sds = jax.ShapeDtypeStruct(leaf.shape, leaf.dtype)
        else:
            raise TypeError(f"{argname} leaves must be jax.ShapeDtypeStruct, got {type(leaf).__name__}")
        if not jnp.issubdtype(sds.dtype, jnp.inexact):
            raise TypeError(f"{argname} leaves must have a floating dtype, got {sds.dtype}")
        out.append(sds)
    return jtu.tree_unflatten(treedef, out)


def check_latent(x, domain, argname: str) -> None:
    """Raise a clear error unless ``x`` matches ``domain`` in structure, shapes and finiteness."""
    xs, xdef = jtu.tree_flatten(x)
    ds, ddef = jtu.tree_flatten(domain)
    if xdef != ddef:
        raise ValueError(f"{argname} has tree structure {xdef}, expected {ddef} (the model's domain)")
    for i, (a, d) in enumerate(zip(xs, ds)):
        if tuple(jnp.shape(a)) != tuple(d.shape):
            raise ValueError(f"{argname} leaf {i} has shape {tuple(jnp.shape(a))}, expected {tuple(d.shape)}")
    if not all(_all_finite(a) for a in xs):
        raise ValueError(f"{argname} contains non-finite values (nan or inf)")


def _all_finite(a) -> bool:
    """On the host where the values are (no compilation); with JAX for arrays spread over processes."""
    if isinstance(a, jax.Array) and not a.is_fully_addressable:
        return bool(jnp.all(jnp.isfinite(a)))
    return bool(np.all(np.isfinite(np.asarray(a))))


class Model:
    """A forward model ``s = call(xi)`` with a standard-normal latent ``xi``.

    Parameters
    ----------
    call : callable
        Pure JAX function of one latent pytree.
    domain : pytree of jax.ShapeDtypeStruct
        Shapes and dtypes of the latent parameters ``xi ~ N(0, I)``.

    Attributes
    ----------
    target : pytree of jax.ShapeDtypeStruct
        Shapes and dtypes of ``call(xi)`` (from ``jax.eval_shape``).
    """

    def __init__(self, call: Callable, domain):
        if not callable(call):
            raise TypeError(f"call must be callable, got {type(call).__name__}")
        self.call = call
        self.domain = normalize_domain(domain)
        self.target = jax.eval_shape(call, self.domain)

    def __call__(self, xi):
        return self.call(xi)

    def init(self, key):
        """Standard-normal latent pytree drawn with ``key`` (one subkey per leaf)."""
        leaves, treedef = jtu.tree_flatten(self.domain)
        keys = jax.random.split(key, len(leaves))
        return jtu.tree_unflatten(
            treedef, [jax.random.normal(k, d.shape, d.dtype) for k, d in zip(keys, leaves)])

    @property
    def size(self) -> int:
        """Number of latent degrees of freedom."""
        return int(sum(math.prod(d.shape) for d in jtu.tree_leaves(self.domain)))

    def __repr__(self):
        return f"Model(call={getattr(self.call, '__name__', self.call)!r}, domain={self.domain})"
