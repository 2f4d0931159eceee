"""Gauss-Markov processes on 1-D (possibly irregular) grids: Wiener, integrated Wiener, Ornstein-Uhlenbeck.

A linear stochastic differential equation ``dx = F x dt + G dW`` sampled at times
``t_0 < t_1 < ... < t_{N-1}`` is exactly a discrete linear recursion

    x_0 = x0,    x_{i+1} = A_i x_i + L_i xi_i,    xi_i ~ N(0, I),

with the state transition ``A_i = exp(F dt_i)`` over the step ``dt_i = t_{i+1} - t_i``
and ``L_i`` a square root (here: the lower Cholesky factor) of the process noise
covariance ``Q_i = int_0^dt_i exp(F s) G G^T exp(F^T s) ds``. No time-discretization
error: the values at the grid points have exactly the process's joint distribution,
on any grid. The processes here:

- Wiener (Brownian motion) with scale ``sigma``: ``A = 1``, ``Q = sigma^2 dt``;
  ``Cov(x(s), x(t)) = sigma^2 min(s, t)`` (times from ``t_0``, ``x0`` fixed).
- Ornstein-Uhlenbeck, ``dx = -gamma x dt + sigma dW``: ``A = exp(-gamma dt)``,
  ``Q = sigma^2 / (2 gamma) (1 - exp(-2 gamma dt))``; stationary variance
  ``sigma^2 / (2 gamma)``, stationary covariance ``sigma^2 / (2 gamma) exp(-gamma |s - t|)``.
- Integrated Wiener, state ``(x, v)`` with ``v`` a Wiener process of scale ``sigma``
  and ``x = int v``: ``A = [[1, dt], [0, 1]]``,
  ``Q = sigma^2 [[dt^3/3, dt^2/2], [dt^2/2, dt]]``, whose Cholesky factor is
  ``sigma sqrt(dt) [[dt/sqrt(3), 0], [sqrt(3)/2, 1/2]]``;
  ``Cov(x(s), x(t)) = sigma^2 (s^2 t / 2 - s^3 / 6)`` for ``s <= t`` (``x0 = v0 = 0``).

The pure functions (:func:`wiener_process`, :func:`integrated_wiener_process`,
:func:`ornstein_uhlenbeck_process`, all built on :func:`discrete_gauss_markov`) are
jittable and differentiable in every argument; they run one ``jax.lax.scan`` over the
steps. The models (:class:`WienerProcess`, :class:`IntegratedWienerProcess`,
:class:`OrnsteinUhlenbeckProcess`) are :class:`~shardvi.Model`\\ s on a latent
``{prefix + "xi": excitations, ...}``; each parameter is fixed (a float, or an array
with one value per step) or inferred (a ``(mean, std)`` pair, a
:class:`~shardvi.models.priors.Prior` or a :class:`~shardvi.Model`), as in
:class:`~shardvi.models.CorrelatedFieldMaker`.

>>> wp = WienerProcess(dt=np.full(99, 0.1), sigma=(1.0, 0.5), x0=(0.0, 1.0))
>>> sorted(wp.domain)            # latent: excitations, log-normal sigma, normal x0
['wpsigma', 'wpx0', 'wpxi']
>>> x = wp(wp.init(jax.random.PRNGKey(0)))   # shape (100,), values at wp.times
"""

from __future__ import annotations

import math

import jax
import jax.core
import jax.numpy as jnp
import numpy as np

from ..module import Module
from .correlated_field import _default_dtype
from .model import Model, normalize_domain
from .priors import LogNormal, Normal, Prior, as_prior

__all__ = [
    "discrete_gauss_markov",
    "wiener_process",
    "integrated_wiener_process",
    "ornstein_uhlenbeck_process",
    "WienerProcess",
    "IntegratedWienerProcess",
    "OrnsteinUhlenbeckProcess",
]

_SQRT3 = math.sqrt(3.0)

#: What a model parameter may be: fixed (a number, or an array with one value per step where
#: allowed) or inferred (a ``(mean, std)`` pair, a :class:`Prior`, a :class:`Model`)
ParameterSpec = float | np.ndarray | jax.Array | tuple[float, float] | list | Prior | Model


# ----------------------------------------------------------------------------- validation
def _concrete(x):
    """``x`` as a NumPy array where its values are known on this host, else ``None`` (a tracer)."""
    if isinstance(x, jax.core.Tracer):
        return None
    if isinstance(x, jax.Array) and not x.is_fully_addressable:
        return None
    return np.asarray(x)


