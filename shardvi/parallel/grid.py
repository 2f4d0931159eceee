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
- :func:`normal` draws a standard-normal slab block by block, each entry
  counter-based on its global index: the whole grid's numbers on any layout.

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
import numpy as np
from jax import tree_util as jtu
from jax.extend.core import Primitive
from jax.interpreters import ad, batching, mlir
from jax.sharding import Mesh, NamedSharding
from jax.sharding import PartitionSpec as P

from .strategy import chunked_apply, ordered_sum

__all__ = [
    "GridLayout",
    "Slab",
    "MeshSlab",
    "is_slab",
    "is_mesh_slab",
    "unsplit",
    "slab_values",
    "block_map",
    "block_total",
    "grid_total",
    "grid_vdot",
    "spread",
    "take",
    "normal",
    "local_rows",
    "gather_rows",
    "pad_rows",
    "unpad_rows",
    "normal_at",
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
    rows : int, optional
        ``N0`` of a grid whose rows the blocks do not divide: the blocks then hold
        ``ceil(N0 / B)`` rows each, the last ones padding rows after the grid's
        (zero in every latent, unobserved in the data; :func:`pad_rows`). ``None``:
        the blocks divide the grid, no padding.
    """

    blocks: int
    axis: str | None = None
    shards: int = 1
    rows: int | None = None

    def __post_init__(self):
        for name in ("blocks", "shards"):
            v = getattr(self, name)
            if isinstance(v, bool) or not isinstance(v, int) or v < 1:
                raise ValueError(f"GridLayout.{name} must be an int >= 1, got {v!r}")
        if self.rows is not None and (isinstance(self.rows, bool) or not isinstance(self.rows, int) or self.rows < 1):
            raise ValueError(f"GridLayout.rows must be None or an int >= 1, got {self.rows!r}")
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

    @property
    def padded_rows(self) -> int | None:
        """The rows the blocks hold, ``B ceil(N0 / B)`` (``None`` without padding)."""
        return None if self.rows is None else _round_up(self.rows, self.blocks)

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


def _unpadded_size(n: int, layout: GridLayout) -> int:
    """``n`` entries of a padded grid (one padding row per ``padded_rows``) less its padding rows' entries."""
    return n if layout.rows is None else n // _round_up(layout.rows, layout.blocks) * layout.rows


def _round_up(n: int, blocks: int) -> int:
    """``n`` rounded up to a multiple of ``blocks``."""
    return -(-n // blocks) * blocks


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
        """Entries of the whole grid, padding rows not counted (static)."""
        return _unpadded_size(int(math.prod(self.value.shape)) * self.layout.shards, self.layout)

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
    """Whether ``node`` is a :class:`Slab` (one device's rows, inside a ``shard_map``) or a :class:`MeshSlab`."""
    return getattr(type(node), "_shardvi_slab", False) is True


def is_mesh_slab(node) -> bool:
    """Whether ``node`` is a :class:`MeshSlab` (a whole grid split over a mesh, outside any ``shard_map``)."""
    return type(node) is MeshSlab


@jtu.register_pytree_node_class
class MeshSlab:
    """A pytree node: a grid-shaped array, outside any ``shard_map``, whose rows ``mesh`` splits over ``layout.axis``.

    The form of a field-split latent in the engine's own (GSPMD) programs: ``value`` is the
    whole grid, after ``value.ndim - grid_ndim`` leading batch axes (samples), placed with
    its rows split over the model axis (:meth:`sharding`), so no device holds another's
    rows. A strategy that maps a function over it (``ShardMap(model_shards=k)``) hands each
    device its rows (:meth:`spec` is the ``shard_map`` in-spec); the reductions of
    :mod:`shardvi.tree_math` (inner products, norms, sums, finiteness) run in a
    ``shard_map`` over ``mesh`` as per-block sums combined in block order, bitwise the
    same as those of a :class:`Slab` and of the one-device grid cut into the same blocks.

    Parameters
    ----------
    value : array
        ``(*batch, N0, N1, ...)``.
    layout : GridLayout
        The blocks and the model axis (``axis`` a name of ``mesh``, ``shards`` its size).
    mesh : jax.sharding.Mesh
    grid_ndim : int
        Axes of the grid (``N0, N1, ...``); the axes before them are batch axes.
    """

    _shardvi_slab = True  # tree_math's reductions dispatch on it

    def __init__(self, value, layout: GridLayout, mesh: Mesh, grid_ndim: int):
        self.value = value
        self.layout = layout
        self.mesh = mesh
        self.grid_ndim = grid_ndim

    def tree_flatten(self):
        return (self.value,), (self.layout, self.mesh, self.grid_ndim)

    @classmethod
    def tree_unflatten(cls, aux, children):
        return cls(children[0], *aux)

    def spec(self, batch=None) -> P:
        """The partition spec of ``value``: rows over the model axis, the first batch axis over ``batch``."""
        lead = [None] * (len(self.value.shape) - self.grid_ndim)
        if batch is not None:
            if not lead:
                raise ValueError("internal: a MeshSlab without a batch axis mapped over samples")
            lead[0] = batch
        return P(*lead, self.layout.axis)

    def sharding(self) -> NamedSharding:
        """Where ``value`` lives: its rows split over the model axis of ``mesh``, replicated otherwise."""
        return NamedSharding(self.mesh, self.spec())

    @property
    def size(self) -> int:
        """Entries of the whole grid, padding rows not counted (static)."""
        return _unpadded_size(int(math.prod(self.value.shape)), self.layout)

    def _reduce(self, fn, *others):
        """``fn(local values..., manual layout)`` in a ``shard_map`` over ``mesh`` (a replicated scalar)."""
        if len(self.value.shape) != self.grid_ndim:
            raise ValueError(
                f"internal: a reduction over a grid with {len(self.value.shape) - self.grid_ndim} batch axes"
            )
        local = self.layout
        # one input per distinct array: inside, ``fn(v, v)`` then sees one value twice, as the per-device and
        # the one-device code do (XLA compiles ``x . x`` unlike ``x . y``: the same bits need the same form)
        values = [self.value] + [o.value for o in others]
        distinct = list({id(v): v for v in values}.values())
        where = [next(i for i, d in enumerate(distinct) if d is v) for v in values]
        mapped = jax.shard_map(
            lambda *d: fn(*(d[i] for i in where), local),
            mesh=self.mesh,
            in_specs=(self.spec(),) * len(distinct),
            out_specs=P(),
            check_vma=False,
        )
        return mapped(*distinct)

    def vdot(self, other: MeshSlab):
        return self._reduce(grid_vdot, other)

    def total(self):
        return self._reduce(grid_total)

    def all_finite(self):
        spec = self.spec()
        mapped = jax.shard_map(
            lambda v: all_devices(jnp.all(jnp.isfinite(v)), self.layout),
            mesh=self.mesh,
            in_specs=(spec,),
            out_specs=P(),
            check_vma=False,
        )
        return mapped(self.value)

    def normal(self, key):
        raise TypeError("internal: random draws of a field-split grid are made per device (inside the strategy)")

    def __repr__(self):
        return f"MeshSlab({self.value!r}, {self.layout}, grid_ndim={self.grid_ndim})"


def slab_values(tree):
    """``Slab`` / ``MeshSlab`` leaves replaced by their arrays as they are (no operation: for host code)."""
    return jtu.tree_map(lambda x: x.value if is_slab(x) else x, tree, is_leaf=is_slab)


def unsplit(tree):
    """``Slab`` / ``MeshSlab`` leaves replaced by their arrays (a ``MeshSlab``'s kept on its sharding)."""

    def one(x):
        if is_mesh_slab(x):
            return jax.lax.with_sharding_constraint(x.value, x.sharding())
        return x.value if is_slab(x) else x

    return jtu.tree_map(one, tree, is_leaf=is_slab)


# --------------------------------------------------------------------------------------- primitives
# The linear maps between a device's rows and replicated arrays, with the transposes of the convention that
# a replicated array's cotangent is the whole one on every device: gathering the blocks (transpose: the
# local part of a replicated cotangent), cutting out the device's rows (transpose: the rows' cotangents
# gathered), and copying a replicated array per block (transpose: the gathered per-block cotangents added in
# block order). Without them JAX would transpose an all_gather into a psum_scatter of a replicated cotangent
# (P times the true value), a slice into a zero-padded local cotangent and a broadcast into a local sum.


def _gather_impl(x, *, axis):
    return jax.lax.all_gather(x, axis, axis=0, tiled=True)


def _gather_abstract(x, *, axis):
    n = jax.lax.axis_size(axis)
    return x.update(shape=(x.shape[0] * n,) + x.shape[1:])


def _gather_transpose(ct, x, *, axis):
    if type(ct) is ad.Zero:
        return [ad.Zero(x.aval)]
    return [_rows_p.bind(ct, axis=axis)]  # the device's rows (transposed in turn: gathered again)


def _gather_batch(args, dims, *, axis):
    (x,), (d,) = args, dims
    x = jnp.moveaxis(x, d, 1)  # the block axis stays in front
    return _gather_p.bind(x, axis=axis), 1


def _rows_impl(x, *, axis):
    n = x.shape[0] // jax.lax.axis_size(axis)
    return jax.lax.dynamic_slice_in_dim(x, jax.lax.axis_index(axis) * n, n, 0)


def _rows_abstract(x, *, axis):
    return x.update(shape=(x.shape[0] // jax.lax.axis_size(axis),) + x.shape[1:])


def _rows_transpose(ct, x, *, axis):
    if type(ct) is ad.Zero:
        return [ad.Zero(x.aval)]
    return [_gather_p.bind(ct, axis=axis)]


def _rows_batch(args, dims, *, axis):
    (x,), (d,) = args, dims
    x = jnp.moveaxis(x, d, 1)  # the grid rows stay in front
    return _rows_p.bind(x, axis=axis), 1


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

_rows_p = Primitive("shardvi_grid_rows")
_rows_p.def_abstract_eval(_rows_abstract)
mlir.register_lowering(_rows_p, mlir.lower_fun(_rows_impl, multiple_results=False))
ad.deflinear2(_rows_p, _rows_transpose)
batching.primitive_batchers[_rows_p] = _rows_batch

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

    A ``scan`` (differentiable) over the blocks and one spare pass, which is dropped. Each
    array is read from a copy with its last row repeated (:func:`_rows_padded`), pass ``i``
    the rows ``[i s0, (i + 1) s0)`` (the spare pass: clamped, the last block shifted by a
    row). The loop always has at least two passes, so XLA never inlines it into (and fuses
    it with) the surrounding program, as it would a loop of one pass on a device that holds
    one block; and each pass reads a slice shorter than the array it reads from, which XLA
    can neither drop (a slice as long as its array is the array) nor prove the same in
    every pass (it would hoist the per-block computation out of the loop). Every block is
    then computed by the same loop-body program on any layout (XLA:CPU contracts a multiply
    and an add into an FMA where it fuses them, and picks a dot's kernel by its context: the
    program decides the bits). Cost: one copy of the arrays (and a row) per loop. (Appending
    a copy of the whole last block instead, the previous form, cost ``(n + 1) / n`` of the
    arrays: 3/2 where a device holds two blocks. Reading the arrays themselves where a device
    holds two or more blocks, and a padded copy only where it holds one, is not bitwise: a
    loop reading a copy compiles to other bits than one reading its arguments.)
    """
    n = stacked[0].shape[0]
    padded = tuple(_rows_padded(a) for a in stacked)

    def one(i):
        return fn(*(_read_block(a, p, i) for a, p in zip(stacked, padded)))

    out = jax.lax.map(one, jnp.arange(n + 1))
    return jtu.tree_map(lambda o: o[:n], out)


def _rows_padded(a):
    """``a`` (``(n, s0, ...)``: ``n`` blocks) as ``(n s0 + 1, ...)``, its last row repeated; ``(n,)``: ``(n + 1,)``."""
    rows = a.reshape((-1,) + a.shape[2:]) if a.ndim >= 2 else a
    return jnp.concatenate([rows, rows[-1:]])


def _read_block(a, padded, i):
    """Block ``i`` of ``a`` from :func:`_rows_padded`; ``i = n``: the last block's rows shifted by one (clamped)."""
    if a.ndim < 2:
        return jax.lax.dynamic_index_in_dim(padded, i, keepdims=False)
    return jax.lax.dynamic_slice_in_dim(padded, i * a.shape[1], a.shape[1])


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
    """Standard-normal slab of local ``shape`` (grid axis 0 first): the whole grid's numbers on its rows.

    Each entry is counter-based on its global index (:func:`~shardvi.tree_math.row_normal`), so the
    slab holds the numbers the whole grid draws there, on any layout and any number of blocks.
    """
    from ..tree_math import row_normal

    layout.check_rows(shape[0])
    rows = shape[0] // layout.local_blocks
    block_shape = (rows,) + tuple(shape[1:])

    def one(i):  # one block per pass of a loop XLA keeps (see chunked_apply): the same program on any layout
        start = layout.block_index(i) * rows
        draw = row_normal(key, block_shape, dtype, start)
        if layout.rows is None:
            return draw
        real = (start + jnp.arange(rows) < layout.rows).reshape((rows,) + (1,) * (len(block_shape) - 1))
        return jnp.where(real, draw, jnp.zeros((), draw.dtype))  # padding rows: zero

    idx = jnp.arange(layout.local_blocks)
    return chunked_apply(one, (0,), (idx,), 1).reshape(shape)


def normal_at(key, index, dtype, layout: GridLayout):
    """A standard-normal slab whose entry at each pixel is the number of datum ``index`` there, zero where
    ``index < 0``: the numbers ``jax.random.normal(key, (n,), dtype)`` draws for ``n`` data, each on the
    pixel it observes (:func:`~shardvi.tree_math.indexed_normal`), drawn block by block like :func:`normal`.

    ``index``: the local slab of integer data indices (``-1`` at a pixel that holds no datum).
    """
    from ..tree_math import indexed_normal

    def one(i):
        draw = indexed_normal(key, jnp.maximum(i, 0), dtype)
        return jnp.where(i >= 0, draw, jnp.zeros((), draw.dtype))

    blocks = _blocks(jnp.asarray(index), layout)
    return chunked_apply(one, (0,), (blocks,), 1).reshape(np.shape(index))


def pad_rows(x, layout: GridLayout, axis: int = 0, value: float = 0):
    """``x`` (the whole grid's ``N0`` rows along ``axis``) with ``layout``'s padding rows appended (``value``).

    NumPy arrays stay on the host; anything else is padded by ``jnp.pad``. Unchanged without padding
    or where ``x`` has them already.
    """
    if layout.rows is None or np.shape(x)[axis] != layout.rows:
        return x
    width = [(0, 0)] * np.ndim(x)
    width[axis] = (0, _round_up(layout.rows, layout.blocks) - layout.rows)
    if isinstance(x, np.ndarray):
        return np.pad(x, width, constant_values=np.asarray(value, x.dtype))
    return jnp.pad(x, width, constant_values=value)


def unpad_rows(x, layout: GridLayout, axis: int = 0):
    """``x`` (the padded grid's rows along ``axis``) without ``layout``'s padding rows (see :func:`pad_rows`)."""
    if layout.rows is None or np.shape(x)[axis] != layout.padded_rows:
        return x
    if isinstance(x, np.ndarray):
        return np.take(x, np.arange(layout.rows), axis=axis)
    return jax.lax.slice_in_dim(x, 0, layout.rows, axis=axis)


def gather_rows(x, layout: GridLayout):
    """The whole grid from this device's slab ``x`` (an all-gather over the axis; ``x`` itself without one)."""
    return _gather(x, layout.axis)


def local_rows(x, layout: GridLayout):
    """This device's slab of a replicated grid-shaped array ``x`` (``x`` itself without an axis).

    Linear; its transpose gathers the slabs' cotangents into the whole grid (a replicated
    array's cotangent is the whole one on every device, as :func:`gather_rows` assumes):
    ``gather_rows`` and ``local_rows`` are each other's transposes.
    """
    if layout.axis is None:
        return x
    return _rows_p.bind(jnp.asarray(x), axis=layout.axis)


def all_devices(flag, layout: GridLayout):
    """A boolean that holds on every device of the axis (exact: an all-gather and ``all``)."""
    if layout.axis is None:
        return flag
    return jnp.all(jax.lax.all_gather(flag, layout.axis))
