"""Instrument responses: masks, point sampling, and a radio-interferometric NUFFT.

Each response is a :class:`~shardvi.Module` (its index arrays and uv points are pytree leaves) and a
linear map ``R`` with ``R(field)`` and an exact adjoint
``R.adjoint(data)`` with respect to the real inner products ``<a, b> = sum(a * b)`` on
real arrays and ``Re sum(conj(a) * b)`` on complex ones. All are pure JAX and compose with
``jit``, ``vmap``, ``grad``/``vjp``/``jvp`` and ``shard_map``.
"""

from __future__ import annotations

import contextlib
import contextvars
import math
from dataclasses import dataclass, field

import jax
import jax.core
import jax.numpy as jnp
import numpy as np

from ..module import Module
from .model import as_shape
from .nufft import _check_eps, _check_shape, complex_dtype_for, match_vma, nufft2d_type1, nufft2d_type2

__all__ = ["Mask", "Sampling", "NUFFTResponse", "match_vma"]


# ----------------------------------------------------------------------------- field parallelism
# A likelihood amended with ``field_blocks`` holds the data of a pixel-wise response (Mask, Sampling) on the
# grid: it finds the response by tracing the model while recording (pixel_responses_recorded), and traces the
# model's per-device work with the device's rows of the observed pixels (pixels_on_grid), under which the
# response returns its input where a pixel is observed and 1 elsewhere (the likelihood ignores those entries).
_RECORDED: contextvars.ContextVar[list | None] = contextvars.ContextVar("shardvi_pixel_responses", default=None)
_ON_GRID: contextvars.ContextVar = contextvars.ContextVar("shardvi_pixels_on_grid", default=None)

#: the value a pixel-wise response outputs at unobserved pixels while its data are held on the grid
UNOBSERVED = 1.0


@contextlib.contextmanager
def pixel_responses_recorded():
    """Collect the pixel-wise responses (:class:`Mask`, :class:`Sampling`) called in the enclosed code."""
    found: list = []
    token = _RECORDED.set(found)
    try:
        yield found
    finally:
        _RECORDED.reset(token)


@contextlib.contextmanager
def pixels_on_grid(observed):
    """Trace the enclosed model with its pixel-wise response on the grid: ``where(observed, field, 1)``.

    ``observed``: boolean, the shape of the field the response receives (a device's rows of the grid).
    """
    token = _ON_GRID.set(observed)
    try:
        yield
    finally:
        _ON_GRID.reset(token)


def _pixel_response(response, values):
    """The response's output on the grid when :func:`pixels_on_grid` is active, else ``None``."""
    found = _RECORDED.get()
    if found is not None:
        found.append(response)
    observed = _ON_GRID.get()
    if observed is None:
        return None
    values = jnp.asarray(values)
    if values.shape != observed.shape:
        raise ValueError(
            f"a {type(response).__name__} in a model split over the field received shape {values.shape}, expected "
            f"this device's rows of the grid {observed.shape}: apply it to the field (the output of the correlated "
            f"field or element-wise functions of it)"
        )
    return jnp.where(observed, values, jnp.asarray(UNOBSERVED, values.dtype))


# ----------------------------------------------------------------------------- gather
def _concrete(value, argname: str, owner: str) -> None:
    """``TypeError`` where ``value`` holds traced arrays: a response's pixels are fixed when it is built."""
    if any(isinstance(x, jax.core.Tracer) for x in jax.tree_util.tree_leaves(value)):
        raise TypeError(
            f"{owner}: {argname} is traced (built inside jax.jit, vmap or grad); its pixels are fixed when it is "
            f"built: build it from concrete (NumPy or JAX) arrays outside JAX transformations"
        )


def _index_array(flat: np.ndarray) -> np.ndarray:
    return flat.astype(np.int32 if flat.size == 0 or flat.max() < 2**31 - 1 else np.int64)


def _gather(values, flat, shape, name: str):
    values = jnp.asarray(values)
    if values.shape != shape:
        raise ValueError(f"{name} has shape {values.shape}, expected {shape}")
    return jnp.ravel(values)[flat]


def _scatter(data, flat, shape, data_shape, name: str):
    data = jnp.asarray(data)
    if data.shape != data_shape:
        raise ValueError(f"{name} has shape {data.shape}, expected {data_shape}")
    out = jnp.zeros(math.prod(shape), data.dtype).at[flat].add(jnp.ravel(data))
    return out.reshape(shape)


