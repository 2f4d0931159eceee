"""Bitwise reproducibility across device counts: programs XLA compiles to the same arithmetic.

A strategy computes the same per-sample values in a single-device program
(``vmap``) and in the per-device part of an SPMD program (``shard_map``,
``pmap``, GSPMD ``jit``). XLA optimizes those programs differently, and two
kinds of rewrites change floating-point results:

1. Constant folding and reassociation (:func:`opaque_constants`). XLA's
algebraic simplifier rewrites arithmetic on compile-time constants, e.g.
``(x * c1) * c2 -> x * (c1 * c2)``, and hoists and folds constant
subexpressions out of loops. Whether a rewrite fires depends on the
surrounding program, so the same per-sample math differs in the last bits
between programs — and the per-sample solvers amplify that to ~1e-9. Passing
every floating-point constant (model data, noise, masks, literals such as
``0.8`` in ``0.8 * x``) through ``lax.optimization_barrier`` keeps XLA from
treating it as a constant during simplification; the arithmetic is then
evaluated as written, identically in every program.

The rewrite works on the jaxpr, recursively into the jaxprs of control flow
(``while``, ``cond``, ``scan``, nested ``jit``, ``shard_map``, custom
derivatives' primal jaxprs). It changes no values: a barrier is the identity.

2. Rewrites that depend on common-subexpression elimination. The SPMD
pipeline runs CSE before the main simplification, the single-device one
after; heuristics such as ``A / broadcast(b) -> A * broadcast(1 / b)`` fire
only when ``b`` has a single user, so the same HLO ends up with a division
in one program and a multiplication by a reciprocal in the other.
:data:`REPRODUCIBLE_COMPILER_OPTIONS` disables XLA's CSE pass for the
compiled engine steps. The same rewrite also fires in SPMD programs when the
divisor is an array-wide broadcast of a scalar computed in the program (the
correlated field's normalizations, ``t / t[-1]``); :func:`opaque_constants`
therefore writes every division by a scalar, ``x / scalar``, as
``x * (1 / scalar)`` itself, so that no program has a division left for XLA
to rewrite. That includes ``scalar / scalar``: a program that maps the
per-sample code over a batch axis turns a per-sample ``scalar / 3.0`` into an
``array / scalar``. Likewise ``x / sqrt(y)`` is written ``x * rsqrt(y)``, the
form XLA's simplifier gives it in some programs and not in others.

3. Fused multiply-adds (jax >= 0.11). LLVM contracts a multiplication and an
addition into one FMA wherever both land in the same kernel; with XLA:CPU's
fusion emitters (the only ones from jax 0.11 on) and its compilation of small
while loops as one function, which pairs share a kernel differs between a
single-device and an SPMD program. :func:`opaque_constants` therefore writes
each product that may reach an addition as ``(x * 0.5) * 2`` with opaque
constants, whose contraction with the addition is exact (see ``_PRODUCTS``
below). On jax 0.10.2, whose classic emitters the engine selects, this is
not needed and not done.

4. Reductions and batched FFTs (jax >= 0.12). XLA:CPU vectorizes the same
reduction differently in a single-device and an SPMD program, and computes a
batch of 1-D FFTs in SIMD groups of lines with the lines left over one by
one (other roundings). Neither is a rewrite of the jaxpr: the engine writes
its solvers' inner products and sums as pairwise additions
(:func:`shardvi.tree_math.pairwise_sum`) and pads every batch of FFT lines to
full groups (:data:`shardvi.parallel.fft.SIMD_LINES`), on the XLA that needs it
(:func:`shardvi._jax_compat.fixed_order_arithmetic`).

The jaxpr surgery goes through :mod:`shardvi._jax_compat`, the one module that
knows the jaxpr structures of the supported jax versions.

:func:`reproducible_jit` combines these; :class:`~shardvi.OptimizeVI` compiles
its sampling and KL steps with it (for every strategy: in the fast mode
``reduce="psum"`` the cross-device sums are then the only difference). The
remaining ingredients live in :func:`~shardvi.parallel.chunked_apply`: fixed
chunk shapes, a loop trip count hidden from XLA and a spare chunk (so a
one-chunk loop is not inlined into its context). Verified for the jax versions
of :data:`TESTED_JAX_VERSIONS` on XLA:CPU (``tests/test_parallel_reproducible.py``
and the other bitwise tests); another XLA version may need other measures. Cost:
XLA's CSE is off and constants are not folded in these steps (measured in
``BENCHMARKS.md``: no measurable cost in compile or run time).
"""

