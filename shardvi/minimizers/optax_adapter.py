"""Run any optax optimizer inside one ``lax.while_loop``."""

from __future__ import annotations

import dataclasses
from collections.abc import Callable
from typing import TYPE_CHECKING, NamedTuple

import jax
import jax.numpy as jnp
import numpy as np
from jax import tree_util as jtu

from .. import tree_math as tm
from ._validate import check_callables, check_iters, check_name, check_tol
from .minimizer import Minimizer
from .progress import log_iteration
from .solution import Solution
from .status import Status

if TYPE_CHECKING:  # imported where used: a run that does not use optax does not load it (memory per process)
    import optax

__all__ = ["OptaxConfig", "check_optimizer"]


@dataclasses.dataclass(frozen=True)
class OptaxConfig(Minimizer):
    """Run an ``optax.GradientTransformation`` as a :class:`~shardvi.minimizers.Minimizer`.

    ``OptaxConfig(optax.adam(1e-2)).minimize(fun_and_grad, None, x0)`` runs it
    (first-order: no ``hessp``); ``optimize_kl`` calls the same method on its
    ``kl_minimization``.

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

    optimizer: optax.GradientTransformation
    maxiter: int = 100
    gtol: float | None = None
    name: str | None = None

    def __post_init__(self):
        if not (callable(getattr(self.optimizer, "init", None)) and callable(getattr(self.optimizer, "update", None))):
            raise TypeError(
                "OptaxConfig.optimizer must be an optax.GradientTransformation "
                f"(with init and update), got {type(self.optimizer).__name__}"
            )
        check_iters("OptaxConfig", 0, self.maxiter)
        check_tol("OptaxConfig", "gtol", self.gtol)
        check_name("OptaxConfig", self.name)

    def minimize(
        self, fun_and_grad: Callable, hessp: Callable | None, x0, *, min_curvature: float | None = None
    ) -> Solution:
        """Minimize with ``optimizer`` for at most ``maxiter`` steps.

        Parameters
        ----------
        fun_and_grad : callable
            ``x -> (f(x), grad f(x))``.
        hessp : callable or None
            Unused (first-order): pass ``None``; the engine passes its metric.
        x0 : pytree
            Starting point.
        min_curvature : float, optional
            Unused.

        Returns
        -------
        Solution

        Notes
        -----
        Optimizers that take extra arguments (``optax.lbfgs`` and other
        ``GradientTransformationExtraArgs``) receive ``value``, ``grad`` and
        ``value_fn``; ``value_fn`` is differentiable in reverse mode with the
        gradient of ``fun_and_grad`` (:func:`differentiable_value`), so line
        searches never differentiate through ``fun_and_grad`` itself. Pure and
        jittable.
        """
        return _optax_minimize(fun_and_grad, x0, self)

    def check(self, params, argname: str = "minimizer") -> None:
        """Trace ``init`` and one ``update`` on ``params`` (:func:`check_optimizer`).

        Errors are ``TypeError``\\ s naming ``{argname}.optimizer``.
        """
        check_optimizer(self.optimizer, params, f"{argname}.optimizer")


class _State(NamedTuple):
    x: object
    f: jax.Array
    g: object
    opt_state: object
    nit: jax.Array
    status: jax.Array


def differentiable_value(fun_and_grad: Callable) -> Callable:
    """``x -> fun_and_grad(x)[0]`` whose reverse-mode derivative is ``fun_and_grad(x)[1]``.

    Line searches (optax's zoom line search in ``optax.lbfgs``) call
    ``jax.value_and_grad(value_fn)``. Differentiating ``fun_and_grad(x)[0]``
    itself would run reverse mode through whatever computes the value — the
    engine's KL maps samples in ``lax.fori_loop``\\ s with a trip count hidden
    from XLA, which reverse mode rejects — and would recompute a gradient that
    ``fun_and_grad`` already gives. The ``custom_vjp`` returns that gradient:
    one ``fun_and_grad`` evaluation per value-and-gradient.
    """

    @jax.custom_vjp
    def value_fn(x):
        return fun_and_grad(x)[0]

    def fwd(x):
        f, g = fun_and_grad(x)
        return f, g

    def bwd(g, ct):
        return (jtu.tree_map(lambda gi: (ct * gi).astype(gi.dtype), g),)

    value_fn.defvjp(fwd, bwd)
    return value_fn


def _is_extra_args(opt) -> bool:
    import optax

    return isinstance(opt, optax.GradientTransformationExtraArgs)


def _avals(tree):
    return jtu.tree_map(lambda a: (tuple(np.shape(a)), jnp.result_type(a)), tree)


def _check_update_output(out, x, opt_state, argname: str):
    """``update`` must return ``(updates, state)``: updates shaped like ``x``, state typed like before.

    Only shapes, dtypes and structures are read: works on tracers and on
    ``jax.eval_shape`` outputs.
    """
    if not (isinstance(out, tuple) and len(out) == 2):
        raise TypeError(
            f"{argname}.update must return a pair (updates, new_state) like an "
            f"optax.GradientTransformation, got {type(out).__name__}"
        )
    updates, new_state = out
    xs, xdef = jtu.tree_flatten(x)
    us, udef = jtu.tree_flatten(updates)
    if udef != xdef:
        raise TypeError(
            f"{argname}.update returned updates of structure {udef}; expected the structure of the parameters, {xdef}"
        )
    for i, (u, p) in enumerate(zip(us, xs)):
        if tuple(np.shape(u)) != tuple(np.shape(p)):
            raise TypeError(
                f"{argname}.update returned updates whose leaf {i} has shape {tuple(np.shape(u))}; "
                f"the parameter has shape {tuple(np.shape(p))}"
            )
    if jtu.tree_structure(new_state) != jtu.tree_structure(opt_state) or _avals(new_state) != _avals(opt_state):
        raise TypeError(
            f"{argname}.update returned a state whose structure, shapes or dtypes differ from "
            f"init's ({jtu.tree_structure(new_state)} vs {jtu.tree_structure(opt_state)}): the "
            f"optimizer's state is the carry of a lax.while_loop and must keep its type"
        )
    return updates, new_state


def _update(opt, g, opt_state, x, value, value_fn, argname):
    if _is_extra_args(opt):
        out = opt.update(g, opt_state, x, value=value, grad=g, value_fn=value_fn)
    else:
        out = opt.update(g, opt_state, x)
    return _check_update_output(out, x, opt_state, argname)


def check_optimizer(optimizer, params, argname: str = "optimizer") -> None:
    """Trace ``init`` and one ``update`` on ``params`` (arrays or ``jax.ShapeDtypeStruct``\\ s).

    Runs under ``jax.eval_shape`` with the quadratic ``|x|^2 / 2`` as the
    objective: nothing is compiled or executed. An optimizer that fails to
    trace, or returns something that is not ``(updates, state)`` of the
    right structure and shapes, raises a ``TypeError`` naming ``argname``
    before any sample is drawn.
    """
    for attr in ("init", "update"):
        if not callable(getattr(optimizer, attr, None)):
            raise TypeError(
                f"{argname}.{attr} must be callable (an optax.GradientTransformation), got "
                f"{type(getattr(optimizer, attr, None)).__name__}"
            )

    def fg(x):
        return 0.5 * tm.vdot(x, x), x

    def probe(x):
        try:
            opt_state = optimizer.init(x)
        except Exception as err:  # reported with the argument's name
            raise TypeError(f"{argname}.init failed on the parameters: {type(err).__name__}: {err}") from err
        value_fn = differentiable_value(fg)
        try:
            out = (
                optimizer.update(x, opt_state, x, value=fg(x)[0], grad=x, value_fn=value_fn)
                if _is_extra_args(optimizer)
                else optimizer.update(x, opt_state, x)
            )
        except Exception as err:
            raise TypeError(
                f"{argname}.update cannot run inside a jitted lax.while_loop on these parameters: "
                f"{type(err).__name__}: {err}"
            ) from err
        _check_update_output(out, x, opt_state, argname)

    jax.eval_shape(probe, params)


def _optax_minimize(fun_and_grad: Callable, x0, config: OptaxConfig) -> Solution:
    """The algorithm of :meth:`OptaxConfig.minimize`."""
    import optax

    check_callables("OptaxConfig.minimize", fun_and_grad=fun_and_grad)
    opt = config.optimizer
    argname = "OptaxConfig.optimizer"
    value_fn = differentiable_value(fun_and_grad)

    f0, g0 = fun_and_grad(x0)
    gtol = -1.0 if config.gtol is None else config.gtol
    st0 = jnp.where(jnp.isfinite(f0), Status.RUNNING, Status.NONFINITE).astype(jnp.int32)
    state = _State(x0, f0, g0, opt.init(x0), jnp.zeros((), jnp.int32), st0)

    def body(s):
        updates, opt_state = _update(opt, s.g, s.opt_state, s.x, s.f, value_fn, argname)
        x = optax.apply_updates(s.x, updates)
        f, g = fun_and_grad(x)
        nit = s.nit + 1
        status = jnp.select(
            [~jnp.isfinite(f) | ~tm.all_finite(g), tm.norm(g) <= gtol, nit >= config.maxiter],
            [Status.NONFINITE, Status.CONVERGED, Status.MAX_ITERATIONS],
            Status.RUNNING,
        ).astype(jnp.int32)
        log_iteration(config.name, nit=nit, energy=f)
        return _State(x, f, g, opt_state, nit, status)

    s = jax.lax.while_loop(lambda s: s.status == Status.RUNNING, body, state)
    nfev = s.nit + 1
    return Solution(s.x, s.f, s.g, s.nit, jnp.zeros((), jnp.int32), nfev, s.status)
