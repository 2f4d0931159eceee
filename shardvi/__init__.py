"""shardvi: multi-device MGVI / geoVI variational inference in JAX.

>>> import shardvi as sv
>>> lh = sv.Gaussian(data, noise_std=0.1).amend(sv.Model(call, domain))
>>> samples, state = sv.optimize_kl(lh, pos, key=key, n_total_iterations=5, n_samples=4)

The names below are imported on first access (PEP 562 ``__getattr__``): ``import
shardvi`` itself imports neither JAX nor jax-finufft nor matplotlib, so
``python -m shardvi --help`` answers at once and ``sv.plot`` is available
without making matplotlib a cost of every import. ``sv.plot`` never selects a
matplotlib backend. Importing shardvi changes nothing in the process: no
environment variable, no JAX configuration, no allocator setting.
"""

from __future__ import annotations

import importlib
from typing import TYPE_CHECKING

from ._version import __version__ as __version__

# submodules reachable as attributes (``sv.vi``, ``sv.plot``, ...)
_SUBMODULES = (
    "compilation",
    "compile_cache",
    "examples",
    "minimizers",
    "models",
    "parallel",
    "plot",
    "tree_math",
    "vi",
)

# top-level name -> submodule that defines it (add new exports here and in the TYPE_CHECKING block)
_EXPORTS = {
    "exceptions": ("ConvergenceWarning", "ShardviError"),
    "parallel.memory": ("InsufficientMemoryError",),
    "minimizers": ("CGConfig", "Minimizer", "NewtonCGConfig", "OptaxConfig", "TrustRegionConfig"),
    "module": ("Module",),
    "models": (
        "CorrelatedField",
        "CorrelatedFieldMaker",
        "IntegratedWienerProcess",
        "InvGamma",
        "Laplace",
        "LogNormal",
        "Mask",
        "Model",
        "NUFFTResponse",
        "Normal",
        "OrnsteinUhlenbeckProcess",
        "Prior",
        "Sampling",
        "Uniform",
        "WienerProcess",
        "prior_model",
    ),
    "vi": (
        "BlockedLikelihood",
        "CheckpointError",
        "EvidenceLowerBound",
        "Gaussian",
        "IterationReport",
        "Likelihood",
        "NonFiniteError",
        "NonPositiveCurvatureError",
        "OptimizeVI",
        "OptimizeVIState",
        "Poisson",
        "SampleMode",
        "Samples",
        "StudentT",
        "VariableCovarianceGaussian",
        "VariableCovarianceStudentT",
        "WienerFilterInfo",
        "draw_linear_residual",
        "estimate_evidence_lower_bound",
        "load_checkpoint",
        "minisanity",
        "nonlinearly_update_residual",
        "optimize_kl",
        "residual_stats",
        "save_checkpoint",
        "wiener_filter_posterior",
    ),
}
_ORIGIN = {name: module for module, names in _EXPORTS.items() for name in names}

__all__ = sorted(_ORIGIN) + list(_SUBMODULES)

if TYPE_CHECKING:  # static analysers and IDEs see the real imports
    from . import compilation, compile_cache, examples, minimizers, models, parallel, plot, tree_math, vi  # noqa: F401
    from .exceptions import ConvergenceWarning, ShardviError  # noqa: F401
    from .minimizers import CGConfig, Minimizer, NewtonCGConfig, OptaxConfig, TrustRegionConfig  # noqa: F401
    from .models import (  # noqa: F401
        CorrelatedField,
        CorrelatedFieldMaker,
        IntegratedWienerProcess,
        InvGamma,
        Laplace,
        LogNormal,
        Mask,
        Model,
        Normal,
        NUFFTResponse,
        OrnsteinUhlenbeckProcess,
        Prior,
        Sampling,
        Uniform,
        WienerProcess,
        prior_model,
    )
    from .module import Module  # noqa: F401
    from .parallel.memory import InsufficientMemoryError  # noqa: F401
    from .vi import (  # noqa: F401
        BlockedLikelihood,
        CheckpointError,
        EvidenceLowerBound,
        Gaussian,
        IterationReport,
        Likelihood,
        NonFiniteError,
        NonPositiveCurvatureError,
        OptimizeVI,
        OptimizeVIState,
        Poisson,
        SampleMode,
        Samples,
        StudentT,
        VariableCovarianceGaussian,
        VariableCovarianceStudentT,
        WienerFilterInfo,
        draw_linear_residual,
        estimate_evidence_lower_bound,
        load_checkpoint,
        minisanity,
        nonlinearly_update_residual,
        optimize_kl,
        residual_stats,
        save_checkpoint,
        wiener_filter_posterior,
    )


def __getattr__(name: str):
    """Import a submodule or an exported name on first access and cache it in the module."""
    if name in _SUBMODULES:
        value = importlib.import_module(f".{name}", __name__)
    elif name in _ORIGIN:
        value = getattr(importlib.import_module(f".{_ORIGIN[name]}", __name__), name)
    else:
        raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
    globals()[name] = value
    return value


def __dir__():
    return sorted(set(globals()) | set(__all__))
