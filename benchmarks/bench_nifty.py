"""shardvi vs NIFTy.re (``nifty`` 9.x, ``import nifty.re as jft``) on the same geoVI reconstruction.

    python benchmarks/bench_nifty.py [--shape 128,128] [--runs 3] [--json out.json]
    python benchmarks/bench_nifty.py --smoke            # seconds; shardvi only

The problem (``benchmarks/_common.py::Problem``): a 2-D correlated field
(shardvi's ``CorrelatedFieldMaker``, non-parametric spectrum), signal
``exp(field)``, Gaussian noise (std 0.1), data on every pixel. Both engines get
the *same Python callable* as forward model (NIFTy.re through
``jft.Model(call, domain=jft.Vector(domain))``, shardvi through ``sv.Model``)
and the same start position, so only the engines differ. Each run: ``--samples``
antithetic pairs, ``--iterations`` global iterations, the first
``--linear-iterations`` ``linear_resample`` (MGVI), the rest
``nonlinear_resample`` (geoVI); both engines' ``optimize_kl`` with a callback
that blocks on the result and reads the clock.

Matched solver settings (``delta = --delta``, ``n`` = number of latent parameters):

==================  ==============================================  ===============================================
stage               NIFTy.re                                        shardvi
==================  ==============================================  ===============================================
MGVI sampling CG    ``draw_linear_kwargs=dict(cg_kwargs=dict(       ``linear_sampling=CGConfig(tol=None,
                    absdelta=delta*n/10, miniter=6, maxiter=M))``   absdelta=delta*n/10, miniter=6, maxiter=M)``
geoVI Newton-CG     ``nonlinearly_update_kwargs=dict(minimize_      ``nonlinear_update=NewtonCGConfig(xtol=X,
                    kwargs=dict(xtol=X, maxiter=K))``               maxiter=K, energy_reduction_factor=0.1,
                                                                    cg=CGConfig(tol=0.5, miniter=6,
                                                                    maxiter=200))``
KL Newton-CG        ``kl_kwargs=dict(minimize_kwargs=dict(          ``kl_minimization=NewtonCGConfig(xtol=Y,
                    xtol=Y, maxiter=L))``                           maxiter=L, cg=<same inner CG>)``
==================  ==============================================  ===============================================

Semantics (read from nifty 9.2.0 ``conjugate_gradient.py``/``optimize.py`` and
``shardvi/minimizers``): CG ``absdelta`` is in both the largest change of the
CG energy ``x.A.x/2 - b.x`` in one iteration that stops the solve (NIFTy:
``<``, shardvi: ``<=``); NIFTy's CG has ``miniter=6`` by default, so shardvi
gets ``miniter=6`` too. Newton ``xtol``: NIFTy stops when
``|step|_1 <= xtol * n`` (``size(x0)``) for the step it *took* (cut short by
its inner CG's energy rule or by backtracking), shardvi when a bound on the
*full* Newton step, ``(|p|_1 + sqrt(n) |r| / c) / n`` with ``r`` the inner CG
residual and ``c`` the metric's curvature floor, is at most ``xtol``: the
same number does not mean the same thing — at ``xtol = delta`` NIFTy.re
stops after 2–3 KL steps per iteration on the 128² problem, shardvi runs to
``maxiter`` and reaches a lower KL. NIFTy's geoVI update measures the step in
the metric norm (``custom_gradnorm``: ``sqrt(s.s + |R s|^2)``, compared with
``xtol * n``): not comparable either. So by default both engines get
``X = --geovi-xtol = 0`` and ``Y = --kl-xtol = 0`` and do exactly
``K = --geovi-maxiter`` geoVI Newton steps per sample and ``L = --kl-maxiter``
(default 3, about what NIFTy.re's own ``xtol = delta`` does here) KL Newton
steps per iteration: equal work, and the ``KL``/``chi2`` columns show that the
results are equally good. ``--kl-xtol 1e-4 --kl-maxiter 10`` runs each engine
at its own stopping rule instead. Inner CG of a Newton step: NIFTy stops at
an L1 residual below ``min(0.5, sqrt(|g|_1)) |g|_1`` or a CG-energy change
below 0.1x the last Newton energy decrease (its default
``energy_reduction_factor=0.1``; after ``miniter=6``, ``maxiter=200``);
shardvi at an L2 residual below ``min(0.5, sqrt(|g|_2)) |g|_2`` or the same
energy rule (``energy_reduction_factor=0.1``, ``miniter=6``: opt-in in shardvi,
set here to match). Line searches differ (NIFTy: halve until the
energy does not increase; shardvi: Armijo) and the engines draw different random
numbers (both start the sampling CG at the prior part of the metric sample), so
they do not do identical numbers of operator applications: the work columns
report them.

Per run (a fresh subprocess, so compilation and peak memory are per run):
``first`` wall time of iteration 1 (tracing + compilation + run); ``iter``
median wall time of iterations 2..N (iteration 3, the first geoVI one, compiles
the geoVI step in both engines); ``warm`` median of the iterations 2..N that
compiled nothing; ``total`` all iterations; ``compile``/``#comp`` XLA backend
compile seconds and count (``jax.monitoring`` event
``/jax/core/compile/backend_compile_duration``, the listener of
``shardvi.compilation.CompileCounter``, in both engines); ``recomp``
compilations after iteration 1; ``RSS`` peak resident memory
(``getrusage(RUSAGE_SELF).ru_maxrss`` at the end of the child) and ``base``
the resident memory just before ``optimize_kl`` (imports, problem, data);
Stage breakdown (second table): mean wall time per iteration of MGVI
sampling, geoVI updates and KL minimization over the geoVI iterations after
the first (each stage timed by a wrapper that blocks on its result: shardvi's
compiled ``_draw_linear``/``_curve``/``_minimize`` steps, NIFTy.re's
``draw_linear_samples``/``nonlinearly_update_samples``/``kl_minimize``), and
``KL ms/hessp``: KL-minimization time per KL-metric application (per inner-CG
iteration: shardvi ``kl_cg_nit``, NIFTy.re ``nhev``).
``KL`` the final sample-averaged Hamiltonian and ``chi2`` the reduced chi^2
``mean_i |(d - s(xi_i))/sigma|^2 / n_data`` over the final samples, both
computed by the same jitted function for both engines. The table shows medians
over ``--runs`` runs (interleaved engine by engine) and ratios
shardvi / NIFTy.re-fastest (the NIFTy.re configuration with the smallest
median ``iter``).

Engine configurations:

- shardvi ``vmap``: ``sample_map=kl_map=sv.parallel.Vmap()`` (chunk 1, the
  bitwise-reproducible default); ``vmap-all``: ``Vmap(chunk_size=None)`` (all
  samples vectorized at once); ``+plainjit``: the same with the engine steps
  compiled by plain ``jax.jit`` instead of
  ``shardvi.parallel.reproducible.reproducible_jit`` (XLA CSE on, constants
  foldable) — the cost of the reproducibility measures; ``shard_map-2cpu``:
  ``ShardMap`` over 2 forced CPU devices (``jax_num_cpu_devices=2``, one per
  core of the development machine), chunk 1 — bitwise the same results as
  ``vmap``; ``jit-2cpu``: ``JitSharding`` on the same 2 devices (GSPMD);
  ``+fusion``: the engine steps compiled with XLA:CPU's default
  MLIR fusion emitters (``compiler_options={"xla_cpu_use_fusion_emitters":
  True}``) instead of shardvi's default, the classic loop emitters;
  ``+serial``: ``precompile=False`` (every step compiles at its first call,
  none ahead in a background thread); ``+cache``: with a warm persistent compilation cache
  (``optimize_kl(..., compilation_cache_dir=...)``; the script runs the
  configuration once, unrecorded, to fill a fresh cache directory first);
  ``auto``: ``sample_map=kl_map="auto"``, the planner's choice (on a GPU
  after compiling the candidates' steps, time that counts in ``first``); the
  record's ``device_map`` holds the choice as logged.
- NIFTy.re ``default``: ``optimize_kl`` defaults (``residual_map="lmap"``:
  Python loop over samples; Python-loop CG and Newton-CG driving jitted
  operator applications; the KL metric/gradient jitted with ``kl_map=vmap``);
  ``jit-lmap``/``jit-vmap``/``jit-smap``: ``linear_minimizer_jit=True`` with
  ``cg=static_cg``, ``nonlinear_minimizer_jit=True`` with
  ``minimize=_static_newton_cg`` (jitted sampling solvers) and
  ``residual_map`` = ``lmap`` (Python loop), ``vmap`` (vectorized) or ``smap``
  (``lax.scan``); the KL minimization stays NIFTy's Python-loop Newton-CG.
  ``jit-pmap-2cpu``: ``residual_map="pmap"`` on 2 forced CPU devices (with
  nifty 9.2.0 and jax 0.10.2 it fails in its first sampling step, also with
  2 pairs on 2 devices).
  ``<config>+classic``: the same with ``XLA_FLAGS=--xla_cpu_use_fusion_emitters=false``
  in the child's environment, i.e. the XLA:CPU emitters shardvi uses for its
  engine steps applied to every NIFTy.re program (not a NIFTy.re setting: it
  shows how much of the memory difference is the compiler choice).

The NIFTy.re side runs in its own venv (``benchmarks/.venv-nifty``, made by
``benchmarks/setup_nifty_venv.sh``: nifty 9.x from PyPI, this project
editable, jax pinned to the project venv's version). If it cannot be
installed the script prints ``skipped: ...`` and measures shardvi only.
"""

