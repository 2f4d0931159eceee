"""Checks shared by the solvers: of their configurations (once, at construction) and of their operands
(shapes and dtypes, at trace time)."""

from __future__ import annotations

import math

import jax.numpy as jnp
import numpy as np
from jax import tree_util as jtu

__all__ = ["check_callables", "check_iters", "check_like", "check_name", "check_tol"]


def check_tol(owner: str, name: str, value, *, allow_none: bool = True, upper=None) -> None:
    """``owner.name`` must be a finite number ``>= 0`` (``<= upper``), or None where allowed."""
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


def check_iters(owner: str, miniter, maxiter) -> None:
    """``0 <= miniter <= maxiter``, ``maxiter >= 1``, both ints."""
    for name, v in (("miniter", miniter), ("maxiter", maxiter)):
        if isinstance(v, bool) or not isinstance(v, int):
            raise TypeError(f"{owner}.{name} must be an int, got {type(v).__name__}")
    if miniter < 0:
        raise ValueError(f"{owner}.miniter must be >= 0, got {miniter}")
    if maxiter < 1:
        raise ValueError(f"{owner}.maxiter must be >= 1, got {maxiter}")
    if miniter > maxiter:
        raise ValueError(f"{owner}.miniter ({miniter}) must be <= maxiter ({maxiter})")


def check_name(owner: str, name) -> None:
    """A logging name: str or None."""
    if name is not None and not isinstance(name, str):
        raise TypeError(f"{owner}.name must be a str or None, got {type(name).__name__}")


def check_callables(owner: str, **functions) -> None:
    """Each keyword's value must be callable: a ``TypeError`` naming ``owner``'s argument otherwise (before JAX
    traces anything)."""
    for name, f in functions.items():
        if not callable(f):
            raise TypeError(f"{owner}: {name} must be callable, got {type(f).__name__}")


def check_like(owner: str, name: str, value, like_name: str, like) -> None:
    """``value`` must have ``like``'s tree structure, leaf shapes and dtypes: a ``ValueError`` naming ``owner``'s
    ``name`` otherwise. Reads only shapes and dtypes (free at trace time, traced values pass)."""
    leaves, tree = jtu.tree_flatten(value)
    like_leaves, like_tree = jtu.tree_flatten(like)
    got = [(tuple(np.shape(x)), jnp.result_type(x)) for x in leaves]
    want = [(tuple(np.shape(x)), jnp.result_type(x)) for x in like_leaves]
    if tree != like_tree or got != want:
        fmt = lambda specs: [f"{d}{list(s)}" for s, d in specs]  # noqa: E731
        raise ValueError(
            f"{owner}: {name} must have the structure, shapes and dtypes of {like_name} ({fmt(want)}), "
            f"got {fmt(got)}" + ("" if tree == like_tree else f" in a tree {tree} instead of {like_tree}")
        )
