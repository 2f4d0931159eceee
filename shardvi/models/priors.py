"""Priors as maps from a standard-normal latent: ``value = prior(xi)`` with ``xi ~ N(0, 1)``.

Every prior is a frozen dataclass whose call is elementwise, jittable and
differentiable in ``xi``; parameters are plain Python floats validated at
construction. Each map is the distribution's quantile function composed with the
normal CDF (computed in log space where a tail would round to 0 or 1), so
``|xi| <= 8`` gives finite values with finite gradients in float64; parameters
for which the values at ``|xi| <= 8`` would leave float64's range of normal
numbers are refused (:class:`LogNormal`, :class:`InvGamma`).

>>> p = LogNormal(mean=2.0, std=0.5)
>>> model = prior_model(p, shape=(3,), name="amp")   # a Model with domain {"amp": (3,)}
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from functools import partial

import jax
import jax.numpy as jnp
from jax.scipy.special import gammainc, gammaincc, gammaln, log_ndtr, ndtr

from .model import Model, as_shape, check_real

__all__ = [
    "Prior",
    "Normal",
    "LogNormal",
    "Uniform",
    "InvGamma",
    "Laplace",
    "prior_model",
    "gamma_quantile_from_normal",
    "as_prior",
]


def _finite_float(x, name: str) -> float:
    if isinstance(x, bool):
        raise TypeError(f"{name} must be a real number, got {x!r}")
    try:
        v = float(x)
    except (TypeError, ValueError):
        raise TypeError(f"{name} must be a real number, got {type(x).__name__}") from None
    if not math.isfinite(v):
        raise ValueError(f"{name} must be finite, got {v}")
    return v


def _positive_float(x, name: str) -> float:
    v = _finite_float(x, name)
    if v <= 0:
        raise ValueError(f"{name} must be > 0, got {v}")
    return v


#: the latent range over which the priors' values are kept finite (``|xi| <= _XI_MAX``)
_XI_MAX = 8.0
#: ``log Phi(-_XI_MAX)``: the log-probability of either tail beyond ``_XI_MAX``
_LOG_TAIL = math.log(0.5 * math.erfc(_XI_MAX / math.sqrt(2.0)))
#: natural logs of the smallest normal and of the largest float64
_LOG_TINY = math.log(2.0**-1022)
_HUGE = 1.7976931348623157e308
_LOG_HUGE = math.log(_HUGE)


def _float_dtype(xi):
    """``xi`` as a JAX array of a floating dtype (integers promoted); ``TypeError`` for anything else."""
    check_real(xi, "xi")
    xi = jnp.asarray(xi)
    return xi if jnp.issubdtype(xi.dtype, jnp.floating) else xi.astype(jnp.result_type(float))


class Prior:
    """Base class: ``prior(xi)`` maps standard-normal ``xi`` to the prior variable."""

    def __call__(self, xi):
        raise NotImplementedError

    def domain(self, shape=(), dtype=None) -> jax.ShapeDtypeStruct:
        """Latent ``jax.ShapeDtypeStruct`` of ``shape`` (default dtype: JAX's default float).

        ``shape`` is an int or a sequence of ints with at least one element in all
        (``()``, a scalar, has one); a float, bool or negative entry is refused.
        """
        shape = as_shape(shape, "shape")
        if math.prod(shape) == 0:
            raise ValueError(f"shape {shape} has no elements: a latent needs at least one")
        dtype = jnp.result_type(float) if dtype is None else jnp.dtype(dtype)
        if not jnp.issubdtype(dtype, jnp.floating):
            raise TypeError(f"dtype must be a real floating dtype, got {dtype}")
        return jax.ShapeDtypeStruct(shape, dtype)


@dataclass(frozen=True)
class Normal(Prior):
    """Normal ``N(mean, std^2)``: ``mean + std * xi``."""

    mean: float
    std: float

    def __post_init__(self):
        object.__setattr__(self, "mean", _finite_float(self.mean, "mean"))
        object.__setattr__(self, "std", _positive_float(self.std, "std"))

    def __call__(self, xi):
        xi = _float_dtype(xi)
        return self.mean + self.std * xi


def _lognormal_sigma(mean: float, std: float) -> float:
    """``sqrt(log(1 + (std / mean)^2))``; ``std / mean`` where its square is below the normal range."""
    r = std / mean
    r2 = r * r
    return math.sqrt(math.log1p(r2)) if r2 >= 2.0**-1022 else r


@dataclass(frozen=True)
class LogNormal(Prior):
    """Log-normal variable with the given ``mean`` and ``std`` of the variable itself.

    The underlying normal has ``sigma^2 = log(1 + std^2 / mean^2)`` and
    ``mu = log(mean) - sigma^2 / 2``; ``value = exp(mu + sigma * xi)``.

    ``mean`` and ``std`` must be positive and finite, the relative variance
    ``(std / mean)^2`` a finite float64, and the values for ``|xi| <= 8``,
    ``exp(mu -+ 8 sigma)``, float64 normal numbers (about ``2.2e-308`` to
    ``1.8e308``); otherwise a ``ValueError`` names the parameters.
    """

    mean: float
    std: float

    def __post_init__(self):
        mean = _positive_float(self.mean, "mean")
        std = _positive_float(self.std, "std")
        object.__setattr__(self, "mean", mean)
        object.__setattr__(self, "std", std)
        r = std / mean
        if not r * r <= _HUGE:
            raise ValueError(
                f"LogNormal(mean={mean!r}, std={std!r}): the relative variance (std / mean)^2 = ({r:.3g})^2 "
                "overflows float64; give mean and std of similar scales"
            )
        lo, hi = self.mu - _XI_MAX * self.sigma, self.mu + _XI_MAX * self.sigma
        if not (_LOG_TINY <= lo and hi <= _LOG_HUGE):
            raise ValueError(
                f"LogNormal(mean={mean!r}, std={std!r}): log-space mu = {self.mu:.4g}, sigma = {self.sigma:.4g} "
                f"give values exp({lo:.4g}) to exp({hi:.4g}) for |xi| <= {_XI_MAX:g}, outside the float64 range "
                f"exp({_LOG_TINY:.4g}) to exp({_LOG_HUGE:.4g}); give mean and std of similar scales, or rescale the "
                "quantity"
            )

    @property
    def sigma(self) -> float:
        """Standard deviation of ``log(value)``."""
        return _lognormal_sigma(self.mean, self.std)

    @property
    def mu(self) -> float:
        """Mean of ``log(value)``."""
        return math.log(self.mean) - 0.5 * self.sigma**2

    def __call__(self, xi):
        xi = _float_dtype(xi)
        return jnp.exp(self.mu + self.sigma * xi)


@dataclass(frozen=True)
class Uniform(Prior):
    """Uniform on ``[low, high]`` via the normal CDF (each half computed from its own tail)."""

    low: float
    high: float

    def __post_init__(self):
        object.__setattr__(self, "low", _finite_float(self.low, "low"))
        object.__setattr__(self, "high", _finite_float(self.high, "high"))
        if not self.low < self.high:
            raise ValueError(f"high must be > low, got low={self.low}, high={self.high}")

    def __call__(self, xi):
        xi = _float_dtype(xi)
        w = self.high - self.low
        return jnp.where(xi < 0, self.low + w * ndtr(xi), self.high - w * ndtr(-xi))


@dataclass(frozen=True)
class Laplace(Prior):
    """Laplace with location ``loc`` and scale ``scale`` (density ``exp(-|x - loc| / scale) / (2 scale)``)."""

    loc: float
    scale: float

    def __post_init__(self):
        object.__setattr__(self, "loc", _finite_float(self.loc, "loc"))
        object.__setattr__(self, "scale", _positive_float(self.scale, "scale"))

    def __call__(self, xi):
        xi = _float_dtype(xi)
        neg = xi < 0
        t = jnp.where(neg, xi, -xi)  # -|xi| with derivative +-1 on both sides of 0
        tail = math.log(2.0) + log_ndtr(t)  # log(2 * min(u, 1 - u)) <= 0
        return self.loc + jnp.where(neg, 1.0, -1.0) * self.scale * tail


# ----------------------------------------------------------------------------- gamma quantile
_GAMMA_MAXITER = 60
_MAX_STEP = 3.0  # Newton steps in log(g) are clipped to this
#: the shapes ``a`` for which the gamma quantile is accurate in float64 (see :func:`gamma_quantile_from_normal`)
_GAMMA_A_MIN, _GAMMA_A_MAX = 1e-3, 1e5


def _gamma_shape(a, name: str = "a") -> float:
    """``a`` as a float in ``[_GAMMA_A_MIN, _GAMMA_A_MAX]``; ``ValueError`` naming ``name`` otherwise."""
    a = _positive_float(a, name)
    if not _GAMMA_A_MIN <= a <= _GAMMA_A_MAX:
        raise ValueError(
            f"{name} must be in [{_GAMMA_A_MIN:g}, {_GAMMA_A_MAX:g}] (the shapes for which the gamma quantile is "
            f"accurate in float64), got {a!r}"
        )
    return a


def _log_gammainc_lower(a, g, u):
    """``log P(a, g)`` accurate for tiny ``g`` (series) and moderate ``g`` (``gammainc``)."""
    gs = jnp.minimum(g, 1.0)

    # P(a, g) = g^a e^{-g} / Gamma(a+1) * sum_n g^n / ((a+1)...(a+n)); 40 terms suffice for g <= 1
    def body(n, carry):
        term, total = carry
        term = term * gs / (a + n)
        return term, total + term

    _, series = jax.lax.fori_loop(1, 40, body, (jnp.ones_like(gs), jnp.ones_like(gs)))
    small = a * u - gs - gammaln(a + 1.0) + jnp.log(series)
    return jnp.where(g <= 1.0, small, jnp.log(gammainc(a, jnp.maximum(g, 1.0))))


def _log_gamma_quantile_impl(a, xi):
    """Solve ``P(a, g) = Phi(-xi)`` for ``u = log g`` by clipped Newton iterations.

    ``log P`` and ``log Q`` are concave in ``log g`` (the log-gamma density is
    log-concave), so Newton converges monotonically once on the safe side of the
    root; the clip keeps the first step(s) finite. For ``xi >= 0`` the lower tail
    ``log P(a, g) = log Phi(-xi)`` is solved, otherwise ``log Q(a, g) = log Phi(xi)``.
    """
    dtype = xi.dtype
    lower = xi >= 0
    target = log_ndtr(jnp.where(lower, -xi, xi))
    lg_a = gammaln(a)
    # start: Wilson-Hilferty where it is positive, else the small-g asymptote P ~ g^a / Gamma(a+1)
    c = 1.0 / (9.0 * a)
    w = 1.0 - c - xi * math.sqrt(c)
    u_wh = math.log(a) + 3.0 * jnp.log(jnp.maximum(w, 1e-3))
    u_small = (log_ndtr(-xi) + gammaln(a + 1.0)) / a
    u0 = jnp.where(w > 0.2, u_wh, jnp.minimum(u_small, u_wh))
    tol = jnp.sqrt(jnp.finfo(dtype).eps)

    def fun(u):
        g = jnp.exp(u)
        logcdf = jnp.where(lower, _log_gammainc_lower(a, g, u), jnp.log(gammaincc(a, jnp.where(lower, 1.0, g))))
        logdens = a * u - g - lg_a  # log of g * gamma_pdf(g)
        f = logcdf - target
        fprime = jnp.where(lower, 1.0, -1.0) * jnp.exp(logdens - logcdf)
        return f, fprime

    def step(u):
        f, fp = fun(u)
        du = -f / fp
        fallback = -jnp.sign(f) * jnp.where(lower, 1.0, -1.0) * _MAX_STEP
        du = jnp.where(jnp.isfinite(du), du, fallback)
        return jnp.clip(du, -_MAX_STEP, _MAX_STEP)

    def cond(state):
        i, u, du = state
        return (i < _GAMMA_MAXITER) & jnp.any(jnp.abs(du) > tol * jnp.maximum(1.0, jnp.abs(u)))

    def body(state):
        i, u, _ = state
        du = step(u)
        return i + 1, u + du, du

    init = (jnp.asarray(0), u0.astype(dtype), jnp.full_like(u0, jnp.inf, dtype=dtype))
    _, u, _ = jax.lax.while_loop(cond, body, init)
    return u + step(u)  # Newton converges quadratically: one more step reaches full precision


@partial(jax.custom_jvp, nondiff_argnums=(0,))
def _log_gamma_quantile(a, xi):
    return _log_gamma_quantile_impl(a, xi)


@_log_gamma_quantile.defjvp
def _log_gamma_quantile_jvp(a, primals, tangents):
    (xi,), (dxi,) = primals, tangents
    u = _log_gamma_quantile(a, xi)
    # P(a, e^u) = Phi(-xi)  =>  du/dxi = -phi(xi) / (e^u * gamma_pdf(e^u))
    log_phi = -0.5 * xi * xi - 0.5 * math.log(2 * math.pi)
    dudxi = -jnp.exp(log_phi - (a * u - jnp.exp(u) - gammaln(a)))
    return u, dudxi * dxi


# compiled once per (a, shape, dtype): the eager op-by-op path is several times slower than compiling
_log_gamma_quantile_jit = jax.jit(_log_gamma_quantile, static_argnums=0)


def gamma_quantile_from_normal(a, xi, *, log: bool = False):
    """Quantile of ``Gamma(a, 1)`` at probability ``Phi(xi)``, elementwise.

    Parameters
    ----------
    a : float
        Shape parameter in ``[1e-3, 1e5]`` (a static Python float; see the notes).
    xi : array
        Standard-normal latent.
    log : bool
        Return ``log g`` (finite even where ``g`` underflows).

    Raises
    ------
    ValueError
        If ``a`` is outside ``[1e-3, 1e5]``.

    Notes
    -----
    Newton iterations on ``log P(a, g)`` (or ``log Q`` in the upper tail) in
    ``log g``; differentiable in ``xi`` by the implicit-function theorem.

    ``a`` is limited to ``[1e-3, 1e5]``, where ``g`` is accurate to a relative
    error of about ``1e-11`` for ``|xi| <= 8``. Above, JAX's regularized
    incomplete gamma functions lose accuracy (relative errors of ``g`` of
    ``2e-9`` at ``a = 1e6``, ``3e-6`` at ``1e7``: 1 % of the distribution's
    relative width ``1 / sqrt(a)``), their continued fraction stops at a fixed
    number of terms, and their power series does not terminate in float64 once
    ``a + 1 == a`` (``a >= 2**53``). Below, the quantiles around the median
    underflow float64 (``g ~ 2**(-1/a)``), where the upper-tail equation cannot
    be solved.
    """
    a = _gamma_shape(a)
    xi = _float_dtype(xi)
    u = _log_gamma_quantile_jit(a, -xi)  # solves P(a, g) = Phi(-t) with t = -xi
    return u if log else jnp.exp(u)


@dataclass(frozen=True)
class InvGamma(Prior):
    """Inverse-gamma with shape ``a`` and scale ``scale`` (scipy's ``invgamma(a, scale=scale)``).

    ``value = scale / g`` with ``g`` the ``Gamma(a, 1)`` quantile at ``1 - Phi(xi)``
    (so the map is increasing in ``xi``), found by Newton iterations on the
    regularized incomplete gamma function in log space
    (:func:`gamma_quantile_from_normal`).

    ``a`` must be in ``[1e-3, 1e5]``, the shapes for which that quantile is
    accurate in float64 (see :func:`gamma_quantile_from_normal`), and ``a`` and
    ``scale`` must keep the values for ``|xi| <= 8`` float64 normal numbers
    (about ``2.2e-308`` to ``1.8e308``): the largest value grows like
    ``scale * exp(35 / a)`` for small ``a`` (with ``scale = 1``, ``a`` below about
    0.05 is refused). Both are checked at construction (``ValueError``).
    """

    a: float
    scale: float

    def __post_init__(self):
        a = _gamma_shape(self.a, "a")
        scale = _positive_float(self.scale, "scale")
        object.__setattr__(self, "a", a)
        object.__setattr__(self, "scale", scale)
        # bounds of log(value) over |xi| <= 8 from bounds of the quantile g of Gamma(a, 1):
        # P(a, g) <= g^a / Gamma(a + 1) bounds the lower-tail quantile below, and the Chernoff bound
        # Q(a, g) <= exp(-(g - a)^2 / (2 g)) (g > a) bounds the upper-tail one above
        log_g_min = (_LOG_TAIL + math.lgamma(a + 1.0)) / a
        tail = -_LOG_TAIL
        log_g_max = math.log(a + tail + math.sqrt(tail * tail + 2.0 * a * tail))
        hi, lo = math.log(scale) - log_g_min, math.log(scale) - log_g_max
        if hi > _LOG_HUGE or lo < _LOG_TINY:
            raise ValueError(
                f"InvGamma(a={a!r}, scale={scale!r}) reaches values of about exp({hi if hi > _LOG_HUGE else lo:.4g}) "
                f"for |xi| <= {_XI_MAX:g}, outside the float64 range exp({_LOG_TINY:.4g}) to exp({_LOG_HUGE:.4g}); "
                f"{'increase a or decrease scale' if hi > _LOG_HUGE else 'increase scale'}"
            )

    def __call__(self, xi):
        xi = _float_dtype(xi)
        u = _log_gamma_quantile_jit(self.a, xi)  # P(a, g) = Phi(-xi)
        return jnp.exp(math.log(self.scale) - u)


def as_prior(value, name: str, kind: type = LogNormal):
    """Turn ``(mean, std)`` into ``kind(mean, std)``; pass a :class:`Prior` through; else TypeError."""
    if isinstance(value, Prior):
        return value
    if isinstance(value, (tuple, list)) and len(value) == 2:
        try:
            return kind(*value)
        except ValueError as err:
            raise ValueError(f"{name}: {err}") from None
    raise TypeError(f"{name} must be a (mean, std) pair or a shardvi Prior, got {value!r}")


def prior_model(prior: Prior, shape=(), *, name: str = "x", dtype=None) -> Model:
    """A :class:`Model` ``xi[name] -> prior(xi[name])`` with latent shape ``shape``.

    ``shape`` is an int or a sequence of ints (Python or NumPy) with at least one
    element in all; floats, bools and negative entries are refused.
    """
    if not isinstance(prior, Prior):
        raise TypeError(f"prior must be a shardvi Prior, got {type(prior).__name__}")
    if not isinstance(name, str) or not name:
        raise TypeError(f"name must be a non-empty str, got {name!r}")
    domain = {name: prior.domain(shape, dtype)}

    def call(xi):
        return prior(xi[name])

    call.__name__ = f"{type(prior).__name__}_prior"
    return Model(call, domain)