def _real_array(x, argname: str):
    """A real numeric array (NumPy or JAX, traced or not); bools, complex and non-numeric: ``TypeError``."""
    if isinstance(x, (bool, np.bool_)):
        raise TypeError(f"{argname} must be a real number or array, got {x!r}")
    if isinstance(x, str) or x is None:
        raise TypeError(f"{argname} must be a real number or array, got {x!r}")
    if isinstance(x, (int, float)):
        return x  # a Python scalar stays weakly typed (it does not promote float32 inputs)
    if not isinstance(x, jax.Array):
        try:
            x = np.asarray(x)
        except (TypeError, ValueError):
            raise TypeError(f"{argname} must be a real number or array, got {type(x).__name__}") from None
    dtype = np.dtype(x.dtype)
    if dtype.kind not in "iuf":
        kind = "complex" if dtype.kind == "c" else "non-numeric"
        raise TypeError(f"{argname} must be real, got a {kind} dtype {dtype}")
    return x


def _check_values(x, argname: str, positive: bool) -> None:
    v = _concrete(x)
    if v is None:
        return  # traced: checked where the values are known (model constructors, eager calls)
    if not np.all(np.isfinite(v)):
        raise ValueError(f"{argname} must be finite, got non-finite values (nan or inf)")
    if positive and not np.all(v > 0):
        raise ValueError(f"{argname} must be > 0, got min {v.min()}")


def _step_param(x, argname: str, n: int, *, positive: bool):
    """A parameter that is a scalar or has one value per step: shape ``()`` or ``(n,)``."""
    x = _real_array(x, argname)
    if np.shape(x) not in ((), (n,)):
        raise ValueError(f"{argname} must be a scalar or have shape ({n},) (one value per step), got {np.shape(x)}")
    _check_values(x, argname, positive)
    return x


def _scalar_param(x, argname: str, shape=()):
    x = _real_array(x, argname)
    if np.shape(x) != tuple(shape):
        raise ValueError(f"{argname} must have shape {tuple(shape)}, got {np.shape(x)}")
    _check_values(x, argname, positive=False)
    return x


def _float_dtype(*xs):
    dtype = jnp.result_type(*xs)
    return dtype if jnp.issubdtype(dtype, jnp.floating) else jnp.result_type(float)


def _excitations(xi, ndim: int, argname: str = "xi"):
    xi = _real_array(xi, argname)
    if np.ndim(xi) != ndim:
        want = "(N-1,)" if ndim == 1 else "(N-1, K)"
        raise ValueError(f"{argname} must have shape {want} (one row per step), got {np.shape(xi)}")
    return xi


# ----------------------------------------------------------------------------- pure functions
def discrete_gauss_markov(xi, x0, drift, cov_sqrt):
    """The linear recursion ``x_0 = x0``, ``x_{i+1} = drift_i @ x_i + cov_sqrt_i @ xi_i``.

    One ``jax.lax.scan`` over the ``N - 1`` steps; jittable, differentiable in every
    argument. The matrix-vector products are written as elementwise products and
    sums (exact on every backend, no reduced-precision matrix units).

    Parameters
    ----------
    xi : array, shape (N-1,) or (N-1, K)
        Excitations (standard normal for a Gauss-Markov process), one row per step.
        A vector ``(N-1,)`` goes with a scalar state.
    x0 : array, shape () or (D,)
        Initial state (``()``: scalar state, ``xi`` of shape ``(N-1,)``).
    drift : array, shape (D, D) or (N-1, D, D); () or (N-1,) for a scalar state
        State transition matrices ``A_i`` (shared by all steps or one per step).
    cov_sqrt : array, shape (D, K) or (N-1, D, K); () or (N-1,) for a scalar state
        Square roots ``L_i`` of the process noise covariances ``Q_i = L_i L_i^T``.

    Returns
    -------
    array, shape (N,) or (N, D)
        The states ``x_0, ..., x_{N-1}`` (``x0`` first), in the promoted floating dtype
        of the inputs.
    """
    x0 = _real_array(x0, "x0")
    drift = _real_array(drift, "drift")
    cov_sqrt = _real_array(cov_sqrt, "cov_sqrt")
    if np.ndim(x0) == 0:
        xi = _excitations(xi, 1)
        n = np.shape(xi)[0]
        for a, name in ((drift, "drift"), (cov_sqrt, "cov_sqrt")):
            if np.shape(a) not in ((), (n,)):
                raise ValueError(f"{name} must have shape () or ({n},) for a scalar state, got {np.shape(a)}")
    elif np.ndim(x0) == 1:
        xi = _excitations(xi, 2)
        n, k = np.shape(xi)
        d = np.shape(x0)[0]
        if np.shape(drift) not in ((d, d), (n, d, d)):
            raise ValueError(f"drift must have shape ({d}, {d}) or ({n}, {d}, {d}), got {np.shape(drift)}")
        if np.shape(cov_sqrt) not in ((d, k), (n, d, k)):
            raise ValueError(f"cov_sqrt must have shape ({d}, {k}) or ({n}, {d}, {k}), got {np.shape(cov_sqrt)}")
    else:
        raise ValueError(f"x0 must be a scalar or a vector (the initial state), got shape {np.shape(x0)}")
    _check_values(x0, "x0", positive=False)
    dtype = _float_dtype(xi, x0, drift, cov_sqrt)
    return _recursion(*(jnp.asarray(v, dtype) for v in (xi, x0, drift, cov_sqrt)))


