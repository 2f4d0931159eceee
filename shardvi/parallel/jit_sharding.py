"""``jit`` strategy: GSPMD partitioning through ``jax.jit`` in/out shardings."""

from __future__ import annotations

import dataclasses
import warnings
from collections.abc import Sequence

import jax
import jax.numpy as jnp
from jax import tree_util as jtu
from jax.sharding import NamedSharding
from jax.sharding import PartitionSpec as P

from ._base import MultiDevice, divide, masked_local_sum, reshape_from_devices, reshape_to_devices
from .blocks import MODEL_AXIS, model_axis, model_specs
from .fft import PARTITIONED_PRIMITIVES
from .mesh import SAMPLE_AXIS, replicated, sharded
from .shard_map import rows_back, rows_out
from .strategy import check_in_axes, chunked_apply, register_strategy

__all__ = ["JitSharding", "unpartitionable_primitives"]

#: primitives XLA's SPMD partitioner replicates instead of splitting along the batch
_UNPARTITIONED = ("fft", "custom_call", "ffi_call", "pure_callback", "nufft")


def _is_spec(x) -> bool:
    return isinstance(x, P)


def unpartitionable_primitives(jaxpr) -> set:
    """Names of primitives in ``jaxpr`` (recursively) that GSPMD runs replicated (FFT, custom calls)."""
    found = set()

    def visit(j):
        for eqn in j.eqns:
            name = eqn.primitive.name
            if any(tag in name for tag in _UNPARTITIONED) and name not in PARTITIONED_PRIMITIVES:
                found.add(name)
            for v in eqn.params.values():
                for sub in v if isinstance(v, (tuple, list)) else (v,):
                    inner = getattr(sub, "jaxpr", sub)
                    if hasattr(inner, "eqns"):
                        visit(inner)

    visit(jaxpr)
    return found


