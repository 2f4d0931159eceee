"""Arithmetic whose order is written in the program, so that every program computes the same bits.

The solvers' inner products and the FFTs of the slab transforms must give the same bits in a
single-device and an SPMD program and in any batch. On jax >= 0.12 the inner products are pairwise
sums of additions written out (not XLA reductions, whose order that XLA picks per program), and
every batch of 1-D FFTs is padded to full SIMD groups of lines (it transforms the lines left over
one by one, with other roundings); older XLA keeps these bits with its own reductions and FFTs.
"""

import math

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from shardvi import tree_math as tm
from shardvi._jax_compat import fixed_order_arithmetic
from shardvi.parallel.fft import SIMD_LINES, fftn

EPS = float(np.finfo(np.float64).eps)


def numpy_pairwise(x):
    """The order :func:`shardvi.tree_math.pairwise_sum` promises, in NumPy (one addition at a time)."""
    v = np.ravel(x)
    if v.size == 0:
        return 0.0
    v = np.concatenate([v, np.zeros((1 << (v.size - 1).bit_length()) - v.size, v.dtype)])
    while v.size > 1:
        h = v.size // 2
        v = v[:h] + v[h:]
    return v[0]


@pytest.mark.parametrize("n", [0, 1, 2, 3, 5, 6, 7, 13, 64, 1000, 4099])
def test_pairwise_sum_is_the_written_order_and_the_sum(n):
    x = np.random.default_rng(n).normal(size=n) * 10.0 ** np.random.default_rng(n + 1).uniform(-8, 8, size=n)
    got = float(jax.jit(tm.pairwise_sum)(jnp.asarray(x)))
    assert got == numpy_pairwise(x)  # bitwise: every addition as written
    bound = math.ceil(math.log2(max(n, 2))) * EPS * np.abs(x).sum()
    assert abs(got - math.fsum(x)) <= bound


@pytest.mark.skipif(not fixed_order_arithmetic(), reason="this XLA's own reductions keep their bits")
def test_vdot_and_total_are_pairwise_over_each_leaf_and_left_to_right_over_leaves():
    rng = np.random.default_rng(0)
    a = {"u": jnp.asarray(rng.normal(size=(3, 5))), "v": jnp.asarray(rng.normal(size=7))}
    b = {"u": jnp.asarray(rng.normal(size=(3, 5))), "v": jnp.asarray(rng.normal(size=7))}
    want = numpy_pairwise(np.asarray(a["u"]) * np.asarray(b["u"])) + numpy_pairwise(np.asarray(a["v"] * b["v"]))
    assert float(jax.jit(tm.vdot)(a, b)) == want
    assert float(jax.jit(tm.total)(a)) == numpy_pairwise(np.asarray(a["u"])) + numpy_pairwise(np.asarray(a["v"]))
    z = jnp.asarray(rng.normal(size=9) + 1j * rng.normal(size=9))
    w = jnp.asarray(rng.normal(size=9) + 1j * rng.normal(size=9))
    np.testing.assert_allclose(float(tm.vdot(z, w)), np.real(np.vdot(z, w)), rtol=4 * EPS)


def test_vdot_has_the_same_bits_in_a_batch_and_in_a_loop():
    """The same inner product traced alone, in a batch of 3 (vmap) and inside a while loop."""
    rng = np.random.default_rng(1)
    x, y = (jnp.asarray(rng.normal(size=(3, 6))) for _ in range(2))
    batch = np.asarray(jax.jit(jax.vmap(tm.vdot))(x, y))

    def looped(x, y):
        def body(c):
            i, out = c
            return i + 1, out.at[i].set(tm.vdot(x[i], y[i]))

        return jax.lax.while_loop(lambda c: c[0] < x.shape[0], body, (0, jnp.zeros(x.shape[0])))[1]

    alone = [float(jax.jit(tm.vdot)(x[i], y[i])) for i in range(3)]
    np.testing.assert_array_equal(batch, alone)
    np.testing.assert_array_equal(np.asarray(jax.jit(looped)(x, y)), alone)


@pytest.mark.parametrize("n", [20, 60])
@pytest.mark.parametrize("axis", [0, 1])
def test_a_lines_fft_does_not_depend_on_its_batch(n, axis):
    """1-D FFTs of length ``n`` (lengths with factors 5 and 3: XLA:CPU's SIMD and one-by-one paths round
    differently there) of the first ``k`` lines of a batch of 16: each line's bits are those it gets in the
    whole batch, for every ``k``; and numpy's FFT to rounding."""
    rng = np.random.default_rng(n)
    shape = (n, 16) if axis == 0 else (16, n)
    x = jnp.asarray(rng.normal(size=shape) + 1j * rng.normal(size=shape))
    f = jax.jit(lambda a: fftn(a, (axis,)))
    whole = np.asarray(f(x))
    np.testing.assert_allclose(whole, np.fft.fft(np.asarray(x), axis=axis), rtol=0, atol=1e-13 * np.abs(whole).max())
    for k in range(1, 16):
        part = np.asarray(f(jax.lax.slice_in_dim(x, 0, k, axis=1 - axis)))
        np.testing.assert_array_equal(part, np.take(whole, range(k), axis=1 - axis), err_msg=f"{k} lines")


def test_a_grid_without_batch_axes_is_transformed_pass_by_pass_in_full_groups():
    """A 2-D grid whose row and column counts are no multiple of the group: its FFT (passes padded along
    the other axis) equals numpy's to rounding."""
    assert 10 % SIMD_LINES and 20 % SIMD_LINES
    rng = np.random.default_rng(2)
    x = jnp.asarray(rng.normal(size=(10, 20)) + 1j * rng.normal(size=(10, 20)))
    y = np.asarray(jax.jit(lambda a: fftn(a))(x))
    np.testing.assert_allclose(y, np.fft.fft2(np.asarray(x)), rtol=0, atol=1e-13 * np.abs(y).max())


def test_per_sample_work_keeps_xlas_reductions_and_the_driver_sums_pairwise():
    """Inside a strategy's per-sample work (the same program on every device count) the inner product is XLA's
    dot; outside it, where this XLA's reductions differ between programs, the written-out pairwise sum."""
    x = jnp.ones(16)

    def primitives():  # a new function each time: no trace cache shared between the two contexts
        return {e.primitive.name for e in jax.make_jaxpr(lambda a, b: tm.vdot(a, b))(x, x).jaxpr.eqns}

    outside = primitives()
    with tm.per_sample_work():
        inside = primitives()
    assert "dot_general" in inside
    assert ("dot_general" in outside) == (not fixed_order_arithmetic())
