"""Compiling the engine steps ahead in a background thread: the same programs, the same bits, no extra compiles."""

import logging
import re
import threading

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

    ``stolen``: the programs lowered ahead and compiled by the calling thread (claimed
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
        m = re.match(r"compiling \('(\w+)'.* in the calling thread \(lowered ahead\)", msg)
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
    """Stand-ins match the real calls: the programs the run uses are built once each, ahead of their calls.

    The calling thread builds only steps it claimed while they waited for the busy compile thread; a
    stand-in whose shape or placement differed from the real call would make the call build its own
    program, on the calling thread.
    """
    _, state, log = _run(True, **kwargs)
    builds = log.builds
    assert [r.n_samples for r in state.history][-2:] in ([1, 1], [0, 2])
    assert len(builds) == n_programs, builds
    main = [name for name, thread in builds if not thread.startswith("shardvi-precompile")]
    # every step was lowered ahead, and compiled ahead unless the call came first
    assert main == log.stolen, (builds, log.stolen)


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
class _Lowered:
    """A stand-in for ``jax.stages.Lowered``: ``compile()`` records the thread and waits for ``gate``."""

    def __init__(self, name, log, gate=None, started=None, fail=False):
        self.name, self.log, self.gate, self.started, self.fail = name, log, gate, started, fail

    def compile(self):
        self.log.append(("compile " + self.name, threading.current_thread().name))
        if self.started is not None:
            self.started.set()
        if self.gate is not None:
            self.gate.wait(5)
        if self.fail:
            raise RuntimeError("compile failed")
        return self.name


def _compile_threads():
    return [t for t in threading.enumerate() if t.name.startswith("shardvi-precompile")]


def test_precompiler_lowers_in_the_caller_and_compiles_in_one_background_thread():
    pc = Precompiler()
    log, lowered_in = [], []
    gate, started = threading.Event(), threading.Event()

    def lower(name, **kw):
        def thunk():
            lowered_in.append((name, threading.current_thread().name))
            return _Lowered(name, log, **kw)

        return thunk

    pc.submit("a", lower("a", gate=gate, started=started))
    pc.submit("b", lower("b"))
    pc.submit("a", lower("again"))  # a key is submitted once
    # the thunks (tracing: the user's model code) ran here, in the calling thread
    assert lowered_in == [("a", threading.current_thread().name), ("b", threading.current_thread().name)]
    assert started.wait(5)
    pc.claim("b")  # waiting for the busy compile thread: compiled by the caller
    assert ("compile b", threading.current_thread().name) in log
    gate.set()
    pc.claim("a")  # being compiled in the background: waited for
    assert log[0][0] == "compile a" and log[0][1].startswith("shardvi-precompile")
    pc.submit("b", lower("b"))  # a claimed key is not submitted again
    assert lowered_in[-1][0] == "b" and len(lowered_in) == 2
    pc.close()
    assert not _compile_threads()


def test_precompiler_swallows_errors_the_real_call_raises():
    pc = Precompiler()
    log = []
    pc.submit("lower", lambda: 1 / 0)  # fails while lowered: nothing to compile
    pc.submit("compile", lambda: _Lowered("c", log, fail=True))  # fails in the background ...
    pc.join()
    assert pc.pending() == ("compile",)
    assert not pc.ready("compile")  # ... is not ready ...
    pc.claim("compile")  # ... and claiming it does not raise: the real call raises
    pc.claim("lower")
    pc.close()


def test_precompiler_disabled_close_and_cancel_pending():
    off = Precompiler(enabled=False)
    off.submit("a", lambda: 1 / 0)
    assert off.pending() == ()
    pc = Precompiler()
    log, gate, started = [], threading.Event(), threading.Event()
    pc.submit("busy", lambda: _Lowered("busy", log, gate=gate, started=started))
    pc.submit("later", lambda: _Lowered("later", log))
    assert started.wait(5)
    closer = threading.Thread(target=pc.close)
    closer.start()  # drops "later", waits for "busy"
    closer.join(0.2)
    assert closer.is_alive()  # a compilation under way is waited for
    gate.set()
    closer.join(5)
    assert not closer.is_alive() and not _compile_threads()
    assert [e for e, _ in log] == ["compile busy"]  # the queued one was dropped
    assert pc.pending() == ()
    pc.submit("later", lambda: _Lowered("later", log))  # a dropped key can be submitted again: a new thread
    pc.claim("later")
    assert [e for e, _ in log] == ["compile busy", "compile later"]
    pc.close()
    assert not _compile_threads()


# -- what a run leaves behind ------------------------------------------------------------------------------
def test_a_run_leaves_no_thread_and_no_retrace_and_calls_schedules_once_in_the_calling_thread():
    """``optimize_kl`` ends its compile thread, clears no JAX cache (a user's jitted function is not traced
    again), and calls every setting given as a callable exactly once per iteration, before iteration 0, in
    the calling thread."""
    traces = []

    @jax.jit
    def user_fn(x):
        traces.append(1)
        return 2 * x

    user_fn(np.arange(3.0))
    calls = []

    def n_samples(i):
        calls.append(("n_samples", i, threading.current_thread().name))
        return (2, 1, 1)[i]

    def mode(i):
        calls.append(("sample_mode", i, threading.current_thread().name))
        return ("linear_resample", "nonlinear_resample", "nonlinear_update")[i]

    lh, pos = PROBLEM
    sv.optimize_kl(
        lh,
        pos,
        key=jax.random.PRNGKey(3),
        n_total_iterations=3,
        n_samples=n_samples,
        sample_mode=mode,
        nonlinear_update=sv.NewtonCGConfig(xtol=1e-6, maxiter=3),
        progress=False,
    )
    assert not _compile_threads()
    user_fn(np.arange(3.0))
    assert len(traces) == 1
    me = threading.current_thread().name
    assert sorted(calls) == sorted([(k, i, me) for k in ("n_samples", "sample_mode") for i in range(3)])


def test_a_bad_setting_at_a_later_iteration_is_refused_before_iteration_0():
    lh, pos = PROBLEM
    ran = []
    with pytest.raises(ValueError, match="n_samples"):
        sv.optimize_kl(
            lh,
            pos,
            key=jax.random.PRNGKey(3),
            n_total_iterations=4,
            n_samples=lambda i: (1, 1, 1, -2)[i],
            callback=lambda *_: ran.append(1),
            progress=False,
        )
    assert ran == []  # no iteration ran
