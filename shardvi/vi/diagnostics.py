"""Reduced chi-square diagnostics (NIFTy's ``minisanity``) and iteration reports."""

from __future__ import annotations

from typing import NamedTuple

import jax
import jax.core
import jax.numpy as jnp
import numpy as np
from jax import tree_util as jtu

from ..module import Module
from .samples import Samples

#: what the diagnostics use of a likelihood
_LIKELIHOOD_ATTRS = ("domain", "has_normalized_residual", "normalized_residual", "layout")

__all__ = [
    "IterationReport",
    "chi2_sums",
    "format_residual_stats",
    "minisanity",
    "pooled_chi2",
    "reduced_chi2",
    "residual_stats",
]


class IterationReport(NamedTuple):
    """Host-side summary of one global iteration (JSON-serializable)."""

    iteration: int
    sample_mode: str
    n_samples: int
    kl_energy: float
    sampling_nit: list  # CG iterations per linear solve (empty for MAP)
    nonlinear_nit: list  # Newton iterations per geoVI update (empty if linear)
    kl_nit: int
    kl_cg_nit: int
    kl_status: int
    chi2_likelihood: float | None
    chi2_prior: float
    wall_time: float
    # per sample solve, a Status code (int; 0 converged, 1 maxiter, 2 non-positive curvature, ...);
    # None where not recorded (histories of older checkpoints)
    sampling_status: list | None = None  # per linear CG solve (empty for MAP / a pure geoVI update)
    nonlinear_status: list | None = None  # per geoVI update (empty if linear)


def _real_dof(x) -> float:
    """Real degrees of freedom per entry: a complex entry holds two.

    Every reduced chi^2 here is ``|x|^2`` summed or averaged, then divided by
    this (dividing first rounds differently in XLA, and the numbers are kept).
    """
    return 2.0 if jnp.iscomplexobj(x) else 1.0


def _on_one_device(tree):
    """Arrays spread over several devices of this process (a multi-device run's samples, rows split over a
    model axis) copied onto one device: the eager diagnostics then run unpartitioned (XLA:CPU rejects an FFT
    that GSPMD partitions op by op: ``fft_thunk`` RET_CHECK on its operand layout). Others are kept."""

    def one(x):
        if isinstance(x, jax.core.Tracer) or not isinstance(x, jax.Array):  # traced (in a compiled step): kept
            return x
        if x.is_fully_addressable and len(x.sharding.device_set) > 1:
            return jax.device_put(x, jax.local_devices()[0])
        return x

    return jtu.tree_map(one, tree)


def _normalized_residuals(stacked, likelihood):
    """The likelihood's normalized residual of every sample of ``stacked`` (leading sample axis), or None if it
    has none."""
    if likelihood is None or not likelihood.has_normalized_residual:
        return None
    return jax.vmap(likelihood.normalized_residual)(stacked)


def _leaf_stats(stacked):
    """Per leaf: (reduced chi^2 averaged over samples, std of it over samples, mean, dof)."""

    def one(x):
        x = jnp.asarray(x)
        axes = tuple(range(1, x.ndim))
        per_sample = jnp.mean(jnp.abs(x) ** 2, axis=axes) / _real_dof(x)
        return (jnp.mean(per_sample), jnp.std(per_sample), jnp.mean(jnp.real(x)), int(np.prod(x.shape[1:])))

    return jtu.tree_map(one, stacked)


def residual_stats(samples: Samples, likelihood=None):
    """Reduced chi-square statistics of the likelihood and prior residuals.

    Returns
    -------
    dict
        ``{"likelihood": {path: (chi2, chi2_std, mean, dof)}, "prior": {...}}``;
        chi2 is ``mean |r|^2`` per degree of freedom averaged over samples
        (1 for a well-fit model), ``mean`` the average residual (bias).
    """
    out = {}
    stacked = _on_one_device(samples.samples)
    nres = _normalized_residuals(stacked, likelihood)
    if nres is not None:
        out["likelihood"] = _flat(_leaf_stats(nres))
    out["prior"] = _flat(_leaf_stats(stacked))
    return out


