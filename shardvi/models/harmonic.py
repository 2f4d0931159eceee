"""Regular grids, Hartley transforms with volume factors, and power-spectrum binning.

Conventions (per axis ``i``: ``N_i`` pixels of length ``dx_i``):

- harmonic coordinates are ``k_i = fftfreq(N_i, dx_i)`` (cycles per unit length), so
  the harmonic cell is ``dk_i = 1 / (N_i dx_i)``; ``|k|`` is the Euclidean norm;
- ``position_to_harmonic(s) = prod(dx) * H s`` and ``harmonic_to_position(S) = prod(dk) * H S``
  with ``H`` the unnormalized Hartley transform (``Re + Im`` of the FFT, ``H H = N I``);
  they are inverse to each other and satisfy Parseval:
  ``sum(dx) s^2 == sum(dk) S^2``;
- a power spectrum ``P(|k|)`` is a spectral density: a stationary field with power
  ``P`` has pixel variance ``sum_k dk P(|k|) = sum_k P(|k|) / V`` (``V`` the total volume).
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass, field

import jax.numpy as jnp
import numpy as np

from ..module import Module
from ..parallel.slab import mapped_axis_size, slab_hartley
from .model import as_shape

__all__ = ["RegularGrid", "hartley", "harmonic_to_position", "position_to_harmonic", "power_analyze"]


def _as_shape(shape) -> tuple[int, ...]:
    out = as_shape(shape, "shape", minimum=2)
    if not out or len(out) > 3:
        raise ValueError(f"shape must have 1 to 3 axes, got {out}")
    return out


def _as_distances(distances, ndim: int) -> tuple[float, ...]:
    if np.ndim(distances) == 0:
        distances = (distances,) * ndim
    try:
        out = tuple(float(d) for d in distances)
    except TypeError:
        raise TypeError(f"distances must be a float or a sequence of floats, got {distances!r}") from None
    if len(out) != ndim:
        raise ValueError(f"distances has {len(out)} entries, expected {ndim} (one per axis)")
    if not all(math.isfinite(d) and d > 0 for d in out):
        raise ValueError(f"distances must be finite and > 0, got {out}")
    return out


def _check_scales(shape, distances) -> None:
    """``ValueError`` unless the grid's derived scales are normal floats.

    Checked: the cell and total volumes, the harmonic distances ``dk``, their
    squares and product (the harmonic cell volume) and the largest squared mode
    length ``sum((N_i // 2 * dk_i)^2)``. Products are float multiplications
    (``inf`` or ``0`` out of range, never an ``OverflowError``).
    """
    cell = math.prod(distances)
    total = cell * math.prod(shape)
    harmonic = [1.0 / (n * d) for n, d in zip(shape, distances)]
    k_max = [(n // 2) * h for n, h in zip(shape, harmonic)]
    tiny, huge = np.finfo(np.float64).tiny, np.finfo(np.float64).max
    scales = (
        ("cell volume", cell),
        ("total volume", total),
        *(("harmonic distance", h) for h in harmonic),
        *(("squared harmonic distance", h * h) for h in harmonic),
        ("harmonic cell volume", math.prod(harmonic)),
        ("largest squared |k|", sum(k * k for k in k_max)),
    )
    bad = [f"{name} {v:.3g}" for name, v in scales if not (tiny <= v <= huge)]
    if bad:
        raise ValueError(
            f"distances {distances} on a grid of shape {shape} give {', '.join(bad)}, outside the range of float64 "
            f"normal numbers [{tiny:.3g}, {huge:.3g}]: express the grid in units where the distances are "
            "moderate (e.g. 1 / npix for a unit box)"
        )


# pixels of the row blocks the power index is built in (bounds the temporaries of a large grid's binning)
_CHUNK_PIXELS = 1 << 20


def _row_chunks(shape, rows: slice | None = None) -> list[slice]:
    """Consecutive blocks of the rows ``rows`` of axis 0 (all by default), each of about ``_CHUNK_PIXELS`` pixels."""
    start, stop = (0, shape[0]) if rows is None else (rows.start, rows.stop)
    step = max(1, _CHUNK_PIXELS // math.prod(shape[1:]))
    return [slice(a, min(a + step, stop)) for a in range(start, stop, step)]


class _Bins:
    """The ``|k|`` bins of a grid: the sorted distinct bin keys, their ``|k|``, and the bin numbers of any row block.

    Keys are the integer ``|n|^2`` (``n`` the integer frequency indices) where the harmonic distances are
    equal (exact bins, no floating-point near-duplicates), else ``|k|^2`` relative to the largest harmonic
    cell, rounded to 10 digits. Built row block by row block: the temporaries stay a block's size, and a
    block's bin numbers need no other rows (a process of a split field builds only its own).
    """

    def __init__(self, shape: tuple[int, ...], dk: tuple[float, ...]):
        self.shape = shape
        self.freqs = [np.fft.fftfreq(n, 1.0 / n).round().astype(np.int64) for n in shape]
        self.dk = dk
        self.isotropic = len(set(dk)) == 1
        self.scale = max(dk) ** 2
        bound = sum((n // 2) ** 2 for n in shape)  # the largest |n|^2
        self.dtype = np.int32 if bound < 2**31 else np.int64
        chunks = _row_chunks(shape)
        if self.isotropic and bound < 8 * math.prod(shape):  # a lookup table over the keys' range
            present = np.zeros(bound + 1, dtype=bool)
            for rows in chunks:
                present[self.keys(rows).ravel()] = True
            uniq = np.flatnonzero(present)
            self._rank = np.cumsum(present, dtype=np.int32) - 1  # a key's position among the sorted keys
        else:  # sparse keys (a long 1-D axis, anisotropic cells): sorted, looked up by bisection
            uniq = np.unique(np.concatenate([np.unique(self.keys(rows)) for rows in chunks]))
            self._rank = None
        self._uniq = uniq
        if self.isotropic:
            self.lengths = dk[0] * np.sqrt(uniq.astype(np.float64))
        else:
            self.lengths = np.sqrt(uniq * self.scale)

    def keys(self, rows: slice) -> np.ndarray:
        """The bin keys of the rows ``rows``, shape ``(rows,) + shape[1:]``."""
        idx = np.ix_(self.freqs[0][rows], *self.freqs[1:])
        if self.isotropic:
            key = np.zeros(np.broadcast_shapes(*[i.shape for i in idx]), dtype=self.dtype)
            for i in idx:
                key += (i * i).astype(self.dtype)
            return key
        k2 = sum((i * d) ** 2 for i, d in zip(idx, self.dk))
        return np.round(k2 / self.scale, 10)

    def index(self, rows: slice) -> np.ndarray:
        """The bin numbers (int32) of the rows ``rows``, shape ``(rows,) + shape[1:]``."""
        key = self.keys(rows)
        if self._rank is not None:
            return self._rank[key]
        return np.searchsorted(self._uniq, key).astype(np.int32)

    def rows(self, rows: slice) -> np.ndarray:
        """:meth:`index` of the rows ``rows`` computed row block by row block (temporaries of a block's size)."""
        out = np.empty((rows.stop - rows.start,) + self.shape[1:], dtype=np.int32)
        for block in _row_chunks(self.shape, rows):
            out[block.start - rows.start : block.stop - rows.start] = self.index(block)
        return out


def _frozen(a: np.ndarray) -> np.ndarray:
    a = np.ascontiguousarray(a)
    a.setflags(write=False)
    return a


@dataclass(frozen=True, eq=False)
class RegularGrid(Module):
    """A periodic regular grid and its harmonic partner.

    Parameters
    ----------
    shape : int or tuple of int
        Pixels per axis (1 to 3 axes, each >= 2).
    distances : float or tuple of float
        Pixel edge length per axis (a scalar is used for every axis).

    Attributes
    ----------
    mode_lengths : ndarray, shape (M,)
        Sorted unique ``|k|`` values; ``mode_lengths[0] == 0``.
    power_index : ndarray of int, shape ``shape``
        Index into ``mode_lengths`` for every harmonic pixel (FFT order).
    multiplicity : ndarray of int, shape (M,)
        Number of harmonic pixels in each ``|k|`` bin.
    log_mode_lengths : ndarray, shape (M-1,)
        ``log |k|`` of the non-zero modes relative to the smallest one; starts at 0.

    A :class:`~shardvi.Module`: the arrays are pytree leaves (inputs of the
    compiled programs of a model that holds the grid).
    """

    shape: tuple
    distances: tuple = 1.0  # pyright: ignore[reportAssignmentType] -- a float default; __post_init__ makes a tuple
    mode_lengths: np.ndarray = field(init=False, repr=False)
    power_index: np.ndarray = field(init=False, repr=False)
    multiplicity: np.ndarray = field(init=False, repr=False)
    log_mode_lengths: np.ndarray = field(init=False, repr=False)

    def __post_init__(self):
        shape = _as_shape(self.shape)
        dist = _as_distances(self.distances, len(shape))
        object.__setattr__(self, "shape", shape)
        object.__setattr__(self, "distances", dist)
        _check_scales(shape, dist)
        bins = _Bins(shape, self.harmonic_distances)
        inv = bins.rows(slice(0, shape[0]))  # no grid-sized temporaries beyond the index itself
        counts = np.zeros(len(bins.lengths), dtype=np.int64)
        for rows in _row_chunks(shape):
            counts += np.bincount(inv[rows].ravel(), minlength=len(counts))
        lengths = bins.lengths
        object.__setattr__(self, "mode_lengths", _frozen(lengths))
        object.__setattr__(self, "power_index", _frozen(inv))
        object.__setattr__(self, "multiplicity", _frozen(counts))
        lk = np.log(lengths[1:])
        object.__setattr__(self, "log_mode_lengths", _frozen(lk - lk[0]))

    def power_index_rows(self, rows: slice) -> np.ndarray:
        """The rows ``rows`` of :attr:`power_index`, built without the others.

        Parameters
        ----------
        rows : slice
            ``slice(start, stop)`` of axis 0, ``0 <= start <= stop <= shape[0]`` (step 1).

        Returns
        -------
        ndarray of int32, shape ``(stop - start,) + shape[1:]``
            Equal to ``power_index[rows]``. The grid's bins are found in one pass
            over all rows in blocks (no grid-sized temporaries), so a process of
            a field split over processes holds only its own rows of the index
            (:func:`shardvi.parallel.field_model`).
        """
        if not isinstance(rows, slice) or rows.step not in (None, 1):
            raise TypeError(f"rows must be a slice of axis 0 with step 1, got {rows!r}")
        start, stop = rows.start, rows.stop
        ints = all(isinstance(v, (int, np.integer)) and not isinstance(v, bool) for v in (start, stop))
        if not (ints and 0 <= start <= stop <= self.shape[0]):
            raise ValueError(f"rows must be slice(start, stop), 0 <= start <= stop <= {self.shape[0]}, got {rows!r}")
        return _Bins(self.shape, self.harmonic_distances).rows(slice(int(start), int(stop)))

    def split_rows(self, strategy) -> RegularGrid:
        """This grid with :attr:`power_index` split by rows over ``strategy``'s model axis.

        Each process builds only the rows its devices hold
        (:func:`~shardvi.parallel.field_array` of :meth:`power_index_rows`);
        the grid itself where nothing is split (``model_shards = 1``, a 1-D
        grid, or rows that ``model_shards`` does not divide). Called for every
        grid of a model by :func:`shardvi.parallel.field_model`.
        """
        from ..parallel.field_arrays import field_array, model_shards

        k = model_shards(strategy)
        if k == 1 or self.ndim < 2 or self.shape[0] % k:
            return self
        index = field_array(strategy, self.shape, self.power_index_rows, dtype=np.int32)
        return self._replaced(power_index=index)

    @property
    def ndim(self) -> int:
        return len(self.shape)

    @property
    def size(self) -> int:
        return math.prod(self.shape)

    @property
    def total_volume(self) -> float:
        """``V = prod(N_i dx_i)``."""
        return math.prod(n * d for n, d in zip(self.shape, self.distances))

    @property
    def harmonic_distances(self) -> tuple[float, ...]:
        """``dk_i = 1 / (N_i dx_i)``."""
        return tuple(1.0 / (n * d) for n, d in zip(self.shape, self.distances))

    @property
    def k_lengths(self) -> np.ndarray:
        """``|k|`` on the full harmonic grid (FFT order), shape ``shape``."""
        return self.mode_lengths[self.power_index]

    def __repr__(self):
        return f"RegularGrid(shape={self.shape}, distances={self.distances})"


def _axes(x, axes):
    if axes is None:
        return tuple(range(jnp.ndim(x)))
    return tuple(int(a) % jnp.ndim(x) for a in axes)


def hartley(x, axes: Sequence[int] | None = None, *, axis_name: str | None = None):
    """Unnormalized Hartley transform ``Re(FFT x) + Im(FFT x)`` over ``axes`` (all by default).

    Real in, real out; ``hartley(hartley(x)) == N x`` with ``N`` the number of
    transformed pixels. ``axis_name``: inside a
    ``jax.shard_map`` whose mesh axis of that name splits ``axes[0]`` into slabs,
    ``x`` is the local slab and the transform is the distributed one
    (:func:`shardvi.parallel.slab.slab_hartley`), bitwise the one-device result on XLA:CPU.
    """
    return slab_hartley(x, axes, axis_name=axis_name)


def _grid_axes(x, grid: RegularGrid, axes, axis_name=None):
    ax = _axes(x, axes) if axes is not None else tuple(range(jnp.ndim(x) - grid.ndim, jnp.ndim(x)))
    shape = tuple(jnp.shape(x)[a] for a in ax)
    if axis_name is not None and len(ax) == grid.ndim:  # a slab: the first grid axis is split over the devices
        shape = (shape[0] * mapped_axis_size(axis_name),) + shape[1:]
    if len(ax) != grid.ndim or shape != grid.shape:
        raise ValueError(f"array of shape {jnp.shape(x)} does not match grid shape {grid.shape} on axes {ax}")
    return ax


def position_to_harmonic(s, grid: RegularGrid, axes: Sequence[int] | None = None, *, axis_name: str | None = None):
    """``S = prod(dx) * H s``: the Hartley-space field with volume factors.

    Parameters
    ----------
    s : array
        Field with ``grid.shape`` on ``axes`` (default: the trailing ``grid.ndim`` axes).
    axis_name : str, optional
        Mesh axis that splits the first grid axis into slabs (inside ``jax.shard_map``;
        ``s`` is then the local slab), see :func:`hartley`.
    """
    ax = _grid_axes(s, grid, axes, axis_name)
    return math.prod(grid.distances) * hartley(s, ax, axis_name=axis_name)


def harmonic_to_position(S, grid: RegularGrid, axes: Sequence[int] | None = None, *, axis_name: str | None = None):
    """``s = prod(dk) * H S``, the inverse of :func:`position_to_harmonic` (``axis_name``: the same)."""
    ax = _grid_axes(S, grid, axes, axis_name)
    return math.prod(grid.harmonic_distances) * hartley(S, ax, axis_name=axis_name)


def power_analyze(s, grid: RegularGrid, axes: Sequence[int] | None = None):
    """Empirical power spectrum ``P(|k|)`` of a field, one value per ``grid.mode_lengths`` bin.

    ``P_j = mean_{k in bin j} S_k^2 / V`` with ``S = position_to_harmonic(s)``; for a
    stationary Gaussian field with power spectrum ``P`` each term has expectation
    ``P(|k|)``; ``sum_j multiplicity_j P_j / V == mean(s^2)`` exactly (Parseval).
    Leading (batch) axes are kept.
    """
    ax = _grid_axes(s, grid, axes)
    S = position_to_harmonic(s, grid, ax)
    S2 = jnp.moveaxis(S * S, ax, tuple(range(-grid.ndim, 0)))
    batch = S2.shape[: -grid.ndim]
    flat = S2.reshape(batch + (-1,))
    idx = jnp.asarray(grid.power_index.ravel())
    m = len(grid.mode_lengths)
    sums = jnp.zeros(batch + (m,), flat.dtype).at[..., idx].add(flat)
    return sums / (jnp.asarray(grid.multiplicity, flat.dtype) * grid.total_volume)
