"""Shared parts of the built-in strategies: one-device and multi-device bases, padding, local sums."""

from __future__ import annotations

import functools
import math

import jax
import jax.numpy as jnp
from jax import tree_util as jtu
from jax.sharding import NamedSharding

from .._xla_flags import warn_if_unordered
from .blocks import is_blocked, is_field_split, model_specs
from .field_arrays import holds_global
from .grid import MeshSlab, is_mesh_slab
from .mesh import (
    Layout,
    check_devices,
    leading_size,
    pad_samples,
    replicated,
    resolve_devices,
    sample_layout,
    sample_mesh,
    sample_model_mesh,
)
from .strategy import Strategy, check_chunk, check_in_axes, check_reduce, chunked_apply, strategy_class, strategy_names

__all__ = ["SingleDevice", "MultiDevice", "single_device_map"]


def _local_device():
    return jax.local_devices()[0]


def single_device_map(fn, in_axes, chunk, name):
    """``map`` on one device: pad to a multiple of ``chunk``, :func:`chunked_apply`, drop the padding."""

    def mapped(*args):
        check_in_axes(in_axes, len(args))
        n = leading_size(args, in_axes, name)
        if chunk is None:
            return chunked_apply(fn, in_axes, args, None)
        n_pad = math.ceil(n / chunk) * chunk
        padded = [pad_samples(a, n_pad) if ax == 0 else a for a, ax in zip(args, in_axes)]
        return jtu.tree_map(lambda y: y[:n], chunked_apply(fn, in_axes, tuple(padded), chunk))

    return mapped


class SingleDevice(Strategy):
    """Base of the strategies that compute on ``jax.local_devices()[0]`` (:class:`Vmap`, :class:`LaxMap`)."""

    @property
    def devices(self) -> tuple:
        """``(jax.local_devices()[0],)``: where the strategy computes."""
        return (_local_device(),)

    def place(self, tree):
        """Commit inputs to the first local device (``ValueError`` for arrays split over processes)."""
        if holds_global(tree):
            raise ValueError(
                f"the inputs hold arrays split over processes (sv.parallel.field_array), but {type(self).__name__} "
                "computes on one device of this process: use ShardMap or JitSharding with the field split "
                "(model_shards > 1, the likelihood amended with field_blocks) and that strategy's arrays"
            )
        return jax.device_put(tree, _local_device())

    def accept_devices(self, devices, argname="sample_map"):
        """Only ``None`` or exactly ``[jax.local_devices()[0]]``: other devices would be ignored."""
        return self._on_one_device(devices, argname, f"{type(self).__name__}()")

    @classmethod
    def create(cls, devices=None, argname="sample_map", **options):
        """``cls(**options)``; ``devices`` only ``None`` or ``[jax.local_devices()[0]]``."""
        return cls(**options)._on_one_device(devices, argname, repr(cls.name))

    def _on_one_device(self, devices, argname, what):
        if devices is None:
            return self
        if len(devices) > 1:
            multi = tuple(n for n in strategy_names() if issubclass(strategy_class(n), MultiDevice))
            raise ValueError(
                f"devices lists {len(devices)} devices but {argname}={what} runs on one device and "
                f"would ignore them: use a multi-device strategy {multi} or leave devices=None"
            )
        if devices[0] != _local_device():
            raise ValueError(
                f"devices=[{devices[0]}] but {argname}={what} always runs on {_local_device()} "
                f"(jax.local_devices()[0]): leave devices=None or use a multi-device strategy"
            )
        return self


@functools.cache
def _cached_mesh(devices: tuple):
    return sample_mesh(devices)


@functools.cache
def _cached_model_mesh(devices: tuple, model_shards: int):
    warn_if_unordered(devices, model_shards)
    return sample_model_mesh(devices, model_shards)