from __future__ import annotations

import collections.abc
import functools
import inspect
import types
import warnings

import jax
import jax.core
import jax.extend.core as jex
import jax.numpy as jnp
import numpy as np
from jax import tree_util as jtu

from .. import _jax_compat as compat

__all__ = [
    "CPU_COMPILER_OPTIONS",
    "REPRODUCIBLE_COMPILER_OPTIONS",
    "TESTED_JAX_VERSIONS",
    "ReproducibilityWarning",
    "check_compiler_options",
    "check_jax_version",
    "engine_compiler_options",
    "engine_options_key",
    "option_supported",
    "opaque_constants",
    "opaque_per_sample",
    "reproducible_jit",
]

#: jax versions on which the bitwise tests (equal results across device counts and strategies) pass; also in
#: pyproject.toml (``[tool.shardvi] bitwise-tested-jax``) and the README
TESTED_JAX_VERSIONS = ("0.10.2", "0.11.2", "0.12.0.1")


class ReproducibilityWarning(RuntimeWarning):
    """Bitwise equality across device counts is not guaranteed (untested jax, a rewrite that failed)."""


_warned_version = []


def check_jax_version(version: str | None = None) -> bool:
    """Warn once per process (:class:`ReproducibilityWarning`) if jax is not a bitwise-tested version.

    Called at the first compilation of an engine step. Returns whether
    ``version`` (default: the running ``jax.__version__``) is in
    :data:`TESTED_JAX_VERSIONS`. Results stay correct on other versions;
    only their bitwise equality across device counts is unverified.
    """
    version = jax.__version__ if version is None else version
    tested = version in TESTED_JAX_VERSIONS
    if not tested and version not in _warned_version:
        _warned_version.append(version)
        warnings.warn(
            f"shardvi: jax {version} is not among the versions its bitwise tests pass on "
            f"{TESTED_JAX_VERSIONS}: results are correct, but bitwise equality across device counts and "
            f"strategies is unverified (XLA may optimize the per-device programs differently). Run "
            f"tests/test_parallel_reproducible.py to check this installation.",
            ReproducibilityWarning,
            stacklevel=3,
        )
    return tested


#: XLA options of the engine steps (read-only; extend them per run with ``optimize_kl(..., compiler_options=...)``):
#: CSE off (bitwise reproducibility, see the module docstring) and XLA:CPU's classic loop emitters instead of
#: its MLIR fusion emitters, which need far more memory to compile these programs for slightly faster
#: iterations (``BENCHMARKS.md``, "Compile time").
#: The ``xla_cpu_`` option has no effect on other platforms. An option the running XLA does not know (jax 0.11's
#: XLA has no ``xla_cpu_use_fusion_emitters``) is left out of the engine's options, see
#: :func:`engine_compiler_options`.
REPRODUCIBLE_COMPILER_OPTIONS = types.MappingProxyType(
    {"xla_disable_hlo_passes": "cse", "xla_cpu_use_fusion_emitters": False}
)

#: XLA options of the engine steps on CPU only (read-only): LLVM optimization level 1 instead of 3 for the
#: machine code. The engine's programs are large (every Newton-CG and CG loop inlines the model, its
#: linearization and transpose), so LLVM's O3 pipeline is most of their compile time; O1 compiles them
#: faster and they run as fast within the noise (their time is in FFTs and memory-bound loops; measured in
#: ``BENCHMARKS.md``, "Compile time").
#: Restore O3 with ``compiler_options={"xla_backend_optimization_level": 3}`` (long runs on large grids).
#: Also XLA's while-loop-invariant code motion off (with CSE, as in :data:`REPRODUCIBLE_COMPILER_OPTIONS`):
#: the solvers' loops hold little invariant work (linearizations are computed before them), and the pass,
#: which runs a dozen times per program, costs compile time for no speed (``BENCHMARKS.md``, "Compile time").
CPU_COMPILER_OPTIONS = types.MappingProxyType(
    {"xla_backend_optimization_level": 1, "xla_disable_hlo_passes": "cse,while-loop-invariant-code-motion"}
)


