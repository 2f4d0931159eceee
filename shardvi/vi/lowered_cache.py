"""Drop JAX's lowered modules of programs that are compiled and have run once.

``jax.jit`` keeps, per traced function and signature, the MLIR module it
lowered (and the computation object that holds it) in Python-level caches, next
to the executable in the C++ dispatch cache of the jitted function. Once a
program has run, its later calls with the same signature take the C++ path and
never read the Python caches again, but the modules stay: ~22 MiB per process
for the engine's steps of a 2048² correlated field (measured with
``benchmarks/bench_field_memory.py``), a part of every process's memory that
does not shrink with the processes of a field split.

:func:`release_lowered_modules` clears those two caches (JAX's own
``cache_clear``; nothing else: executables, traced jaxprs and the eager
operations' caches stay). A jitted function called later through the Python
path (a new signature) lowers again; it compiles again only where its
executable was not kept elsewhere (the persistent compilation cache loads it).
The engine calls it after the first call of each of its steps, when no step
compiled ahead waits for its call (whose executable only that cache holds).

The caches are JAX internals, reached through :mod:`shardvi._jax_compat`: where a
JAX version has no such cache, nothing is cleared.
"""

from __future__ import annotations

from .._jax_compat import LOWERED_CACHES, clear_lowered_caches

__all__ = ["LOWERED_CACHES", "release_lowered_modules"]


def release_lowered_modules() -> int:
    """Clear JAX's caches of lowered modules (:data:`LOWERED_CACHES`); how many it cleared (0 to 2).

    Programs already called keep running from their executables without being lowered or
    compiled again (see the module docstring).
    """
    return clear_lowered_caches(LOWERED_CACHES)
