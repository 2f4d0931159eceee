"""XLA:CPU's depth-first instruction schedule, chosen at ``import shardvi`` (before JAX's backend starts).

With several CPU devices in one process (``jax_num_cpu_devices``), XLA:CPU runs
every device's program on one shared thread pool, and its default
concurrency-optimized (breadth-first) schedule leaves collectives without a data
dependence between them in flight together. A field split over a model axis has
such pairs (a slab transform's ``all_to_all`` beside a block sum's
``all-gather``): one device's thread can then wait in the first while the other
device's thread waits in the second, and the run stops with XLA's rendezvous
timeout (``ShardMap`` 2x2 on a 128^2 field split, 5 iterations: 10 of 18 runs).
The memory-minimizing (depth-first) schedule orders them (none of 14 runs);
it changes the order of the operations, not their arithmetic (the same bits).

XLA reads this option only from ``XLA_FLAGS`` when its CPU backend starts (a
per-program compile option is ignored), so ``import shardvi`` adds
``--xla_cpu_enable_concurrency_optimized_scheduler=false`` to ``XLA_FLAGS``
unless ``XLA_FLAGS`` sets that option already (the user's choice is kept),
``SHARDVI_KEEP_XLA_FLAGS`` is set (non-empty), or JAX's backends have started.
:data:`STATE` records which; a model-split strategy on several CPU devices of
one process warns when ``XLA_FLAGS`` does not name the option then
(:func:`warn_if_unordered`).
"""

from __future__ import annotations

import os
import sys
import warnings

__all__ = ["FLAG", "STATE", "prefer_depth_first_schedule", "warn_if_unordered"]

FLAG = "--xla_cpu_enable_concurrency_optimized_scheduler=false"
_NAME = "xla_cpu_enable_concurrency_optimized_scheduler"

#: "set" (shardvi added the flag), "user" (XLA_FLAGS names the option), "opted_out"
#: (SHARDVI_KEEP_XLA_FLAGS), "too_late" (JAX's backends had started), or "" before the first call
STATE = ""


def _backends_started() -> bool:
    if "jax" not in sys.modules:  # before jax is imported: nothing started (and nothing imported here)
        return False
    from ._jax_compat import backends_started

    return backends_started()


def prefer_depth_first_schedule() -> str:
    """Add :data:`FLAG` to ``XLA_FLAGS`` where allowed (see the module docstring); return :data:`STATE`."""
    global STATE
    flags = os.environ.get("XLA_FLAGS", "")
    if _NAME in flags:
        STATE = "user"
    elif os.environ.get("SHARDVI_KEEP_XLA_FLAGS"):
        STATE = "opted_out"
    elif _backends_started():
        STATE = "too_late"
    else:
        os.environ["XLA_FLAGS"] = f"{flags} {FLAG}".strip()
        STATE = "set"
    return STATE


def warn_if_unordered(devices, model_shards: int) -> None:
    """Warn (``RuntimeWarning``) when a mesh with a model axis puts several CPU devices of this process in one
    row and ``XLA_FLAGS`` does not name the schedule option (JAX started before ``import shardvi``,
    ``SHARDVI_KEEP_XLA_FLAGS``, or ``XLA_FLAGS`` replaced after ``import shardvi``)."""
    if model_shards < 2 or _NAME in os.environ.get("XLA_FLAGS", ""):
        return
    import jax

    local = [d for d in devices if d.platform == "cpu" and d.process_index == jax.process_index()]
    if len(local) < 2:
        return
    warnings.warn(
        f"several CPU devices of this process share a model axis, and XLA:CPU's concurrency-optimized schedule is "
        f"in effect (JAX's backend started before `import shardvi`, SHARDVI_KEEP_XLA_FLAGS is set, or XLA_FLAGS "
        f"was replaced after `import shardvi`): their collectives can deadlock (XLA's rendezvous timeout). Import "
        f"shardvi before any JAX computation, or add {FLAG} to XLA_FLAGS before the process starts",
        RuntimeWarning,
        stacklevel=3,
    )
