"""Mapping samples over devices.

Strategies (all usable as ``sample_map`` and ``kl_map`` of
:func:`shardvi.optimize_kl`, by name or as objects), each a subclass of
:class:`Strategy` in its own module, registered there by name:

- :class:`Vmap` (``"vmap"``), :class:`LaxMap` (``"lax_map"``): one device.
- :class:`Pmap` (``"pmap"``), :class:`ShardMap` (``"shard_map"``),
  :class:`JitSharding` (``"jit"``, ``jax.jit`` in/out shardings, a ``shard_map`` inside): many devices.

In the default reproducible mode every strategy gives bitwise identical
results for any device count (the contract is in :class:`Strategy`'s
docstring; see also :mod:`shardvi.parallel.reproducible`). Also:
:func:`collectives` (count all-reduce / all-gather ops in compiled HLO) and
:func:`initialize_distributed` (multi-process runs), :func:`field_array` /
:func:`field_model` / :func:`process_rows` (grid-shaped data, start positions
and model grids each process builds only its rows of), :func:`slab_fftn` /
:func:`slab_hartley` (FFTs of a grid split into slabs over a mesh axis), and
:class:`GridLayout` / :class:`Slab` (a grid cut into fixed blocks over the
model axis: sums, tables and draws that are bitwise the same on any layout,
:mod:`shardvi.parallel.grid`).
"""

# ruff: noqa: F401 -- the engine imports its helpers from here too; __all__ below is the public part
import importlib

from .._xla_flags import depth_first_cpu_schedule
from .collectives import CollectiveCounts, collectives, count_collectives
from .distributed import DistributedTimeoutError, initialize_distributed, is_distributed, shutdown_distributed
from .field_arrays import field_array, field_model, process_rows
from .grid import GridLayout, Slab
from .jit_sharding import JitSharding
from .lax_map import LaxMap
from .memory import InsufficientMemoryError, memory_limit
from .mesh import SAMPLE_AXIS, check_devices, replicated, sample_mesh, sharded
from .pmap import Pmap
from .reproducible import (
    CPU_COMPILER_OPTIONS,
    REPRODUCIBLE_COMPILER_OPTIONS,
    check_compiler_options,
    engine_compiler_options,
    opaque_constants,
    reproducible_jit,
)
from .shard_map import ShardMap
from .slab import slab_fftn, slab_hartley
from .strategy import (
    REDUCE_MODES,
    Placed,
    Strategy,
    chunked_apply,
    fixed_order_mean,
    get_strategy,
    map_mean,
    place,
    register_strategy,
    strategy_class,
    strategy_names,
)
from .vmap import Vmap

#: the names of the built-in strategies, each registered by its own module (:func:`strategy_names` also lists
#: strategies registered later)
STRATEGY_NAMES = strategy_names()

# the names users need; the other names imported above are the engine's own (importable, not public API);
# plan, Plan and Candidate (the planner, shardvi.vi.planner) are public too, imported on first use (__getattr__)
__all__ = [
    "CPU_COMPILER_OPTIONS",
    "DistributedTimeoutError",
    "InsufficientMemoryError",
    "memory_limit",
    "CollectiveCounts",
    "GridLayout",
    "JitSharding",
    "LaxMap",
    "Pmap",
    "REDUCE_MODES",
    "REPRODUCIBLE_COMPILER_OPTIONS",
    "STRATEGY_NAMES",
    "ShardMap",
    "Slab",
    "Strategy",
    "Vmap",
    "collectives",
    "depth_first_cpu_schedule",
    "field_array",
    "field_model",
    "get_strategy",
    "initialize_distributed",
    "is_distributed",
    "process_rows",
    "register_strategy",
    "reproducible_jit",
    "shutdown_distributed",
    "slab_fftn",
    "slab_hartley",
    "strategy_names",
]


def __getattr__(name: str):
    """The planner (:mod:`shardvi.vi.planner`: it compiles the engine's steps), imported on first use."""
    if name in ("plan", "Plan", "Candidate"):  # like the package's own lazy exports: imported by name
        return getattr(importlib.import_module("shardvi.vi.planner"), name)
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