@dataclass(frozen=True, eq=False)
class Mask(Module):
    """Keep the pixels where ``mask`` is True.

    Parameters
    ----------
    mask : bool array, shape ``S``
        True marks an observed pixel.

    Notes
    -----
    ``R(field)`` has shape ``(n,)`` with ``n = mask.sum()``, in C (row-major) order;
    ``R.adjoint(data)`` scatters back into shape ``S`` with zeros elsewhere.
    """

    mask: np.ndarray
    _flat: np.ndarray = field(init=False, repr=False)

    def __post_init__(self):
        _concrete(self.mask, "mask", "Mask")
        m = np.asarray(self.mask)
        if m.dtype != np.bool_:
            raise ValueError(f"mask must be a boolean array, got dtype {m.dtype}")
        if m.ndim == 0:
            raise ValueError("mask must have at least one dimension, got a scalar")
        m = m.copy()
        m.setflags(write=False)
        object.__setattr__(self, "mask", m)
        object.__setattr__(self, "_flat", _index_array(np.flatnonzero(m)))

    @property
    def shape(self) -> tuple[int, ...]:
        """Field shape ``S``."""
        return self.mask.shape

    @property
    def size(self) -> int:
        """Number of kept pixels ``n``."""
        return int(self._flat.size)

    def __call__(self, field):
        """Field, shape ``S`` -> kept values, shape ``(n,)``."""
        on_grid = _pixel_response(self, field)
        if on_grid is not None:
            return on_grid
        return _gather(field, self._flat, self.shape, "field")

    def pixel_indices(self) -> np.ndarray:
        """Flat (C-order) index into the field of each output entry, shape ``(n,)``."""
        return np.asarray(self._flat)

    def adjoint(self, data):
        """Values, shape ``(n,)`` -> field, shape ``S``, zero where masked."""
        return _scatter(data, self._flat, self.shape, (self.size,), "data")


@dataclass(frozen=True, eq=False)
class Sampling(Module):
    """Read a field at integer pixel positions (a gather); the adjoint scatter-adds.

    Parameters
    ----------
    indices : sequence of ``len(shape)`` integer arrays, common shape ``K``
        Pixel index along each axis, as returned by ``np.nonzero``; repeats allowed.
    shape : int or tuple of int
        Field shape ``S`` (Python or NumPy integers, each >= 1).

    Notes
    -----
    ``R(field)[k] = field[indices[0][k], indices[1][k], ...]``, shape ``K``; the adjoint
    sums data falling on the same pixel.
    """

    indices: tuple
    shape: tuple
    _flat: np.ndarray = field(init=False, repr=False)

    def __post_init__(self):
        shape = as_shape(self.shape, "shape", minimum=1)
        if not shape:
            raise ValueError(f"shape must be non-empty positive ints, got {shape}")
        idx = self.indices
        _concrete(idx, "indices", "Sampling")
        if isinstance(idx, (np.ndarray, jax.Array)):
            idx = list(idx)
        idx = tuple(np.asarray(i) for i in idx)
        if len(idx) != len(shape):
            raise ValueError(f"indices must hold one array per axis ({len(shape)}), got {len(idx)}")
        if any(not np.issubdtype(i.dtype, np.integer) for i in idx):
            raise ValueError(f"indices must be integer arrays, got {[str(i.dtype) for i in idx]}")
        if len({i.shape for i in idx}) != 1:
            raise ValueError(f"indices must share one shape, got {[i.shape for i in idx]}")
        for ax, (i, s) in enumerate(zip(idx, shape)):
            if i.size and (i.min() < 0 or i.max() >= s):
                raise ValueError(f"indices[{ax}] out of range [0, {s}): min {i.min()}, max {i.max()}")
        for i in idx:
            i.setflags(write=False)
        object.__setattr__(self, "indices", idx)
        object.__setattr__(self, "shape", shape)
        object.__setattr__(self, "_flat", _index_array(np.ravel_multi_index(idx, shape).reshape(idx[0].shape)))

    @property
    def data_shape(self) -> tuple[int, ...]:
        """Output shape ``K``."""
        return self._flat.shape

    def __call__(self, field):
        """Field, shape ``S`` -> samples, shape ``K``."""
        on_grid = _pixel_response(self, field)
        if on_grid is not None:
            return on_grid
        return _gather(field, self._flat, self.shape, "field")

    def pixel_indices(self) -> np.ndarray:
        """Flat (C-order) index into the field of each output entry, shape ``K``."""
        return np.asarray(self._flat)

    def adjoint(self, data):
        """Samples, shape ``K`` -> field, shape ``S`` (repeats summed)."""
        return _scatter(data, self._flat.ravel(), self.shape, self.data_shape, "data")


