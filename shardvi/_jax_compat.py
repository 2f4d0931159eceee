"""What shardvi assumes about JAX's internals and about the XLA each JAX version ships, in one module.

Every use of ``jax._src`` in the package is here, and so is every fact that differs between the
supported JAX versions (:data:`SUPPORTED_JAX_VERSIONS`: 0.10.2 on Python 3.11, the newest for
Python 3.12). ``tests/test_jax_compat.py`` checks each function on the running version and fails
(an error, never a warning) where an assumption no longer holds.

Three groups:

- building jaxpr equations (:mod:`shardvi.parallel.reproducible`'s rewrite) through the public
  ``jax.extend.core``; what is not public there (the optimization-barrier and ``pvary`` primitives,
  the parameters a primitive binds with) is taken from a traced template, never hard-coded;
- the ``jax._src`` services: the set of primitives that need the devices while lowering, the
  monitoring listeners (for tests);
- XLA facts of a version: whether a batch-sharded plain ``jnp.fft.fftn`` under ``jit`` is gathered.
"""

from __future__ import annotations

import functools
import re

import jax
import jax.extend.core as jex
import numpy as np
from jax.core import ShapedArray

__all__ = [
    "CLOSED_JAXPR_IS_JAXPR",
    "SUPPORTED_JAX_VERSIONS",
    "closed_jaxpr_map",
    "event_listener_counts",
    "fixed_order_arithmetic",
    "guard_products",
    "jax_version",
    "new_eqn",
    "plain_fft_gathers_batch",
    "primitive",
    "require_devices_during_lowering",
    "shaped_array",
    "varying_axes",
]

#: JAX versions whose internals this module is written and tested for (``tests/test_jax_compat.py``)
SUPPORTED_JAX_VERSIONS = ("0.10.2", "0.11.2", "0.12.0.1")


def jax_version(version: str | None = None) -> tuple[int, ...]:
    """``jax.__version__`` (or ``version``) as a tuple of ints, e.g. ``(0, 12, 0, 1)``; a suffix is dropped."""
    text = jax.__version__ if version is None else version
    return tuple(int(p) for p in re.findall(r"\d+", text.split("+")[0].split("dev")[0])[:4])


# ---------------------------------------------------------------------------------------------- jaxprs
#: jax >= 0.11: ``ClosedJaxpr`` is the class ``Jaxpr`` (a jaxpr carries its constants); jax 0.10.2: a wrapper
#: ``ClosedJaxpr(jaxpr, consts)``
CLOSED_JAXPR_IS_JAXPR = jex.ClosedJaxpr is jex.Jaxpr


def closed_jaxpr_map(value, rewrite):
    """``rewrite`` (``Jaxpr -> Jaxpr``) applied to a jaxpr held in an equation's parameter; ``None`` if it is none.

    A closed jaxpr keeps its constants: on jax 0.10.2 ``ClosedJaxpr(rewrite(value.jaxpr), value.consts)``;
    on jax >= 0.11 the jaxpr itself carries them and ``rewrite`` keeps them (``Jaxpr.replace``).
    """
    if not CLOSED_JAXPR_IS_JAXPR and isinstance(value, jex.ClosedJaxpr):
        return jex.ClosedJaxpr(rewrite(value.jaxpr), value.consts)
    if isinstance(value, jex.Jaxpr):
        return rewrite(value)
    return None


def shaped_array(shape, dtype) -> ShapedArray:
    """The abstract value of an array (no sharding, not weakly typed)."""
    return ShapedArray(tuple(shape), np.dtype(dtype))


def new_eqn(invars, outvars, prim, params):
    """A jaxpr equation without effects (``jax.extend.core.new_jaxpr_eqn``)."""
    return jex.new_jaxpr_eqn(list(invars), list(outvars), prim, dict(params), jex.no_effects)


def _single_eqn(jaxpr, name: str):
    eqns = [e for e in jaxpr.eqns if e.primitive.name == name]
    if len(eqns) != 1:
        raise AssertionError(f"tracing a template for {name!r} gave {[e.primitive.name for e in jaxpr.eqns]}")
    return eqns[0]


