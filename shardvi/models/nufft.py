"""2-D non-uniform FFTs on jax-finufft with transformation rules that compose.

jax-finufft 1.3.1 has a broken ``vmap`` rule on jax 0.10 (``batching.not_mapped`` was
removed) and its abstract evaluation drops the shard_map "varying" mark of the points, so
gradients w.r.t. a replicated image under ``shard_map(check_vma=True)`` come out wrong.
This module therefore wraps the two transforms in its own primitives:

* ``nufft2d_type2(f, x, y)``: ``c_j = sum_k f_k exp(iflag i (k1 x_j + k2 y_j))``, uniform
  modes -> non-uniform points;
* ``nufft2d_type1(c, x, y, shape)``: ``f_k = sum_j c_j exp(iflag i (k1 x_j + k2 y_j))``,
  non-uniform points -> uniform modes;

with the centred mode convention ``k = -(n // 2), ..., (n - 1) // 2`` (array index
``p`` holds ``k = p - n // 2``). Both are linear in their first argument and are each
other's (bilinear, un-conjugated) transposes, which is what JAX's reverse mode needs. The
rules are defined here, not taken from jax-finufft: JVP = the same transform of the
tangent, transpose = the other type with the same ``iflag``, batching = finufft's native
multi-transform (batch folded into a leading axis, one plan for all), and every bind
first :func:`match_vma`-casts its operands to a common set of varying manual axes. The
points are constants for differentiation (their tangents are ignored).
"""

from __future__ import annotations

import math

import jax
import jax.numpy as jnp
import numpy as np
from jax.extend.core import Primitive
from jax.interpreters import ad, batching, mlir

from .model import as_shape

__all__ = ["nufft2d_type1", "nufft2d_type2", "match_vma", "complex_dtype_for"]

_COMPLEX_OF = {np.dtype(np.float32): np.dtype(np.complex64), np.dtype(np.float64): np.dtype(np.complex128)}


def complex_dtype_for(real_dtype) -> np.dtype:
    """complex64 for float32, complex128 for float64; TypeError otherwise."""
    dt = np.dtype(real_dtype)
    if dt not in _COMPLEX_OF:
        raise TypeError(f"NUFFT supports float32 or float64 points, got {dt}")
    return _COMPLEX_OF[dt]


# ----------------------------------------------------------------------------- vma helpers
def _varying_axes(x) -> frozenset:
    aval = jax.typeof(x)
    vma = getattr(aval, "vma", None)
    if vma is None:  # jax >= 0.10 keeps it in the manual-axis type
        vma = getattr(getattr(aval, "manual_axis_type", None), "varying", ())
    return frozenset(vma)


def match_vma(*xs):
    """Cast arrays to the union of their varying manual axes (``jax.lax.pcast``).

    Inside ``jax.shard_map(..., check_vma=True)`` a replicated operand combined with a
    sharded one must be marked varying before it enters a custom call, or JAX mistypes the
    result and differentiates it wrongly. Outside shard_map (or with ``check_vma=False``)
    this is the identity.

    Returns
    -------
    tuple
        The inputs, each cast to ``to='varying'`` over the axes it was missing.
    """
    axes = [_varying_axes(x) for x in xs]
    union = frozenset().union(*axes)
    if not union:
        return tuple(xs)
    return tuple(jax.lax.pcast(x, tuple(sorted(union - a)), to="varying") if union - a else x for x, a in zip(xs, axes))


# ----------------------------------------------------------------------------- raw calls
def _fold(a, n_core):
    """Fold the leading batch axes of ``a`` (all but the last ``n_core``) into one."""
    batch = a.shape[: a.ndim - n_core]
    if len(batch) == 1:
        return batch, a
    return batch, a.reshape((math.prod(batch),) + a.shape[a.ndim - n_core :])


def _fold_points(p):
    return p if p.ndim <= 2 else p.reshape((-1, p.shape[-1]))


def _reproducible_opts():
    """finufft options that make a transform's bits independent of the threads it runs with.

    By default finufft picks its thread count, spreading order and upsampling factor at run
    time (``nthreads=0``, heuristic sorting, ``upsampfac=0``): with several devices computing at
    once in one process, the same transform then gave results ~1e-8 apart (type 1 spreads
    with atomic adds in thread order). One thread, sorted spreading and a fixed upsampling
    factor give the same bits whatever runs beside it; the devices provide the parallelism.
    """
    from jax_finufft.options import Opts, SpreadSort, SpreadThread

    return Opts(nthreads=1, spread_sort=SpreadSort.Sort, spread_thread=SpreadThread.Sequential, upsampfac=2.0)


