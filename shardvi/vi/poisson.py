"""Poisson likelihood for counts."""

from __future__ import annotations

import jax.numpy as jnp
from jax import tree_util as jtu

from ._checks import all_true, domain_of, finite_data
from .likelihood import Likelihood
from .normalization import gamma_ln, summed_over_data

__all__ = ["Poisson"]


class Poisson(Likelihood):
    """Poisson likelihood ``H(s) = sum(s - d log s)`` for a positive rate ``s``.

    Parameters
    ----------
    counts : array or pytree of arrays
        Non-negative observed counts ``d`` (a pytree leaf: ``self.counts``).

    Notes
    -----
    Fisher metric ``F = diag(1/s)``, transformation ``T(s) = 2 sqrt(s)``,
    normalized residual ``(d - s)/sqrt(s)``. The model must output ``s > 0``
    (e.g. through ``exp``).
    """

    def __init__(self, counts):
        d = finite_data(counts, "counts")
        if any(jnp.iscomplexobj(x) for x in jtu.tree_leaves(d)):
            raise TypeError("counts must be real")
        if not all(all_true(lambda a: a >= 0, x) for x in jtu.tree_leaves(d)):
            raise ValueError("counts must be non-negative")
        if not all(all_true(lambda a: a == jnp.round(a), x) for x in jtu.tree_leaves(d)):
            raise ValueError(
                "counts must be whole numbers (a Poisson likelihood is for counts): got fractional values; "
                "for continuous data use sv.Gaussian or sv.StudentT"
            )
        self.counts = d
        self.set_domain(domain_of(d))

    def energy(self, s):
        parts = jtu.tree_map(lambda si, di: jnp.sum(si - di * jnp.log(si)), s, self.counts)
        return sum(jtu.tree_leaves(parts))

    def normalization(self) -> float:
        """``sum(log d!)``."""
        return summed_over_data(lambda d: gamma_ln(d + 1.0), self.counts)

    lsm_is_transformation_vjp = True  # left_sqrt_metric below is (dT/ds)^T e

    def transformation(self, s):
        return jtu.tree_map(lambda x: 2.0 * jnp.sqrt(x), s)

    def metric(self, s, t):
        return jtu.tree_map(lambda si, ti: ti / si, s, t)

    def left_sqrt_metric(self, s, e):
        return jtu.tree_map(lambda si, ei: ei / jnp.sqrt(si), s, e)

    def normalized_residual(self, s):
        return jtu.tree_map(lambda si, di: (di - si) / jnp.sqrt(si), s, self.counts)

    @property
    def data_leaves(self):
        return {"Poisson": {"counts": self.counts}}