# ----------------------------------------------------------------------------- radio NUFFT
def _check_real_dtype(dtype) -> np.dtype:
    try:
        dt = np.dtype(dtype)
    except TypeError:
        raise TypeError(f"dtype must be float32 or float64, got {dtype!r}") from None
    if dt not in (np.float32, np.float64):
        raise TypeError(f"dtype must be float32 or float64, got {dt}")
    if dt == np.float64 and not jax.config.jax_enable_x64:  # pyright: ignore[reportAttributeAccessIssue] -- a runtime flag
        raise ValueError("dtype=float64 needs jax_enable_x64; enable it or use float32")
    return dt


def _array_like(a, dtype=None):
    """``a`` itself when it is an array (NumPy, JAX, traced), else ``np.asarray(a, dtype)`` (a list of numbers)."""
    if hasattr(a, "dtype") and hasattr(a, "shape"):
        return a
    try:
        return np.asarray(a, dtype)
    except (TypeError, ValueError) as err:
        raise TypeError(f"expected a real 1-D array, got {type(a).__name__}: {err}") from None


def _check_uv(u, v, dtype):
    u, v = _array_like(u), _array_like(v)
    for name, a in (("u", u), ("v", v)):
        if np.iscomplexobj(a) or not np.issubdtype(a.dtype, np.number):
            raise TypeError(f"{name} must be a real array (wavelengths), got dtype {a.dtype}")
    u, v = jnp.asarray(u, dtype), jnp.asarray(v, dtype)
    if u.ndim != 1:
        raise ValueError(f"u must be 1-D, got shape {u.shape}")
    if u.shape != v.shape:
        raise ValueError(f"u and v must have the same shape, got u {u.shape} and v {v.shape}")
    if not isinstance(u, jax.core.Tracer) and not isinstance(v, jax.core.Tracer):
        if not (bool(jnp.all(jnp.isfinite(u))) and bool(jnp.all(jnp.isfinite(v)))):
            raise ValueError("u and v must be finite")
    return u, v


def _check_pixel_size(pixel_size) -> tuple[float, float]:
    ps = np.atleast_1d(np.asarray(pixel_size, dtype=float))
    if ps.shape == (1,):
        ps = np.repeat(ps, 2)
    if ps.shape != (2,) or not np.all(np.isfinite(ps)) or np.any(ps <= 0):
        raise ValueError(f"pixel_size must be a positive finite float or pair (radians), got {pixel_size!r}")
    return float(ps[0]), float(ps[1])


def _check_block_points(inputs, dtype) -> dict:
    """``inputs`` of a per-block call checked: a mapping with 1-D ``u`` and ``v`` of one length and the response's
    dtype (lists of numbers are taken as arrays of it); returns ``{"u": u, "v": v}``."""
    if not (hasattr(inputs, "keys") and "u" in inputs and "v" in inputs):
        raise TypeError(
            f"inputs must be a mapping with 'u' and 'v' (a block of data_inputs), got {type(inputs).__name__}"
        )
    u, v = _array_like(inputs["u"], dtype), _array_like(inputs["v"], dtype)
    if np.ndim(u) != 1 or np.shape(u) != np.shape(v):
        raise ValueError(f"inputs 'u' and 'v' must be 1-D of one length, got shapes {np.shape(u)} and {np.shape(v)}")
    if np.dtype(u.dtype) != dtype or np.dtype(v.dtype) != dtype:
        raise TypeError(f"inputs 'u' and 'v' must be {dtype} (the response's dtype), got {u.dtype} and {v.dtype}")
    return {"u": u, "v": v}


def _wrap(phase):
    """Reduce radians to [-pi, pi): exact for the 2pi-periodic sum, keeps finufft in range."""
    two_pi = 2 * np.pi
    return phase - two_pi * jnp.round(phase / two_pi)


