"""Matrix-free conjugate gradient on pytrees (jittable, vmappable)."""

from __future__ import annotations

import dataclasses
from collections.abc import Callable
from typing import NamedTuple

import jax
import jax.numpy as jnp

from .. import tree_math as tm
from ._validate import check_callables, check_iters, check_like, check_name, check_tol
from .progress import log_iteration
from .solution import CGResult
from .status import Status

__all__ = ["CGConfig", "CGResult", "cg_solve", "conjugate_gradient"]

_OFF = -1.0  # a disabled tolerance: "|x| <= -1" never holds


@dataclasses.dataclass(frozen=True)
class CGConfig:
    """Stopping rules of the conjugate gradient solver.

    CG stops, after at least ``miniter`` iterations, as soon as any enabled
    criterion holds; it gives up after ``maxiter`` iterations.

    Parameters
    ----------
    tol : float or None
        Relative residual: stop when ``|r| <= tol * |b|`` (scipy's ``rtol``).
    resnorm : float or None
        Absolute residual: stop when ``|r| <= resnorm``.
    absdelta : float or None
        Stop when the CG energy ``x.A.x/2 - b.x`` changes by at most
        ``absdelta`` in one iteration (NIFTy's criterion; scale it with the
        problem size).
    miniter, maxiter : int
        Iteration bounds.
    name : str or None
        When set, every iteration is logged through ``logging`` under this name.
    """

    tol: float | None = 1e-6
    resnorm: float | None = None
    absdelta: float | None = None
    miniter: int = 0
    maxiter: int = 1000
    name: str | None = None

    def __post_init__(self):
        for f in ("tol", "resnorm", "absdelta"):
            check_tol("CGConfig", f, getattr(self, f))
        check_iters("CGConfig", self.miniter, self.maxiter)
        check_name("CGConfig", self.name)


class _State(NamedTuple):
    x: object
    r: object
    d: object
    gamma: jax.Array
    energy: jax.Array
    nit: jax.Array
    status: jax.Array
    fresh: jax.Array  # the first pass of a solve started at x0: it only computes r = b - A x0


def _tol(v):
    return _OFF if v is None else v


