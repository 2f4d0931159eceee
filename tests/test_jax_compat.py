"""``shardvi._jax_compat``: every JAX internal and version-dependent fact shardvi relies on, on the running JAX.

Each test checks one function of the module against what it stands for; a JAX version that changed an
assumption fails here (never a warning). The module's functions are the only place the package reaches
into ``jax._src``.
"""

import re
from pathlib import Path

import jax
import jax.extend.core as jex
import jax.numpy as jnp
import numpy as np
import pytest
from jax.sharding import NamedSharding
from jax.sharding import PartitionSpec as P

from shardvi import _jax_compat as compat
from shardvi.parallel import reproducible

ROOT = Path(__file__).parents[1]


def test_the_running_jax_is_a_supported_version():
    assert jax.__version__ in compat.SUPPORTED_JAX_VERSIONS, (
        f"jax {jax.__version__} is not among {compat.SUPPORTED_JAX_VERSIONS}: run this module and the bitwise "
        f"tests on it, then add it (and its facts below)"
    )
    assert compat.jax_version("0.12.0.1") == (0, 12, 0, 1) and compat.jax_version("0.10.2") == (0, 10, 2)
    assert compat.jax_version("0.11.0.dev20260101") == (0, 11, 0)


def test_jax_src_is_used_in_the_compat_module_only():
    users = []
    for path in sorted((ROOT / "shardvi").rglob("*.py")):
        if path.name == "_jax_compat.py":
            continue
        text = path.read_text()
        if re.search(r"jax\._src|from jax import _src", text):
            users.append(str(path.relative_to(ROOT)))
    assert users == []


# ------------------------------------------------------------------------------------------------ jaxprs
def test_closed_jaxpr_class_and_map():
    closed = jax.make_jaxpr(lambda x: jnp.sin(x) * np.arange(3.0))(jnp.ones(3))
    assert compat.CLOSED_JAXPR_IS_JAXPR == (compat.jax_version() >= (0, 11))
    seen = []

    def rewrite(j):
        seen.append(j)
        return j.replace(eqns=list(j.eqns))

    out = compat.closed_jaxpr_map(closed, rewrite)
    assert len(seen) == 1 and isinstance(seen[0], jex.Jaxpr)
    assert isinstance(out, jex.ClosedJaxpr) and len(out.consts) == len(closed.consts)
    got = jax.core.eval_jaxpr(out.jaxpr, list(out.consts), jnp.ones(3))
    np.testing.assert_array_equal(got[0], jnp.sin(1.0) * np.arange(3.0))
    assert compat.closed_jaxpr_map(closed.jaxpr, rewrite) is not None  # an open jaxpr param
    assert compat.closed_jaxpr_map((1, 2), rewrite) is None


@pytest.mark.parametrize("name", ["mul", "div", "rsqrt", "broadcast_in_dim", "optimization_barrier", "pvary"])
def test_primitive_templates_bind(name):
    prim, params = compat.primitive(name)
    assert prim.name == name
    f32 = compat.shaped_array((), np.float32)
    x = jex.Var(f32)
    if name == "broadcast_in_dim":
        out = jex.Var(compat.shaped_array((3,), np.float32))
        eqn = compat.new_eqn([x], [out], prim, {**params, "shape": (3,), "broadcast_dimensions": ()})
    elif name in ("mul", "div"):
        out = jex.Var(f32)
        eqn = compat.new_eqn([x, x], [out], prim, params)
    else:
        out = jex.Var(f32)
        eqn = compat.new_eqn([x], [out], prim, params)
    if name == "pvary":
        assert params == {"axes": ()}
        return  # bound inside a shard_map only (below)
    jaxpr = jex.Jaxpr([], [x], [out], [eqn])
    got = jax.core.eval_jaxpr(jaxpr, [], np.float32(4.0))[0]
    want = {"mul": 16.0, "div": 1.0, "rsqrt": 0.5, "broadcast_in_dim": [4.0] * 3, "optimization_barrier": 4.0}[name]
    np.testing.assert_array_equal(got, np.asarray(want, np.float32))


def test_pvary_and_varying_axes_in_a_checked_shard_map():
    mesh = jax.make_mesh((2,), ("s",), axis_types=(jax.sharding.AxisType.Auto,), devices=jax.devices()[:2])
    prim, params = compat.primitive("pvary")
    seen = []

    # what jax.lax.pcast(..., to="varying") binds in a checked shard_map is that primitive, with only ``axes``
    def cast(x):
        return x * jax.lax.pcast(jnp.ones((), x.dtype), ("s",), to="varying")

    outer = jax.make_jaxpr(jax.shard_map(cast, mesh=mesh, in_specs=P("s"), out_specs=P("s"), check_vma=True))(
        jnp.ones(4)
    ).jaxpr
    inner = [e for eq in outer.eqns for sub in jex.jaxprs_in_params(eq.params) for e in sub.eqns]
    bound = [e for e in inner if e.primitive is prim]
    assert len(bound) == 1 and set(bound[0].params) == {"axes"}, [e.primitive.name for e in inner]

    # the primitive is found inside another shard_map's trace too (where the engine's rewrite runs)
    def inside(x):
        compat.primitive.cache_clear()
        assert compat.primitive("pvary")[0] is prim
        return x

    jax.shard_map(inside, mesh=mesh, in_specs=P("s"), out_specs=P("s"))(jnp.ones(4))

    def body(x):
        seen.append(compat.varying_axes(jax.typeof(x)))
        one = jnp.ones((), x.dtype)
        assert compat.varying_axes(jax.typeof(one)) == ()
        return x * prim.bind(one, **{**params, "axes": ("s",)})

    f = jax.shard_map(body, mesh=mesh, in_specs=P("s"), out_specs=P("s"), check_vma=True)
    np.testing.assert_array_equal(f(jnp.arange(4.0)), np.arange(4.0))
    assert seen == [("s",)]
    assert compat.varying_axes(jax.typeof(jnp.ones(2))) == ()


