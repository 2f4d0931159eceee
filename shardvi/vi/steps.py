"""The engine's steps as pure functions: MGVI draw, geoVI update, KL minimization, sample diagnostics.

Each step maps a batch of samples over devices with a strategy
(:mod:`shardvi.parallel`) and is a pure, jittable function of its arrays
(``likelihood``, positions, residuals, keys) with the solver configuration and
the strategy static. :class:`~shardvi.OptimizeVI` (and so
:func:`~shardvi.optimize_kl`) compiles exactly these functions with
:func:`~shardvi.parallel.reproducible_jit` and loops over them, adding only
host-side services (progress, checkpoints, compiling ahead); a loop of one's
own over them gives the driver's bits::

    step = sv.parallel.reproducible_jit(sv.vi.steps.draw_samples, static_argnames=("config", "strategy"))
    residuals, info = step(lh, pos, keys, config=sv.CGConfig(), strategy=sv.parallel.Vmap())

With ``mirror_samples`` the driver draws ``n`` linear residuals with ``n`` keys
(``jax.random.split`` of its iteration key), interleaves each with its mirror
(:func:`~shardvi.vi.samples.interleave_pairs`: ``r_0, -r_0, r_1, ...``) and
curves them with every key repeated twice and the signs ``+1, -1, ...``.

A likelihood split over the field (``amend(model, field_blocks=...)``) takes
its latents marked with :func:`~shardvi.vi.field_split.split_latent`; every
other likelihood takes plain pytrees. Where its blocks do not divide the
grid's rows, the latents it returns hold the blocks' padding rows:
:func:`~shardvi.vi.field_split.unpadded_latent` cuts them off.
"""

from __future__ import annotations

from typing import NamedTuple

import jax
import jax.numpy as jnp
from jax import tree_util as jtu

from .. import tree_math as tm
from ..minimizers.solution import Solution
from ..parallel.grid import unsplit
from .field_split import per_device
from .kl import kl_metric, kl_value_and_grad
from .masks import project
from .sampling import draw_linear_residual, nonlinearly_update_residual

__all__ = ["SampleInfo", "draw_samples", "minimize_kl", "sample_diagnostics", "update_samples"]


class SampleInfo(NamedTuple):
    """Per-sample solver record of a sampling step.

    Attributes
    ----------
    nit : jax.Array, shape (n,)
        Iterations of each sample's solve (CG or Newton).
    status : jax.Array, shape (n,)
        Each solve's :class:`~shardvi.minimizers.Status` code.
    finite : jax.Array, shape ()
        Whether every residual is finite.
    """

    nit: jax.Array
    status: jax.Array
    finite: jax.Array


def draw_samples(likelihood, pos, keys, config, strategy, sample_mask=None):
    """MGVI: one linear residual per key, ``r_i ~ N(0, M(pos)^{-1})``, mapped over ``strategy``'s devices.

    Parameters
    ----------
    likelihood : Likelihood
        On the latent space.
    pos : pytree
        Expansion point.
    keys : jax.Array, shape (n, 2)
        One raw key per residual (the same key gives the same residual on any device).
    config : CGConfig
        The sampling CG's stopping rules (static).
    strategy : shardvi.parallel.Strategy
        How the residuals are mapped over devices (static).
    sample_mask : pytree of bool, optional
        False for point-estimated entries (static).

    Returns
    -------
    residuals : pytree with a leading axis of ``n``
    info : SampleInfo
    """

    def one(lik, p, k):
        lik, p = per_device(lik, p)
        r, info = draw_linear_residual(lik, p, k, config, sample_mask=sample_mask)
        return r, info.nit, info.status

    r, nit, status = unsplit(strategy.map(one, (None, None, 0))(likelihood, pos, keys))
    return r, SampleInfo(nit, status, tm.all_finite(r))


def update_samples(likelihood, pos, residuals, keys, signs, config, strategy, sample_mask=None):
    """geoVI: curve each residual with its metric sample's key and sign (:func:`nonlinearly_update_residual`).

    ``residuals``, ``keys`` (raw, shape ``(m, 2)``) and ``signs`` (shape ``(m,)``, ``+1``/``-1``) share
    their leading axis; ``config`` is a ``NewtonCGConfig``. Returns ``(residuals, SampleInfo)``.
    """

    def one(lik, p, r, k, s):
        lik, p, r = per_device(lik, p, r)
        r, info = nonlinearly_update_residual(lik, p, r, k, s, config, sample_mask=sample_mask)
        return r, info.nit, info.status

    r, nit, status = unsplit(strategy.map(one, (None, None, 0, 0, 0))(likelihood, pos, residuals, keys, signs))
    return r, SampleInfo(nit, status, tm.all_finite(r))


def minimize_kl(likelihood, pos, residuals, config, strategy, opt_mask=None):
    """Minimize the sample-averaged KL ``mean_i H(pos + r_i)`` over ``pos`` (residuals fixed).

    ``config`` is a :class:`~shardvi.minimizers.Minimizer` (``NewtonCGConfig``, ...); the metric
    ``mean_i M(pos + r_i) >= I`` is its Hessian. ``opt_mask`` (False: constant entries) is static.
    Returns ``(Solution, finite)`` with ``finite`` whether the result and its KL are finite.
    """
    keep = jtu.tree_map(lambda _: True, likelihood.domain) if opt_mask is None else opt_mask

    def fun_and_grad(x):
        v, g = kl_value_and_grad(likelihood, x, residuals, strategy)
        return v, project(keep, g)

    def hessp(x, t):
        return project(keep, kl_metric(likelihood, x, residuals, project(keep, t), strategy))

    # the metric mean_i M(pos + r_i) >= I: non-positive curvature means a broken likelihood metric
    res = config.minimize(fun_and_grad, hessp, pos, min_curvature=1.0)
    if not isinstance(res, Solution):
        raise TypeError(
            f"kl_minimization: {type(config).__name__}.minimize must return a "
            f"shardvi.minimizers.Solution, got {type(res).__name__}"
        )
    return unsplit(res), tm.all_finite(res.x) & jnp.isfinite(res.fun)


def sample_diagnostics(likelihood, pos, residuals, strategy):
    """``((chi^2 sum, dof) of the likelihood, (chi^2 sum, dof) of the prior)`` over the samples ``pos + r_i``.

    The likelihood part is ``(None, 0)`` where the likelihood has no normalized residual.
    """
    return likelihood.layout.chi2_sums(likelihood, pos, residuals, strategy)