from __future__ import annotations

import argparse
import importlib
import json
import logging
import os
import shutil
import subprocess
import sys
import tempfile
import time

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import _common as C

SHARDVI_CONFIGS = (
    "vmap",
    "vmap-all",
    "vmap+plainjit",
    "vmap-all+plainjit",
    "shard_map-2cpu",
    "vmap+fusion",
    "shard_map-2cpu+fusion",
    "vmap+cache",
    "shard_map-2cpu+cache",
    "vmap+serial",
    "shard_map-2cpu+serial",
    "jit-2cpu",
    "auto",
)
NIFTY_BASE_CONFIGS = ("default", "jit-lmap", "jit-vmap", "jit-smap", "jit-pmap-2cpu")
#: every NIFTy.re configuration also as ``<config>+classic``: XLA:CPU's classic emitters for all its programs
NIFTY_CONFIGS = NIFTY_BASE_CONFIGS + tuple(c + "+classic" for c in NIFTY_BASE_CONFIGS)
DEFAULT_NIFTY = ("default", "jit-lmap", "jit-vmap")
#: the XLA flag behind ``+classic`` (shardvi sets it per engine step, ``REPRODUCIBLE_COMPILER_OPTIONS``)
CLASSIC_EMITTERS_FLAG = "--xla_cpu_use_fusion_emitters=false"
#: NIFTy.re's default inner-CG energy rule of its Newton-CG (``energy_reduction_factor``), given to shardvi too
NIFTY_ENERGY_RULE = 0.1


