"""The state of :class:`~shardvi.vi.optimize_kl.OptimizeVI` between global iterations."""

from __future__ import annotations

from typing import Any, NamedTuple

import numpy as np

from .._keys import raw_key

__all__ = ["OptimizeVIState", "check_nit", "raw_key"]


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


def check_nit(nit, argname: str = "nit") -> None:
    """A count of completed global iterations: an int ``>= 0`` (``TypeError`` / ``ValueError`` naming ``argname``)."""
    if isinstance(nit, (bool, np.bool_)) or not isinstance(nit, (int, np.integer)):
        raise TypeError(f"{argname} must be an int >= 0 (completed iterations), got {type(nit).__name__} {nit!r}")
    if nit < 0:
        raise ValueError(f"{argname} must be an int >= 0 (completed iterations), got {nit!r}")
