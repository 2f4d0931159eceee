"""Input validation shared by the likelihood constructors.

The checks run in NumPy on the host: validating concrete user data needs no
XLA compilation (each eager JAX operation would compile a small program and
keep it in memory).
"""

from __future__ import annotations

import jax
import jax.core
import jax.numpy as jnp
import numpy as np
from jax import tree_util as jtu

from ..parallel.field_arrays import is_global

__all__ = ["finite_data", "positive_like", "to_device", "domain_of", "is_global", "all_true"]


def all_true(predicate, x) -> bool:
    """``bool(all(predicate(x)))`` on the host; for an array split over processes, compiled (the same answer on
    every process). ``predicate`` must work on NumPy and JAX arrays alike (e.g. ``lambda a: a >= 0``)."""
    if is_global(x):
        return bool(jax.jit(lambda a: jnp.all(predicate(a)))(x))
    return bool(np.all(predicate(np.asarray(x))))


def _global_finite_data(leaf, argname: str, where: str):
    """:func:`finite_data` of one leaf split over processes (kept split; integers become floats)."""
    if not jnp.issubdtype(leaf.dtype, jnp.number):
        raise TypeError(f"{argname} must be numeric, got dtype {leaf.dtype}")
    if leaf.size == 0:
        raise ValueError(f"{argname}{where} is empty (shape {leaf.shape}): every data array needs at least one entry")
    if not jnp.issubdtype(leaf.dtype, jnp.inexact):
        leaf = jax.jit(lambda a: a.astype(jnp.result_type(float)))(leaf)
    n_bad = int(jax.jit(lambda a: jnp.sum(~jnp.isfinite(a)))(leaf))
    if n_bad:
        raise ValueError(f"{argname} contains {n_bad} non-finite value(s) (nan or inf)")
    return leaf


def check_bool(value, argname: str) -> bool:
    """``value`` as a bool where it is a Python or NumPy bool; ``TypeError`` naming ``argname`` otherwise (a truthy
    object such as ``"no"`` is no flag)."""
    if not isinstance(value, (bool, np.bool_)):
        raise TypeError(f"{argname} must be a bool, got {type(value).__name__}")
    return bool(value)


def finite_data(data, argname: str = "data"):
    """Convert leaves to arrays and reject empty, non-finite or non-numeric entries.

    Checked on the host; a NumPy leaf is copied to the device once (``jax.device_put``: no staging copy
    beside it), a JAX array leaf is kept. A leaf split over processes
    (:func:`shardvi.parallel.field_array`) is checked by compiled reductions and stays split.
    """
    leaves, treedef = jtu.tree_flatten(data)
    if not leaves:
        raise ValueError(f"{argname} must be a non-empty array or pytree of arrays")
    out = []
    for i, leaf in enumerate(leaves):
        if isinstance(leaf, jax.core.Tracer):
            raise TypeError(
                f"{argname} is traced (a likelihood built inside jax.jit, vmap or grad): build likelihoods from "
                f"concrete arrays, outside JAX transformations (the engine passes their arrays to its compiled "
                f"programs as arguments)"
            )
        if is_global(leaf):
            out.append(_global_finite_data(leaf, argname, "" if len(leaves) == 1 else f" leaf {i}"))
            continue
        try:
            host = np.asarray(leaf)
        except (TypeError, ValueError) as err:
            raise TypeError(f"{argname} must contain numeric arrays, got {type(leaf).__name__}") from err
        if not (jnp.issubdtype(host.dtype, jnp.number)):
            raise TypeError(f"{argname} must be numeric, got dtype {host.dtype}")
        if jnp.issubdtype(host.dtype, jnp.inexact) and host.dtype.itemsize < (
            8 if jnp.issubdtype(host.dtype, jnp.complexfloating) else 4
        ):
            raise TypeError(
                f"{argname} has dtype {host.dtype}: the likelihoods and solvers compute in float32 or float64 "
                f"(complex64 / complex128); cast the data, e.g. {argname}.astype(np.float32)"
            )
        if host.size == 0:
            where = "" if len(leaves) == 1 else f" leaf {i}"
            raise ValueError(
                f"{argname}{where} is empty (shape {host.shape}): every data array needs at least one entry"
            )
        keep = False  # a JAX array of a floating dtype is kept as it is
        if not jnp.issubdtype(host.dtype, jnp.inexact):
            host = host.astype(jnp.result_type(float))
        elif isinstance(leaf, jax.Array):
            keep = True
        elif jax.dtypes.canonicalize_dtype(host.dtype) != host.dtype:  # float64 without x64: checked as stored
            given = host
            with np.errstate(over="ignore"):
                host = host.astype(jax.dtypes.canonicalize_dtype(host.dtype))
            n_over = int(np.sum(np.isfinite(given) & ~np.isfinite(host)))
            if n_over:
                raise ValueError(
                    f"{argname} has {n_over} value(s) beyond {host.dtype}'s range: with jax_enable_x64 off, JAX "
                    f"computes {given.dtype} data in {host.dtype}; enable it "
                    f'(jax.config.update("jax_enable_x64", True)) or rescale the data'
                )
        n_bad = int(np.sum(~np.isfinite(host)))
        if n_bad:
            raise ValueError(f"{argname} contains {n_bad} non-finite value(s) (nan or inf)")
        out.append(leaf if keep else jax.device_put(host))
    return jtu.tree_unflatten(treedef, out)


