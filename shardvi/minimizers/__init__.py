"""Jittable solvers: conjugate gradient, Newton-CG, optax adapter."""
from .cg import CGResult, conjugate_gradient
from .config import CGConfig, NewtonCGConfig, OptaxConfig
from .newton_cg import OptimizeResult, newton_cg
from .optax_adapter import optax_minimize
from .status import Status, status_message

__all__ = [
    "CGConfig", "CGResult", "NewtonCGConfig", "OptaxConfig", "OptimizeResult", "Status",
    "conjugate_gradient", "newton_cg", "optax_minimize", "status_message",
]
