"""Grid-shaped arrays split by rows over a strategy's model axis, each process building only its own rows.

Field parallelism over processes (:func:`~shardvi.parallel.initialize_distributed`,
``ShardMap`` or ``JitSharding`` with ``model_shards = k``) splits the grid's
rows over the model axis: each process computes on ``N0 / k`` rows per device.
Data and a start position given as whole arrays would still be whole on every
process (one grid-sized copy each). :func:`field_array` builds such an array
as one global ``jax.Array`` of which every process creates only the rows its
devices hold (``fill`` is called with those rows), and :func:`process_rows` says
which rows they are. The likelihoods (``sv.Gaussian``, ``sv.Poisson``, ...)
take such arrays as data, and :func:`shardvi.optimize_kl` takes them in the
start position; the run is bitwise the one with whole arrays.

>>> strategy = sv.parallel.ShardMap(model_shards=jax.process_count())
>>> d = sv.parallel.field_array(strategy, (n, n), lambda rows: load_rows(rows.start, rows.stop))
>>> lh = sv.Gaussian(d, noise_std=0.1).amend(model, field_blocks=8)
"""

from __future__ import annotations

from collections.abc import Callable

import jax
import jax.core
import jax.numpy as jnp
import numpy as np
from jax import tree_util as jtu
from jax.sharding import NamedSharding
from jax.sharding import PartitionSpec as P

from .mesh import MODEL_AXIS

__all__ = ["field_array", "field_model", "process_rows", "is_global", "holds_global"]


def is_global(x) -> bool:
    """Whether ``x`` is an array split over processes (e.g. a :func:`field_array`): not all of its values are
    on this process, so it is checked with compiled JAX reductions every process runs alike."""
    return isinstance(x, jax.Array) and not isinstance(x, jax.core.Tracer) and not x.is_fully_addressable


def holds_global(tree) -> bool:
    """Whether any leaf of ``tree`` is an array split over processes (:func:`is_global`)."""
    return any(is_global(x) for x in jax.tree_util.tree_leaves(tree))


def _shape(shape) -> tuple[int, ...]:
    try:
        out = tuple(shape)
    except TypeError:
        raise TypeError(f"shape must be a tuple of ints, got {shape!r}") from None
    if not out or not all(isinstance(n, (int, np.integer)) and not isinstance(n, bool) and n >= 1 for n in out):
        raise ValueError(f"shape must be a non-empty tuple of positive ints (grid rows first), got {shape!r}")
    return tuple(int(n) for n in out)


def model_shards(strategy) -> int:
    """``strategy``'s number of model shards (1 without a model axis); ``TypeError`` for no strategy."""
    from .strategy import Strategy

    if not isinstance(strategy, Strategy):
        raise TypeError(f"strategy must be a shardvi.parallel strategy object, got {type(strategy).__name__}")
    return int(getattr(strategy, "model_shards", 1))


def _split_sharding(strategy, shape) -> NamedSharding:
    k = model_shards(strategy)
    if shape[0] % k:
        raise ValueError(f"model_shards={k} does not divide the grid's {shape[0]} rows (shape[0] of {shape})")
    return NamedSharding(strategy.mesh, P(MODEL_AXIS))


def _row_span(index, shape) -> tuple[int, int]:
    """``(start, stop)`` of the rows of a device's index (a tuple of slices, ``None`` for the whole array)."""
    rows = slice(None) if index is None else index[0]
    return rows.start or 0, shape[0] if rows.stop is None else rows.stop


def process_rows(strategy, shape) -> slice:
    """The grid rows this process's devices hold along ``strategy``'s model axis (one contiguous range).

    Parameters
    ----------
    strategy : shardvi.parallel.Strategy
        The run's strategy. Without a model axis (``model_shards = 1``, or a
        one-device strategy) every process holds all rows.
    shape : tuple of int
        The whole grid-shaped array's shape, rows first.

    Returns
    -------
    slice
        ``slice(start, stop)`` of the rows (axis 0).
    """
    shape = _shape(shape)
    if model_shards(strategy) == 1:
        return slice(0, shape[0])
    index_map = _split_sharding(strategy, shape).addressable_devices_indices_map(shape)
    spans = sorted({_row_span(ix, shape) for ix in index_map.values()})
    start, stop = spans[0]
    for a, b in spans[1:]:
        if a != stop:
            raise ValueError(
                f"this process's devices hold the grid rows {spans} along the model axis, not one contiguous range: "
                f"order the strategy's devices so that each process's devices are neighbours on the model axis"
            )
        stop = b
    return slice(start, stop)


def _value_preserving_cast(a: np.ndarray, dtype: np.dtype, what: str) -> np.ndarray:
    """``a`` cast to ``dtype`` where its values survive: the same kind or a wider one (no complex to real, no
    float to int), integers in range, finite floats finite (a float may round). ``TypeError`` / ``ValueError``."""
    if a.dtype == dtype:
        return a
    if not np.can_cast(a.dtype, dtype, casting="same_kind"):
        raise TypeError(f"fill's values of dtype {a.dtype} cannot become {dtype} ({what}) without losing their kind")
    with np.errstate(over="ignore", invalid="ignore"):
        out = a.astype(dtype)
    if np.issubdtype(dtype, np.integer):
        lost = not np.array_equal(out.astype(a.dtype), a)
    else:
        lost = bool(np.any(np.isfinite(a) & ~np.isfinite(out)))
    if lost:
        raise ValueError(f"fill's values of dtype {a.dtype} do not fit in {dtype} ({what})")
    return out


