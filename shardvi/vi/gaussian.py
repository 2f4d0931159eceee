"""Gaussian likelihood with known noise."""

from __future__ import annotations

import math
from collections.abc import Callable

import jax
import jax.numpy as jnp
import numpy as np
from jax import tree_util as jtu

from .. import tree_math as tm
from ._checks import domain_of, finite_data, is_global, positive_like, to_device
from .likelihood import Likelihood
from .normalization import LOG_2PI, summed_over_data

__all__ = ["Gaussian"]


class Gaussian(Likelihood):
    """Gaussian likelihood ``H(s) = (d - s)^T N^{-1} (d - s) / 2``.

    Parameters
    ----------
    data : array or pytree of arrays
        Measured data ``d`` (real or complex; complex entries have independent
        real and imaginary noise of the given std).
    noise_std : float, array or pytree, optional
        Diagonal noise standard deviation, same units as ``d``; broadcast to the
        data shape. Strictly positive, with ``1/noise_std**2`` finite and
        non-zero in the data's dtype. A scalar or array applies to every data
        leaf; a pytree must have exactly the data's structure (a list of
        numbers is an array only for data that is one array: containers of
        another structure are rejected as ambiguous).
    noise_cov_inv : float, array, pytree or callable, optional
        Inverse noise covariance ``N^{-1}``: a diagonal (positive numbers, same
        structure rules as ``noise_std``) or a linear map ``r -> N^{-1} r``. A
        callable needs ``noise_std_inv`` (``r -> N^{-1/2} r``, self-adjoint)
        for sampling. Give exactly one of ``noise_std`` and ``noise_cov_inv``.
    noise_std_inv : callable, optional, keyword-only
        ``r -> N^{-1/2} r`` (self-adjoint), required with a callable ``noise_cov_inv``
        and only with it. Both callables are checked when the likelihood is built:
        traced on the data's shapes (they must return the data's structure, shapes
        and dtypes) and, for data held by this process, applied to two random
        residuals ``u, v``, where ``N^{-1}`` and ``N^{-1/2}`` must be self-adjoint
        and ``<N^{-1/2} u, N^{-1/2} v> = <u, N^{-1} v>``, to a relative ``1e-6``
        (``1e-3`` for single-precision data).
    noise_log_det : float, optional, keyword-only
        ``log det N`` (over the data's real components) for a callable
        ``noise_cov_inv``: only the :meth:`normalization` (the evidence) needs
        it. A diagonal noise knows its own.

    Attributes
    ----------
    data : pytree of jax.Array
        ``d`` (a pytree leaf, like the noise arrays below).
    noise_std, inv_std : pytree of jax.Array or None
        ``noise_std`` and ``1 / noise_std`` (given ``noise_std``): broadcast to
        the data shape, except that a scalar stays a 0-d array (no data-sized
        copies of one number).
    noise_cov_inv, sqrt_noise_cov_inv : pytree of jax.Array, callable or None
        The diagonal ``N^{-1}`` and its square root (the same shapes), or the callables.
    """

    def __init__(
        self,
        data,
        noise_std=None,
        noise_cov_inv=None,
        *,
        noise_std_inv: Callable | None = None,
        noise_log_det: float | None = None,
    ):
        d = finite_data(data, "data")
        if (noise_std is None) == (noise_cov_inv is None):
            raise ValueError("give exactly one of noise_std and noise_cov_inv")
        self.data = d
        self.noise_std = self.inv_std = self.noise_cov_inv = self.sqrt_noise_cov_inv = None
        if noise_std_inv is not None and not callable(noise_cov_inv):
            raise ValueError(
                "noise_std_inv goes with a callable noise_cov_inv (r -> N^{-1} r); with "
                + ("noise_std" if noise_std is not None else "an array noise_cov_inv")
                + " the likelihood takes its square root itself: drop noise_std_inv"
            )
        if noise_std is not None:
            std = positive_like(
                noise_std, d, "noise_std", inverse_square=True, keep_scalars=True
            )  # 1/std**2 finite in d's dtype
            self.noise_std = to_device(std)
            self.inv_std = to_device(jtu.tree_map(lambda x: 1.0 / x, std))  # in NumPy: correctly rounded
        elif callable(noise_cov_inv):
            if noise_std_inv is None:
                raise ValueError("a callable noise_cov_inv needs noise_std_inv (r -> N^{-1/2} r) as well")
            if not callable(noise_std_inv):
                raise TypeError(
                    f"noise_std_inv must be a callable r -> N^{{-1/2}} r (with a callable noise_cov_inv), got "
                    f"{type(noise_std_inv).__name__}"
                )
            _check_noise_callables(noise_cov_inv, noise_std_inv, d)
            self.noise_cov_inv, self.sqrt_noise_cov_inv = noise_cov_inv, noise_std_inv
        else:
            prec_host = positive_like(noise_cov_inv, d, "noise_cov_inv", keep_scalars=True)
            self.noise_cov_inv = to_device(prec_host)
            self.sqrt_noise_cov_inv = to_device(jtu.tree_map(np.sqrt, prec_host))
        if noise_log_det is not None:
            if not callable(noise_cov_inv):
                raise ValueError("noise_log_det is for a callable noise_cov_inv (a diagonal noise knows its own)")
            if isinstance(noise_log_det, bool) or not isinstance(noise_log_det, (int, float, np.integer, np.floating)):
                raise TypeError(f"noise_log_det must be a real number, got {type(noise_log_det).__name__}")
            if not math.isfinite(float(noise_log_det)):
                raise ValueError(f"noise_log_det must be finite, got {noise_log_det}")
        self._noise_log_det = None if noise_log_det is None else float(noise_log_det)
        self.set_domain(domain_of(d))

    def _n_inv(self, r):
        if self.inv_std is not None:
            return _scaled(r, self.inv_std, twice=True)
        if callable(self.noise_cov_inv):
            return self.noise_cov_inv(r)
        return _scaled(r, self.noise_cov_inv)

    def _n_inv_sqrt(self, r):
        if self.inv_std is not None:
            return _scaled(r, self.inv_std)
        if callable(self.sqrt_noise_cov_inv):
            return self.sqrt_noise_cov_inv(r)
        return _scaled(r, self.sqrt_noise_cov_inv)

    def energy(self, s):
        r = tm.sub(self.data, s)
        return 0.5 * tm.vdot(r, self._n_inv(r))

    def normalization(self) -> float | None:
        """``log det(2 pi N) / 2`` over the data's real components (a complex datum counts twice).

        ``None`` for a callable ``noise_cov_inv`` without ``noise_log_det``.
        """
        n_real = sum(math.prod(np.shape(d)) * (2 if np.iscomplexobj(d) else 1) for d in jtu.tree_leaves(self.data))
        if self.noise_std is not None:
            log_var = summed_over_data(lambda d, sd: _components(d) * np.log(sd), self.data, self.noise_std)
            return 0.5 * n_real * LOG_2PI + log_var
        if callable(self.noise_cov_inv):
            return None if self._noise_log_det is None else 0.5 * (n_real * LOG_2PI + self._noise_log_det)
        log_prec = summed_over_data(lambda d, p: _components(d) * np.log(p), self.data, self.noise_cov_inv)
        return 0.5 * (n_real * LOG_2PI - log_prec)

    lsm_is_transformation_vjp = True  # left_sqrt_metric below is (dT/ds)^T e

    def transformation(self, s):
        return self._n_inv_sqrt(s)

    def metric(self, s, t):
        return self._n_inv(t)

    def left_sqrt_metric(self, s, e):
        return self._n_inv_sqrt(e)

    def normalized_residual(self, s):
        return self._n_inv_sqrt(tm.sub(self.data, s))

    @property
    def data_leaves(self):
        """The data and the noise as used, the noise at the data's shapes (a callable ``noise_cov_inv``
        is unknown: ``None``); a scalar noise is a broadcast view, not a copy."""
        if self.noise_std is not None:
            noise = {"noise_std": _at_data_shapes(self.noise_std, self.data)}
        elif callable(self.noise_cov_inv):
            noise = {"noise_cov_inv": None}
        else:
            noise = {"noise_cov_inv": _at_data_shapes(self.noise_cov_inv, self.data)}
        return {"Gaussian": {"data": self.data, **noise}}


