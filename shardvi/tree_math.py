"""Arithmetic on pytrees of arrays, used as vectors by the solvers.

All functions are pure and jittable. Vectors are arbitrary pytrees whose leaves
are inexact arrays; two vectors in one operation must share their structure.

A leaf may be a slab of a grid split over devices (a
:class:`~shardvi.parallel.grid.Slab` node, field parallelism): the leafwise
operations act on the local slab, the reductions (:func:`vdot`, :func:`norm`,
:func:`total`, :func:`abs_total`, :func:`all_finite`, :func:`size`) and
:func:`random_like` cover the whole grid in a fixed block order, so their
results do not depend on how many devices share the grid. On jax >= 0.12 the reductions
of the other leaves, outside a strategy's per-sample work (:func:`per_sample_work`), are
pairwise sums written out as additions (:func:`pairwise_sum`): that XLA orders its own
reductions differently in a single-device and an SPMD program.
"""

from __future__ import annotations

import contextlib
import contextvars
import math

import jax
import jax.numpy as jnp
import numpy as np
from jax import tree_util as jtu
from jax.extend.random import threefry_2x32

from ._jax_compat import fixed_order_arithmetic

__all__ = [
    "add",
    "sub",
    "scale",
    "axpy",
    "vdot",
    "pairwise_sum",
    "per_sample_work",
    "norm",
    "total",
    "abs_total",
    "zeros_like",
    "size",
    "where",
    "stack",
    "unstack_index",
    "leaf_dtype",
    "all_finite",
    "conj",
    "linear_adjoint",
    "linearize_with_adjoint",
    "random_like",
    "row_normal",
    "indexed_normal",
]


def add(a, b):
    """Leafwise ``a + b``."""
    return jtu.tree_map(jnp.add, a, b)


def sub(a, b):
    """Leafwise ``a - b``."""
    return jtu.tree_map(jnp.subtract, a, b)


def scale(alpha, a):
    """Leafwise ``alpha * a`` for a scalar ``alpha``."""
    return jtu.tree_map(lambda x: alpha * x, a)


def axpy(alpha, x, y):
    """Leafwise ``alpha * x + y``."""
    return jtu.tree_map(lambda xi, yi: alpha * xi + yi, x, y)


def _is_slab(node) -> bool:
    return getattr(type(node), "_shardvi_slab", False) is True


def _leaves(a):
    """Leaves with slabs kept whole (their reductions span the grid)."""
    return jtu.tree_leaves(a, is_leaf=_is_slab)


def _add_up(parts):
    """``parts[0] + parts[1] + ...`` left to right (0 for none)."""
    if not parts:
        return jnp.zeros(())
    out = parts[0]
    for p in parts[1:]:
        out = out + p
    return out


def pairwise_sum(x):
    """Sum of all entries of ``x`` in a fixed pairwise order, written out as additions.

    The entries (flattened, zero-padded to a power of two) are added in halves,
    ``v[:h] + v[h:]``, until one is left: the order of every addition is in the program
    itself. XLA's reductions leave their order to the compiler, which on XLA:CPU vectorizes
    the same reduction differently in a single-device and an SPMD program (jax >= 0.12; see
    :func:`shardvi._jax_compat.fixed_order_arithmetic`); this sum has the same bits in every
    program. ``log2(size)`` elementwise passes over halving arrays (about twice the memory
    traffic of a reduction).
    """
    v = jnp.ravel(x)
    n = v.shape[0]
    if n == 0:
        return jnp.zeros((), v.dtype)
    width = 1 << (n - 1).bit_length()
    if width > n:
        v = jnp.concatenate([v, jnp.zeros((width - n,), v.dtype)])
    while v.shape[0] > 1:
        h = v.shape[0] // 2
        v = v[:h] + v[h:]
    return v[0]


#: pairwise sums in the reductions where XLA's own reductions differ between programs (jax >= 0.12)
_FIXED_ORDER = fixed_order_arithmetic()
_PER_SAMPLE: contextvars.ContextVar[bool] = contextvars.ContextVar("shardvi_per_sample", default=False)