# ================================================================================================ child
def _solver_settings(args, n):
    return dict(
        delta=args.delta,
        geovi_xtol=args.geovi_xtol,
        kl_xtol=args.kl_xtol,
        absdelta=args.delta * n / 10.0,
        cg_maxiter=args.cg_maxiter,
        geovi_maxiter=args.geovi_maxiter,
        kl_maxiter=args.kl_maxiter,
        miniter=6,
        inner_maxiter=200,
    )


def _sample_mode(n_linear):
    return lambda i: "linear_resample" if i < n_linear else "nonlinear_resample"


def child_shardvi(args, problem, clock):
    import jax

    sv = C.import_shardvi()
    if args.config.endswith("+plainjit"):
        # the module whose OptimizeVI compiles the engine steps (by its global ``reproducible_jit``)
        okl = importlib.import_module("shardvi.vi.engine")
        assert okl.reproducible_jit is not None and hasattr(okl, "OptimizeVI")
        okl.reproducible_jit = lambda fn, platform=None, **kw: jax.jit(fn, **kw)
    # "+fusion": XLA:CPU's default (MLIR fusion) emitters for the engine steps
    options = {"xla_cpu_use_fusion_emitters": True} if args.config.endswith("+fusion") else None
    base = args.config.split("+")[0]
    if base == "shard_map-2cpu":  # samples spread over 2 forced CPU devices (one per core), chunk 1
        strategy = sv.parallel.ShardMap(devices=jax.devices()[:2])
    elif base == "jit-2cpu":  # the same with GSPMD (jax.jit in/out shardings)
        strategy = sv.parallel.JitSharding(devices=jax.devices()[:2])
    elif base == "auto":  # the planner's choice (on a GPU it compiles the candidates' steps first)
        strategy = "auto"
    else:
        strategy = sv.parallel.Vmap() if base == "vmap" else sv.parallel.Vmap(chunk_size=None)
    chosen = _AutoChoice() if base == "auto" else None
    s = _solver_settings(args, problem.n_latent)
    inner = sv.CGConfig(tol=0.5, miniter=s["miniter"], maxiter=s["inner_maxiter"])
    lh = problem.shardvi_likelihood()
    work = []
    build = sv.OptimizeVI._build

    def timed_build(self):  # time the compiled engine steps (each blocks on its result)
        build(self)
        for attr, stage in (("_draw_linear", "sampling"), ("_curve", "geovi"), ("_minimize", "kl")):
            setattr(self, attr, clock.timed(getattr(self, attr), stage))

    sv.OptimizeVI._build = timed_build

    def callback(samples, state):
        clock.tick(samples.pos)
        r = state.history[-1]
        work.append(
            dict(
                kl_nit=r.kl_nit,
                kl_hessp=r.kl_cg_nit,
                sampling_cg=int(sum(r.sampling_nit)),
                geovi_nit=int(sum(r.nonlinear_nit)),
                engine_kl=r.kl_energy,
                kl_status=sv.minimizers.status_message(r.kl_status),
                stages=clock.take_stages(),
            )
        )

    clock.start()
    samples, state = sv.optimize_kl(
        lh,
        problem.position,
        key=jax.random.PRNGKey(args.seed),
        n_total_iterations=args.iterations,
        n_samples=args.samples,
        sample_mode=_sample_mode(args.linear_iterations),
        linear_sampling=sv.CGConfig(tol=None, absdelta=s["absdelta"], miniter=s["miniter"], maxiter=s["cg_maxiter"]),
        nonlinear_update=sv.NewtonCGConfig(
            xtol=s["geovi_xtol"], maxiter=s["geovi_maxiter"], cg=inner, energy_reduction_factor=NIFTY_ENERGY_RULE
        ),
        kl_minimization=sv.NewtonCGConfig(
            xtol=s["kl_xtol"], maxiter=s["kl_maxiter"], cg=inner, energy_reduction_factor=NIFTY_ENERGY_RULE
        ),
        sample_map=strategy,
        kl_map=strategy,
        callback=callback,
        compiler_options=options,
        compilation_cache_dir=args.cache_dir if args.config.endswith("+cache") else None,
        precompile=not args.config.endswith("+serial"),
    )
    if chosen is not None:
        chosen.close()
        work[0]["device_map"] = chosen.message
    return samples.samples, work


