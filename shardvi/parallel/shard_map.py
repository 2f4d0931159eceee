"""``shard_map`` strategy: each device maps its own block of samples."""

from __future__ import annotations

import contextlib
import dataclasses
from collections.abc import Sequence

import jax
import jax.numpy as jnp
from jax import tree_util as jtu
from jax.sharding import PartitionSpec as P

from ._base import MultiDevice, divide, masked_local_sum
from .blocks import MODEL_AXIS, model_axis, model_specs
from .grid import MeshSlab, is_slab
from .mesh import SAMPLE_AXIS
from .strategy import chunked_apply, register_strategy

__all__ = ["ShardMap"]


def _to_varying(tree):
    return jtu.tree_map(lambda x: jax.lax.pcast(x, SAMPLE_AXIS, to="varying"), tree)


@dataclasses.dataclass(frozen=True)
class ShardMap(MultiDevice):
    """Spread samples over devices with ``jax.shard_map`` on a 1-D mesh.

    Every device runs its per-sample solvers (CG, Newton-CG ``while_loop``\\ s)
    independently and stops at its own iteration count: the sampling loops
    contain no collectives. Outputs are all-gathered (replicated) once at the
    end; means use the fixed-order sum over the gathered per-sample values
    (``reduce="fixed"``) or a per-device sum plus ``psum`` (``reduce="psum"``).

    Parameters
    ----------
    devices : sequence of jax.Device, optional
        Devices of the mesh (default: all ``jax.devices()`` at call time).
    chunk_size : int
        Samples per vectorized step on each device (bounds memory; the same
        value gives bitwise identical results for any device count).
    reduce : {"fixed", "psum"}
        ``"fixed"`` (default): bitwise reproducible; ``"psum"``: fast, each
        reduction may differ from the reproducible one by ~1 ulp.
    pad : bool
        Pad a sample count that is not a multiple of ``len(devices) *
        chunk_size`` with copies of the last sample whose results are dropped
        (default). ``False`` raises a ``ValueError`` listing counts that work.
    model_shards : int
        Devices along a second mesh axis, ``"model"``, over which the data
        blocks of a likelihood amended with ``data_blocks`` are split (model
        parallelism): the mesh is ``(len(devices) // model_shards,
        model_shards)``, samples are split over its rows, and within a row
        each device holds and evaluates ``data_blocks / model_shards`` blocks
        of data, noise and ``data_inputs`` (one all-gather of per-block terms
        over the row per energy, gradient or metric application). Results
        are bitwise those of one device when ``model_shards`` divides
        ``data_blocks`` (else ``ValueError``). A likelihood amended with
        ``field_blocks`` is split the same way by grid rows: its data, the
        latents' grid leaves (:class:`~shardvi.parallel.grid.MeshSlab`
        inputs; per-device ``Slab`` outputs come back as ``MeshSlab``, rows
        still split); a model that needs the whole field raises a
        ``ValueError`` (:class:`~shardvi.parallel.JitSharding` evaluates it on
        the gathered field). Default 1: data replicated.
    check_vma : bool
        JAX's varying-manual-axes type checking. ``False`` (default): no
        implicit cross-device reductions at all (gradients with respect to
        broadcast inputs stay per sample; the only collectives are the
        explicit gather/``psum`` of this strategy), and solver loops whose
        carries start replicated (the engine's CG / Newton-CG) work. ``True``:
        broadcast inputs are ``pcast`` to varying on entry — without that, JAX
        would sum their gradients over devices — but every ``while_loop`` in
        the per-sample function must keep consistent varying types.
    """

    devices: Sequence | None = None
    chunk_size: int = 1
    reduce: str = "fixed"
    pad: bool = True
    check_vma: bool = False
    model_shards: int = 1
    name: str = dataclasses.field(default="shard_map", init=False)

    def __post_init__(self):
        self._validate()
        if not isinstance(self.check_vma, bool):
            raise TypeError(f"check_vma must be a bool, got {type(self.check_vma).__name__}")
        if self.check_vma and self.model_shards > 1:
            raise ValueError("model_shards > 1 needs check_vma=False (the block sums gather over the model axis)")

    def _local(self, fn, in_axes, local):
        if self.check_vma:
            local = [_to_varying(a) if ax is None else a for a, ax in zip(local, in_axes)]
        # with model shards, the block sums traced in fn gather over the row
        split = self.model_shards > 1
        with model_axis(MODEL_AXIS, self.model_shards, self.reduce) if split else contextlib.nullcontext():
            return chunked_apply(fn, in_axes, tuple(local), self.chunk_size)

    def _shard_map(self, body, in_axes, out_specs, args):
        if self.model_shards == 1:
            in_specs = tuple(P(SAMPLE_AXIS) if ax == 0 else P() for ax in in_axes)
        else:
            self.check_blocks(args)
            in_specs = tuple(
                model_specs(a, batch=SAMPLE_AXIS) if ax == 0 else model_specs(a) for a, ax in zip(args, in_axes)
            )
        return jax.shard_map(body, mesh=self.mesh, in_specs=in_specs, out_specs=out_specs, check_vma=self.check_vma)

    def map(self, fn, in_axes):
        """Stacked per-sample outputs (padding dropped, replicated over the mesh).

        With a field split over the model axis, an output ``Slab`` (one device's rows) is
        returned as a :class:`~shardvi.parallel.grid.MeshSlab`, its rows left split.
        """

        def mapped(*args):
            layout, padded = self._prepare(args, in_axes)
            if self._splits_rows(padded):
                record = {}
                body = lambda *local: rows_out(self._local(fn, in_axes, local), record, 1)  # noqa: E731
                flat = self._shard_map(body, in_axes, P(SAMPLE_AXIS, MODEL_AXIS), padded)(*padded)
                return self._finish(rows_back(flat, record, self.mesh, 1), layout)
            body = lambda *local: self._local(fn, in_axes, local)  # noqa: E731
            out = self._shard_map(body, in_axes, P(SAMPLE_AXIS), padded)(*padded)
            return self._finish(out, layout)

        return mapped

    def fast_map_mean(self, fn, in_axes):
        """Per-device sums ``psum``-ed inside the ``shard_map`` (``reduce="psum"``)."""

        def mm(*args):
            layout, padded = self._prepare(args, in_axes)
            rows, record = self._splits_rows(padded), {}

            def body(*local):
                vals = self._local(fn, in_axes, local)
                part = jax.lax.psum(masked_local_sum(vals, layout, jax.lax.axis_index(SAMPLE_AXIS)), SAMPLE_AXIS)
                return rows_out(part, record, 0) if rows else part

            if rows:
                flat = self._shard_map(body, in_axes, P(MODEL_AXIS), padded)(*padded)
                return divide(rows_back(flat, record, self.mesh, 0), layout.n)
            return divide(self._shard_map(body, in_axes, P(), padded)(*padded), layout.n)

        return mm


def rows_out(tree, record: dict, batch: int) -> list:
    """Inside the ``shard_map``: the output leaves for out-spec ``(samples,)*batch + (model,)``.

    A ``Slab`` leaf gives its rows (split over the model axis); any other leaf, the same on
    every device of the model axis, gets a model axis of length 1 (the first copy is kept).
    ``record`` notes the tree and the slabs for :func:`rows_back`.
    """
    leaves, treedef = jtu.tree_flatten(tree, is_leaf=is_slab)
    record["treedef"] = treedef
    record["slabs"] = [(x.layout, x.value.ndim - batch) if is_slab(x) else None for x in leaves]
    return [x.value if is_slab(x) else jnp.expand_dims(x, batch) for x in leaves]


def rows_back(flat: list, record: dict, mesh, batch: int):
    """Outside the ``shard_map``: the output tree, each slab a ``MeshSlab`` of the whole grid."""
    out = []
    for x, slab in zip(flat, record["slabs"]):
        if slab is None:
            out.append(x[(slice(None),) * batch + (0,)])
        else:
            layout, grid_ndim = slab
            out.append(MeshSlab(x, layout, mesh, grid_ndim))
    return jtu.tree_unflatten(record["treedef"], out)


register_strategy("shard_map", ShardMap)
