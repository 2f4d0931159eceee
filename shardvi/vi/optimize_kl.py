"""The MGVI / geoVI driver: sample, minimize the sample-averaged KL, repeat."""
from __future__ import annotations

import contextlib
import functools
import logging
import time
from typing import Any, Callable, NamedTuple, Optional, Union

import jax
import jax.numpy as jnp
import numpy as np
from jax import tree_util as jtu

from .. import tree_math as tm
from ..minimizers.config import CGConfig, NewtonCGConfig, OptaxConfig
from ..minimizers.newton_cg import newton_cg
from ..minimizers.optax_adapter import check_optimizer, optax_minimize
from ..minimizers.status import Status, status_message
from ..models.model import check_latent
from ..parallel.reproducible import check_compiler_options, engine_compiler_options, reproducible_jit
from ..parallel.mesh import check_devices
from ..parallel.strategy import Placed, get_strategy, place
from . import checkpoint as ckpt
from .diagnostics import IterationReport, pooled_chi2, residual_stats
from .kl import kl_metric, kl_value_and_grad
from .likelihood import Likelihood
from .masks import parse_selection, project
from .modes import SampleMode, parse_sample_mode
from .progress import Progress, check_progress, open_display
from .samples import Samples
from .sampling import draw_linear_residual, nonlinearly_update_residual

__all__ = ["NonFiniteError", "NonPositiveCurvatureError", "OptimizeVI", "OptimizeVIState", "optimize_kl"]

logger = logging.getLogger("shardvi")

DEFAULT_LINEAR_SAMPLING = CGConfig(tol=1e-6, maxiter=500)
DEFAULT_NONLINEAR_UPDATE = NewtonCGConfig(xtol=1e-6, maxiter=20)
DEFAULT_KL_MINIMIZATION = NewtonCGConfig(xtol=1e-6, maxiter=35)


class OptimizeVIState(NamedTuple):
    """State between global iterations (arrays and plain Python values only).

    Attributes
    ----------
    nit : int
        Completed global iterations.
    key : jax.Array
        Raw ``uint32`` RNG key for the next iteration.
    history : tuple of IterationReport
        One report per completed iteration.
    """

    nit: int
    key: Any
    history: tuple = ()


def _raw_key(key, argname="key"):
    """One threefry2x32 key as its raw ``uint32[2]`` data (typed keys are unwrapped).

    Only threefry2x32 keys are supported: the host-side key splitting and the
    stored per-pair keys (``Samples.keys``, checkpoints) are threefry data, and
    samples must be bitwise reproducible from them.
    """
    if key is None:
        raise TypeError(f"{argname} is required (e.g. jax.random.PRNGKey(0))")
    if not isinstance(key, (jax.Array, np.ndarray)):
        raise TypeError(f"{argname} must be a jax.random key (PRNGKey(seed) or jax.random.key(seed)), "
                        f"got {type(key).__name__}")
    if jnp.issubdtype(key.dtype, jax.dtypes.prng_key):
        impl = str(jax.random.key_impl(key))
        if impl != "threefry2x32":
            raise TypeError(f"{argname} is a {impl!r} key; only threefry2x32 keys are supported (the default: "
                            f"jax.random.key(seed) or jax.random.PRNGKey(seed)), so that samples are bitwise "
                            f"reproducible from their stored keys")
        if key.shape != ():
            raise TypeError(f"{argname} must be one key, got a batch of shape {key.shape}")
        key = jax.random.key_data(key)
    if key.dtype != np.uint32 or key.shape != (2,):
        hint = ""
        if key.dtype == np.uint32 and key.ndim == 2 and key.shape[1] == 2:
            hint = " (a batch of keys: pass one key)"
        elif key.dtype == np.uint32 and key.shape == (4,):
            hint = " (an 'rbg' key? only threefry2x32 keys are supported)"
        raise TypeError(f"{argname} must be one threefry2x32 jax.random key (PRNGKey(seed) or "
                        f"jax.random.key(seed)), got dtype {key.dtype} shape {key.shape}{hint}")
    return jnp.asarray(key)


def _at_iteration(value, nit, argname, check=None):
    """Evaluate per-iteration settings given as ``callable(iteration)``.

    ``check(result)`` validates the result; its ``TypeError``/``ValueError``
    from a callable's result is re-raised naming the call
    (``sample_mode(3) returned ...``).
    """
    if callable(value) and not isinstance(value, (CGConfig, NewtonCGConfig, OptaxConfig)):
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