@jax.jit
def _recursion(xi, x0, drift, cov_sqrt):
    """:func:`discrete_gauss_markov` on validated arrays of one dtype (compiled once per shapes and dtype).

    The noise terms ``b_i = L_i xi_i`` are computed for all steps at once, outside the
    loop: the scan runs the bare recursion ``x_{i+1} = A_i x_i + b_i`` (small loop
    bodies, also in its derivatives).
    """
    if x0.ndim == 0:
        noise = cov_sqrt * xi
        shared = drift.ndim == 0

        def step(x, inputs):
            a, b = (drift, inputs) if shared else inputs
            x = a * x + b
            return x, x
    else:
        noise = jnp.sum(cov_sqrt * xi[:, None, :], axis=-1)
        shared = drift.ndim == 2

        def step(x, inputs):
            a, b = (drift, inputs) if shared else inputs
            x = jnp.sum(a * x, axis=-1) + b
            return x, x

    _, xs = jax.lax.scan(step, x0, noise if shared else (drift, noise))
    return jnp.concatenate([x0[None], xs], axis=0)


def wiener_process(xi, x0, sigma, dt):
    """Wiener process (Brownian motion) ``x_{i+1} = x_i + sigma_i sqrt(dt_i) xi_i``.

    Parameters
    ----------
    xi : array, shape (N-1,)
        Standard-normal excitations, one per step.
    x0 : float or array, shape ()
        Value at the first grid point ``t_0`` (units of ``x``).
    sigma : float or array, shape () or (N-1,)
        Scale, > 0 (units of ``x / sqrt(time)``): ``Var(x(t) - x(s)) = sigma^2 (t - s)``.
        An array gives each step its own scale.
    dt : float or array, shape () or (N-1,)
        Step sizes ``t_{i+1} - t_i``, > 0 (time).

    Returns
    -------
    array, shape (N,)
        ``x(t_0), ..., x(t_{N-1})``: ``Cov(x_i, x_j) = sigma^2 min(t_i - t_0, t_j - t_0)``
        for a fixed ``x0`` and constant ``sigma``.
    """
    xi = _excitations(xi, 1)
    n = np.shape(xi)[0]
    x0 = _scalar_param(x0, "x0")
    sigma = _step_param(sigma, "sigma", n, positive=True)
    dt = _step_param(dt, "dt", n, positive=True)
    dtype = _float_dtype(xi, x0, sigma, dt)
    return _wiener(*(jnp.asarray(v, dtype) for v in (xi, x0, sigma, dt)))


@jax.jit
def _wiener(xi, x0, sigma, dt):
    return _recursion(xi, x0, jnp.ones((), xi.dtype), sigma * jnp.sqrt(dt))