@contextlib.contextmanager
def per_sample_work():
    """Trace the enclosed code as per-sample work (a strategy's mapped function).

    A strategy evaluates the per-sample work as the same program (fixed chunk shapes, one
    loop body) on any device count, so XLA's reductions keep their bits there; the
    reductions outside it (the KL minimization driving the strategy, compiled into a
    single-device or an SPMD program) are written as :func:`pairwise_sum` where XLA's
    differ between those programs (:func:`shardvi._jax_compat.fixed_order_arithmetic`).
    """
    token = _PER_SAMPLE.set(True)
    try:
        yield
    finally:
        _PER_SAMPLE.reset(token)


def _pairwise() -> bool:
    return _FIXED_ORDER and not _PER_SAMPLE.get()


def _leaf_total(x):
    return pairwise_sum(x) if _pairwise() else jnp.sum(x)


def _leaf_vdot(x, y):
    if not _pairwise():
        return jnp.real(jnp.vdot(x, y))
    if not (jnp.iscomplexobj(x) or jnp.iscomplexobj(y)):
        return pairwise_sum(x * y)
    # Re(conj(x) y) as two real sums: real products only (a complex product's additions are the compiler's)
    return pairwise_sum(jnp.real(x) * jnp.real(y)) + pairwise_sum(jnp.imag(x) * jnp.imag(y))


def vdot(a, b):
    """Real inner product ``sum(conj(a) * b)`` over all leaves (a scalar); each leaf's a :func:`pairwise_sum`
    where XLA's reductions differ between programs (jax >= 0.12, outside :func:`per_sample_work`)."""
    return _add_up([x.vdot(y) if _is_slab(x) else _leaf_vdot(x, y) for x, y in zip(_leaves(a), _leaves(b))])


def total(a):
    """Sum of all entries of all leaves (a scalar), each leaf's summed as in :func:`vdot`."""
    return _add_up([x.total() if _is_slab(x) else _leaf_total(x) for x in _leaves(a)])


def abs_total(a):
    """``sum |entry|`` over all leaves: the l1 norm (a real scalar)."""
    return total(jtu.tree_map(jnp.abs, a))


def norm(a):
    """Euclidean norm over all leaves."""
    return jnp.sqrt(vdot(a, a))


def zeros_like(a):
    """Pytree of zeros with the structure, shapes and dtypes of ``a``."""
    return jtu.tree_map(jnp.zeros_like, a)


def size(a) -> int:
    """Total number of scalar entries (static)."""
    return int(sum(x.size if _is_slab(x) else jnp.size(x) for x in _leaves(a)))


def where(cond, a, b):
    """Select the whole pytree ``a`` where the scalar ``cond`` holds, else ``b``."""
    return jtu.tree_map(lambda x, y: jnp.where(cond, x, y), a, b)


def stack(trees):
    """Stack a sequence of same-structured pytrees along a new leading axis."""
    return jtu.tree_map(lambda *xs: jnp.stack(xs), *trees)


def unstack_index(tree, i):
    """Entry ``i`` along the leading axis of every leaf."""
    return jtu.tree_map(lambda x: x[i], tree)


def leaf_dtype(a):
    """Common result dtype of all leaves."""
    leaves = jtu.tree_leaves(a)
    return jnp.result_type(*leaves) if leaves else jnp.float32


def all_finite(a):
    """Scalar bool: every entry of every leaf is finite."""
    leaves = _leaves(a)
    if not leaves:
        return jnp.array(True)
    return jnp.all(jnp.stack([x.all_finite() if _is_slab(x) else jnp.all(jnp.isfinite(x)) for x in leaves]))


def conj(a):
    """Leafwise complex conjugate (a no-op on real leaves)."""
    return jtu.tree_map(lambda x: jnp.conj(x) if jnp.iscomplexobj(x) else x, a)


def linear_adjoint(vjp_fn):
    """Adjoint of a linearization w.r.t. the real inner product ``Re(vdot(a, b))``.

    ``jax.vjp`` does not conjugate cotangents; for maps with complex outputs the
    adjoint in the real sense is ``vjp(conj(ct))``. Real maps are unaffected.
    """

    def adj(ct):
        (out,) = vjp_fn(conj(ct))
        return conj(out)

    return adj