def _check_n_samples(n, nit, mode: SampleMode):
    if isinstance(n, bool) or not isinstance(n, (int, np.integer)):
        raise TypeError(f"n_samples must be an int >= 0 (number of antithetic pairs), got {n!r} "
                        f"at iteration {nit}")
    if n < 0:
        raise ValueError(f"n_samples must be >= 0, got {n} at iteration {nit}")
    if n == 0 and mode.nonlinear:
        raise ValueError(f"n_samples=0 (MAP) cannot be combined with sample_mode={mode.value!r} "
                         f"at iteration {nit}; use a linear mode or n_samples >= 1")
    return int(n)


def _check_real_domain(domain):
    """The latent space must be real: the prior N(0, I) and the samples' metric are real."""
    for path, d in jtu.tree_flatten_with_path(domain)[0]:
        if jnp.issubdtype(d.dtype, jnp.complexfloating):
            raise TypeError(f"likelihood: its domain (the latent space) is complex at {jtu.keystr(path) or 'the root'} "
                            f"({d.dtype}); latents must be real (amend the likelihood with a sv.Model on a real "
                            f"domain, e.g. a complex signal from two real latents)")


def _check_type(value, types, argname, nit):
    if not isinstance(value, types):
        names = " or ".join(t.__name__ for t in (types if isinstance(types, tuple) else (types,)))
        raise TypeError(f"{argname} must be a {names} (or a callable returning one), got "
                        f"{type(value).__name__} at iteration {nit}")
    return value


def _no_samples(p):
    """Empty residual leaf ``(0, *p.shape)`` (from NumPy: no compilation)."""
    return jnp.asarray(np.zeros((0,) + tuple(p.shape), p.dtype))


def _interleave(r):
    """``[r_0, -r_0, r_1, -r_1, ...]`` along the leading axis."""
    return jtu.tree_map(lambda x: jnp.stack([x, -x], axis=1).reshape((-1,) + x.shape[1:]), r)


def _with_progress(method):
    """Run ``method(self, samples, state, ...)`` inside a progress display (see :mod:`.progress`)."""
    leave = method.__name__ == "run"   # a single update's bar is erased when it closes

    @functools.wraps(method)
    def wrapper(self, samples, state, *args, **kwargs):
        with self._progress_scope(leave):
            return method(self, samples, state, *args, **kwargs)
    return wrapper


