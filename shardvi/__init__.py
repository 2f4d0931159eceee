"""shardvi: multi-device MGVI / geoVI variational inference in JAX.

>>> import shardvi as sv
>>> lh = sv.Gaussian(data, noise_std=0.1).amend(sv.Model(call, domain))
>>> samples, state = sv.optimize_kl(lh, pos, key=key, n_total_iterations=5, n_samples=4)
"""
from . import minimizers, models, parallel, tree_math, vi
from .minimizers import CGConfig, NewtonCGConfig, OptaxConfig
from .models import (
    CorrelatedField, CorrelatedFieldMaker, InvGamma, Laplace, LogNormal, Mask, Model, NUFFTResponse, Normal, Prior,
    Sampling, Uniform, prior_model,
)
from .vi import (
    CheckpointError, Gaussian, IterationReport, Likelihood, NonFiniteError, OptimizeVI, OptimizeVIState, Poisson,
    SampleMode, Samples, StudentT, VariableCovarianceGaussian, draw_linear_residual, load_checkpoint,
    minisanity, nonlinearly_update_residual, optimize_kl, residual_stats, save_checkpoint,
)

__version__ = "0.1.0"

__all__ = [
    "CGConfig", "CheckpointError", "Gaussian", "IterationReport", "Likelihood", "Model", "NonFiniteError", "NewtonCGConfig",
    "OptaxConfig", "OptimizeVI", "OptimizeVIState", "Poisson", "SampleMode", "Samples", "StudentT",
    "VariableCovarianceGaussian", "draw_linear_residual", "load_checkpoint", "minimizers", "minisanity",
    "models", "nonlinearly_update_residual", "optimize_kl", "parallel", "residual_stats", "save_checkpoint",
    "tree_math", "vi",
]
__all__ += ["CorrelatedField", "CorrelatedFieldMaker", "InvGamma", "Laplace", "LogNormal", "Mask", "NUFFTResponse",
            "Normal", "Prior", "Sampling", "Uniform", "prior_model"]