@dataclasses.dataclass(frozen=True)
class JitSharding(MultiDevice):
    """Let XLA's GSPMD partitioner split the samples (``jax.jit`` with shardings).

    The padded sample axis is reshaped to ``(len(devices), per_device, ...)``
    and ``vmap``-ed over the device axis inside a ``jax.jit`` whose
    ``in_shardings``/``out_shardings`` split that axis over a 1-D mesh.

    Notes
    -----
    GSPMD partitions one *batched* program, so the per-sample ``while_loop``
    solvers run in lockstep on all devices: the loop condition contains an
    all-reduce and every device iterates until the slowest sample anywhere
    has converged (finished samples are frozen, so results are unchanged).
    :class:`~shardvi.parallel.ShardMap` and :class:`~shardvi.parallel.Pmap`
    let each device stop on its own. GSPMD cannot split opaque custom calls
    (e.g. jax-finufft's NUFFT) nor, in this XLA version, a plain
    ``jnp.fft`` FFT: it all-gathers the batch and runs all samples on every
    device — slow, and the FFT then sees another batch size than on one
    device, so results can differ in the last bits (mapping such a function
    warns). shardvi's own FFT (:func:`shardvi.parallel.fft.fftn`, used by
    :func:`shardvi.models.harmonic.hartley` and the correlated field) carries a partitioning
    rule and stays split over the samples: correlated-field models run
    sample-parallel. Use
    :class:`~shardvi.parallel.ShardMap` or :class:`~shardvi.parallel.Pmap`
    for models with other custom calls.

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
        Devices along a second mesh axis, ``"model"``, over which the data
        blocks of a likelihood amended with ``data_blocks`` are split (see
        :class:`~shardvi.parallel.ShardMap`): the mesh is ``(len(devices) //
        model_shards, model_shards)``, GSPMD splits the samples over its rows
        and every block sum is a ``shard_map`` manual over the model axis (each
        device evaluates its own blocks; one all-gather of per-block terms, or
        a ``psum`` with ``reduce="psum"``). Bitwise equal to one device when
        ``model_shards`` divides ``data_blocks`` and the model has no FFT.
        A likelihood amended with ``field_blocks`` is split by grid rows:
        inside the ``jax.jit`` the per-sample work runs in a ``shard_map``
        over both mesh axes (each device its sample row's samples and its
        grid rows, as under :class:`~shardvi.parallel.ShardMap`; its solvers
        then stop on their own, not in lockstep), since XLA's partitioner
        does not keep samples split through the slab transform's
        ``all_to_all``; bitwise equal to one device for ``model_shards``
        dividing ``field_blocks``. A model that needs the whole field is then
        evaluated on the gathered field on every device of the model axis
        (with a warning) instead of raising. Default 1: data replicated.
    """

    devices: Sequence | None = None
    chunk_size: int = 1
    reduce: str = "fixed"
    pad: bool = True
    model_shards: int = 1
    name: str = dataclasses.field(default="jit", init=False)

    def __post_init__(self):
        self._validate()

    def _jit(self, per_device_fn, in_axes, out_sharding, args):
        """``jit(vmap(per_device_fn))(*args)`` with the samples split over the sample axis."""
        mesh = self.mesh
        if self.model_shards == 1:
            batched = jax.vmap(per_device_fn, in_axes=tuple(in_axes))
            in_shardings = tuple(sharded(mesh) if ax == 0 else replicated(mesh) for ax in in_axes)
            return jax.jit(batched, in_shardings=in_shardings, out_shardings=out_sharding)(*args)
        # the device axis is the sample mesh axis (also for the block sums' shard_maps inside)
        batched = jax.vmap(per_device_fn, in_axes=tuple(in_axes), spmd_axis_name=SAMPLE_AXIS)
        # data blocks split over the model axis: one sharding per leaf (blocks P("model"), the rest P())
        self.check_blocks(args)
        flat, treedef = jtu.tree_flatten(tuple(args))
        shardings = []
        for a, ax in zip(args, in_axes):
            n_leaves = len(jtu.tree_leaves(a))
            if ax == 0:
                shardings += [sharded(mesh)] * n_leaves
            else:
                shardings += [NamedSharding(mesh, spec) for spec in jtu.tree_leaves(model_specs(a), is_leaf=_is_spec)]

        def flat_fn(*leaves):
            return batched(*jtu.tree_unflatten(treedef, leaves))

        jitted = jax.jit(flat_fn, in_shardings=tuple(shardings), out_shardings=out_sharding)
        # traced here: every block sum in the per-sample work becomes a shard_map manual over the model axis
        with model_axis(MODEL_AXIS, self.model_shards, self.reduce, mesh=mesh):
            return jitted(*flat)

    def _jit_rows(self, per_device_fn, in_axes, args, batch: int):
        """``_jit`` for a field split over the model axis: one ``shard_map`` over both mesh axes.

        Inside a ``jax.jit`` whose in-shardings split the device axis over the sample axis and
        the grid rows over the model axis, a ``shard_map`` manual over both axes hands each
        device its sample row's samples and its grid rows, as under
        :class:`~shardvi.parallel.ShardMap` (``Slab`` latents, slab FFTs, block-order sums over
        the model axis). The sample axis is manual too: with it left to GSPMD (the model axis
        manual only), XLA's partitioner gathered every sample row's samples around each
        ``all_to_all`` of the slab transform and each block sum's ``all_gather`` (it keeps no
        automatic split through a collective of a manual axis), so every device transformed all
        of its row's samples (1.55-1.79x ``ShardMap``'s time at 2x2; BENCHMARKS.md). ``batch``:
        the sample axes in front of the per-device function's outputs (1 for stacked samples, 0
        for a sum). Returns the outputs with ``Slab`` leaves as ``MeshSlab`` (rows split), the
        device axis still in front.
        """
        mesh, record = self.mesh, {}
        self.check_blocks(args)
        batched = jax.vmap(per_device_fn, in_axes=tuple(in_axes))  # this device's part of the device axis
        in_specs = tuple(model_specs(a, batch=SAMPLE_AXIS if ax == 0 else None) for a, ax in zip(args, in_axes))

        def body(*local):
            # traced per device; a model that needs the whole field gets it gathered over the model axis
            with model_axis(MODEL_AXIS, self.model_shards, self.reduce, whole_model=True):
                return rows_out(batched(*local), record, batch + 1)

        flat, treedef = jtu.tree_flatten(tuple(args))

        def program(*leaves):
            mapped = jax.shard_map(
                body,
                mesh=mesh,
                in_specs=in_specs,
                out_specs=P(SAMPLE_AXIS, *(None,) * batch, MODEL_AXIS),
                check_vma=False,
            )
            return rows_back(mapped(*jtu.tree_unflatten(treedef, leaves)), record, mesh, batch + 1)

        in_shardings = tuple(NamedSharding(mesh, s) for s in jtu.tree_leaves(in_specs, is_leaf=_is_spec))
        return jax.jit(program, in_shardings=in_shardings)(*flat)

    def _warn_unpartitionable(self, fn, in_axes, args):
        if len(self.resolved_devices) < 2 or self._splits_rows(args):  # a field split: see _jit_rows
            return
        check_in_axes(in_axes, len(args))
        example = [jax.tree.map(lambda x: x[0], a) if ax == 0 else a for a, ax in zip(args, in_axes)]
        found = sorted(unpartitionable_primitives(jax.make_jaxpr(fn)(*example).jaxpr))
        if found:
            warnings.warn(
                f"JitSharding: the per-sample function uses {found}, which XLA's SPMD partitioner does not split: "
                f"every device all-gathers the batch and computes all samples (slow), and results can differ in "
                f"the last bits from 1-device runs. Use ShardMap or Pmap for such models.",
                UserWarning,
                stacklevel=3,
            )

    def map(self, fn, in_axes):
        """Stacked per-sample outputs (padding dropped, replicated over the mesh)."""

        def mapped(*args):
            self._warn_unpartitionable(fn, in_axes, args)
            layout, padded = self._prepare(args, in_axes)
            split = [reshape_to_devices(a, layout) if ax == 0 else a for a, ax in zip(padded, in_axes)]
            per_device = lambda *local: chunked_apply(fn, in_axes, local, self.chunk_size)  # noqa: E731
            if self._splits_rows(padded):
                out = self._jit_rows(per_device, in_axes, split, 1)
            else:
                out = self._jit(per_device, in_axes, sharded(self.mesh), split)
            return self._finish(reshape_from_devices(out, layout), layout)

        return mapped

    def fast_map_mean(self, fn, in_axes):
        """Per-device sums, then an all-reduce (``reduce="psum"``)."""

        def mm(*args):
            self._warn_unpartitionable(fn, in_axes, args)
            layout, padded = self._prepare(args, in_axes)
            split = [reshape_to_devices(a, layout) if ax == 0 else a for a, ax in zip(padded, in_axes)]
            axes = tuple(in_axes) + (0,)

            def per_device(*local):
                *local, d = local
                vals = chunked_apply(fn, in_axes, tuple(local), self.chunk_size)
                return masked_local_sum(vals, layout, d)

            split.append(jnp.arange(layout.n_devices))
            if self._splits_rows(padded):
                parts = self._jit_rows(per_device, axes, split, 0)
            else:
                parts = self._jit(per_device, axes, sharded(self.mesh), split)
            total = jtu.tree_map(lambda x: jnp.sum(x, axis=0), parts)
            return self._replicated(divide(total, layout.n))

        return mm


register_strategy("jit", JitSharding)
