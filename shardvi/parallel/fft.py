"""An N-D FFT that XLA's SPMD partitioner splits along its batch axes.

XLA's partitioner has no rule for the FFT op: in a program partitioned by
``jax.jit`` with shardings (user code that maps a batch of fields that way;
shardvi's strategies run the per-sample work per device) it gathers a batch
of fields that is split over the devices and runs the whole batch on every
device. :func:`fftn` is ``jnp.fft.fftn`` with a partitioning
rule (``jax.experimental.custom_partitioning``): an input split along axes
that are not transformed stays split and each device transforms its own
part; an input split along the first transformed axis (a field split into
slabs over a model axis) is transformed in place by the slab algorithm
(:func:`slab_passes`: local FFTs, ``all_to_all``, FFT, ``all_to_all``);
other splits of transformed axes are gathered. The lines a device transforms
get the bits they get on one device (a batched 1-D FFT on XLA:CPU transforms
each line on its own), so sample- and slab-parallel FFTs under ``jit`` give
the one-device results bitwise.

Outside a partitioned program (one device) it lowers to the plain FFT; inside
a ``jax.shard_map`` (where XLA cannot run a custom rule: per device, as in
every strategy's per-sample work) it is the plain FFT. It is linear with a
JVP, a transpose (the DFT matrix is symmetric: the transpose is the same
FFT) and a batching rule, so ``grad``, ``jvp``, ``linear_transpose`` and
``vmap`` work as for ``jnp.fft.fftn``.
"""

from __future__ import annotations

import functools
import math
from collections.abc import Sequence
from typing import Any, cast

import jax
import jax.numpy as jnp
from jax.interpreters import ad, batching, mlir
from jax.sharding import NamedSharding
from jax.sharding import PartitionSpec as P

from .._jax_compat import fixed_order_arithmetic, require_devices_during_lowering

try:
    from jax.experimental.custom_partitioning import custom_partitioning
    from jax.extend.core import Primitive
except ImportError:  # pragma: no cover - depends on the jax version
    # typed Any: used only after the `Primitive is not None` checks below
    custom_partitioning = Primitive = cast(Any, None)

__all__ = ["fftn", "normalize_axes", "slab_passes", "PARTITIONED_PRIMITIVES"]


def normalize_axes(ndim: int, axes) -> tuple[int, ...]:
    """``axes`` (default: all ``ndim``) as distinct ints in ``[0, ndim)``; ``TypeError``/``ValueError`` otherwise."""
    if axes is None:
        return tuple(range(ndim))
    try:
        if isinstance(axes, (str, bytes)):
            raise TypeError
        out = tuple(int(a) for a in axes)
    except (TypeError, ValueError):
        raise TypeError(f"axes must be a sequence of ints, got {axes!r}") from None
    if any(not -ndim <= a < ndim for a in out):
        raise ValueError(f"axes {out} out of range for an array with {ndim} axes")
    out = tuple(a % ndim for a in out)
    if len(set(out)) != len(out):
        raise ValueError(f"axes must be distinct, got {out}")
    return out


def slab_passes(x, axes: tuple, axis_name: str, n_dev: int, hartley: bool = False, rows: int | None = None):
    """The DFT over ``axes`` of a slab split along ``axes[0]`` over mesh axis ``axis_name`` (``n_dev`` devices).

    Local FFTs over ``axes[1:]``, an ``all_to_all`` that gathers ``axes[0]`` and splits
    ``axes[1]``, the FFT along ``axes[0]``, and the ``all_to_all`` back. Per device, inside a
    ``shard_map`` or a partitioned program where ``axis_name`` is manual; see
    :mod:`shardvi.parallel.slab`. On one device (``n_dev`` 1) the same passes by :func:`fftn`
    (bitwise the plain FFTs), which GSPMD keeps split along batch axes.

    ``hartley``: return ``Re + Im`` of the transform (real), formed before the ``all_to_all`` back,
    which then moves half the bytes (the same values: the sum is taken per entry either way).

    ``rows``: the grid's own length along ``axes[0]`` where the slabs end with padding rows after it
    (:class:`~shardvi.parallel.grid.GridLayout`): the pass along ``axes[0]`` transforms those rows
    only, and the padding rows of the result are zero.
    """
    a0, a1 = axes[0], axes[1]
    if n_dev == 1:  # the whole grid: under jit, a batch of grids stays split over the devices (fftn)
        # two calls, as the slabs' passes: transposed, they run in the reverse order, as the slabs' do
        y = _rows_only(lambda v: fftn(v, (a0,)), fftn(x, axes[1:]), a0, rows)
        return y.real + y.imag if hartley else y
    x = _lane_fftn(x, axes[1:])
    x = jax.lax.all_to_all(x, axis_name, split_axis=a1, concat_axis=a0, tiled=True)
    x = _rows_only(lambda v: _lane_fftn(v, (a0,)), x, a0, rows)
    if hartley:
        x = x.real + x.imag
    return jax.lax.all_to_all(x, axis_name, split_axis=a0, concat_axis=a1, tiled=True)