def ornstein_uhlenbeck_process(xi, x0, sigma, gamma, dt):
    """Ornstein-Uhlenbeck process ``dx = -gamma x dt + sigma dW``, exactly discretized.

    ``x_{i+1} = exp(-gamma dt_i) x_i + sqrt(sigma^2 / (2 gamma) (1 - exp(-2 gamma dt_i))) xi_i``
    (``expm1`` keeps the noise scale accurate for ``gamma dt << 1``).

    Parameters
    ----------
    xi : array, shape (N-1,)
        Standard-normal excitations, one per step.
    x0 : float or array, shape ()
        Value at ``t_0`` (units of ``x``). ``x0 = sigma / sqrt(2 gamma) * z`` with
        ``z ~ N(0, 1)`` starts the process in its stationary distribution.
    sigma : float or array, shape () or (N-1,)
        Diffusion scale, > 0 (units of ``x / sqrt(time)``); the stationary standard
        deviation is ``sigma / sqrt(2 gamma)``.
    gamma : float or array, shape () or (N-1,)
        Mean-reversion rate, > 0 (1 / time); the correlation time is ``1 / gamma``.
    dt : float or array, shape () or (N-1,)
        Step sizes, > 0 (time).

    Returns
    -------
    array, shape (N,)
        ``x(t_0), ..., x(t_{N-1})``; from a stationary start with constant parameters
        ``Cov(x_i, x_j) = sigma^2 / (2 gamma) exp(-gamma |t_i - t_j|)``.
    """
    xi = _excitations(xi, 1)
    n = np.shape(xi)[0]
    x0 = _scalar_param(x0, "x0")
    sigma = _step_param(sigma, "sigma", n, positive=True)
    gamma = _step_param(gamma, "gamma", n, positive=True)
    dt = _step_param(dt, "dt", n, positive=True)
    dtype = _float_dtype(xi, x0, sigma, gamma, dt)
    return _ornstein_uhlenbeck(*(jnp.asarray(v, dtype) for v in (xi, x0, sigma, gamma, dt)))


@jax.jit
def _ornstein_uhlenbeck(xi, x0, sigma, gamma, dt):
    drift = jnp.exp(-gamma * dt)
    cov_sqrt = sigma * jnp.sqrt(-jnp.expm1(-2.0 * gamma * dt) / (2.0 * gamma))
    return _recursion(xi, x0, drift, cov_sqrt)


def _iwp_matrices(sigma, dt):
    """Per-step transition ``[[1, dt], [0, 1]]`` and Cholesky factor of ``sigma^2 [[dt^3/3, dt^2/2], [dt^2/2, dt]]``."""
    one, zero = jnp.ones_like(dt), jnp.zeros_like(dt)
    drift = jnp.stack([jnp.stack([one, dt], -1), jnp.stack([zero, one], -1)], -2)
    s = sigma * jnp.sqrt(dt)
    cov_sqrt = jnp.stack(
        [jnp.stack([s * dt / _SQRT3, zero], -1), jnp.stack([s * (0.5 * _SQRT3), s * 0.5], -1)],
        -2,
    )
    return drift, cov_sqrt


def integrated_wiener_process(xi, x0, sigma, dt):
    """Integrated Wiener process: state ``(x, v)``, ``v`` a Wiener process of scale ``sigma``, ``x = int v dt``.

    ``(x, v)_{i+1} = A_i (x, v)_i + L_i xi_i`` with ``A_i = [[1, dt_i], [0, 1]]`` and
    ``L_i`` the lower Cholesky factor of
    ``Q_i = sigma_i^2 [[dt_i^3/3, dt_i^2/2], [dt_i^2/2, dt_i]]``, in closed form
    ``sigma_i sqrt(dt_i) [[dt_i / sqrt(3), 0], [sqrt(3) / 2, 1 / 2]]``.

    Parameters
    ----------
    xi : array, shape (N-1, 2)
        Standard-normal excitations, one pair per step.
    x0 : array, shape (2,)
        Initial state ``(x(t_0), v(t_0))`` (units of ``x`` and ``x / time``).
    sigma : float or array, shape () or (N-1,)
        Scale of the velocity's Wiener process, > 0 (units of ``x / time^(3/2)``).
    dt : float or array, shape () or (N-1,)
        Step sizes, > 0 (time).

    Returns
    -------
    array, shape (N, 2)
        ``[:, 0]`` the integrated process ``x(t_i)``, ``[:, 1]`` its derivative ``v(t_i)``.
        For ``x0 = (0, 0)`` and constant ``sigma``, with times from ``t_0`` and ``s <= t``:
        ``Cov(x(s), x(t)) = sigma^2 (s^2 t / 2 - s^3 / 6)``,
        ``Cov(x(s), v(t)) = sigma^2 s^2 / 2``, ``Cov(v(s), x(t)) = sigma^2 (s t - s^2 / 2)``,
        ``Cov(v(s), v(t)) = sigma^2 s``.
    """
    xi = _excitations(xi, 2)
    n = np.shape(xi)[0]
    if np.shape(xi)[1] != 2:
        raise ValueError(f"xi must have shape (N-1, 2) (two excitations per step), got {np.shape(xi)}")
    x0 = _scalar_param(x0, "x0", shape=(2,))
    sigma = _step_param(sigma, "sigma", n, positive=True)
    dt = _step_param(dt, "dt", n, positive=True)
    dtype = _float_dtype(xi, x0, sigma, dt)
    return _integrated_wiener(*(jnp.asarray(v, dtype) for v in (xi, x0, sigma, dt)))


