"""Gaussian likelihood whose noise standard deviation is inferred."""

from __future__ import annotations

import jax
import jax.numpy as jnp

from ._checks import finite_data
from .likelihood import Likelihood

__all__ = ["VariableCovarianceGaussian"]

_SQRT2 = 2.0**0.5


class VariableCovarianceGaussian(Likelihood):
    """Gaussian likelihood with signal ``s = (mean, std)`` (a 2-tuple of arrays).

    ``H = sum(((d - mean)/std)^2 / 2 + log(std))``. The Fisher metric is
    ``diag(1/std^2, 2/std^2)`` and is applied exactly; the geoVI transformation
    ``T = (mean/std, sqrt(2) log(std))`` reproduces it up to the mean-std cross
    term, which vanishes where ``mean`` is small relative to ``std``.

    Parameters
    ----------
    data : array
        Real data ``d``; the model must output ``(mean, std)`` shaped like it,
        with ``std > 0``.
    """

    def __init__(self, data):
        d = finite_data(data, "data")
        if not isinstance(d, jax.Array) or jnp.iscomplexobj(d):
            raise TypeError("VariableCovarianceGaussian data must be one real array")
        sds = jax.ShapeDtypeStruct(d.shape, d.dtype)
        self.data = d
        self.set_domain((sds, sds), lsm_tangents_shape=(sds, sds))

    def energy(self, s):
        mean, std = s
        return jnp.sum(0.5 * ((self.data - mean) / std) ** 2 + jnp.log(std))

    def transformation(self, s):
        return (s[0] / s[1], _SQRT2 * jnp.log(s[1]))

    def metric(self, s, t):
        _, std = s
        return (t[0] / std**2, 2.0 * t[1] / std**2)

    def left_sqrt_metric(self, s, e):
        _, std = s
        return (e[0] / std, _SQRT2 * e[1] / std)

    def normalized_residual(self, s):
        return (self.data - s[0]) / s[1]

    @property
    def data_leaves(self):
        return {"VariableCovarianceGaussian": {"data": self.data}}
