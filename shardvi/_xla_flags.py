"""XLA:CPU's depth-first instruction schedule for several CPU devices in one process: an explicit opt-in.

With several CPU devices in one process (``jax_num_cpu_devices``), XLA:CPU runs
every device's program on one shared thread pool, and its default
concurrency-optimized (breadth-first) schedule leaves collectives without a data
dependence between them in flight together. A field split over a model axis has
such pairs (a slab transform's ``all_to_all`` beside a block sum's
``all-gather``): one device's thread can then wait in the first while the other
device's thread waits in the second, and the run stops with XLA's rendezvous
timeout. The memory-minimizing (depth-first) schedule orders them; it changes
the order of the operations, not their arithmetic (the same bits).

XLA reads this option only from ``XLA_FLAGS`` when its CPU backend starts (a
per-program compile option is ignored), so shardvi cannot set it for one
computation, and it never edits the environment by itself. A program that puts
a model axis over several CPU devices of one process calls
:func:`depth_first_cpu_schedule` before its first JAX computation (the demos,
``python -m shardvi`` and the test suite do), or sets the option in the shell;
a strategy warns once per process where neither was done
(:func:`warn_if_unordered`).
"""

from __future__ import annotations

import os
import warnings

__all__ = ["FLAG", "depth_first_cpu_schedule", "warn_if_unordered"]

FLAG = "--xla_cpu_enable_concurrency_optimized_scheduler=false"
_NAME = "xla_cpu_enable_concurrency_optimized_scheduler"
_warned = False


def depth_first_cpu_schedule() -> bool:
    """Add :data:`FLAG` to ``XLA_FLAGS`` of this process unless it names the option already.

    An explicit opt-in for programs that put a model axis (``model_shards > 1``) over
    several CPU devices of one process; it acts only when called before JAX's CPU
    backend starts (the process's first JAX computation). Returns whether it changed
    ``XLA_FLAGS``.
    """
    flags = os.environ.get("XLA_FLAGS", "")
    if _NAME in flags:
        return False
    os.environ["XLA_FLAGS"] = f"{flags} {FLAG}".strip()
    return True


def warn_if_unordered(devices, model_shards: int) -> None:
    """Warn once per process (``RuntimeWarning``) when a mesh with a model axis puts several CPU devices of this
    process in one row and ``XLA_FLAGS`` does not name the schedule option."""
    global _warned
    if _warned or model_shards < 2 or _NAME in os.environ.get("XLA_FLAGS", ""):
        return
    import jax

    local = [d for d in devices if d.platform == "cpu" and d.process_index == jax.process_index()]
    if len(local) < 2:
        return
    _warned = True
    warnings.warn(
        "several CPU devices of this process share a model axis under XLA:CPU's concurrency-optimized "
        "schedule: their collectives can deadlock (XLA's rendezvous timeout). Call "
        "shardvi.parallel.depth_first_cpu_schedule() at the top of the program, before its first JAX "
        f'computation, or start it with XLA_FLAGS="$XLA_FLAGS {FLAG}"',
        RuntimeWarning,
        stacklevel=3,
    )