@functools.cache
def option_supported(name: str, value, platform: str) -> bool:
    """Whether the running XLA accepts the compile option ``name=value`` for ``platform`` (cached per process).

    XLA rejects an option that is not a field of its ``DebugOptions`` ("No such compile option"), and those
    fields change between XLA versions (jax 0.11's XLA has no ``xla_cpu_use_fusion_emitters``). Checked by
    compiling a one-line program on the platform's first device.
    """
    x = jax.device_put(np.float32(0), jax.devices(platform)[0])
    try:
        jax.jit(lambda v: v + 1, compiler_options={name: value}).lower(x).compile()
    except Exception:  # noqa: BLE001 -- XLA's INVALID_ARGUMENT (jax.errors.JaxRuntimeError)
        return False
    return True


def engine_compiler_options(extra=None, platform: str | None = None) -> dict:
    """The XLA options of the engine steps on ``platform`` (default: ``jax.default_backend()``).

    :data:`REPRODUCIBLE_COMPILER_OPTIONS`, on ``"cpu"`` also :data:`CPU_COMPILER_OPTIONS`, less any of these
    defaults the running XLA does not know for ``platform`` (:func:`option_supported`), and ``extra`` (a
    mapping, or ``None``; validated by :func:`check_compiler_options`, never dropped) merged over them.
    """
    platform = jax.default_backend() if platform is None else platform
    cpu = CPU_COMPILER_OPTIONS if platform == "cpu" else {}
    defaults = {k: v for k, v in {**REPRODUCIBLE_COMPILER_OPTIONS, **cpu}.items() if option_supported(k, v, platform)}
    return {**defaults, **(extra or {})}


def engine_options_key(platform: str | None = None) -> tuple:
    """:func:`engine_compiler_options` as a hashable key: reuse a compiled step only under the same options."""
    return tuple(sorted((k, str(v)) for k, v in engine_compiler_options(None, platform).items()))


def check_compiler_options(options, argname: str = "compiler_options") -> dict:
    """Validate extra XLA options for the engine steps; return them as a new dict.

    Parameters
    ----------
    options : mapping of str to bool, int, float or str, or None
        XLA ``DebugOptions`` fields (e.g. ``{"xla_cpu_use_fusion_emitters": True}``), merged over
        :data:`REPRODUCIBLE_COMPILER_OPTIONS`. ``None`` means none.
    argname : str
        Name used in error messages.

    Raises
    ------
    TypeError
        ``options`` is not a mapping of option names to scalars.
    ValueError
        XLA rejects an option name or value (checked by compiling a one-line program).
    """
    if options is None:
        return {}
    if not isinstance(options, collections.abc.Mapping):
        raise TypeError(f"{argname} must be a dict of XLA option names to values, got {type(options).__name__}")
    out = {}
    for name, value in options.items():
        if not isinstance(name, str):
            raise TypeError(f"{argname} keys must be XLA option names (str), got {name!r}")
        if isinstance(value, (np.bool_, np.integer, np.floating)):
            value = value.item()
        if not isinstance(value, (bool, int, float, str)):
            raise TypeError(f"{argname}[{name!r}] must be a bool, int, float or str, got {type(value).__name__}")
        out[name] = value
    if out:
        try:
            jax.jit(lambda x: x + 1, compiler_options=engine_compiler_options(out)).lower(np.float32(0)).compile()
        except Exception as err:  # noqa: BLE001 -- XLA's INVALID_ARGUMENT (jax.errors.JaxRuntimeError)
            raise ValueError(f"{argname} rejected by XLA: {str(err).splitlines()[0]}") from None
    return out


def _inexact(aval) -> bool:
    dtype = getattr(aval, "dtype", None)
    return dtype is not None and jnp.issubdtype(dtype, jnp.inexact)


def _guarded_dtype(aval) -> bool:
    return getattr(aval, "dtype", None) in (np.float32, np.float64)


def _eqn(name, invars, outvars, **params):
    prim, template = compat.primitive(name)
    return compat.new_eqn(invars, outvars, prim, {**template, **params})


def _barrier_eqn(invar, aval):
    out = jex.Var(aval)
    return out, _eqn("optimization_barrier", [invar], [out])


