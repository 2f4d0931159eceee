"""Gaussian likelihood whose noise standard deviation is inferred.

Also the helpers the variable-covariance likelihoods share
(:class:`~shardvi.vi.variable_covariance_student_t.VariableCovarianceStudentT`):
validation of real data and the ``(mean, std)`` domain built from the data's
structure.
"""

from __future__ import annotations

import functools
import math
import operator

import jax.numpy as jnp
import numpy as np
from jax import tree_util as jtu

from ._checks import domain_of, finite_data
from .likelihood import Likelihood
from .normalization import LOG_2PI

__all__ = ["VariableCovarianceGaussian", "local_coordinates", "residual_coordinates"]

_SQRT2 = 2.0**0.5


def real_data(data, owner: str):
    """``data`` as finite real arrays (one array or a pytree); ``TypeError`` for complex leaves."""
    d = finite_data(data, "data")
    if any(jnp.iscomplexobj(x) for x in jtu.tree_leaves(d)):
        raise TypeError(
            f"{owner} data must be real (the model's mean and std are real arrays shaped like the data), "
            "got complex data"
        )
    return d


def mean_std_domain(data):
    """``(tree, tree)``, ``tree`` the data's shapes: the signal ``(mean, std)`` of a variable-covariance likelihood."""
    tree = domain_of(data)
    return (tree, tree)


def residual_coordinates(s, data, fisher_mean, fisher_std):
    """``(a (mean - d)/std, b log std)``: the global geoVI coordinates of a location-scale likelihood.

    ``a = fisher_mean`` and ``b = fisher_std`` are ``std`` times the square roots of the Fisher
    metric's entries (trees of the data's structure: arrays or Python floats). The Gram matrix of the
    Jacobian is the Fisher metric ``diag(a^2, b^2)/std^2`` plus the cross terms
    ``-a^2 delta/std^2`` (mean-std) and ``a^2 delta^2/std^2`` (std-std), with the normalized
    residual ``delta = (mean - d)/std``: exact where the model fits the data.
    """
    mean, std = s
    return (
        jtu.tree_map(lambda a, m, d, sg: a * ((m - d) / sg), fisher_mean, mean, data, std),
        jtu.tree_map(lambda b, sg: b * jnp.log(sg), fisher_std, std),
    )


def local_coordinates(s, s_bar, fisher_mean, fisher_std):
    """The geoVI coordinates of a location-scale likelihood around the expansion point ``s_bar``.

    With ``delta = (mean - mean_bar)/std`` and ``a``, ``b`` as in :func:`residual_coordinates`::

        T(mean, std) = (a delta, b log std + a^2 delta^2 / (2 b))

    The Gram matrix of its Jacobian, ``std^2 G = [[a^2 + a^4 delta^2/b^2, -a^4 delta^3/b^2],
    [-a^4 delta^3/b^2, b^2 - a^2 delta^2 + a^4 delta^4/b^2]]``, equals the Fisher metric
    ``diag(a^2, b^2)/std^2`` where ``mean = mean_bar`` (for every ``std``), together with its
    first derivatives (the quadratic term cancels the slope of the cross term); its errors are of
    second order in ``delta``, and ``det G = det F`` everywhere. The Fisher geometry of a
    location-scale family is a hyperbolic plane: no map is exact on a whole neighbourhood.
    """
    (mean, std), m_bar = s, s_bar[0]

    def one_mean(a, m, mb, sg):
        return a * ((m - mb) / sg)

    def one_std(a, b, m, mb, sg):
        d = (m - mb) / sg
        return b * jnp.log(sg) + (a * a / (2 * b)) * (d * d)

    return (
        jtu.tree_map(one_mean, fisher_mean, mean, m_bar, std),
        jtu.tree_map(one_std, fisher_mean, fisher_std, mean, m_bar, std),
    )


def leaf_sum(fn, *trees):
    """``sum_leaves fn(*leaves)`` over trees of the first tree's structure (leaves in tree order, no ``0 +``)."""
    return functools.reduce(operator.add, jtu.tree_leaves(jtu.tree_map(fn, *trees)))


class VariableCovarianceGaussian(Likelihood):
    """Gaussian likelihood with signal ``s = (mean, std)``: the noise level is inferred.

    ``H = sum(((d - mean)/std)^2 / 2 + log(std))`` (``-log p`` up to a
    constant). The Fisher metric per datum, with respect to ``(mean, std)``,
    is ``diag(1/std^2, 2/std^2)`` and is applied exactly (so are its square
    root and the metric samples).

    A location-scale Fisher metric is curved (a hyperbolic plane): no
    transformation makes it Euclidean everywhere. The geoVI update therefore
    uses coordinates built around its expansion point
    (:meth:`transformation_at`, :func:`local_coordinates`): with
    ``delta = (mean - mean_bar)/std``,
    ``T = (delta, sqrt(2) log(std) + delta^2 / (2 sqrt(2)))``, whose Jacobian
    reproduces the metric and its first derivatives exactly at the expansion
    point, for any ``mean`` and ``std``. The global :meth:`transformation`
    ``((mean - d)/std, sqrt(2) log(std))`` is exact where the model fits the
    data (its cross terms are proportional to the normalized residual).

    Parameters
    ----------
    data : array or pytree of arrays
        Real data ``d``. The model outputs the 2-tuple ``(mean, std)``, each
        with exactly the data's structure and shapes (for one data array:
        ``(mean_array, std_array)``; for ``{"a": da, "b": db}``:
        ``({"a": ma, "b": mb}, {"a": sa, "b": sb})``), with ``std > 0``.

    Attributes
    ----------
    data : jax.Array or pytree of jax.Array
        The data (the likelihood's pytree leaves).
    """

    def __init__(self, data):
        d = real_data(data, "VariableCovarianceGaussian")
        self.data = d
        dom = mean_std_domain(d)
        self.set_domain(dom, lsm_tangents_shape=dom)

    def energy(self, s):
        mean, std = s
        return leaf_sum(lambda d, m, sg: jnp.sum(0.5 * ((d - m) / sg) ** 2 + jnp.log(sg)), self.data, mean, std)

    def normalization(self) -> float:
        """``log(2 pi) / 2`` per datum (the energy keeps ``log std``)."""
        return 0.5 * LOG_2PI * sum(math.prod(np.shape(d)) for d in jtu.tree_leaves(self.data))

    def _fisher_sqrt(self):
        """``(a, b) = (1, sqrt(2))`` per data leaf: ``std`` times the square roots of the Fisher metric."""
        return jtu.tree_map(lambda _: 1.0, self.data), jtu.tree_map(lambda _: _SQRT2, self.data)

    def transformation(self, s):
        return residual_coordinates(s, self.data, *self._fisher_sqrt())

    def transformation_at(self, s_bar):
        return lambda s: local_coordinates(s, s_bar, *self._fisher_sqrt())

    def metric(self, s, t):
        std = s[1]
        return (
            jtu.tree_map(lambda ti, sg: ti / sg**2, t[0], std),
            jtu.tree_map(lambda ti, sg: 2.0 * ti / sg**2, t[1], std),
        )

    def left_sqrt_metric(self, s, e):
        std = s[1]
        return (
            jtu.tree_map(lambda ei, sg: ei / sg, e[0], std),
            jtu.tree_map(lambda ei, sg: _SQRT2 * ei / sg, e[1], std),
        )

    def normalized_residual(self, s):
        mean, std = s
        return jtu.tree_map(lambda d, m, sg: (d - m) / sg, self.data, mean, std)

    @property
    def data_leaves(self):
        return {"VariableCovarianceGaussian": {"data": self.data}}
