"""The state of :class:`~shardvi.vi.optimize_kl.OptimizeVI` between global iterations."""

from __future__ import annotations

from typing import Any, NamedTuple

__all__ = ["OptimizeVIState"]


class OptimizeVIState(NamedTuple):
    """State between global iterations (arrays and plain Python values only).

    Attributes
    ----------
    nit : int
        Completed global iterations.
    key : jax.Array
        Raw ``uint32`` RNG key for the next iteration.
    history : tuple of IterationReport
        One report per completed iteration.
    """

    nit: int
    key: Any
    history: tuple = ()