class _AutoChoice(logging.Handler):
    """Keeps the message with which ``"auto"`` logs its choice (``shardvi`` logger, INFO)."""

    def __init__(self):
        super().__init__(logging.INFO)
        self.message = None
        self.logger = logging.getLogger("shardvi")
        self.level_before = self.logger.level
        self.logger.setLevel(logging.INFO)
        self.logger.addHandler(self)

    def emit(self, record):
        if "'auto' device map" in record.getMessage():
            self.message = record.getMessage()

    def close(self):
        self.logger.removeHandler(self)
        self.logger.setLevel(self.level_before)
        super().close()


def child_nifty(args, problem, clock):
    import jax
    import nifty.re as jft
    import numpy as np

    call = problem.call
    model = jft.Model(lambda x: call(x.tree if isinstance(x, jft.Vector) else x), domain=jft.Vector(problem.domain))
    std = problem.noise_std
    lh = jft.Gaussian(problem.data, noise_cov_inv=lambda r: r / std**2, noise_std_inv=lambda r: r / std).amend(model)
    s = _solver_settings(args, problem.n_latent)
    draw = dict(cg_name=None, cg_kwargs=dict(absdelta=s["absdelta"], miniter=s["miniter"], maxiter=s["cg_maxiter"]))
    inner = dict(name=None, miniter=s["miniter"], maxiter=s["inner_maxiter"])
    curve = dict(minimize_kwargs=dict(name=None, xtol=s["geovi_xtol"], maxiter=s["geovi_maxiter"], cg_kwargs=inner))
    kl = dict(minimize_kwargs=dict(name=None, xtol=s["kl_xtol"], maxiter=s["kl_maxiter"], cg_kwargs=inner))
    kw = {}
    config = args.config.split("+")[0]  # "+classic" is an XLA flag set by the parent (child_env)
    if config != "default":
        residual_map = config.split("-")[1]
        kw = dict(linear_minimizer_jit=True, nonlinear_minimizer_jit=True, residual_map=residual_map)
        draw["cg"] = jft.conjugate_gradient.static_cg
        curve["minimize"] = jft.optimize._static_newton_cg
    work = []
    for attr, stage in (
        ("draw_linear_samples", "sampling"),
        ("nonlinearly_update_samples", "geovi"),
        ("kl_minimize", "kl"),
    ):
        setattr(jft.OptimizeVI, attr, clock.timed(getattr(jft.OptimizeVI, attr), stage))

    def callback(samples, state):
        clock.tick(samples.pos)
        ms = state.minimization_state
        ss = state.sample_state
        geovi = int(np.sum(np.asarray(ss.nit))) if hasattr(ss, "nit") else 0
        work.append(
            dict(
                kl_nit=int(ms.nit),
                kl_hessp=int(ms.nhev),
                sampling_cg=None,
                geovi_nit=geovi,
                engine_kl=float(ms.fun),
                kl_status=int(ms.status),
                stages=clock.take_stages(),
            )
        )

    import logging

    logging.getLogger("NIFTy.RE").setLevel(logging.WARNING)
    clock.start()
    samples, state = jft.optimize_kl(
        lh,
        jft.Vector(problem.position),
        key=jax.random.PRNGKey(args.seed),
        n_total_iterations=args.iterations,
        n_samples=args.samples,
        sample_mode=_sample_mode(args.linear_iterations),
        draw_linear_kwargs=draw,
        nonlinearly_update_kwargs=curve,
        kl_kwargs=kl,
        callback=callback,
        **kw,
    )
    return samples.samples.tree, work


