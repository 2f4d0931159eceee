"""Reference-posterior problems of the accuracy benchmark (``bench_accuracy.py``) and its fast test.

Each problem is built by :func:`make` from its name: a likelihood on the latent space (latent
``xi ~ N(0, I)``), the quantities whose posterior is compared (``quantities(xi)``: a dict of
arrays), the truth and a starting position. Everything is plain shardvi code, so the NUTS
reference (``numpyro``, on ``sv.vi.hamiltonian``) samples the very same posterior.

Problems (``PROBLEMS``):

- ``noise_gauss``: a 30-step Brownian motion observed at 20 steps (10 missing), innovation and
  observation noise scales both inferred with LogNormal(0, 2) priors
  (``sv.VariableCovarianceGaussian``): the path sits far from zero in units of the noise scale.
- ``noise_student``: the same path with outliers, ``sv.VariableCovarianceStudentT`` (``dof = 4``).
- ``funnel``: eight-schools hierarchical model (group means ``mu + tau * theta_j``, LogNormal
  group scale ``tau``): a funnel between ``tau`` and the group effects.
- ``gp_poisson``: a 1-D Gaussian process with learned amplitude and length scale (squared-
  exponential kernel, Cholesky in the model), Poisson counts of its exponential.
- ``lognormal_mask``: a log-normal 1-D field (fixed spectrum) behind a mask, Gaussian noise.
- ``cf_spectrum``: ``sv.CorrelatedFieldMaker`` 1-D field with learned offset, fluctuations and
  spectral slope, Gaussian noise on a masked grid (the three hyperparameters are reported with
  the field).
- ``linear``: a 1-D Wiener filter (the control: MGVI and geoVI are exact up to sampling noise).
"""

from __future__ import annotations

import math
from typing import NamedTuple

import jax
import jax.numpy as jnp
import numpy as np

PROBLEMS = ("noise_gauss", "noise_student", "funnel", "gp_poisson", "lognormal_mask", "cf_spectrum", "linear")


class Problem(NamedTuple):
    name: str
    lh: object  # sv.Likelihood on the latent space
    quantities: object  # xi -> dict of arrays
    xi_true: dict
    pos0: dict
    #: for the NUTS reference only: ``z -> (xi, log|det dxi/dz|)``, a parametrization in which NUTS
    #: mixes well (the posterior of the quantities is the same in every parametrization)
    nuts_coordinates: object = None
    #: where the benchmark's VI runs start (``pos0`` if None): away from a funnel's neck, where
    #: the problem has one (``bench_accuracy.py --start pos0`` starts at ``pos0`` instead)
    start: dict | None = None


def _f64(shape=()):
    return jax.ShapeDtypeStruct(shape, jnp.float64)


def _brownian(sv, student: bool) -> Problem:
    n, rng = 30, np.random.default_rng(7)
    observed = np.sort(np.setdiff1d(np.arange(n), np.r_[np.arange(12, 18), rng.choice(n, 4, replace=False)]))
    observed = observed[:20] if observed.size > 20 else observed
    domain = {"path": _f64((n,)), "innov": _f64(), "obs": _f64()}

    def scales(xi):
        return jnp.exp(2.0 * xi["innov"]), jnp.exp(2.0 * xi["obs"])  # LogNormal(0, 2) priors

    def path(xi):
        return jnp.cumsum(scales(xi)[0] * xi["path"])

    def call(xi):
        mean = path(xi)[observed]
        return mean, jnp.broadcast_to(scales(xi)[1], mean.shape)

    model = sv.Model(call, domain)
    xi_true = {
        "path": jnp.asarray(rng.normal(size=n) - 0.35),  # a path that drifts to about -0.8 and beyond
        "innov": jnp.asarray(0.5 * math.log(0.08)),
        "obs": jnp.asarray(0.5 * math.log(0.1)),
    }
    mean, std = call(xi_true)
    if student:
        noise = rng.standard_t(4.0, size=mean.shape)
        noise[[3, 11]] = [6.0, -5.0]  # outliers
        lh = sv.VariableCovarianceStudentT(np.asarray(mean) + np.asarray(std) * noise, 4.0)
    else:
        lh = sv.VariableCovarianceGaussian(np.asarray(mean) + np.asarray(std) * rng.normal(size=mean.shape))

    def quantities(xi):
        innov, obs = scales(xi)
        return {"obs_scale": obs, "innov_scale": innov, "path": path(xi)}

    def centered(z):  # z["path"] = the increments tau * xi["path"]: NUTS sees no funnel in tau
        tau = jnp.exp(2.0 * z["innov"])
        return {**z, "path": z["path"] / tau}, -n * 2.0 * z["innov"]

    pos0 = jax.tree.map(lambda x: 0.1 * jnp.ones_like(x), xi_true)
    # pos0's path latents are small: the neck of the funnel between the innovation scale and the
    # path, where MGVI's linear samples are wide along it. The VI start has path latents of unit
    # size (a fixed standard-normal draw), the two scales as in pos0.
    start = {**pos0, "path": jnp.asarray(np.random.default_rng(3).normal(size=n))}
    name = "noise_student" if student else "noise_gauss"
    return Problem(name, lh.amend(model), quantities, xi_true, pos0, centered, start)