def _per_leaf(value, treedef, argname: str) -> list:
    """One value per data leaf: a leaf broadcast to all, or subtrees at the data's leaf positions.

    Accepted: a scalar or array (broadcast to every data leaf), a pytree with
    exactly the data's structure (one scalar/array-like per data leaf), or,
    for data that is one array, any array-like (a list of numbers). A container
    of another structure (a list for tuple data, a dict for list data, a tuple
    of the wrong length) is ambiguous and rejected.
    """
    if value is None or isinstance(value, bool):
        raise TypeError(f"{argname} must be a positive number or array, got {value!r}")
    if jtu.treedef_is_leaf(jtu.tree_structure(value)):
        return [value] * treedef.num_leaves
    try:
        return treedef.flatten_up_to(value)
    except (ValueError, TypeError):
        raise ValueError(
            f"{argname} is a {type(value).__name__} of structure {jtu.tree_structure(value)}, which does not "
            f"match the data's structure {treedef}: give a scalar, one array (broadcast to every data leaf) "
            f"or a pytree with exactly the data's structure"
        ) from None


def positive_like(value, data, argname: str, *, inverse_square: bool = False, keep_scalars: bool = False):
    """Broadcast a scalar/array/pytree of strictly positive finite numbers to ``data``'s leaves.

    Values are NumPy arrays in the data's real dtype (``float32`` for
    ``float32`` or ``complex64`` data). With ``inverse_square`` (a noise
    standard deviation), ``1 / value**2`` must be finite and non-zero in that
    dtype too. With ``keep_scalars`` a scalar stays a 0-d array (validated
    against the data leaf, not broadcast: no data-sized copy).

    For a data leaf split over processes (:func:`shardvi.parallel.field_array`) the
    value is a scalar (host) or an array split like it; the broadcast and converted
    values are split like the data leaf (each process holds its part only).
    """
    d_leaves, treedef = jtu.tree_flatten(data)
    out = []
    for v, d in zip(_per_leaf(value, treedef, argname), d_leaves):
        if is_global(v):
            out.append(_global_positive(v, d, argname, inverse_square))
            continue
        if v is None or isinstance(v, bool):
            raise TypeError(f"{argname} must be a positive number or array, got {v!r}")
        try:
            host = np.asarray(v)
        except (TypeError, ValueError) as err:
            raise TypeError(f"{argname} must be a positive number or array, got {type(v).__name__}") from err
        if host.dtype.kind not in "iuf" and not jnp.issubdtype(host.dtype, jnp.floating):
            raise TypeError(f"{argname} must be a real number or array, got {type(v).__name__} of dtype {host.dtype}")
        _check_broadcasts(host.shape, tuple(d.shape), argname)
        with np.errstate(over="ignore", invalid="ignore"):
            wide = host.astype(np.float64)
        if not bool(np.all(np.isfinite(wide) & (wide > 0))):
            raise ValueError(f"{argname} must be strictly positive and finite everywhere")
        dtype = jnp.finfo(d.dtype).dtype
        with np.errstate(over="ignore", under="ignore"):
            host = host.astype(dtype)
        if not bool(np.all(np.isfinite(host) & (host >= jnp.finfo(dtype).tiny))):  # subnormals flush to 0 on XLA
            raise ValueError(
                f"{argname} is not representable in the data's dtype {np.dtype(dtype).name} "
                f"(it overflows or underflows; range {jnp.finfo(dtype).tiny:.3g} to "
                f"{jnp.finfo(dtype).max:.3g})"
            )
        if inverse_square:
            _check_inverse_square(host, argname)
        if keep_scalars and host.ndim == 0:
            out.append(host)
            continue
        host = np.broadcast_to(host, d.shape)
        if is_global(d):  # split like the data: each process makes its part of the broadcast
            host = jax.make_array_from_callback(d.shape, d.sharding, lambda index, h=host: np.asarray(h[index]))
        out.append(host)
    return jtu.tree_unflatten(treedef, out)


