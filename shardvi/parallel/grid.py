"""A grid split into fixed slabs along its first axis: sums, tables and draws that are bitwise layout-free.

Field parallelism cuts a grid of shape ``(N0, N1, ...)`` into ``B`` fixed
*blocks* of ``N0 / B`` rows (the unit of decomposition, never the device);
``P`` devices along the model mesh axis (:data:`~shardvi.parallel.mesh.MODEL_AXIS`)
hold ``B / P`` consecutive blocks each, a *slab* of ``N0 / P`` rows. On one
device (``axis=None``) the slab is the whole grid, cut into the same ``B``
blocks. The pieces here compute everything that couples the rows of a grid
(sums over it, a replicated table read at every pixel, random draws) per
block, with the same program for every block wherever it is placed, and
combine the blocks in block order, so the results are bitwise those of one
device for every ``P`` dividing ``B``:

- :func:`grid_total` sums a slab over the whole grid: per-block sums,
  all-gathered over the axis, then added in block order;
- :func:`spread` copies a replicated array once per local block; the
  transpose (the gradient with respect to the replicated array) gathers the
  per-block cotangents and adds them in block order, the same on any layout.
  :func:`take` (``table[index]`` at every pixel of a slab) is built on it;
- :func:`normal` draws a standard-normal slab block by block, each block from
  ``fold_in(key, block index)``.

Each is linear where it should be (JVP, transpose and batching rules), so
``jax.grad``, ``jax.linearize``, ``jax.linear_transpose`` and ``jax.vmap``
work through it inside ``jax.shard_map`` (with ``check_vma=False``: the
transposes do the cross-device reductions themselves, in block order).
"""

from __future__ import annotations

import dataclasses
import math
from collections.abc import Callable

import jax
import jax.numpy as jnp
from jax import tree_util as jtu
from jax.extend.core import Primitive
from jax.interpreters import ad, batching, mlir

from .strategy import chunked_apply, ordered_sum

__all__ = [
    "GridLayout",
    "Slab",
    "is_slab",
    "block_map",
    "block_total",
    "grid_total",
    "grid_vdot",
    "spread",
    "take",
    "normal",
    "local_rows",
    "gather_rows",
    "all_devices",
]


@dataclasses.dataclass(frozen=True)
class GridLayout:
    """How a grid's first axis is cut: ``blocks`` fixed blocks over ``shards`` devices along mesh axis ``axis``.

    Parameters
    ----------
    blocks : int
        ``B``, the number of fixed blocks of rows (a divisor of ``N0``).
    axis : str or None
        The mesh axis that splits the blocks (inside ``jax.shard_map``), ``None``: all local.
    shards : int
        Devices along ``axis`` (1 when ``axis`` is None); must divide ``blocks``.
    """

    blocks: int
    axis: str | None = None
    shards: int = 1

    def __post_init__(self):
        for name in ("blocks", "shards"):
            v = getattr(self, name)
            if isinstance(v, bool) or not isinstance(v, int) or v < 1:
                raise ValueError(f"GridLayout.{name} must be an int >= 1, got {v!r}")
        if self.axis is None and self.shards != 1:
            raise ValueError(f"GridLayout.shards must be 1 without a mesh axis, got {self.shards}")
        if self.blocks % self.shards:
            raise ValueError(
                f"the {self.shards} devices along the model axis must divide the {self.blocks} grid blocks"
            )

    @property
    def local_blocks(self) -> int:
        """Blocks per device, ``B / P``."""
        return self.blocks // self.shards

    def block_index(self, i):
        """Global index of local block ``i`` (block order = row order of the grid)."""
        if self.axis is None:
            return i
        return jax.lax.axis_index(self.axis) * self.local_blocks + i

    def check_rows(self, rows: int, what: str = "array") -> None:
        """``ValueError`` unless a slab of ``rows`` local rows cuts into the local blocks."""
        if rows % self.local_blocks:
            raise ValueError(
                f"{what}: {rows * self.shards} rows along grid axis 0 cannot be cut into {self.blocks} equal "
                f"blocks (pick a number of field blocks that divides the first grid axis)"
            )


