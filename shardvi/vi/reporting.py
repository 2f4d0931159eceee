"""What a global iteration reports: per-sample solver statuses and the iteration's log line."""

from __future__ import annotations

import numpy as np

from ..minimizers.status import Status, status_message
from .diagnostics import IterationReport
from .errors import NonPositiveCurvatureError

__all__ = ["format_report", "sample_status", "unconverged_message"]

_STATUS_HINTS = {
    Status.MAX_ITERATIONS: "maxiter",
    Status.NONPOSITIVE_CURVATURE: "non-positive curvature",
    Status.LINE_SEARCH_FAILED: "a failed line search",
}


def sample_status(status, nit, stage, *, metric_must_be_pd):
    """Per-sample status codes (list of int) of one sampling stage; raise on a broken metric.

    Non-positive curvature of a metric that must be positive definite raises
    :class:`NonPositiveCurvatureError` (``nit`` 0-based, as for
    :class:`NonFiniteError`). The other unconverged solves are reported by
    :func:`unconverged_message`.
    """
    codes = np.asarray(status).reshape(-1).astype(int).tolist()
    npc = [i for i, c in enumerate(codes) if c == Status.NONPOSITIVE_CURVATURE]
    if metric_must_be_pd and npc:
        raise NonPositiveCurvatureError(nit, stage, npc)
    return codes


def unconverged_message(codes, nit, total, stage, field, config) -> str | None:
    """The :class:`~shardvi.ConvergenceWarning` text for the unconverged solves in ``codes`` (``None``: all converged).

    It names the configuration field (``field``, the argument of
    :func:`~shardvi.optimize_kl`) to change and suggests a value.
    """
    parts = []
    for code, what in _STATUS_HINTS.items():
        which = [i for i, c in enumerate(codes) if c == code]
        if which:
            parts.append(f"{len(which)} at {what}" + ("" if len(which) == len(codes) else f" {_fmt_which(which)}"))
    if not parts:
        return None
    n_bad = sum(c != Status.CONVERGED for c in codes)
    head = (
        f"{stage} at iteration {nit + 1}/{total}: {n_bad} of {len(codes)} sample solves did not converge "
        f"({', '.join(parts)}). The samples are kept; the log line of every iteration counts its unconverged solves."
    )
    if stage.startswith("sampling"):
        head += (
            " These samples enter this iteration's KL minimization; the next iteration draws or updates its own, and "
            "the run returns the last iteration's."
            if nit + 1 < total
            else " They are among the samples the run returns."
        )
    maxiter = getattr(config, "maxiter", None)
    if any(c == Status.MAX_ITERATIONS for c in codes) and isinstance(maxiter, int):
        name = type(config).__name__
        head += (
            f" To let them converge, raise {field}.maxiter (now {maxiter}), e.g. "
            f"{field}=sv.{name}(..., maxiter={2 * maxiter})"
        )
        crit = _criterion(config)
        head += f", or loosen its stopping criterion ({crit})." if crit else "."
    elif any(c == Status.LINE_SEARCH_FAILED for c in codes):
        head += (
            f" A failed line search usually means the solve reached the precision floor of {field} near its "
            "solution; a looser tolerance (xtol / absdelta) lets it stop as converged."
        )
        if field == "nonlinear_update":
            head += (
                " In the geoVI update it can also mean a fold of the sample's coordinate map (its Jacobian "
                "singular) between the solve and a root: no Newton step gets past it, and the sample is kept "
                "where its residual stopped falling."
            )
    return head + ' Silence: warnings.filterwarnings("ignore", category=sv.ConvergenceWarning).'


def _criterion(config) -> str:
    """``xtol=1e-05`` / ``tol=1e-06``: the config's set stopping tolerances, as text."""
    found = [f"{k}={getattr(config, k)!r}" for k in ("tol", "xtol", "absdelta") if getattr(config, k, None)]
    return ", ".join(found)


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
