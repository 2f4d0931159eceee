"""Trust-region Newton-CG (Steihaug-Toint truncated CG), one jittable loop."""

from __future__ import annotations

import dataclasses
import math
from collections.abc import Callable
from typing import NamedTuple

import jax
import jax.numpy as jnp

from .. import tree_math as tm
from ._validate import check_callables, check_iters, check_name, check_tol
from .minimizer import Minimizer
from .newton_cg import _F_ROUNDING  # energy changes below this many eps * |f| are rounding noise: one rule
from .progress import log_iteration
from .solution import Solution
from .status import Status

__all__ = ["TrustRegionConfig"]

_SHRINK_BELOW, _GROW_ABOVE = 0.25, 0.75  # Nocedal & Wright, Alg. 4.1: ratio thresholds of the radius update
_SHRINK, _GROW = 0.25, 2.0  # ... and the factors


def _positive(owner: str, name: str, value) -> None:
    check_tol(owner, name, value, allow_none=False)
    if value == 0:
        raise ValueError(f"{owner}.{name} must be > 0, got {value!r}")


@dataclasses.dataclass(frozen=True)
class TrustRegionConfig(Minimizer):
    """Trust-region Newton-CG as a :class:`~shardvi.minimizers.Minimizer`: radius rules and stopping rules.

    ``TrustRegionConfig(...).minimize(fun_and_grad, hessp, x0)`` runs it;
    ``optimize_kl`` calls the same method on its ``kl_minimization``.
    The defaults of the radius rules are scipy's (``method='trust-ncg'``).

    Parameters
    ----------
    absdelta : float or None
        Stop when the energy decreases by at most ``absdelta`` in one accepted
        Newton step (an inner solve that met its residual tolerance inside the
        trust region).
    xtol : float or None
        Stop when the mean absolute entry of a Newton step, ``|p|_1 / n``, is
        at most ``xtol`` (as :class:`~shardvi.minimizers.NewtonCGConfig`). A
        step cut by the trust region or by ``cg_maxiter`` does not count.
    gtol : float or None
        Stop when the gradient norm is at most ``gtol``.
    miniter, maxiter : int
        Iteration bounds; every iteration (accepted or rejected step) counts.
    initial_radius : float
        Trust-region radius of the first step, ``> 0``.
    max_radius : float
        Largest radius, ``>= initial_radius``.
    eta : float
        Acceptance threshold in ``[0, 0.25)``: a step is taken when the ratio
        of actual to predicted decrease exceeds ``eta``.
    cg_tol : float
        In ``(0, 1]``: the inner CG stops when its residual is below
        ``min(cg_tol, sqrt(|g|)) |g|`` (with ``0.5``: scipy's forcing term).
    cg_maxiter : int
        Inner CG iterations per step at most (``>= 1``).
    name : str or None
        When set, every iteration is logged through ``logging`` under this name.
    """

    absdelta: float | None = None
    xtol: float | None = 1e-8
    gtol: float | None = None
    miniter: int = 0
    maxiter: int = 50
    initial_radius: float = 1.0
    max_radius: float = 1000.0
    eta: float = 0.15
    cg_tol: float = 0.5
    cg_maxiter: int = 500
    name: str | None = None

    def __post_init__(self):
        owner = "TrustRegionConfig"
        for f in ("absdelta", "xtol", "gtol"):
            check_tol(owner, f, getattr(self, f))
        check_iters(owner, self.miniter, self.maxiter)
        _positive(owner, "initial_radius", self.initial_radius)
        _positive(owner, "max_radius", self.max_radius)
        if self.initial_radius > self.max_radius:
            raise ValueError(
                f"{owner}.initial_radius ({self.initial_radius!r}) must be <= max_radius ({self.max_radius!r})"
            )
        check_tol(owner, "eta", self.eta, allow_none=False)
        if not self.eta < _SHRINK_BELOW:
            raise ValueError(f"{owner}.eta must be in [0, 0.25), got {self.eta!r}")
        _positive(owner, "cg_tol", self.cg_tol)
        check_tol(owner, "cg_tol", self.cg_tol, upper=1.0)
        if isinstance(self.cg_maxiter, bool) or not isinstance(self.cg_maxiter, int):
            raise TypeError(f"{owner}.cg_maxiter must be an int, got {type(self.cg_maxiter).__name__}")
        if self.cg_maxiter < 1:
            raise ValueError(f"{owner}.cg_maxiter must be >= 1, got {self.cg_maxiter}")
        check_name(owner, self.name)

    def minimize(self, fun_and_grad: Callable, hessp: Callable, x0, *, min_curvature: float | None = None) -> Solution:
        """Minimize a smooth function with trust-region Newton-CG steps (Steihaug-Toint).

        Parameters
        ----------
        fun_and_grad : callable
            ``x -> (f(x), grad f(x))``.
        hessp : callable
            ``(x, v) -> H(x) v`` with ``H`` symmetric: the Hessian (it may be
            indefinite) or a positive (semi-)definite metric.
        x0 : pytree
            Starting point.
        min_curvature : float, optional
            Declares ``H`` a metric with ``d.H.d >= min_curvature |d|^2`` (``1``
            for ``J^T F J + I``): a direction that violates it beyond rounding
            stops the minimizer at its current point with status
            ``NONPOSITIVE_CURVATURE`` (a broken operator). Without it non-positive
            curvature is Steihaug's: the step goes to the trust-region boundary.

        Returns
        -------
        Solution
            ``nit`` counts iterations (accepted and rejected steps), ``ncg`` the
            applications of ``hessp``, ``nfev`` the ``fun_and_grad`` calls
            (``nit + 1``).

        Notes
        -----
        Nocedal & Wright, *Numerical Optimization* (2nd ed., 2006): the radius
        update of Alg. 4.1 and the CG-Steihaug subproblem solver of Alg. 7.2.
        Each iteration runs CG on ``H p = -g`` from ``p = 0`` until the residual
        is below ``min(cg_tol, sqrt(|g|)) |g|`` (a Newton step), a direction has
        non-positive curvature, or an iterate leaves the region ``|p| <= radius``
        (then the step ends on its boundary). The ratio ``rho`` of the actual
        decrease ``f(x) - f(x + p)`` to the model's ``-(g.p + p.H.p/2)`` decides:
        ``rho < 1/4`` shrinks the radius by 4, ``rho > 3/4`` with a step on the
        boundary doubles it (up to ``max_radius``), and ``rho > eta`` accepts the
        step. A trial point where ``f`` or its gradient is not finite counts as
        ``rho = -inf`` (rejected, radius shrunk). With the same rules scipy's
        ``minimize(method='trust-ncg')`` is this algorithm, up to one addition:
        where both decreases are below the rounding of ``f`` (``100 eps |f|``),
        the actual one is taken from the gradients, ``-p.(g(x) + g(x + p))/2``
        (the trapezoid rule, exact for quadratics; the idea of Hager and Zhang's
        approximate Armijo condition in :func:`~shardvi.minimizers.newton_cg`),
        so that the last steps to a minimum with ``|f| >> 0`` are not rejected
        for rounding noise.

        Stopping rules as :func:`~shardvi.minimizers.newton_cg`'s: ``gtol`` on
        the gradient at the current point; ``xtol`` and ``absdelta`` on Newton
        steps only; a Newton step that changes ``f`` by rounding noise only
        (``100 eps |f|``), as the model predicts, and does not reduce ``|g|`` is
        the precision floor and ends the run as converged. A step that no longer
        changes ``x`` in floating point (the radius collapsed) ends it with
        ``LINE_SEARCH_FAILED``: no decrease of ``f`` was found. Pure and
        jittable; vmappable. Inner products and norms go through
        :mod:`shardvi.tree_math` (pytree and slab positions).
        """
        return _trust_region_newton_cg(fun_and_grad, hessp, x0, self, min_curvature=min_curvature)


