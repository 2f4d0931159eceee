"""Variational inference: likelihoods, KL, MGVI/geoVI sampling, the driver."""

from . import steps
from .blocked import BlockedLikelihood
from .checkpoint import CheckpointError, load_checkpoint, save_checkpoint
from .diagnostics import IterationReport, minisanity, residual_stats
from .evidence import EvidenceLowerBound, estimate_evidence_lower_bound
from .gaussian import Gaussian
from .kl import hamiltonian, hamiltonian_metric, kl_metric, kl_value_and_grad
from .likelihood import Likelihood
from .modes import SampleMode
from .optimize_kl import NonFiniteError, NonPositiveCurvatureError, OptimizeVI, OptimizeVIState, optimize_kl
from .poisson import Poisson
from .samples import Samples
from .sampling import draw_linear_residual, metric_sample, nonlinearly_update_residual
from .student_t import StudentT
from .variable_covariance import VariableCovarianceGaussian
from .variable_covariance_student_t import VariableCovarianceStudentT
from .wiener import WienerFilterInfo, wiener_filter_posterior

__all__ = [
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
    "hamiltonian",
    "hamiltonian_metric",
    "kl_metric",
    "kl_value_and_grad",
    "load_checkpoint",
    "metric_sample",
    "minisanity",
    "nonlinearly_update_residual",
    "optimize_kl",
    "residual_stats",
    "save_checkpoint",
    "steps",
    "wiener_filter_posterior",
]
