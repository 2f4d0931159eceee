"""Compiling the engine steps ahead in a background thread: the same programs, the same bits, no extra compiles."""

import logging
import re
import threading
import time

import jax
import numpy as np
import pytest
from _parallel_problem import final_arrays
from _small_problem import exp_problem as _problem

import shardvi as sv
from shardvi.vi.precompile import Precompiler

PROBLEM = _problem()
SETTINGS = dict(
    n_total_iterations=4,
    # fresh MGVI, MAP, geoVI with a new count, geoVI curving the previous residuals again
    n_samples=lambda i: (2, 0, 1, 1)[i],
    sample_mode=lambda i: ("linear_resample", "linear_resample", "nonlinear_resample", "nonlinear_update")[i],
    nonlinear_update=sv.NewtonCGConfig(xtol=1e-6, maxiter=4),
    kl_minimization=lambda i: sv.NewtonCGConfig(xtol=1e-6, maxiter=3 + (i % 2)),
    progress=False,
)


ENGINE_STEPS = ("draw_linear", "curve", "minimize", "diagnostics")


#: the precompiler's step keys -> the programs' names
STEP_PROGRAMS = dict(draw="draw_linear", curve="curve", kl="minimize", diagnostics="diagnostics")


class _Builds(logging.Handler):
    """The engine-step programs JAX builds (``jax_log_compiles``), with the thread that built each.

    ``stolen``: the programs lowered in the background and compiled by the calling thread (claimed
    while the compile thread was busy with another step).
    """

    def __init__(self):
        super().__init__()
        self.builds, self.stolen = [], []

    def emit(self, record):
        msg = record.getMessage()
        m = re.search(r"Finished XLA compilation of jit\((\w+)\)", msg)
        if m and m[1] in ENGINE_STEPS:
            self.builds.append((m[1], record.threadName))
        m = re.match(r"compiling \('(\w+)'.* in the calling thread \(lowered in the background\)", msg)
        if m:
            self.stolen.append(STEP_PROGRAMS[m[1]])


def _run(precompile, **kwargs):
    lh, pos = PROBLEM
    handler, jax_logger, sv_logger = _Builds(), logging.getLogger("jax"), logging.getLogger("shardvi.vi")
    jax_logger.addHandler(handler)
    sv_logger.addHandler(handler)
    before, sv_level = jax.config.jax_log_compiles, sv_logger.level
    jax.config.update("jax_log_compiles", True)  # global: jax.log_compiles() would not reach the background thread
    sv_logger.setLevel(logging.DEBUG)
    try:
        samples, state = sv.optimize_kl(
            lh, pos, key=jax.random.PRNGKey(3), precompile=precompile, **{**SETTINGS, **kwargs}
        )
    finally:
        jax.config.update("jax_log_compiles", before)
        jax_logger.removeHandler(handler)
        sv_logger.removeHandler(handler)
        sv_logger.setLevel(sv_level)
    return final_arrays(samples, state), state, handler


@pytest.mark.parametrize(
    "kwargs, n_programs",
    [
        # draw(2), kl(3, 2), diag(2) | MAP: kl(4, 0), diag(0) | draw(1), curve(1), kl(3, 1), diag(1) | kl(4, 1)
        ({}, 10),
        # two-device strategies (replicated placements), one sample per key, one geoVI iteration less:
        # draw(2), kl(3, 2), diag(2) | kl(4, 0), diag(0) | curve(2) (its draw, KL and diagnostics are built)
        (
            dict(
                sample_map="shard_map",
                kl_map="jit",
                devices=jax.devices()[:2],
                mirror_samples=False,
                n_total_iterations=3,
                n_samples=lambda i: (2, 0, 2)[i],
            ),
            6,
        ),
    ],
    ids=["vmap", "multi-device-unmirrored"],
)
def test_each_step_built_once_ahead_of_its_call(kwargs, n_programs):
    """Stand-ins match the real calls: the background builds the programs the run uses, each once.

    The calling thread builds only the first step (the geoVI update compiled ahead of iteration 3, ...);
    a stand-in whose shape or placement differed from the real call would make the call build its own
    program, on the calling thread.
    """
    _, state, log = _run(True, **kwargs)
    builds = log.builds
    assert [r.n_samples for r in state.history][-2:] in ([1, 1], [0, 2])
    assert len(builds) == n_programs, builds
    main = [name for name, thread in builds if not thread.startswith("shardvi-precompile")]
    # the first step of the run; all others were lowered ahead, and compiled ahead unless the call came first
    assert main == ["draw_linear", *log.stolen], (builds, log.stolen)