def _check_broadcasts(shape: tuple, data_shape: tuple, argname: str) -> None:
    """``ValueError`` unless an array of ``shape`` broadcasts to ``data_shape`` (one value per datum)."""
    try:
        fits = np.broadcast_shapes(shape, data_shape) == data_shape
    except ValueError:
        fits = False
    if fits:
        return
    hint = ""
    if len(data_shape) and shape == data_shape + data_shape:
        hint = (
            " (one value per datum: the diagonal of the noise; for a dense noise covariance pass callables, "
            "noise_cov_inv=lambda r: ... with noise_std_inv)"
        )
    raise ValueError(f"{argname} has shape {shape}, which does not broadcast to the data shape {data_shape}{hint}")


def _global_positive(v, d, argname: str, inverse_square: bool):
    """:func:`positive_like` of an array ``v`` split over processes: the data leaf's shape and split."""
    if not is_global(d) or v.shape != d.shape or v.sharding != d.sharding:
        raise ValueError(
            f"{argname} is an array split over processes (shape {v.shape}): it must have the data's shape "
            f"{d.shape} and be split like the data (sv.parallel.field_array with the same strategy)"
        )
    if not (jnp.issubdtype(v.dtype, jnp.integer) or jnp.issubdtype(v.dtype, jnp.floating)):
        raise TypeError(f"{argname} must be a real number or array, got dtype {v.dtype}")
    dtype = jnp.finfo(d.dtype).dtype
    v = jax.jit(lambda a: a.astype(dtype))(v)
    tiny = jnp.finfo(dtype).tiny
    if not all_true(lambda a: (a >= tiny) & (a < np.inf), v):
        raise ValueError(
            f"{argname} must be strictly positive and finite everywhere, a normal number of {np.dtype(dtype).name} "
            f"(at least {tiny:.3g})"
        )
    if inverse_square and not all_true(lambda a: ((1 / a) ** 2 > 0) & ((1 / a) ** 2 < np.inf), v):
        raise ValueError(
            f"{argname} is so small (or so large) that 1/{argname}**2 overflows (or underflows to 0) in "
            f"{np.dtype(dtype).name}"
        )
    return v


def _check_inverse_square(host, argname: str) -> None:
    """``1 / host**2`` finite and non-zero in ``host``'s dtype (the precision of a noise std)."""
    with np.errstate(over="ignore", under="ignore", divide="ignore"):
        inv = np.reciprocal(host)
        inv2 = inv * inv
    dtype = np.dtype(host.dtype)
    lo = float(np.sqrt(np.float64(1.0) / np.float64(jnp.finfo(dtype).max)))
    if not bool(np.all(np.isfinite(inv2))):
        raise ValueError(
            f"{argname} is so small that 1/{argname}**2 overflows {dtype.name} (smallest "
            f"{argname} {float(np.min(host)):.3g}; it must be above about {lo:.3g} in {dtype.name})"
        )
    if not bool(np.all(inv2 > 0)):
        raise ValueError(
            f"{argname} is so large that 1/{argname}**2 underflows to 0 in {dtype.name} "
            f"(largest {argname} {float(np.max(host)):.3g})"
        )


def to_device(tree):
    """NumPy leaves as JAX arrays (one transfer each, no compilation, no staging copy); JAX arrays kept."""
    return jtu.tree_map(lambda x: x if isinstance(x, jax.Array) else jax.device_put(x), tree)


def domain_of(data):
    """ShapeDtypeStruct pytree of ``data``."""
    return jtu.tree_map(lambda x: jax.ShapeDtypeStruct(x.shape, x.dtype), data)
