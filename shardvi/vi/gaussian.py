"""Gaussian likelihood with known noise."""
from __future__ import annotations

from typing import Callable, Optional

import numpy as np
from jax import tree_util as jtu

from .. import tree_math as tm
from ._checks import domain_of, finite_data, positive_like, to_device
from .likelihood import Likelihood

__all__ = ["Gaussian"]


def Gaussian(data, noise_std=None, noise_cov_inv=None, *, noise_std_inv: Optional[Callable] = None
             ) -> Likelihood:
    """Gaussian likelihood ``H(s) = (d - s)^T N^{-1} (d - s) / 2``.

    Parameters
    ----------
    data : array or pytree of arrays
        Measured data ``d`` (real or complex; complex entries have independent
        real and imaginary noise of the given std).
    noise_std : float, array or pytree, optional
        Diagonal noise standard deviation, same units as ``d``; broadcast to the
        data shape. Strictly positive.
    noise_cov_inv : float, array or callable, optional
        Inverse noise covariance ``N^{-1}``: a diagonal (positive numbers) or a
        linear map ``r -> N^{-1} r``. A callable needs ``noise_std_inv``
        (``r -> N^{-1/2} r``, self-adjoint) for sampling.

    Give exactly one of ``noise_std`` and ``noise_cov_inv``.
    """
    d = finite_data(data, "data")
    if (noise_std is None) == (noise_cov_inv is None):
        raise ValueError("give exactly one of noise_std and noise_cov_inv")
    if noise_std is not None:
        inv_std = to_device(jtu.tree_map(lambda x: 1.0 / x, positive_like(noise_std, d, "noise_std")))

        def n_inv(r):
            return jtu.tree_map(lambda a, w: a * w * w, r, inv_std)

        def n_inv_sqrt(r):
            return jtu.tree_map(lambda a, w: a * w, r, inv_std)
    elif callable(noise_cov_inv):
        if not callable(noise_std_inv):
            raise ValueError("a callable noise_cov_inv needs noise_std_inv (r -> N^{-1/2} r) as well")
        n_inv, n_inv_sqrt = noise_cov_inv, noise_std_inv
    else:
        prec_host = positive_like(noise_cov_inv, d, "noise_cov_inv")
        prec, sqrt_prec = to_device(prec_host), to_device(jtu.tree_map(np.sqrt, prec_host))

        def n_inv(r):
            return jtu.tree_map(lambda a, w: a * w, r, prec)

        def n_inv_sqrt(r):
            return jtu.tree_map(lambda a, w: a * w, r, sqrt_prec)

    def energy(s):
        r = tm.sub(d, s)
        return 0.5 * tm.vdot(r, n_inv(r))

    return Likelihood(
        energy, n_inv_sqrt, domain=domain_of(d),
        metric=lambda s, t: n_inv(t),
        left_sqrt_metric=lambda s, e: n_inv_sqrt(e),
        normalized_residual=lambda s: n_inv_sqrt(tm.sub(d, s)),
    )
