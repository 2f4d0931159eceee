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
            lambda si, di, n, sg: jnp.sum(0.5 * (n + 1) * jnp.log1p(((di - si) / sg) ** 2 / n)),
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


def t_log_normalization(nu):
    """``log Gamma(nu/2) - log Gamma((nu + 1)/2) + log(nu pi)/2``: ``-log`` of the unit-scale Student-t density's
    constant (host arrays, float64)."""
    return gamma_ln(0.5 * nu) - gamma_ln(0.5 * (nu + 1.0)) + 0.5 * np.log(nu * np.pi)


def _t_constant(d, nu, sigma):
    del d
    return t_log_normalization(nu) + np.log(sigma)
