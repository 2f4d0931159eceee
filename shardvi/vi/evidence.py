"""The evidence lower bound (ELBO) of a variational posterior: :func:`estimate_evidence_lower_bound`.

For a Gaussian approximation ``q = N(xi_bar, M^{-1})`` of the posterior of
``xi ~ N(0, I)``, with ``M = M(xi_bar) = I + J^T F J`` the metric MGVI samples
with (``n`` latent parameters)::

    log p(d) >= ELBO = -E_q[H(xi)] - c + n / 2 - log det(M) / 2

(the prior's and the entropy's ``2 pi`` factors cancel), where
``H = H_lh + xi.xi / 2`` is the Hamiltonian and ``c`` the likelihood's
normalization (:meth:`~shardvi.Likelihood.normalization`: the
``log det(2 pi N) / 2`` of a Gaussian, the ``sum log d!`` of a Poisson, ...),
which the energies drop. With ``normalized=False`` the constant is left out,
as NIFTy.re does: then the value is the bound up to a data-dependent constant
that cancels only between models of the same data and noise.
``E_q[H]`` is estimated by the samples' average; ``log det M`` is computed by
one of

- ``"dense"``: the explicit ``n x n`` metric (its columns mapped over devices)
  and its eigenvalues: exact;
- ``"slq"``: stochastic Lanczos quadrature (Ubaru, Chen & Saad 2017, SIAM J.
  Matrix Anal. Appl. 38:1075): Rademacher probes, each a Lanczos run mapped
  over devices; unbiased with a standard error from the probes' spread;
- ``"eigsh"``: the ``k`` largest eigenvalues of ``J^T F J`` (ARPACK, as
  NIFTy.re does); the other ``min(n, n_data) - k`` non-unit eigenvalues of
  ``M`` are bounded by the smallest one found, which bounds the ELBO from
  below (the value itself treats them as 1, an upper estimate).

For a linear-Gaussian problem with exact posterior samples the bound is the
log-evidence (Frank, Leike & Enßlin 2021, Entropy 23:853, Sec. 5.1).
"""

from __future__ import annotations

import functools
import math
from typing import NamedTuple

import jax
import jax.numpy as jnp
import numpy as np
from jax import tree_util as jtu
from jax.flatten_util import ravel_pytree

from ..models.model import check_latent
from ..parallel.field_arrays import holds_global
from ..parallel.memory import InsufficientMemoryError, check_memory, format_bytes, memory_limit
from ..parallel.reproducible import engine_options_key, reproducible_jit
from ..parallel.strategy import Placed, Strategy, get_strategy
from ._checks import check_bool
from .kl import hamiltonian, hamiltonian_metric
from .likelihood import Likelihood
from .planner import choose_strategy
from .samples import Samples
from .settings import raw_key

__all__ = ["EvidenceLowerBound", "METHODS", "estimate_evidence_lower_bound"]

METHODS = ("auto", "dense", "slq", "eigsh")
DENSE_MAX = 2048  # "auto" builds the explicit metric up to this many latent parameters
_COLUMNS = 256  # metric columns per mapped call of the dense method


