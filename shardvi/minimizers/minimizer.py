"""The extension point for KL minimization: :class:`Minimizer`."""

from __future__ import annotations

import abc
from collections.abc import Callable

from .solution import Solution

__all__ = ["Minimizer", "check_minimizer"]


class Minimizer(abc.ABC):
    """A jittable minimizer of a smooth objective, configured by its (frozen) fields.

    Subclasses implement :meth:`minimize`; :class:`~shardvi.NewtonCGConfig`,
    :class:`~shardvi.TrustRegionConfig` and :class:`~shardvi.OptaxConfig` are the built-in ones, and any subclass can be
    passed as ``kl_minimization`` to :func:`~shardvi.optimize_kl`.

    Notes
    -----
    - An instance is a *static* argument of ``jax.jit``: it must be immutable
      and hashable, with equality by value (a ``@dataclasses.dataclass(frozen=True)``
      does this); validate the fields in ``__post_init__``. Equal instances
      share one compiled program.
    - :meth:`minimize` is pure and traceable: it runs inside ``jax.jit`` (a
      ``lax.while_loop`` or ``fori_loop``, no host round trips), works on pytree
      positions and returns a :class:`~shardvi.minimizers.Solution` whose ``x``
      has the structure, shapes and dtypes of ``x0``.
    - Bitwise reproducibility across device counts comes from ``fun_and_grad``
      and ``hessp`` (the driver's strategies reduce over samples in a fixed
      order); the minimizer's own arithmetic runs on the full position and adds
      nothing that depends on the devices.

    Examples
    --------
    A fixed number of gradient-descent steps::

        @dataclasses.dataclass(frozen=True)
        class GradientDescent(sv.minimizers.Minimizer):
            step: float = 0.1
            steps: int = 20

            def minimize(self, fun_and_grad, hessp, x0, *, min_curvature=None):
                def body(_, x):
                    return sv.tree_math.axpy(-self.step, fun_and_grad(x)[1], x)
                x = jax.lax.fori_loop(0, self.steps, body, x0)
                f, g = fun_and_grad(x)
                n = jnp.asarray(self.steps, jnp.int32)
                return sv.minimizers.Solution(x, f, g, n, jnp.zeros((), jnp.int32), n + 1,
                                              jnp.asarray(sv.minimizers.Status.MAX_ITERATIONS, jnp.int32))
    """

    __slots__ = ()

    @abc.abstractmethod
    def minimize(self, fun_and_grad: Callable, hessp: Callable, x0, *, min_curvature: float | None = None) -> Solution:
        """Minimize ``f`` from ``x0``.

        Parameters
        ----------
        fun_and_grad : callable
            ``x -> (f(x), grad f(x))``, ``f`` a real scalar.
        hessp : callable
            ``(x, v) -> H(x) v`` with ``H`` a symmetric positive (semi-)definite
            curvature (for the KL: the sample-averaged metric). Solvers that
            use first-order information only ignore it.
        x0 : pytree
            Starting point.
        min_curvature : float, optional
            A known lower bound on the eigenvalues of ``H`` (the KL metric is
            ``>= I``: the driver passes ``1.0``). Solvers that cannot use it
            ignore it.

        Returns
        -------
        Solution
        """

    def check(self, params, argname: str = "minimizer") -> None:  # noqa: B027 -- optional hook, default no-op
        """Validate against the parameters before anything is compiled (default: nothing to check).

        ``params`` holds arrays or ``jax.ShapeDtypeStruct``\\ s shaped like the
        position; errors are ``TypeError``/``ValueError`` naming ``argname``.
        """


def check_minimizer(value, argname: str, params=None) -> Minimizer:
    """``value`` must be a hashable :class:`Minimizer`; with ``params``, also ``value.check(params, argname)``.

    Returns ``value``. Raises ``TypeError`` naming ``argname`` otherwise.
    """
    if not isinstance(value, Minimizer):
        optax_like = callable(getattr(value, "init", None)) and callable(getattr(value, "update", None))
        hint = (
            f"; an optax optimizer runs wrapped: {argname}=sv.OptaxConfig(optimizer, maxiter=...)" if optax_like else ""
        )
        raise TypeError(
            f"{argname} must be a shardvi.minimizers.Minimizer (e.g. NewtonCGConfig(...), "
            f"TrustRegionConfig(...), OptaxConfig(...)), got {type(value).__name__}{hint}"
        )
    try:
        hash(value)
    except TypeError as err:
        raise TypeError(
            f"{argname} must be hashable (it is a static argument of the compiled step; use a frozen dataclass): {err}"
        ) from None
    if params is not None:
        value.check(params, argname)
    return value