class Clock:
    """Per-iteration wall times and compilations, read in the engines' callbacks."""

    def __init__(self, compile_stats):
        self.cs = compile_stats
        self.times, self.compiles, self.compile_s = [], [], []
        self.stages = {}

    def timed(self, fn, stage):
        """``fn`` that blocks on its result and adds its wall time to ``stage`` (for the current iteration)."""
        import functools

        import jax

        @functools.wraps(fn)
        def wrapper(*args, **kwargs):
            t = time.perf_counter()
            out = fn(*args, **kwargs)
            jax.block_until_ready(jax.tree.leaves(out))
            self.stages[stage] = self.stages.get(stage, 0.0) + time.perf_counter() - t
            return out

        if hasattr(fn, "lower"):  # shardvi's steps: compiled ahead through their lower (precompile)
            wrapper.lower = fn.lower

        return wrapper

    def take_stages(self):
        out, self.stages = self.stages, {}
        return out

    def start(self):
        self.t = time.perf_counter()
        self.snap = self.cs.snapshot()

    def tick(self, pos):
        import jax

        jax.block_until_ready(pos)
        now, snap = time.perf_counter(), self.cs.snapshot()
        self.times.append(now - self.t)
        self.compiles.append(snap["n"] - self.snap["n"])
        self.compile_s.append(snap["s"] - self.snap["s"])
        self.t, self.snap = time.perf_counter(), snap  # the callback's own bookkeeping is not timed


def child_main(args):
    jax = C.setup_jax()
    if args.config.split("+")[0].endswith("-2cpu"):
        jax.config.update("jax_num_cpu_devices", 2)  # before any JAX op
    cs = C.CompileStats()
    problem = C.Problem(args.shape, noise_std=args.noise_std, seed=args.seed, link=args.link, model=args.model)
    jax.block_until_ready(problem.data)
    start = cs.snapshot()
    rss_base = C.current_rss_mib()
    clock = Clock(cs)
    t0 = time.perf_counter()
    run = child_shardvi if args.engine == "shardvi" else child_nifty
    stacked, work = run(args, problem, clock)
    total = time.perf_counter() - t0
    end = cs.snapshot()
    kl, chi2 = (float(v) for v in problem.evaluate(stacked))
    times = clock.times
    later = times[1:]
    warm = [t for t, c in zip(times[1:], clock.compiles[1:]) if c == 0]
    # stage breakdown over the geoVI iterations after the first one (iterations linear+2 .. N, 1-based)
    late = list(range(args.linear_iterations + 1, len(work)))
    stage_s = {
        st: (sum(work[i]["stages"].get(st, 0.0) for i in late) / len(late) if late else None)
        for st in ("sampling", "geovi", "kl")
    }
    hessp = sum(work[i]["kl_hessp"] for i in late)
    kl_ms_per_hessp = 1e3 * sum(work[i]["stages"].get("kl", 0.0) for i in late) / hessp if hessp else None
    rec = dict(
        engine=args.engine,
        config=args.config,
        shape=list(args.shape),
        n_latent=problem.n_latent,
        n_data=problem.n_data,
        iter_s=times,
        iter_compiles=clock.compiles,
        iter_compile_s=clock.compile_s,
        first_s=times[0],
        iter_median_s=C.median(later) if later else None,
        warm_iter_s=C.median(warm),
        late_sampling_s=stage_s["sampling"],
        late_geovi_s=stage_s["geovi"],
        late_kl_s=stage_s["kl"],
        late_compiles=sum(clock.compiles[i] for i in late),
        kl_ms_per_hessp=kl_ms_per_hessp,
        total_s=total,
        compile_s=end["s"] - start["s"],
        n_compiles=end["n"] - start["n"],
        recompiles=sum(clock.compiles[1:]),
        trace_lower_s=end["trace_lower_s"] - start["trace_lower_s"],
        rss_base_mib=rss_base,
        rss_peak_mib=C.peak_rss_mib(),
        device_peak_mib=C.device_peak_mib(),
        kl=kl,
        chi2=chi2,
        kl_nit=sum(w["kl_nit"] for w in work),
        kl_hessp=sum(w["kl_hessp"] for w in work),
        geovi_nit=sum(w["geovi_nit"] for w in work),
        sampling_cg=None if work and work[0]["sampling_cg"] is None else sum(w["sampling_cg"] for w in work),
        engine_kl=work[-1]["engine_kl"] if work else None,
        work=work,
        device_map=work[0].get("device_map") if work else None,
        jax=jax.__version__,
    )
    print(json.dumps(rec), flush=True)


