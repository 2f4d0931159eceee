"""Standard Hamiltonian and the sample-averaged KL with its metric."""

from __future__ import annotations

import jax

from .. import tree_math as tm
from ..parallel.grid import is_slab, unsplit
from ..parallel.strategy import map_mean
from .field_split import one_zero_residual, per_device
from .layout import hamiltonian
from .likelihood import Likelihood

__all__ = ["hamiltonian", "hamiltonian_metric", "hamiltonian_metric_operator", "kl_value_and_grad", "kl_metric"]


def hamiltonian_metric(likelihood: Likelihood, xi, t):
    """``M(xi) t = J^T F J t + t``."""
    return hamiltonian_metric_operator(likelihood, xi)(t)


def hamiltonian_metric_operator(likelihood: Likelihood, xi):
    """``t -> M(xi) t`` with the model evaluated and linearized at ``xi`` once (for CG solves)."""
    op = likelihood.metric_operator(xi)
    return lambda t: tm.add(op(t), t)


def kl_value_and_grad(likelihood: Likelihood, pos, residuals, strategy):
    """Sample-averaged ``H`` and its gradient at ``pos`` with fixed residuals.

    ``residuals`` has a leading sample axis; with zero samples this is the MAP
    objective ``H(pos)``.
    """
    vg = likelihood.layout.hamiltonian_and_grad
    if _n(residuals) == 0:
        if not likelihood.layout.splits_latent:
            return vg(likelihood, pos)
        residuals = one_zero_residual(pos)  # mean over one zero residual: H(pos), evaluated per device

    def one(lik, p, r):  # a field-split likelihood: per device on slabs (per_device), the gradient a slab
        lik, p, r = per_device(lik, p, r)
        return vg(lik, tm.add(p, r))

    # the likelihood is passed to the strategy as a broadcast argument (its arrays are never closed over)
    return _like(pos, map_mean(strategy, one, (None, None, 0))(likelihood, pos, residuals))


def kl_metric(likelihood: Likelihood, pos, residuals, tangent, strategy):
    """Sample-averaged metric ``mean_i M(pos + r_i) t``."""
    if _n(residuals) == 0:
        if not likelihood.layout.splits_latent:
            return hamiltonian_metric(likelihood, pos, tangent)
        residuals = one_zero_residual(pos)

    def one(lik, p, r, t):
        lik, p, r, t = per_device(lik, p, r, t)
        return hamiltonian_metric(lik, tm.add(p, r), t)

    return _like(pos, map_mean(strategy, one, (None, None, 0, None))(likelihood, pos, residuals, tangent))


def _like(pos, out):
    """``out`` with plain arrays where ``pos`` has them: a field-split likelihood's slab outputs unwrapped
    unless the caller passed slabs (the engine, :func:`~shardvi.vi.field_split.split_latent`)."""
    if any(is_slab(x) for x in jax.tree_util.tree_leaves(pos, is_leaf=is_slab)):
        return out
    return unsplit(out)


def _n(residuals) -> int:
    leaves = jax.tree_util.tree_leaves(residuals)
    return int(leaves[0].shape[0]) if leaves else 0
