"""Jittable solvers: conjugate gradient, Newton-CG (line search or trust region), optax adapter; the
:class:`Minimizer` base and result types.

Each solver is its configuration: a frozen, validated ``...Config`` whose method runs it
(``CGConfig(...).solve(matvec, b)``, ``NewtonCGConfig(...).minimize(fun_and_grad, hessp, x0)``).
The minimizers' ``minimize`` is the :class:`Minimizer` interface that ``optimize_kl`` calls.
"""

from .cg import CGConfig
from .minimizer import Minimizer, check_minimizer
from .newton_cg import NewtonCGConfig
from .optax_adapter import OptaxConfig
from .solution import CGResult, Solution, SolverError
from .status import Status, status_message
from .trust_region import TrustRegionConfig

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
    "status_message",
]
