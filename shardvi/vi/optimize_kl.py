"""The MGVI / geoVI driver: sample, minimize the sample-averaged KL, repeat."""

from __future__ import annotations

import contextlib
import functools
import logging
import os
from collections.abc import Callable

import jax
import jax.numpy as jnp
import numpy as np
from jax import tree_util as jtu

from ..compile_cache import persistent_compilation_cache
from ..minimizers.minimizer import Minimizer
from ..models.model import check_latent
from ..parallel.strategy import Strategy
from . import checkpoint as ckpt
from .engine import OptimizeVI, _Handover, _no_samples, check_arity, run_fingerprint
from .errors import (
    NonFiniteError,
    NonPositiveCurvatureError,
)
from .likelihood import Likelihood, amend_hint
from .modes import recorded_as
from .planner import resolve_auto
from .progress import Progress
from .samples import Samples
from .settings import (
    DEFAULT_KL_MINIMIZATION,
    DEFAULT_LINEAR_SAMPLING,
    DEFAULT_NONLINEAR_UPDATE,
    check_resume,
    resume_source,
    same_dir,
)
from .state import OptimizeVIState

__all__ = ["NonFiniteError", "NonPositiveCurvatureError", "OptimizeVI", "OptimizeVIState", "optimize_kl"]

logger = logging.getLogger("shardvi")


