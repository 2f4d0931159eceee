"""Jittable solvers: conjugate gradient, Newton-CG (line search or trust region), optax adapter; the
:class:`Minimizer` base and result types.
"""

from .cg import CGConfig, conjugate_gradient
from .minimizer import Minimizer, check_minimizer
from .newton_cg import NewtonCGConfig, newton_cg
from .optax_adapter import OptaxConfig, optax_minimize
from .solution import CGResult, Solution, SolverError
from .status import Status, status_message
from .trust_region import TrustRegionConfig, trust_region_newton_cg

__all__ = [
    "CGConfig",
    "CGResult",
    "Minimizer",
    "NewtonCGConfig",
    "OptaxConfig",
    "Solution",
    "SolverError",
    "Status",
    "TrustRegionConfig",
    "check_minimizer",
    "conjugate_gradient",
    "newton_cg",
    "optax_minimize",
    "status_message",
    "trust_region_newton_cg",
]