class EvidenceLowerBound(NamedTuple):
    """An ELBO estimate (all in nats).

    Attributes
    ----------
    value : float
        ``mean_i ELBO_i``: the bound estimated with the samples.
    std : float
        Standard error of ``value``: the samples' spread (antithetic pairs
        averaged first; ``nan`` with fewer than two independent samples) and,
        for ``"slq"``, the log-determinant's, added in quadrature.
    lower, upper : float
        ``value -/+ std``; for ``"eigsh"`` ``lower`` also subtracts half the
        truncation bound of the log-determinant.
    per_sample : numpy.ndarray
        ``-H(xi_i) - c + n/2 - log det(M)/2`` per sample, shape ``(n_samples,)``.
    expected_energy : float
        ``mean_i H(xi_i)`` (without ``c``).
    normalization : float
        ``c``, the likelihood's normalization included in the value (0 with
        ``normalized=False``).
    log_det_metric : float
        ``log det M`` at ``samples.pos`` (``"eigsh"``: of the eigenvalues found).
    log_det_std : float
        Standard error of ``log_det_metric`` (``"slq"``; 0 otherwise).
    log_det_truncation : float
        ``"eigsh"``: upper bound of the omitted part of ``log det M`` (0 otherwise).
    method : str
        ``"dense"``, ``"slq"`` or ``"eigsh"``.
    n_latent : int
        Number of latent parameters ``n``.
    n_relevant : int
        ``min(n, number of data)``: the eigenvalues of ``M`` that can differ from 1.
    eigenvalues : numpy.ndarray or None
        Eigenvalues of ``M`` found, descending (``"dense"``, ``"eigsh"``).
    """

    value: float
    std: float
    lower: float
    upper: float
    per_sample: np.ndarray
    expected_energy: float
    normalization: float
    log_det_metric: float
    log_det_std: float
    log_det_truncation: float
    method: str
    n_latent: int
    n_relevant: int
    eigenvalues: np.ndarray | None

    def __repr__(self):
        return (
            f"EvidenceLowerBound(value={self.value:.6g}, std={self.std:.3g}, method={self.method!r}, "
            f"log_det_metric={self.log_det_metric:.6g}, n_latent={self.n_latent})"
        )


def _check(lh, samples) -> None:
    if not isinstance(lh, Likelihood):
        raise TypeError(f"likelihood must be a shardvi Likelihood, got {type(lh).__name__}")
    if holds_global(lh):
        raise ValueError(
            "estimate_evidence_lower_bound needs the likelihood's arrays whole on every process: these are split "
            "over processes (sv.parallel.field_array / field_model); build the likelihood from whole arrays"
        )
    if not isinstance(samples, Samples):
        raise TypeError(f"samples must be a shardvi Samples (from optimize_kl), got {type(samples).__name__}")
    if len(samples) == 0:
        raise ValueError(
            "samples holds no posterior samples (a point estimate, e.g. a run with n_samples=0): the ELBO is an "
            "expectation over the variational posterior q and needs its samples; run optimize_kl with "
            "n_samples >= 1 (antithetic pairs)"
        )
    for d in jtu.tree_leaves(lh.domain):
        if not jnp.issubdtype(d.dtype, jnp.floating):
            raise TypeError(f"estimate_evidence_lower_bound needs a real floating latent domain, got {d.dtype}")
    # a Samples object with a position of another structure cannot be evaluated
    check_latent(samples.pos, lh.domain, "samples.pos", exact_dtype=True)


def _independent_groups(samples: Samples) -> int:
    """2 where the samples are antithetic pairs (averaged before their spread is taken), else 1."""
    n = len(samples)
    if n < 2 or n % 2:
        return 1
    keys = samples.keys
    if keys is not None and int(np.shape(keys)[0]) * 2 == n:
        return 2
    if keys is None:
        mirrored = all(
            np.array_equal(np.asarray(r)[0::2], -np.asarray(r)[1::2]) for r in jtu.tree_leaves(samples.residuals)
        )
        return 2 if mirrored else 1
    return 1


def _n_data(lh) -> int:
    shape = getattr(lh, "lsm_tangents_shape", None)
    if shape is None:
        return -1
    return sum(
        int(np.prod(d.shape)) * (2 if jnp.issubdtype(d.dtype, jnp.complexfloating) else 1)
        for d in jtu.tree_leaves(shape)
    )


def _check_dense_fits(n: int, limit) -> None:
    """The explicit ``n x n`` metric (float64, on the host and in the eigensolver) must fit the host memory."""
    host_limit, source = memory_limit([jax.devices("cpu")[0]], limit)  # the metric is assembled on the host
    need = 3 * n * n * 8  # the columns, their symmetrized copy and the eigensolver's workspace
    if host_limit is not None and need > host_limit:
        raise InsufficientMemoryError(
            f"method='dense' builds the {n} x {n} metric ({format_bytes(need)} with the eigensolver's copies) but "
            f"the host has {format_bytes(host_limit)} ({source}): use method='slq' (stochastic Lanczos) or "
            "method='eigsh' with n_eigenvalues",
            need,
            host_limit,
        )