def cg_solve(
    matvec: Callable,
    b,
    x0=None,
    *,
    tol: float | jax.Array | None = 1e-6,
    resnorm=None,
    absdelta=None,
    miniter: int = 0,
    maxiter: int = 1000,
    name=None,
    min_curvature=None,
    absdelta_miniter: int = 0,
) -> CGResult:
    """CG with tolerances that may be traced values (used by Newton-CG).

    Same semantics as :func:`conjugate_gradient`; ``None`` disables a criterion.

    Parameters
    ----------
    min_curvature : float, optional
        A known lower bound ``c`` with ``d.A.d >= c |d|^2`` for every ``d``
        (``1`` for a metric ``J^T F J + I``). A direction that violates it by
        more than rounding stops the solve with ``NONPOSITIVE_CURVATURE``: the
        operator is broken (e.g. a noise covariance that is not positive).
    absdelta_miniter : int
        The energy rule (``absdelta``) counts only from this iteration on
        (and from ``miniter``): one iteration's energy change is no measure of
        stagnation.
    """
    if x0 is not None:
        check_like("conjugate_gradient", "x0", x0, "b", b)
    dtype = tm.leaf_dtype(b)
    real = jnp.finfo(dtype).dtype
    eps = jnp.asarray(jnp.finfo(real).eps, real)
    tol, resnorm, absdelta = (jnp.asarray(_tol(v), real) for v in (tol, resnorm, absdelta))
    bnorm = tm.norm(b)

    def small(gamma_):
        rn = jnp.sqrt(gamma_)
        return (rn <= tol * bnorm) | (rn <= resnorm) | (gamma_ == 0)

    def started(x, r):
        """The state at ``x`` with residual ``r = b - A x`` (converged at once where ``r`` is already small)."""
        gamma = tm.vdot(r, r)
        energy = -0.5 * tm.vdot(x, tm.add(b, r))
        # an exactly zero residual is the exact solution: nothing left to iterate, whatever miniter says
        status0 = jnp.where(
            ~jnp.isfinite(gamma),
            Status.NONFINITE,
            jnp.where(((miniter == 0) & small(gamma)) | (gamma == 0), Status.CONVERGED, Status.RUNNING),
        ).astype(jnp.int32)
        return _State(x, r, r, gamma, energy, jnp.zeros((), jnp.int32), status0, jnp.bool_(False))

    if x0 is None:
        state = started(tm.zeros_like(b), b)
    else:
        # b - A x0 is computed by the loop's first pass, at the loop's one call site of matvec: each call site
        # inlines the operator (for the engine: the model's linearization and its transpose), and a separate
        # A x0 here would inline it a second time (a larger program). The first pass applies A to d = x0.
        nan = jnp.full((), jnp.nan, real)
        running = jnp.asarray(Status.RUNNING, jnp.int32)
        state = _State(x0, b, x0, nan, nan, jnp.zeros((), jnp.int32), running, jnp.bool_(True))

    def cond(s):
        return s.status == Status.RUNNING

    def body(s):
        q = matvec(s.d)
        check_like("conjugate_gradient", "matvec(v)", q, "b", b)
        curv = tm.vdot(s.d, q)
        dd = tm.vdot(s.d, s.d)
        scale = jnp.sqrt(dd) * tm.norm(q)  # |d.q| <= |d| |q|: curvature below eps |d| |q| is rounding noise
        ok = curv > eps * scale  # also False for a nan curvature
        if min_curvature is not None:
            ok = ok & (curv >= min_curvature * dd - jnp.sqrt(eps) * scale)
        alpha = jnp.where(ok, s.gamma / jnp.where(ok, curv, 1), 0)
        x = tm.axpy(alpha, s.d, s.x)
        r = tm.axpy(-alpha, q, s.r)
        gamma = tm.vdot(r, r)
        energy = -0.5 * tm.vdot(x, tm.add(b, r))
        beta = gamma / jnp.where(s.gamma == 0, 1, s.gamma)
        d = tm.axpy(beta, s.d, r)
        nit = s.nit + 1
        # gamma == 0 means an exact solve: the next direction would be zero (curvature 0), so stop
        # even before miniter instead of reporting non-positive curvature
        stalled = (nit >= absdelta_miniter) & (jnp.abs(energy - s.energy) <= absdelta)
        done = ((nit >= miniter) & (small(gamma) | stalled)) | (gamma == 0)
        status = jnp.select(
            [~jnp.isfinite(curv), ~ok, ~jnp.isfinite(gamma) | ~jnp.isfinite(energy), done, nit >= maxiter],
            [Status.NONFINITE, Status.NONPOSITIVE_CURVATURE, Status.NONFINITE, Status.CONVERGED, Status.MAX_ITERATIONS],
            Status.RUNNING,
        ).astype(jnp.int32)
        # on non-positive curvature keep the previous iterate
        new = _State(x, r, d, gamma, energy, nit, status, s.fresh)
        new = jax.tree_util.tree_map(lambda a, o: jnp.where(ok, a, o), new, s._replace(nit=nit, status=status))
        if x0 is not None:  # the first pass: only r = b - A x0 (the rest of this pass is dropped)
            new = jax.tree_util.tree_map(lambda a, o: jnp.where(s.fresh, a, o), started(s.x, tm.sub(b, q)), new)
        log_iteration(name, ~s.fresh, nit=nit, resnorm=jnp.sqrt(new.gamma), energy=new.energy)
        return new

    s = jax.lax.while_loop(cond, body, state)
    return CGResult(s.x, s.nit, s.status, jnp.sqrt(s.gamma), s.energy)


def conjugate_gradient(
    matvec: Callable, b, x0=None, config: CGConfig = CGConfig(), *, min_curvature: float | None = None
) -> CGResult:
    """Solve ``A x = b`` for a symmetric positive definite, matrix-free ``A``.

    Parameters
    ----------
    matvec : callable
        ``v -> A v`` on pytrees shaped like ``b``.
    b : pytree
        Right-hand side.
    x0 : pytree, optional
        Starting point (zeros by default).
    config : CGConfig
        Stopping rules.
    min_curvature : float, optional
        A known lower bound ``c`` with ``d.A.d >= c |d|^2`` (``1`` for a metric
        ``J^T F J + I``): a direction violating it beyond rounding stops the
        solve with ``NONPOSITIVE_CURVATURE`` (see :func:`cg_solve`).

    Returns
    -------
    CGResult
        With ``.x``, ``.nit``, ``.converged`` and a ``.status`` code. A
        direction with ``d.A.d <= eps |d| |A d|`` (non-positive up to rounding)
        stops the solver with status ``NONPOSITIVE_CURVATURE`` and the last
        iterate; a nan curvature gives ``NONFINITE``.

    Notes
    -----
    Pure and jittable; under ``vmap`` every batch member keeps its own
    iteration count and status.
    """
    if not isinstance(config, CGConfig):
        raise TypeError(f"config must be a CGConfig, got {type(config).__name__}")
    check_callables("conjugate_gradient", matvec=matvec)
    return cg_solve(
        matvec,
        b,
        x0,
        tol=config.tol,
        resnorm=config.resnorm,
        absdelta=config.absdelta,
        miniter=config.miniter,
        maxiter=config.maxiter,
        name=config.name,
        min_curvature=min_curvature,
    )
