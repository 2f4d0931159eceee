"""The MGVI / geoVI engine: :class:`OptimizeVI` compiles the steps (:mod:`.steps`) and iterates them."""

from __future__ import annotations

import contextlib
import inspect
import logging
import time
import warnings
from collections.abc import Callable

import jax
import jax.numpy as jnp
import numpy as np
from jax import tree_util as jtu

from ..exceptions import ConvergenceWarning
from ..host_memory import keep_host_memory_low, release_host_memory
from ..minimizers.cg import CGConfig
from ..minimizers.minimizer import Minimizer
from ..minimizers.newton_cg import NewtonCGConfig
from ..parallel.grid import slab_values, unsplit
from ..parallel.memory import check_memory
from ..parallel.mesh import check_devices
from ..parallel.reproducible import (
    check_compiler_options,
    engine_compiler_options,
    reproducible_jit,
)
from ..parallel.strategy import Placed, Strategy, get_strategy, place
from . import checkpoint as ckpt
from . import steps
from .diagnostics import IterationReport, reduced_chi2
from .errors import (
    check_kl_result,
    check_sampling_finite,
)
from .field_split import padded_latent, split_latent, unpadded_latent
from .likelihood import Likelihood
from .masks import parse_selection
from .modes import SampleMode, SamplePlan, SampleSource, plan_samples
from .precompile import Precompiler
from .progress import Progress, check_progress, open_display
from .reporting import format_report, sample_status, unconverged_message
from .row_locality import check_row_local
from .samples import Samples, interleave_pairs
from .settings import (
    DEFAULT_KL_MINIMIZATION,
    DEFAULT_LINEAR_SAMPLING,
    DEFAULT_NONLINEAR_UPDATE,
    IterationSettings,
    check_run_arguments,
    raw_key,
    settings_at,
)
from .state import OptimizeVIState, check_nit

__all__ = ["OptimizeVI"]

logger = logging.getLogger("shardvi")


def _no_samples(p):
    """Empty residual leaf ``(0, *p.shape)`` (from NumPy: no compilation)."""
    return jnp.asarray(np.zeros((0,) + tuple(p.shape), p.dtype))


def _key_count(samples: Samples) -> int:
    """The number of sample keys (pairs) ``samples`` carry (0 for none, e.g. before the first iteration)."""
    return samples.keys.shape[0] if samples.keys is not None and len(samples) > 0 else 0


def check_arity(fn, n_args: int, argname: str, form: str) -> None:
    """``TypeError`` naming ``argname`` unless ``fn`` is callable with ``n_args`` positional arguments.

    ``form`` is the expected call as the message shows it (``"callback(samples, state)"``). A callable
    whose signature cannot be inspected (some builtins and C functions) passes unchecked.
    """
    if not callable(fn):
        raise TypeError(f"{argname} must be callable as {form}, got {type(fn).__name__}")
    try:
        signature = inspect.signature(fn)
    except (TypeError, ValueError):
        return
    try:
        signature.bind(*range(n_args))
    except TypeError as err:
        raise TypeError(
            f"{argname} must be callable as {form}, but its signature {signature} does not accept "
            f"{n_args} positional arguments: {err}"
        ) from None


def _check_samples_arg(samples, argname: str = "samples") -> None:
    """``TypeError`` unless ``samples`` is a :class:`Samples` (a plain position is named as such)."""
    if not isinstance(samples, Samples):
        raise TypeError(
            f"{argname} must be a shardvi.Samples, got {type(samples).__name__}; to start from a position, "
            f"pass Samples(position, residuals) with residuals of leading axis 0 (no samples yet), or call "
            f"optimize_kl(likelihood, position, ...)"
        )


def _check_state(state: OptimizeVIState) -> OptimizeVIState:
    """``state`` checked (an :class:`OptimizeVIState` with ``nit >= 0`` and a valid key), its key raw."""
    if not isinstance(state, OptimizeVIState):
        raise TypeError(f"state must be an OptimizeVIState (from init_state), got {type(state).__name__}")
    check_nit(state.nit, "state.nit")
    return state._replace(key=raw_key(state.key, "state.key"))  # a typed key is unwrapped, a bad one named