def optimize_kl(
    likelihood: Likelihood,
    position,
    *,
    key,
    n_total_iterations: int,
    n_samples,
    sample_mode: str | Callable[[int], str] = "nonlinear_resample",
    mirror_samples: bool = True,
    point_estimates=(),
    constants=(),
    linear_sampling=DEFAULT_LINEAR_SAMPLING,
    nonlinear_update=DEFAULT_NONLINEAR_UPDATE,
    kl_minimization: Minimizer | Callable[[int], Minimizer] = DEFAULT_KL_MINIMIZATION,
    sample_map: str | Strategy = "vmap",
    kl_map: str | Strategy = "vmap",
    devices=None,
    checkpoint_dir: str | None = None,
    resume: bool | str = False,
    overwrite: bool = False,
    callback: Callable | None = None,
    compiler_options: dict | None = None,
    progress: bool | str | Progress | None = "auto",
    compilation_cache_dir: str | os.PathLike | None = None,
    precompile: bool = True,
    trim_host_memory: bool = False,
    memory_limit: int | None = None,
    check_field_split: bool = True,
) -> tuple[Samples, OptimizeVIState]:
    """Approximate the posterior with MGVI / geoVI.

    Parameters
    ----------
    likelihood : Likelihood
        On the latent space (``lh.amend(model)``); latent prior ``N(0, I)``.
    position : pytree or Samples
        Initial latent position (or samples of an earlier run to continue from).
    key : jax key
        RNG key; sample keys are split from it on the host, one per pair.
    n_total_iterations : int
        Global iterations (sampling + KL minimization).
    n_samples : int or callable(iteration) -> int
        Number of antithetic *pairs* (with ``mirror_samples``); 0 means MAP.
    sample_mode : str or callable(iteration) -> str
        One of ``linear_sample``, ``linear_resample``, ``nonlinear_sample``,
        ``nonlinear_resample``, ``nonlinear_update`` (see :class:`SampleMode`).
    mirror_samples : bool
        Use antithetic pairs ``+r, -r``.
    point_estimates : sequence of dict keys or pytree of bools
        Latent entries without posterior samples: their residuals are zero, so
        the KL minimization optimizes them as point estimates while the rest
        is sampled. Top-level keys of a dict latent (``("skyzeromode",)``) or a
        pytree of bools with the latent's structure (``True``: a point
        estimate). Fixed for the run. Default: none.
    constants : sequence of dict keys or pytree of bools
        Latent entries the KL minimization does not move: they keep their
        value in ``position`` (their residuals are still drawn unless they are
        point estimates too). The same forms as ``point_estimates``. Default:
        none.
    linear_sampling : CGConfig or callable(iteration) -> CGConfig
        Conjugate gradient of the MGVI solve ``M r = y``, one per sample.
        Default ``CGConfig(tol=1e-6, maxiter=500)``.
    nonlinear_update : NewtonCGConfig or callable(iteration) -> NewtonCGConfig
        Newton-CG of the geoVI update, one per sample (used by the
        ``nonlinear_*`` modes). Default ``NewtonCGConfig(xtol=1e-6, maxiter=50,
        cg=CGConfig(tol=1e-8, maxiter=500))``: the update is a root problem, where
        tight inner solves keep Newton's quadratic convergence.
    kl_minimization : Minimizer or callable(iteration) -> Minimizer
        Minimizer of the sample-averaged KL: ``NewtonCGConfig`` (line search),
        ``TrustRegionConfig`` (Steihaug trust region), ``OptaxConfig`` or any
        :class:`~shardvi.minimizers.Minimizer`. Default
        ``NewtonCGConfig(xtol=1e-6, maxiter=35)``.
    sample_map : str or strategy
        How the sample solves (MGVI CG, geoVI Newton-CG) are mapped over the
        samples and devices: ``"vmap"`` (default), ``"lax_map"``,
        ``"shard_map"``, ``"pmap"``, ``"jit"``, ``"auto"`` (the planner's
        choice, :func:`shardvi.parallel.plan`: on CPU chunk 1 on all
        ``devices``, on a GPU the largest chunk that fits; logged, and the
        same bits as the strategy it chose), or a :mod:`shardvi.parallel`
        strategy object (guide: "Choosing a strategy").
    kl_map : str or strategy
        How the sample-averaged KL (value, gradient, metric) is mapped inside
        the KL minimization; the same choices as ``sample_map``, usually the
        same strategy.
    devices : sequence of jax.Device, optional
        For multi-device strategies given by name (default: all devices);
        read once (a generator is fine). Never silently ignored: with
        ``"vmap"``/``"lax_map"`` (or ``Vmap()``/``LaxMap()``) only ``None`` or
        ``[jax.local_devices()[0]]``, with a strategy object only ``None`` or
        its own devices; anything else is a ``ValueError``.
    checkpoint_dir : str or os.PathLike, optional
        Write an array-only checkpoint after every iteration (guide:
        "Checkpoints and resume"). Checked before iteration 0 (created if missing; must
        be a writable directory) and locked for the whole run: a second run
        on it raises :class:`CheckpointError` naming the lock's holder.
    resume : bool, ``"force"`` or path
        ``True``: continue from the checkpoint in ``checkpoint_dir`` if there
        is one (else start fresh). A path (``resume="out/run1"``, as NIFTy.re
        users write it; a file of the checkpoint names its directory):
        continue the checkpoint there, which must exist, and write the
        continued run's checkpoints to ``checkpoint_dir``, by default that
        same directory (another ``checkpoint_dir`` leaves the source
        untouched, not even locked: it may be a read-only archive). It must belong to this run: the same
        likelihood (kind, data and noise, model output shapes), latent
        structure, ``mirror_samples``, ``point_estimates``, ``constants``,
        and ``n_samples`` / ``sample_mode`` of the completed iterations;
        otherwise :class:`CheckpointError` lists what differs. ``"force"``
        resumes despite such differences (with a warning); a different latent
        structure never loads. On resume ``key`` is not used: the
        checkpoint's RNG state continues. A checkpoint of more completed
        iterations than ``n_total_iterations`` is a ``ValueError`` (one of
        exactly ``n_total_iterations`` returns its result).
    overwrite : bool
        With ``resume=False`` (a new run), a ``checkpoint_dir`` that already
        holds a checkpoint is refused with :class:`CheckpointError` unless
        ``overwrite=True``; the new run then replaces it: the old run's own
        npz files (listed in its index) are pruned as new ones are written,
        other files are never touched.
    callback : callable(samples, state), optional
        Called after every iteration. Its signature is checked before any
        work (where it can be inspected): it must accept two positional
        arguments.
    compiler_options : dict, optional
        Extra XLA options for the compiled sampling and KL steps, merged over
        :data:`shardvi.parallel.REPRODUCIBLE_COMPILER_OPTIONS` and, on CPU,
        :data:`shardvi.parallel.CPU_COMPILER_OPTIONS` (LLVM optimization level
        1, which compiles faster at the same run time, see BENCHMARKS.md,
        "Compile time"; ``{"xla_backend_optimization_level": 3}`` restores
        XLA's default; XLA's while-loop-invariant code motion off with CSE)
        (validated up front). Overriding ``xla_disable_hlo_passes``
        gives up bitwise reproducibility across device counts.
    progress : bool, str or shardvi.vi.progress.Progress
        What is printed while it runs (standard error). ``"auto"`` (default)
        or ``True``: a live bar (global iterations, elapsed time, ETA, the
        running stage; ``compiling + ...`` on the iterations that compile)
        when standard error is a terminal, otherwise one summary line per
        iteration. ``"bar"`` / ``"lines"`` force one of the two; ``False``
        prints nothing. The summary line also always goes to the ``logging``
        logger ``"shardvi"`` (level INFO), whatever ``progress`` is.
    compilation_cache_dir : str or os.PathLike, optional
        Opt-in persistent compilation cache (created if missing): the
        compiled programs are stored there, and a later run of the same
        problem (same shapes, configs, strategies and devices; the data may
        differ) loads them instead of compiling: its first iteration runs in
        about the time of the others, with bitwise the same results. JAX's
        persistent cache, switched on for this call only
        (:func:`shardvi.compile_cache.persistent_compilation_cache`; the
        directory is trusted code, see there). Default: no cache.
    precompile : bool
        ``True`` (default): compile the steps of the running and the later
        iterations in a background thread while the earlier ones compile and
        run (the first KL minimization while the first samples are drawn, a
        geoVI update while the linear iterations before it run), so the
        compile times overlap. The same programs, bitwise the same results;
        a step that fails to compile there is compiled again at its call and
        raises there. The steps are traced in the calling thread; only
        XLA's compilation runs in the background, and its thread has ended
        when the call returns. ``False``: every step
        compiles at its first call, in the calling thread (one compilation
        at a time: lower peak memory). Always ``False`` in multi-process
        runs (``jax.distributed``): there every process must compile and
        transfer in the same order.
    trim_host_memory : bool
        Opt-in, glibc only, process-wide: fix glibc's mmap threshold at
        1 MiB, let threads share at most two heaps, and return the heaps'
        free pages to the system before each stage and after each step's
        compiling call (:mod:`shardvi.host_memory`). Lowers the peak resident
        memory of large runs (BENCHMARKS.md, "Opt-in process settings");
        changes no result. Default:
        the allocator is left as it is.

    memory_limit : int, optional
        Bytes per device the run must fit. Before any work, the samples the
        run keeps on a device (``n_samples`` pairs of latent-sized residuals,
        as drawn and as held for the KL step), the position and the data are
        held against it, or by default against the device's memory (on CPU:
        the host's available memory shared by the process's CPU devices);
        a run that cannot fit raises
        :class:`~shardvi.parallel.memory.InsufficientMemoryError` at once.
    check_field_split : bool
        For a likelihood amended with ``field_blocks`` under a strategy with
        ``model_shards > 1``: before the first iteration, evaluate the
        sample-averaged Hamiltonian and its gradient at a random latent on
        the split field and on the whole field (one device) and raise a
        ``ValueError`` if the model mixes rows across blocks (a flip, roll or
        transpose along the grid's first axis), which would otherwise give a
        silently wrong posterior. ``False`` skips it, for a field too large
        to evaluate on one device: then the model must be row-local by
        construction. Data split over processes are never checked.
    Returns
    -------
    (Samples, OptimizeVIState)
    """
    if callback is not None:
        check_arity(callback, 2, "callback", "callback(samples, state)")
    check_resume(resume, overwrite, checkpoint_dir)
    cache = contextlib.nullcontext()
    if compilation_cache_dir is not None:
        cache = persistent_compilation_cache(compilation_cache_dir)  # validated (and created) on entry
    sample_map, kl_map, devices, n_samples = resolve_auto(
        likelihood,
        n_total_iterations,
        sample_map=sample_map,
        kl_map=kl_map,
        devices=devices,
        n_samples=n_samples,
        mirror_samples=mirror_samples,
        memory_limit=memory_limit,
    )
    with cache:
        opt = OptimizeVI(
            likelihood,
            n_total_iterations,
            n_samples=n_samples,
            sample_mode=sample_mode,
            mirror_samples=mirror_samples,
            point_estimates=point_estimates,
            constants=constants,
            linear_sampling=linear_sampling,
            nonlinear_update=nonlinear_update,
            kl_minimization=kl_minimization,
            sample_map=sample_map,
            kl_map=kl_map,
            devices=devices,
            compiler_options=compiler_options,
            progress=progress,
            precompile=precompile,
            trim_host_memory=trim_host_memory,
            memory_limit=memory_limit,
            check_field_split=check_field_split,
        )
        samples = position if isinstance(position, Samples) else None
        pos = samples.pos if samples is not None else position
        check_latent(pos, likelihood.domain, "position", hint=amend_hint(likelihood))
        pos = jtu.tree_map(lambda x, d: jnp.asarray(x, d.dtype), pos, likelihood.domain)
        if samples is None:
            samples = Samples(pos, jtu.tree_map(_no_samples, pos), None)
        state = opt.init_state(key)
        source = resume_source(resume)
        if source is not None and checkpoint_dir is None:
            checkpoint_dir = source  # resume='dir' continues the run there
        if checkpoint_dir is None:
            handover = _Handover(samples)
            del samples
            return opt.run(handover, state, callback=callback)  # pyright: ignore[reportArgumentType]
        directory = ckpt.prepare_checkpoint_dir(checkpoint_dir)  # before iteration 0: created and writable
        fingerprint = run_fingerprint(opt, pos)
        with ckpt.checkpoint_lock(directory):  # held until the run ends (or raises)
            if source is not None:
                if not same_dir(source, directory) and ckpt.has_checkpoint(directory) and not overwrite:
                    raise ckpt.CheckpointError(
                        f"checkpoint_dir {directory!r} already holds a checkpoint; resume={source!r} would write "
                        "the continued run over it: pass overwrite=True to replace it, or another checkpoint_dir"
                    )
                # the source is only read (no lock file there: it may be a read-only archive)
                samples, state = ckpt.load_checkpoint(
                    source, pos, fingerprint=fingerprint, check_history=functools.partial(_history_differences, opt)
                )
                _check_not_beyond(state.nit, opt.n_total_iterations, source)
                logger.info("resuming from %s at iteration %d, writing to %s", source, state.nit, directory)
            elif ckpt.has_checkpoint(directory):
                if resume:
                    samples, state = ckpt.load_checkpoint(
                        directory,
                        pos,
                        fingerprint=fingerprint,
                        force=resume == "force",
                        check_history=functools.partial(_history_differences, opt),
                    )
                    _check_not_beyond(state.nit, opt.n_total_iterations, directory)
                    logger.info("resuming from %s at iteration %d", directory, state.nit)
                elif not overwrite:
                    raise ckpt.CheckpointError(_refusal(directory))
                else:
                    logger.warning("overwrite=True: a new run replaces the checkpoint in %s", directory)
            if jax.process_count() > 1:
                _check_same_iteration(state.nit, directory)
            handover = _Handover(samples)  # the loaded samples: freed once the next ones replace them
            del samples
            return opt.run(
                handover,  # pyright: ignore[reportArgumentType]
                state,
                checkpoint_dir=directory,
                callback=callback,
                fingerprint=fingerprint,
            )