# ================================================================================================ parent
def nifty_python(args):
    """Interpreter of the NIFTy.re venv (created on first use), or (None, reason)."""
    if args.nifty_python:
        return args.nifty_python, None
    script = os.path.join(C.HERE, "setup_nifty_venv.sh")
    try:
        p = subprocess.run(["bash", script], capture_output=True, text=True, timeout=1800)
    except (OSError, subprocess.TimeoutExpired) as err:
        return None, f"{script} failed: {err}"
    skipped = [ln for ln in p.stderr.splitlines() if ln.startswith("skipped:")]
    out = p.stdout.strip().splitlines()
    if skipped or p.returncode != 0 or not out or not os.path.exists(out[-1]):
        return None, (skipped[-1][len("skipped:") :].strip() if skipped else f"exit {p.returncode}: {p.stderr[-500:]}")
    return out[-1], None


def child_env(engine, config):
    """Extra environment of a child run: ``+classic`` NIFTy.re runs get XLA:CPU's classic emitters."""
    if engine == "nifty" and config.endswith("+classic"):
        return {"XLA_FLAGS": (os.environ.get("XLA_FLAGS", "") + " " + CLASSIC_EMITTERS_FLAG).strip()}
    return None


def child_args(args, engine, config):
    a = [
        "--child",
        "--engine",
        engine,
        "--config",
        config,
        "--shape",
        ",".join(map(str, args.shape)),
        "--samples",
        str(args.samples),
        "--iterations",
        str(args.iterations),
        "--linear-iterations",
        str(args.linear_iterations),
        "--delta",
        repr(args.delta),
        "--cg-maxiter",
        str(args.cg_maxiter),
        "--geovi-maxiter",
        str(args.geovi_maxiter),
        "--geovi-xtol",
        repr(args.geovi_xtol),
        "--kl-xtol",
        repr(args.kl_xtol),
        "--kl-maxiter",
        str(args.kl_maxiter),
        "--seed",
        str(args.seed),
        "--noise-std",
        repr(args.noise_std),
        "--link",
        args.link,
        "--model",
        args.model,
    ]
    if engine == "shardvi" and config.endswith("+cache"):
        a += ["--cache-dir", args.cache_dir]
    return a


SUMMARY_KEYS = (
    "first_s",
    "iter_median_s",
    "warm_iter_s",
    "late_sampling_s",
    "late_geovi_s",
    "late_kl_s",
    "late_compiles",
    "kl_ms_per_hessp",
    "total_s",
    "compile_s",
    "n_compiles",
    "recompiles",
    "trace_lower_s",
    "rss_base_mib",
    "rss_peak_mib",
    "device_peak_mib",
    "kl",
    "chi2",
    "kl_nit",
    "kl_hessp",
    "geovi_nit",
    "sampling_cg",
)


def summarize(records):
    ok = [r for r in records if "error" not in r]
    out = dict(runs=len(ok), errors=[r["error"] for r in records if "error" in r])
    for k in SUMMARY_KEYS:
        out[k] = C.median([r.get(k) for r in ok])
    return out