class OptimizeVI:
    """MGVI / geoVI optimizer with cached compiled steps.

    Build once, then call :meth:`init_state` and :meth:`update` (one global
    iteration) or :meth:`run`. All compiled functions are created here and
    cached by JAX per input shape and (frozen, hashable) config, so iterations
    with the same sample count, mode class and configs never recompile.

    Parameters are those of :func:`optimize_kl` without position/key/checkpointing.
    """

    def __init__(self, likelihood: Likelihood, n_total_iterations: int, *,
                 n_samples: Union[int, Callable[[int], int]],
                 sample_mode: Union[str, Callable[[int], str]] = "nonlinear_resample",
                 mirror_samples: bool = True, point_estimates=(), constants=(),
                 linear_sampling=DEFAULT_LINEAR_SAMPLING, nonlinear_update=DEFAULT_NONLINEAR_UPDATE,
                 kl_minimization=DEFAULT_KL_MINIMIZATION, sample_map="vmap", kl_map="vmap", devices=None,
                 compiler_options=None, progress: Union[bool, str, Progress, None] = "auto"):
        if not isinstance(likelihood, Likelihood):
            raise TypeError(f"likelihood must be a shardvi Likelihood, got {type(likelihood).__name__}")
        if isinstance(n_total_iterations, bool) or not isinstance(n_total_iterations, (int, np.integer)) \
                or n_total_iterations < 0:
            raise ValueError(f"n_total_iterations must be an int >= 0, got {n_total_iterations!r}")
        if not isinstance(mirror_samples, bool):
            raise TypeError(f"mirror_samples must be a bool, got {type(mirror_samples).__name__}")
        if not callable(sample_mode):
            parse_sample_mode(sample_mode)
        if not callable(n_samples):
            _check_n_samples(n_samples, 0, SampleMode.LINEAR_SAMPLE)
        for name, val, types in (("linear_sampling", linear_sampling, CGConfig),
                                 ("nonlinear_update", nonlinear_update, NewtonCGConfig),
                                 ("kl_minimization", kl_minimization, (NewtonCGConfig, OptaxConfig))):
            if not callable(val) or isinstance(val, (CGConfig, NewtonCGConfig, OptaxConfig)):
                _check_type(val, types, name, 0)
        _check_real_domain(likelihood.domain)
        if isinstance(kl_minimization, OptaxConfig):  # traced once (eval_shape), nothing compiled
            check_optimizer(kl_minimization.optimizer, likelihood.domain, "kl_minimization.optimizer")
        self.likelihood = likelihood
        self.n_total_iterations = int(n_total_iterations)
        self.n_samples = n_samples
        self.sample_mode = sample_mode
        self.mirror_samples = mirror_samples
        self.linear_sampling = linear_sampling
        self.nonlinear_update = nonlinear_update
        self.kl_minimization = kl_minimization
        domain = likelihood.domain
        self._sample_mask = jtu.tree_map(lambda b: not b, parse_selection(point_estimates, domain,
                                                                           "point_estimates"))
        self._opt_mask = jtu.tree_map(lambda b: not b, parse_selection(constants, domain, "constants"))
        devices = check_devices(devices, "devices")  # a generator is read once, here
        self.sample_strategy = get_strategy(sample_map, "sample_map", devices)
        self.kl_strategy = get_strategy(kl_map, "kl_map", devices)
        self.compiler_options = check_compiler_options(compiler_options, "compiler_options")
        self.progress = check_progress(progress, "progress")
        self._display = None          # the open progress display (inside run / update)
        self._seen_steps = set()      # (step, config, sample count) already run: compiled
        self._build()

    # -- compiled pieces -----------------------------------------------------------------------
    def _build(self):
        lh, smask, omask = self.likelihood, self._sample_mask, self._opt_mask
        sstrat, kstrat = self.sample_strategy, self.kl_strategy

        def draw_linear(pos, keys, config):
            fn = lambda p, k: draw_linear_residual(lh, p, k, config, sample_mask=smask)  # noqa: E731
            r, info = sstrat.map(fn, (None, 0))(pos, keys)
            return r, info.nit, info.status, tm.all_finite(r)

        def curve(pos, residuals, keys, signs, config):
            fn = lambda p, r, k, s: nonlinearly_update_residual(  # noqa: E731
                lh, p, r, k, s, config, sample_mask=smask)
            r, info = sstrat.map(fn, (None, 0, 0, 0))(pos, residuals, keys, signs)
            return r, info.nit, info.status, tm.all_finite(r)

        def minimize(pos, residuals, config):
            def fun_and_grad(x):
                v, g = kl_value_and_grad(lh, x, residuals, kstrat)
                return v, project(omask, g)

            def hessp(x, t):
                return project(omask, kl_metric(lh, x, residuals, project(omask, t), kstrat))

            if isinstance(config, OptaxConfig):
                res = optax_minimize(fun_and_grad, pos, config)
            else:
                # the metric mean_i M(pos + r_i) >= I: non-positive curvature means a broken likelihood metric
                res = newton_cg(fun_and_grad, hessp, pos, config, min_curvature=1.0)
            # the finiteness check runs here, compiled with the step (not as eager ops on the host)
            return res, tm.all_finite(res.x) & jnp.isfinite(res.fun)

        def diagnostics(pos, residuals):
            smp = Samples(pos, residuals)
            return residual_stats_arrays(lh, smp)

        # reproducible_jit: the same arithmetic, bitwise, on any device count and for every strategy;
        # Placed: inputs placed by the strategy that computes on them (same sharding every call: no recompiles)
        rjit = functools.partial(reproducible_jit, static_argnames="config", compiler_options=self.compiler_options)
        self._draw_linear = Placed(sstrat, rjit(draw_linear))
        self._curve = Placed(sstrat, rjit(curve))
        self._minimize = Placed(kstrat, rjit(minimize))
        # the small helpers with the same XLA options (one emitter pipeline for all of the engine's programs)
        ejit = functools.partial(jax.jit, compiler_options=engine_compiler_options(self.compiler_options))
        self._interleave = Placed(sstrat, ejit(_interleave))
        self._diagnostics = Placed(kstrat, ejit(diagnostics))
        self._repeat_keys = Placed(sstrat, ejit(lambda keys: jnp.repeat(keys, 2, axis=0)))

    # -- progress ----------------------------------------------------------------------------
    @contextlib.contextmanager
    def _progress_scope(self, leave: bool):
        """Open a progress display unless one is open (``update`` inside ``run``); close it at exit."""
        if self._display is not None:
            yield
            return
        self._display = open_display(self.progress, leave=leave)
        try:
            yield
        finally:
            display, self._display = self._display, None
            display.close()

    def _stage(self, name: str, step=None):
        """Report that stage ``name`` starts; ``step`` (a hashable key) is compiled on its first run."""
        compiling = step is not None and step not in self._seen_steps
        if step is not None:
            self._seen_steps.add(step)
        if self._display is not None:
            self._display.stage(name, compiling)

    # -- state -------------------------------------------------------------------------------
    def init_state(self, key, nit: int = 0) -> OptimizeVIState:
        """Fresh state holding the RNG ``key``."""
        return OptimizeVIState(nit=int(nit), key=_raw_key(key), history=())

    def _settings(self, nit):
        mode = _at_iteration(self.sample_mode, nit, "sample_mode", parse_sample_mode)
        n = _check_n_samples(_at_iteration(self.n_samples, nit, "n_samples"), nit, mode)
        lin = _check_type(_at_iteration(self.linear_sampling, nit, "linear_sampling"), CGConfig,
                          "linear_sampling", nit)
        nonlin = _check_type(_at_iteration(self.nonlinear_update, nit, "nonlinear_update"), NewtonCGConfig,
                             "nonlinear_update", nit)
        klc = _check_type(_at_iteration(self.kl_minimization, nit, "kl_minimization"),
                          (NewtonCGConfig, OptaxConfig), "kl_minimization", nit)
        return mode, n, lin, nonlin, klc

    def draw_samples(self, samples: Samples, key, mode: SampleMode, n: int, lin: CGConfig,
                     nonlin: NewtonCGConfig, iteration: int = 0):
        """Residuals around ``samples.pos`` for one iteration.

        Returns ``(Samples, cg_nit, newton_nit, mode, cg_status, newton_status)``
        where ``mode`` is the mode actually used (``nonlinear_update`` without
        previous samples of the same count draws fresh ones:
        ``nonlinear_resample``) and the statuses are per-sample
        :class:`~shardvi.minimizers.Status` codes (lists of int). Raises
        :class:`NonPositiveCurvatureError` where the sampling metric is not
        positive definite; logs a warning for unconverged sample solves.
        """
        pos = samples.pos
        if n == 0:
            empty = jtu.tree_map(_no_samples, pos)
            return Samples(pos, empty, None), [], [], mode, [], []
        have_prev = samples.keys is not None and len(samples) > 0
        n_prev = 0 if not have_prev else samples.keys.shape[0]
        if mode.update and have_prev and n_prev == n:
            keys = samples.keys
            signs = self._signs(n)
            self._stage("geoVI update", ("curve", nonlin, n))
            r, nl_nit, st, ok = self._curve(pos, samples.residuals, self._expand(keys), signs, config=nonlin)
            _raise_nonfinite(ok, st, iteration, "sampling (geoVI update)")
            nl_st = _sample_status(st, iteration, self.n_total_iterations, "sampling (geoVI update)",
                                   "nonlinear_update", metric_must_be_pd=False)
            return Samples(pos, r, keys), [], np.asarray(nl_nit).tolist(), mode, [], nl_st
        if mode.update:
            logger.info("nonlinear_update without previous samples of the same count: drawing fresh ones")
            mode = SampleMode.NONLINEAR_RESAMPLE
        reuse = (not mode.fresh_keys) and (not mode.update) and have_prev and n_prev == n
        keys = samples.keys if reuse else jax.random.split(key, n)
        self._stage("MGVI sampling", ("draw", lin, n))
        r, cg_nit, st, ok = self._draw_linear(pos, keys, config=lin)
        _raise_nonfinite(ok, st, iteration, "sampling (MGVI linear CG)")
        cg_st = _sample_status(st, iteration, self.n_total_iterations, "sampling (MGVI linear CG)", "linear_sampling",
                               metric_must_be_pd=True)
        if self.mirror_samples:
            r = self._interleave(r)
        nl_nit, nl_st = [], []
        if mode.nonlinear:
            self._stage("geoVI update", ("curve", nonlin, n))
            r, nl, st, ok = self._curve(pos, r, self._expand(keys), self._signs(n), config=nonlin)
            _raise_nonfinite(ok, st, iteration, "sampling (geoVI update)")
            nl_nit = np.asarray(nl).tolist()
            nl_st = _sample_status(st, iteration, self.n_total_iterations, "sampling (geoVI update)",
                                   "nonlinear_update", metric_must_be_pd=False)
        return Samples(pos, r, keys), np.asarray(cg_nit).tolist(), nl_nit, mode, cg_st, nl_st

    def _expand(self, keys):
        # fresh or reused keys: one placement, one compiled repeat
        return self._repeat_keys(keys) if self.mirror_samples else place(self.sample_strategy, keys)

    def _signs(self, n):  # built in NumPy: no eager XLA programs to compile
        return jnp.asarray(np.tile([1.0, -1.0], n) if self.mirror_samples else np.ones((n,)))

    @_with_progress
    def update(self, samples: Samples, state: OptimizeVIState) -> tuple[Samples, OptimizeVIState]:
        """One global iteration: draw/update samples, then minimize the KL."""
        t0 = time.perf_counter()
        nit = state.nit
        self._display.start_iteration(nit, self.n_total_iterations)
        mode, n, lin, nonlin, klc = self._settings(nit)
        key, k_samples = jax.random.split(state.key)
        samples, cg_nit, nl_nit, mode, cg_st, nl_st = self.draw_samples(samples, k_samples, mode, n, lin,
                                                                        nonlin, nit)
        samples = place(self.kl_strategy, samples)  # pos, residuals and keys on the same devices
        self._stage("KL minimization", ("kl", klc, n))
        res, ok = self._minimize(samples.pos, samples.residuals, config=klc)
        if int(res.status) == Status.NONFINITE or not bool(ok):
            raise NonFiniteError(nit, "KL minimization", f"the KL energy or its gradient is nan/inf "
                                 f"(status: {status_message(res.status)})")
        if int(res.status) == Status.NONPOSITIVE_CURVATURE:  # Newton-CG on the metric, which must be >= I
            raise NonPositiveCurvatureError(nit, "KL minimization")
        samples = samples.at(res.x)
        stats = self._diagnostics(samples.pos, samples.residuals)
        chi2_lh = _pool(stats[0]) if stats[0] is not None else None
        report = IterationReport(
            iteration=nit + 1, sample_mode=mode.value, n_samples=n, kl_energy=float(res.fun),
            sampling_nit=cg_nit, nonlinear_nit=nl_nit, kl_nit=int(res.nit), kl_cg_nit=int(res.ncg),
            kl_status=int(res.status), chi2_likelihood=chi2_lh, chi2_prior=_pool(stats[1]),
            wall_time=time.perf_counter() - t0, sampling_status=cg_st, nonlinear_status=nl_st)
        line = _format_report(report, self.n_total_iterations)
        logger.info(line)
        self._display.end_iteration(nit, self.n_total_iterations, line)
        return samples, OptimizeVIState(nit=nit + 1, key=key, history=state.history + (report,))

    @_with_progress
    def run(self, samples: Samples, state: OptimizeVIState, *, checkpoint_dir=None, callback=None,
            fingerprint: Optional[dict] = None):
        """Iterate :meth:`update` until ``n_total_iterations``, checkpointing after each.

        With ``checkpoint_dir``, the directory's lock is held for the whole
        run and every checkpoint carries ``fingerprint`` (default: that of
        this optimizer and ``samples.pos``). Unlike :func:`optimize_kl`, this
        does not refuse a directory that holds another run's checkpoint.
        """
        lock = contextlib.nullcontext()
        if checkpoint_dir is not None:
            checkpoint_dir = ckpt.prepare_checkpoint_dir(checkpoint_dir)   # before iteration 0
            if fingerprint is None:
                fingerprint = _run_fingerprint(self, samples.pos)
            lock = ckpt.checkpoint_lock(checkpoint_dir)
        with lock:
            while state.nit < self.n_total_iterations:
                samples, state = self.update(samples, state)
                if checkpoint_dir is not None:
                    self._stage("writing checkpoint")
                    ckpt.save_checkpoint(checkpoint_dir, samples, state, fingerprint=fingerprint)
                if callback is not None:
                    callback(samples, state)
        return samples, state


