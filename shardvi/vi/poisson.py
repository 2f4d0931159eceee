"""Poisson likelihood for counts."""
from __future__ import annotations

import jax.numpy as jnp
from jax import tree_util as jtu

from .. import tree_math as tm
from ._checks import domain_of, finite_data
from .likelihood import Likelihood

__all__ = ["Poisson"]


def Poisson(counts) -> Likelihood:
    """Poisson likelihood ``H(s) = sum(s - d log s)`` for a positive rate ``s``.

    Parameters
    ----------
    counts : array or pytree of arrays
        Non-negative observed counts ``d``.

    Notes
    -----
    Fisher metric ``F = diag(1/s)``, transformation ``T(s) = 2 sqrt(s)``,
    normalized residual ``(d - s)/sqrt(s)``. The model must output ``s > 0``
    (e.g. through ``exp``).
    """
    d = finite_data(counts, "counts")
    if not all(bool(jnp.all(x >= 0)) for x in jtu.tree_leaves(d)):
        raise ValueError("counts must be non-negative")
    if any(jnp.iscomplexobj(x) for x in jtu.tree_leaves(d)):
        raise TypeError("counts must be real")

    def energy(s):
        parts = jtu.tree_map(lambda si, di: jnp.sum(si - di * jnp.log(si)), s, d)
        return sum(jtu.tree_leaves(parts))

    lh = Likelihood(
        energy, lambda s: jtu.tree_map(lambda x: 2.0 * jnp.sqrt(x), s), domain=domain_of(d),
        metric=lambda s, t: jtu.tree_map(lambda si, ti: ti / si, s, t),
        left_sqrt_metric=lambda s, e: jtu.tree_map(lambda si, ei: ei / jnp.sqrt(si), s, e),
        normalized_residual=lambda s: jtu.tree_map(lambda si, di: (di - si) / jnp.sqrt(si), s, d),
    )
    lh.data_leaves = {"Poisson": {"counts": d}}  # checkpoint fingerprint
    return lh
