"""Strict test set-up: float64 and 4 forced CPU devices, before any JAX op.

The test session shares one JAX persistent compilation cache (a temporary
directory, removed at the end; ``SHARDVI_TEST_JAX_CACHE=0`` turns it off):
tests that build problems of the same shapes compile the same programs, and
with the data as program arguments those programs are identical. A cache hit
returns the executable XLA compiled for the same HLO and options, so no
assertion changes; it only saves compilation time.

Engine steps compile at LLVM level 0 on CPU in most tests, at the shipped
level (:data:`shardvi.parallel.CPU_COMPILER_OPTIONS`, level 1) in the tests
marked ``product_compiler``. The suite is bound by compilation (most of it the
engine's steps), and level 0 compiles them faster. Both levels compute IEEE arithmetic without fast-math, so a
test against a closed form, scipy or a tolerance asserts the same; what level 0
does not keep is the bitwise equality of *different* programs (1 vs N devices,
one strategy vs another, data as constants vs arguments), which the shipped
level is tested for: every test that compares the bits of two different
programs carries the marker (a module: ``pytestmark``), and so does a test
bound by its run time (the flagship demo; level-0 code runs slower).
Same-program comparisons (resume, compilation cache, compiling ahead) hold at
any level.
"""

import os
import shutil
import tempfile
import types

os.environ.setdefault("JAX_PLATFORMS", "cpu")
# The programs the tests compile outside the engine (test-local jits, eager ops such as jax.random.normal)
# at LLVM level 0 instead of XLA's default 3 (no fast-math at any level), in a fraction of the compile time
# (the small test programs run in microseconds at any level). The engine steps set their level themselves (below).
if "xla_backend_optimization_level" not in os.environ.get("XLA_FLAGS", ""):
    os.environ["XLA_FLAGS"] = (os.environ.get("XLA_FLAGS", "") + " --xla_backend_optimization_level=0").strip()
# model axes over the 4 forced CPU devices of one process: XLA:CPU's depth-first schedule (shardvi._xla_flags)
from shardvi._xla_flags import depth_first_cpu_schedule  # imports no JAX

depth_first_cpu_schedule()

import jax  # noqa: E402 -- after the XLA flags

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
from _session_cache import use_session_cache  # noqa: E402

use_session_cache()

import pytest  # noqa: E402

from shardvi.parallel import reproducible as _reproducible  # noqa: E402


def pytest_sessionfinish(session, exitstatus):
    """The process that created the run's compilation cache removes it (after its workers have ended)."""
    if _OWNER:
        shutil.rmtree(_CACHE, ignore_errors=True)


_TEST_ENGINE_LEVEL = types.MappingProxyType({**_reproducible.CPU_COMPILER_OPTIONS, "xla_backend_optimization_level": 0})


@pytest.fixture(autouse=True)
def _engine_llvm_level(request, monkeypatch):
    """LLVM level 0 for the engine's steps on CPU unless the test is marked ``product_compiler`` (see above).

    Function-scoped, so module-scoped fixtures (the references of the bitwise modules) run at the shipped level.
    A reference cached across tests (``functools.cache`` in tests/_parallel_problem.py and
    tests/_model_parallel_problem.py) takes the level of the test that computes it first: only marked tests
    use them."""
    if request.node.get_closest_marker("product_compiler") is None:
        monkeypatch.setattr(_reproducible, "CPU_COMPILER_OPTIONS", _TEST_ENGINE_LEVEL)


@pytest.fixture
def key():
    return jax.random.PRNGKey(42)