def linearize_with_adjoint(f, x):
    """``(f(x), J, J^T)`` with one evaluation of ``f``: ``J`` its JVP at ``x``, ``J^T`` the adjoint of ``J``.

    ``jax.jvp`` and ``jax.vjp`` each evaluate ``f`` again; in a program compiled
    without XLA's common-subexpression elimination (``reproducible_jit``) both
    evaluations are then executed. ``jax.linearize`` plus ``jax.linear_transpose``
    evaluate ``f`` once and apply only the linear parts. The adjoint is w.r.t.
    the real inner product, as :func:`linear_adjoint`.
    """
    y, jvp_fn = jax.linearize(f, x)
    jvp_fn = _residuals_apart(jvp_fn)
    return y, jvp_fn, linear_adjoint(jax.linear_transpose(jvp_fn, x))


def _residuals_apart(jvp_fn):
    """``jvp_fn`` (from ``jax.linearize``) with its residuals passed through an optimization barrier.

    The residuals are the values at ``x`` the linear map needs (for ``exp(f)``, ``exp(f)`` itself).
    Without the barrier XLA may compute them inside their consumers, e.g. in the body of a solver's
    loop that applies the map, and a per-sample program and a batched one (``Vmap(chunk_size>1)``'s)
    may fuse such a consumer differently: ``exp`` can come out 1 ulp apart (a 128^2 correlated field's
    sampling step), and the solvers amplify it. With the barrier
    they are computed once, before their users, in every program. A ``jvp_fn`` of another form
    (another jax) is returned unchanged.
    """
    if not isinstance(jvp_fn, jtu.Partial):
        return jvp_fn
    leaves, treedef = jtu.tree_flatten(tuple(jvp_fn.args))
    arrays = [i for i, v in enumerate(leaves) if isinstance(v, jax.Array)]  # tracers are jax.Arrays too
    if not arrays:
        return jvp_fn
    apart = jax.lax.optimization_barrier([leaves[i] for i in arrays])
    for i, v in zip(arrays, apart):
        leaves[i] = v
    return jtu.Partial(jvp_fn.func, *jtu.tree_unflatten(treedef, leaves), **jvp_fn.keywords)


def _wide_index(row_offset, row_size: int, shape):
    """``(hi, lo)`` uint32 words of the flat row-major index ``(row_offset + i) * row_size + j`` over ``shape``.

    64-bit integer arithmetic in two uint32 words (the same with and without ``jax_enable_x64``).
    """
    if row_size >= 2**32:
        raise ValueError(f"row_normal: rows of {row_size} entries (at most 2**32 - 1)")
    u32 = jnp.uint32
    o = jnp.asarray(row_offset).astype(u32)
    # o * row_size in two words: 16-bit limbs, every partial product below 2**32
    o_lo, o_hi = o & u32(0xFFFF), o >> u32(16)
    r_lo, r_hi = u32(row_size & 0xFFFF), u32(row_size >> 16)
    ll, lh, hl = o_lo * r_lo, o_lo * r_hi, o_hi * r_lo
    mid = (ll >> u32(16)) + (lh & u32(0xFFFF)) + (hl & u32(0xFFFF))
    base_lo = (ll & u32(0xFFFF)) | (mid << u32(16))
    base_hi = o_hi * r_hi + (lh >> u32(16)) + (hl >> u32(16)) + (mid >> u32(16))
    local = jax.lax.iota(u32, math.prod(shape)).reshape(shape)
    lo = base_lo + local
    return base_hi + (lo < local).astype(u32), lo


def _key_words(key):
    """The two uint32 words of a threefry key (typed or raw); another PRNG's key gives two words of its bits."""
    data = jax.random.key_data(key) if jnp.issubdtype(key.dtype, jax.dtypes.prng_key) else key
    if data.shape != (2,) or data.dtype != jnp.uint32:
        data = jax.random.bits(key, (2,), jnp.uint32)
    return data[0], data[1]