def _platform(strategy) -> str:
    """The platform a strategy computes on: its devices' (default: JAX's default backend)."""
    devices = getattr(strategy, "devices", None)
    return devices[0].platform if devices else jax.default_backend()


class _Handover:
    """Samples handed over by a caller that keeps no reference to them (``run`` to each iteration,
    :func:`optimize_kl` to ``run``, e.g. those of a checkpoint it resumes): the receiver takes them out,
    so they are freed once the next iteration's samples replace them."""

    __slots__ = ("samples",)

    def __init__(self, samples: Samples):
        self.samples = samples

    def take(self) -> Samples:
        samples, self.samples = self.samples, None
        assert samples is not None, "handed over twice"
        return samples


class _WithLikelihood:
    """A compiled engine step whose first argument, the likelihood, is bound (and placed once).

    Calls and ``lower`` take the remaining arguments, so ``step.lower(...).compile()`` inspects
    exactly the program that runs, with the likelihood's arrays as its inputs.
    """

    def __init__(self, step, likelihood):
        self.step, self.likelihood = step, likelihood

    def __call__(self, *args, **kwargs):
        return self.step(self.likelihood, *args, **kwargs)

    def lower(self, *args, **kwargs):
        return self.step.lower(self.likelihood, *args, **kwargs)


