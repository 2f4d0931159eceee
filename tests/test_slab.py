"""Distributed FFT / Hartley transforms of a grid split into slabs along its first axis.

Bitwise equality with the one-device transform for 1, 2 and 4 devices (2-D and
3-D grids, with batch axes), agreement with numpy's FFT, and the JVP, VJP and
transpose of the distributed transform (dot tests).
"""

import jax
import jax.extend
import jax.numpy as jnp
import numpy as np
import pytest
from jax.sharding import AxisType, Mesh
from jax.sharding import PartitionSpec as P

from shardvi._jax_compat import fixed_order_arithmetic
from shardvi.models.harmonic import RegularGrid, harmonic_to_position, hartley, position_to_harmonic
from shardvi.parallel import slab_fftn, slab_hartley
from shardvi.parallel.fft import fftn

AX = "m"
EPS = float(np.finfo(np.float64).eps)


def mesh(p):
    return Mesh(np.asarray(jax.devices()[:p]), (AX,), axis_types=(AxisType.Auto,))


def on_slabs(fn, p, split_axis=0, n_in=1):
    """``fn`` applied per device to slabs split along ``split_axis`` over ``p`` devices, jitted."""
    spec = P(*([None] * split_axis + [AX]))
    return jax.jit(jax.shard_map(fn, mesh=mesh(p), in_specs=(spec,) * n_in, out_specs=spec, check_vma=False))


SHAPES = [(16, 12), (12, 20), (8, 12, 6), (4, 8, 10)]


def by_axes(x):
    """The DFT as 1-D FFTs, last axis first: the passes the slab transform splits between devices."""
    for a in reversed(range(x.ndim)):
        x = jnp.fft.fft(x, axis=a)
    return x


@pytest.mark.parametrize("shape", [(48, 60), (32, 30, 18)], ids=str)
def test_fftn_is_the_sequence_of_1d_passes_and_each_line_is_batch_independent(shape):
    """The facts the bitwise equality rests on: XLA:CPU's ``fftn`` == its 1-D passes, last axis first; the
    engine's batched 1-D FFT (padded to full SIMD groups of lines) gives every line the bits it gets in any
    other batch (here: each of 4 slabs; 15 or 7 lines per slab, no multiple of a group)."""
    rng = np.random.default_rng(7)
    x = jnp.asarray(rng.normal(size=shape) + 1j * rng.normal(size=shape))
    assert np.array_equal(np.asarray(jax.jit(jnp.fft.fftn)(x)), np.asarray(jax.jit(by_axes)(x)))
    for axis in (0, 1):
        f = jax.jit(lambda a, ax=axis: fftn(a, (ax,)))
        whole = np.asarray(f(x))
        m = shape[1 - axis] // 4
        for p in range(4):
            part = np.asarray(f(jax.lax.slice_in_dim(x, p * m, (p + 1) * m, axis=1 - axis)))
            assert np.array_equal(part, np.take(whole, range(p * m, (p + 1) * m), axis=1 - axis))


@pytest.mark.parametrize("shape", SHAPES[1:3], ids=str)
def test_one_device_hartley_is_re_plus_im_of_numpys_fft(shape):
    x = np.random.default_rng(0).normal(size=shape)
    y = np.fft.fftn(x)
    h = np.asarray(jax.jit(hartley)(x))
    np.testing.assert_allclose(h, y.real + y.imag, rtol=0, atol=1e-12 * np.abs(y).max())
    # H H = N I
    np.testing.assert_allclose(np.asarray(hartley(h)), x.size * x, rtol=0, atol=1e-11 * x.size)


@pytest.mark.parametrize("shape", SHAPES, ids=str)
def test_slab_hartley_bitwise_equal_to_one_device_for_1_2_4_devices(shape):
    x = jnp.asarray(np.random.default_rng(1).normal(size=shape))
    ref = np.asarray(jax.jit(hartley)(x))
    for p in (1, 2, 4):
        out = np.asarray(on_slabs(lambda a: hartley(a, axis_name=AX), p)(x))
        assert np.array_equal(out, ref), (shape, p, np.abs(out - ref).max())


