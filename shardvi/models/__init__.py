"""Generative models."""

from .correlated_field import (
    CorrelatedField,
    CorrelatedFieldMaker,
    Hyperparameter,
    MaternAmplitude,
    NonParametricAmplitude,
)
from .gauss_markov import (
    IntegratedWienerProcess,
    OrnsteinUhlenbeckProcess,
    WienerProcess,
    discrete_gauss_markov,
    integrated_wiener_process,
    ornstein_uhlenbeck_process,
    wiener_process,
)
from .harmonic import RegularGrid, harmonic_to_position, hartley, position_to_harmonic, power_analyze
from .model import Model
from .nufft import match_vma, nufft2d_type1, nufft2d_type2
from .priors import (
    InvGamma,
    Laplace,
    LogNormal,
    Normal,
    Prior,
    Uniform,
    as_prior,
    gamma_quantile_from_normal,
    prior_model,
)
from .responses import Mask, NUFFTResponse, Sampling

__all__ = ["Model"]
__all__ += ["Mask", "Sampling", "NUFFTResponse", "match_vma", "nufft2d_type1", "nufft2d_type2"]
__all__ += [
    "Prior",
    "Normal",
    "LogNormal",
    "Uniform",
    "InvGamma",
    "Laplace",
    "prior_model",
    "as_prior",
    "gamma_quantile_from_normal",
]
__all__ += [
    "CorrelatedFieldMaker",
    "CorrelatedField",
    "NonParametricAmplitude",
    "MaternAmplitude",
    "Hyperparameter",
    "RegularGrid",
    "hartley",
    "harmonic_to_position",
    "position_to_harmonic",
    "power_analyze",
]
__all__ += [
    "WienerProcess",
    "IntegratedWienerProcess",
    "OrnsteinUhlenbeckProcess",
    "discrete_gauss_markov",
    "wiener_process",
    "integrated_wiener_process",
    "ornstein_uhlenbeck_process",
]
