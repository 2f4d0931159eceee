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
        data shape. Strictly positive, with ``1/noise_std**2`` finite and
        non-zero in the data's dtype. A scalar or array applies to every data
        leaf; a pytree must have exactly the data's structure (a list of
        numbers is an array only for data that is one array: containers of
        another structure are rejected as ambiguous).
    noise_cov_inv : float, array, pytree or callable, optional
        Inverse noise covariance ``N^{-1}``: a diagonal (positive numbers, same
        structure rules as ``noise_std``) or a linear map ``r -> N^{-1} r``. A
        callable needs ``noise_std_inv`` (``r -> N^{-1/2} r``, self-adjoint)
        for sampling.

    Give exactly one of ``noise_std`` and ``noise_cov_inv``.
    """
    d = finite_data(data, "data")
    if (noise_std is None) == (noise_cov_inv is None):
        raise ValueError("give exactly one of noise_std and noise_cov_inv")
    if noise_std is not None:
        std = positive_like(noise_std, d, "noise_std", inverse_square=True)  # 1/std**2 finite in d's dtype
        inv_std = to_device(jtu.tree_map(lambda x: 1.0 / x, std))

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

    lh = Likelihood(
        energy, n_inv_sqrt, domain=domain_of(d),
        metric=lambda s, t: n_inv(t),
        left_sqrt_metric=lambda s, e: n_inv_sqrt(e),
        normalized_residual=lambda s: n_inv_sqrt(tm.sub(d, s)),
    )
    # checkpoint fingerprint: the data and the noise as used (a callable noise_cov_inv is unknown: None)
    noise = ({"noise_std": std} if noise_std is not None else
             {"noise_cov_inv": None if callable(noise_cov_inv) else prec_host})
    lh.data_leaves = {"Gaussian": {"data": d, **noise}}
    return lh