def test_slab_fftn_forward_and_inverse_match_numpy_and_are_bitwise_across_device_counts():
    rng = np.random.default_rng(2)
    x = jnp.asarray(rng.normal(size=(8, 12, 6)) + 1j * rng.normal(size=(8, 12, 6)))
    for inverse, ref_np in ((False, np.fft.fftn(x)), (True, np.fft.ifftn(x))):
        ref = np.asarray(jax.jit(lambda a, inv=inverse: slab_fftn(a, inverse=inv))(x))
        np.testing.assert_allclose(ref, ref_np, rtol=0, atol=1e-12 * np.abs(ref_np).max())
        for p in (2, 4):
            out = on_slabs(lambda a, inv=inverse: slab_fftn(a, axis_name=AX, inverse=inv), p)(x)
            assert np.array_equal(np.asarray(out), ref), (inverse, p)


def test_batched_slabs_vmap_and_explicit_axes():
    """A batch axis in front (explicit grid ``axes``) and a ``vmap`` over samples inside the map."""
    x = jnp.asarray(np.random.default_rng(3).normal(size=(3, 16, 12)))
    ref = np.asarray(jax.jit(jax.vmap(hartley))(x))
    for p in (2, 4):
        explicit = on_slabs(lambda a: slab_hartley(a, (1, 2), axis_name=AX), p, split_axis=1)(x)
        vmapped = on_slabs(lambda a: jax.vmap(lambda b: hartley(b, axis_name=AX))(a), p, split_axis=1)(x)
        assert np.array_equal(np.asarray(explicit), ref)
        assert np.array_equal(np.asarray(vmapped), ref)


def test_slab_grid_axes_other_than_the_leading_ones():
    """Grid axes (2, 0): axis 2 split, axis 0 the transposition partner; axis 1 a batch."""
    x = jnp.asarray(np.random.default_rng(4).normal(size=(12, 3, 8)))
    ref = np.asarray(jax.jit(lambda a: hartley(a, (2, 0)))(x))
    y = np.fft.fftn(np.asarray(x), axes=(2, 0))
    np.testing.assert_allclose(ref, y.real + y.imag, rtol=0, atol=1e-12 * np.abs(y).max())
    out = on_slabs(lambda a: hartley(a, (2, 0), axis_name=AX), 4, split_axis=2)(x)
    assert np.array_equal(np.asarray(out), ref)


def _vdot(a, b):
    return float(np.sum(np.asarray(a) * np.asarray(b)))


def test_slab_hartley_moves_real_data_back():
    """The second ``all_to_all`` of the slab Hartley transform (and of its transpose) carries ``Re + Im``
    (real, half the bytes of the complex transform); the first carries the complex partial transform."""
    x = jnp.asarray(np.random.default_rng(2).normal(size=(8, 12)))

    def exchanged(fn):
        jaxpr = jax.make_jaxpr(jax.shard_map(fn, mesh=mesh(4), in_specs=P(AX), out_specs=P(AX), check_vma=False))(x)
        found = []

        def walk(jx):
            found.extend(str(e.invars[0].aval.dtype) for e in jx.eqns if e.primitive.name == "all_to_all")
            for sub in jax.extend.core.subjaxprs(jx):  # the shard_map's body
                walk(sub)

        walk(jaxpr.jaxpr)
        return found

    assert exchanged(lambda a: slab_hartley(a, axis_name=AX)) == ["complex128", "float64"]
    transposed = exchanged(lambda b: jax.linear_transpose(lambda a: slab_hartley(a, axis_name=AX), b)(b)[0])
    assert transposed == ["float64", "complex128"], transposed


@pytest.mark.parametrize("p", [2, 4])
def test_slab_hartley_jvp_vjp_and_transpose(p):
    """Linear: the JVP is the transform of the tangent; the transform is symmetric, so its VJP and its
    ``linear_transpose`` are the transform itself (dot test ``<H x, y> == <x, H^T y>``)."""
    rng = np.random.default_rng(5)
    shape = (8, 12, 6)
    x, t, y = (jnp.asarray(rng.normal(size=shape)) for _ in range(3))
    H = lambda a: slab_hartley(a, axis_name=AX)  # noqa: E731

    jvp = on_slabs(lambda a, b: jax.jvp(H, (a,), (b,))[1], p, n_in=2)(x, t)
    vjp = on_slabs(lambda a, b: jax.vjp(H, a)[1](b)[0], p, n_in=2)(x, y)
    transpose = on_slabs(lambda b: jax.linear_transpose(H, b)(b)[0], p)(y)
    Hx, Ht, Hy = (np.asarray(jax.jit(hartley)(v)) for v in (x, t, y))
    scale = np.abs(Hy).max()
    np.testing.assert_allclose(np.asarray(jvp), Ht, rtol=0, atol=1e-12 * scale)
    np.testing.assert_allclose(np.asarray(vjp), Hy, rtol=0, atol=1e-12 * scale)
    np.testing.assert_allclose(np.asarray(transpose), Hy, rtol=0, atol=1e-12 * scale)
    lhs, rhs = _vdot(Hx, y), _vdot(x, transpose)
    assert abs(lhs - rhs) <= 1e-12 * np.sqrt(x.size) * scale * np.abs(np.asarray(x)).max()
    # the gradient of a nonlinear function of the distributed transform, against the one-device one
    loss = lambda a, ax=None: jnp.sum(jnp.sin(slab_hartley(a, axis_name=ax)) ** 2)  # noqa: E731
    g_ref = np.asarray(jax.jit(jax.grad(loss))(x))
    g = on_slabs(jax.grad(lambda a: loss(a, AX)), p)(x)
    np.testing.assert_allclose(np.asarray(g), g_ref, rtol=0, atol=1e-12 * np.abs(g_ref).max())