class OptimizeVI:
    """MGVI / geoVI optimizer with cached compiled steps.

    Build once, then call :meth:`init_state` and :meth:`update` (one global
    iteration) or :meth:`run`. All compiled functions are created here and
    cached by JAX per input shape and (frozen, hashable) config, so iterations
    with the same sample count, mode class and configs never recompile.

    Parameters are those of :func:`optimize_kl` without position/key/checkpointing.
    """

    def __init__(
        self,
        likelihood: Likelihood,
        n_total_iterations: int,
        *,
        n_samples: int | Callable[[int], int],
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
        compiler_options=None,
        progress: bool | str | Progress | None = "auto",
        precompile: bool = True,
        trim_host_memory: bool = False,
        memory_limit: int | None = None,
        check_field_split: bool = True,
    ):
        check_run_arguments(
            likelihood,
            n_total_iterations,
            n_samples=n_samples,
            sample_mode=sample_mode,
            mirror_samples=mirror_samples,
            linear_sampling=linear_sampling,
            nonlinear_update=nonlinear_update,
            kl_minimization=kl_minimization,
        )
        self.likelihood = likelihood
        self.n_total_iterations = int(n_total_iterations)
        self.n_samples = n_samples
        self.sample_mode = sample_mode
        self.mirror_samples = mirror_samples
        self.linear_sampling = linear_sampling
        self.nonlinear_update = nonlinear_update
        self.kl_minimization = kl_minimization
        domain = likelihood.domain
        self._sample_mask = jtu.tree_map(lambda b: not b, parse_selection(point_estimates, domain, "point_estimates"))
        self._opt_mask = jtu.tree_map(lambda b: not b, parse_selection(constants, domain, "constants"))
        devices = check_devices(devices, "devices")  # a generator is read once, here
        schedule = tuple(self._evaluate_settings(nit) for nit in range(self.n_total_iterations))
        n_max = max((st[1] for st in schedule), default=0)
        self.sample_strategy = get_strategy(sample_map, "sample_map", devices)
        self.kl_strategy = get_strategy(kl_map, "kl_map", devices)
        # each distinct strategy once (the samples must fit, the model's rows are checked, per strategy)
        self._strategies = [self.sample_strategy] + (
            [] if self.kl_strategy == self.sample_strategy else [self.kl_strategy]
        )
        for strat in self._strategies:  # the samples must fit before any work
            check_memory(
                likelihood, n_max, strat, mirror_samples=mirror_samples, memory_limit=memory_limit, what="optimize_kl"
            )
        self.compiler_options = check_compiler_options(compiler_options, "compiler_options")
        self.progress = check_progress(progress, "progress")
        if not isinstance(precompile, bool):
            raise TypeError(f"precompile must be a bool, got {type(precompile).__name__}")
        if not isinstance(trim_host_memory, bool):
            raise TypeError(f"trim_host_memory must be a bool, got {type(trim_host_memory).__name__}")
        self.trim_host_memory = trim_host_memory
        if not isinstance(check_field_split, bool):
            raise TypeError(f"check_field_split must be a bool, got {type(check_field_split).__name__}")
        self._row_check_pending = check_field_split  # the model's row locality, checked before the first iteration
        # steps of coming iterations, compiled in a background thread; not with several processes, whose
        # programs and transfers must come in the same order in every process
        self._ahead = Precompiler(precompile and jax.process_count() == 1)
        self._planned = set()  # iterations whose steps were submitted to it
        self._display = None  # the open progress display (inside run / update)
        self._in_run = False  # inside run (compiling ahead plans the remaining iterations)
        self._seen_steps = set()  # (step, config, sample count) already run: compiled
        self._called_steps = set()  # those whose first call has returned (dispatched)
        self._warned = set()  # stages whose unconverged solves were warned about (once per stage)
        # every setting given as a callable: called once per iteration, here, and checked before any work
        self._schedule: tuple[IterationSettings, ...] = schedule
        if trim_host_memory:
            keep_host_memory_low()  # opt-in: freed buffers back to the system (see shardvi.host_memory)
        self._build()

    # -- compiled pieces -----------------------------------------------------------------------
    def _build(self):
        smask, omask = self._sample_mask, self._opt_mask
        sstrat, kstrat = self.sample_strategy, self.kl_strategy

        # the likelihood (data, noise, model arrays) is an argument of every step, never a constant; the steps are
        # the pure functions of .steps with the strategies and masks bound
        def draw_linear(lh, pos, keys, config):
            r, info = steps.draw_samples(lh, pos, keys, config, sstrat, smask)
            return r, info.nit, info.status, info.finite

        def curve(lh, pos, residuals, keys, signs, config):
            r, info = steps.update_samples(lh, pos, residuals, keys, signs, config, sstrat, smask)
            return r, info.nit, info.status, info.finite

        def minimize(lh, pos, residuals, config):
            return steps.minimize_kl(lh, pos, residuals, config, kstrat, omask)

        def diagnostics(lh, pos, residuals):
            return steps.sample_diagnostics(lh, pos, residuals, kstrat)

        # reproducible_jit: the same arithmetic, bitwise, on any device count and for every strategy;
        # Placed: inputs placed by the strategy that computes on them (same sharding every call: no recompiles)
        # (with the XLA options for the platform each strategy computes on)
        def rjit(fn, strategy):
            return reproducible_jit(
                fn, static_argnames="config", compiler_options=self.compiler_options, platform=_platform(strategy)
            )

        def ejit(fn, strategy):  # the small helpers with the same XLA options (one pipeline for all programs)
            return jax.jit(fn, compiler_options=engine_compiler_options(self.compiler_options, _platform(strategy)))

        # transferred once (and once only where both strategies place alike: no second copy of its host arrays)
        lh_s = place(sstrat, self.likelihood)
        lh_k = lh_s if kstrat == sstrat else place(kstrat, self.likelihood)
        self._draw_linear = _WithLikelihood(Placed(sstrat, rjit(draw_linear, sstrat)), lh_s)
        self._curve = _WithLikelihood(Placed(sstrat, rjit(curve, sstrat)), lh_s)
        self._minimize = _WithLikelihood(Placed(kstrat, rjit(minimize, kstrat)), lh_k)
        self._interleave = Placed(sstrat, ejit(lambda r: unsplit(interleave_pairs(r)), sstrat))
        self._diagnostics = _WithLikelihood(Placed(kstrat, ejit(diagnostics, kstrat)), lh_k)
        self._repeat_keys = Placed(sstrat, ejit(lambda keys: jnp.repeat(keys, 2, axis=0), sstrat))

    # -- progress ----------------------------------------------------------------------------
    @contextlib.contextmanager
    def _session(self, *, leave: bool):
        """The scope of a :meth:`run` or of an :meth:`update` called alone (nothing when inside ``run``).

        A progress display (a single update's bar is erased when it closes: ``leave=False``), and the
        compile thread: at exit, also on an error, the steps compiled ahead that wait are dropped and
        the thread has ended, so nothing the engine started outlives the call.
        """
        if self._display is not None:
            yield
            return
        self._display = open_display(self.progress, leave=leave)
        try:
            yield
        finally:
            display, self._display = self._display, None
            self._ahead.close()
            self._planned.clear()
            display.close()

    def _stage(self, name: str, step=None):
        """Report that stage ``name`` starts; ``step`` (a hashable key) is compiled on its first run.

        A step compiled ahead in the background is waited for here (shown as compiling while it is not ready).
        """
        if self.trim_host_memory:  # the last step's freed buffers and compile work, before this one allocates
            release_host_memory()
        compiling = step is not None and step not in self._seen_steps and not self._ahead.ready(step)
        if step is not None:
            self._seen_steps.add(step)
        if self._display is not None:
            self._display.stage(name, compiling)
        if step is not None:
            self._ahead.claim(step)

    def _called(self, step) -> None:
        """After the first call of ``step`` returned (its program may still run), with ``trim_host_memory``:
        return the heaps' free pages, among them the compiler's work memory when the call compiled the step.

        XLA:CPU dispatches a program asynchronously: the return comes while the program starts, before
        its buffers have grown, so the compiler's freed pages are gone before the step's peak instead of
        adding to it.
        """
        if step in self._called_steps:
            return
        self._called_steps.add(step)
        if self.trim_host_memory:
            release_host_memory()

    # -- compiling ahead -----------------------------------------------------------------------
    def _precompile_ahead(self, samples: Samples, state: OptimizeVIState) -> None:
        """Submit the steps of this iteration and, inside :meth:`run`, of the later ones.

        Once per run (the iterations from ``state.nit`` on, in the order they call their
        steps; a step already submitted is not submitted again). Each is lowered here, in
        the calling thread, and compiled in the background while the earlier steps run. Stand-in arguments with the
        shapes, dtypes and placements of the real calls: the background compilations fill
        the steps' own JAX caches (see :mod:`.precompile`).
        """
        if not self._ahead.enabled or state.nit in self._planned:
            return
        n_prev = _key_count(samples)
        # a run plans its remaining iterations; an update called alone only its own (the compile thread ends
        # with it)
        last = max(self.n_total_iterations, state.nit + 1) if self._in_run else state.nit + 1
        for nit in range(state.nit, last):
            self._planned.add(nit)
            mode, n, lin, nonlin, klc = self._settings(nit)
            plan = plan_samples(mode, n, n_prev)
            for step, thunk in self._steps_of(plan, samples.pos, state.key, n, lin, nonlin, klc):
                self._ahead.submit(step, thunk)
            n_prev = 0 if plan.source is SampleSource.NONE else n

    def _steps_of(self, plan: SamplePlan, pos, key, n, lin, nonlin, klc) -> list:
        """``[(step key, lowering thunk)]`` of one iteration, in the order it calls them (but see below).

        The stand-ins are made inside the thunks (in the background, and only for steps submitted).
        """
        per_key = 2 if self.mirror_samples else 1
        m = 0 if plan.source is SampleSource.NONE else per_key * n

        def residuals():
            return jtu.tree_map(lambda p: np.zeros((m, *np.shape(p)), jnp.result_type(p)), pos)

        def keys(count):  # values do not matter: zeros of the raw keys' shape and dtype
            return np.zeros((count, *np.shape(key)), jnp.result_type(key))

        def curve():
            return self._curve.lower(
                self._split(pos), self._split(residuals()), keys(per_key * n), self._signs(n), config=nonlin
            )

        steps = []
        if plan.source is SampleSource.UPDATE:
            steps.append((("curve", nonlin, n), curve))
        elif plan.source is not SampleSource.NONE:
            steps.append((("draw", lin, n), lambda: self._draw_linear.lower(self._split(pos), keys(n), config=lin)))
            if plan.mode.nonlinear:
                steps.append((("curve", nonlin, n), curve))
        # the small diagnostics step before the KL step, which it follows in the call order: it then compiles
        # while the KL step is still being lowered instead of delaying the compilations after that
        kpos = self._split(pos, True)
        steps.append((("diagnostics", n), lambda: self._diagnostics.lower(kpos, self._split(residuals(), True))))
        steps.append((("kl", klc, n), lambda: self._minimize.lower(kpos, self._split(residuals(), True), config=klc)))
        return steps

    # -- state -------------------------------------------------------------------------------
    def init_state(self, key, nit: int = 0) -> OptimizeVIState:
        """Fresh state holding the RNG ``key``.

        Parameters
        ----------
        key : jax key
            One threefry2x32 key (``jax.random.PRNGKey(seed)`` or ``jax.random.key(seed)``).
        nit : int
            Completed global iterations (>= 0): the iteration the next :meth:`update` runs.

        Raises
        ------
        TypeError
            ``key`` is not one threefry key; ``nit`` is not an int.
        ValueError
            ``nit`` is negative.
        """
        check_nit(nit, "nit")
        return OptimizeVIState(nit=int(nit), key=raw_key(key), history=())

    def _settings(self, nit) -> IterationSettings:
        """The settings of iteration ``nit`` (``(mode, n, linear, nonlinear, kl)``), evaluated and checked.

        Those of the run's iterations were evaluated once, when the optimizer was built.
        """
        if nit < len(self._schedule):
            return self._schedule[nit]
        return self._evaluate_settings(nit)

    def _evaluate_settings(self, nit) -> IterationSettings:
        return settings_at(
            nit,
            sample_mode=self.sample_mode,
            n_samples=self.n_samples,
            linear_sampling=self.linear_sampling,
            nonlinear_update=self.nonlinear_update,
            kl_minimization=self.kl_minimization,
        )

    def draw_samples(
        self, samples: Samples, key, mode: SampleMode, n: int, lin: CGConfig, nonlin: NewtonCGConfig, iteration: int = 0
    ):
        """Residuals around ``samples.pos`` for one iteration.

        Returns ``(Samples, cg_nit, newton_nit, mode, cg_status, newton_status)``
        where ``mode`` is the mode actually used (``nonlinear_update`` without
        previous samples of the same count draws fresh ones:
        ``nonlinear_resample``) and the statuses are per-sample
        :class:`~shardvi.minimizers.Status` codes (lists of int). Raises
        :class:`NonPositiveCurvatureError` where the sampling metric is not
        positive definite; logs a warning for unconverged sample solves.
        """
        drawn, *info = self._draw_samples(samples, key, mode, n, lin, nonlin, iteration)
        return (self._unpadded(drawn), *info)

    def _draw_samples(self, samples, key, mode, n, lin, nonlin, iteration):
        """:meth:`draw_samples`, the residuals as the engine's programs return them (a field split's grid leaves
        with their blocks' padding rows, if any: kept split over the model axis between the steps)."""
        pos = padded_latent(self.likelihood, samples.pos)
        n_prev = _key_count(samples)
        plan = plan_samples(mode, n, n_prev)
        if plan.source is SampleSource.NONE:
            empty = jtu.tree_map(_no_samples, pos)
            return Samples(pos, empty, None), [], [], plan.mode, [], []
        if plan.source is SampleSource.UPDATE:
            keys = samples.keys
            r, nl_nit, nl_st = self._geovi_update(pos, samples.residuals, keys, n, nonlin, iteration)
            return Samples(pos, r, keys), [], nl_nit, plan.mode, [], nl_st
        if plan.fallback:
            logger.info("nonlinear_update without previous samples of the same count: drawing fresh ones")
        mode = plan.mode
        keys = samples.keys if plan.source is SampleSource.REUSE else jax.random.split(key, n)
        self._stage("MGVI sampling", ("draw", lin, n))
        r, cg_nit, st, ok = self._draw_linear(self._split(pos), keys, config=lin)
        self._called(("draw", lin, n))
        check_sampling_finite(ok, st, iteration, "sampling (MGVI linear CG)")
        cg_st = sample_status(st, iteration, "sampling (MGVI linear CG)", metric_must_be_pd=True)
        self._warn_unconverged(cg_st, iteration, "sampling (MGVI linear CG)", "linear_sampling", lin)
        if self.mirror_samples:
            r = self._interleave(self._split(r))
        nl_nit, nl_st = [], []
        if mode.nonlinear:
            r, nl_nit, nl_st = self._geovi_update(pos, r, keys, n, nonlin, iteration)
        return Samples(pos, r, keys), np.asarray(cg_nit).tolist(), nl_nit, mode, cg_st, nl_st

    def _geovi_update(self, pos, residuals, keys, n, nonlin, iteration):
        """The geoVI step on ``residuals`` (``n`` keys, mirrored as drawn): ``(residuals, nit, statuses)``."""
        self._stage("geoVI update", ("curve", nonlin, n))
        r, nit, st, ok = self._curve(
            self._split(pos), self._split(residuals), self._expand(keys), self._signs(n), config=nonlin
        )
        self._called(("curve", nonlin, n))
        check_sampling_finite(ok, st, iteration, "sampling (geoVI update)")
        status = sample_status(st, iteration, "sampling (geoVI update)", metric_must_be_pd=False)
        self._warn_unconverged(status, iteration, "sampling (geoVI update)", "nonlinear_update", nonlin)
        return r, np.asarray(nit).tolist(), status

    def _check_continued(self, samples: Samples, mode: SampleMode, n: int, iteration: int) -> None:
        """``ValueError`` where iteration ``iteration`` curves ``samples``' residuals again (``nonlinear_update``)
        but they are mirrored otherwise than this run's ``mirror_samples`` (before any work)."""
        keys = _key_count(samples)
        if plan_samples(mode, n, keys).source is not SampleSource.UPDATE:
            return
        n_res, per_key = len(samples), 2 if self.mirror_samples else 1
        if n_res == per_key * keys:
            return
        held = f"the samples given hold {n_res} residuals for {keys} keys"
        if n_res not in (keys, 2 * keys):
            raise ValueError(f"{held}: expected {per_key * keys} with mirror_samples={self.mirror_samples}")
        mirrored = n_res == 2 * keys
        raise ValueError(
            f"{held}: they come from a run with mirror_samples={mirrored}, and sample_mode 'nonlinear_update' "
            f"(iteration {iteration}) would continue them with mirror_samples={self.mirror_samples}; pass "
            f"mirror_samples={mirrored} or start from a position (samples.pos) to draw fresh samples"
        )

    def _warn_unconverged(self, codes, iteration, stage, field, config):
        """One :class:`~shardvi.ConvergenceWarning` per stage and run, at its first unconverged solve."""
        if stage in self._warned:
            return
        msg = unconverged_message(codes, iteration, self.n_total_iterations, stage, field, config)
        if msg is not None:
            self._warned.add(stage)
            warnings.warn(msg, ConvergenceWarning, stacklevel=2)

    def _split(self, tree, kl: bool = False):
        """Latents for a step of the sampling (``kl=False``) or KL strategy: a field-split likelihood's grid
        leaves marked, to be placed with their rows split (:func:`~shardvi.vi.field_split.split_latent`)."""
        return split_latent(self.likelihood, self.kl_strategy if kl else self.sample_strategy, tree)

    def _unpadded(self, samples: Samples) -> Samples:
        """``samples`` from the engine's programs without the padding rows of field blocks that do not divide
        the grid's rows (:func:`~shardvi.vi.field_split.unpadded_latent`): what leaves the engine (between its
        steps it keeps them, and with them the grid rows split over the model axis). Without padding: the same
        arrays."""
        lh = self.likelihood
        return Samples(unpadded_latent(lh, samples.pos), unpadded_latent(lh, samples.residuals), samples.keys)

    def _place_samples(self, samples: Samples) -> Samples:
        """``samples`` placed for the KL strategy (a field split's grid rows kept split over its model axis)."""
        if not self.likelihood.layout.splits_latent:
            return place(self.kl_strategy, samples)
        kstrat = self.kl_strategy
        pos, res = (slab_values(place(kstrat, self._split(t, True))) for t in (samples.pos, samples.residuals))
        return Samples(pos, res, None if samples.keys is None else place(kstrat, samples.keys))

    def _expand(self, keys):
        # fresh or reused keys: one placement, one compiled repeat
        return self._repeat_keys(keys) if self.mirror_samples else place(self.sample_strategy, keys)

    def _signs(self, n):  # a NumPy array (placed by the step): no eager XLA program to compile
        signs = np.tile([1.0, -1.0], n) if self.mirror_samples else np.ones((n,))
        return signs.astype(jax.dtypes.canonicalize_dtype(np.float64))

    def update(self, samples: Samples, state: OptimizeVIState) -> tuple[Samples, OptimizeVIState]:
        """One global iteration: draw/update samples, then minimize the KL.

        Raises
        ------
        TypeError
            ``samples`` is not a :class:`Samples`; ``state`` is not an :class:`OptimizeVIState`.
        ValueError
            ``state.nit`` is negative; the iteration continues ``samples`` (``nonlinear_update``) whose
            residuals are mirrored otherwise than ``mirror_samples`` says.
        """
        _check_samples_arg(samples)
        with self._session(leave=False):
            samples, state, line = self._iterate(_Handover(samples), state)
            self._end_iteration(state, line)
            return self._unpadded(samples), state

    def _end_iteration(self, state: OptimizeVIState, line: str) -> None:
        """The display's end of iteration ``state.nit - 1``: after its checkpoint, so a display that raises
        loses nothing."""
        display = self._display
        assert display is not None  # opened by _session
        display.end_iteration(state.nit - 1, self.n_total_iterations, line)

    def _iterate(self, handover: _Handover, state: OptimizeVIState) -> tuple[Samples, OptimizeVIState, str]:
        """:meth:`update` inside an open progress display, taking the samples out of ``handover``.

        Once the new samples are drawn the old ones have no reference left here: a caller that
        kept none (:meth:`run`) frees their residuals before the KL step allocates. Returns the
        iteration's log line too (the caller ends the display's iteration with it).
        """
        state = _check_state(state)
        samples = handover.take()
        t0 = time.perf_counter()
        nit = state.nit
        mode, n, lin, nonlin, klc = self._settings(nit)
        self._check_continued(samples, mode, n, nit)
        display = self._display
        assert display is not None  # opened by _session
        display.start_iteration(nit, self.n_total_iterations)
        if self._row_check_pending:  # a field split over a model axis: before any sampling
            self._row_check_pending = False
            for strat in self._strategies:
                if self.likelihood.layout.needs_row_check(getattr(strat, "model_shards", 1)):
                    self._stage("checking the model's rows")
                    check_row_local(self.likelihood, strat, samples.pos)
        self._precompile_ahead(samples, state)
        key, k_samples = jax.random.split(state.key)
        samples, cg_nit, nl_nit, mode, cg_st, nl_st = self._draw_samples(samples, k_samples, mode, n, lin, nonlin, nit)
        samples = self._place_samples(samples)  # pos, residuals and keys on the same devices
        self._stage("KL minimization", ("kl", klc, n))
        res, ok = self._minimize(self._split(samples.pos, True), self._split(samples.residuals, True), config=klc)
        self._called(("kl", klc, n))
        check_kl_result(res.status, ok, nit)
        samples = samples.at(res.x)
        self._ahead.claim(("diagnostics", n))
        stats = self._diagnostics(self._split(samples.pos, True), self._split(samples.residuals, True))
        self._called(("diagnostics", n))
        chi2_lh = reduced_chi2(stats[0]) if stats[0] is not None else None
        report = IterationReport(
            iteration=nit + 1,
            sample_mode=mode.value,
            n_samples=n,
            kl_energy=float(res.fun),
            sampling_nit=cg_nit,
            nonlinear_nit=nl_nit,
            kl_nit=int(res.nit),
            kl_cg_nit=int(res.ncg),
            kl_status=int(res.status),
            chi2_likelihood=chi2_lh,
            chi2_prior=reduced_chi2(stats[1]),
            wall_time=time.perf_counter() - t0,
            sampling_status=cg_st,
            nonlinear_status=nl_st,
        )
        line = format_report(report, self.n_total_iterations)
        logger.info(line)
        return samples, OptimizeVIState(nit=nit + 1, key=key, history=state.history + (report,)), line

    def run(
        self,
        samples: Samples,
        state: OptimizeVIState,
        *,
        checkpoint_dir=None,
        callback=None,
        fingerprint: dict | None = None,
    ):
        """Iterate :meth:`update` until ``n_total_iterations``, checkpointing after each.

        With ``checkpoint_dir``, the directory's lock is held for the whole
        run and every checkpoint carries ``fingerprint`` (default: that of
        this optimizer and ``samples.pos``). Unlike :func:`optimize_kl`, this
        does not refuse a directory that holds another run's checkpoint.

        Raises
        ------
        TypeError
            ``samples``, ``state`` or ``callback`` (``callback(samples, state)``,
            called after every iteration) is of the wrong kind; checked
            before the first iteration.
        ValueError
            ``state.nit`` is above ``n_total_iterations`` (a state of exactly
            ``n_total_iterations`` returns ``samples`` and ``state``).
        """
        if not isinstance(samples, _Handover):
            _check_samples_arg(samples)
        state = _check_state(state)
        if state.nit > self.n_total_iterations:
            raise ValueError(
                f"state.nit={state.nit} completed iterations is above n_total_iterations={self.n_total_iterations}"
            )
        if callback is not None:
            check_arity(callback, 2, "callback", "callback(samples, state)")
        with self._session(leave=True):
            self._in_run = True
            try:
                return self._run(samples, state, checkpoint_dir, callback, fingerprint)
            finally:
                self._in_run = False

    def _run(self, samples, state, checkpoint_dir, callback, fingerprint):
        if isinstance(samples, _Handover):
            samples = samples.take()
        lock = contextlib.nullcontext()
        if checkpoint_dir is not None:
            checkpoint_dir = ckpt.prepare_checkpoint_dir(checkpoint_dir)  # before iteration 0
            if fingerprint is None:
                fingerprint = run_fingerprint(self, samples.pos)
            lock = ckpt.checkpoint_lock(checkpoint_dir)
        with lock:
            while state.nit < self.n_total_iterations:
                handover = _Handover(samples)  # the last iteration's residuals go once the new ones are drawn
                del samples
                samples, state, line = self._iterate(handover, state)
                if checkpoint_dir is None and callback is None:
                    self._end_iteration(state, line)
                    continue
                given = self._unpadded(samples)  # without padding rows (with them: a copy, made only here)
                if checkpoint_dir is not None:
                    self._stage("writing checkpoint")
                    ckpt.save_checkpoint(checkpoint_dir, given, state, fingerprint=fingerprint)
                self._end_iteration(state, line)
                if callback is not None:
                    callback(given, state)
                del given
        return self._unpadded(samples), state


def run_fingerprint(opt: OptimizeVI, pos) -> dict:
    """What a checkpoint of this run must match on resume (besides the per-iteration sample settings)."""
    return ckpt.fingerprint(
        opt.likelihood,
        pos,
        mirror_samples=opt.mirror_samples,
        point_estimates=jtu.tree_map(lambda b: not b, opt._sample_mask),
        constants=jtu.tree_map(lambda b: not b, opt._opt_mask),
    )