class _Inner(NamedTuple):
    """CG-Steihaug state; on exit ``z`` is the step ``p`` and ``r`` the model gradient ``g + H p`` there."""

    z: object
    r: object
    d: object
    gamma: jax.Array  # |r|^2
    nit: jax.Array
    status: jax.Array  # CONVERGED (residual met, or the boundary reached), MAX_ITERATIONS, NONPOSITIVE_CURVATURE, ...
    boundary: jax.Array


def _steihaug(op: Callable, g, radius, tol, maxiter: int, min_curvature, real) -> _Inner:
    """Nocedal & Wright, Alg. 7.2: approximately minimize ``g.p + p.H.p / 2`` subject to ``|p| <= radius``.

    ``tol`` is the absolute residual tolerance. Non-positive curvature along a
    direction ends on the boundary, at the root of ``|z + t d| = radius`` with
    the lower model value. With ``min_curvature`` (a declared metric) it is a
    broken operator instead: status ``NONPOSITIVE_CURVATURE``, ``z`` as before.
    """
    eps = jnp.asarray(jnp.finfo(real).eps, real)
    gamma0 = tm.vdot(g, g)
    status0 = jnp.where(gamma0 == 0, Status.CONVERGED, Status.RUNNING).astype(jnp.int32)
    state = _Inner(tm.zeros_like(g), g, tm.scale(-1.0, g), gamma0, jnp.zeros((), jnp.int32), status0, jnp.bool_(False))

    def body(c):
        q = op(c.d)
        curv = tm.vdot(c.d, q)
        dd = tm.vdot(c.d, c.d)
        scale = jnp.sqrt(dd) * tm.norm(q)  # curvature below eps |d| |Hd| is rounding noise (as in cg_solve)
        positive = curv > eps * scale  # False for a nan curvature
        if min_curvature is not None:
            positive = positive & (curv >= min_curvature * dd - jnp.sqrt(eps) * scale)
        alpha = c.gamma / jnp.where(positive, curv, 1)
        crosses = tm.norm(tm.axpy(alpha, c.d, c.z)) >= radius
        # |z + t d| = radius: a t^2 + b t + c = 0 with c < 0 (z inside), one root of each sign; the form
        # without cancellation (Golub & Van Loan, as scipy's trust-region subproblems)
        zd = tm.vdot(c.z, c.d)
        cq = tm.vdot(c.z, c.z) - radius**2
        b = 2 * zd
        aux = b + jnp.where(b >= 0, 1, -1) * jnp.sqrt(jnp.maximum(b * b - 4 * dd * cq, 0))
        aux = jnp.where(aux == 0, 1, aux)  # only for a zero radius (cq = 0) or a zero direction: t = 0
        t1, t2 = -aux / (2 * dd), -2 * cq / aux
        t_lo, t_hi = jnp.minimum(t1, t2), jnp.maximum(t1, t2)
        rd = tm.vdot(c.r, c.d)

        def model(t):  # m(z + t d) - m(z)
            return t * rd + 0.5 * t * t * curv

        t_npc = jnp.where(model(t_lo) < model(t_hi), t_lo, t_hi)
        to_boundary = ~positive | crosses
        t = jnp.where(positive, jnp.where(crosses, t_hi, alpha), t_npc)
        z = tm.axpy(t, c.d, c.z)
        r = tm.axpy(t, q, c.r)
        gamma = tm.vdot(r, r)
        d = tm.axpy(gamma / c.gamma, c.d, tm.scale(-1.0, r))
        nit = c.nit + 1
        broken = ~positive if min_curvature is not None else jnp.bool_(False)
        status = jnp.select(
            [~jnp.isfinite(curv) | ~jnp.isfinite(gamma), broken, to_boundary | (jnp.sqrt(gamma) < tol), nit >= maxiter],
            [Status.NONFINITE, Status.NONPOSITIVE_CURVATURE, Status.CONVERGED, Status.MAX_ITERATIONS],
            Status.RUNNING,
        ).astype(jnp.int32)
        new = _Inner(z, r, d, gamma, nit, status, to_boundary)
        # a broken operator or a nan: keep the last iterate (the outer loop stops at its current point)
        keep = (status == Status.NONFINITE) | (status == Status.NONPOSITIVE_CURVATURE)
        return jax.tree_util.tree_map(
            lambda a, o: jnp.where(keep, a, o), c._replace(nit=nit, status=status, boundary=jnp.bool_(False)), new
        )

    return jax.lax.while_loop(lambda c: c.status == Status.RUNNING, body, state)