def main(argv=None):
    ap = argparse.ArgumentParser(
        description=__doc__.splitlines()[0], formatter_class=argparse.RawDescriptionHelpFormatter
    )
    ap.add_argument("--shape", default="128,128", help="grid shape, comma separated")
    ap.add_argument("--samples", type=int, default=4, help="antithetic sample pairs")
    ap.add_argument("--iterations", type=int, default=5, help="global iterations")
    ap.add_argument("--linear-iterations", type=int, default=2, help="leading linear_resample iterations")
    ap.add_argument("--delta", type=float, default=1e-4, help="NIFTy-demo tolerance scale (see docstring)")
    ap.add_argument("--cg-maxiter", type=int, default=100, help="sampling CG maxiter")
    ap.add_argument("--geovi-maxiter", type=int, default=5)
    ap.add_argument(
        "--geovi-xtol",
        type=float,
        default=0.0,
        help="geoVI Newton xtol (default 0: exactly --geovi-maxiter steps in both engines)",
    )
    ap.add_argument(
        "--kl-xtol",
        type=float,
        default=0.0,
        help="KL Newton xtol (default 0: exactly --kl-maxiter steps in both engines; see docstring)",
    )
    ap.add_argument("--kl-maxiter", type=int, default=3)
    ap.add_argument("--noise-std", type=float, default=0.1)
    ap.add_argument("--link", choices=("exp", "linear"), default="exp")
    ap.add_argument(
        "--model",
        choices=("cf", "pointwise"),
        default="cf",
        help="cf: correlated field; pointwise: signal = link(latent) (no FFTs, fast to compile)",
    )
    ap.add_argument("--seed", type=int, default=1)
    ap.add_argument("--runs", type=int, default=3, help="fresh-process runs per configuration (medians)")
    ap.add_argument("--shardvi", default=",".join(SHARDVI_CONFIGS), help=f"shardvi configurations {SHARDVI_CONFIGS}")
    ap.add_argument(
        "--nifty",
        default=",".join(DEFAULT_NIFTY),
        help=f"NIFTy.re configurations {NIFTY_CONFIGS}; empty: skip NIFTy.re",
    )
    ap.add_argument("--nifty-python", default=None, help="interpreter with nifty installed (default: make the venv)")
    ap.add_argument("--timeout", type=float, default=900, help="seconds per child run")
    ap.add_argument("--smoke", action="store_true", help="tiny pointwise problem, 1 run, shardvi only (seconds)")
    ap.add_argument("--json", default=None, help="write the records and summary to this file")
    # child mode (internal)
    ap.add_argument("--child", action="store_true", help=argparse.SUPPRESS)
    ap.add_argument("--engine", choices=("shardvi", "nifty"), help=argparse.SUPPRESS)
    ap.add_argument("--config", help=argparse.SUPPRESS)
    ap.add_argument("--cache-dir", default=None, help=argparse.SUPPRESS)
    args = ap.parse_args(argv)
    args.shape = tuple(int(s) for s in str(args.shape).split(","))
    if args.child:
        return child_main(args)
    if args.smoke:
        args.shape, args.samples, args.iterations, args.linear_iterations = (16, 16), 1, 2, 1
        args.runs, args.nifty, args.shardvi, args.kl_maxiter, args.cg_maxiter = 1, "", "vmap", 3, 20
        args.model = "pointwise"
    shardvi_cfgs = [c for c in args.shardvi.split(",") if c]
    nifty_cfgs = [c for c in args.nifty.split(",") if c]
    for c in shardvi_cfgs:
        if c not in SHARDVI_CONFIGS:
            ap.error(f"unknown shardvi configuration {c!r}; choose from {SHARDVI_CONFIGS}")
    for c in nifty_cfgs:
        if c not in NIFTY_CONFIGS:
            ap.error(f"unknown NIFTy.re configuration {c!r}; choose from {NIFTY_CONFIGS}")
    nifty_py, skip_reason = (None, "not requested") if not nifty_cfgs else nifty_python(args)
    if nifty_cfgs and nifty_py is None:
        print(f"skipped: NIFTy.re comparison ({skip_reason}); measuring shardvi only", flush=True)
        nifty_cfgs = []
    jobs = [("shardvi", c, sys.executable) for c in shardvi_cfgs] + [("nifty", c, nifty_py) for c in nifty_cfgs]
    script = os.path.abspath(__file__)
    records = {(e, c): [] for e, c, _ in jobs}
    cache_root = None
    if any(c.endswith("+cache") for c in shardvi_cfgs):  # "+cache": one unrecorded run fills a fresh cache
        cache_root = tempfile.mkdtemp(prefix="shardvi-bench-cache-")
        args.cache_dir = cache_root
        for c in (c for c in shardvi_cfgs if c.endswith("+cache")):
            print(f"filling the compilation cache: shardvi/{c} ...", file=sys.stderr, flush=True)
            rec = C.run_child(sys.executable, script, child_args(args, "shardvi", c), timeout=args.timeout)
            if "error" in rec:
                print(f"  warm-up of {c} failed: {rec['error']}", file=sys.stderr)
    for run in range(args.runs):
        for engine, config, py in jobs:
            rec = C.run_child(
                py, script, child_args(args, engine, config), timeout=args.timeout, env=child_env(engine, config)
            )
            rec.setdefault("engine", engine)
            rec.setdefault("config", config)
            rec["run"] = run
            records[(engine, config)].append(rec)
            brief = {
                k: rec.get(k)
                for k in (
                    "engine",
                    "config",
                    "run",
                    "first_s",
                    "iter_median_s",
                    "compile_s",
                    "rss_peak_mib",
                    "device_peak_mib",
                    "device_map",
                    "kl",
                    "chi2",
                    "error",
                )
            }
            print(json.dumps(brief), file=sys.stderr, flush=True)
    summary = {f"{e}/{c}": summarize(records[(e, c)]) for e, c, _ in jobs}
    nifty_rows = {k: v for k, v in summary.items() if k.startswith("nifty/") and v["iter_median_s"] is not None}
    fastest = min(nifty_rows, key=lambda k: nifty_rows[k]["iter_median_s"]) if nifty_rows else None
    ratio_keys = ("first_s", "iter_median_s", "warm_iter_s", "total_s", "compile_s", "rss_peak_mib")
    for v in summary.values():
        if fastest and v["iter_median_s"] is not None:
            ref = summary[fastest]
            v["ratio_vs_nifty_fastest"] = {
                q: (v[q] / ref[q] if v[q] is not None and ref[q] else None) for q in ratio_keys
            }
    meta = dict(
        C.machine_meta(),
        shape=list(args.shape),
        samples=args.samples,
        iterations=args.iterations,
        linear_iterations=args.linear_iterations,
        delta=args.delta,
        cg_maxiter=args.cg_maxiter,
        geovi_maxiter=args.geovi_maxiter,
        geovi_xtol=args.geovi_xtol,
        kl_xtol=args.kl_xtol,
        kl_maxiter=args.kl_maxiter,
        runs=args.runs,
        link=args.link,
        model=args.model,
        nifty_fastest=fastest,
        nifty_skipped=skip_reason if not nifty_cfgs else None,
        command=" ".join([os.path.relpath(script, C.ROOT)] + list(argv if argv is not None else sys.argv[1:])),
    )
    C.write_json(args.json, dict(meta=meta, summary=summary, records={f"{e}/{c}": r for (e, c), r in records.items()}))
    print_table(meta, summary, fastest)
    if cache_root is not None:  # the cache directory is this script's own
        shutil.rmtree(cache_root, ignore_errors=True)
    bad = [k for k, v in summary.items() if v["runs"] == 0]
    if bad:
        print(f"\nfailed configurations: {bad}: " + "; ".join(summary[b]["errors"][0][:300] for b in bad))
        return 1
    return 0