def _funnel(sv) -> Problem:
    y = np.array([28.0, 8.0, -3.0, 7.0, -1.0, 1.0, 18.0, 12.0])
    sigma = np.array([15.0, 10.0, 16.0, 11.0, 9.0, 11.0, 10.0, 18.0])
    domain = {"mu": _f64(), "tau": _f64(), "theta": _f64((8,))}

    def quantities(xi):
        mu, tau = 5.0 * xi["mu"], jnp.exp(1.0 + xi["tau"])  # mu ~ N(0, 5^2), tau ~ LogNormal(1, 1)
        return {"mu": mu, "tau": tau, "effects": mu + tau * xi["theta"]}

    model = sv.Model(lambda xi: quantities(xi)["effects"], domain)
    xi_true = {"mu": jnp.asarray(0.8), "tau": jnp.asarray(0.5), "theta": jnp.asarray(y / 10.0)}
    pos0 = jax.tree.map(lambda x: 0.1 * jnp.ones_like(x), xi_true)
    return Problem("funnel", sv.Gaussian(y, noise_std=sigma).amend(model), quantities, xi_true, pos0)


def _grid_gp(n=32):
    x = np.linspace(0.0, 1.0, n)
    return x, (x[:, None] - x[None, :]) ** 2


def _gp_poisson(sv) -> Problem:
    x, d2 = _grid_gp()
    n, rng = x.size, np.random.default_rng(11)
    domain = {"f": _f64((n,)), "amp": _f64(), "ell": _f64(), "offset": _f64()}

    def quantities(xi):
        amp = jnp.exp(-0.5 + 0.5 * xi["amp"])  # LogNormal(-0.5, 0.5)
        ell = jnp.exp(math.log(0.15) + 0.4 * xi["ell"])  # LogNormal(log 0.15, 0.4)
        k = amp**2 * jnp.exp(-0.5 * jnp.asarray(d2) / ell**2) + 1e-6 * jnp.eye(n)
        log_rate = math.log(3.0) + 0.5 * xi["offset"] + jnp.linalg.cholesky(k) @ xi["f"]
        return {"amplitude": amp, "length_scale": ell, "rate": jnp.exp(log_rate)}

    model = sv.Model(lambda xi: quantities(xi)["rate"], domain)
    xi_true = {"f": jnp.asarray(rng.normal(size=n)), "amp": jnp.asarray(0.3), "ell": jnp.asarray(-0.2)}
    xi_true["offset"] = jnp.asarray(0.0)
    counts = rng.poisson(np.asarray(model(xi_true))).astype(np.float64)
    pos0 = jax.tree.map(lambda x: 0.1 * jnp.ones_like(x), xi_true)
    return Problem("gp_poisson", sv.Poisson(counts).amend(model), quantities, xi_true, pos0)


