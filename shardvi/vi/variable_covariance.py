"""Gaussian likelihood whose noise standard deviation is inferred.

Also the helpers the variable-covariance likelihoods share
(:class:`~shardvi.vi.variable_covariance_student_t.VariableCovarianceStudentT`):
validation of real data and the ``(mean, std)`` domain built from the data's
structure.
"""

from __future__ import annotations

import functools
import operator

import jax.numpy as jnp
from jax import tree_util as jtu

from ._checks import domain_of, finite_data
from .likelihood import Likelihood

__all__ = ["VariableCovarianceGaussian"]

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


def leaf_sum(fn, *trees):
    """``sum_leaves fn(*leaves)`` over trees of the first tree's structure (leaves in tree order, no ``0 +``)."""
    return functools.reduce(operator.add, jtu.tree_leaves(jtu.tree_map(fn, *trees)))


class VariableCovarianceGaussian(Likelihood):
    """Gaussian likelihood with signal ``s = (mean, std)``: the noise level is inferred.

    ``H = sum(((d - mean)/std)^2 / 2 + log(std))`` (``-log p`` up to a
    constant). The Fisher metric per datum, with respect to ``(mean, std)``,
    is ``diag(1/std^2, 2/std^2)`` and is applied exactly (so are its square
    root and the metric samples). The geoVI transformation
    ``T = (mean/std, sqrt(2) log(std))`` reproduces it only up to the
    mean-std cross terms: ``(dT/ds)^T (dT/ds)`` has the off-diagonal
    ``-mean/std^3`` and adds ``mean^2/std^4`` to the std entry; they vanish
    where ``mean`` is small relative to ``std``. (A location-scale Fisher
    metric is curved: no transformation makes it Euclidean everywhere.)

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

    def transformation(self, s):
        mean, std = s
        return (jtu.tree_map(lambda m, sg: m / sg, mean, std), jtu.tree_map(lambda sg: _SQRT2 * jnp.log(sg), std))

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
