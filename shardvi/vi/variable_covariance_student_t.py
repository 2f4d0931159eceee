"""Student-t likelihood whose scale is inferred (robust to outliers, noise level unknown)."""

from __future__ import annotations

import jax.numpy as jnp
import numpy as np
from jax import tree_util as jtu

from ._checks import positive_like, to_device
from .likelihood import Likelihood
from .normalization import summed_over_data
from .student_t import log1p_scaled_square, t_log_normalization
from .variable_covariance import leaf_sum, mean_std_domain, real_data

__all__ = ["VariableCovarianceStudentT"]


def _coordinate_mean(n):
    """``a sqrt(dof)`` of the geoVI coordinates (host NumPy; asinh for ``dof >= 1``, atan below)."""
    return np.where(n >= 1, (n + 1) / np.sqrt(n + 3), (n + 1) / np.sqrt(n + 2))


def _coordinate_std(n):
    """``b`` of the geoVI coordinates: ``sqrt((dof - 1)/(dof + 3))`` for ``dof >= 1``, ``sqrt(dof/(dof + 2))`` below."""
    return np.where(n >= 1, np.sqrt(np.maximum(n - 1, 0) / (n + 3)), np.sqrt(n / (n + 2)))


class VariableCovarianceStudentT(Likelihood):
    """Student-t likelihood with signal ``s = (mean, std)`` and ``dof`` degrees of freedom.

    The data are ``d = mean + std * t_dof`` (``std`` is the Student-t scale,
    not its standard deviation). Energy, ``-log p`` up to a data-independent
    constant::

        H = sum((dof + 1)/2 * log(1 + ((d - mean)/std)^2 / dof) + log(std))

    The Fisher metric per datum with respect to ``(mean, std)`` is diagonal,
    ``F_mm = (dof + 1) / ((dof + 3) std^2)``, ``F_ss = 2 dof / ((dof + 3) std^2)``,
    and is applied exactly, as is its square root ``diag(sqrt(F_mm), sqrt(F_ss))``
    (the metric samples). As for :class:`~shardvi.VariableCovarianceGaussian`
    (its ``dof -> inf`` limit) the geometry is a hyperbolic plane, and the
    geoVI coordinates reproduce the Fisher metric in expectation over data
    drawn at the point. With ``delta = (mean - d)/std`` and ``n = dof``::

        T = (a sqrt(n) asinh(delta/sqrt(n)), b log(std)),
        a = (n + 1)/sqrt(n (n + 3)),  b = sqrt((n - 1)/(n + 3))     (dof >= 1)
        T = (a sqrt(n) atan(delta/sqrt(n)), b log(std)),
        a = (n + 1)/sqrt(n (n + 2)),  b = sqrt(n/(n + 2))           (dof < 1)

    (``E[1/(1 + delta^2/n)] = n/(n + 1)`` and ``E[1/(1 + delta^2/n)^2] =
    n (n + 2)/((n + 1)(n + 3))`` under the Student-t make the expected Gram
    matrix ``diag(F_mm, F_ss)``; both maps tend to the Gaussian's
    ``(delta, log std)`` as ``dof -> inf``).

    ``dof`` is fixed at construction (as in NIFTy.re's
    ``VariableCovarianceStudentT``); to infer it, write a likelihood whose
    model also outputs it.

    Parameters
    ----------
    data : array or pytree of arrays
        Real data ``d``. The model outputs the 2-tuple ``(mean, std)``, each
        with exactly the data's structure and shapes, with ``std > 0``.
    dof : float, array or pytree
        Degrees of freedom, > 0: a scalar or an array broadcast to every data
        leaf, or a pytree with the data's structure.

    Attributes
    ----------
    data, dof : pytree of jax.Array
        The data and ``dof`` broadcast to the data's leaves (pytree leaves of
        the likelihood, per datum: a blocked likelihood cuts them with the data).
    fisher_sqrt_mean, fisher_sqrt_std : pytree of jax.Array
        ``sqrt((dof + 1)/(dof + 3))`` and ``sqrt(2 dof/(dof + 3))``: ``std``
        times the square roots of ``F_mm`` and ``F_ss``.
    coordinate_mean, coordinate_std : pytree of jax.Array
        ``a sqrt(dof)`` and ``b`` of the geoVI coordinates.

    Notes
    -----
    :meth:`normalized_residual` is ``(d - mean)/std``, like
    :class:`~shardvi.StudentT`'s; NIFTy.re multiplies it by ``sqrt((dof + 1)/(dof + 3))``.
    """

    def __init__(self, data, dof):
        d = real_data(data, "VariableCovarianceStudentT")
        nu_host = positive_like(dof, d, "dof")
        self.data = d
        self.dof = to_device(nu_host)
        # in NumPy on the host, like the checks (no eager XLA programs)
        self.fisher_sqrt_mean = to_device(jtu.tree_map(lambda n: np.sqrt((n + 1) / (n + 3)), nu_host))
        self.fisher_sqrt_std = to_device(jtu.tree_map(lambda n: np.sqrt(2 * n / (n + 3)), nu_host))
        self.coordinate_mean = to_device(jtu.tree_map(_coordinate_mean, nu_host))
        self.coordinate_std = to_device(jtu.tree_map(_coordinate_std, nu_host))
        dom = mean_std_domain(d)
        self.set_domain(dom, lsm_tangents_shape=dom)

    def energy(self, s):
        mean, std = s

        def one(d, n, m, sg):
            return jnp.sum(0.5 * (n + 1) * log1p_scaled_square((d - m) / sg, n) + jnp.log(sg))

        return leaf_sum(one, self.data, self.dof, mean, std)

    def normalization(self) -> float:
        """``sum(log Gamma(dof/2) - log Gamma((dof + 1)/2) + log(dof pi)/2)`` (the energy keeps ``log std``)."""
        return summed_over_data(lambda d, nu: t_log_normalization(nu), self.data, self.dof)

    def transformation(self, s):
        mean, std = s

        def one_mean(d, n, c, m, sg):
            u = ((m - d) / sg) / jnp.sqrt(n)
            return c * jnp.where(n >= 1, jnp.arcsinh(u), jnp.arctan(u))

        return (
            jtu.tree_map(one_mean, self.data, self.dof, self.coordinate_mean, mean, std),
            jtu.tree_map(lambda b, sg: b * jnp.log(sg), self.coordinate_std, std),
        )

    def metric(self, s, t):
        std = s[1]
        return (
            jtu.tree_map(lambda f, ti, sg: (f / sg) ** 2 * ti, self.fisher_sqrt_mean, t[0], std),
            jtu.tree_map(lambda f, ti, sg: (f / sg) ** 2 * ti, self.fisher_sqrt_std, t[1], std),
        )

    def left_sqrt_metric(self, s, e):
        std = s[1]
        return (
            jtu.tree_map(lambda f, ei, sg: (f / sg) * ei, self.fisher_sqrt_mean, e[0], std),
            jtu.tree_map(lambda f, ei, sg: (f / sg) * ei, self.fisher_sqrt_std, e[1], std),
        )

    def normalized_residual(self, s):
        mean, std = s
        return jtu.tree_map(lambda d, m, sg: (d - m) / sg, self.data, mean, std)

    @property
    def data_leaves(self):
        return {"VariableCovarianceStudentT": {"data": self.data, "dof": self.dof}}
