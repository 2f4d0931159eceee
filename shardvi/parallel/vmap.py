"""``vmap`` strategy: vectorize over the samples on one device, in fixed chunks."""

from __future__ import annotations

import dataclasses

from ._base import SingleDevice, single_device_map
from .strategy import check_chunk, check_reduce, register_strategy

__all__ = ["Vmap"]


@dataclasses.dataclass(frozen=True)
class Vmap(SingleDevice):
    """Vectorize over samples on one device, in chunks of ``chunk_size`` samples.

    Parameters
    ----------
    chunk_size : int or None
        Samples per vectorized batch (bounds memory). The default 1 evaluates
        the samples one after the other in a loop — the reproducible
        reference every multi-device strategy with the same ``chunk_size`` is
        bitwise equal to. ``None`` vectorizes all samples at once (fastest
        for small models; results then depend on the sample count in the last
        bits).
    reduce : {"fixed", "psum"}
        ``"fixed"``: fixed-order mean (bitwise reproducible); ``"psum"``: tree
        reduction (``jnp.sum``), ~1 ulp different.
    """

    chunk_size: int | None = 1
    reduce: str = "fixed"
    name: str = dataclasses.field(default="vmap", init=False)

    def __post_init__(self):
        check_chunk(self.chunk_size)
        check_reduce(self.reduce)

    def map(self, fn, in_axes):
        return single_device_map(fn, in_axes, self.chunk_size, self.name)


register_strategy("vmap", Vmap)