def field_array(strategy, shape, fill: Callable[[slice], np.ndarray], dtype=None) -> jax.Array:
    """A grid-shaped array split by rows over ``strategy``'s model axis, this process building only its rows.

    Parameters
    ----------
    strategy : shardvi.parallel.Strategy
        The strategy of the run (the one given to :func:`shardvi.optimize_kl`).
        With ``model_shards = k > 1`` the result is a global array whose rows
        are split over the model axis as the run splits them (replicated over
        the sample axis); otherwise an ordinary whole array.
    shape : tuple of int
        The whole array's shape, grid rows first (``k`` must divide ``shape[0]``).
    fill : callable
        ``fill(rows) -> array`` of shape ``(rows.stop - rows.start,) + shape[1:]``:
        the values of the rows ``rows`` (a ``slice`` of axis 0). Called once per
        distinct row range of this process's devices (for the whole range with
        ``model_shards = 1``).
    dtype : dtype, optional
        Cast the values to it (default: ``fill``'s dtype): of the same kind or
        a wider one, integers in its range, finite floats finite in it (else
        ``TypeError`` / ``ValueError``).

    Returns
    -------
    jax.Array
        Shape ``shape``. Use it as data of a pixel-wise likelihood amended with
        ``field_blocks``, or as a grid leaf of the start position.
    """
    shape = _shape(shape)
    if not callable(fill):
        raise TypeError(f"fill must be callable(rows: slice) -> array, got {type(fill).__name__}")
    want = None if dtype is None else np.dtype(dtype)
    done: dict[tuple[int, int], np.ndarray] = {}

    def rows_of(start: int, stop: int) -> np.ndarray:
        if (start, stop) not in done:
            try:
                a = np.asarray(fill(slice(start, stop)))
            except (TypeError, ValueError) as err:
                raise TypeError(f"fill must return a numeric array for rows {start}:{stop}: {err}") from err
            expect = (stop - start,) + shape[1:]
            if a.shape != expect:
                raise ValueError(f"fill returned shape {a.shape} for the rows {start}:{stop}, expected {expect}")
            if not np.issubdtype(a.dtype, np.number):
                raise TypeError(f"fill must return a numeric array, got dtype {a.dtype}")
            if want is not None:
                a = _value_preserving_cast(a, want, "dtype")
            canonical = np.dtype(jax.dtypes.canonicalize_dtype(a.dtype))
            done[(start, stop)] = _value_preserving_cast(a, canonical, "the dtype JAX computes in (jax_enable_x64 off)")
        return done[(start, stop)]

    if model_shards(strategy) == 1:
        return jnp.asarray(rows_of(0, shape[0]))
    sharding = _split_sharding(strategy, shape)

    def local(index):
        return rows_of(*_row_span(index, shape))[(slice(None),) + tuple(index[1:])]

    return jax.make_array_from_callback(shape, sharding, local)


def field_model(strategy, model):
    """``model`` with the grid-shaped arrays it holds split by rows over ``strategy``'s model axis.

    The model's grids (every node of its pytree with a ``split_rows(strategy)``
    method: a :class:`~shardvi.models.harmonic.RegularGrid`, whose power index
    takes 4 bytes per pixel) are replaced by their ``split_rows(strategy)``:
    each process builds and holds only the rows its devices hold, as
    :func:`field_array` does for data. A likelihood amended with
    ``field_blocks`` reads them row by row; the run is bitwise the one with
    the whole model.

    >>> cf = sv.parallel.field_model(strategy, cfm.finalize())   # drop the whole one
    >>> model = sv.Model(jax.tree_util.Partial(lambda cf, xi: jnp.exp(cf(xi)), cf), cf.domain)

    Parameters
    ----------
    strategy : shardvi.parallel.Strategy
        The run's strategy. With ``model_shards = 1`` ``model`` is returned as it is.
    model : pytree
        A model (or anything holding grids as pytree nodes). Grids hidden in a
        Python closure are not found: hold them as attributes or in a
        ``jax.tree_util.Partial``, as above.

    Returns
    -------
    pytree
        ``model`` with its grids split (the same tree structure).

    Raises
    ------
    ValueError
        With ``model_shards > 1``, where ``model``'s pytree holds no grid.
    """
    if model_shards(strategy) == 1:
        return model
    splits = lambda node: callable(getattr(node, "split_rows", None))  # noqa: E731
    if not any(splits(n) for n in jtu.tree_leaves(model, is_leaf=splits)):
        raise ValueError(
            f"model ({type(model).__name__}) holds no grid in its pytree (nothing to split): a grid a function "
            f"closes over is hidden; pass the field model itself, or hold it in a jax.tree_util.Partial"
        )
    return jtu.tree_map(lambda n: n.split_rows(strategy) if splits(n) else n, model, is_leaf=splits)
