"""Run any optax optimizer inside one ``lax.while_loop``."""
from __future__ import annotations

from typing import Callable, NamedTuple

import jax
import jax.numpy as jnp
import optax

from .. import tree_math as tm
from .config import OptaxConfig
from .newton_cg import OptimizeResult
from .progress import log_iteration
from .status import Status

__all__ = ["optax_minimize"]


class _State(NamedTuple):
    x: object
    f: jax.Array
    g: object
    opt_state: object
    nit: jax.Array
    status: jax.Array


def optax_minimize(fun_and_grad: Callable, x0, config: OptaxConfig) -> OptimizeResult:
    """Minimize with ``config.optimizer`` for at most ``config.maxiter`` steps.

    Optimizers that take extra arguments (``optax.lbfgs`` and other
    ``GradientTransformationExtraArgs``) receive ``value``, ``grad`` and
    ``value_fn``. Pure and jittable.
    """
    if not isinstance(config, OptaxConfig):
        raise TypeError(f"config must be an OptaxConfig, got {type(config).__name__}")
    opt = config.optimizer
    extra = isinstance(opt, optax.GradientTransformationExtraArgs)

    def value_fn(x):
        return fun_and_grad(x)[0]

    f0, g0 = fun_and_grad(x0)
    gtol = -1.0 if config.gtol is None else config.gtol
    st0 = jnp.where(jnp.isfinite(f0), Status.RUNNING, Status.NONFINITE).astype(jnp.int32)
    state = _State(x0, f0, g0, opt.init(x0), jnp.zeros((), jnp.int32), st0)

    def body(s):
        if extra:
            updates, opt_state = opt.update(s.g, s.opt_state, s.x, value=s.f, grad=s.g, value_fn=value_fn)
        else:
            updates, opt_state = opt.update(s.g, s.opt_state, s.x)
        x = optax.apply_updates(s.x, updates)
        f, g = fun_and_grad(x)
        nit = s.nit + 1
        status = jnp.select(
            [~jnp.isfinite(f) | ~tm.all_finite(g), tm.norm(g) <= gtol, nit >= config.maxiter],
            [Status.NONFINITE, Status.CONVERGED, Status.MAX_ITERATIONS], Status.RUNNING).astype(jnp.int32)
        log_iteration(config.name, nit=nit, energy=f)
        return _State(x, f, g, opt_state, nit, status)

    s = jax.lax.while_loop(lambda s: s.status == Status.RUNNING, body, state)
    nfev = s.nit + 1
    return OptimizeResult(s.x, s.f, s.g, s.nit, jnp.zeros((), jnp.int32), nfev, s.status)
