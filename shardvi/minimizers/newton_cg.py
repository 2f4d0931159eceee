"""Newton-CG with a backtracking (Armijo) line search, one jittable loop."""
from __future__ import annotations

from typing import Callable, NamedTuple, Optional

import jax
import jax.numpy as jnp

from .. import tree_math as tm
from .cg import cg_solve
from .config import NewtonCGConfig
from .progress import log_iteration
from .status import Status

__all__ = ["OptimizeResult", "newton_cg"]

_ARMIJO_C1 = 1e-4


class OptimizeResult(NamedTuple):
    """Result of a minimizer.

    Attributes
    ----------
    x : pytree
        Final position.
    fun : float array
        Objective at ``x``.
    grad : pytree
        Gradient at ``x``.
    nit : int array
        Outer iterations.
    ncg : int array
        Inner CG iterations summed over all outer iterations (0 for optax).
    nfev : int array
        Objective evaluations.
    status : int array
        A :class:`~shardvi.minimizers.Status` code.
    """

    x: object
    fun: jax.Array
    grad: object
    nit: jax.Array
    ncg: jax.Array
    nfev: jax.Array
    status: jax.Array

    @property
    def converged(self):
        return self.status == Status.CONVERGED


class _State(NamedTuple):
    x: object
    f: jax.Array
    g: object
    nit: jax.Array
    ncg: jax.Array
    nfev: jax.Array
    last_decrease: jax.Array
    status: jax.Array


def newton_cg(fun_and_grad: Callable, hessp: Callable, x0, config: NewtonCGConfig = NewtonCGConfig(), *,
              hessp_at: Optional[Callable] = None) -> OptimizeResult:
    """Minimize a smooth function with truncated Newton steps.

    Parameters
    ----------
    fun_and_grad : callable
        ``x -> (f(x), grad f(x))``.
    hessp : callable
        ``(x, v) -> H(x) v`` with ``H`` symmetric positive (semi-)definite, e.g.
        the Hessian or a Gauss-Newton / Fisher metric.
    x0 : pytree
        Starting point.
    config : NewtonCGConfig
        Stopping rules and inner CG settings.
    hessp_at : callable, optional
        ``x -> (v -> H(x) v)``, the same operator with the work that depends on
        ``x`` alone done once per Newton step (e.g. a linearization) instead of
        in every inner CG iteration; used for the CG solves when given.

    Returns
    -------
    OptimizeResult

    Notes
    -----
    Each iteration solves ``H p = -g`` by CG (relative tolerance
    ``min(cg.tol, 0.5, sqrt(|g|))``, absolute energy tolerance
    ``energy_reduction_factor`` times the previous decrease), falls back to
    ``-g`` when ``p`` is no descent direction, and halves the step until the
    Armijo condition holds. Pure and jittable; vmappable.
    """
    if not isinstance(config, NewtonCGConfig):
        raise TypeError(f"config must be a NewtonCGConfig, got {type(config).__name__}")
    cgc = config.cg
    n = tm.size(x0)
    f0, g0 = fun_and_grad(x0)
    real = jnp.result_type(f0)
    off = jnp.asarray(-1.0, real)
    half = jnp.asarray(0.5, real)  # a python 0.5**k would promote float32 iterates to float64 under x64
    absdelta = off if config.absdelta is None else jnp.asarray(config.absdelta, real)
    xtol = off if config.xtol is None else jnp.asarray(config.xtol, real)
    gtol = off if config.gtol is None else jnp.asarray(config.gtol, real)

    finite0 = jnp.isfinite(f0) & tm.all_finite(g0)
    status0 = jnp.where(finite0, Status.RUNNING, Status.NONFINITE)
    status0 = jnp.where(finite0 & (config.miniter == 0) & (tm.norm(g0) <= gtol), Status.CONVERGED, status0)
    zero_i = jnp.zeros((), jnp.int32)
    state = _State(x0, f0, g0, zero_i, zero_i, jnp.ones((), jnp.int32), jnp.asarray(jnp.inf, real),
                   status0.astype(jnp.int32))

    def cond(s):
        return s.status == Status.RUNNING

    def body(s):
        gnorm = tm.norm(s.g)
        eta = jnp.minimum(0.5, jnp.sqrt(gnorm))
        rtol = eta if cgc.tol is None else jnp.minimum(cgc.tol, eta)
        inner_absdelta = jnp.where(jnp.isfinite(s.last_decrease),
                                   config.energy_reduction_factor * s.last_decrease, -1.0)
        if cgc.absdelta is not None:
            inner_absdelta = jnp.maximum(inner_absdelta, cgc.absdelta)
        op = hessp_at(s.x) if hessp_at is not None else (lambda v: hessp(s.x, v))
        res = cg_solve(op, tm.scale(-1.0, s.g), tol=rtol, resnorm=cgc.resnorm,
                       absdelta=inner_absdelta, miniter=cgc.miniter, maxiter=cgc.maxiter, name=cgc.name)
        p = res.x
        slope = tm.vdot(s.g, p)
        descent = (slope < 0) & tm.all_finite(p)
        p = tm.where(descent, p, tm.scale(-1.0, s.g))
        slope = jnp.where(descent, slope, -gnorm**2)

        # backtracking line search on the Armijo condition: step 2**-k, k = 0, 1, ...; the loop starts at
        # k = -1 (nothing evaluated yet) so that fun_and_grad is traced once here, not twice
        def ls_cond(c):
            k, _, f_new, _ = c
            bad = ~jnp.isfinite(f_new) | (f_new > s.f + _ARMIJO_C1 * half**k * slope)
            return (k < 0) | (bad & (k < config.max_line_search_steps))

        def ls_body(c):
            k = c[0] + 1
            x_new = tm.axpy(half**k, p, s.x)
            f_new, g_new = fun_and_grad(x_new)
            return k, x_new, f_new, g_new

        k, x_new, f_new, g_new = jax.lax.while_loop(ls_cond, ls_body, (-jnp.ones((), jnp.int32), s.x, s.f, s.g))
        ls_ok = jnp.isfinite(f_new) & (f_new <= s.f + _ARMIJO_C1 * half**k * slope)
        finite = ls_ok & tm.all_finite(g_new)
        step = tm.scale(half**k, p)
        decrease = s.f - f_new
        nit = s.nit + 1
        step_l1 = sum(jnp.sum(jnp.abs(leaf)) for leaf in jax.tree_util.tree_leaves(step))
        done = (nit >= config.miniter) & (
            ((decrease >= 0) & (decrease <= absdelta)) | (step_l1 / n <= xtol) | (tm.norm(g_new) <= gtol))
        status = jnp.select(
            [~ls_ok, ~finite, done, nit >= config.maxiter],
            [Status.LINE_SEARCH_FAILED, Status.NONFINITE, Status.CONVERGED, Status.MAX_ITERATIONS],
            Status.RUNNING).astype(jnp.int32)
        new = _State(x_new, f_new, g_new, nit, s.ncg + res.nit, s.nfev + k + 1, decrease, status)
        # a failed line search keeps the last good point
        keep = jax.tree_util.tree_map(lambda a, o: jnp.where(finite, a, o), new,
                                      s._replace(nit=nit, ncg=new.ncg, nfev=new.nfev, status=status))
        log_iteration(config.name, nit=nit, energy=keep.f, decrease=decrease, cg_nit=res.nit, step=half**k)
        return keep

    s = jax.lax.while_loop(cond, body, state)
    return OptimizeResult(s.x, s.f, s.g, s.nit, s.ncg, s.nfev, s.status)