def _check_probes_fit(n: int, itemsize: int, n_probes: int, order: int, strategy: Strategy, limit) -> None:
    """The SLQ probes' keys, Lanczos tridiagonals and the Lanczos bases of one chunk must fit one device."""
    devs = getattr(strategy, "devices", None) or (jax.local_devices()[0],)
    device_limit, source = memory_limit(devs, limit)
    if device_limit is None:
        return
    chunk = getattr(strategy, "chunk_size", 1)
    chunk = n_probes if chunk is None else min(int(chunk), n_probes)
    per_probe = 2 * 8 + (2 * order + 1) * 8  # the key (and its padded copy), alpha, beta and the step count
    basis = (order + 4) * n * itemsize  # the Lanczos vectors of one probe and its work vectors
    need = n_probes * per_probe + chunk * basis
    if need > device_limit:
        room = max((device_limit - chunk * basis) // per_probe, 0)
        raise InsufficientMemoryError(
            f"method='slq' with n_probes={n_probes} (lanczos_order={order}) needs {format_bytes(need)} per device "
            f"for its probes but a device has {format_bytes(device_limit)} ({source}): at most n_probes={room} "
            "fit; use fewer probes (the standard error falls as 1/sqrt(n_probes)), a sample_map with a smaller "
            "chunk_size, or pass memory_limit=... (bytes per device) if the limit is wrong",
            need,
            device_limit,
        )


def _flat_metric(lik, p, v):
    """``M(p) v`` on the flat (raveled) latent vector ``v``."""
    _, unravel = ravel_pytree(p)
    return ravel_pytree(hamiltonian_metric(lik, p, unravel(v)))[0]


@functools.lru_cache(maxsize=32)
def _steps(strategy: Strategy, options: tuple = ()) -> dict:
    """The compiled programs of one strategy (kept: repeated estimates do not trace or compile again).

    ``options``: the engine's compiler options when built (part of the cache key only).
    """

    def energies(lik, xs):
        return strategy.map(hamiltonian, (None, 0))(lik, xs)

    def columns(lik, p, vs):
        return strategy.map(_flat_metric, (None, None, 0))(lik, p, vs)

    def probes(lik, p, keys, order):
        return strategy.map(lambda li, pp, k: _probe(li, pp, k, order), (None, None, 0))(lik, p, keys)

    return {
        "energies": Placed(strategy, reproducible_jit(energies)),
        "columns": Placed(strategy, reproducible_jit(columns)),
        "probes": Placed(strategy, reproducible_jit(probes, static_argnames="order")),
        "matvec": jax.jit(_flat_metric),
    }


def _energies(lh, samples: Samples, strategy: Strategy) -> np.ndarray:
    return np.asarray(_steps(strategy, engine_options_key())["energies"](lh, samples.samples), dtype=np.float64)


def _dense_log_det(lh, pos, strategy):
    flat, _ = ravel_pytree(pos)
    n = flat.size
    eye = np.eye(n, dtype=flat.dtype)
    cols = [
        np.asarray(_steps(strategy, engine_options_key())["columns"](lh, pos, eye[i : i + _COLUMNS]))
        for i in range(0, n, _COLUMNS)
    ]
    m = np.concatenate(cols, axis=0).astype(np.float64)  # row i = M e_i = column i (M symmetric)
    import scipy.linalg  # here: a run that does not estimate the ELBO does not load scipy (memory per process)

    ev = np.flip(scipy.linalg.eigvalsh(0.5 * (m + m.T)))
    if ev[-1] <= 0:
        raise ValueError(
            f"the metric at samples.pos is not positive definite (smallest eigenvalue {ev[-1]:.3e}): "
            "the likelihood's Fisher metric is broken"
        )
    return float(np.sum(np.log(ev))), 0.0, 0.0, ev


def _lanczos(matvec, z, order: int):
    """``order`` Lanczos steps from ``z`` with full reorthogonalization: ``(alpha, beta, k)``.

    ``k`` is the number of valid steps (the Krylov space may be exhausted earlier:
    ``beta`` below round-off of the operator's scale).
    """
    n = z.shape[0]
    dtype = z.dtype
    eps = jnp.finfo(dtype).eps

    def body(j, carry):
        v, alpha, beta, k, alive, scale = carry
        q = v[j]
        w = matvec(q)
        a = jnp.vdot(q, w)
        w = w - v.T @ (v @ w)  # full reorthogonalization against every basis vector so far (zeros beyond j)
        w = w - v.T @ (v @ w)
        b = jnp.linalg.norm(w)
        scale = jnp.where(alive, jnp.maximum(scale, jnp.abs(a) + b), scale)
        go_on = alive & (b > 1e3 * eps * scale)  # else: the Krylov space is exhausted, T_k is exact
        v = v.at[j + 1].set(jnp.where(go_on, w / jnp.where(go_on, b, 1.0), 0.0))
        alpha = alpha.at[j].set(jnp.where(alive, a, 0.0))
        beta = beta.at[j].set(jnp.where(go_on, b, 0.0))
        return v, alpha, beta, jnp.where(alive, j + 1, k), go_on, scale

    v0 = jnp.zeros((order + 1, n), dtype).at[0].set(z / jnp.linalg.norm(z))
    zero = jnp.zeros(order, dtype)
    init = (v0, zero, zero, jnp.asarray(0), jnp.asarray(True), jnp.asarray(0.0, dtype))
    _, alpha, beta, k, _, _ = jax.lax.fori_loop(0, order, body, init)
    return alpha, beta, k


def _quadrature(alpha, beta, k, norm2) -> float:
    """``|z|^2 e1^T log(T_k) e1`` for the ``k x k`` Lanczos tridiagonal ``T_k``."""
    import scipy.linalg

    theta, vecs = scipy.linalg.eigh_tridiagonal(alpha[:k], beta[: k - 1])
    if theta[0] <= 0:
        raise ValueError(
            f"the metric at samples.pos is not positive definite (Lanczos eigenvalue {theta[0]:.3e}): "
            "the likelihood's Fisher metric is broken"
        )
    return float(norm2 * np.sum(vecs[0] ** 2 * np.log(theta)))


def _probe(lik, p, key, order: int):
    """One SLQ probe: the Lanczos tridiagonal of ``M(p)`` from a Rademacher vector drawn from ``key``."""
    flat, _ = ravel_pytree(p)
    z = jax.random.rademacher(key, flat.shape, flat.dtype)
    return _lanczos(lambda v: _flat_metric(lik, p, v), z, order)


def _slq_log_det(lh, pos, strategy, key, n_probes: int, order: int):
    n = ravel_pytree(pos)[0].size
    order = min(order, n)
    out = _steps(strategy, engine_options_key())["probes"](lh, pos, jax.random.split(key, n_probes), order=order)
    alpha, beta, steps = (np.asarray(a) for a in out)
    est = np.array([_quadrature(alpha[i], beta[i], int(steps[i]), n) for i in range(n_probes)])
    se = float(np.std(est, ddof=1) / math.sqrt(n_probes)) if n_probes > 1 else float("nan")
    return float(np.mean(est)), se, 0.0, None


def _eigsh_log_det(lh, pos, strategy, k: int, n_relevant: int):
    flat, _ = ravel_pytree(pos)
    n = flat.size
    matvec = _steps(strategy, engine_options_key())["matvec"]

    def kv(v):  # J^T F J v = (M - I) v, positive semi-definite
        v = np.asarray(v, dtype=flat.dtype).reshape(-1)
        return np.asarray(matvec(lh, pos, v), dtype=np.float64) - v

    import scipy.sparse.linalg

    op = scipy.sparse.linalg.LinearOperator((n, n), matvec=kv, dtype=np.float64)  # pyright: ignore[reportCallIssue]
    lam = np.flip(np.sort(scipy.sparse.linalg.eigsh(op, k=k, which="LA", return_eigenvectors=False)))
    ev = 1.0 + np.maximum(lam, 0.0)
    found = float(np.sum(np.log(ev)))
    truncation = float(max(n_relevant - k, 0) * np.log(ev[-1]))
    return found, 0.0, truncation, ev


def estimate_evidence_lower_bound(
    likelihood: Likelihood,
    samples: Samples,
    n_eigenvalues: int | None = None,
    *,
    method: str = "auto",
    key=None,
    n_probes: int = 32,
    lanczos_order: int = 60,
    sample_map: str | Strategy = "vmap",
    devices=None,
    normalized: bool = True,
    memory_limit: int | None = None,
) -> EvidenceLowerBound:
    """Estimate the evidence lower bound of the approximate posterior ``samples``.

    Parameters
    ----------
    likelihood : Likelihood
        On the latent space (``lh.amend(model)``), as given to
        :func:`~shardvi.optimize_kl`; amended with ``data_blocks`` or
        ``field_blocks`` too, its arrays whole on every process (not split
        over processes: a ``ValueError``).
    samples : Samples
        Posterior samples around ``samples.pos`` (the variational mean).
    n_eigenvalues : int, optional
        For ``method="eigsh"`` (or ``"auto"``): how many of the largest
        metric eigenvalues to compute.
    method : {"auto", "dense", "slq", "eigsh"}
        How ``log det M`` is computed (module docstring). ``"auto"``:
        ``"eigsh"`` when ``n_eigenvalues`` is given and below the number of
        relevant eigenvalues, else ``"dense"`` up to 2048 latent parameters,
        else ``"slq"``.
    key : jax key, optional
        Random key of the SLQ probes (default ``PRNGKey(0)``); checked as
        one threefry key whenever given, whichever the method.
    n_probes : int
        SLQ probes (>= 2 for a standard error); their keys, results and the
        Lanczos bases of one chunk must fit ``memory_limit``.
    lanczos_order : int
        Lanczos steps per SLQ probe (at most ``n``; fewer where the Krylov
        space is exhausted).
    sample_map, devices
        How the per-sample energies, metric columns (``"dense"``) and SLQ
        probes are mapped over devices, as in :func:`~shardvi.optimize_kl`
        (``"auto"`` included).
    normalized : bool
        Include the likelihood's normalization ``c`` (default), so that the
        value is a lower bound on ``log p(d)`` itself; ``False`` leaves it
        out (NIFTy.re's convention: comparable only between models of the
        same data and noise). A likelihood whose normalization is unknown
        (:meth:`~shardvi.Likelihood.normalization` returns ``None``) needs
        ``normalized=False``. A Python or NumPy bool.
    memory_limit : int, optional
        Bytes per device. Before any work the samples, for
        ``method="dense"`` the ``n x n`` metric and for ``method="slq"`` the
        ``n_probes`` probes are held against it (default: the device's
        memory); too large raises
        :class:`~shardvi.parallel.memory.InsufficientMemoryError`.

    Returns
    -------
    EvidenceLowerBound
        ``.value`` and ``.std`` in nats (natural-log units).

    Raises
    ------
    TypeError
        ``key`` is not one threefry key, ``normalized`` not a bool, an int
        argument of another type.
    ValueError
        For samples without residuals (a point estimate), or with
        ``normalized=True`` for a likelihood that does not know its
        normalization.
    InsufficientMemoryError
        The samples, the dense metric or the SLQ probes do not fit
        ``memory_limit``.
    """
    lh = likelihood
    _check(lh, samples)
    check_bool(normalized, "normalized")
    probe_key = None if key is None else raw_key(key, "key")
    c = lh.normalization() if normalized else 0.0
    if c is None:
        raise ValueError(
            f"the likelihood ({type(lh).__name__}) does not know its normalization c (-log p(d|s) = energy + c), "
            "so the ELBO cannot bound log p(d): pass normalized=False (the bound up to that constant, NIFTy.re's "
            "convention), or give it (Likelihood(..., normalization=c); Gaussian(..., noise_log_det=...) for a "
            "callable noise)"
        )
    if method not in METHODS:
        raise ValueError(f"method must be one of {METHODS}, got {method!r}")
    for name, v, lo in (("n_probes", n_probes, 1), ("lanczos_order", lanczos_order, 1)):
        if isinstance(v, bool) or not isinstance(v, (int, np.integer)):
            raise TypeError(f"{name} must be an int, got {type(v).__name__}")
        if v < lo:
            raise ValueError(f"{name} must be >= {lo}, got {v}")
    n = sum(int(np.prod(d.shape)) for d in jtu.tree_leaves(lh.domain))
    n_data = _n_data(lh)
    n_relevant = n if n_data < 0 else min(n, n_data)
    if n_eigenvalues is not None:
        if isinstance(n_eigenvalues, bool) or not isinstance(n_eigenvalues, (int, np.integer)):
            raise TypeError(f"n_eigenvalues must be an int or None, got {type(n_eigenvalues).__name__}")
        if not 1 <= n_eigenvalues <= n_relevant:
            raise ValueError(
                f"n_eigenvalues must be in [1, {n_relevant}] (the metric eigenvalues that can differ from 1: "
                f"min(latent size {n}, data size {n_data})), got {n_eigenvalues}"
            )
    if method == "auto":
        if n_eigenvalues is not None and n_eigenvalues < n_relevant:
            method = "eigsh"
        else:
            method = "dense" if n <= DENSE_MAX else "slq"
    if method == "eigsh" and n_eigenvalues is None:
        raise ValueError("method='eigsh' needs n_eigenvalues (how many of the largest eigenvalues to compute)")
    if method == "eigsh" and n_eigenvalues is not None and n_eigenvalues >= n - 1:
        method = "dense"  # ARPACK needs k < n - 1; then the explicit metric is small anyway
    if sample_map == "auto":
        sample_map = choose_strategy(
            lh,
            samples.pos,
            n_samples=max(len(samples) // 2, 1),
            devices=devices,
            memory_limit=memory_limit,
            sample_mode="linear_resample",
        )
        devices = None
    strategy = get_strategy(sample_map, "sample_map", devices)
    check_memory(lh, len(samples), strategy, mirror_samples=False, memory_limit=memory_limit, what="the ELBO")
    if method == "dense":
        _check_dense_fits(n, memory_limit)
    if method == "slq":
        itemsize = max(np.dtype(d.dtype).itemsize for d in jtu.tree_leaves(lh.domain))
        _check_probes_fit(n, itemsize, n_probes, min(lanczos_order, n), strategy, memory_limit)
    pos = samples.pos

    if method == "dense":
        log_det, log_det_se, trunc, ev = _dense_log_det(lh, pos, strategy)
    elif method == "slq":
        k = jax.random.PRNGKey(0) if probe_key is None else probe_key
        log_det, log_det_se, trunc, ev = _slq_log_det(lh, pos, strategy, k, n_probes, lanczos_order)
    else:
        assert n_eigenvalues is not None
        log_det, log_det_se, trunc, ev = _eigsh_log_det(lh, pos, strategy, n_eigenvalues, n_relevant)

    energies = _energies(lh, samples, strategy)
    per_sample = -energies - c + 0.5 * n - 0.5 * log_det
    group = _independent_groups(samples)
    units = per_sample.reshape(-1, group).mean(axis=1)
    sample_se = float(np.std(units, ddof=1) / math.sqrt(units.size)) if units.size > 1 else float("nan")
    value = float(np.mean(per_sample))
    std = math.sqrt(sample_se**2 + (0.5 * log_det_se) ** 2)
    return EvidenceLowerBound(
        value=value,
        std=std,
        lower=value - std - 0.5 * trunc,
        upper=value + std,
        per_sample=per_sample,
        expected_energy=float(np.mean(energies)),
        normalization=float(c),
        log_det_metric=log_det,
        log_det_std=log_det_se,
        log_det_truncation=trunc,
        method=method,
        n_latent=n,
        n_relevant=n_relevant,
        eigenvalues=ev,
    )
