"""Validation of the driver's arguments and the per-iteration settings of ``optimize_kl``.

Everything here runs on the host and compiles nothing. Settings may be given
as ``callable(iteration)``; :func:`settings_at` evaluates and checks them for
one iteration.
"""

from __future__ import annotations

import os
from typing import Any, NamedTuple

import jax.numpy as jnp
import numpy as np
from jax import tree_util as jtu

from ..minimizers.cg import CGConfig
from ..minimizers.minimizer import Minimizer, check_minimizer
from ..minimizers.newton_cg import NewtonCGConfig
from ..models.model import check_x64
from . import checkpoint as ckpt
from .defaults import DEFAULT_KL_MINIMIZATION, DEFAULT_LINEAR_SAMPLING, DEFAULT_NONLINEAR_UPDATE
from .likelihood import Likelihood
from .modes import SampleMode, parse_sample_mode
from .state import raw_key

__all__ = [
    "DEFAULT_KL_MINIMIZATION",
    "DEFAULT_LINEAR_SAMPLING",
    "DEFAULT_NONLINEAR_UPDATE",
    "IterationSettings",
    "at_iteration",
    "check_n_samples",
    "check_real_domain",
    "check_resume",
    "resume_source",
    "same_dir",
    "check_run_arguments",
    "check_type",
    "raw_key",
    "settings_at",
]

_CONFIGS = (CGConfig, NewtonCGConfig, Minimizer)  # callables that are settings, not callable(iteration)


class IterationSettings(NamedTuple):
    """The settings of one global iteration, evaluated and checked (see :func:`settings_at`)."""

    sample_mode: SampleMode
    n_samples: int
    linear_sampling: CGConfig
    nonlinear_update: NewtonCGConfig
    kl_minimization: Minimizer


def at_iteration(value, nit, argname, check=None) -> Any:
    """Evaluate per-iteration settings given as ``callable(iteration)``.

    ``check(result)`` validates the result; its ``TypeError``/``ValueError``
    from a callable's result is re-raised naming the call
    (``sample_mode(3) returned ...``).
    """
    if callable(value) and not isinstance(value, _CONFIGS):
        try:
            out = value(nit)
        except Exception as err:
            raise ValueError(f"{argname}({nit}) raised {type(err).__name__}: {err}") from err
        if check is None:
            return out
        try:
            return check(out)
        except (TypeError, ValueError) as err:
            raise type(err)(f"{argname}({nit}) returned {out!r}: {err}") from None
    return value if check is None else check(value)


def check_n_samples(n, nit, mode: SampleMode):
    """``n_samples`` of iteration ``nit``: an int >= 0, and >= 1 for a nonlinear ``mode``."""
    if isinstance(n, bool) or not isinstance(n, (int, np.integer)):
        raise TypeError(f"n_samples must be an int >= 0 (number of antithetic pairs), got {n!r} at iteration {nit}")
    if n < 0:
        raise ValueError(f"n_samples must be >= 0, got {n} at iteration {nit}")
    if n == 0 and mode.nonlinear:
        raise ValueError(
            f"n_samples=0 (MAP) cannot be combined with sample_mode={mode.value!r} "
            f"at iteration {nit}; use a linear mode or n_samples >= 1"
        )
    return int(n)


def check_real_domain(domain):
    """The latent space must be real: the prior N(0, I) and the samples' metric are real."""
    for path, d in jtu.tree_flatten_with_path(domain)[0]:
        if jnp.issubdtype(d.dtype, jnp.complexfloating):
            raise TypeError(
                f"likelihood: its domain (the latent space) is complex at {jtu.keystr(path) or 'the root'} "
                f"({d.dtype}); latents must be real (amend the likelihood with a sv.Model on a real "
                f"domain, e.g. a complex signal from two real latents)"
            )


def check_type(value, types, argname, nit):
    """``value`` (of iteration ``nit``) is an instance of ``types``."""
    if not isinstance(value, types):
        names = " or ".join(t.__name__ for t in (types if isinstance(types, tuple) else (types,)))
        raise TypeError(
            f"{argname} must be a {names} (or a callable returning one), got {type(value).__name__} at iteration {nit}"
        )
    return value