@jax.jit
def _integrated_wiener(xi, x0, sigma, dt):
    drift, cov_sqrt = _iwp_matrices(sigma, jnp.broadcast_to(dt, xi.shape[:1]))
    return _recursion(xi, x0, drift, cov_sqrt)


# ----------------------------------------------------------------------------- model parameters
class _Parameter(Module):
    """A model parameter: fixed (a float or an array), ``prior(xi[name])`` or a sub-model's output.

    A sub-model whose domain is a dict shares the outer latent (its keys are merged into
    the model's domain); any other domain is nested under ``name``.
    """

    def __init__(self, spec, name: str, argname: str, kind: type, *, positive: bool, n_steps: int | None, dtype):
        self.name = name
        self.argname = argname
        self.value = None
        self.prior = None
        self.model = None
        shapes = ((),) if n_steps is None else ((), (n_steps,))
        if isinstance(spec, Model):
            target = spec.target
            if not isinstance(target, jax.ShapeDtypeStruct):
                raise TypeError(f"{argname}: a model parameter must return one array, got target {target}")
            if tuple(target.shape) not in shapes or not jnp.issubdtype(target.dtype, jnp.floating):
                raise ValueError(
                    f"{argname}: the model must return a real array of shape {' or '.join(map(str, shapes))}, "
                    f"got {target.shape} {target.dtype}"
                )
            self.model = spec
        elif isinstance(spec, Prior) or (isinstance(spec, (tuple, list)) and not isinstance(spec, str)):
            self.prior = as_prior(spec, argname, kind)
        else:
            arr = _real_array(spec, argname)
            if isinstance(arr, jax.core.Tracer):
                raise TypeError(f"{argname} must be a concrete value, not a traced array")
            arr = np.asarray(arr)
            if arr.shape not in shapes:
                want = " or ".join(str(s) for s in shapes)
                raise ValueError(
                    f"{argname} must be a scalar{' or have shape ' + want if n_steps else ''}, got shape {arr.shape}"
                )
            _check_values(arr, argname, positive)
            self.value = float(arr) if arr.ndim == 0 else arr.astype(dtype)

    def domain(self, dtype) -> dict:
        if self.prior is not None:
            return {self.name: self.prior.domain((), dtype)}
        if self.model is not None:
            dom = self.model.domain
            return dict(dom) if isinstance(dom, dict) else {self.name: dom}
        return {}

    def __call__(self, xi, dtype):
        if self.prior is not None:
            return self.prior(xi[self.name]).astype(dtype)
        if self.model is not None:
            dom = self.model.domain
            sub = {k: xi[k] for k in dom} if isinstance(dom, dict) else xi[self.name]
            return jnp.asarray(self.model(sub)).astype(dtype)
        return jnp.asarray(self.value, dtype)


def _check_prefix(prefix):
    if not isinstance(prefix, str):
        raise TypeError(f"prefix must be a str, got {type(prefix).__name__}")
    return prefix


def _grid(dt, n_points, dtype) -> np.ndarray:
    """Validated step sizes, shape ``(N-1,)``, from ``dt`` (scalar or ``(N-1,)``) and ``n_points``."""
    if isinstance(dt, jax.core.Tracer):
        raise TypeError("dt must be a concrete array (the model stores it), not a traced value")
    dt = np.asarray(_real_array(dt, "dt"))
    if n_points is not None:
        if isinstance(n_points, bool) or not isinstance(n_points, (int, np.integer)):
            raise TypeError(f"n_points must be an int, got {n_points!r}")
        if n_points < 2:
            raise ValueError(f"n_points must be >= 2 (a process needs at least one step), got {n_points}")
    if dt.ndim == 0:
        if n_points is None:
            raise ValueError("n_points is needed with a scalar dt (the number of grid points)")
        dt = np.full(int(n_points) - 1, dt)
    elif dt.ndim == 1:
        if dt.shape[0] < 1:
            raise ValueError("dt must have at least one step, got shape (0,)")
        if n_points is not None and dt.shape[0] != n_points - 1:
            raise ValueError(f"dt must have shape (n_points - 1,) = ({n_points - 1},), got {dt.shape}")
    else:
        raise ValueError(f"dt must be a scalar or have shape (N-1,) (one step per interval), got shape {dt.shape}")
    _check_values(dt, "dt", positive=True)
    dt = dt.astype(dtype)
    if not np.all(dt > 0):  # a positive float64 step that underflows in float32
        raise ValueError(f"dt must be > 0 in {np.dtype(dtype).name}, got min {dt.min()}")
    return dt