def residual_stats_arrays(lh, samples: Samples):
    """Jittable (sum |r|^2, dof) per section, used for the iteration log line."""
    stacked = samples.samples

    def pooled(tree):
        leaves = jtu.tree_leaves(tree)
        tot = sum(jnp.sum(jnp.abs(x) ** 2) / (2.0 if jnp.iscomplexobj(x) else 1.0) for x in leaves)
        dof = sum(int(np.prod(x.shape)) for x in leaves)
        return tot, dof

    lh_part = pooled(jax.vmap(lh.normalized_residual)(stacked)) if lh.has_normalized_residual else None
    return lh_part, pooled(stacked)


def _pool(part):
    tot, dof = part
    return float(tot) / int(dof)


class NonFiniteError(FloatingPointError):
    """NaN/inf during a global iteration; the last good state is untouched.

    Attributes
    ----------
    iteration : int
        Index of the failing global iteration (0-based; ``state.nit`` before it).
    stage : str
        ``"sampling (MGVI linear CG)"``, ``"sampling (geoVI update)"`` or
        ``"KL minimization"``.
    """

    def __init__(self, iteration: int, stage: str, detail: str):
        self.iteration, self.stage = iteration, stage
        super().__init__(f"non-finite values in {stage} at iteration {iteration}: {detail}. The samples and "
                         f"state of iteration {iteration} (and its checkpoint, if any) are unchanged.")


