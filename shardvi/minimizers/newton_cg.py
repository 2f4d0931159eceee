"""Newton-CG with a backtracking (Armijo) line search, one jittable loop."""

from __future__ import annotations

import dataclasses
from collections.abc import Callable
from typing import NamedTuple

import jax
import jax.numpy as jnp

from .. import tree_math as tm
from ._validate import check_callables, check_iters, check_name, check_tol
from .cg import CGConfig, cg_solve
from .minimizer import Minimizer
from .progress import log_iteration
from .solution import Solution
from .status import Status

__all__ = ["NewtonCGConfig", "newton_cg"]

_ARMIJO_C1 = 1e-4
_ENERGY_RULE_MINITER = 6  # the inner CG's energy rule counts from this iteration on (NIFTy's CG miniter)
_F_ROUNDING = 100.0  # energy changes below this many eps * |f| are taken as rounding noise


@dataclasses.dataclass(frozen=True)
class NewtonCGConfig(Minimizer):
    """Newton-CG as a :class:`~shardvi.minimizers.Minimizer`: its stopping rules.

    ``NewtonCGConfig(...).minimize(fun_and_grad, hessp, x0, min_curvature=c)``
    is ``newton_cg(fun_and_grad, hessp, x0, config, min_curvature=c)``.

    Parameters
    ----------
    absdelta : float or None
        Stop when the energy decreases by at most ``absdelta`` in one full
        (not backtracked) Newton step.
    xtol : float or None
        Stop when the mean absolute entry of the Newton step, ``|dx|_1 / n``,
        is at most ``xtol`` (scipy's ``xtol`` for ``method='Newton-CG'``). Only
        a Newton step counts, not a gradient step or one cut short by the
        inner CG or by backtracking (see :func:`~shardvi.minimizers.newton_cg`).
    gtol : float or None
        Stop when the gradient norm is at most ``gtol``.
    miniter, maxiter : int
        Iteration bounds.
    cg : CGConfig
        Inner CG. Its relative tolerance is tightened to the Eisenstat-Walker
        forcing term ``min(0.5, sqrt(|g|))``.
    energy_reduction_factor : float or None
        In (0, 1]: also stop the inner CG (from its 6th iteration on, NIFTy's
        ``miniter``) when its energy changes by at most this factor times the
        previous Newton decrease (NIFTy's rule; ``0.1`` there). None (default):
        off. The rule saves CG iterations per step but stalls on ill-conditioned
        problems, where it makes Newton converge linearly.
    max_line_search_steps : int
        Backtracking halvings of the step before the line search gives up.
    name : str or None
        When set, every iteration is logged through ``logging`` under this name.
    """

    absdelta: float | None = None
    xtol: float | None = 1e-8
    gtol: float | None = None
    miniter: int = 0
    maxiter: int = 50
    cg: CGConfig = dataclasses.field(default_factory=lambda: CGConfig(tol=0.5, maxiter=500))
    energy_reduction_factor: float | None = None
    max_line_search_steps: int = 30
    name: str | None = None

    def __post_init__(self):
        for f in ("absdelta", "xtol", "gtol"):
            check_tol("NewtonCGConfig", f, getattr(self, f))
        check_iters("NewtonCGConfig", self.miniter, self.maxiter)
        if not isinstance(self.cg, CGConfig):
            raise TypeError(f"NewtonCGConfig.cg must be a CGConfig, got {type(self.cg).__name__}")
        check_tol("NewtonCGConfig", "energy_reduction_factor", self.energy_reduction_factor, upper=1.0)
        if self.energy_reduction_factor == 0:
            raise ValueError("NewtonCGConfig.energy_reduction_factor must be in (0, 1], got 0")
        if (
            isinstance(self.max_line_search_steps, bool)
            or not isinstance(self.max_line_search_steps, int)
            or self.max_line_search_steps < 1
        ):
            raise ValueError(
                f"NewtonCGConfig.max_line_search_steps must be an int >= 1, got {self.max_line_search_steps!r}"
            )
        check_name("NewtonCGConfig", self.name)

    def minimize(self, fun_and_grad: Callable, hessp: Callable, x0, *, min_curvature: float | None = None) -> Solution:
        """:func:`newton_cg` with this configuration (see :meth:`Minimizer.minimize`)."""
        return newton_cg(fun_and_grad, hessp, x0, self, min_curvature=min_curvature)


