"""Opt-in persistent compilation cache: a second run compiles nothing and gives the same bits."""

import os

import jax
import numpy as np
import pytest
from _parallel_problem import final_arrays
from _small_problem import exp_problem as _problem

import shardvi as sv
from shardvi.compilation import CompileCounter


def _run(cache_dir, problem=None, **kwargs):
    lh, pos = _problem() if problem is None else problem
    return sv.optimize_kl(
        lh,
        pos,
        key=jax.random.PRNGKey(3),
        n_total_iterations=2,
        n_samples=2,
        sample_mode="linear_resample",
        kl_minimization=sv.NewtonCGConfig(xtol=1e-6, maxiter=5),
        progress=False,
        compilation_cache_dir=cache_dir,
        **kwargs,
    )


@pytest.mark.slow
def test_second_run_compiles_nothing_and_is_bitwise_equal(tmp_path):
    cache = tmp_path / "xla-cache"
    keep = tmp_path / "xla-cache" / "notes.txt"
    os.makedirs(cache)
    keep.write_text("the user's file")
    before = jax.config.jax_compilation_cache_dir
    problem = _problem()  # built outside the counted runs (its eager ops compile without the cache)
    jax.clear_caches()  # as in a fresh process: programs other tests compiled must not come from memory
    with CompileCounter() as first:
        ref = final_arrays(*_run(cache, problem))
    assert first.compiled > 0
    assert jax.config.jax_compilation_cache_dir == before, "the run left JAX's cache setting changed"
    written = set(os.listdir(cache)) - {"notes.txt"}
    assert written, "nothing was written to the cache directory"
    jax.clear_caches()  # drop the in-memory executables: only the directory can spare the compilations
    problem = _problem()
    with CompileCounter() as second:
        got = final_arrays(*_run(str(cache), problem))
    assert second.compiled == 0, f"the cached run compiled {second.compiled} programs"
    assert second.cache_hits == second.count > 0  # every program it needed: loaded from the directory
    for a, b in zip(got, ref):
        assert a.dtype == b.dtype and np.array_equal(a, b)
    assert keep.read_text() == "the user's file"
    # and without the cache, the same bits again (the cache changes no arithmetic)
    jax.clear_caches()
    for a, b in zip(final_arrays(*_run(None)), ref):
        assert np.array_equal(a, b)


def test_cache_scope_restores_jax_settings_on_error(tmp_path):
    names = ("jax_compilation_cache_dir", "jax_persistent_cache_min_compile_time_secs")
    before = [getattr(jax.config, n) for n in names]
    with pytest.raises(RuntimeError, match="boom"):
        with sv.compile_cache.persistent_compilation_cache(tmp_path / "c") as path:
            assert jax.config.jax_compilation_cache_dir == path == str(tmp_path / "c")
            assert jax.config.jax_persistent_cache_min_compile_time_secs == 0
            raise RuntimeError("boom")
    assert [getattr(jax.config, n) for n in names] == before


@pytest.mark.parametrize(
    "value,exc,match",
    [
        (123, TypeError, "compilation_cache_dir must be a str or os.PathLike"),
        (b"/tmp/x", TypeError, "compilation_cache_dir must be a str or os.PathLike"),
        ("", ValueError, "non-empty"),
        ("FILE", ValueError, "is not a directory"),
        ("UNDER_FILE", ValueError, "cannot be created"),
    ],
    ids=["int", "bytes", "empty", "a file", "under a file"],
)
def test_bad_cache_dir_is_a_clear_error(tmp_path, value, exc, match):
    f = tmp_path / "file"
    f.write_text("x")
    value = {"FILE": str(f), "UNDER_FILE": str(f / "sub")}.get(value, value) if isinstance(value, str) else value
    before = jax.config.jax_compilation_cache_dir
    with pytest.raises(exc, match=match):
        _run(value)
    assert jax.config.jax_compilation_cache_dir == before
