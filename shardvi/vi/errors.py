"""The errors a global iteration raises; the last good samples and state are untouched."""

from __future__ import annotations

import numpy as np

from ..exceptions import ShardviError
from ..minimizers.status import Status, status_message

__all__ = ["NonFiniteError", "NonPositiveCurvatureError", "check_kl_result", "check_sampling_finite"]


class NonFiniteError(ShardviError, FloatingPointError):
    """NaN/inf during a global iteration; the last good state is untouched.

    Attributes
    ----------
    iteration : int
        Index of the failing global iteration (0-based; ``state.nit`` before it).
    stage : str
        ``"sampling (MGVI linear CG)"``, ``"sampling (geoVI update)"`` or
        ``"KL minimization"``.
    """

    def __init__(self, iteration: int, stage: str, detail: str):
        self.iteration, self.stage = iteration, stage
        super().__init__(
            f"non-finite values in {stage} at iteration {iteration}: {detail}. The samples and "
            f"state of iteration {iteration} (and its checkpoint, if any) are unchanged."
        )


class NonPositiveCurvatureError(ShardviError, ValueError):
    """The metric of a global iteration is not positive definite; the last good state is untouched.

    ``M = J^T F J + I`` (sampling) and its sample average (KL) are positive
    definite for any valid likelihood: a solver that meets non-positive
    curvature points at a broken likelihood, e.g. a callable
    ``noise_cov_inv`` that is not positive definite, or a ``noise_std_inv``
    that is not its square root.

    Attributes
    ----------
    iteration : int
        Index of the failing global iteration (0-based; ``state.nit`` before it).
    stage : str
        ``"sampling (MGVI linear CG)"`` or ``"KL minimization"``.
    samples : list of int
        Indices of the sample solves that met it (empty for the KL).
    """

    def __init__(self, iteration: int, stage: str, samples=()):
        self.iteration, self.stage, self.samples = iteration, stage, list(samples)
        which = f" (sample solves {self.samples})" if self.samples else ""
        super().__init__(
            f"non-positive curvature in {stage} at iteration {iteration}{which}: the metric J^T F J + I is not "
            f"positive definite, so the likelihood's Fisher metric F is not positive semi-definite. Check the "
            f"likelihood (a callable noise_cov_inv must be positive definite and noise_std_inv its symmetric "
            f"square root). The samples and state of iteration {iteration} (and its checkpoint, if any) are "
            f"unchanged."
        )


def check_sampling_finite(finite, status, nit: int, stage: str) -> None:
    """Raise :class:`NonFiniteError` if a sample solve met nan/inf or a residual is not finite.

    Parameters
    ----------
    finite : bool or array
        Whether every residual is finite (computed in the compiled step).
    status : array of int
        Per-sample :class:`~shardvi.minimizers.Status` codes.
    nit : int
        The global iteration (0-based).
    stage : str
        The sampling stage, as named in the error.
    """
    bad = np.asarray(status) == Status.NONFINITE
    if bad.any() or not bool(finite):
        which = np.nonzero(bad)[0].tolist()
        raise NonFiniteError(
            nit, stage, f"the solver met nan/inf (sample solves {which})" if which else "a residual is nan/inf"
        )


def check_kl_result(status, finite, nit: int) -> None:
    """Raise if the KL minimization met nan/inf or non-positive curvature.

    Parameters
    ----------
    status : int or array
        The minimizer's :class:`~shardvi.minimizers.Status`.
    finite : bool or array
        Whether the new position and the KL energy are finite.
    nit : int
        The global iteration (0-based).
    """
    if int(status) == Status.NONFINITE or not bool(finite):
        raise NonFiniteError(
            nit, "KL minimization", f"the KL energy or its gradient is nan/inf (status: {status_message(status)})"
        )
    if int(status) == Status.NONPOSITIVE_CURVATURE:  # Newton-CG on the metric, which must be >= I
        raise NonPositiveCurvatureError(nit, "KL minimization")