def _rows_only(fn, x, axis: int, rows: int | None):
    """``fn`` (a transform along ``axis``) of ``x``'s first ``rows`` entries along ``axis``, zero-padded back to
    ``x``'s length there (``fn(x)`` for ``rows`` None or the whole length)."""
    n = x.shape[axis]
    if rows is None or rows == n:
        return fn(x)
    y = fn(jax.lax.slice_in_dim(x, 0, rows, axis=axis))
    widths = [(0, n - rows) if i == axis else (0, 0) for i in range(x.ndim)]
    return jnp.pad(y, widths)


#: XLA:CPU (jax >= 0.12) computes a batch of 1-D FFTs in SIMD groups of consecutive lines (up to 8 for
#: float64 on AVX-512) and the lines left over one by one, with other roundings: a line's bits depend on
#: whether its batch fills its group. On that XLA every FFT here transforms batches whose number of lines
#: is a multiple of this (padded with zero lines where needed), so that a line gets the same bits in a
#: slab and in the whole grid, and in any batch.
SIMD_LINES = 8
#: whether this XLA groups FFT lines so (:func:`shardvi._jax_compat.fixed_order_arithmetic`)
_PAD_LINES = fixed_order_arithmetic()


def _lines_fill_groups(shape, axes) -> bool:
    """Whether every 1-D pass of an FFT over ``axes`` of an array of ``shape`` has a multiple of
    :data:`SIMD_LINES` lines."""
    size = math.prod(shape)
    return size == 0 or all((size // shape[a]) % SIMD_LINES == 0 for a in axes)


def _lane_fftn(x, axes: tuple):
    """``jnp.fft.fftn(x, axes=axes)`` with every pass over full SIMD groups of lines (:data:`SIMD_LINES`;
    jax >= 0.12, else the plain call).

    Zero lines are appended along the first axis not transformed (and cut off after); where every
    axis is transformed, the passes run one after the other (the last axes, then ``axes[0]``, the
    order of the single call), each padded along an axis it does not transform, and a single line
    gets a batch axis. Same values as the single call; bitwise equal to it where no padding is
    needed (then it is that call).
    """
    if not _PAD_LINES or _lines_fill_groups(x.shape, axes):
        return jnp.fft.fftn(x, axes=axes)
    free = [a for a in range(x.ndim) if a not in axes]
    if not free and len(axes) > 1:  # a whole grid without batch axes: pass by pass
        return _lane_fftn(_lane_fftn(x, axes[1:]), axes[:1])
    if not free:  # one line
        return _lane_fftn(x[None], (1,))[0]
    b = free[0]
    n = x.shape[b]
    rest = [math.prod(x.shape) // (n * x.shape[a]) for a in axes]
    e = next(e for e in range(1, SIMD_LINES) if all((n + e) * r % SIMD_LINES == 0 for r in rest))
    widths = [(0, e) if i == b else (0, 0) for i in range(x.ndim)]
    return jax.lax.slice_in_dim(jnp.fft.fftn(jnp.pad(x, widths), axes=axes), 0, n, axis=b)


def _plan(sharding, shape, axes, mesh):
    """The operand sharding to compute in, and the mesh axis of a slab transform (or ``None``).

    Transformed axes whole: ``sharding`` as is, each device its own part. ``axes[0]`` split over
    one named mesh axis that also divides ``axes[1]``: as is, with the slab transform (bitwise the
    one-device FFT on XLA:CPU). Any other split of a transformed axis: those axes gathered.
    """
    local = sharding.shard_shape(shape)
    split = [a for a in axes if local[a] != shape[a]]
    if not split:
        return sharding, None
    if isinstance(sharding, NamedSharding):
        spec = tuple(sharding.spec) + (None,) * (len(shape) - len(sharding.spec))
        name = spec[axes[0]]
        if split == [axes[0]] and len(axes) >= 2 and isinstance(name, str):
            n_dev = sharding.mesh.shape[name]
            if shape[axes[1]] % n_dev == 0:
                return sharding, name
        return NamedSharding(sharding.mesh, P(*(None if i in axes else s for i, s in enumerate(spec)))), None
    return NamedSharding(mesh, P()), None  # an unnamed split of a transformed axis: gather it all (correct, slow)


@functools.cache
def _partitioned(axes: tuple, ndim: int):
    """``fftn`` over ``axes`` of an ``ndim``-D array as a ``custom_partitioning`` function."""

    def fft(x):
        return _lane_fftn(x, axes)

    cp = custom_partitioning(fft)

    def infer(mesh, arg_shapes, result_shape):
        a = arg_shapes[0]
        return _plan(a.sharding, a.shape, axes, mesh)[0]

    def partition(mesh, arg_shapes, result_shape):
        a = arg_shapes[0]
        s, name = _plan(a.sharding, a.shape, axes, mesh)
        if name is None:
            return mesh, fft, s, (s,)
        n_dev = s.mesh.shape[name]
        return mesh, functools.partial(slab_passes, axes=axes, axis_name=name, n_dev=n_dev), s, (s,)

    factors = " ".join(f"d{i}" for i in range(ndim))
    cp.def_partition(
        infer_sharding_from_operands=infer,
        partition=partition,
        sharding_rule=f"{factors} -> {factors}",
        # the first transformed axis may stay split (the slab transform); the others are gathered if split
        need_replication_factors=tuple(f"d{a}" for a in axes[1:]),
    )
    return cp


if Primitive is not None:
    _fft_p = Primitive("shardvi_partitioned_fft")
    _fft_p.def_impl(lambda x, *, axes: _lane_fftn(x, axes))
    _fft_p.def_abstract_eval(lambda x, *, axes: x)
    mlir.register_lowering(
        _fft_p, mlir.lower_fun(lambda x, *, axes: _partitioned(axes, x.ndim)(x), multiple_results=False)
    )
    require_devices_during_lowering(_fft_p)  # its lowering (the partitioning rule) looks at the mesh

    def _batch_rule(args, dims, *, axes):
        (x,), (d,) = args, dims
        x = jnp.moveaxis(x, d, 0)  # the batch first: the transformed axes move up by one
        return _fft_p.bind(x, axes=tuple(a + 1 for a in axes)), 0

    batching.primitive_batchers[_fft_p] = _batch_rule
    # linear; the DFT matrix is symmetric, so the transpose is the same FFT
    ad.deflinear2(_fft_p, lambda ct, x, *, axes: [_fft_p.bind(ct, axes=axes)])

#: primitives of this module (the FFT with a partitioning rule), for code that looks for FFTs in a jaxpr
PARTITIONED_PRIMITIVES = ("shardvi_partitioned_fft",)


def fftn(x, axes: Sequence[int] | None = None):
    """``jnp.fft.fftn(x, axes=axes)`` (complex ``x``) that stays split along untransformed axes under ``jit``.

    Parameters
    ----------
    x : complex array
    axes : sequence of int, optional
        Axes to transform (default: all), distinct; normalized to ``0 <= a < x.ndim``.

    Returns
    -------
    complex array, the shape of ``x``
        Bitwise ``jnp.fft.fftn(x, axes=axes)`` on XLA:CPU, on one device and per device.
    """
    x = jnp.asarray(x)
    if not jnp.iscomplexobj(x):
        raise TypeError(f"fftn expects a complex array, got {x.dtype}")
    axes = normalize_axes(x.ndim, axes)
    if Primitive is None:  # pragma: no cover - no custom partitioning in this jax: the plain FFT
        return _lane_fftn(x, axes)
    if jax.sharding.get_abstract_mesh().manual_axes:
        # inside a shard_map (also JitSharding's field split): XLA's partitioner cannot run the custom
        # rule there; the plain FFT, the same bits
        return _lane_fftn(x, axes)
    return _fft_p.bind(x, axes=axes)