@jtu.register_pytree_node_class
class Slab:
    """A pytree node: this device's slab of a grid-shaped leaf, with the :class:`GridLayout` it is cut by.

    The engine's tree arithmetic (:mod:`shardvi.tree_math`) maps over the slab like over
    an array, and computes its reductions (inner products, norms, sums, finiteness,
    random draws) over the whole grid with :func:`grid_vdot`, :func:`grid_total` and
    :func:`normal`: a solver working on a pytree with ``Slab`` leaves iterates the same
    on every layout. ``value`` may be an array, a tracer or a ``jax.ShapeDtypeStruct``
    (a domain).
    """

    _shardvi_slab = True  # the marker tree_math dispatches on (no import of this module there)

    def __init__(self, value, layout: GridLayout):
        self.value = value
        self.layout = layout

    def tree_flatten(self):
        return (self.value,), self.layout

    @classmethod
    def tree_unflatten(cls, layout, children):
        return cls(children[0], layout)

    @property
    def size(self) -> int:
        """Entries of the whole grid (static)."""
        return int(math.prod(self.value.shape)) * self.layout.shards

    def vdot(self, other: Slab):
        return grid_vdot(self.value, other.value, self.layout)

    def total(self):
        return grid_total(self.value, self.layout)

    def all_finite(self):
        return all_devices(jnp.all(jnp.isfinite(self.value)), self.layout)

    def normal(self, key):
        """A standard-normal slab shaped like this one (``value`` may be a ``ShapeDtypeStruct``)."""
        return Slab(normal(key, self.value.shape, self.value.dtype, self.layout), self.layout)

    def __repr__(self):
        return f"Slab({self.value!r}, {self.layout})"


def is_slab(node) -> bool:
    """Whether ``node`` is a :class:`Slab` (the ``is_leaf`` of reductions over a pytree with slabs)."""
    return getattr(type(node), "_shardvi_slab", False) is True


# --------------------------------------------------------------------------------------- primitives
# The two linear maps whose transposes do a cross-device reduction: gathering the blocks (transpose: the
# local part of a replicated cotangent) and copying a replicated array per block (transpose: the gathered
# per-block cotangents added in block order). Without them JAX would transpose an all_gather into a
# psum_scatter of a replicated cotangent (P times the true value) and a broadcast into a local sum.


def _gather_impl(x, *, axis):
    return jax.lax.all_gather(x, axis, axis=0, tiled=True)


def _gather_abstract(x, *, axis):
    n = jax.lax.axis_size(axis)
    return x.update(shape=(x.shape[0] * n,) + x.shape[1:])


def _gather_transpose(ct, x, *, axis):
    n = x.aval.shape[0]
    if type(ct) is ad.Zero:
        return [ad.Zero(x.aval)]
    return [jax.lax.dynamic_slice_in_dim(ct, jax.lax.axis_index(axis) * n, n, 0)]


def _gather_batch(args, dims, *, axis):
    (x,), (d,) = args, dims
    x = jnp.moveaxis(x, d, 1)  # the block axis stays in front
    return _gather_p.bind(x, axis=axis), 1


def _spread_impl(x, *, n, axis):
    return jnp.broadcast_to(x, (n,) + x.shape)


def _spread_abstract(x, *, n, axis):
    return x.update(shape=(n,) + x.shape)


def _spread_transpose(ct, x, *, n, axis):
    if type(ct) is ad.Zero:
        return [ad.Zero(x.aval)]
    return [_block_order_total(ct, axis)]


def _spread_batch(args, dims, *, n, axis):
    (x,), (d,) = args, dims
    return _spread_p.bind(x, n=n, axis=axis), d + 1


_gather_p = Primitive("shardvi_grid_gather")
_gather_p.def_abstract_eval(_gather_abstract)
mlir.register_lowering(_gather_p, mlir.lower_fun(_gather_impl, multiple_results=False))
ad.deflinear2(_gather_p, _gather_transpose)
batching.primitive_batchers[_gather_p] = _gather_batch

_spread_p = Primitive("shardvi_grid_spread")
_spread_p.def_abstract_eval(_spread_abstract)
mlir.register_lowering(_spread_p, mlir.lower_fun(_spread_impl, multiple_results=False))
ad.deflinear2(_spread_p, _spread_transpose)
batching.primitive_batchers[_spread_p] = _spread_batch


def _gather(x, axis):
    """All blocks ``(B, ...)`` from this device's ``(B / P, ...)`` (identity without an axis)."""
    return x if axis is None else _gather_p.bind(x, axis=axis)


def _block_order_total(parts, axis):
    """``sum_b parts[b]`` over all blocks of the grid, in block order (``parts``: the local blocks in front)."""
    return ordered_sum(_gather(parts, axis))