def _finufft1(*args, **kwargs):
    from jax_finufft import nufft1  # on first use: importing shardvi does not load jax-finufft

    return nufft1(*args, **kwargs, opts=_reproducible_opts())


def _finufft2(*args, **kwargs):
    from jax_finufft import nufft2

    return nufft2(*args, **kwargs, opts=_reproducible_opts())


def _impl_type2(f, x, y, *, iflag, eps):
    if f.ndim == 2:
        return _finufft2(f, x, y, iflag=iflag, eps=eps)
    batch, fb = _fold(f, 2)
    out = _finufft2(fb, _fold_points(x), _fold_points(y), iflag=iflag, eps=eps)
    return out.reshape(batch + x.shape[-1:])


def _impl_type1(c, x, y, *, shape, iflag, eps):
    if c.ndim == 1:
        return _finufft1(shape, c, x, y, iflag=iflag, eps=eps)
    batch, cb = _fold(c, 1)
    out = _finufft1(shape, cb, _fold_points(x), _fold_points(y), iflag=iflag, eps=eps)
    return out.reshape(batch + tuple(shape))


# ----------------------------------------------------------------------------- primitives
_type2_p = Primitive("shardvi_nufft2d_type2")
_type1_p = Primitive("shardvi_nufft2d_type1")


def _bind_type2(f, x, y, *, iflag, eps):
    f, x, y = match_vma(f, x, y)
    return _type2_p.bind(f, x, y, iflag=iflag, eps=eps)


def _bind_type1(c, x, y, *, shape, iflag, eps):
    c, x, y = match_vma(c, x, y)
    return _type1_p.bind(c, x, y, shape=tuple(shape), iflag=iflag, eps=eps)


def _abstract_type2(f, x, y, *, iflag, eps):
    del iflag, eps
    return f.update(shape=f.shape[:-2] + x.shape[-1:], dtype=f.dtype)


def _abstract_type1(c, x, y, *, shape, iflag, eps):
    del iflag, eps
    return c.update(shape=c.shape[:-1] + tuple(shape), dtype=c.dtype)


def _transpose_type2(ct, f, x, y, *, iflag, eps):
    assert ad.is_undefined_primal(f) and not ad.is_undefined_primal(x)
    if type(ct) is ad.Zero:
        return None, None, None
    return _bind_type1(ct, x, y, shape=f.aval.shape[-2:], iflag=iflag, eps=eps), None, None


def _transpose_type1(ct, c, x, y, *, shape, iflag, eps):
    assert ad.is_undefined_primal(c) and not ad.is_undefined_primal(x)
    if type(ct) is ad.Zero:
        return None, None, None
    return _bind_type2(ct, x, y, iflag=iflag, eps=eps), None, None


def _move_front(a, d, n):
    return jnp.broadcast_to(a, (n,) + a.shape) if d is None else jnp.moveaxis(a, d, 0)


def _points_to(p, d, batch):
    """Points with batch axis ``d`` (or none) -> shape ``batch + (M,)``."""
    p = p[None] if d is None else jnp.moveaxis(p, d, 0)
    if p.ndim < len(batch) + 1:  # only the new axis is batched: insert the inner ones
        p = p.reshape(p.shape[:1] + (1,) * (len(batch) + 1 - p.ndim) + p.shape[1:])
    return jnp.broadcast_to(p, batch + p.shape[-1:])


def _batch_rule(bind, n_core):
    def rule(args, dims, **params):
        src, x, y = args
        ds, dx, dy = dims
        n = next(a.shape[d] for a, d in zip(args, dims) if d is not None)
        src = _move_front(src, ds, n)
        if dx is None and dy is None and x.ndim == 1 and y.ndim == 1:
            return bind(src, x, y, **params), 0  # native multi-transform, one plan
        batch = src.shape[: src.ndim - n_core]
        return bind(src, _points_to(x, dx, batch), _points_to(y, dy, batch), **params), 0

    return rule


_type2_p.def_impl(_impl_type2)
_type1_p.def_impl(_impl_type1)
_type2_p.def_abstract_eval(_abstract_type2)
_type1_p.def_abstract_eval(_abstract_type1)
mlir.register_lowering(_type2_p, mlir.lower_fun(_impl_type2, multiple_results=False))
mlir.register_lowering(_type1_p, mlir.lower_fun(_impl_type1, multiple_results=False))
# Linear in the source; the points' tangents are ignored (None rules).
ad.defjvp(_type2_p, lambda g, f, x, y, **kw: _bind_type2(g, x, y, **kw), None, None)
ad.defjvp(_type1_p, lambda g, c, x, y, **kw: _bind_type1(g, x, y, **kw), None, None)
ad.primitive_transposes[_type2_p] = _transpose_type2
ad.primitive_transposes[_type1_p] = _transpose_type1
batching.primitive_batchers[_type2_p] = _batch_rule(_bind_type2, 2)
batching.primitive_batchers[_type1_p] = _batch_rule(_bind_type1, 1)