@functools.cache
def primitive(name: str):
    """``(primitive, params)`` of ``name`` as ``jax.lax`` binds it on the running version (traced once).

    ``name``: ``"mul"``, ``"div"``, ``"rsqrt"``, ``"broadcast_in_dim"``, ``"optimization_barrier"``
    (``jax.lax.optimization_barrier``) or ``"pvary"`` (what ``jax.lax.pcast(..., to="varying")``
    binds inside a ``shard_map``: JAX's own primitive object). The parameters are those of a float32
    template: shapes and axes are the caller's to replace (``broadcast_in_dim``: ``shape``,
    ``broadcast_dimensions``; ``pvary``: ``axes``).
    """
    x = jax.ShapeDtypeStruct((2,), np.float32)
    s = jax.ShapeDtypeStruct((), np.float32)
    lax = jax.lax
    if name == "pvary":
        # not traced from a template: that needs a shard_map of its own, which cannot be traced inside another
        # shard_map (the engine's rewrite runs there); tests/test_jax_compat.py checks that a pcast binds it
        from jax._src import core

        return core.pvary_p, {"axes": ()}
    templates = {
        "mul": (lax.mul, (x, x)),
        "div": (lax.div, (x, x)),
        "rsqrt": (lax.rsqrt, (x,)),
        "broadcast_in_dim": (lambda v: lax.broadcast_in_dim(v, (2,), ()), (s,)),
        "optimization_barrier": (lax.optimization_barrier, (x,)),
    }
    if name not in templates:
        raise ValueError(f"no template for primitive {name!r}")
    fn, args = templates[name]
    eqn = _single_eqn(jax.make_jaxpr(fn)(*args).jaxpr, name)
    if name == "broadcast_in_dim" and not {"shape", "broadcast_dimensions"} <= set(eqn.params):
        raise AssertionError(f"broadcast_in_dim binds with {sorted(eqn.params)}")
    return eqn.primitive, dict(eqn.params)


def varying_axes(aval) -> tuple:
    """Manual mesh axes an abstract value varies over (``shard_map`` with ``check_vma=True``), else ``()``."""
    mat = getattr(aval, "mat", None)
    return tuple(sorted(getattr(mat, "varying", ()) or ()))


# ---------------------------------------------------------------------------------------------- jax._src
def require_devices_during_lowering(prim) -> None:
    """Register ``prim`` as a primitive that needs the devices while lowering (as jax's cuDNN attention does):
    its lowering is a ``custom_partitioning`` rule that looks at the mesh."""
    from jax._src import dispatch

    dispatch.prim_requires_devices_during_lowering.add(prim)


def event_listener_counts() -> tuple[int, int]:
    """The numbers of ``jax.monitoring`` duration listeners and event listeners registered (for tests)."""
    from jax._src import monitoring

    return len(monitoring.get_event_duration_listeners()), len(monitoring.get_event_listeners())


# ---------------------------------------------------------------------------------------------- XLA facts
def guard_products(version: str | None = None) -> bool:
    """Whether the reproducibility rewrite guards products against fused multiply-adds (see
    :data:`shardvi.parallel.reproducible._PRODUCTS`): on jax >= 0.11, whose XLA:CPU has only its fusion
    emitters (no ``xla_cpu_use_fusion_emitters``) and compiles small while loops as one function. On jax
    0.10.2, where the engine compiles with the classic emitters, the guards change XLA's fusion decisions
    and break the bitwise equality they would protect (its constants are compiled into the kernels)."""
    return jax_version(version) >= (0, 11)


def fixed_order_arithmetic(version: str | None = None) -> bool:
    """Whether the engine writes out the order of its sums and pads its FFT batches (jax >= 0.12).

    XLA:CPU of jax 0.12 vectorizes the same reduction differently in a single-device and an SPMD
    program, and computes a batch of 1-D FFTs in SIMD groups of lines with the lines left over one
    by one (other roundings): there the solvers' inner products are pairwise sums written out as
    additions (:func:`shardvi.tree_math.pairwise_sum`) and every batch of FFT lines is padded to
    full groups (:data:`shardvi.parallel.fft.SIMD_LINES`). The XLA of jax 0.10.2 and 0.11.2 does
    neither, and its programs keep their bits with XLA's own reductions and FFTs.
    """
    return jax_version(version) >= (0, 12)


def plain_fft_gathers_batch(version: str | None = None) -> bool:
    """Whether the XLA of this JAX gathers a batch-sharded plain ``jnp.fft.fftn`` under ``jit`` (GSPMD has no
    FFT rule there): jax 0.10.2 and 0.11.2 yes, jax 0.12 no."""
    return jax_version(version) < (0, 12)