# --------------------------------------------------------------------------------------- public pieces
def _blocks(x, layout: GridLayout):
    """``(B/P, N0/B, ...)``: the local slab cut into its blocks (a free reshape)."""
    layout.check_rows(x.shape[0])
    return x.reshape((layout.local_blocks, x.shape[0] // layout.local_blocks) + x.shape[1:])


def _loop_blocks(fn: Callable, stacked: tuple):
    """``fn`` on entry ``b`` of every array in ``stacked`` (leading axis: the local blocks), stacked.

    A ``scan`` (differentiable) with one spare pass that reads the last block again and is
    dropped: the loop always has at least two passes, so XLA never inlines it into (and fuses it
    with) the surrounding program, as it would a loop of one pass on a device that holds one
    block. Every block is then computed by the same loop-body program on any layout (XLA:CPU
    contracts a multiply and an add into an FMA where it fuses them: fusion decides the bits).
    Blocks are read in place (no copy of the slab).
    """
    n = stacked[0].shape[0]

    def one(i):
        at = jnp.minimum(i, n - 1)
        return fn(*(jax.lax.dynamic_index_in_dim(a, at, keepdims=False) for a in stacked))

    out = jax.lax.map(one, jnp.arange(n + 1))
    return jtu.tree_map(lambda o: o[:n], out)


def block_map(fn: Callable, layout: GridLayout, *slabs):
    """``fn(block_b of each slab)`` for every local block, stacked along a leading block axis.

    One block per pass of a loop, so each block is computed by the same program on any
    layout; differentiable (see :func:`_loop_blocks`).
    """
    return _loop_blocks(fn, tuple(_blocks(s, layout) for s in slabs))


def block_total(parts, layout: GridLayout):
    """``sum_b parts[b]`` over all blocks of the grid in block order (``parts``: one entry per local block).

    The same value on every device of the axis, bitwise the one-device value; differentiable
    (the transpose hands each device its blocks' cotangents).
    """
    return _block_order_total(parts, layout.axis)


def grid_total(x, layout: GridLayout):
    """Sum of every entry of the grid whose local slab is ``x`` (grid axis 0 first), in block order.

    The same value on every device of the axis and bitwise the one-device value for any layout
    with the same ``layout.blocks``. Linear: its transpose spreads the cotangent over the slab.
    """
    return _block_order_total(block_map(jnp.sum, layout, x), layout.axis)


def grid_vdot(a, b, layout: GridLayout):
    """Real inner product ``sum(conj(a) * b)`` of two slabs over the whole grid (see :func:`grid_total`)."""
    return _block_order_total(block_map(lambda u, v: jnp.real(jnp.vdot(u, v)), layout, a, b), layout.axis)


def spread(x, layout: GridLayout):
    """``x`` (replicated over the axis) copied once per local block: shape ``(B/P,) + x.shape``.

    Its transpose adds the per-block cotangents of all blocks in block order: the
    gradient with respect to ``x`` of anything computed per block does not depend on
    the layout.
    """
    return _spread_p.bind(jnp.asarray(x), n=layout.local_blocks, axis=layout.axis)


def take(table, index, layout: GridLayout):
    """``table[index]`` at every pixel of a slab (``index``: the slab's integer indices into ``table``).

    ``table`` (1-D, replicated over the axis) is read block by block from a copy per
    block (:func:`spread`): its gradient (a scatter-add over the pixels) is summed per
    block and the blocks in block order, bitwise the same on any layout.
    """
    parts = _loop_blocks(lambda t, i: t[i], (spread(table, layout), _blocks(index, layout)))
    return parts.reshape(index.shape)


def normal(key, shape, dtype, layout: GridLayout):
    """Standard-normal slab of local ``shape`` (grid axis 0 first), block ``b`` drawn from ``fold_in(key, b)``."""
    layout.check_rows(shape[0])
    rows = shape[0] // layout.local_blocks
    block_shape = (rows,) + tuple(shape[1:])

    def one(i):  # one block per pass of a loop XLA keeps (see chunked_apply): the same program on any layout
        return jax.random.normal(jax.random.fold_in(key, layout.block_index(i)), block_shape, dtype)

    idx = jnp.arange(layout.local_blocks)
    return chunked_apply(one, (0,), (idx,), 1).reshape(shape)


def gather_rows(x, layout: GridLayout):
    """The whole grid from this device's slab ``x`` (an all-gather over the axis; ``x`` itself without one)."""
    return _gather(x, layout.axis)


def local_rows(x, layout: GridLayout):
    """This device's slab of a replicated grid-shaped array ``x`` (``x`` itself without an axis)."""
    if layout.axis is None:
        return x
    n = x.shape[0] // layout.shards
    return jax.lax.dynamic_slice_in_dim(x, jax.lax.axis_index(layout.axis) * n, n, 0)


def all_devices(flag, layout: GridLayout):
    """A boolean that holds on every device of the axis (exact: an all-gather and ``all``)."""
    if layout.axis is None:
        return flag
    return jnp.all(jax.lax.all_gather(flag, layout.axis))