def _raise_nonfinite(finite, status, nit, stage):
    bad = np.asarray(status) == Status.NONFINITE
    if bad.any() or not bool(finite):
        which = np.nonzero(bad)[0].tolist()
        raise NonFiniteError(nit, stage, f"the solver met nan/inf (sample solves {which})" if which
                             else "a residual is nan/inf")


class NonPositiveCurvatureError(ValueError):
    """The metric of a global iteration is not positive definite; the last good state is untouched.

    ``M = J^T F J + I`` (sampling) and its sample average (KL) are positive
    definite for any valid likelihood: a solver that meets non-positive
    curvature points at a broken likelihood, e.g. a callable
    ``noise_cov_inv`` that is not positive definite, or a ``noise_std_inv``
    that is not its square root.

    Attributes
    ----------
    iteration : int
        Index of the failing global iteration (0-based; ``state.nit`` before it).
    stage : str
        ``"sampling (MGVI linear CG)"`` or ``"KL minimization"``.
    samples : list of int
        Indices of the sample solves that met it (empty for the KL).
    """

    def __init__(self, iteration: int, stage: str, samples=()):
        self.iteration, self.stage, self.samples = iteration, stage, list(samples)
        which = f" (sample solves {self.samples})" if self.samples else ""
        super().__init__(
            f"non-positive curvature in {stage} at iteration {iteration}{which}: the metric J^T F J + I is not "
            f"positive definite, so the likelihood's Fisher metric F is not positive semi-definite. Check the "
            f"likelihood (a callable noise_cov_inv must be positive definite and noise_std_inv its symmetric "
            f"square root). The samples and state of iteration {iteration} (and its checkpoint, if any) are "
            f"unchanged.")


