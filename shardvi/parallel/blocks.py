"""Sums over fixed data blocks, split over the model mesh axis: the reductions of model parallelism.

A likelihood whose data are cut into ``B`` fixed blocks
(:class:`~shardvi.vi.blocked.BlockedLikelihood`) computes its energy,
gradient, metric applications and metric samples as sums of per-block
terms. :func:`block_sum` evaluates the terms of the blocks a device holds,
one block per pass of a loop whose body is the same program wherever the
block is placed (:func:`~shardvi.parallel.chunked_apply` with chunks of one),
then combines them: with the blocks split over the mesh axis
:data:`MODEL_AXIS` (a strategy with ``model_shards > 1`` traces the
per-sample work inside :func:`model_axis`), an all-gather of the per-block
terms over that axis and a sum over all ``B`` blocks in block order. On one
device the same loop runs over all blocks and the same ordered sum follows,
so the result is bitwise the same for any number of model shards that
divides ``B``. ``reduce="psum"`` (the strategy's fast mode) sums the local
blocks and adds the shards' sums with a ``psum`` instead (about one ulp
apart).

Every multi-device strategy traces the per-sample work per device, inside a
``shard_map`` manual over the model axis (``JitSharding`` too, inside its
``jax.jit``), so the gather is a collective of that ``shard_map``.
"""

from __future__ import annotations

import contextlib
import contextvars
from collections.abc import Callable
from typing import NamedTuple

import jax
from jax import tree_util as jtu
from jax.sharding import PartitionSpec as P

from .grid import is_mesh_slab
from .mesh import MODEL_AXIS
from .strategy import chunked_apply, ordered_sum

__all__ = [
    "MODEL_AXIS",
    "ModelAxis",
    "model_axis",
    "current_model_axis",
    "block_map",
    "block_sum",
    "is_blocked",
    "model_specs",
]


class ModelAxis(NamedTuple):
    """The model axis the per-sample work is traced under (per device, inside a ``shard_map`` manual over it).

    ``name``, ``size`` and ``reduce`` (the strategy's reduction mode). ``whole_model``: a
    field-split model that needs the whole field is evaluated on the gathered field on every
    device of the axis (``JitSharding``), instead of raising (``ShardMap``).
    """

    name: str
    size: int
    reduce: str = "fixed"
    whole_model: bool = False


_CURRENT: contextvars.ContextVar[ModelAxis | None] = contextvars.ContextVar("shardvi_model_axis", default=None)


@contextlib.contextmanager
def model_axis(name: str = MODEL_AXIS, size: int = 1, reduce: str = "fixed", whole_model: bool = False):
    """Trace the enclosed code with the data blocks split over mesh axis ``name`` of ``size`` devices.

    Used by strategies around the per-sample function they map, inside their
    ``shard_map``, where :func:`block_sum` gathers over ``name``.
    """
    token = _CURRENT.set(ModelAxis(name, int(size), reduce, whole_model))
    try:
        yield
    finally:
        _CURRENT.reset(token)


def current_model_axis() -> ModelAxis | None:
    """The :class:`ModelAxis` being traced under, or ``None`` (all blocks are local)."""
    return _CURRENT.get()


def block_map(fn: Callable, blocks, *broadcast):
    """``fn(block_b, *broadcast)`` for every local block ``b``, stacked along a leading block axis.

    ``blocks`` is a pytree whose leaves carry the leading block axis (the
    blocks this device holds); one block per loop pass, the same program for
    every block wherever it is placed.
    """
    in_axes = (0,) + (None,) * len(broadcast)
    # copy_free: the data blocks are read in place (no copy of a device's data per block sum)
    return chunked_apply(fn, in_axes, (blocks,) + tuple(broadcast), 1, copy_free=True)


def block_sum(fn: Callable, blocks, *broadcast):
    """``sum_b fn(block_b, *broadcast)`` over all blocks, in block order (see the module docstring)."""
    axis = current_model_axis()
    parts = block_map(fn, blocks, *broadcast)
    if axis is None or axis.size == 1:
        return ordered_sum(parts)
    if axis.reduce == "psum":
        return jax.lax.psum(ordered_sum(parts), axis.name)
    gathered = jtu.tree_map(lambda p: jax.lax.all_gather(p, axis.name, axis=0, tiled=True), parts)
    return ordered_sum(gathered)


def _node_layout(node):
    """A likelihood's :class:`~shardvi.vi.layout.Layout` (``None`` for any other node)."""
    layout = getattr(node, "layout", None)
    return layout if hasattr(layout, "model_blocks") else None


def is_blocked(node) -> bool:
    """Whether ``node`` holds data blocks a model axis splits (a likelihood amended with ``data_blocks``)."""
    layout = _node_layout(node)
    return layout is not None and layout.splits_data is True and hasattr(node, "blocks")


def is_field_split(node) -> bool:
    """Whether ``node`` is a likelihood amended with ``field_blocks`` (its grid rows a model axis splits)."""
    layout = _node_layout(node)
    return layout is not None and layout.splits_latent is True


def _is_split_node(node) -> bool:
    return is_blocked(node) or is_field_split(node) or is_mesh_slab(node)


def model_specs(tree, axis: str = MODEL_AXIS, batch: str | None = None):
    """A ``PartitionSpec`` per leaf of ``tree``: what the model axis splits, the rest replicated.

    Split along their leading axis: the non-scalar leaves of a blocked likelihood's
    ``blocks`` (whole blocks per device; scalars there are replicated), the grid rows of a
    field-split likelihood's data (its ``partition_specs``) and the rows of a
    :class:`~shardvi.parallel.grid.MeshSlab` (its ``spec``). With ``batch``, ``tree`` is
    mapped over samples: every leaf's leading axis is split over ``batch`` too.
    """
    flat = []
    for node in jtu.tree_leaves(tree, is_leaf=_is_split_node):
        if is_mesh_slab(node):
            flat.append(node.spec(batch))
        elif batch is not None:
            if is_blocked(node) or is_field_split(node):
                raise ValueError("internal: a likelihood mapped over samples")
            flat.append(P(batch))
        elif is_blocked(node):
            for path, leaf in jtu.tree_flatten_with_path(node)[0]:
                split = path and path[0] == jtu.GetAttrKey("blocks") and len(getattr(leaf, "shape", ())) > 0
                flat.append(P(axis) if split else P())
        elif is_field_split(node):
            flat.extend(jtu.tree_leaves(node.partition_specs(axis), is_leaf=lambda x: isinstance(x, P)))
        else:
            flat.append(P())
    return jtu.tree_unflatten(jtu.tree_structure(tree), flat)