def _rewrite_param(value):
    rewritten = compat.closed_jaxpr_map(value, _rewrite_jaxpr)
    if rewritten is not None:
        return rewritten
    if type(value) is tuple:  # exactly tuple: not NamedTuples (e.g. a PRNG implementation)
        return tuple(_rewrite_param(v) for v in value)
    if type(value) is list:
        return [_rewrite_param(v) for v in value]
    return value


class _Ones:
    """Opaque constants of one jaxpr, per value, dtype and varying axes: a literal behind an optimization
    barrier (and a ``pvary`` inside a ``shard_map`` with ``check_vma=True``), created where first needed."""

    def __init__(self, eqns):
        self.eqns = eqns
        self.vars = {}

    def __call__(self, dtype, axes=(), value=1.0):
        key = (np.dtype(dtype), axes, value)
        if key not in self.vars:
            lit = jex.Literal(np.asarray(value, dtype)[()], compat.shaped_array((), dtype))
            one, eqn = _barrier_eqn(lit, lit.aval)
            self.eqns.append(eqn)
            if axes:
                varying = jex.Var(compat.shaped_array((), dtype))
                self.eqns.append(_eqn("pvary", [one], [varying], axes=axes))
                one = varying
            self.vars[key] = one
        return self.vars[key]


def _scale(var, ones, value):
    """Eqns for ``var * value`` (``value`` an opaque constant); the new var."""
    aval = var.aval
    c = ones(aval.dtype, compat.varying_axes(aval), value)
    eqns = []
    if aval.shape:
        b = jex.Var(aval)
        eqns.append(_eqn("broadcast_in_dim", [c], [b], shape=tuple(aval.shape), broadcast_dimensions=()))
        c = b
    out = jex.Var(aval)
    return [*eqns, _eqn("mul", [var, c], [out])], out


def _guard(var, ones):
    """Eqns for ``(var * 0.5) * 2`` (opaque constants, see :data:`_PRODUCTS`); the new var."""
    half, h = _scale(var, ones, 0.5)
    two, out = _scale(h, ones, 2.0)
    return half + two, out


def _reciprocal_multiply(eqn, a, b, ones):
    """Eqns for ``a * (1 / b)`` replacing ``a / b`` with a scalar ``b`` (same outvar)."""
    recip = jex.Var(b.aval)
    one = ones(b.aval.dtype, compat.varying_axes(b.aval))
    return [_eqn("div", [one, b], [recip]), _eqn("mul", [a, recip], eqn.outvars)]


def _rsqrt_multiply(eqn, a, y):
    """Eqns for ``a * rsqrt(y)`` replacing ``a / sqrt(y)`` (same outvar)."""
    r = jex.Var(y.aval)
    return [_eqn("rsqrt", [y], [r]), _eqn("mul", [a, r], eqn.outvars)]


#: Primitives whose result is a multiplication (``div`` by a scalar and by a square root becomes one here).
#: LLVM contracts a multiplication and an addition that uses it into one fused multiply-add wherever both
#: land in the same kernel. On jax >= 0.11 (XLA:CPU's fusion emitters only, small while loops compiled as
#: one function) which ones do depends on XLA's fusion decisions, which differ between a single-device and
#: an SPMD program and between a program with and without a batch axis of one
#: (``tests/test_parallel_reproducible.py``). There a float32/float64 product that may reach an addition
#: is written ``(x * 0.5) * 2`` with opaque constants: a contraction of ``((x * 0.5) * 2) + y`` is
#: ``x + y`` rounded once, the value of the uncontracted sum, so every program gets the same bits. Not
#: ``x * 1``: LLVM folds a multiplication by a constant one where XLA compiles a loop into one function;
#: ``(x * 0.5) * 2`` it folds nowhere. It is ``x`` for every ``x`` but those in the lowest binade of
#: normal numbers (below ``2 * finfo.tiny``: 4.5e-308, 2.4e-38), which become 0 (XLA:CPU flushes the
#: subnormal ``x * 0.5``). See :func:`shardvi._jax_compat.guard_products`.
_PRODUCTS = frozenset({"mul", "div", "integer_pow", "square", "dot_general"})
#: Consumers that use a value only as a factor, divisor or comparand (never add to it): a product used by
#: these alone needs no guard. Everything else (additions, reductions, the functions XLA expands into
#: polynomials or range reductions that may add to their argument, control flow, outputs) may contract
#: with it.
_FACTOR_USES = frozenset(
    {"mul", "div", "integer_pow", "square", "sqrt", "abs", "sign", "max", "min", "lt", "le", "gt", "ge", "eq",
     "ne", "is_finite", "reduce_max", "reduce_min", "argmax", "argmin", "dot_general"}
)  # fmt: skip
#: Consumers that pass values through unchanged (their users decide)
_PASS_THROUGH = frozenset(
    {"reshape", "squeeze", "expand_dims", "broadcast_in_dim", "transpose", "slice", "dynamic_slice", "rev",
     "concatenate", "pad", "gather", "select_n", "copy", "copy_p", "convert_element_type", "dynamic_update_slice",
     "optimization_barrier"}
)  # fmt: skip