def print_table(meta, summary, fastest):
    shape = "x".join(map(str, meta["shape"]))
    model = "correlated field" if meta["model"] == "cf" else "pointwise model"
    print(
        f"\n{shape} {model}, {meta['link']} link, {meta['samples']} pairs, {meta['iterations']} iterations "
        f"({meta['linear_iterations']} linear), medians of {meta['runs']} fresh-process runs; "
        f"ratio = shardvi / NIFTy.re {fastest or '(none)'}; {meta['cpu_count']} CPU cores\n"
    )
    header = [
        "engine/config",
        "first s",
        "iter s",
        "warm s",
        "total s",
        "compile s",
        "#comp",
        "recomp",
        "RSS MiB",
        "base MiB",
        "KL",
        "chi2",
        "KL nit/hessp",
        "geoVI nit",
        "total ratio",
        "first ratio",
        "compile ratio",
        "iter ratio",
        "RSS ratio",
    ]
    rows = []
    for k, v in summary.items():
        r = v.get("ratio_vs_nifty_fastest") or {}
        rows.append(
            [
                k,
                C.fmt(v["first_s"], ".2f"),
                C.fmt(v["iter_median_s"], ".3f"),
                C.fmt(v["warm_iter_s"], ".3f"),
                C.fmt(v["total_s"], ".1f"),
                C.fmt(v["compile_s"], ".1f"),
                C.fmt(v["n_compiles"], ".0f"),
                C.fmt(v["recompiles"], ".0f"),
                C.fmt(v["rss_peak_mib"], ".0f"),
                C.fmt(v["rss_base_mib"], ".0f"),
                C.fmt(v["kl"], ".1f"),
                C.fmt(v["chi2"], ".3f"),
                f"{C.fmt(v['kl_nit'], '.0f')}/{C.fmt(v['kl_hessp'], '.0f')}",
                C.fmt(v["geovi_nit"], ".0f"),
                C.fmt(r.get("total_s"), ".2f"),
                C.fmt(r.get("first_s"), ".2f"),
                C.fmt(r.get("compile_s"), ".2f"),
                C.fmt(r.get("iter_median_s"), ".2f"),
                C.fmt(r.get("rss_peak_mib"), ".2f"),
            ]
        )
    print(C.markdown_table(header, rows))
    n_late = meta["iterations"] - meta["linear_iterations"] - 1
    if n_late > 0:
        print(
            f"\nstage breakdown: mean seconds per iteration over the last {n_late} geoVI iterations "
            f"(each stage blocks on its result); KL ms/hessp = KL-minimization time per KL-metric application\n"
        )
        header = ["engine/config", "sampling s", "geoVI s", "KL s", "KL ms/hessp", "compiles in them"]
        rows = [
            [
                k,
                C.fmt(v.get("late_sampling_s"), ".3f"),
                C.fmt(v.get("late_geovi_s"), ".3f"),
                C.fmt(v.get("late_kl_s"), ".3f"),
                C.fmt(v.get("kl_ms_per_hessp"), ".2f"),
                C.fmt(v.get("late_compiles"), ".0f"),
            ]
            for k, v in summary.items()
        ]
        print(C.markdown_table(header, rows))


if __name__ == "__main__":
    sys.exit(main())
