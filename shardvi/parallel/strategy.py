"""Device-map strategies: how a per-sample function is mapped over samples.

A strategy turns ``fn(*args)`` into a function over a leading *sample axis*
(like ``jax.vmap``) and reduces stacked per-sample results to their mean. The
engine only ever calls these two methods, inside ``jax.jit``, so a strategy
that spreads samples over devices drops in without touching the engine:

- ``map(fn, in_axes)``: ``in_axes`` is a tuple with ``0`` (mapped over the
  leading axis) or ``None`` (broadcast) per positional argument; returns the
  stacked outputs, leading axis = number of samples, in sample order.
- ``mean(stacked)``: mean over the leading axis in a fixed order, so the
  result does not depend on how the samples were spread out.
"""
from __future__ import annotations

import dataclasses
from typing import Callable, Optional, Protocol, runtime_checkable

import jax
import jax.numpy as jnp
from jax import tree_util as jtu

__all__ = ["Strategy", "Vmap", "LaxMap", "get_strategy", "fixed_order_mean", "STRATEGY_NAMES"]


@runtime_checkable
class Strategy(Protocol):
    """Protocol every device-map strategy implements."""

    name: str

    def map(self, fn: Callable, in_axes: tuple) -> Callable: ...

    def mean(self, stacked): ...


def fixed_order_mean(stacked):
    """Mean over the leading axis, summing samples strictly left to right.

    ``jnp.mean`` lets XLA pick a reduction tree that can depend on the batch
    size; an explicit sequential sum is bitwise stable.
    """
    def one(x):
        n = x.shape[0]
        if n == 0:
            raise ValueError("cannot average over zero samples")
        acc = jax.lax.fori_loop(1, n, lambda i, a: a + x[i], x[0])
        return acc / n
    return jtu.tree_map(one, stacked)


def _check_in_axes(in_axes, n_args):
    if len(in_axes) != n_args:
        raise ValueError(f"in_axes has {len(in_axes)} entries for {n_args} arguments")
    if any(a not in (0, None) for a in in_axes):
        raise ValueError(f"in_axes entries must be 0 or None, got {in_axes}")
    if all(a is None for a in in_axes):
        raise ValueError("at least one argument must be mapped (in_axes entry 0)")


def _check_chunk(chunk_size):
    if chunk_size is not None and (isinstance(chunk_size, bool) or not isinstance(chunk_size, int)
                                   or chunk_size < 1):
        raise ValueError(f"chunk_size must be a positive int or None, got {chunk_size!r}")


@dataclasses.dataclass(frozen=True)
class Vmap:
    """Vectorize over samples on one device (``jax.vmap``).

    Parameters
    ----------
    chunk_size : int or None
        Samples per vectorized batch (bounds memory); ``None`` maps all at once.
    """

    chunk_size: Optional[int] = None
    name: str = dataclasses.field(default="vmap", init=False)

    def __post_init__(self):
        _check_chunk(self.chunk_size)

    def map(self, fn, in_axes):
        if self.chunk_size is None:
            return jax.vmap(fn, in_axes=in_axes)
        return LaxMap(batch_size=self.chunk_size).map(fn, in_axes)

    def mean(self, stacked):
        return fixed_order_mean(stacked)


@dataclasses.dataclass(frozen=True)
class LaxMap:
    """Loop over samples sequentially (``jax.lax.map``): lowest memory.

    Parameters
    ----------
    batch_size : int or None
        Samples vectorized per loop step (``lax.map``'s ``batch_size``).
    """

    batch_size: Optional[int] = None
    name: str = dataclasses.field(default="lax_map", init=False)

    def __post_init__(self):
        _check_chunk(self.batch_size)

    def map(self, fn, in_axes):
        def mapped(*args):
            _check_in_axes(in_axes, len(args))
            xs = tuple(a for a, ax in zip(args, in_axes) if ax == 0)

            def one(x):
                it = iter(x)
                full = [next(it) if ax == 0 else a for a, ax in zip(args, in_axes)]
                return fn(*full)
            return jax.lax.map(one, xs, batch_size=self.batch_size)
        return mapped

    def mean(self, stacked):
        return fixed_order_mean(stacked)


_FACTORIES: dict = {"vmap": Vmap, "lax_map": LaxMap}
STRATEGY_NAMES = ("vmap", "lax_map", "pmap", "shard_map", "jit")


def register_strategy(name: str, factory: Callable) -> None:
    """Make ``factory(devices=...)`` available under ``name`` (used by multi-device strategies)."""
    _FACTORIES[name] = factory


def get_strategy(spec, argname: str = "sample_map", devices=None):
    """Resolve a strategy name or object.

    Parameters
    ----------
    spec : str or Strategy
        One of ``STRATEGY_NAMES`` or an object with ``map`` and ``mean``.
    argname : str
        Argument name used in error messages.
    devices : sequence of jax.Device, optional
        Devices for multi-device strategies given by name.
    """
    if isinstance(spec, str):
        if spec not in STRATEGY_NAMES:
            raise ValueError(f"{argname} must be one of {STRATEGY_NAMES} or a strategy object, got {spec!r}")
        if spec not in _FACTORIES:
            raise NotImplementedError(f"{argname}={spec!r} is not available in this build")
        factory = _FACTORIES[spec]
        return factory() if spec in ("vmap", "lax_map") else factory(devices=devices)
    if isinstance(spec, Strategy):
        return spec
    raise TypeError(f"{argname} must be a strategy name {STRATEGY_NAMES} or an object with map() and mean(), "
                    f"got {type(spec).__name__}")