class _GaussMarkovModel(Model):
    """Shared parts of the Gauss-Markov models (grid, latent layout, parameters, call)."""

    def _setup(self, dt, n_points, prefix, dtype):
        self.dtype = _default_dtype(dtype)
        self.prefix = _check_prefix(prefix)
        self.dt = _grid(dt, n_points, self.dtype)
        return self.dt.shape[0]

    def _set_latent(self, params, xi_shape, extra=None) -> None:
        domain = dict(extra or {})
        for p in params:
            if p is None:
                continue
            sub = p.domain(self.dtype)
            clash = set(sub) & set(domain)
            if clash:
                raise ValueError(f"latent names {sorted(clash)} are used twice (check the parameter models' names)")
            domain.update(sub)
        xi_name = self.prefix + "xi"
        if xi_name in domain:
            raise ValueError(f"latent name {xi_name!r} clashes with a parameter's; change the prefix")
        domain[xi_name] = jax.ShapeDtypeStruct(xi_shape, self.dtype)
        self.xi_name = xi_name
        # the same as Model.set_domain, traced without flattening ``self`` (its attribute set is complete here)
        self.domain = normalize_domain(domain, real=True)
        self.target = jax.eval_shape(self._call, self.domain)

    @property
    def n_points(self) -> int:
        """Number of grid points ``N``."""
        return int(np.shape(self.dt)[0]) + 1

    @property
    def times(self) -> np.ndarray:
        """Grid times relative to the first point, ``[0, cumsum(dt)]``, shape (N,) (host arrays only)."""
        dt = np.asarray(self.dt)
        return np.concatenate([np.zeros(1, dt.dtype), np.cumsum(dt)])

    def _parameters(self) -> tuple:
        raise NotImplementedError

    def hyperparameters(self, xi) -> dict:
        """Realized parameters by latent-style name (``prefix + "sigma"``, ...; fixed ones included)."""
        return {p.name: p(xi, self.dtype) for p in self._parameters() if p is not None}

    def __call__(self, xi):
        """The process on the grid (one compiled program per model structure and latent dtype)."""
        return _gauss_markov_jit(self, xi)

    def _call(self, xi):
        raise NotImplementedError

    def __repr__(self):
        return (
            f"{type(self).__name__}(prefix={self.prefix!r}, n_points={self.n_points}, "
            f"dtype={self.dtype.name}, latent={sorted(self.domain)})"
        )


_gauss_markov_jit = jax.jit(lambda model, xi: model._call(xi))
_gauss_markov_jit.__name__ = "gauss_markov"  # pyright: ignore[reportAttributeAccessIssue] -- jit wrappers take it