def _products_to_guard(jaxpr) -> set:
    """Outvars of :data:`_PRODUCTS` (real floating) whose value may reach an addition (see there)."""
    users = {}
    for eqn in jaxpr.eqns:
        for x in eqn.invars:
            if not isinstance(x, jex.Literal):
                users.setdefault(x, []).append(eqn)
    outs = {x for x in jaxpr.outvars if not isinstance(x, jex.Literal)}
    memo = {}

    def reaches_addition(v, depth=0) -> bool:
        if v in memo:
            return memo[v]
        memo[v] = False  # (acyclic; a default while recursing)
        hit = v in outs or depth > 64
        for eqn in users.get(v, ()):
            if hit:
                break
            name = eqn.primitive.name
            if name in _PASS_THROUGH:
                hit = any(reaches_addition(o, depth + 1) for o in eqn.outvars)
            elif name not in _FACTOR_USES:
                hit = True
        memo[v] = hit
        return hit

    sqrts = {e.outvars[0] for e in jaxpr.eqns if e.primitive.name == "sqrt"}

    def product(eqn) -> bool:  # a division only where the rewrite makes it a multiplication
        if eqn.primitive.name == "div":
            b = eqn.invars[1]
            return not b.aval.shape or b in sqrts
        return eqn.primitive.name in _PRODUCTS

    return {
        eqn.outvars[0]
        for eqn in jaxpr.eqns
        if product(eqn)
        and len(eqn.outvars) == 1
        and _guarded_dtype(eqn.outvars[0].aval)
        and reaches_addition(eqn.outvars[0])
    }


def _rewrite_jaxpr(jaxpr):
    eqns = []
    ones = _Ones(eqns)
    subst = {}
    sqrt_of = {}  # outvar of a sqrt in this jaxpr -> its operand
    guard = _products_to_guard(jaxpr) if compat.guard_products() else set()
    for v in jaxpr.constvars:
        if _inexact(v.aval):
            nv, eqn = _barrier_eqn(v, v.aval)
            subst[v] = nv
            eqns.append(eqn)
    for eqn in jaxpr.eqns:
        invars = []
        for x in eqn.invars:
            if isinstance(x, jex.Literal):
                if _inexact(x.aval) and eqn.primitive.name != "optimization_barrier":
                    nv, beqn = _barrier_eqn(x, x.aval)
                    eqns.append(beqn)
                    invars.append(nv)
                else:
                    invars.append(x)
            else:
                invars.append(subst.get(x, x))
        params = {k: _rewrite_param(v) for k, v in eqn.params.items()}
        name = eqn.primitive.name
        out = eqn.outvars[0] if len(eqn.outvars) == 1 else None
        if name == "div" and out is not None and _inexact(out.aval) and not invars[1].aval.shape:
            # x / scalar: XLA rewrites A / broadcast(b) into A * broadcast(1 / b) in some programs and
            # not in others (depending on b's users); do it here, the same way everywhere
            eqns.extend(_reciprocal_multiply(eqn, invars[0], invars[1], ones))
        elif name == "div" and out is not None and _inexact(out.aval) and invars[1] in sqrt_of:
            # x / sqrt(y): XLA's simplifier makes it x * rsqrt(y) in some programs (one device) and not in
            # others (a GSPMD-partitioned one); write the rsqrt form here, the same way everywhere
            eqns.extend(_rsqrt_multiply(eqn, invars[0], sqrt_of[invars[1]]))
        else:
            if name == "sqrt" and out is not None and _inexact(out.aval):
                sqrt_of[out] = invars[0]
            eqns.append(eqn.replace(invars=invars, params=params))
        if out is not None and out in guard:
            more, subst[out] = _guard(out, ones)
            eqns.extend(more)
    outvars = [x if isinstance(x, jex.Literal) else subst.get(x, x) for x in jaxpr.outvars]
    return jaxpr.replace(eqns=eqns, outvars=outvars)


