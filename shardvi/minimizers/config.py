"""Frozen, validated solver configurations."""
from __future__ import annotations

import dataclasses
import math
from typing import Optional

__all__ = ["CGConfig", "NewtonCGConfig", "OptaxConfig"]


def _check_tol(owner: str, name: str, value, *, allow_none: bool = True, upper=None) -> None:
    if value is None:
        if allow_none:
            return
        raise ValueError(f"{owner}.{name} must be a positive finite number, got None")
    if isinstance(value, bool) or not isinstance(value, (int, float)):
        raise TypeError(f"{owner}.{name} must be a float or None, got {type(value).__name__}")
    if not math.isfinite(value) or value < 0:
        raise ValueError(f"{owner}.{name} must be a finite number >= 0, got {value!r}")
    if upper is not None and value > upper:
        raise ValueError(f"{owner}.{name} must be <= {upper}, got {value!r}")


def _check_iters(owner: str, miniter, maxiter) -> None:
    for name, v in (("miniter", miniter), ("maxiter", maxiter)):
        if isinstance(v, bool) or not isinstance(v, int):
            raise TypeError(f"{owner}.{name} must be an int, got {type(v).__name__}")
    if miniter < 0:
        raise ValueError(f"{owner}.miniter must be >= 0, got {miniter}")
    if maxiter < 1:
        raise ValueError(f"{owner}.maxiter must be >= 1, got {maxiter}")
    if miniter > maxiter:
        raise ValueError(f"{owner}.miniter ({miniter}) must be <= maxiter ({maxiter})")


def _check_name(owner: str, name) -> None:
    if name is not None and not isinstance(name, str):
        raise TypeError(f"{owner}.name must be a str or None, got {type(name).__name__}")


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

    tol: Optional[float] = 1e-6
    resnorm: Optional[float] = None
    absdelta: Optional[float] = None
    miniter: int = 0
    maxiter: int = 1000
    name: Optional[str] = None

    def __post_init__(self):
        for f in ("tol", "resnorm", "absdelta"):
            _check_tol("CGConfig", f, getattr(self, f))
        _check_iters("CGConfig", self.miniter, self.maxiter)
        _check_name("CGConfig", self.name)


@dataclasses.dataclass(frozen=True)
class NewtonCGConfig:
    """Stopping rules of the Newton-CG minimizer.

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

    absdelta: Optional[float] = None
    xtol: Optional[float] = 1e-8
    gtol: Optional[float] = None
    miniter: int = 0
    maxiter: int = 50
    cg: CGConfig = dataclasses.field(default_factory=lambda: CGConfig(tol=0.5, maxiter=500))
    energy_reduction_factor: Optional[float] = None
    max_line_search_steps: int = 30
    name: Optional[str] = None

    def __post_init__(self):
        for f in ("absdelta", "xtol", "gtol"):
            _check_tol("NewtonCGConfig", f, getattr(self, f))
        _check_iters("NewtonCGConfig", self.miniter, self.maxiter)
        if not isinstance(self.cg, CGConfig):
            raise TypeError(f"NewtonCGConfig.cg must be a CGConfig, got {type(self.cg).__name__}")
        _check_tol("NewtonCGConfig", "energy_reduction_factor", self.energy_reduction_factor, upper=1.0)
        if self.energy_reduction_factor == 0:
            raise ValueError("NewtonCGConfig.energy_reduction_factor must be in (0, 1], got 0")
        if isinstance(self.max_line_search_steps, bool) or not isinstance(self.max_line_search_steps, int) \
                or self.max_line_search_steps < 1:
            raise ValueError("NewtonCGConfig.max_line_search_steps must be an int >= 1, "
                             f"got {self.max_line_search_steps!r}")
        _check_name("NewtonCGConfig", self.name)


@dataclasses.dataclass(frozen=True)
class OptaxConfig:
    """Run an ``optax.GradientTransformation`` as a minimizer.

    Parameters
    ----------
    optimizer : optax.GradientTransformation
        Any optax optimizer (``optax.adam(1e-2)``, ``optax.lbfgs()``, ...).
        Line searches get a ``value_fn`` whose gradient is the minimizer's
        own (no reverse mode through the objective). :class:`~shardvi.OptimizeVI`
        traces ``init`` and one ``update`` on the latent domain when it is
        built (``jax.eval_shape``, nothing compiled): an optimizer that cannot
        run in a jitted ``lax.while_loop`` or returns something other than
        ``(updates, state)`` of the parameters' structure is a ``TypeError``
        naming ``kl_minimization.optimizer``.
    maxiter : int
        Number of steps at most.
    gtol : float or None
        Stop when the gradient norm is at most ``gtol``.
    name : str or None
        When set, every step is logged through ``logging`` under this name.
    """

    optimizer: object
    maxiter: int = 100
    gtol: Optional[float] = None
    name: Optional[str] = None

    def __post_init__(self):
        if not (callable(getattr(self.optimizer, "init", None)) and callable(getattr(self.optimizer, "update", None))):
            raise TypeError("OptaxConfig.optimizer must be an optax.GradientTransformation "
                            f"(with init and update), got {type(self.optimizer).__name__}")
        _check_iters("OptaxConfig", 0, self.maxiter)
        _check_tol("OptaxConfig", "gtol", self.gtol)
        _check_name("OptaxConfig", self.name)