_STATUS_HINTS = {
    Status.MAX_ITERATIONS: "maxiter",
    Status.NONPOSITIVE_CURVATURE: "non-positive curvature",
    Status.LINE_SEARCH_FAILED: "a failed line search",
}


def _sample_status(status, nit, total, stage, config_name, *, metric_must_be_pd):
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
        logger.warning("%s at iteration %d/%d: %d of %d sample solves did not converge (%s); see %s", stage,
                       nit + 1, total, sum(c != Status.CONVERGED for c in codes), len(codes), ", ".join(parts),
                       config_name)
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


def _format_report(r: IterationReport, total: int) -> str:
    lh = f"{r.chi2_likelihood:.3f}" if r.chi2_likelihood is not None else "-"
    return (f"iteration {r.iteration}/{total} [{r.sample_mode}, {r.n_samples} pairs] "
            f"KL {r.kl_energy:.6e} | sampling CG med/max {_fmt_nit(r.sampling_nit)}"
            f"{_fmt_unconverged(r.sampling_status)} | geoVI Newton med/max {_fmt_nit(r.nonlinear_nit)}"
            f"{_fmt_unconverged(r.nonlinear_status)} | KL Newton {r.kl_nit} (CG {r.kl_cg_nit}, "
            f"{status_message(r.kl_status)}) | red.chi2 lh {lh} prior {r.chi2_prior:.3f} | {r.wall_time:.2f} s")


