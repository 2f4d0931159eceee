"""``lax_map`` strategy: loop over the samples on one device (lowest memory)."""

from __future__ import annotations

import dataclasses

import jax

from ..tree_math import per_sample_work
from ._base import SingleDevice, single_device_map
from .strategy import _with_mapped, check_chunk, check_in_axes, check_reduce, register_strategy

__all__ = ["LaxMap"]


@dataclasses.dataclass(frozen=True)
class LaxMap(SingleDevice):
    """Loop over samples sequentially: lowest memory.

    Parameters
    ----------
    batch_size : int or None
        Samples vectorized per loop step (default 1, bitwise identical to
        ``Vmap(chunk_size=1)``); ``None`` loops over unbatched samples
        (``jax.lax.map`` without ``batch_size``).
    reduce : {"fixed", "psum"}
        As for :class:`~shardvi.parallel.Vmap`.
    """

    batch_size: int | None = 1
    reduce: str = "fixed"
    name: str = dataclasses.field(default="lax_map", init=False)

    def __post_init__(self):
        check_chunk(self.batch_size, "batch_size")
        check_reduce(self.reduce)

    @classmethod
    def create(cls, devices=None, argname="sample_map", **options):
        """By name, ``chunk_size`` (the option every built-in takes) sets ``batch_size``."""
        if "chunk_size" in options:
            options["batch_size"] = options.pop("chunk_size")
        return super().create(devices, argname, **options)

    def map(self, fn, in_axes):
        if self.batch_size is not None:
            return single_device_map(fn, in_axes, self.batch_size, self.name)

        def mapped(*args):
            check_in_axes(in_axes, len(args))
            xs = tuple(a for a, ax in zip(args, in_axes) if ax == 0)
            with per_sample_work():  # traced here, as the other strategies' per-sample work
                return jax.lax.map(lambda x: fn(*_with_mapped(args, in_axes, x)), xs)

        return mapped


register_strategy("lax_map", LaxMap)
