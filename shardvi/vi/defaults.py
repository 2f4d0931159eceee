"""The solver settings ``optimize_kl`` and the public sampling functions use when none are given."""

from __future__ import annotations

from ..minimizers.cg import CGConfig
from ..minimizers.newton_cg import NewtonCGConfig

__all__ = ["DEFAULT_KL_MINIMIZATION", "DEFAULT_LINEAR_SAMPLING", "DEFAULT_NONLINEAR_UPDATE"]

#: MGVI residuals: CG on the sampling metric to a relative residual of 1e-6
DEFAULT_LINEAR_SAMPLING = CGConfig(tol=1e-6, maxiter=500)
#: geoVI updates, a root problem: Newton steps to ``xtol=1e-6`` with inner CG solves to 1e-8 (inexact inner solves
#: cost Newton its fast convergence there)
DEFAULT_NONLINEAR_UPDATE = NewtonCGConfig(xtol=1e-6, maxiter=50, cg=CGConfig(tol=1e-8, maxiter=500))
#: the KL minimization of each global iteration
DEFAULT_KL_MINIMIZATION = NewtonCGConfig(xtol=1e-6, maxiter=35)
