"""``pmap`` strategy: samples reshaped to ``(devices, per_device, ...)`` and ``jax.pmap``-ed."""

from __future__ import annotations

import dataclasses
from collections.abc import Sequence

import jax

from ._base import MultiDevice, divide, masked_local_sum, reshape_from_devices, reshape_to_devices
from .mesh import SAMPLE_AXIS
from .strategy import chunked_apply, register_strategy

__all__ = ["Pmap"]


@dataclasses.dataclass(frozen=True)
class Pmap(MultiDevice):
    """Spread samples over devices with ``jax.pmap`` (usable inside ``jax.jit``).

    The padded sample axis is reshaped to ``(len(devices), per_device, ...)``;
    each device maps its block in chunks of ``chunk_size`` samples and, like
    :class:`~shardvi.parallel.ShardMap`, runs its solver loops without
    collectives. Broadcast arguments use ``in_axes=None``. Single-process
    only: in a multi-process run use :class:`~shardvi.parallel.ShardMap` or
    :class:`~shardvi.parallel.JitSharding`.

    Parameters
    ----------
    devices : sequence of jax.Device, optional
        Devices to map over (default: all ``jax.devices()`` at call time).
    chunk_size : int
        Samples per vectorized step on each device.
    reduce : {"fixed", "psum"}
        ``"fixed"`` (default): all-gather + fixed-order sum, bitwise
        reproducible; ``"psum"``: per-device sum + ``psum``, ~1 ulp apart.
    pad : bool
        Pad unplaceable sample counts with masked copies (default) or raise a
        ``ValueError`` naming the counts that work.
    """

    devices: Sequence | None = None
    chunk_size: int = 1
    reduce: str = "fixed"
    pad: bool = True
    model_shards: int = 1
    name: str = dataclasses.field(default="pmap", init=False)

    def __post_init__(self):
        if self.model_shards != 1:
            raise ValueError(
                f"model_shards={self.model_shards!r}: Pmap maps samples only and does not split data blocks "
                f"over a model axis; use ShardMap(model_shards=...) or JitSharding(model_shards=...)"
            )
        self._validate()

    def _pmap(self, body, in_axes):
        devices = self.resolved_devices
        if any(d.process_index != jax.process_index() for d in devices):
            raise ValueError(
                "devices: Pmap maps over devices of this process only, but the devices span "
                f"processes {sorted({d.process_index for d in devices})}; use ShardMap or "
                "JitSharding for multi-process runs (or pass jax.local_devices())"
            )
        return jax.pmap(body, axis_name=SAMPLE_AXIS, in_axes=tuple(in_axes), devices=devices)

    def _split(self, padded, in_axes, layout):
        return [reshape_to_devices(a, layout) if ax == 0 else a for a, ax in zip(padded, in_axes)]

    def map(self, fn, in_axes):
        """Stacked per-sample outputs (padding dropped, replicated over the devices)."""

        def mapped(*args):
            layout, padded = self._prepare(args, in_axes)
            body = lambda *local: chunked_apply(fn, in_axes, local, self.chunk_size)  # noqa: E731
            out = self._pmap(body, in_axes)(*self._split(padded, in_axes, layout))
            return self._finish(reshape_from_devices(out, layout), layout)

        return mapped

    def fast_map_mean(self, fn, in_axes):
        """Per-device sums ``psum``-ed inside the ``pmap`` (``reduce="psum"``)."""

        def mm(*args):
            layout, padded = self._prepare(args, in_axes)

            def body(*local):
                vals = chunked_apply(fn, in_axes, local, self.chunk_size)
                part = masked_local_sum(vals, layout, jax.lax.axis_index(SAMPLE_AXIS))
                return jax.lax.psum(part, SAMPLE_AXIS)

            out = self._pmap(body, in_axes)(*self._split(padded, in_axes, layout))
            return divide(jax.tree_util.tree_map(lambda x: x[0], out), layout.n)

        return mm


register_strategy("pmap", Pmap)
