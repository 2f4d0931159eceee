"""``jit`` strategy: one ``jax.jit`` whose in/out shardings place the samples (and the model axis's blocks)."""

from __future__ import annotations

import contextlib
import dataclasses
from collections.abc import Sequence

import jax
import jax.numpy as jnp
from jax import tree_util as jtu
from jax.sharding import NamedSharding
from jax.sharding import PartitionSpec as P

from ._base import MultiDevice, divide, masked_local_sum, reshape_from_devices, reshape_to_devices
from .blocks import MODEL_AXIS, model_axis, model_specs
from .mesh import SAMPLE_AXIS
from .shard_map import rows_back, rows_out
from .strategy import chunked_apply, register_strategy

__all__ = ["JitSharding"]


def _is_spec(x) -> bool:
    return isinstance(x, P)


@dataclasses.dataclass(frozen=True)
class JitSharding(MultiDevice):
    """Place the samples with ``jax.jit`` in/out shardings; each device runs its own.

    The padded sample axis is reshaped to ``(len(devices) // model_shards,
    per_device, ...)`` and passed to a ``jax.jit`` whose ``in_shardings`` split
    that device axis over the mesh's sample axis (and, with ``model_shards >
    1``, the data blocks or grid rows over its model axis). Inside, the
    per-sample work runs in a ``shard_map`` manual over the mesh: each device
    maps its own samples (chunks of ``chunk_size``) as under
    :class:`~shardvi.parallel.ShardMap`, so its solver loops stop at its own
    iteration count and hold no collective, and an FFT or another custom call
    (jax-finufft's NUFFT) runs on the device's own samples. What lies outside
    the per-sample work (the gather of the outputs, the sums over samples) is
    left to XLA's SPMD partitioner.

    Notes
    -----
    Letting the partitioner split one *batched* program over the device axis
    instead (``jit(vmap(f))``) would cost more: the batched ``while_loop``
    solvers would run in lockstep (an all-reduce in every loop condition, every
    device iterating until the slowest sample anywhere has converged) and XLA
    does not split custom calls such as a plain ``jnp.fft`` (it all-gathers the
    batch, and the FFT then sees another batch size than on one device: other
    bits). Mapped per device, ``JitSharding`` takes about ``ShardMap``'s time
    per iteration (``BENCHMARKS.md``, "Sample-map strategies"). shardvi's own FFT
    (:func:`shardvi.parallel.fft.fftn`, used by :func:`shardvi.models.harmonic.hartley`
    and the correlated field) still carries a partitioning rule for user code
    that maps it with ``jax.jit`` and shardings of its own.

    Parameters
    ----------
    devices : sequence of jax.Device, optional
        Devices of the mesh (default: all ``jax.devices()`` at call time).
    chunk_size : int
        Samples per vectorized step on each device.
    reduce : {"fixed", "psum"}
        ``"fixed"`` (default): all-gather + fixed-order sum, bitwise
        reproducible; ``"psum"``: per-device sums reduced by an all-reduce.
    pad : bool
        Pad unplaceable sample counts with masked copies (default) or raise.
    model_shards : int
        Devices along a second mesh axis, ``"model"`` (see
        :class:`~shardvi.parallel.ShardMap`): the mesh is ``(len(devices) //
        model_shards, model_shards)`` and the samples are split over its rows.
        The data blocks of a likelihood amended with ``data_blocks`` are split
        over the model axis (each device evaluates its own blocks; one
        all-gather of per-block terms per block sum, or a ``psum`` with
        ``reduce="psum"``); a likelihood amended with ``field_blocks`` is split
        by grid rows (``Slab`` latents, slab FFTs). Bitwise equal to one device
        when ``model_shards`` divides ``data_blocks`` / ``field_blocks``. A
        field-split model that needs the whole field is evaluated on the field
        gathered over the model axis on every device of it (with a warning),
        where :class:`~shardvi.parallel.ShardMap` raises. Default 1: data
        replicated.
    """

    devices: Sequence | None = None
    chunk_size: int = 1
    reduce: str = "fixed"
    pad: bool = True
    model_shards: int = 1
    name: str = dataclasses.field(default="jit", init=False)

    def __post_init__(self):
        self._validate()

    def _jit(self, per_device_fn, in_axes, args, batch: int):
        """``jax.jit`` of the per-sample work, manual over every mesh axis inside.

        The jit's in-shardings split the device axis of ``args`` (the reshaped samples,
        ``(len(devices) // model_shards, per_device, ...)``) over the sample axis and, with
        ``model_shards > 1``, the data blocks or grid rows over the model axis; a
        ``shard_map`` inside it hands each device its own samples (and blocks or rows), and
        ``per_device_fn`` runs on them unbatched, as under :class:`~shardvi.parallel.ShardMap`.
        So each device's solver loops stop at its own iteration count and hold no collective.
        Left to XLA's partitioner, one batched program over the device axis would run the
        solvers in lockstep (an all-reduce in every loop condition) and, with a field split,
        gather every sample row's samples around the slab transform's ``all_to_all``.
        ``batch``: the sample axes in front of ``per_device_fn``'s outputs (1 for stacked
        samples, 0 for a sum). Returns the outputs with the device axis in front; with a field
        split, ``Slab`` leaves come back as ``MeshSlab`` (rows still split).
        """
        mesh, split, record = self.mesh, self.model_shards > 1, {}
        rows = self._splits_rows(args)
        if split:
            self.check_blocks(args)
            in_specs = tuple(model_specs(a, batch=SAMPLE_AXIS if ax == 0 else None) for a, ax in zip(args, in_axes))
        else:
            in_specs = tuple(
                jtu.tree_map(lambda _, ax=ax: P(SAMPLE_AXIS) if ax == 0 else P(), a) for a, ax in zip(args, in_axes)
            )

        def body(*local):
            # this device's part of the device axis has length 1
            own = [jtu.tree_map(lambda x: x[0], a) if ax == 0 else a for a, ax in zip(local, in_axes)]
            # with a model axis, every block sum gathers over it, and a field-split model that needs the
            # whole field gets it gathered over it
            axis = model_axis(MODEL_AXIS, self.model_shards, self.reduce, whole_model=True)
            with axis if split else contextlib.nullcontext():
                out = jtu.tree_map(lambda x: x[None], per_device_fn(*own))
            return rows_out(out, record, batch + 1) if rows else out

        # outputs other than a field split's slabs are the same on every device of the model axis
        out_specs = P(SAMPLE_AXIS, *(None,) * batch, MODEL_AXIS) if rows else P(SAMPLE_AXIS)
        flat, treedef = jtu.tree_flatten(tuple(args))

        def program(*leaves):
            mapped = jax.shard_map(body, mesh=mesh, in_specs=in_specs, out_specs=out_specs, check_vma=False)
            out = mapped(*jtu.tree_unflatten(treedef, leaves))
            return rows_back(out, record, mesh, batch + 1) if rows else out

        in_shardings = tuple(NamedSharding(mesh, s) for s in jtu.tree_leaves(in_specs, is_leaf=_is_spec))
        return jax.jit(program, in_shardings=in_shardings)(*flat)

    def map(self, fn, in_axes):
        """Stacked per-sample outputs (padding dropped, replicated over the mesh)."""

        def mapped(*args):
            layout, padded = self._prepare(args, in_axes)
            split = [reshape_to_devices(a, layout) if ax == 0 else a for a, ax in zip(padded, in_axes)]
            per_device = lambda *local: chunked_apply(fn, in_axes, local, self.chunk_size)  # noqa: E731
            out = self._jit(per_device, in_axes, split, 1)
            return self._finish(reshape_from_devices(out, layout), layout)

        return mapped

    def fast_map_mean(self, fn, in_axes):
        """Per-device sums, then an all-reduce (``reduce="psum"``)."""

        def mm(*args):
            layout, padded = self._prepare(args, in_axes)
            split = [reshape_to_devices(a, layout) if ax == 0 else a for a, ax in zip(padded, in_axes)]
            axes = tuple(in_axes) + (0,)

            def per_device(*local):
                *local, d = local
                vals = chunked_apply(fn, in_axes, tuple(local), self.chunk_size)
                return masked_local_sum(vals, layout, d)

            split.append(jnp.arange(layout.n_devices))
            parts = self._jit(per_device, axes, split, 0)
            total = jtu.tree_map(lambda x: jnp.sum(x, axis=0), parts)
            return self._replicated(divide(total, layout.n))

        return mm


register_strategy("jit", JitSharding)
