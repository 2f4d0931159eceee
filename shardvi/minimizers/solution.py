"""Result types of all solvers: :class:`Solution` (minimizers) and :class:`CGResult` (linear solves).

Both are ``NamedTuple``\\ s, hence pytrees: a solver returns them from
``jax.jit`` and ``jax.vmap`` (batched fields get a leading axis). They share
one status vocabulary (:class:`~shardvi.minimizers.Status`) and the same
host-side helpers: ``converged`` (an array, usable under jit), ``message``
(readable text) and ``throw()`` (raise :class:`SolverError` on a failed solve).
"""

from __future__ import annotations

from typing import NamedTuple

import jax
import jax.core
import numpy as np

from ..exceptions import ShardviError
from .status import Status, status_message

__all__ = ["CGResult", "Solution", "SolverError"]


class SolverError(ShardviError, RuntimeError):
    """A solve ended with a status that was not accepted (see ``Solution.throw``).

    Attributes
    ----------
    status : numpy.ndarray
        The status code(s) of the solve (one per batch member under ``vmap``).
    solution : Solution or CGResult
        The result that failed; its ``x`` is the solver's last iterate.
    """

    def __init__(self, message: str, status, solution):
        super().__init__(message)
        self.status = status
        self.solution = solution


def _concrete_status(result, what: str) -> np.ndarray:
    status = result.status
    if isinstance(status, jax.core.Tracer):
        raise TypeError(
            f"{type(result).__name__}.{what} needs a concrete status: read it outside jax.jit / "
            "jax.vmap (the converged property works under tracing)"
        )
    return np.asarray(status)


def _message(result) -> str:
    codes = _concrete_status(result, "message")
    if codes.ndim == 0:
        return status_message(codes)
    values, counts = np.unique(codes, return_counts=True)
    return "; ".join(f"{c} of {codes.size}: {status_message(v)}" for v, c in zip(values, counts))


def _converged(result):
    return result.status == Status.CONVERGED


def _check_accept(accept) -> tuple[int, ...]:
    if isinstance(accept, (Status, int)) and not isinstance(accept, bool):
        accept = (accept,)
    try:
        items = tuple(accept)  # pyright: ignore[reportArgumentType] -- a bool raises TypeError, reported below
    except TypeError:
        raise TypeError(f"accept must be a Status or a sequence of Status codes, got {type(accept).__name__}") from None
    codes = []
    for a in items:
        if isinstance(a, bool) or not isinstance(a, (Status, int, np.integer)):
            raise TypeError(f"accept must hold Status codes, got {type(a).__name__}")
        try:
            codes.append(int(Status(int(a))))
        except ValueError:
            raise ValueError(
                f"accept holds {int(a)}, which is no Status code ({', '.join(f'{s.name}={int(s)}' for s in Status)})"
            ) from None
    if int(Status.RUNNING) in codes:
        raise ValueError("accept cannot hold Status.RUNNING: no returned solve is still running")
    return tuple(codes)


def _throw(result, accept=()):
    """Return ``result`` if its status is ``CONVERGED`` (or in ``accept``); raise :class:`SolverError` otherwise."""
    ok_codes = (int(Status.CONVERGED),) + _check_accept(accept)
    codes = _concrete_status(result, "throw()")
    bad = ~np.isin(codes, ok_codes)
    if not bad.any():
        return result
    kind = type(result).__name__
    if codes.ndim == 0:
        code = int(codes)
        name = Status(code).name if code in set(Status) else str(code)
        msg = (
            f"{kind}: the solve failed after {int(np.asarray(result.nit))} iterations: "
            f"{status_message(code)} (status {name})"
        )
    else:
        failed = codes[bad]
        msg = f"{kind}: {failed.size} of {codes.size} batched solves failed: " + "; ".join(
            f"{c} x {status_message(v)}" for v, c in zip(*np.unique(failed, return_counts=True))
        )
    raise SolverError(msg, codes, result)


_THROW_DOC = """Raise :class:`SolverError` unless the solve converged; return ``self`` otherwise.

        Parameters
        ----------
        accept : Status or sequence of Status, optional
            Further statuses that count as success, e.g.
            ``Status.MAX_ITERATIONS`` for a solver run for a fixed budget.

        Returns
        -------
        self
            So that ``x = newton_cg(...).throw().x`` reads naturally.

        Raises
        ------
        SolverError
            With a readable message (batched: how many members failed, and why).
        TypeError
            When called under ``jax.jit``/``vmap`` tracing: the status is not
            known before the program runs.
        """


class Solution(NamedTuple):
    """Result of a minimizer (:func:`~shardvi.minimizers.newton_cg` or the ``minimize`` of any
    :class:`~shardvi.minimizers.Minimizer`).

    Attributes
    ----------
    x : pytree
        Final position (the last accepted iterate).
    fun : float array
        Objective at ``x``.
    grad : pytree
        Gradient at ``x``.
    nit : int array
        Outer iterations.
    ncg : int array
        Inner CG iterations summed over all outer iterations (0 for solvers
        without an inner CG, e.g. optax).
    nfev : int array
        Objective (value-and-gradient) evaluations.
    status : int array
        A :class:`~shardvi.minimizers.Status` code.

    Notes
    -----
    ``converged`` is a boolean array (fine under jit and vmap); ``message`` and
    ``throw()`` read the status on the host.
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
        """``status == Status.CONVERGED`` (a boolean array)."""
        return _converged(self)

    @property
    def message(self) -> str:
        """Readable text for ``status`` (batched: one line per distinct status, with counts)."""
        return _message(self)

    def throw(self, *, accept=()) -> Solution:
        return _throw(self, accept)

    throw.__doc__ = _THROW_DOC


class CGResult(NamedTuple):
    """Result of :func:`~shardvi.minimizers.conjugate_gradient` (a linear solve ``A x = b``).

    Attributes
    ----------
    x : pytree
        Approximate solution of ``A x = b``.
    nit : int array
        Iterations done (one operator application each).
    status : int array
        A :class:`~shardvi.minimizers.Status` code.
    resnorm : float array
        Norm of the recursively updated residual ``b - A x``.
    energy : float array
        CG energy ``x.A.x/2 - b.x`` at ``x``.

    Notes
    -----
    Not a :class:`Solution`: a linear solve has a residual and a CG energy,
    no objective, gradient or function count. ``converged``, ``message`` and
    ``throw()`` work as on :class:`Solution`.
    """

    x: object
    nit: jax.Array
    status: jax.Array
    resnorm: jax.Array
    energy: jax.Array

    @property
    def converged(self):
        """``status == Status.CONVERGED`` (a boolean array)."""
        return _converged(self)

    @property
    def message(self) -> str:
        """Readable text for ``status`` (batched: one line per distinct status, with counts)."""
        return _message(self)

    def throw(self, *, accept=()) -> CGResult:
        return _throw(self, accept)

    throw.__doc__ = _THROW_DOC
