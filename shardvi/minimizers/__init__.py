"""Jittable solvers: conjugate gradient, Newton-CG (line search or trust region), optax adapter; the
:class:`Minimizer` base and result types.

One entry point per solver: :func:`conjugate_gradient` and :func:`newton_cg` (NIFTy.re's names, the
package's stable functions) take a frozen, validated ``...Config``; a minimizer's configuration is a
:class:`Minimizer`, whose ``minimize`` is the interface ``optimize_kl`` calls for any minimizer, built-in or
user-defined (``TrustRegionConfig`` and ``OptaxConfig`` run through it alone; ``NewtonCGConfig.minimize`` is
:func:`newton_cg` with that configuration).
"""

from .cg import CGConfig, conjugate_gradient
from .minimizer import Minimizer, check_minimizer
from .newton_cg import NewtonCGConfig, newton_cg
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
    "conjugate_gradient",
    "newton_cg",
    "status_message",
]
