"""Multi-dimensional FFTs of a grid split into slabs along its first axis (slab decomposition).

A field too large for one device is split along its first grid axis over a
mesh axis of ``P`` devices: device ``p`` holds rows ``[p N0/P, (p+1) N0/P)``
(a *slab*). The ``d``-dimensional DFT over the grid axes ``(a0, a1, ...)`` is
computed as

1. local 1-D FFTs along the unsplit axes, last to ``a1`` (each device holds
   those axes whole);
2. ``all_to_all`` over the mesh axis: split ``a1`` into ``P`` pieces, gather
   ``a0`` whole (each device now holds ``N1/P`` columns of every row);
3. local 1-D FFTs along ``a0``;
4. ``all_to_all`` back: the result split along ``a0`` again, like the input.

On one device (no mesh axis) it is ``jnp.fft.fftn`` over the grid axes
(as :func:`shardvi.parallel.fft.fftn`, which carries a rule for XLA's
partitioner: a batch of fields split over devices under ``jit`` stays split).
XLA:CPU computes that as the same 1-D passes in the same order (last axis
first; bitwise equal to the explicit sequence, and faster than calling it
pass by pass). A line's result does not depend on how many lines are in its
batch (on jax >= 0.12 every batch is padded to full SIMD groups of lines for
that, :data:`~shardvi.parallel.fft.SIMD_LINES`), and the two
``all_to_all`` only move data, so the slab transform is bitwise the
one-device transform for any ``P`` that divides ``N0`` and ``N1``
(``tests/test_slab.py`` and ``tests/test_fixed_order.py`` check these facts
on 2-D and 3-D grids). The
inverse is ``conj(F conj(x)) / N`` in both layouts (``jnp.fft.ifftn`` scales
differently, in the last bits).

Everything here is made of ``jnp.fft.fft`` and ``jax.lax.all_to_all``, whose
JVP and transpose rules JAX has: the transforms are differentiable and
transposable inside ``jax.shard_map`` (the transpose of ``all_to_all`` is the
``all_to_all`` that undoes it).
"""

from __future__ import annotations

import math
from collections.abc import Sequence

import jax
import jax.numpy as jnp

from .fft import fftn, normalize_axes, slab_passes

__all__ = ["mapped_axis_size", "slab_fftn", "slab_hartley", "layout_hartley"]


def mapped_axis_size(axis_name: str) -> int:
    """Devices along mesh axis ``axis_name`` of the enclosing ``jax.shard_map`` (``ValueError`` outside one)."""
    try:
        return jax.lax.axis_size(axis_name)
    except NameError:
        raise ValueError(
            f"axis_name={axis_name!r} is not a mesh axis being mapped over here: call the slab "
            f"transform inside jax.shard_map over a mesh with that axis (or pass axis_name=None)"
        ) from None


def slab_fftn(x, axes: Sequence[int] | None = None, *, axis_name: str | None = None, inverse: bool = False):
    """DFT over the grid ``axes`` of a slab: ``axes[0]`` split over mesh axis ``axis_name``.

    Parameters
    ----------
    x : array (complex)
        The local slab: ``N0 / P`` rows of grid axis ``axes[0]``, the other grid axes
        whole (``P`` devices along ``axis_name``); other axes (a batch) are carried along.
    axes : sequence of int, optional
        The grid axes (default: all axes of ``x``), the split one first; at least two
        when ``axis_name`` is given (a 1-D grid has no second axis to transpose into).
    axis_name : str, optional
        Mesh axis of the enclosing ``jax.shard_map`` that splits ``axes[0]``. ``None``:
        ``x`` is the whole grid (``jnp.fft.fftn``).
    inverse : bool
        The inverse DFT (``1/N`` normalized, like ``jnp.fft.ifftn``; equal to it up to rounding).

    Returns
    -------
    array, the shape of ``x``
        The local slab of the transform, split along ``axes[0]`` like ``x``; bitwise
        the rows of the one-device transform on XLA:CPU.

    Raises
    ------
    ValueError
        Fewer than two grid axes with ``axis_name``; ``N1`` (the length of ``axes[1]``)
        not divisible by the number of devices along ``axis_name``; ``axis_name`` not
        mapped over here.
    """
    ax = normalize_axes(jnp.ndim(x), axes)
    n_dev = _slab_devices(x, ax, axis_name)
    if not inverse:
        return _forward(x, ax, axis_name, n_dev)
    # the inverse from the same forward transform (both layouts alike): conj(F conj(x)) / N
    n = math.prod(x.shape[a] for a in ax) * n_dev
    return jnp.conj(_forward(jnp.conj(x), ax, axis_name, n_dev)) / n