class MultiDevice(Strategy):
    """Base of frozen dataclasses with ``devices``, ``chunk_size``, ``reduce`` and ``pad`` fields."""

    # declared by every subclass (dataclass fields there)
    devices: tuple | None  # after _validate
    chunk_size: int
    reduce: str
    pad: bool
    model_shards: int = 1  # a field of the strategies that split data blocks over a second mesh axis

    def _validate(self):
        object.__setattr__(self, "devices", check_devices(self.devices, "devices"))
        check_chunk(self.chunk_size, "chunk_size", allow_none=False)
        check_reduce(self.reduce)
        if not isinstance(self.pad, bool):
            raise TypeError(f"pad must be a bool, got {type(self.pad).__name__}")
        k = self.model_shards
        if isinstance(k, bool) or not isinstance(k, int) or k < 1:
            raise ValueError(f"model_shards must be a positive int, got {k!r}")
        if self.devices is not None and len(self.devices) % k:
            raise ValueError(
                f"model_shards={k} does not divide the {len(self.devices)} devices: the mesh is "
                f"(devices // model_shards) sample shards x model_shards model shards{_cpu_hint(self.devices, k)}"
            )

    # -- devices / mesh ---------------------------------------------------------------------
    @property
    def resolved_devices(self) -> tuple:
        """``devices``, or all ``jax.devices()`` when ``None`` (resolved at use, not construction)."""
        return resolve_devices(self.devices)

    @property
    def mesh(self):
        """The sample mesh over :attr:`resolved_devices`: 1-D, or ``(samples, model)`` with ``model_shards > 1``."""
        devices = self.resolved_devices
        if self.model_shards == 1:
            return _cached_mesh(devices)
        if len(devices) % self.model_shards:
            raise ValueError(
                f"model_shards={self.model_shards} does not divide the {len(devices)} devices "
                f"(devices=None: all jax.devices()); pass devices whose count model_shards divides"
                f"{_cpu_hint(devices, self.model_shards)}"
            )
        return _cached_model_mesh(devices, self.model_shards)

    @property
    def n_sample_shards(self) -> int:
        """Devices along the sample axis (``len(devices) // model_shards``)."""
        return len(self.resolved_devices) // self.model_shards

    def place(self, tree):
        """Replicate ``tree`` over the strategy's devices (the canonical input placement).

        With ``model_shards > 1`` the data blocks of blocked likelihoods are split over the
        model axis instead (each device holds its blocks only).
        """
        if self.model_shards == 1:
            return jax.device_put(tree, replicated(self.mesh))
        self.check_blocks(tree)
        mesh = self.mesh
        shardings = jtu.tree_map(lambda spec: NamedSharding(mesh, spec), model_specs(tree))
        return jax.device_put(tree, shardings)

    def check_blocks(self, tree) -> None:
        """``ValueError`` unless ``model_shards`` divides the block count of every blocked likelihood in ``tree``
        (data blocks, or the field blocks of a likelihood amended with ``field_blocks``)."""
        for node in jtu.tree_leaves(tree, is_leaf=_is_layout_node):
            if _is_layout_node(node):
                node.layout.check_model_shards(self.model_shards)

    def _splits_rows(self, args) -> bool:
        """Whether ``args`` hold a field split over the model axis (its outputs' ``Slab`` leaves stay split)."""
        return self.model_shards > 1 and any(_is_split_field(n) for n in jtu.tree_leaves(args, is_leaf=_is_split_field))

    # -- layout -------------------------------------------------------------------------------
    def _prepare(self, args, in_axes) -> tuple[Layout, list]:
        check_in_axes(in_axes, len(args))
        n = leading_size(args, in_axes, self.name)
        layout = sample_layout(n, self.n_sample_shards, self.chunk_size, self.pad, self.name)
        padded = [pad_samples(a, layout.padded) if ax == 0 else a for a, ax in zip(args, in_axes)]
        return layout, padded

    def _finish(self, stacked, layout: Layout):
        """Drop the padding and replicate the stacked outputs (the all-gather)."""
        return self._replicated(jtu.tree_map(lambda y: y[: layout.n], stacked))

    def _replicated(self, out):
        """``out`` replicated over the mesh (the all-gather), a ``MeshSlab``'s rows left split over the model axis."""
        if not any(is_mesh_slab(x) for x in jtu.tree_leaves(out, is_leaf=is_mesh_slab)):
            return jax.lax.with_sharding_constraint(out, replicated(self.mesh))

        def one(x):  # a MeshSlab's rows stay split over the model axis
            if is_mesh_slab(x):
                return MeshSlab(jax.lax.with_sharding_constraint(x.value, x.sharding()), x.layout, x.mesh, x.grid_ndim)
            return jax.lax.with_sharding_constraint(x, replicated(self.mesh))

        return jtu.tree_map(one, out, is_leaf=is_mesh_slab)


def _is_layout_node(node) -> bool:
    return is_blocked(node) or is_field_split(node)


def _is_split_field(node) -> bool:
    return is_mesh_slab(node) or is_field_split(node)


def masked_local_sum(values, layout: Layout, device_index):
    """Sum over this device's block, padding samples contributing exactly zero."""
    idx = device_index * layout.per_device + jnp.arange(layout.per_device)
    valid = idx < layout.n

    def one(v):
        m = valid.reshape((-1,) + (1,) * (v.ndim - 1))
        return jnp.sum(jnp.where(m, v, jnp.zeros((), v.dtype)), axis=0)

    return jtu.tree_map(one, values)


def reshape_to_devices(tree, layout: Layout):
    """``(n_padded, ...) -> (n_devices, per_device, ...)``."""
    return jtu.tree_map(lambda x: x.reshape((layout.n_devices, layout.per_device) + x.shape[1:]), tree)


def reshape_from_devices(tree, layout: Layout):
    """``(n_devices, per_device, ...) -> (n_padded, ...)``."""
    return jtu.tree_map(lambda x: x.reshape((layout.padded,) + x.shape[2:]), tree)


def divide(tree, n: int):
    """``tree * (1 / n)`` (the scaling :func:`~shardvi.parallel.fixed_order_mean` uses)."""
    return jtu.tree_map(lambda x: x * (1.0 / n), tree)


def _cpu_hint(devices, want: int) -> str:
    """How to get more CPU devices, where JAX sees fewer CPU devices than ``want``."""
    if len(devices) >= want or any(d.platform != "cpu" for d in devices):
        return ""
    return (
        f". JAX sees {len(devices)} CPU device(s): for {want} or more, call "
        f"jax.config.update('jax_num_cpu_devices', {want}) before any JAX operation (or start Python with "
        f"XLA_FLAGS=--xla_force_host_platform_device_count={want})"
    )