def _flat(tree):
    items = jtu.tree_flatten_with_path(
        tree, is_leaf=lambda x: isinstance(x, tuple) and len(x) == 4 and isinstance(x[3], int)
    )[0]
    return {(jtu.keystr(p) or "."): tuple(float(v) if i < 3 else v for i, v in enumerate(s)) for p, s in items}


def pooled_chi2(stats: dict) -> float:
    """Degree-of-freedom weighted reduced chi^2 over all entries of one section."""
    num = sum(s[0] * s[3] for s in stats.values())
    den = sum(s[3] for s in stats.values())
    return float(num / den) if den else float("nan")


def chi2_sums(samples: Samples, likelihood=None):
    """Jittable chi^2 sums of the likelihood and prior residuals, pooled over all samples and entries.

    The iteration log line's reduced chi^2 (``optimize_kl`` computes these in
    a compiled step; :func:`reduced_chi2` divides on the host).

    Returns
    -------
    (likelihood, prior)
        Each ``(sum of |r|^2 per real degree of freedom, dof)`` with ``dof``
        a Python int counting every entry of every sample; ``likelihood`` is
        None without a ``likelihood`` or one without normalized residuals.
    """

    def pooled(tree):
        leaves = jtu.tree_leaves(tree)
        return (
            sum(jnp.sum(jnp.abs(x) ** 2) / _real_dof(x) for x in leaves),
            sum(int(np.prod(x.shape)) for x in leaves),
        )

    stacked = _on_one_device(samples.samples)
    nres = _normalized_residuals(stacked, likelihood)
    return (None if nres is None else pooled(nres)), pooled(stacked)


def reduced_chi2(sums) -> float:
    """``sum / dof`` of one part of :func:`chi2_sums` (a float, on the host)."""
    total, dof = sums
    return float(total) / int(dof)


def minisanity(samples: Samples, likelihood=None) -> str:
    """A table of reduced chi^2, its spread over samples, mean residual and dof.

    Parameters
    ----------
    samples : Samples
        Posterior samples (latent space).
    likelihood : Likelihood, optional
        Likelihood on the latent space; adds its normalized residuals.
    """
    _check_minisanity_inputs(samples, likelihood)
    return format_residual_stats(residual_stats(samples, likelihood))


def _check_minisanity_inputs(samples, likelihood) -> None:
    """``samples`` a Samples; ``likelihood`` None or a Likelihood on the samples' latent space."""
    from ..models.model import check_latent

    if not isinstance(samples, Samples):
        raise TypeError(f"samples must be a shardvi Samples, got {type(samples).__name__}")
    if likelihood is None:
        return
    # a Likelihood (checked by what this module uses of it: the likelihood module builds on this one)
    domain = getattr(likelihood, "domain", None)
    if not (isinstance(likelihood, Module) and all(hasattr(likelihood, a) for a in _LIKELIHOOD_ATTRS)):
        raise TypeError(f"likelihood must be a shardvi Likelihood or None, got {type(likelihood).__name__}")
    try:
        check_latent(samples.pos, domain, "samples.pos", finite=False)
    except (TypeError, ValueError) as err:
        raise ValueError(
            f"likelihood: its domain does not match the samples (is it amended with the model "
            f"the samples belong to?): {err}"
        ) from None


def _row_name(section: str, path: str) -> str:
    """``likelihood`` for a single-array residual (path ``"."``), else ``prior['a']`` etc."""
    return section if path in ("", ".") else section + path


def format_residual_stats(stats: dict) -> str:
    """The :func:`minisanity` table of :func:`residual_stats` output.

    One row per section and leaf; the name column is as wide as the longest
    name (at least ``residual``), so the numeric columns stay aligned.
    """
    rows = [(_row_name(section, path), s) for section, entries in stats.items() for path, s in entries.items()]
    width = max([len("residual")] + [len(name) for name, _ in rows])
    lines = [f"{'residual':<{width}} {'red.chi2':>10} {'+-':>9} {'mean':>10} {'dof':>9}"]
    for name, (c, cs, m, dof) in rows:
        lines.append(f"{name:<{width}} {c:>10.4g} {cs:>9.2g} {m:>10.3g} {dof:>9d}")
    return "\n".join(lines)
