"""Strict test set-up: float64 and 4 forced CPU devices, before any JAX op.

The test session shares one JAX persistent compilation cache (a temporary
directory, removed at the end; ``SHARDVI_TEST_JAX_CACHE=0`` turns it off):
tests that build problems of the same shapes compile the same programs, and
with the data as program arguments those programs are identical. A cache hit
returns the executable XLA compiled for the same HLO and options, so no
assertion changes; it only saves compilation time.
"""

import os
import shutil
import tempfile

os.environ.setdefault("JAX_PLATFORMS", "cpu")
# The programs the tests compile outside the engine (test-local jits, eager ops such as jax.random.normal)
# at the LLVM level the engine's steps use on CPU (shardvi.parallel.CPU_COMPILER_OPTIONS) instead of XLA's
# default 3 (no fast-math at either level), in a fraction of the compile time (a 4-D jax.random.normal:
# 4.9 s at level 3, 0.4 s at level 1). The engine steps set their level themselves.
if "xla_backend_optimization_level" not in os.environ.get("XLA_FLAGS", ""):
    os.environ["XLA_FLAGS"] = (os.environ.get("XLA_FLAGS", "") + " --xla_backend_optimization_level=1").strip()

import jax

jax.config.update("jax_num_cpu_devices", 4)
jax.config.update("jax_enable_x64", True)
jax.config.update("jax_threefry_partitionable", True)

# one cache per test run: the first process that loads this file (pytest, or the pytest-xdist controller)
# creates it and owns it; the xdist workers it starts inherit the directory through the environment
_CACHE = os.environ.get("SHARDVI_TEST_JAX_CACHE_DIR")
_OWNER = _CACHE is None
if _OWNER:
    _CACHE = tempfile.mkdtemp(prefix="shardvi-test-jax-cache-")
    os.environ["SHARDVI_TEST_JAX_CACHE_DIR"] = _CACHE
if os.environ.get("SHARDVI_TEST_JAX_CACHE", "1") != "0":
    jax.config.update("jax_compilation_cache_dir", _CACHE)
    jax.config.update("jax_persistent_cache_min_compile_time_secs", 0)
    jax.config.update("jax_persistent_cache_min_entry_size_bytes", 0)

import pytest  # noqa: E402


def pytest_sessionfinish(session, exitstatus):
    """The process that created the run's compilation cache removes it (after its workers have ended)."""
    if _OWNER:
        shutil.rmtree(_CACHE, ignore_errors=True)


@pytest.fixture
def key():
    return jax.random.PRNGKey(42)
