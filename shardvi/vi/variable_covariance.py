"""Gaussian likelihood whose noise standard deviation is inferred."""
from __future__ import annotations

import jax
import jax.numpy as jnp

from ._checks import finite_data
from .likelihood import Likelihood

__all__ = ["VariableCovarianceGaussian"]

_SQRT2 = 2.0 ** 0.5


def VariableCovarianceGaussian(data) -> Likelihood:
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
    d = finite_data(data, "data")
    if not isinstance(d, jax.Array) or jnp.iscomplexobj(d):
        raise TypeError("VariableCovarianceGaussian data must be one real array")
    sds = jax.ShapeDtypeStruct(d.shape, d.dtype)

    def energy(s):
        mean, std = s
        return jnp.sum(0.5 * ((d - mean) / std) ** 2 + jnp.log(std))

    def metric(s, t):
        _, std = s
        return (t[0] / std**2, 2.0 * t[1] / std**2)

    def lsm(s, e):
        _, std = s
        return (e[0] / std, _SQRT2 * e[1] / std)

    lh = Likelihood(
        energy, lambda s: (s[0] / s[1], _SQRT2 * jnp.log(s[1])), domain=(sds, sds),
        metric=metric, left_sqrt_metric=lsm, lsm_tangents_shape=(sds, sds),
        normalized_residual=lambda s: (d - s[0]) / s[1],
    )
    lh.data_leaves = {"VariableCovarianceGaussian": {"data": d}}  # checkpoint fingerprint
    return lh