def test_volume_factor_transforms_on_slabs():
    grid = RegularGrid((16, 12), distances=(0.5, 0.25))
    s = jnp.asarray(np.random.default_rng(6).normal(size=grid.shape))
    S_ref = np.asarray(jax.jit(lambda a: position_to_harmonic(a, grid))(s))
    S = on_slabs(lambda a: position_to_harmonic(a, grid, axis_name=AX), 4)(s)
    back = on_slabs(lambda a: harmonic_to_position(a, grid, axis_name=AX), 4)(S)
    assert np.array_equal(np.asarray(S), S_ref)
    np.testing.assert_allclose(np.asarray(back), np.asarray(s), rtol=0, atol=1e-12)


def test_bad_slab_input_raises_clear_errors():
    x = jnp.ones((8, 6))
    with pytest.raises(ValueError, match="not divisible by the 4 devices"):
        on_slabs(lambda a: hartley(a, axis_name=AX), 4)(x)
    with pytest.raises(ValueError, match="needs at least 2 grid axes"):
        on_slabs(lambda a: slab_hartley(a, axis_name=AX), 2)(jnp.ones(8))
    with pytest.raises(ValueError, match="is not a mesh axis being mapped over here"):
        slab_hartley(x, axis_name="nope")
    with pytest.raises(ValueError, match="does not match grid shape"):
        on_slabs(lambda a: position_to_harmonic(a, RegularGrid((16, 6)), axis_name=AX), 2)(x)
    with pytest.raises(TypeError, match="real array"):
        slab_hartley(jnp.ones((4, 4), jnp.complex128))
    with pytest.raises(ValueError, match="distinct"):
        slab_hartley(x, (0, 0))
    with pytest.raises(TypeError, match="sequence of ints"):
        slab_hartley(x, "01")


# ------------------------------------------------------------------ the FFT with a partitioning rule (jit, GSPMD)
def _sharded(x, spec):
    return jax.device_put(x, jax.sharding.NamedSharding(mesh(4), spec))


def test_partitioned_fft_stays_split_over_the_batch_under_jit():
    from shardvi._jax_compat import plain_fft_gathers_batch

    rng = np.random.default_rng(8)
    x = jnp.asarray(rng.normal(size=(8, 16, 12)) + 1j * rng.normal(size=(8, 16, 12)))
    ref = np.asarray(jax.jit(lambda a: jnp.fft.fftn(a, axes=(1, 2)))(x))
    xs = _sharded(x, P(AX))
    twice = lambda a, f: f(f(a) / 192.0) / 192.0  # noqa: E731
    cases = (
        (jax.jit(lambda a: fftn(a, (1, 2))), lambda a: jnp.fft.fftn(a, axes=(1, 2))),
        (jax.jit(jax.vmap(fftn, spmd_axis_name=AX)), jax.vmap(jnp.fft.fftn)),
        # in a loop (the partitioner hands the rule a GSPMD sharding there)
        (
            jax.jit(lambda a: jax.lax.fori_loop(0, 2, lambda i, b: jax.vmap(fftn)(b) / 192.0, a)),
            lambda a: twice(a, jax.vmap(jnp.fft.fftn)),
        ),
    )
    for f, reference in cases:
        out = f(xs)
        assert "all-gather" not in f.lower(xs).compile().as_text()  # each device its own 2 fields
        assert np.array_equal(np.asarray(out), np.asarray(jax.jit(reference)(x)))
        assert out.sharding.spec[0] == AX
    # a plain jnp.fft is gathered by the XLA of jax 0.10.2 (the reason for the rule), not by jax 0.12's
    plain = jax.jit(lambda a: jnp.fft.fftn(a, axes=(1, 2)))
    assert ("all-gather" in plain.lower(xs).compile().as_text()) == plain_fft_gathers_batch()
    assert np.array_equal(np.asarray(plain(xs)), ref)
    # split along a transformed axis: gathered there (correct, not fast)
    assert np.array_equal(np.asarray(jax.jit(lambda a: fftn(a, (1, 2)))(_sharded(x, P(None, AX)))), ref)