@dataclass(frozen=True, eq=False)
class NUFFTResponse(Module):
    """Radio-interferometric measurement of a real image, via jax-finufft.

    ``V_j = sum_{p,q} I[p, q] exp(-2 pi i (u_j l_p + v_j m_q))`` with
    ``l_p = (p - nx // 2) * dl`` and ``m_q = (q - ny // 2) * dm`` (pixel grid centred on
    ``(l, m) = (0, 0)`` at index ``(nx // 2, ny // 2)``; axis 0 is ``l``/``u``). Flat sky:
    no w-term, no primary beam. The adjoint is the dirty image
    ``D[p, q] = Re sum_j V_j exp(+2 pi i (u_j l_p + v_j m_q))``.

    Parameters
    ----------
    u, v : real arrays, shape (M,)
        Baseline coordinates in wavelengths.
    image_shape : (int, int)
        ``(nx, ny)`` pixels.
    pixel_size : float or (float, float)
        Pixel size ``(dl, dm)`` in radians (direction cosines).
    eps : float in (0, 1), keyword-only
        NUFFT relative accuracy (finufft tolerance); clamped by finufft near the
        precision's machine epsilon.
    dtype : float32 or float64, keyword-only
        Precision: images are ``dtype``, visibilities complex64 or complex128.

    Notes
    -----
    A pytree whose leaves are ``u`` and ``v`` (everything else is static), so it can be
    passed into ``jax.shard_map`` with ``in_specs=P('s')`` to shard the visibilities while
    the image stays replicated; the replicated image is cast to varying internally
    (:func:`match_vma`), so gradients w.r.t. it are correct under ``check_vma=True``.
    ``u`` and ``v`` are not differentiable (treated as constants).
    """

    u: jax.Array
    v: jax.Array
    image_shape: tuple
    pixel_size: tuple
    eps: float = field(default=1e-9, kw_only=True)
    dtype: np.dtype = field(default=np.float64, kw_only=True)  # pyright: ignore[reportAssignmentType] -- __post_init__

    def __post_init__(self):
        dt = _check_real_dtype(self.dtype)
        u, v = _check_uv(self.u, self.v, dt)
        object.__setattr__(self, "dtype", dt)
        object.__setattr__(self, "u", u)
        object.__setattr__(self, "v", v)
        object.__setattr__(self, "image_shape", _check_shape(self.image_shape, "image_shape"))
        object.__setattr__(self, "pixel_size", _check_pixel_size(self.pixel_size))
        object.__setattr__(self, "eps", _check_eps(self.eps))

    @property
    def complex_dtype(self) -> np.dtype:
        """complex64 or complex128, matching ``dtype``."""
        return complex_dtype_for(self.dtype)

    @property
    def n_vis(self) -> int:
        """Number of visibilities ``M`` (local count inside shard_map)."""
        return int(np.shape(self.u)[0])

    @property
    def domain(self) -> jax.ShapeDtypeStruct:
        """Image shape and dtype."""
        return jax.ShapeDtypeStruct(self.image_shape, self.dtype)

    @property
    def target(self) -> jax.ShapeDtypeStruct:
        """Visibility shape and dtype."""
        return jax.ShapeDtypeStruct((self.n_vis,), self.complex_dtype)

    def _points(self, inputs=None):
        dl, dm = self.pixel_size
        u, v = (self.u, self.v) if inputs is None else (inputs["u"], inputs["v"])
        return _wrap(2 * np.pi * dl * u), _wrap(2 * np.pi * dm * v)

    @property
    def data_inputs(self) -> dict:
        """``{"u": u, "v": v}``: the per-visibility inputs, for ``sv.Model(..., data_inputs=...)``."""
        return {"u": self.u, "v": self.v}

    def without_points(self) -> NUFFTResponse:
        """This response with no baselines (``u``, ``v`` of length 0), a template for per-block calls.

        A blocked forward model (``Model(call, domain, data_inputs=response.data_inputs)``)
        should hold this template, not the response: the model's arrays are replicated on
        every device, the visibilities' coordinates are split with the data.
        """
        empty = np.zeros((0,), self.dtype)
        return self._replaced(u=empty, v=empty)

    def __call__(self, image, inputs=None):
        """Image, real ``dtype``, shape ``(nx, ny)`` -> visibilities, complex, shape ``(M,)``.

        ``inputs`` (optional): ``{"u": u, "v": v}`` of a block of baselines to evaluate
        instead of this response's own (same units), e.g. one data block of a model built
        with ``data_inputs=response.data_inputs``.
        """
        image = jnp.asarray(image)
        if image.ndim != 2:
            raise ValueError(f"image must be 2-D with shape {self.image_shape}, got shape {image.shape}")
        if image.shape != self.image_shape:
            raise ValueError(f"image has shape {image.shape}, expected {self.image_shape}")
        if image.dtype != self.dtype:
            raise TypeError(
                f"image has dtype {image.dtype}, but the response is {self.dtype}; "
                f"cast it with image.astype({self.dtype.name!r})"
            )
        if inputs is not None:
            inputs = _check_block_points(inputs, self.dtype)
        x, y = self._points(inputs)
        return nufft2d_type2(image.astype(self.complex_dtype), x, y, iflag=-1, eps=self.eps)

    def adjoint(self, vis):
        """Visibilities, complex, shape ``(M,)`` -> dirty image, real ``dtype``, shape ``(nx, ny)``."""
        vis = jnp.asarray(vis)
        if vis.dtype != self.complex_dtype:
            raise TypeError(f"vis has dtype {vis.dtype}, expected {self.complex_dtype}")
        if vis.shape != (self.n_vis,):
            raise ValueError(f"vis has shape {vis.shape}, expected ({self.n_vis},)")
        x, y = self._points()
        return jnp.real(nufft2d_type1(vis, x, y, self.image_shape, iflag=1, eps=self.eps))
