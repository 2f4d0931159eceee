"""What a global iteration reports: per-sample solver statuses and the iteration's log line."""

from __future__ import annotations

import logging

import numpy as np

from ..minimizers.status import Status, status_message
from .diagnostics import IterationReport
from .errors import NonPositiveCurvatureError

__all__ = ["format_report", "sample_status"]

logger = logging.getLogger("shardvi")

_STATUS_HINTS = {
    Status.MAX_ITERATIONS: "maxiter",
    Status.NONPOSITIVE_CURVATURE: "non-positive curvature",
    Status.LINE_SEARCH_FAILED: "a failed line search",
}


def sample_status(status, nit, total, stage, config_name, *, metric_must_be_pd):
    """Per-sample status codes (list of int) of one sampling stage; raise or warn on bad ones.

    Non-positive curvature of a metric that must be positive definite raises
    :class:`NonPositiveCurvatureError` (``nit`` 0-based, as for
    :class:`NonFiniteError`); every other unconverged solve (maxiter,
    curvature of the geoVI Gauss-Newton operator, line search) is logged as
    one warning line, numbered like the iteration's log line (``nit + 1``).
    """
    codes = np.asarray(status).reshape(-1).astype(int).tolist()
    npc = [i for i, c in enumerate(codes) if c == Status.NONPOSITIVE_CURVATURE]
    if metric_must_be_pd and npc:
        raise NonPositiveCurvatureError(nit, stage, npc)
    parts = []
    for code, what in _STATUS_HINTS.items():
        which = [i for i, c in enumerate(codes) if c == code]
        if which:
            parts.append(f"{len(which)} at {what}" + ("" if len(which) == len(codes) else f" {_fmt_which(which)}"))
    if parts:
        logger.warning(
            "%s at iteration %d/%d: %d of %d sample solves did not converge (%s); see %s",
            stage,
            nit + 1,
            total,
            sum(c != Status.CONVERGED for c in codes),
            len(codes),
            ", ".join(parts),
            config_name,
        )
    return codes


def _fmt_which(which, shown=8):
    """``(samples [0, 3, 5])``, at most ``shown`` indices."""
    more = ", ..." if len(which) > shown else ""
    return f"(samples [{', '.join(str(i) for i in which[:shown])}{more}])"


def _fmt_nit(v):
    if not v:
        return "-"
    a = np.asarray(v)
    return f"{int(np.median(a))}/{int(a.max())}"


def _fmt_unconverged(status) -> str:
    """`` (k unconverged)`` for k sample solves that did not converge (nothing when all did / not recorded)."""
    k = sum(c != Status.CONVERGED for c in status or ())
    return f" ({k} unconverged)" if k else ""


def format_report(r: IterationReport, total: int) -> str:
    """The iteration's log line (``iteration i/total [mode, n pairs] KL ... | ... s``)."""
    lh = f"{r.chi2_likelihood:.3f}" if r.chi2_likelihood is not None else "-"
    return (
        f"iteration {r.iteration}/{total} [{r.sample_mode}, {r.n_samples} pairs] "
        f"KL {r.kl_energy:.6e} | sampling CG med/max {_fmt_nit(r.sampling_nit)}"
        f"{_fmt_unconverged(r.sampling_status)} | geoVI Newton med/max {_fmt_nit(r.nonlinear_nit)}"
        f"{_fmt_unconverged(r.nonlinear_status)} | KL Newton {r.kl_nit} (CG {r.kl_cg_nit}, "
        f"{status_message(r.kl_status)}) | red.chi2 lh {lh} prior {r.chi2_prior:.3f} | {r.wall_time:.2f} s"
    )
