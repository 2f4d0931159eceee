"""Posterior samples: a position plus residuals with a leading sample axis."""
from __future__ import annotations

from typing import Callable, Optional

import jax
import jax.numpy as jnp
from jax import tree_util as jtu

__all__ = ["Samples"]


@jtu.register_pytree_node_class
class Samples:
    """Samples ``pos + residuals[i]`` of an approximate posterior.

    Parameters
    ----------
    pos : pytree
        Latent position (the KL's expansion point / variational mean).
    residuals : pytree
        Same structure as ``pos`` with an extra leading axis of length
        ``n``; mirrored (antithetic) samples come in pairs ``+r, -r``.
        ``n = 0`` (MAP) is allowed.
    keys : array, optional
        RNG keys, one per sample pair (raw ``uint32`` keys, shape ``(n_pairs, 2)``).

    Notes
    -----
    ``len(samples)`` is ``n``. Iterating yields ``pos + residuals[i]``; with no
    residuals it yields ``pos`` once, and ``mean``/``mean_and_std`` reduce to
    the point estimate (std 0).
    """

    def __init__(self, pos, residuals, keys=None):
        self.pos = pos
        self.residuals = residuals
        self.keys = keys

    def tree_flatten(self):
        return (self.pos, self.residuals, self.keys), None

    @classmethod
    def tree_unflatten(cls, aux, children):
        return cls(*children)

    def __len__(self) -> int:
        leaves = jtu.tree_leaves(self.residuals)
        return int(leaves[0].shape[0]) if leaves else 0

    @property
    def samples(self):
        """All samples stacked along a leading axis (``pos[None]`` if there are none)."""
        if len(self) == 0:
            return jtu.tree_map(lambda p: p[None], self.pos)
        return jtu.tree_map(lambda p, r: p[None] + r, self.pos, self.residuals)

    def __iter__(self):
        stacked = self.samples
        n = max(len(self), 1)
        for i in range(n):
            yield jtu.tree_map(lambda x: x[i], stacked)

    def __getitem__(self, i):
        return jtu.tree_map(lambda x: x[i], self.samples)

    def at(self, pos) -> "Samples":
        """The same residuals around a new position."""
        if jtu.tree_structure(pos) != jtu.tree_structure(self.pos):
            raise ValueError("pos must have the same tree structure as samples.pos")
        return Samples(pos, self.residuals, self.keys)

    def map(self, fn: Callable):
        """``fn`` applied to every sample, stacked (vectorized with ``jax.vmap``)."""
        return jax.vmap(fn)(self.samples)

    def mean(self, fn: Optional[Callable] = None):
        """Sample mean of ``fn(sample)`` (of the samples themselves if ``fn`` is None)."""
        return self.mean_and_std(fn)[0]

    def mean_and_std(self, fn: Optional[Callable] = None, correct_bias: bool = True):
        """Sample mean and standard deviation of ``fn(sample)``.

        ``correct_bias`` divides the variance by ``n - 1`` (``n > 1``).
        """
        vals = self.map(fn) if fn is not None else self.samples
        n = max(len(self), 1)
        mean = jtu.tree_map(lambda v: jnp.mean(v, axis=0), vals)
        if n == 1:
            return mean, jtu.tree_map(lambda m: jnp.zeros_like(jnp.real(m)), mean)
        ddof = 1 if correct_bias else 0
        std = jtu.tree_map(lambda v: jnp.std(v, axis=0, ddof=ddof), vals)
        return mean, std

    def __repr__(self):
        return f"Samples(n={len(self)}, pos={jtu.tree_map(lambda x: x.shape, self.pos)})"