def _check_not_beyond(nit: int, n_total_iterations: int, directory) -> None:
    """``ValueError`` where the resumed checkpoint has completed more iterations than the run asks for."""
    if nit > n_total_iterations:
        raise ValueError(
            f"n_total_iterations={n_total_iterations} is below the {nit} iterations the checkpoint in "
            f"{os.fsdecode(os.fspath(directory))!r} has completed: pass n_total_iterations >= {nit} to resume it "
            f"(= {nit} returns its result), or resume=False with overwrite=True to start afresh"
        )


def _check_same_iteration(nit, directory) -> None:
    """Multi-process: every process starts (or resumes) at the same iteration, else a ``CheckpointError`` on all.

    Each process writes its own checkpoint after the iteration's last collective: a process killed while the
    others wrote can be one iteration behind, and processes at different iterations would wait on each
    other's collectives for ever.
    """
    from jax.experimental import multihost_utils

    its = np.asarray(multihost_utils.process_allgather(np.asarray(int(nit), np.int32))).ravel()
    if np.any(its != its[0]):
        raise ckpt.CheckpointError(
            f"the processes start at different iterations {its.tolist()} (process i at entry i; this process "
            f"{jax.process_index()}, {directory!r}: {int(nit)}): every process must resume from a checkpoint of the "
            "same iteration (see each checkpoint_dir's latest.json)"
        )


def _history_differences(opt: OptimizeVI, history) -> list:
    """``n_samples`` / ``sample_mode`` of the checkpoint's iterations against this run's settings."""
    out = []
    for r in history:
        i = r.iteration - 1
        mode, n = opt._settings(i)[:2]
        if n != r.n_samples:
            out.append(f"n_samples at iteration {i}: {r.n_samples} in the checkpoint, {n} now")
        if not recorded_as(mode, r.sample_mode):  # nonlinear_update may have run as nonlinear_resample
            out.append(f"sample_mode at iteration {i}: {r.sample_mode!r} in the checkpoint, {mode.value!r} now")
    return out if len(out) <= 6 else out[:6] + [f"... and {len(out) - 6} more iteration setting(s)"]


def _refusal(directory: str) -> str:
    try:
        what = f"of iteration {ckpt.read_index(directory)['nit']}"
    except ckpt.CheckpointError:
        what = "with an unreadable index"
    return (
        f"checkpoint_dir {directory!r} already holds a checkpoint {what}, and resume=False (the default) "
        f"starts a new run that would replace it. Pass resume=True to continue it, overwrite=True to discard "
        f"it and start afresh, or use another checkpoint_dir."
    )