def row_normal(key, shape, dtype, row_offset=0):
    """Standard-normal array of ``shape``: rows ``row_offset ..`` of ``jax.random.normal(key, whole_shape)``.

    Counter-based on the global flat index: entry ``(i, j...)`` is a function
    of ``key`` and ``(row_offset + i) * prod(shape[1:]) + j`` only (threefry
    2x32 on that counter, as JAX's partitionable threefry does), so an array
    cut into blocks of rows (data blocks, a grid's slabs) draws, block by block
    with each block's ``row_offset``, the numbers of the whole array; and the
    whole array's numbers are ``jax.random.normal(key, shape, dtype)``'s under
    JAX's default ``jax_threefry_partitionable`` (tested bitwise on CPU with
    the supported JAX versions, real float dtypes). A 0-d shape draws one number. Complex
    dtypes get independent unit-variance real and imaginary parts (the real
    draws of the two halves of ``jax.random.split(key)``).
    """
    dtype = jnp.dtype(dtype)
    if jnp.issubdtype(dtype, jnp.complexfloating):
        kr, ki = jax.random.split(key)
        real = jnp.finfo(dtype).dtype
        return (row_normal(kr, shape, real, row_offset) + 1j * row_normal(ki, shape, real, row_offset)).astype(dtype)
    shape = tuple(shape)
    hi, lo = _wide_index(row_offset, math.prod(shape[1:]), shape)
    return _counter_normal(key, hi, lo, dtype)


def indexed_normal(key, index, dtype):
    """Standard-normal numbers at the flat indices ``index`` of ``jax.random.normal(key, (n,), dtype)``.

    Entry ``index[...]`` of the result is the number :func:`row_normal` draws at that
    index of a vector (the same counter), whatever ``index``'s shape or order: e.g. a
    datum's number on the pixel it observes. ``index``: non-negative integers below
    ``2**32``; ``dtype`` real.
    """
    index = jnp.asarray(index)
    lo = index.astype(jnp.uint32)
    return _counter_normal(key, jnp.zeros_like(lo), lo, jnp.dtype(dtype))


def _counter_normal(key, hi, lo, dtype):
    """Standard-normal numbers of ``dtype`` (real) from threefry 2x32 of ``key`` on the counters ``(hi, lo)``."""
    shape = tuple(lo.shape)
    k1, k2 = _key_words(key)
    n = math.prod(shape)
    words = threefry_2x32((k1, k2), jnp.concatenate([hi.ravel(), lo.ravel()]))
    bits1, bits2 = words[:n].reshape(shape), words[n:].reshape(shape)
    # bits -> uniform in [nextafter(-1, 0), 1) -> normal, as jax.random.uniform / jax.random.normal
    finfo = jnp.finfo(dtype)
    nbits, nmant = finfo.bits, finfo.nmant
    rng_bits = 8 if nmant < 8 else nbits
    uint = {8: jnp.uint8, 16: jnp.uint16, 32: jnp.uint32, 64: jnp.uint64}
    if rng_bits == 64:
        bits = (bits1.astype(jnp.uint64) << jnp.uint64(32)) | bits2.astype(jnp.uint64)
    else:
        bits = (bits1 ^ bits2).astype(uint[rng_bits]).astype(uint[nbits])
    one = jnp.asarray(np.array(1.0, dtype).view(uint[nbits]), uint[nbits])
    floats = jax.lax.bitcast_convert_type((bits >> uint[nbits](rng_bits - nmant)) | one, dtype) - jnp.array(1.0, dtype)
    lo_val = jnp.asarray(np.nextafter(np.array(-1.0, dtype), np.array(0.0, dtype)), dtype)
    hi_val = jnp.asarray(1.0, dtype)
    u = jax.lax.max(lo_val, floats * (hi_val - lo_val) + lo_val)
    return jnp.asarray(np.sqrt(2), dtype) * jax.lax.erf_inv(u)


def random_like(key, domain, row_offset=0):
    """Standard-normal pytree shaped like ``domain`` (ShapeDtypeStructs or arrays).

    Complex leaves get independent unit-variance real and imaginary parts, i.e.
    unit variance w.r.t. the real inner product used throughout. Every leaf is
    drawn row by row (:func:`row_normal`, rows counted from ``row_offset``):
    a block of rows of a leaf, drawn with its offset, gets the whole leaf's
    numbers there, and a slab leaf (a grid split over devices) the same
    numbers as the whole grid.
    """
    leaves, treedef = jtu.tree_flatten(domain, is_leaf=_is_slab)
    keys = jax.random.split(key, max(len(leaves), 1))
    out = []
    for k, d in zip(keys, leaves):
        if _is_slab(d):
            if jnp.issubdtype(d.value.dtype, jnp.complexfloating):
                raise TypeError("random_like: a grid split over devices must be real")
            out.append(d.normal(k))
        else:
            out.append(row_normal(k, d.shape, d.dtype, row_offset))
    return jtu.tree_unflatten(treedef, out)