def _components(d) -> int:
    """Real components per datum: 2 for complex data, else 1."""
    return 2 if np.iscomplexobj(d) else 1


def _scaled(r, w, twice: bool = False):
    """``r * w`` (``r * w * w`` with ``twice``) per data leaf; a scalar ``w`` scales the whole of its leaf's
    subtree in ``r`` (e.g. a grid slab, :class:`~shardvi.parallel.grid.Slab`, of a field-split run)."""
    if twice:
        return jtu.tree_map(lambda wi, sub: jtu.tree_map(lambda a: a * wi * wi, sub), w, r)
    return jtu.tree_map(lambda wi, sub: jtu.tree_map(lambda a: a * wi, sub), w, r)


def _at_data_shapes(noise, data):
    """``noise`` leaves broadcast (NumPy views) to the shapes of the ``data`` leaves (an array split over
    processes has them already: kept)."""
    return jtu.tree_map(lambda w, d: w if is_global(w) else np.broadcast_to(np.asarray(w), np.shape(d)), noise, data)


def _check_noise_callables(cov_inv: Callable, std_inv: Callable, data) -> None:
    """``Gaussian``: the noise callables map data-shaped residuals to data-shaped results, and are consistent.

    Both are traced on the data's shapes (``jax.eval_shape``: no computation), then, for data held
    by this process, applied to two random residuals ``u, v``: ``N^{-1/2}`` must be self-adjoint and
    square to ``N^{-1}`` (``<u, S v> = <S u, v>``, ``<S u, S v> = <u, N^{-1} v>``), and ``N^{-1}``
    self-adjoint, to a relative ``1e-6`` (``1e-3`` in single precision) of ``|u| |result|``.
    """
    spec = jtu.tree_map(lambda x: jax.ShapeDtypeStruct(np.shape(x), x.dtype), data)
    want = jtu.tree_structure(spec), [(s.shape, s.dtype) for s in jtu.tree_leaves(spec)]
    for name, fn in (("noise_cov_inv", cov_inv), ("noise_std_inv", std_inv)):
        try:
            out = jax.eval_shape(fn, spec)
        except Exception as err:  # the user's function, traced once on the data's shapes
            raise ValueError(
                f"{name} failed on a residual of the data's shapes {[s for s, _ in want[1]]}: "
                f"{type(err).__name__}: {err}"
            ) from err
        got = jtu.tree_structure(out), [(tuple(o.shape), o.dtype) for o in jtu.tree_leaves(out)]
        if got != want:
            raise ValueError(
                f"{name} must return a residual of the data's structure, shapes and dtypes "
                f"{[(s, str(t)) for s, t in want[1]]}, got {[(s, str(t)) for s, t in got[1]]}"
            )
    if any(is_global(x) for x in jtu.tree_leaves(data)):
        return  # each process holds a part of the data: the shapes are checked, the values are the user's
    rng = np.random.default_rng(0)

    def draw():
        def leaf(x):
            x = np.asarray(x)
            v = rng.standard_normal(x.shape)
            if np.iscomplexobj(x):
                v = v + 1j * rng.standard_normal(x.shape)
            return jnp.asarray(v.astype(x.dtype))

        return jtu.tree_map(leaf, data)

    def dot(a, b):  # the real inner product, in float64 on the host (non-finite values are reported below)
        with np.errstate(all="ignore"):
            pairs = zip(jtu.tree_leaves(a), jtu.tree_leaves(b))
            return float(sum(np.sum(np.real(np.conj(np.asarray(x, np.complex128)) * np.asarray(y))) for x, y in pairs))

    def norm(a):
        return math.sqrt(max(dot(a, a), 0.0))

    u, v = draw(), draw()
    su, sv, nv, nu = std_inv(u), std_inv(v), cov_inv(v), cov_inv(u)
    single = any(jnp.finfo(jnp.result_type(x)).bits < 64 for x in jtu.tree_leaves(data))
    tol = 1e-3 if single else 1e-6
    checks = (
        (
            "noise_cov_inv is not self-adjoint (<u, N^{-1} v> != <N^{-1} u, v>)",
            dot(u, nv),
            dot(nu, v),
            norm(u) * norm(nv),
        ),
        ("noise_std_inv is not self-adjoint (<u, S v> != <S u, v>)", dot(u, sv), dot(su, v), norm(u) * norm(sv)),
        (
            "noise_std_inv is not the square root of noise_cov_inv (<S u, S v> != <u, N^{-1} v>)",
            dot(su, sv),
            dot(u, nv),
            norm(u) * norm(nv),
        ),
    )
    for what, a, b, scale in checks:
        if not (math.isfinite(a) and math.isfinite(b)):
            raise ValueError("noise_cov_inv or noise_std_inv gives non-finite values on finite residuals")
        if abs(a - b) > tol * max(scale, np.finfo(np.float64).tiny):
            raise ValueError(f"{what}: {a:.6g} vs {b:.6g} at two random residuals")