def optimize_kl(likelihood: Likelihood, position, *, key, n_total_iterations: int, n_samples,
                sample_mode="nonlinear_resample", mirror_samples: bool = True, point_estimates=(),
                constants=(), linear_sampling=DEFAULT_LINEAR_SAMPLING,
                nonlinear_update=DEFAULT_NONLINEAR_UPDATE, kl_minimization=DEFAULT_KL_MINIMIZATION,
                sample_map="vmap", kl_map="vmap", devices=None, checkpoint_dir: Optional[str] = None,
                resume: Union[bool, str] = False, overwrite: bool = False, callback: Optional[Callable] = None,
                compiler_options: Optional[dict] = None,
                progress: Union[bool, str, Progress, None] = "auto") -> tuple[Samples, OptimizeVIState]:
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
    point_estimates, constants : sequence of dict keys or pytree of bools
        Latent entries that are not sampled / not optimized.
    linear_sampling : CGConfig or callable
        CG for the MGVI solve ``M r = y``.
    nonlinear_update : NewtonCGConfig or callable
        Newton-CG of the geoVI update.
    kl_minimization : NewtonCGConfig, OptaxConfig or callable
        Minimizer of the sample-averaged KL.
    sample_map, kl_map : str or strategy
        How samples are mapped (``"vmap"``, ``"lax_map"``, multi-device
        strategies, or a :mod:`shardvi.parallel` strategy object).
    devices : sequence of jax.Device, optional
        For multi-device strategies given by name (default: all devices);
        read once (a generator is fine). Never silently ignored: with
        ``"vmap"``/``"lax_map"`` (or ``Vmap()``/``LaxMap()``) only ``None`` or
        ``[jax.local_devices()[0]]``, with a strategy object only ``None`` or
        its own devices; anything else is a ``ValueError``.
    checkpoint_dir : str or os.PathLike, optional
        Write an array-only checkpoint after every iteration (README,
        "Checkpoints"). Checked before iteration 0 (created if missing; must
        be a writable directory) and locked for the whole run: a second run
        on it raises :class:`CheckpointError` naming the lock's holder.
    resume : bool or ``"force"``
        ``True``: continue from the checkpoint in ``checkpoint_dir`` if there
        is one (else start fresh). It must belong to this run: the same
        likelihood (kind, data and noise, model output shapes), latent
        structure, ``mirror_samples``, ``point_estimates``, ``constants``,
        and ``n_samples`` / ``sample_mode`` of the completed iterations;
        otherwise :class:`CheckpointError` lists what differs. ``"force"``
        resumes despite such differences (with a warning); a different latent
        structure never loads. On resume ``key`` is not used: the
        checkpoint's RNG state continues.
    overwrite : bool
        With ``resume=False`` (a new run), a ``checkpoint_dir`` that already
        holds a checkpoint is refused with :class:`CheckpointError` unless
        ``overwrite=True``; the new run then replaces it: the old run's own
        npz files (listed in its index) are pruned as new ones are written,
        other files are never touched.
    callback : callable(samples, state), optional
        Called after every iteration.
    compiler_options : dict, optional
        Extra XLA options for the compiled sampling and KL steps, merged over
        :data:`shardvi.parallel.REPRODUCIBLE_COMPILER_OPTIONS` (validated up
        front). E.g. ``{"xla_cpu_use_fusion_emitters": True}``: XLA:CPU's
        default fusion emitters, ~10 % faster iterations for ~1.8x the peak
        memory (128^2 correlated field, ``BENCHMARKS.md``). Overriding
        ``xla_disable_hlo_passes`` gives up bitwise reproducibility across
        device counts.
    progress : bool, str or shardvi.vi.progress.Progress
        What is printed while it runs (standard error). ``"auto"`` (default)
        or ``True``: a live bar (global iterations, elapsed time, ETA, the
        running stage; ``compiling + ...`` on the iterations that compile)
        when standard error is a terminal, otherwise one summary line per
        iteration. ``"bar"`` / ``"lines"`` force one of the two; ``False``
        prints nothing. The summary line also always goes to the ``logging``
        logger ``"shardvi"`` (level INFO), whatever ``progress`` is.

    Returns
    -------
    (Samples, OptimizeVIState)
    """
    opt = OptimizeVI(likelihood, n_total_iterations, n_samples=n_samples, sample_mode=sample_mode,
                     mirror_samples=mirror_samples, point_estimates=point_estimates, constants=constants,
                     linear_sampling=linear_sampling, nonlinear_update=nonlinear_update,
                     kl_minimization=kl_minimization, sample_map=sample_map, kl_map=kl_map, devices=devices,
                     compiler_options=compiler_options, progress=progress)
    if callback is not None and not callable(callback):
        raise TypeError(f"callback must be callable(samples, state), got {type(callback).__name__}")
    _check_resume(resume, overwrite, checkpoint_dir)
    samples = position if isinstance(position, Samples) else None
    pos = samples.pos if samples is not None else position
    check_latent(pos, likelihood.domain, "position")
    pos = jtu.tree_map(lambda x, d: jnp.asarray(x, d.dtype), pos, likelihood.domain)
    if samples is None:
        samples = Samples(pos, jtu.tree_map(_no_samples, pos), None)
    state = opt.init_state(key)
    if checkpoint_dir is None:
        return opt.run(samples, state, callback=callback)
    directory = ckpt.prepare_checkpoint_dir(checkpoint_dir)    # before iteration 0: created and writable
    fingerprint = _run_fingerprint(opt, pos)
    with ckpt.checkpoint_lock(directory):                       # held until the run ends (or raises)
        if ckpt.has_checkpoint(directory):
            if resume:
                samples, state = ckpt.load_checkpoint(
                    directory, pos, fingerprint=fingerprint, force=resume == "force",
                    check_history=functools.partial(_history_differences, opt))
                logger.info("resuming from %s at iteration %d", directory, state.nit)
            elif not overwrite:
                raise ckpt.CheckpointError(_refusal(directory))
            else:
                logger.warning("overwrite=True: a new run replaces the checkpoint in %s", directory)
        return opt.run(samples, state, checkpoint_dir=directory, callback=callback, fingerprint=fingerprint)


def _check_resume(resume, overwrite, checkpoint_dir) -> None:
    if not (isinstance(resume, bool) or (isinstance(resume, str) and resume == "force")):
        if isinstance(resume, str):
            raise ValueError(f"resume must be False, True or 'force', got {resume!r}")
        raise TypeError(f"resume must be False, True or 'force', got {type(resume).__name__}")
    if not isinstance(overwrite, bool):
        raise TypeError(f"overwrite must be a bool, got {type(overwrite).__name__}")
    if resume and overwrite:
        raise ValueError("resume and overwrite exclude each other: resume=True continues the checkpoint in "
                         "checkpoint_dir, overwrite=True discards it; pass one of them")
    if checkpoint_dir is None:
        if resume:
            raise ValueError(f"resume={resume!r} needs checkpoint_dir")
        if overwrite:
            raise ValueError("overwrite=True needs checkpoint_dir")
        return
    ckpt.check_path(checkpoint_dir, "checkpoint_dir")


def _run_fingerprint(opt: OptimizeVI, pos) -> dict:
    """What a checkpoint of this run must match on resume (besides the per-iteration sample settings)."""
    return ckpt.fingerprint(opt.likelihood, pos, mirror_samples=opt.mirror_samples,
                            point_estimates=jtu.tree_map(lambda b: not b, opt._sample_mask),
                            constants=jtu.tree_map(lambda b: not b, opt._opt_mask))


def _history_differences(opt: OptimizeVI, history) -> list:
    """``n_samples`` / ``sample_mode`` of the checkpoint's iterations against this run's settings."""
    out = []
    for r in history:
        i = r.iteration - 1
        mode, n = opt._settings(i)[:2]
        if n != r.n_samples:
            out.append(f"n_samples at iteration {i}: {r.n_samples} in the checkpoint, {n} now")
        # nonlinear_update without previous samples of the same count runs (and is recorded) as nonlinear_resample
        if mode.value != r.sample_mode and not (mode is SampleMode.NONLINEAR_UPDATE
                                                and r.sample_mode == SampleMode.NONLINEAR_RESAMPLE.value):
            out.append(f"sample_mode at iteration {i}: {r.sample_mode!r} in the checkpoint, {mode.value!r} now")
    return out if len(out) <= 6 else out[:6] + [f"... and {len(out) - 6} more iteration setting(s)"]


def _refusal(directory: str) -> str:
    try:
        what = f"of iteration {ckpt.read_index(directory)['nit']}"
    except ckpt.CheckpointError:
        what = "with an unreadable index"
    return (f"checkpoint_dir {directory!r} already holds a checkpoint {what}, and resume=False (the default) "
            f"starts a new run that would replace it. Pass resume=True to continue it, overwrite=True to discard "
            f"it and start afresh, or use another checkpoint_dir.")