class _State(NamedTuple):
    x: object
    f: jax.Array
    g: object
    radius: jax.Array
    nit: jax.Array
    ncg: jax.Array
    nfev: jax.Array
    status: jax.Array
    fresh: jax.Array  # f and g not evaluated yet (the first pass of the loop evaluates them at x0)


def _trust_region_newton_cg(
    fun_and_grad: Callable, hessp: Callable, x0, config: TrustRegionConfig, *, min_curvature: float | None
) -> Solution:
    """The algorithm of :meth:`TrustRegionConfig.minimize`."""
    check_callables("TrustRegionConfig.minimize", fun_and_grad=fun_and_grad, hessp=hessp)
    check_tol("TrustRegionConfig.minimize", "min_curvature", min_curvature)
    n = tm.size(x0)
    # f and g at x0 come from the loop's first pass, at the one call site of fun_and_grad (as newton_cg: each
    # call site inlines the whole objective)
    f_shape = jax.eval_shape(fun_and_grad, x0)[0]
    real = jnp.result_type(f_shape.dtype)
    off = jnp.asarray(-1.0, real)
    absdelta = off if config.absdelta is None else jnp.asarray(config.absdelta, real)
    xtol = off if config.xtol is None else jnp.asarray(config.xtol, real)
    gtol = off if config.gtol is None else jnp.asarray(config.gtol, real)
    f_eps = jnp.asarray(_F_ROUNDING * jnp.finfo(real).eps, real)
    radius0 = jnp.asarray(config.initial_radius, real)
    max_radius = jnp.asarray(config.max_radius, real)
    neg_inf = jnp.asarray(-math.inf, real)
    zero_i = jnp.zeros((), jnp.int32)

    def started(f0, g0):
        """The state at x0 once ``f0, g0`` are known (converged at once at a stationary point)."""
        finite0 = jnp.isfinite(f0) & tm.all_finite(g0)
        g0norm = tm.norm(g0)
        stationary0 = finite0 & (config.miniter == 0) & ((g0norm <= gtol) | (g0norm == 0))
        status0 = jnp.select([~finite0, stationary0], [Status.NONFINITE, Status.CONVERGED], Status.RUNNING)
        one_i = jnp.ones((), jnp.int32)
        return _State(x0, f0, g0, radius0, zero_i, zero_i, one_i, status0.astype(jnp.int32), jnp.bool_(False))

    # not yet evaluated: g = 0 makes the first pass's subproblem trivial (p = 0: the trial point is x0)
    state = started(jnp.full((), jnp.nan, real), tm.zeros_like(x0))._replace(
        status=jnp.asarray(Status.RUNNING, jnp.int32), fresh=jnp.bool_(True)
    )

    def body(s):
        gnorm = tm.norm(s.g)
        tol = jnp.minimum(config.cg_tol, jnp.sqrt(gnorm)) * gnorm
        inner = _steihaug(lambda v: hessp(s.x, v), s.g, s.radius, tol, config.cg_maxiter, min_curvature, real)
        broken = inner.status == Status.NONPOSITIVE_CURVATURE
        inner_nonfinite = inner.status == Status.NONFINITE
        ok = ~broken & ~inner_nonfinite
        p = tm.where(ok, inner.z, tm.zeros_like(inner.z))  # a failed subproblem: evaluate at x (discarded)
        newton = ok & (inner.status == Status.CONVERGED) & ~inner.boundary
        x_new = tm.add(s.x, p)
        f_new, g_new = fun_and_grad(x_new)
        trial_finite = jnp.isfinite(f_new) & tm.all_finite(g_new)
        f_tol = f_eps * jnp.abs(s.f)  # energy changes below this are rounding noise
        # the model's decrease -(g.p + p.H.p/2) = -p.(g + r)/2, r = g + H p the model gradient at p
        pred = -0.5 * tm.vdot(p, tm.add(s.g, inner.r))
        # where f cannot resolve the decrease, the gradients can: the trapezoid rule -p.(g + g_new)/2, exact
        # for a quadratic (the idea of Hager and Zhang's approximate Armijo condition, as in newton_cg)
        actual_f = s.f - f_new
        noise = (jnp.abs(actual_f) <= f_tol) & (pred <= f_tol)
        actual = jnp.where(noise, -0.5 * tm.vdot(p, tm.add(s.g, g_new)), actual_f)
        rho = actual / jnp.where(pred > 0, pred, 1)
        rho = jnp.where(trial_finite & (pred > 0) & jnp.isfinite(rho), rho, neg_inf)
        radius = jnp.where(
            rho < _SHRINK_BELOW,
            _SHRINK * s.radius,
            jnp.where((rho > _GROW_ABOVE) & inner.boundary, jnp.minimum(_GROW * s.radius, max_radius), s.radius),
        )
        accept = ok & (rho > config.eta)
        nit = s.nit + 1
        gnorm_new = tm.norm(g_new)
        small_step = newton & (tm.abs_total(p) / n <= xtol)
        small_decrease = newton & accept & (actual >= 0) & (actual <= absdelta)
        # rounding floor: a Newton step whose actual and predicted changes of f are rounding noise and that does
        # not reduce |g|, as it must near a minimum (e.g. float32 with an xtol below its precision)
        floor = newton & trial_finite & noise & (gnorm_new >= gnorm)
        gnorm_at = jnp.where(accept, gnorm_new, gnorm)
        stationary = (gnorm_at <= gtol) | (gnorm_at == 0)
        done = (nit >= config.miniter) & (small_step | small_decrease | floor | stationary)
        # the radius collapsed: the step no longer changes x (at a nonzero gradient: a zero one is stationary,
        # held by miniter only), whether or not the gradients' estimate of the decrease accepts it
        stuck = (tm.norm(tm.sub(x_new, s.x)) == 0) & (gnorm > 0)
        status = jnp.select(
            [broken, inner_nonfinite, done, stuck, nit >= config.maxiter],
            [
                Status.NONPOSITIVE_CURVATURE,
                Status.NONFINITE,
                Status.CONVERGED,
                Status.LINE_SEARCH_FAILED,
                Status.MAX_ITERATIONS,
            ],
            Status.RUNNING,
        ).astype(jnp.int32)
        ncg, nfev = s.ncg + inner.nit, s.nfev + 1
        taken = _State(x_new, f_new, g_new, radius, nit, ncg, nfev, status, s.fresh)
        kept = s._replace(radius=radius, nit=nit, ncg=ncg, nfev=nfev, status=status)
        new = jax.tree_util.tree_map(lambda a, o: jnp.where(accept, a, o), taken, kept)
        # the first pass: only x0's f and g (the rest of this pass worked on placeholders and is dropped)
        new = jax.tree_util.tree_map(lambda a, o: jnp.where(s.fresh, a, o), started(f_new, g_new), new)
        log_iteration(
            config.name, ~s.fresh, nit=nit, energy=new.f, decrease=actual, rho=rho, radius=radius, cg_nit=inner.nit
        )
        return new

    s = jax.lax.while_loop(lambda s: s.status == Status.RUNNING, body, state)
    return Solution(s.x, s.f, s.g, s.nit, s.ncg, s.nfev, s.status)