def _rewrite(closed):
    """The rewritten jaxpr; where the rewrite cannot be applied, the original one and a warning."""
    try:
        return _rewrite_jaxpr(closed.jaxpr)
    except (AttributeError, TypeError, ValueError, KeyError, AssertionError) as err:  # a changed jaxpr structure
        warnings.warn(
            f"shardvi: the reproducibility rewrite failed on this program ({type(err).__name__}: "
            f"{err}); it compiles unchanged and bitwise equality across device counts is not "
            f"guaranteed (jax {jax.__version__}; tested: {TESTED_JAX_VERSIONS})",
            ReproducibilityWarning,
            stacklevel=4,
        )
        return closed.jaxpr


def opaque_per_sample(one, example):
    """Trace ``one`` (per-sample function) and return ``(consts, run, out_shape)``.

    ``run(consts, *x)`` evaluates the rewritten jaxpr (which puts its
    floating-point constants behind optimization barriers); ``consts`` are
    the captured values (model arrays, broadcast arguments); ``out_shape`` is the output pytree of
    ``jax.ShapeDtypeStruct``.
    """
    closed, out_shape = jax.make_jaxpr(one, return_shape=True)(*example)
    out_tree = jtu.tree_structure(out_shape)
    jaxpr = _rewrite(closed)
    consts = list(closed.consts)

    def run(consts, *x):
        flat = jtu.tree_leaves(x)
        return jtu.tree_unflatten(out_tree, jax.core.eval_jaxpr(jaxpr, list(consts), *flat))

    return consts, run, out_shape


def opaque_constants(fn, static_argnames=()):
    """Wrap ``fn`` so that, when traced, its floating-point constants are opaque to XLA.

    Use it on the whole function that is ``jax.jit``-ed: not only the
    per-sample work but also the code around it (e.g. a Newton-CG loop
    calling the strategy) then compiles to the same arithmetic in a
    single-device and in an SPMD program.

    Parameters
    ----------
    fn : callable
        Function of arrays (pytrees); arguments named in ``static_argnames``
        are passed through untraced (give the same names to ``jax.jit``).
    static_argnames : str or sequence of str
    """
    static = {static_argnames} if isinstance(static_argnames, str) else set(static_argnames)
    sig = inspect.signature(fn)

    @functools.wraps(fn)
    def wrapped(*args, **kwargs):
        check_jax_version()
        bound = sig.bind(*args, **kwargs)
        names = [k for k in bound.arguments if k not in static]
        fixed = {k: v for k, v in bound.arguments.items() if k in static}
        dynamic = [bound.arguments[k] for k in names]

        def call(*dyn):
            return fn(**dict(zip(names, dyn)), **fixed)

        closed, out_shape = jax.make_jaxpr(call, return_shape=True)(*dynamic)
        out = jax.core.eval_jaxpr(_rewrite(closed), list(closed.consts), *jtu.tree_leaves(dynamic))
        return jtu.tree_unflatten(jtu.tree_structure(out_shape), out)

    return wrapped


def reproducible_jit(fn, **jit_kwargs):
    """``jax.jit`` with :func:`opaque_constants` and :data:`REPRODUCIBLE_COMPILER_OPTIONS`.

    Static arguments must be given by name (``static_argnames``); pytrees of
    arrays are the other arguments. ``compiler_options`` (optional) are merged
    over :func:`engine_compiler_options` for ``platform`` (optional, default:
    ``jax.default_backend()``); overriding ``xla_disable_hlo_passes`` gives up
    bitwise reproducibility across device counts.
    """
    options = engine_compiler_options(jit_kwargs.pop("compiler_options", None), jit_kwargs.pop("platform", None))
    return jax.jit(opaque_constants(fn, jit_kwargs.get("static_argnames", ())), compiler_options=options, **jit_kwargs)