class WienerProcess(_GaussMarkovModel):
    """Wiener process prior on a 1-D grid: ``x(t_0) = x0``, ``x_{i+1} = x_i + sigma sqrt(dt_i) xi_i``.

    Parameters
    ----------
    dt : float or array, shape (N-1,)
        Step sizes ``t_{i+1} - t_i`` (time), finite and > 0; irregular grids welcome.
        A scalar needs ``n_points``. Stored as an array leaf of the model (a program
        input, not a constant).
    sigma : float, array of shape (N-1,), (mean, std), Prior or Model
        Scale, > 0 (units of ``x / sqrt(time)``). A float or array is fixed (an array:
        one scale per step); a ``(mean, std)`` pair is a log-normal prior, a
        :class:`~shardvi.models.priors.Prior` its own prior, both on a scalar latent
        ``prefix + "sigma"``; a :class:`~shardvi.Model` returning shape ``()`` or
        ``(N-1,)`` is evaluated on its own latent (merged into this one where its
        domain is a dict).
    x0 : float, (mean, std), Prior or Model
        Value at ``t_0`` (units of ``x``); a pair is a normal prior (latent ``prefix + "x0"``).
    n_points : int, optional
        Number of grid points ``N`` (>= 2); needed with a scalar ``dt``.
    prefix : str
        Prefix of the latent names.
    dtype : float32 or float64, optional
        Latent and output dtype (default: JAX's default float).

    Notes
    -----
    Latent: ``prefix + "xi"`` of shape ``(N-1,)`` plus the inferred parameters. The
    output has shape ``(N,)``, the values at :attr:`times`. With fixed parameters the
    model is affine in the latent and ``Cov(x_i, x_j) = sigma^2 min(t_i, t_j) + Var(x0)``.

    All three process models have ``times`` (the grid times from ``t_0``, shape ``(N,)``),
    ``n_points``, ``dt`` (the steps, an array leaf) and ``hyperparameters(xi)`` (the
    realized parameters by latent-style name, fixed ones included).
    """

    def __init__(
        self,
        dt: float | np.ndarray,
        sigma: ParameterSpec,
        *,
        x0: ParameterSpec = 0.0,
        n_points: int | None = None,
        prefix: str = "wp",
        dtype=None,
    ):
        n = self._setup(dt, n_points, prefix, dtype)
        p = self.prefix
        self.sigma = _Parameter(sigma, p + "sigma", "sigma", LogNormal, positive=True, n_steps=n, dtype=self.dtype)
        self.x0 = _Parameter(x0, p + "x0", "x0", Normal, positive=False, n_steps=None, dtype=self.dtype)
        self._set_latent(self._parameters(), (n,))

    def _parameters(self):
        return (self.sigma, self.x0)

    def _call(self, xi):
        d = self.dtype
        return wiener_process(xi[self.xi_name], self.x0(xi, d), self.sigma(xi, d), jnp.asarray(self.dt, d))


class OrnsteinUhlenbeckProcess(_GaussMarkovModel):
    """Ornstein-Uhlenbeck process ``dx = -gamma x dt + sigma dW`` on a 1-D grid, exactly discretized.

    Parameters
    ----------
    dt : float or array, shape (N-1,)
        Step sizes (time), finite and > 0. A scalar needs ``n_points``.
    sigma : float, array of shape (N-1,), (mean, std), Prior or Model
        Diffusion scale, > 0 (units of ``x / sqrt(time)``); a pair is log-normal
        (latent ``prefix + "sigma"``). See :class:`WienerProcess` for the forms.
    gamma : float, array of shape (N-1,), (mean, std), Prior or Model
        Mean-reversion rate, > 0 (1 / time); a pair is log-normal (latent ``prefix + "gamma"``).
    x0 : "stationary", float, (mean, std), Prior or Model
        Value at ``t_0``. ``"stationary"`` (default): ``x0 = sigma / sqrt(2 gamma) * z``
        with a standard-normal latent ``prefix + "x0"`` (with per-step parameters, those
        of the first step), so with constant parameters the process is stationary.
        Otherwise as in :class:`WienerProcess` (a pair is a normal prior).
    n_points : int, optional
        Number of grid points ``N`` (>= 2); needed with a scalar ``dt``.
    prefix : str
        Prefix of the latent names.
    dtype : float32 or float64, optional
        Latent and output dtype.

    Notes
    -----
    Output shape ``(N,)``. Stationary start, fixed parameters:
    ``Cov(x_i, x_j) = sigma^2 / (2 gamma) exp(-gamma |t_i - t_j|)``.
    """

    def __init__(
        self,
        dt: float | np.ndarray,
        sigma: ParameterSpec,
        gamma: ParameterSpec,
        *,
        x0: str | ParameterSpec = "stationary",
        n_points: int | None = None,
        prefix: str = "ou",
        dtype=None,
    ):
        n = self._setup(dt, n_points, prefix, dtype)
        p = self.prefix
        self.sigma = _Parameter(sigma, p + "sigma", "sigma", LogNormal, positive=True, n_steps=n, dtype=self.dtype)
        self.gamma = _Parameter(gamma, p + "gamma", "gamma", LogNormal, positive=True, n_steps=n, dtype=self.dtype)
        if isinstance(x0, str):
            if x0 != "stationary":
                raise ValueError(
                    f"x0 must be 'stationary', a float, a (mean, std) pair, a Prior or a Model, got {x0!r}"
                )
            self.stationary = True
            self.x0 = None
        else:
            self.stationary = False
            self.x0 = _Parameter(x0, p + "x0", "x0", Normal, positive=False, n_steps=None, dtype=self.dtype)
        extra = {p + "x0": jax.ShapeDtypeStruct((), self.dtype)} if self.stationary else None
        self._set_latent(self._parameters(), (n,), extra)

    def _parameters(self):
        return (self.sigma, self.gamma, self.x0)

    def stationary_std(self, xi):
        """``sigma / sqrt(2 gamma)``: the stationary standard deviation (per step for per-step parameters)."""
        d = self.dtype
        return self.sigma(xi, d) / jnp.sqrt(2.0 * self.gamma(xi, d))

    def _call(self, xi):
        d = self.dtype
        sigma, gamma = self.sigma(xi, d), self.gamma(xi, d)
        if self.x0 is None:  # stationary start
            std0 = jnp.ravel(sigma)[0] / jnp.sqrt(2.0 * jnp.ravel(gamma)[0])
            x0 = std0 * jnp.asarray(xi[self.prefix + "x0"], d)
        else:
            x0 = self.x0(xi, d)
        return ornstein_uhlenbeck_process(xi[self.xi_name], x0, sigma, gamma, jnp.asarray(self.dt, d))


