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


class _Builds(logging.Handler):
    """The engine-step programs JAX builds (``jax_log_compiles``), with the thread that built each."""

    def __init__(self):
        super().__init__()
        self.builds = []

    def emit(self, record):
        m = re.search(r"Finished XLA compilation of jit\((\w+)\)", record.getMessage())
        if m and m[1] in ENGINE_STEPS:
            self.builds.append((m[1], record.threadName))


def _run(precompile, **kwargs):
    lh, pos = PROBLEM
    handler, jax_logger = _Builds(), logging.getLogger("jax")
    jax_logger.addHandler(handler)
    before = jax.config.jax_log_compiles
    jax.config.update("jax_log_compiles", True)  # global: jax.log_compiles() would not reach the background thread
    try:
        samples, state = sv.optimize_kl(
            lh, pos, key=jax.random.PRNGKey(3), precompile=precompile, **{**SETTINGS, **kwargs}
        )
    finally:
        jax.config.update("jax_log_compiles", before)
        jax_logger.removeHandler(handler)
    return final_arrays(samples, state), state, handler.builds


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
    _, state, builds = _run(True, **kwargs)
    assert [r.n_samples for r in state.history][-2:] in ([1, 1], [0, 2])
    assert len(builds) == n_programs, builds
    main = [name for name, thread in builds if not thread.startswith("shardvi-precompile")]
    assert main == ["draw_linear"], builds  # the first step of the run; all others were compiled ahead


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
    gate, ran = threading.Event(), []

    def slow():
        gate.wait(5)
        ran.append("slow")

    pc.submit("a", slow)
    pc.submit("b", lambda: ran.append("b"))
    pc.submit("a", lambda: ran.append("again"))  # a key is submitted once
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