def _spectral_field(n, scale=4.0, amp=1.0):
    """``xi -> f``: a stationary 1-D field of pixel std ``amp``, the orthonormal Hartley transform of ``A xi``."""
    k = np.minimum(np.arange(n), n - np.arange(n))
    a = 1.0 / (1.0 + (k / scale) ** 2)
    a = jnp.asarray(amp * a / np.sqrt(np.mean(a**2)))

    def field(xi):
        h = jnp.fft.fft(a * xi) / math.sqrt(n)
        return h.real + h.imag

    return field


def _masked(n, rng):
    keep = np.ones(n, bool)
    keep[n // 3 : n // 3 + n // 6] = False
    keep[rng.random(n) < 0.25] = False
    return np.flatnonzero(keep)


def _masked_field(sv, name, seed, link, amp=1.0) -> Problem:
    """A 48-pixel stationary field behind a mask, ``signal = link(field)``, Gaussian noise of std 0.3."""
    n, rng = 48, np.random.default_rng(seed)
    idx, field = _masked(n, rng), _spectral_field(n, amp=amp)
    domain = {"f": _f64((n,))}

    def quantities(xi):
        return {"signal": link(field(xi["f"]))}

    model = sv.Model(lambda xi: quantities(xi)["signal"][idx], domain)
    xi_true = {"f": jnp.asarray(rng.normal(size=n))}
    data = np.asarray(model(xi_true)) + 0.3 * rng.normal(size=idx.size)
    pos0 = {"f": jnp.zeros(n)}
    return Problem(name, sv.Gaussian(data, noise_std=0.3).amend(model), quantities, xi_true, pos0)


def _lognormal_mask(sv) -> Problem:
    return _masked_field(sv, "lognormal_mask", 13, jnp.exp, amp=0.8)


def _linear(sv) -> Problem:
    return _masked_field(sv, "linear", 17, lambda f: f)


def _cf_spectrum(sv) -> Problem:
    n, rng = 64, np.random.default_rng(19)
    cfm = sv.CorrelatedFieldMaker("cf", dtype=jnp.float64)
    cfm.set_amplitude_total_offset(0.0, (0.3, 0.1))
    cfm.add_fluctuations((n,), 1.0 / n, fluctuations=(0.8, 0.2), loglogavgslope=(-3.0, 0.5), prefix="f")
    field = cfm.finalize()
    idx = _masked(n, rng)

    def quantities(xi):
        h = field.hyperparameters(xi)
        return {
            "signal": field(xi),
            "offset_std": h["cfzeromode"],
            "fluctuations": h["cfffluctuations"],
            "slope": h["cffloglogavgslope"],
        }

    model = sv.Model(lambda xi: field(xi)[idx], field.domain)
    xi_true = field.init(jax.random.PRNGKey(19))
    data = np.asarray(model(xi_true)) + 0.2 * rng.normal(size=idx.size)
    pos0 = jax.tree.map(lambda d: jnp.zeros(d.shape), field.domain)
    return Problem("cf_spectrum", sv.Gaussian(data, noise_std=0.2).amend(model), quantities, xi_true, pos0)


def brownian_quadrature(problem: Problem, n_grid: int = 801) -> dict:
    """The exact posterior moments of ``noise_gauss`` (``{"quantity": (mean, std)}``), by quadrature.

    Given the two scales the path is a linear-Gaussian problem: the data's marginal likelihood
    ``N(d; 0, tau^2 C + sigma^2 I)`` and the path's conditional mean and covariance are closed
    forms (``C`` the data's covariance of a unit Brownian motion, diagonalized once). The two
    scales' latents are integrated on an ``n_grid^2`` grid wide enough that its edges carry
    no mass (checked).
    """
    lh = problem.lh
    n = problem.xi_true["path"].size
    zero = jnp.asarray(0.0)
    # the observation operator of the path (tau = 1): d mean / d path, with path = cumsum(xi)
    jac = np.asarray(jax.jacfwd(lambda v: lh.model({"path": v, "innov": zero, "obs": zero})[0])(jnp.zeros(n)))
    select = jac @ np.linalg.inv(np.tril(np.ones((n, n))))
    k = np.minimum.outer(np.arange(n), np.arange(n)) + 1.0
    lam, u = np.linalg.eigh(select @ k @ select.T)
    dt = u.T @ np.asarray(lh.likelihood.data)
    xi_innov, xi_obs = np.meshgrid(np.linspace(-4.0, 2.0, n_grid), np.linspace(-8.0, 1.0, n_grid), indexing="ij")
    tau2, sig2 = np.exp(4.0 * xi_innov), np.exp(4.0 * xi_obs)
    v = tau2[..., None] * lam + sig2[..., None]
    logp = -0.5 * np.sum(np.log(v) + dt**2 / v, -1) - 0.5 * (xi_innov**2 + xi_obs**2)
    w = np.exp(logp - logp.max())
    w /= w.sum()
    edge = max(w[0].sum(), w[-1].sum(), w[:, 0].sum(), w[:, -1].sum())
    if edge > 1e-12:
        raise RuntimeError(f"the quadrature grid's edges carry {edge:.1e} of the posterior mass")

    def moments(x):
        m = np.sum(w * x)
        return m, np.sqrt(np.sum(w * (x - m) ** 2))

    a = (k @ select.T) @ u
    cond_mean = np.einsum("ik,abk->abi", a, tau2[..., None] * (dt / v))
    cond_var = tau2[..., None] * np.diag(k) - np.einsum("ik,abk->abi", a**2, tau2[..., None] ** 2 / v)
    path_mean = np.einsum("ab,abi->i", w, cond_mean)
    path_var = np.einsum("ab,abi->i", w, cond_var + cond_mean**2) - path_mean**2
    return {
        "obs_scale": moments(np.sqrt(sig2)),
        "innov_scale": moments(np.sqrt(tau2)),
        "path": (path_mean, np.sqrt(path_var)),
    }


def wiener_exact(problem: Problem) -> dict:
    """The exact posterior moments of ``linear`` (``{"signal": (mean, std)}``): the Wiener filter.

    The model is linear, ``d = R xi + n`` with ``xi ~ N(0, I)`` and white noise: the posterior of
    ``xi`` is ``N(D R^T N^{-1} d, D)`` with ``D = (1 + R^T N^{-1} R)^{-1}``, and the signal
    ``S xi`` has mean ``S m`` and covariance ``S D S^T`` (``R``, ``S`` by ``jax.jacfwd``).
    """
    lh = problem.lh
    x0 = jnp.zeros_like(problem.xi_true["f"])
    resp = np.asarray(jax.jacfwd(lambda v: lh.model({"f": v}))(x0))
    sig = np.asarray(jax.jacfwd(lambda v: problem.quantities({"f": v})["signal"])(x0))
    ninv = np.broadcast_to(1.0 / np.asarray(lh.likelihood.noise_std) ** 2, resp.shape[:1])
    d_cov = np.linalg.inv(np.eye(x0.size) + resp.T @ (ninv[:, None] * resp))
    mean = d_cov @ (resp.T @ (ninv * np.asarray(lh.likelihood.data)))
    return {"signal": (sig @ mean, np.sqrt(np.diag(sig @ d_cov @ sig.T)))}


def make(name: str) -> Problem:
    """The problem ``name`` (one of :data:`PROBLEMS`); needs ``jax_enable_x64``."""
    import shardvi as sv

    builders = {
        "noise_gauss": lambda: _brownian(sv, student=False),
        "noise_student": lambda: _brownian(sv, student=True),
        "funnel": lambda: _funnel(sv),
        "gp_poisson": lambda: _gp_poisson(sv),
        "lognormal_mask": lambda: _lognormal_mask(sv),
        "cf_spectrum": lambda: _cf_spectrum(sv),
        "linear": lambda: _linear(sv),
    }
    if name not in builders:
        raise ValueError(f"unknown problem {name!r}; choose from {PROBLEMS}")
    return builders[name]()