class IntegratedWienerProcess(_GaussMarkovModel):
    """Integrated Wiener process on a 1-D grid: ``x = int v dt`` with ``v`` a Wiener process of scale ``sigma``.

    Parameters
    ----------
    dt : float or array, shape (N-1,)
        Step sizes (time), finite and > 0. A scalar needs ``n_points``.
    sigma : float, array of shape (N-1,), (mean, std), Prior or Model
        Scale of the velocity's Wiener process, > 0 (units of ``x / time^(3/2)``); a pair
        is log-normal (latent ``prefix + "sigma"``). See :class:`WienerProcess` for the forms.
    x0 : float, (mean, std), Prior or Model
        ``x(t_0)`` (units of ``x``); a pair is a normal prior (latent ``prefix + "x0"``).
    v0 : float, (mean, std), Prior or Model
        ``v(t_0)`` (units of ``x / time``); a pair is a normal prior (latent ``prefix + "v0"``).
    n_points : int, optional
        Number of grid points ``N`` (>= 2); needed with a scalar ``dt``.
    return_velocity : bool
        Return the state ``(x, v)`` of shape ``(N, 2)`` instead of ``x`` of shape ``(N,)``.
    prefix : str
        Prefix of the latent names.
    dtype : float32 or float64, optional
        Latent and output dtype.

    Notes
    -----
    Latent ``prefix + "xi"`` of shape ``(N-1, 2)``. For ``x0 = v0 = 0`` and a fixed
    ``sigma``, ``Cov(x(s), x(t)) = sigma^2 (s^2 t / 2 - s^3 / 6)`` for ``s <= t``; an
    inferred ``x0`` adds ``Var(x0)``, an inferred ``v0`` adds ``Var(v0) s t``.
    """

    def __init__(
        self,
        dt: float | np.ndarray,
        sigma: ParameterSpec,
        *,
        x0: ParameterSpec = 0.0,
        v0: ParameterSpec = 0.0,
        n_points: int | None = None,
        return_velocity: bool = False,
        prefix: str = "iwp",
        dtype=None,
    ):
        n = self._setup(dt, n_points, prefix, dtype)
        if not isinstance(return_velocity, bool):
            raise TypeError(f"return_velocity must be a bool, got {type(return_velocity).__name__}")
        self.return_velocity = return_velocity
        p = self.prefix
        self.sigma = _Parameter(sigma, p + "sigma", "sigma", LogNormal, positive=True, n_steps=n, dtype=self.dtype)
        self.x0 = _Parameter(x0, p + "x0", "x0", Normal, positive=False, n_steps=None, dtype=self.dtype)
        self.v0 = _Parameter(v0, p + "v0", "v0", Normal, positive=False, n_steps=None, dtype=self.dtype)
        self._set_latent(self._parameters(), (n, 2))

    def _parameters(self):
        return (self.sigma, self.x0, self.v0)

    def _call(self, xi):
        d = self.dtype
        state0 = jnp.stack([self.x0(xi, d), self.v0(xi, d)])
        out = integrated_wiener_process(xi[self.xi_name], state0, self.sigma(xi, d), jnp.asarray(self.dt, d))
        return out if self.return_velocity else out[:, 0]