def _slab_devices(x, ax, axis_name) -> int:
    """Devices along ``axis_name`` (1 without one), checked to split ``x``'s grid ``ax`` into slabs."""
    if axis_name is None:
        return 1
    n_dev = mapped_axis_size(axis_name)
    _check_split(x, ax, n_dev, axis_name)
    return n_dev


def _check_split(x, ax, n_dev, axis_name):
    """``ValueError`` unless a slab split along ``ax[0]`` can be transposed into ``ax[1]`` over ``n_dev`` devices."""
    if len(ax) < 2:
        raise ValueError(
            f"a slab transform needs at least 2 grid axes (got axes={ax}): a 1-D grid split over devices "
            f"has no second axis to transpose into; transform it on one device (axis_name=None)"
        )
    if x.shape[ax[1]] % n_dev:
        raise ValueError(
            f"grid axis {ax[1]} has {x.shape[ax[1]]} entries, not divisible by the {n_dev} devices along "
            f"{axis_name!r}: the slab transform splits it over them (pick a grid shape whose first two "
            f"axes the device count divides)"
        )


def _real(x):
    x = jnp.asarray(x)
    if jnp.iscomplexobj(x):
        raise TypeError("hartley expects a real array")
    return x


def _forward(x, ax, axis_name, n_dev, hartley: bool = False):
    """The DFT (``hartley``: its ``Re + Im``, see :func:`~shardvi.parallel.fft.slab_passes`)."""
    if axis_name is None:  # split along other (batch) axes under jit: each device its own part (.fft)
        y = fftn(x, ax)
        return y.real + y.imag if hartley else y
    return slab_passes(x, ax, axis_name, n_dev, hartley=hartley)  # steps 1-4 above


def slab_hartley(x, axes: Sequence[int] | None = None, *, axis_name: str | None = None):
    """Unnormalized Hartley transform ``Re(F x) + Im(F x)`` of a real slab (see :func:`slab_fftn`).

    ``F`` is the DFT over the grid ``axes`` (default: all), ``axes[0]`` split over mesh
    axis ``axis_name`` (``None``: the whole grid is local). Real in, real out, same
    shape and dtype; applied twice it gives ``N x`` (``N`` the number of grid pixels).
    """
    x = _real(x)
    ax = normalize_axes(jnp.ndim(x), axes)
    n_dev = _slab_devices(x, ax, axis_name)
    y = _forward(x.astype(jnp.result_type(x.dtype, jnp.complex64)), ax, axis_name, n_dev, hartley=True)
    return y.astype(x.dtype)


def layout_hartley(x, layout, axes: Sequence[int] | None = None):
    """:func:`slab_hartley` of a slab cut by a :class:`~shardvi.parallel.grid.GridLayout`.

    Always the explicit slab passes (:func:`~shardvi.parallel.fft.slab_passes`), also on one
    device (``layout.axis`` None): their JVP and transpose are then the same programs on every
    layout, bitwise (the one-device ``fftn`` is bitwise the passes forward, not in its transpose).
    A layout with padding rows (``layout.rows``) transforms the grid's own rows: the padding rows
    of ``x`` are not read, those of the result are zero.
    """
    x = _real(x)
    ax = normalize_axes(jnp.ndim(x), axes)
    _check_split(x, ax, layout.shards, layout.axis)
    y = slab_passes(
        x.astype(jnp.result_type(x.dtype, jnp.complex64)), ax, layout.axis, layout.shards, True, layout.rows
    )
    return y.astype(x.dtype)
