"""Student-t likelihood (robust to outliers)."""
from __future__ import annotations

import jax.numpy as jnp
import numpy as np
from jax import tree_util as jtu

from ._checks import domain_of, finite_data, positive_like, to_device
from .likelihood import Likelihood

__all__ = ["StudentT"]


def StudentT(data, dof, noise_std) -> Likelihood:
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
    """
    d = finite_data(data, "data")
    if any(jnp.iscomplexobj(x) for x in jtu.tree_leaves(d)):
        raise TypeError("StudentT data must be real")
    nu_host, sig_host = positive_like(dof, d, "dof"), positive_like(noise_std, d, "noise_std", inverse_square=True)
    # in NumPy, like the checks (no eager XLA programs); sqrt and division are correctly rounded in both
    fac = to_device(jtu.tree_map(lambda n, s: np.sqrt((n + 1) / (n + 3)) / s, nu_host, sig_host))
    nu, sig = to_device(nu_host), to_device(sig_host)

    def energy(s):
        parts = jtu.tree_map(
            lambda si, di, n, sg: jnp.sum(0.5 * (n + 1) * jnp.log1p(((di - si) / sg) ** 2 / n)), s, d, nu, sig)
        return sum(jtu.tree_leaves(parts))

    lh = Likelihood(
        energy, lambda s: jtu.tree_map(lambda si, f: f * si, s, fac), domain=domain_of(d),
        metric=lambda s, t: jtu.tree_map(lambda ti, f: f * f * ti, t, fac),
        left_sqrt_metric=lambda s, e: jtu.tree_map(lambda ei, f: f * ei, e, fac),
        normalized_residual=lambda s: jtu.tree_map(lambda si, di, sg: (di - si) / sg, s, d, sig),
    )
    lh.data_leaves = {"StudentT": {"data": d, "dof": nu_host, "noise_std": sig_host}}  # checkpoint fingerprint
    return lh