def test_same_bits_as_compiling_at_each_call():
    ref, ref_state, _ = _run(False, n_total_iterations=3)
    got, state, _ = _run(True, n_total_iterations=3)
    assert [r.sample_mode for r in state.history] == [r.sample_mode for r in ref_state.history]
    for a, b in zip(got, ref, strict=True):
        np.testing.assert_array_equal(a, b)


def test_failing_step_raises_at_its_call():
    """A KL minimizer that cannot be traced fails in the background silently and at its stage loudly."""

    class Broken(sv.NewtonCGConfig):
        def minimize(self, *args, **kwargs):
            raise RuntimeError("broken minimizer")

    lh, pos = PROBLEM
    for precompile in (False, True):
        with pytest.raises(RuntimeError, match="broken minimizer"):
            sv.optimize_kl(
                lh,
                pos,
                key=jax.random.PRNGKey(3),
                n_total_iterations=2,
                n_samples=1,
                sample_mode="linear_resample",
                kl_minimization=Broken(),
                progress=False,
                precompile=precompile,
            )


def test_precompile_must_be_bool():
    lh, pos = PROBLEM
    with pytest.raises(TypeError, match="precompile must be a bool"):
        sv.optimize_kl(lh, pos, key=jax.random.PRNGKey(0), n_total_iterations=1, n_samples=1, precompile="yes")


# -- the Precompiler itself ------------------------------------------------------------------------------
def test_precompiler_claim_waits_cancels_and_swallows():
    pc = Precompiler()
    gate, started, ran = threading.Event(), threading.Event(), []

    def slow():
        started.set()
        gate.wait(5)
        ran.append("slow")

    pc.submit("a", slow)
    pc.submit("b", lambda: ran.append("b"))
    pc.submit("a", lambda: ran.append("again"))  # a key is submitted once
    assert started.wait(5)
    pc.claim("b")  # not started (the worker is busy with "a"): cancelled, the caller compiles it
    assert pc.pending() == ("a",)
    gate.set()
    pc.claim("a")  # started: waited for
    assert ran == ["slow"]
    pc.submit("b", lambda: ran.append("b"))  # claimed keys are not submitted again
    pc.submit("c", lambda: 1 / 0)  # fails in the background ...
    pc.join()
    assert pc.pending() == ("c",)
    assert not pc.ready("c")  # ... is not ready ...
    pc.claim("c")  # ... and claiming it does not raise: the real call raises
    assert ran == ["slow"]


def test_precompiler_disabled_and_cancel_pending():
    off = Precompiler(enabled=False)
    off.submit("a", lambda: 1 / 0)
    assert off.pending() == ()
    pc = Precompiler()
    gate, ran = threading.Event(), []
    pc.submit("busy", lambda: gate.wait(5))
    pc.submit("later", lambda: ran.append("later"))
    pc.cancel_pending()
    gate.set()
    assert pc.pending() == ()
    pc.submit("later", lambda: ran.append("later"))  # a cancelled key can be submitted again
    pc.claim("later")
    assert ran in ([], ["later"])  # cancelled by the claim or run before it, never twice


class _Lowered:
    """A stand-in for ``jax.stages.Lowered``: ``compile()`` records the thread and waits for ``gate``."""

    def __init__(self, name, log, gate=None):
        self.name, self.log, self.gate = name, log, gate

    def compile(self):
        self.log.append(("compile " + self.name, threading.current_thread().name))
        if self.gate is not None:
            self.gate.wait(5)
        return self.name


def test_precompiler_pipelines_lowering_and_compiling():
    """The next step is lowered while the previous one compiles, in another thread; claims wait for both stages."""
    pc = Precompiler()
    log, compiling_a, lowered_b = [], threading.Event(), threading.Event()

    class _SlowCompile(_Lowered):
        def compile(self):
            compiling_a.set()
            assert lowered_b.wait(5), "b was not lowered while a compiled"
            return super().compile()

    def lower(name, cls=_Lowered, after=None):
        def thunk():
            log.append(("lower " + name, threading.current_thread().name))
            if after is not None:
                after.set()
            return cls(name, log)

        return thunk

    pc.submit("a", lower("a", _SlowCompile))
    pc.submit("b", lower("b", after=lowered_b))
    assert lowered_b.wait(5)
    assert compiling_a.wait(5)  # a is in the compile thread (not merely lowered: the caller would compile it)
    pc.claim("a")  # being compiled: waited for
    # b's thunk set lowered_b before it returned: the lowering thread may not have recorded it as lowered yet
    deadline = time.monotonic() + 5
    while pc._jobs["b"].state == "lowering" and time.monotonic() < deadline:
        time.sleep(0.001)
    assert pc.ready("b") or pc._jobs["b"].state in ("to-compile", "compiling")
    pc.join()
    assert pc.ready("b")
    pc.claim("b")
    assert [s for s, _ in log] == ["lower a", "lower b", "compile a", "compile b"]
    threads = dict(log)
    assert threads["lower a"] == threads["lower b"] != threads["compile a"] == threads["compile b"]
    assert threads["lower a"].startswith("shardvi-precompile") and threads["compile a"].startswith("shardvi-precompile")
    assert compiling_a.is_set() and pc.pending() == ()


