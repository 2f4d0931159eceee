"""Student-t likelihood (robust to outliers)."""

from __future__ import annotations

import jax.numpy as jnp
import numpy as np
from jax import tree_util as jtu

from ._checks import domain_of, finite_data, is_global, positive_like, to_device
from .likelihood import Likelihood
from .normalization import gamma_ln, summed_over_data

__all__ = ["StudentT"]


class StudentT(Likelihood):
    """Student-t likelihood with ``dof`` degrees of freedom and scale ``noise_std``.

    ``H(s) = sum((dof + 1)/2 * log(1 + ((d - s)/sigma)^2 / dof))``; Fisher
    metric ``F = (dof + 1) / ((dof + 3) sigma^2)``.

    Parameters
    ----------
    data : array or pytree of arrays
        Real data ``d``.
    dof : float or array
        Degrees of freedom, > 0.
    noise_std : float or array
        Scale ``sigma`` > 0 (same units as ``d``).

    Attributes
    ----------
    data, dof, noise_std : pytree of jax.Array
        Broadcast to the data's leaves (pytree leaves of the likelihood).
    fisher_sqrt : pytree of jax.Array
        ``sqrt((dof + 1) / (dof + 3)) / sigma``, the square root of the metric.
    """

    def __init__(self, data, dof, noise_std):
        d = finite_data(data, "data")
        if any(jnp.iscomplexobj(x) for x in jtu.tree_leaves(d)):
            raise TypeError("StudentT data must be real")
        nu_host = positive_like(dof, d, "dof")
        sig_host = positive_like(noise_std, d, "noise_std", inverse_square=True)
        self.data = d
        self.dof, self.noise_std = to_device(nu_host), to_device(sig_host)
        # in NumPy, like the checks (no eager XLA programs; JAX for arrays split over processes): sqrt and
        # division are correctly rounded in both
        self.fisher_sqrt = to_device(
            jtu.tree_map(lambda n, s: (jnp if is_global(s) else np).sqrt((n + 1) / (n + 3)) / s, nu_host, sig_host)
        )
        self.set_domain(domain_of(d))

    def energy(self, s):
        parts = jtu.tree_map(
            lambda si, di, n, sg: jnp.sum(0.5 * (n + 1) * log1p_scaled_square((di - si) / sg, n)),
            s,
            self.data,
            self.dof,
            self.noise_std,
        )
        return sum(jtu.tree_leaves(parts))

    def normalization(self) -> float:
        """``sum(log Gamma(dof/2) - log Gamma((dof + 1)/2) + log(dof pi)/2 + log sigma)``."""
        return summed_over_data(_t_constant, self.data, self.dof, self.noise_std)

    lsm_is_transformation_vjp = True  # left_sqrt_metric below is (dT/ds)^T e

    def transformation(self, s):
        return jtu.tree_map(lambda si, f: f * si, s, self.fisher_sqrt)

    def metric(self, s, t):
        return jtu.tree_map(lambda ti, f: f * f * ti, t, self.fisher_sqrt)

    def left_sqrt_metric(self, s, e):
        return jtu.tree_map(lambda ei, f: f * ei, e, self.fisher_sqrt)

    def normalized_residual(self, s):
        return jtu.tree_map(lambda si, di, sg: (di - si) / sg, s, self.data, self.noise_std)

    @property
    def data_leaves(self):
        return {"StudentT": {"data": self.data, "dof": self.dof, "noise_std": self.noise_std}}


def log1p_scaled_square(r, n):
    """``log1p(r**2 / n)`` elementwise, finite wherever ``r`` is and ``n > 0``.

    Where ``r**2 / n`` would overflow it is ``logaddexp(0, 2 log|r| - log n)``; elsewhere the
    plain expression (its bits).
    """
    limit = jnp.sqrt(jnp.finfo(jnp.result_type(r)).max) / 2 * jnp.sqrt(jnp.minimum(n, 1))
    big = jnp.abs(r) > limit
    small, large = jnp.where(big, 0, r), jnp.where(big, r, 1)
    return jnp.where(big, jnp.logaddexp(0, 2 * jnp.log(jnp.abs(large)) - jnp.log(n)), jnp.log1p(small**2 / n))


#: above this ``dof`` the normalization's ``log Gamma`` difference comes from its asymptotic series
_SERIES_DOF = 100.0


def t_log_normalization(nu):
    """``log Gamma(nu/2) - log Gamma((nu + 1)/2) + log(nu pi)/2``: ``-log`` of the unit-scale Student-t density's
    constant (host arrays, float64).

    For ``nu > 100`` the difference of the two ``log Gamma`` (each about ``(nu/2) log(nu/2)``, which would
    cancel to a few digits) is its asymptotic series in ``x = nu/2``: the constant is
    ``log(2 pi)/2 + 1/(8x) - 1/(192x^3) + 1/(640x^5) - 17/(14336x^7)``, the next term below ``1e-18`` there;
    it tends to the Gaussian's ``log(2 pi)/2``.
    """
    nu = np.asarray(nu, np.float64)
    big = nu > _SERIES_DOF
    x = 0.5 * np.where(big, nu, 2.0 * _SERIES_DOF)
    xi = 1.0 / x
    series = 0.5 * np.log(2.0 * np.pi) + xi * (1 / 8 - xi**2 * (1 / 192 - xi**2 * (1 / 640 - xi**2 * 17 / 14336)))
    small = np.where(big, 1.0, nu)
    direct = gamma_ln(0.5 * small) - gamma_ln(0.5 * (small + 1.0)) + 0.5 * np.log(small * np.pi)
    return np.where(big, series, direct)


def _t_constant(d, nu, sigma):
    del d
    return t_log_normalization(nu) + np.log(sigma)