def check_run_arguments(
    likelihood,
    n_total_iterations,
    *,
    n_samples,
    sample_mode,
    mirror_samples,
    linear_sampling,
    nonlinear_update,
    kl_minimization,
) -> None:
    """Up-front checks of :class:`~shardvi.vi.optimize_kl.OptimizeVI`'s arguments (callables: per iteration)."""
    if not isinstance(likelihood, Likelihood):
        raise TypeError(f"likelihood must be a shardvi Likelihood, got {type(likelihood).__name__}")
    check_x64(likelihood.domain, "the likelihood's domain")
    if (
        isinstance(n_total_iterations, bool)
        or not isinstance(n_total_iterations, (int, np.integer))
        or n_total_iterations < 0
    ):
        raise ValueError(f"n_total_iterations must be an int >= 0, got {n_total_iterations!r}")
    if not isinstance(mirror_samples, bool):
        raise TypeError(f"mirror_samples must be a bool, got {type(mirror_samples).__name__}")
    if not callable(sample_mode):
        parse_sample_mode(sample_mode)
    if not callable(n_samples):
        check_n_samples(n_samples, 0, SampleMode.LINEAR_SAMPLE)
    for name, val, types in (
        ("linear_sampling", linear_sampling, CGConfig),
        ("nonlinear_update", nonlinear_update, NewtonCGConfig),
    ):
        if not callable(val) or isinstance(val, _CONFIGS):
            check_type(val, types, name, 0)
    check_real_domain(likelihood.domain)
    if not callable(kl_minimization) or isinstance(kl_minimization, _CONFIGS):
        # the minimizer's own checks (an optax optimizer is traced once with eval_shape: nothing compiled)
        check_minimizer(kl_minimization, "kl_minimization", params=likelihood.domain)


def settings_at(
    nit: int, *, sample_mode, n_samples, linear_sampling, nonlinear_update, kl_minimization
) -> IterationSettings:
    """The settings of global iteration ``nit`` (callables evaluated), each checked."""
    mode = at_iteration(sample_mode, nit, "sample_mode", parse_sample_mode)
    n = check_n_samples(at_iteration(n_samples, nit, "n_samples"), nit, mode)
    lin = check_type(at_iteration(linear_sampling, nit, "linear_sampling"), CGConfig, "linear_sampling", nit)
    nonlin = check_type(
        at_iteration(nonlinear_update, nit, "nonlinear_update"), NewtonCGConfig, "nonlinear_update", nit
    )
    klc = at_iteration(
        kl_minimization, nit, "kl_minimization", lambda v: check_minimizer(v, f"kl_minimization at iteration {nit}")
    )
    return IterationSettings(mode, n, lin, nonlin, klc)


def resume_source(resume) -> str | None:
    """The directory ``resume`` names (``resume=path``), or ``None`` for ``False``/``True``/``"force"``.

    A path to a file of a checkpoint (its ``latest.json`` or an ``npz``) names its directory.
    """
    if isinstance(resume, bool) or (isinstance(resume, str) and resume == "force"):
        return None
    path = ckpt.check_path(resume, "resume")
    return os.path.dirname(os.path.abspath(path)) if os.path.isfile(path) else path


def check_resume(resume, overwrite, checkpoint_dir) -> None:
    """``resume`` / ``overwrite`` / ``checkpoint_dir`` of :func:`~shardvi.vi.optimize_kl.optimize_kl` agree."""
    if not isinstance(resume, (bool, str, bytes, os.PathLike)):
        raise TypeError(
            f"resume must be False, True, 'force' or the path of a checkpoint directory, got {type(resume).__name__}"
        )
    if not isinstance(overwrite, bool):
        raise TypeError(f"overwrite must be a bool, got {type(overwrite).__name__}")
    source = resume_source(resume)  # a path: checked (non-empty)
    if source is not None:
        if not ckpt.has_checkpoint(source):
            raise ckpt.CheckpointError(
                f"resume={source!r}: that directory holds no checkpoint (no index file "
                "there); resume=True with checkpoint_dir starts fresh where there is none"
            )
        if checkpoint_dir is None or same_dir(source, checkpoint_dir):
            if overwrite:
                raise ValueError(
                    f"resume={resume!r} continues the checkpoint there and overwrite=True would discard it; "
                    "pass one of them (or another checkpoint_dir to write the continued run to)"
                )
        else:
            ckpt.check_path(checkpoint_dir, "checkpoint_dir")
        return
    if resume and overwrite:
        raise ValueError(
            "resume and overwrite exclude each other: resume=True continues the checkpoint in "
            "checkpoint_dir, overwrite=True discards it; pass one of them"
        )
    if checkpoint_dir is None:
        if resume:
            raise ValueError(f"resume={resume!r} needs checkpoint_dir (or give the directory: resume='path/to/dir')")
        if overwrite:
            raise ValueError("overwrite=True needs checkpoint_dir")
        return
    ckpt.check_path(checkpoint_dir, "checkpoint_dir")


def same_dir(a, b) -> bool:
    """Whether paths ``a`` and ``b`` name the same directory (the same file if both exist, else the same path)."""
    a, b = os.fsdecode(os.fspath(a)), os.fsdecode(os.fspath(b))
    try:
        return os.path.samefile(a, b)
    except OSError:
        return os.path.abspath(a) == os.path.abspath(b)
