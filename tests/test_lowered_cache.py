"""``shardvi.vi.lowered_cache``: JAX's lowered modules dropped once their programs ran, nothing recompiled."""

import gc
import importlib
import weakref

import jax
import jax.numpy as jnp
import numpy as np
from _small_problem import exp_problem

import shardvi as sv
from shardvi.compilation import CompileCounter
from shardvi.vi import lowered_cache

okl = importlib.import_module("shardvi.vi.optimize_kl")  # the module (the package's attribute is the function)


def _cache(module, name):
    from shardvi._jax_compat import lowered_cache

    return lowered_cache(module, name)


def test_release_drops_the_lowered_modules_and_keeps_the_executables():
    f = jax.jit(lambda x: jnp.sin(x) * 2.0 + jnp.cumsum(x))  # a function no other test traces
    x = jnp.linspace(0.0, 1.0, 7)
    want = np.asarray(f(x))
    lowered = f.lower(x)  # the same cached computation as the call's
    module = weakref.ref(lowered._lowering)
    del lowered
    assert all(_cache(*c).cache_info().currsize >= 1 for c in lowered_cache.LOWERED_CACHES)

    assert lowered_cache.release_lowered_modules() == len(lowered_cache.LOWERED_CACHES)
    gc.collect()
    assert all(_cache(*c).cache_info().currsize == 0 for c in lowered_cache.LOWERED_CACHES)
    assert module() is None  # the lowered computation (and its MLIR module) is gone
    with CompileCounter() as cc:
        got = f(x)  # the dispatch cache's executable: neither lowered nor compiled again
    assert cc.count == 0
    np.testing.assert_array_equal(np.asarray(got), want)
    # a new signature lowers and compiles as usual
    np.testing.assert_allclose(np.asarray(f(x[:3])), want[:3], rtol=1e-15, atol=0)


def test_a_missing_cache_is_skipped(monkeypatch):
    monkeypatch.setattr(lowered_cache, "LOWERED_CACHES", (("shardvi", "no_such_cache"), ("no_such.module", "x")))
    assert lowered_cache.release_lowered_modules() == 0


def test_the_engine_releases_after_first_calls_and_compiles_nothing_later(monkeypatch):
    """Released once the steps ran and none compiled ahead waits; later iterations compile nothing."""
    calls = []
    real = okl.release_lowered_modules
    monkeypatch.setattr(okl, "release_lowered_modules", lambda: calls.append(1) or real())
    lh, pos = exp_problem()
    counts = []
    with CompileCounter() as cc:
        samples, _ = sv.optimize_kl(
            lh,
            pos,
            key=jax.random.PRNGKey(3),
            n_total_iterations=3,
            n_samples=2,
            sample_mode="nonlinear_resample",
            kl_minimization=sv.NewtonCGConfig(maxiter=3),
            progress=False,
            callback=lambda s, st: counts.append((cc.count, len(calls))),
        )
    assert counts[0][1] >= 1, counts  # released in the first iteration
    assert [c for c, _ in counts] == [counts[0][0]] * 3, counts  # no compilation after it
    assert [n for _, n in counts[1:]] == [counts[0][1]] * 2, counts  # nothing new to release
    assert np.isfinite(np.asarray(samples.pos["a"])).all()