# ----------------------------------------------------------------------------- public API
def _check_eps(eps) -> float:
    if isinstance(eps, bool) or not isinstance(eps, (int, float, np.floating, np.integer)):
        raise TypeError(f"eps must be a real number, got {type(eps).__name__}")
    eps = float(eps)
    if not (0.0 < eps < 1.0):
        raise ValueError(f"eps must lie in (0, 1), got {eps}")
    return eps


def _check_iflag(iflag) -> int:
    if iflag not in (-1, 1):
        raise ValueError(f"iflag must be -1 or +1, got {iflag!r}")
    return int(iflag)


def _check_points(x, y, complex_dtype, src_name: str):
    """Validate the point arrays against the source's complex dtype."""
    x, y = jnp.asarray(x), jnp.asarray(y)
    if x.shape != y.shape:
        raise ValueError(f"x and y must have the same shape, got x {x.shape} and y {y.shape}")
    if x.ndim != 1:
        raise ValueError(f"x and y must be 1-D arrays of points, got shape {x.shape}")
    want = np.dtype(np.float32 if complex_dtype == np.complex64 else np.float64)
    for name, p in (("x", x), ("y", y)):
        if p.dtype != want:
            raise TypeError(
                f"{name} has dtype {p.dtype}, but {src_name} is {complex_dtype}: "
                f"jax-finufft needs {want} points for a {complex_dtype} source"
            )
    return jax.lax.stop_gradient(x), jax.lax.stop_gradient(y)


def _check_source(a, name: str, ndim: int):
    a = jnp.asarray(a)
    if a.dtype not in (np.complex64, np.complex128):
        raise TypeError(f"{name} must be complex64 or complex128, got {a.dtype}")
    if a.ndim != ndim:
        raise ValueError(f"{name} must be {ndim}-D, got shape {a.shape}")
    return a


def nufft2d_type2(f, x, y, *, iflag: int = -1, eps: float = 1e-9):
    """Uniform -> non-uniform: ``c_j = sum_k f_k exp(iflag i (k1 x_j + k2 y_j))``.

    Parameters
    ----------
    f : complex array, shape (n1, n2)
        Mode coefficients; ``f[p, q]`` holds ``k = (p - n1 // 2, q - n2 // 2)``.
    x, y : real arrays, shape (M,)
        Points in radians (any real value; the sum is 2π-periodic in them). float32 with
        complex64, float64 with complex128.
    iflag : {-1, +1}
        Sign of the exponent.
    eps : float in (0, 1)
        Requested relative accuracy (finufft tolerance).

    Returns
    -------
    complex array, shape (M,)
    """
    f = _check_source(f, "f", 2)
    x, y = _check_points(x, y, f.dtype, "f")
    return _bind_type2(f, x, y, iflag=_check_iflag(iflag), eps=_check_eps(eps))


def nufft2d_type1(c, x, y, shape, *, iflag: int = -1, eps: float = 1e-9):
    """Non-uniform -> uniform: ``f_k = sum_j c_j exp(iflag i (k1 x_j + k2 y_j))``.

    The exact (un-conjugated) transpose of :func:`nufft2d_type2` with the same ``iflag``.

    Parameters
    ----------
    c : complex array, shape (M,)
    x, y : real arrays, shape (M,)
    shape : (int, int)
        Number of modes ``(n1, n2)``; centred convention as in :func:`nufft2d_type2`.
    iflag, eps
        As in :func:`nufft2d_type2`.

    Returns
    -------
    complex array, shape (n1, n2)
    """
    c = _check_source(c, "c", 1)
    x, y = _check_points(x, y, c.dtype, "c")
    if c.shape != x.shape:
        raise ValueError(f"c has shape {c.shape}, but there are {x.shape[0]} points")
    shape = _check_shape(shape, "shape")
    return _bind_type1(c, x, y, shape=shape, iflag=_check_iflag(iflag), eps=_check_eps(eps))


def _check_shape(shape, name: str) -> tuple[int, int]:
    """A pair of positive ints (Python or NumPy); ``TypeError`` for floats or bools, ``ValueError`` otherwise."""
    out = as_shape(shape, name, minimum=1)
    if len(out) != 2:
        raise ValueError(f"{name} must be two positive ints, got {out}")
    return out  # pyright: ignore[reportReturnType] -- two entries, checked above