class _State(NamedTuple):
    x: object
    f: jax.Array
    g: object
    nit: jax.Array
    ncg: jax.Array
    nfev: jax.Array
    last_decrease: jax.Array
    status: jax.Array
    fresh: jax.Array  # f and g not evaluated yet (the first pass of the loop evaluates them at x0)


def newton_cg(
    fun_and_grad: Callable,
    hessp: Callable,
    x0,
    config: NewtonCGConfig = NewtonCGConfig(),
    *,
    hessp_at: Callable | None = None,
    min_curvature: float | None = None,
    xtol_curvature: float | None = None,
) -> Solution:
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
    min_curvature : float, optional
        Declares ``H`` positive (semi-)definite by construction, a metric with
        ``d.H.d >= min_curvature |d|^2`` (``1`` for ``J^T F J + I``, ``0`` for
        a Gauss-Newton ``J^T J``). The inner CG checks it along every direction;
        a violation (beyond rounding) stops the minimizer at the current point
        with status ``NONPOSITIVE_CURVATURE``: the operator is broken. Without
        it (a true, possibly indefinite Hessian) non-positive curvature on the
        first CG direction falls back to a gradient step, and a run that ends
        at ``maxiter`` after such a step reports ``NONPOSITIVE_CURVATURE``.
    xtol_curvature : float, optional
        A lower bound (or an estimate) ``c`` of the smallest eigenvalue of
        ``H``, used to bound what the inner CG left unsolved (default:
        ``min_curvature`` where that is positive); see Notes.

    Returns
    -------
    Solution

    Notes
    -----
    Each iteration solves ``H p = -g`` by CG to the relative residual
    ``min(cg.tol, 0.5, sqrt(|g|))`` (Eisenstat-Walker), falls back to ``-g``
    when ``p`` is no descent direction, and halves the step until the Armijo
    condition holds (or, where the energy change is within ``100 eps |f|``,
    its derivative form ``g(x + p).p <= (1 - 2 c1) g.p``, exact for quadratics:
    Hager and Zhang's approximate Armijo condition).

    Convergence is judged on the full Newton step ``p* = p + H^-1 r`` (``r``
    the inner CG residual), never on the step taken: a step made small by an
    inner solve cut short, by the gradient fallback or by backtracking says
    nothing about the distance to the minimum. With ``xtol_curvature = c``,
    ``xtol`` tests the bound ``|p|_1 + sqrt(n) |r| / c`` and ``absdelta`` the
    decrease plus the model decrease left unsolved, ``|r|^2 / 2c``; without
    it both count only when the inner CG met its residual tolerance (and
    ``absdelta`` only for a step taken without backtracking). A Newton step
    that changes ``f`` by rounding noise only and does not reduce ``|g|``
    ends the run as converged (the precision floor, e.g. float32 with an
    ``xtol`` below it), and so does an exactly zero gradient.
    Pure and jittable; vmappable.
    """
    if not isinstance(config, NewtonCGConfig):
        raise TypeError(f"config must be a NewtonCGConfig, got {type(config).__name__}")
    check_callables("newton_cg", fun_and_grad=fun_and_grad, hessp=hessp)
    if hessp_at is not None:
        check_callables("newton_cg", hessp_at=hessp_at)
    check_tol("newton_cg", "min_curvature", min_curvature)
    check_tol("newton_cg", "xtol_curvature", xtol_curvature)
    cgc = config.cg
    if xtol_curvature is None and min_curvature is not None and min_curvature > 0:
        xtol_curvature = min_curvature
    n = tm.size(x0)
    # f and g at x0 are evaluated by the loop's first pass, at the line search's one call site of fun_and_grad:
    # each call site inlines the whole objective (for the engine: the model, its linearization and transpose),
    # and a separate evaluation here would inline it a second time (a larger program, a longer compile)
    f_shape = jax.eval_shape(fun_and_grad, x0)[0]
    real = jnp.result_type(f_shape.dtype)
    off = jnp.asarray(-1.0, real)
    half = jnp.asarray(0.5, real)  # a python 0.5**k would promote float32 iterates to float64 under x64
    absdelta = off if config.absdelta is None else jnp.asarray(config.absdelta, real)
    xtol = off if config.xtol is None else jnp.asarray(config.xtol, real)
    gtol = off if config.gtol is None else jnp.asarray(config.gtol, real)
    cg_resnorm = off if cgc.resnorm is None else jnp.asarray(cgc.resnorm, real)
    f_eps = jnp.asarray(_F_ROUNDING * jnp.finfo(real).eps, real)

    def started(f0, g0):
        """The state at x0 once ``f0, g0`` are known (converged at once at a stationary point)."""
        finite0 = jnp.isfinite(f0) & tm.all_finite(g0)
        status0 = jnp.where(finite0, Status.RUNNING, Status.NONFINITE)
        g0norm = tm.norm(g0)
        stationary0 = finite0 & (config.miniter == 0) & ((g0norm <= gtol) | (g0norm == 0))
        status0 = jnp.where(stationary0, Status.CONVERGED, status0)
        zero_i = jnp.zeros((), jnp.int32)
        one_i = jnp.ones((), jnp.int32)
        inf = jnp.asarray(jnp.inf, real)
        return _State(x0, f0, g0, zero_i, zero_i, one_i, inf, status0.astype(jnp.int32), jnp.bool_(False))

    # not yet evaluated: g = 0 makes the first pass's CG solve trivial (p = 0: x_new = x0)
    g_zero = tm.zeros_like(x0)
    state = started(jnp.full((), jnp.nan, real), g_zero)._replace(
        status=jnp.asarray(Status.RUNNING, jnp.int32), fresh=jnp.bool_(True)
    )

    def cond(s):
        return s.status == Status.RUNNING

    def body(s):
        gnorm = tm.norm(s.g)
        eta = jnp.minimum(0.5, jnp.sqrt(gnorm))
        rtol = eta if cgc.tol is None else jnp.minimum(cgc.tol, eta)
        inner_absdelta = off
        if config.energy_reduction_factor is not None:
            inner_absdelta = jnp.where(
                jnp.isfinite(s.last_decrease), config.energy_reduction_factor * s.last_decrease, off
            )
        if cgc.absdelta is not None:
            inner_absdelta = jnp.maximum(inner_absdelta, cgc.absdelta)
        op = hessp_at(s.x) if hessp_at is not None else (lambda v: hessp(s.x, v))
        res = cg_solve(
            op,
            tm.scale(-1.0, s.g),
            tol=rtol,
            resnorm=cgc.resnorm,
            absdelta=inner_absdelta,
            miniter=cgc.miniter,
            maxiter=cgc.maxiter,
            name=cgc.name,
            min_curvature=min_curvature,
            absdelta_miniter=_ENERGY_RULE_MINITER,
        )
        p = res.x
        slope = tm.vdot(s.g, p)
        descent = (slope < 0) & tm.all_finite(p)
        # a Newton step to trust: the inner CG met its residual tolerance (the same test as inside cg_solve)
        inner_solved = (res.status == Status.CONVERGED) & ((res.resnorm <= rtol * gnorm) | (res.resnorm <= cg_resnorm))
        newton = descent & inner_solved
        # non-positive curvature of a declared metric: a broken operator, stop here
        broken = (res.status == Status.NONPOSITIVE_CURVATURE) if min_curvature is not None else jnp.bool_(False)
        # no positive curvature along -g (CG's first direction): a gradient step, recorded in the status
        fallback_npc = (res.status == Status.NONPOSITIVE_CURVATURE) & ~descent
        p = tm.where(descent, p, tm.scale(-1.0, s.g))
        slope = jnp.where(descent, slope, -(gnorm**2))
        p_l1 = tm.abs_total(p)
        f_tol = f_eps * jnp.abs(s.f)  # energy changes below this are rounding noise

        def accepted(k, f_new, g_new):
            armijo = f_new <= s.f + _ARMIJO_C1 * half**k * slope
            # Hager-Zhang approximate Armijo: where f cannot resolve the decrease, its derivative can
            approx = (f_new <= s.f + f_tol) & (tm.vdot(g_new, p) <= (2 * _ARMIJO_C1 - 1) * slope)
            return jnp.isfinite(f_new) & (armijo | approx)

        # backtracking line search: step 2**-k, k = 0, 1, ...; the loop starts at k = -1 (nothing evaluated
        # yet) so that fun_and_grad is traced once here, not twice
        def ls_cond(c):  # the first pass only evaluates f and g at x0
            k, _, f_new, g_new = c
            more = ~s.fresh & ~broken & ~accepted(k, f_new, g_new) & (k < config.max_line_search_steps)
            return (k < 0) | more

        def ls_body(c):
            k = c[0] + 1
            x_new = tm.axpy(half**k, p, s.x)
            f_new, g_new = fun_and_grad(x_new)
            return k, x_new, f_new, g_new

        k, x_new, f_new, g_new = jax.lax.while_loop(ls_cond, ls_body, (-jnp.ones((), jnp.int32), s.x, s.f, s.g))
        ls_ok = accepted(k, f_new, g_new) & ~broken
        finite = ls_ok & tm.all_finite(g_new)
        decrease = s.f - f_new
        nit = s.nit + 1
        # the distance to the minimum (in the quadratic model) is the full Newton step p* = p + H^-1 r, r the
        # inner CG residual; a known curvature floor c bounds |H^-1 r| <= |r| / c (and the decrease left to
        # the model by r.H^-1.r / 2 <= |r|^2 / 2c); without one only a solve that met its residual tolerance
        # says p* ~ p
        if xtol_curvature is None:
            bounded = newton
            left_l1 = left_f = jnp.zeros((), real)
        else:
            bounded = descent & ((res.status == Status.CONVERGED) | (res.status == Status.MAX_ITERATIONS))
            left_l1 = jnp.sqrt(jnp.asarray(n, real)) * res.resnorm / xtol_curvature
            left_f = 0.5 * res.resnorm**2 / xtol_curvature
        # the full Newton step is below xtol: converged, even where rounding defeats the line search
        small_step = bounded & ((p_l1 + left_l1) / n <= xtol)
        small_decrease = bounded & (k == 0) & (decrease >= 0) & (decrease + left_f <= absdelta)
        gnorm_new = tm.norm(g_new)
        # rounding floor: a full Newton step (taken without backtracking, nothing left unsolved beyond rounding)
        # that changes f by rounding noise only and does not reduce |g|, as it must near a minimum, is noise:
        # e.g. float32 with an xtol below its precision
        floor = newton & (k == 0) & (jnp.abs(decrease) <= f_tol) & (left_f <= f_tol) & (gnorm_new >= gnorm)
        stationary = (gnorm_new <= gtol) | (gnorm_new == 0)
        done = (nit >= config.miniter) & (small_step | (finite & (small_decrease | floor | stationary)))
        status = jnp.select(
            [broken, done, ~ls_ok, ~finite, nit >= config.maxiter],
            [
                Status.NONPOSITIVE_CURVATURE,
                Status.CONVERGED,
                Status.LINE_SEARCH_FAILED,
                Status.NONFINITE,
                jnp.where(fallback_npc, Status.NONPOSITIVE_CURVATURE, Status.MAX_ITERATIONS),
            ],
            Status.RUNNING,
        ).astype(jnp.int32)
        new = _State(x_new, f_new, g_new, nit, s.ncg + res.nit, s.nfev + k + 1, decrease, status, s.fresh)
        # a failed line search keeps the last good point
        keep = jax.tree_util.tree_map(
            lambda a, o: jnp.where(finite, a, o), new, s._replace(nit=nit, ncg=new.ncg, nfev=new.nfev, status=status)
        )
        # the first pass: only x0's f and g (the rest of this pass worked on placeholders and is dropped)
        keep = jax.tree_util.tree_map(lambda a, o: jnp.where(s.fresh, a, o), started(f_new, g_new), keep)
        log_iteration(config.name, ~s.fresh, nit=nit, energy=keep.f, decrease=decrease, cg_nit=res.nit, step=half**k)
        return keep

    s = jax.lax.while_loop(cond, body, state)
    return Solution(s.x, s.f, s.g, s.nit, s.ncg, s.nfev, s.status)