def test_partitioned_fft_derivatives_and_errors():
    rng = np.random.default_rng(9)
    x, t = (jnp.asarray(rng.normal(size=(4, 8, 6)) + 1j * rng.normal(size=(4, 8, 6))) for _ in range(2))
    plain = lambda a: jnp.fft.fftn(a, axes=(1, 2))  # noqa: E731
    ours = lambda a: fftn(a, (1, 2))  # noqa: E731
    assert np.array_equal(np.asarray(jax.jvp(ours, (x,), (t,))[1]), np.asarray(jax.jvp(plain, (x,), (t,))[1]))
    assert np.array_equal(np.asarray(jax.vjp(ours, x)[1](t)[0]), np.asarray(jax.vjp(plain, x)[1](t)[0]))
    assert np.array_equal(
        np.asarray(jax.linear_transpose(ours, x)(t)[0]), np.asarray(jax.linear_transpose(plain, x)(t)[0])
    )
    loss = lambda f: lambda a: jnp.sum(jnp.abs(jax.vmap(f)(a)) ** 2)  # noqa: E731
    # a batch split over devices under jit: each device transforms its own grids (the forward pass bitwise; where
    # FFT batches are padded, jax >= 0.12, the gradient's elementwise parts of this plain jit are fused differently
    # around the padded per-device FFT: the last bits)
    f = jax.jit(jax.vmap(lambda a: fftn(a)))
    np.testing.assert_array_equal(np.asarray(f(_sharded(x, P(AX)))), np.asarray(jax.vmap(jnp.fft.fftn)(x)))
    g = np.asarray(jax.jit(jax.grad(loss(lambda a: fftn(a))))(_sharded(x, P(AX))))
    g_ref = np.asarray(jax.grad(loss(jnp.fft.fftn))(x))
    if fixed_order_arithmetic():
        np.testing.assert_allclose(g, g_ref, rtol=0, atol=4 * EPS * np.abs(g_ref).max())
    else:
        np.testing.assert_array_equal(g, g_ref)
    with pytest.raises(TypeError, match="complex array"):
        fftn(jnp.ones((4, 4)))
    z = jnp.ones((4, 4), jnp.complex128)
    with pytest.raises(ValueError, match="out of range"):
        fftn(z, (2,))
    with pytest.raises(ValueError, match="distinct"):
        fftn(z, (1, -1))
    with pytest.raises(TypeError, match="sequence of ints"):
        fftn(z, "01")


@pytest.mark.parametrize("shape", [(16, 12), (8, 12, 6)], ids=str)
def test_partitioned_fft_of_a_slab_split_field_under_jit_uses_the_slab_transform(shape):
    """A field split along its first axis (a model axis) under plain ``jit``: transformed in place by the slab
    algorithm (``all_to_all``, no all-gather), bitwise the one-device transform; the Hartley transform too."""
    rng = np.random.default_rng(10)
    x = jnp.asarray(rng.normal(size=shape))
    xs = _sharded(x, P(AX))
    ref = np.asarray(jax.jit(hartley)(x))
    f = jax.jit(hartley)
    out = f(xs)
    text = f.lower(xs).compile().as_text()
    assert "all-to-all" in text and "all-gather" not in text
    assert np.array_equal(np.asarray(out), ref)
    assert out.sharding.spec[0] == AX
    # the gradient of a nonlinear function of it, against one device
    loss = lambda a: jnp.sum(jnp.sin(hartley(a)) ** 2)  # noqa: E731
    g_ref = np.asarray(jax.jit(jax.grad(loss))(x))
    np.testing.assert_allclose(np.asarray(jax.jit(jax.grad(loss))(xs)), g_ref, rtol=0, atol=1e-12 * np.abs(g_ref).max())
    # the second axis not divisible by the devices: gathered, still correct
    y = jnp.asarray(rng.normal(size=(8, 6)))
    np.testing.assert_array_equal(np.asarray(jax.jit(hartley)(_sharded(y, P(AX)))), np.asarray(jax.jit(hartley)(y)))