def test_precompiler_caller_compiles_a_lowered_step_waiting_for_the_compile_thread():
    pc = Precompiler()
    log, gate = [], threading.Event()
    pc.submit("busy", lambda: _Lowered("busy", log, gate))
    pc.submit("next", lambda: _Lowered("next", log))
    for _ in range(500):  # "next" is lowered once the lowering thread is free; its compile waits for "busy"
        if pc._jobs["next"].state == "to-compile" and log:
            break
        threading.Event().wait(0.01)
    assert pc._jobs["next"].state == "to-compile"
    pc.claim("next")  # lowered, the compile thread busy: compiled here, not lowered again
    assert log == [("compile busy", log[0][1]), ("compile next", threading.current_thread().name)]
    assert pc.pending() == ("busy",)
    gate.set()
    pc.claim("busy")
    pc.join()
    assert [s for s, _ in log] == ["compile busy", "compile next"]  # each once


def test_precompiler_claim_during_lowering_compiles_in_the_caller_when_the_compile_thread_is_busy():
    """A step claimed while its lowering is under way waits for the lowering only: with the compile thread busy
    it is compiled in the caller (before, the claim waited for the queue of the compile thread as well)."""
    pc = Precompiler()
    log, busy, lowering, release = [], threading.Event(), threading.Event(), threading.Event()
    pc.submit("busy", lambda: _Lowered("busy", log, busy))

    def slow_lowering():
        lowering.set()
        release.wait(5)
        return _Lowered("next", log)

    pc.submit("next", slow_lowering)
    assert lowering.wait(5)
    threading.Timer(0.05, release.set).start()  # the lowering ends while the claim below waits for it
    pc.claim("next")
    assert log == [("compile busy", log[0][1]), ("compile next", threading.current_thread().name)]
    busy.set()
    pc.claim("busy")
    pc.join()
    assert [s for s, _ in log] == ["compile busy", "compile next"]


def test_precompiler_drops_a_step_lowered_across_cancel_pending():
    pc = Precompiler()
    log, gate = [], threading.Event()

    def slow_lowering():
        gate.wait(5)
        return _Lowered("slow", log)

    pc.submit("slow", slow_lowering)
    for _ in range(500):
        if pc._jobs["slow"].state == "lowering":
            break
        threading.Event().wait(0.01)
    pc.cancel_pending()  # the run stopped while "slow" was being lowered
    gate.set()
    pc.submit("after", lambda: _Lowered("after", log))
    pc.join()
    pc.claim("after")
    assert [s for s, _ in log] == ["compile after"]  # "slow" is not compiled after its lowering
    pc.submit("slow", lambda: _Lowered("slow", log))  # and can be submitted again
    pc.claim("slow")
    assert [s for s, _ in log] in (["compile after"], ["compile after", "compile slow"])


def test_exit_hook_drops_queued_compilations():
    """At interpreter exit only a running compilation is waited for, not every queued one."""
    import concurrent.futures.thread as cft
    import threading as th

    from shardvi.vi import precompile

    # ours runs before concurrent.futures joins its workers (the hooks, partials, run in reverse order)
    hooks = [h.func for h in th._threading_atexits]  # pyright: ignore[reportAttributeAccessIssue]
    assert hooks.index(precompile._cancel_all_at_exit) > hooks.index(cft._python_exit)
    pc = Precompiler()
    gate, ran = threading.Event(), []
    pc.submit("busy", lambda: gate.wait(5))
    for k in range(3):
        pc.submit(k, lambda k=k: ran.append(k))
    precompile._cancel_all_at_exit()
    assert pc.pending() == ()
    gate.set()
    pc.submit("after", lambda: ran.append("after"))  # runs once "busy" is done
    pc.join()
    assert ran == ["after"]  # the three queued before the exit hook never ran