def test_the_rewrite_uses_the_templates_under_a_checked_shard_map():
    """The rewrite's opaque constants (division by a scalar, product guards) in per-sample code whose values
    vary over a mesh axis (``ShardMap(check_vma=True)``): bound with ``pvary``, the right values."""
    from shardvi.parallel import ShardMap

    def fn(w, x):
        return (x / jnp.sum(x)) * w + (x * x) * 0.25

    strat = ShardMap(devices=jax.devices()[:2], check_vma=True)
    w = jnp.asarray(1.5)
    xs = jnp.asarray(np.random.default_rng(0).normal(size=(4, 3)))
    got = jax.jit(strat.map(fn, (None, 0)))(*strat.place((w, xs)))
    np.testing.assert_allclose(got, jax.vmap(fn, (None, 0))(w, xs), rtol=1e-14)


# ------------------------------------------------------------------------------------------------ jax._src
def test_require_devices_during_lowering():
    from jax._src import dispatch  # what the compat function registers with

    from shardvi.parallel import fft

    prim = jex.Primitive("shardvi_compat_test")
    compat.require_devices_during_lowering(prim)
    assert prim in dispatch.prim_requires_devices_during_lowering
    assert fft._fft_p in dispatch.prim_requires_devices_during_lowering


def test_event_listener_counts_follow_jax_monitoring():
    before = compat.event_listener_counts()

    def listener(*args, **kwargs):
        pass

    jax.monitoring.register_event_duration_secs_listener(listener)
    try:
        assert compat.event_listener_counts() == (before[0] + 1, before[1])
    finally:
        jax.monitoring.unregister_event_duration_listener(listener)
    assert compat.event_listener_counts() == before


# ------------------------------------------------------------------------------------------------ XLA facts
def test_guard_products_matches_the_emitters_of_this_xla():
    """Products are guarded where XLA:CPU has no classic emitters (jax >= 0.11: the engine's
    ``xla_cpu_use_fusion_emitters=False`` is unknown there)."""
    classic = reproducible.option_supported("xla_cpu_use_fusion_emitters", False, "cpu")
    assert compat.guard_products() == (not classic)
    assert compat.guard_products("0.12.0.1") and not compat.guard_products("0.10.2")


def test_guarded_product_is_exact_and_survives_xla():
    """``(x * 0.5) * 2`` is ``x`` but in the lowest binade of normal numbers, where XLA:CPU flushes ``x * 0.5``
    (subnormal) to zero; XLA keeps both multiplications. float16 products are left alone."""
    f = reproducible.opaque_constants(lambda x, y: x * y + x)
    tiny = np.finfo(np.float64).tiny
    x = np.asarray([1e300, -3.7, 2 * tiny, 1.5 * tiny, 1e-300, np.inf, np.nan])
    y = np.asarray([1e-300, 1.1, 0.5, 1.0, 1e-6, 2.0, 1.0])
    got = np.asarray(jax.jit(f)(x, y))
    want = x * y + x
    if compat.guard_products():
        want[[2, 3]] = x[[2, 3]]  # products in [tiny, 2 tiny) become 0
    np.testing.assert_array_equal(got, want)
    jaxpr = jax.make_jaxpr(f)(x, y)
    muls = [e for e in jaxpr.jaxpr.eqns if e.primitive.name == "mul"]
    assert len(muls) == (3 if compat.guard_products() else 1)
    half = jax.make_jaxpr(f)(x.astype(np.float16), y.astype(np.float16))
    assert len([e for e in half.jaxpr.eqns if e.primitive.name == "mul"]) == 1


def test_fixed_order_arithmetic_matches_xla():
    """Where the engine pads its FFT batches: where this XLA gives a line of a batch of 5 (the fifth, left over
    from a SIMD group) other bits than the same line in a batch of 8 (length 60: every line differs there)."""
    x = jnp.asarray(np.random.default_rng(0).normal(size=(8, 60)) + 0j)
    f = jax.jit(lambda a: jnp.fft.fft(a, axis=1))
    grouped = not np.array_equal(np.asarray(f(x[:5]))[4], np.asarray(f(x))[4])
    assert compat.fixed_order_arithmetic() == grouped
    assert compat.fixed_order_arithmetic("0.12.0.1") and not compat.fixed_order_arithmetic("0.11.2")


def test_plain_fft_gathers_batch_matches_xla():
    """Whether a batch-sharded plain ``jnp.fft.fftn`` under ``jit`` is all-gathered (GSPMD without an FFT rule)."""
    mesh = jax.make_mesh((4,), ("b",), axis_types=(jax.sharding.AxisType.Auto,), devices=jax.devices()[:4])
    x = jax.device_put(jnp.ones((8, 6, 4), jnp.complex128), NamedSharding(mesh, P("b")))
    hlo = jax.jit(lambda a: jnp.fft.fftn(a, axes=(1, 2))).lower(x).compile().as_text()
    assert ("all-gather" in hlo) == compat.plain_fft_gathers_batch()
    assert compat.plain_fft_gathers_batch("0.10.2") and not compat.plain_fft_gathers_batch("0.12.0.1")
