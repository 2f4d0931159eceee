"""A grid split into fixed blocks over a model axis (field parallelism): layout-free reductions.

Every piece of :mod:`shardvi.parallel.grid` and what is built on it (tree-math
reductions over :class:`Slab` leaves, the correlated field's slab path) gives
bitwise the same numbers on one device (all blocks local) and on 1, 2 and 4 devices of a
model axis, for values, gradients, JVPs and transposes; the transposes are
checked against closed forms (``bincount``) and by dot tests. The solvers on
a slab-split latent, in the engine: ``tests/test_field_split.py``.
"""

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from jax.sharding import AxisType, Mesh
from jax.sharding import PartitionSpec as P

from shardvi import CorrelatedFieldMaker
from shardvi import tree_math as tm
from shardvi._jax_compat import fixed_order_arithmetic
from shardvi.parallel.grid import GridLayout, Slab, grid_total, grid_vdot, normal, spread, take
from shardvi.parallel.reproducible import reproducible_jit
from shardvi.tree_math import row_normal

AX = "m"
B = 4  # fixed blocks of the grid
LAYOUTS = [None, 1, 2, 4]  # None: one device, no mesh axis; else devices along the model axis
#: the compilation of the compared programs: where the engine pads its FFT batches (jax >= 0.12) the padding
#: changes XLA's fusion of the elementwise code around the FFTs, and only the engine's compilation
#: (``reproducible_jit``) keeps the bits there; elsewhere plain ``jit`` programs keep them
_JIT = reproducible_jit if fixed_order_arithmetic() else jax.jit


def run(fn, p, args, in_split, out_split, rows=None):
    """``fn(layout, *args)`` on one device (``p`` None) or per device on ``p`` devices of a model axis (see
    :data:`_JIT`).

    ``in_split`` / ``out_split``: per argument / output, whether it is a grid split along axis 0 (else
    replicated). ``rows``: the grid's own rows where the blocks end with padding rows. Returns NumPy arrays.
    """
    if p is None:
        out = _JIT(lambda a: fn(GridLayout(B, rows=rows), *a))(tuple(args))
    else:
        mesh = Mesh(np.asarray(jax.devices()[:p]), (AX,), axis_types=(AxisType.Auto,))
        spec = lambda split: P(AX) if split else P()  # noqa: E731
        mapped = jax.shard_map(
            lambda *a: fn(GridLayout(B, AX, p, rows), *a),
            mesh=mesh,
            in_specs=tuple(spec(s) for s in in_split),
            out_specs=tuple(spec(s) for s in out_split),
            check_vma=False,
        )
        out = _JIT(lambda a: mapped(*a))(tuple(args))
    return [jax.tree_util.tree_map(np.asarray, o) for o in out]


def assert_same_on_all_layouts(fn, args, in_split, out_split, layouts=LAYOUTS, rows=None):
    """Bitwise equal outputs on every layout; returns the one-device outputs."""
    ref = run(fn, None, args, in_split, out_split, rows)
    for p in layouts[1:]:
        out = run(fn, p, args, in_split, out_split, rows)
        for i, (a, b) in enumerate(zip(out, ref)):
            for u, v in zip(jax.tree_util.tree_leaves(a), jax.tree_util.tree_leaves(b)):
                assert np.array_equal(u, v), f"output {i} differs on {p} devices: max |diff| {np.max(np.abs(u - v))}"
    return ref


def test_layout_validation():
    with pytest.raises(ValueError, match="divide the 4 grid blocks"):
        GridLayout(4, AX, 3)
    with pytest.raises(ValueError, match="shards must be 1 without a mesh axis"):
        GridLayout(4, None, 2)
    with pytest.raises(ValueError, match="blocks must be an int >= 1"):
        GridLayout(0)
    with pytest.raises(ValueError, match="cannot be cut into 4 equal blocks"):
        grid_total(jnp.ones((6, 3)), GridLayout(4))


def test_sums_and_draws_are_layout_free_and_right():
    rng = np.random.default_rng(0)
    a, b = (jnp.asarray(rng.normal(size=(16, 6))) for _ in range(2))
    key = jax.random.key(5)

    def fn(lay, a, b):
        return grid_total(a, lay), grid_vdot(a, b, lay), normal(key, a.shape, a.dtype, lay)

    # the draw's local shape is the slab's: pass the slab of a through
    tot, dot, draw = assert_same_on_all_layouts(fn, (a, b), (True, True), (False, False, True))
    np.testing.assert_allclose(tot, np.sum(a), rtol=1e-13)
    np.testing.assert_allclose(dot, np.vdot(a, b), rtol=1e-13)
    # entry (g, j) of the draw is counter-based on its global index: the whole grid's numbers, jax.random.normal's
    assert np.array_equal(draw, np.asarray(row_normal(key, a.shape, a.dtype)))
    assert np.array_equal(draw, np.asarray(jax.random.normal(key, a.shape, a.dtype)))


def test_blocks_with_padding_rows_draw_sum_and_transform_the_grid_own_rows():
    """14 rows in 4 blocks of 4 (2 padding rows): draws are the whole grid's numbers on its rows and zero on the
    padding; a datum's number lands on its pixel (normal_at); the Hartley transform reads the grid's rows only
    and is zero on the padding; sizes count the grid's entries. Bitwise on every layout."""
    from shardvi.parallel.grid import normal_at, pad_rows, unpad_rows
    from shardvi.parallel.slab import layout_hartley

    rows, lay = 14, GridLayout(B, rows=14)
    assert lay.padded_rows == 16 and GridLayout(B).padded_rows is None
    rng = np.random.default_rng(1)
    x = rng.normal(size=(rows, 8))
    xp = pad_rows(x, lay, value=7.0)  # padding rows with junk: never read
    assert xp.shape == (16, 8) and np.all(xp[rows:] == 7.0) and np.array_equal(unpad_rows(xp, lay), x)
    assert pad_rows(xp, lay) is xp and unpad_rows(x, lay) is x  # idempotent
    index = np.full((16, 8), -1, np.int32)
    pixels = rng.choice(rows * 8, size=30, replace=False)
    index.reshape(-1)[pixels] = np.arange(30)
    key = jax.random.key(2)

    def fn(layout, a, idx):
        return normal(key, a.shape, a.dtype, layout), normal_at(key, idx, a.dtype, layout), layout_hartley(a, layout)

    draw, at, h = assert_same_on_all_layouts(
        fn, (jnp.asarray(xp), jnp.asarray(index)), (True, True), (True, True, True), layouts=(None, 2), rows=rows
    )
    assert np.array_equal(draw[:rows], np.asarray(jax.random.normal(key, x.shape))) and not draw[rows:].any()
    data = np.asarray(jax.random.normal(key, (30,)))
    assert np.array_equal(at.reshape(-1)[pixels], data) and np.count_nonzero(at) == 30
    f = np.fft.fftn(x)
    np.testing.assert_allclose(h[:rows], f.real + f.imag, rtol=1e-12, atol=1e-12)
    assert not h[rows:].any()
    assert Slab(jnp.zeros((16, 8)), lay).size == rows * 8
    with pytest.raises(ValueError, match="rows must be None or an int >= 1"):
        GridLayout(B, rows=0)


def test_spread_transpose_is_the_block_order_total_and_take_grad_is_bincount():
    """Dot test of ``spread`` on every layout, and the gradient of ``take`` against ``np.bincount``."""
    rng = np.random.default_rng(1)
    table = jnp.asarray(rng.normal(size=(7,)))
    idx = jnp.asarray(rng.integers(0, 7, size=(8, 5)).astype(np.int32))
    w = jnp.asarray(rng.normal(size=(8, 5)))
    u = jnp.asarray(rng.normal(size=(7,)))
    blocks_ct = jnp.asarray(rng.normal(size=(B, 7)))

    def fn(lay, table, idx, w, u, ct):
        spread_u, lin = jax.linearize(lambda t: spread(t, lay), u)
        (ct_u,) = jax.linear_transpose(lin, u)(ct)
        lhs = grid_total(jnp.sum(spread_u * ct, axis=1), lay)  # <spread u, ct> over all blocks
        grad = jax.grad(lambda t: grid_vdot(w, take(t, idx, lay), lay))(table)
        return lhs, jnp.vdot(u, ct_u), grad, take(table, idx, lay)

    lhs, rhs, grad, val = assert_same_on_all_layouts(
        fn, (table, idx, w, u, blocks_ct), (False, True, True, False, True), (False, False, False, True)
    )
    np.testing.assert_allclose(lhs, rhs, rtol=1e-13)
    np.testing.assert_allclose(grad, np.bincount(np.ravel(idx), weights=np.ravel(w), minlength=7), rtol=1e-13)
    assert np.array_equal(val, np.asarray(table)[np.asarray(idx)])


def test_batched_samples_are_layout_free():
    """``vmap`` over samples (a strategy's chunks of a fixed size): the batched values and table
    gradients are bitwise the same on every layout and the unbatched ones to rounding (XLA:CPU
    reductions depend on the batch shape; the strategies keep it fixed)."""
    rng = np.random.default_rng(6)
    tables = jnp.asarray(rng.normal(size=(3, 7)))
    idx = jnp.asarray(rng.integers(0, 7, size=(8, 5)).astype(np.int32))
    w = jnp.asarray(rng.normal(size=(8, 5)))

    def one(lay, t, idx, w):
        return jax.value_and_grad(lambda t: grid_vdot(w, jnp.sin(take(t, idx, lay)), lay))(t)

    def fn(lay, tables, idx, w):
        batched = jax.vmap(lambda t: one(lay, t, idx, w))(tables)
        single = [one(lay, tables[i], idx, w) for i in range(3)]
        return batched, jax.tree_util.tree_map(lambda *a: jnp.stack(a), *single)

    batched, single = assert_same_on_all_layouts(
        fn, (tables, idx, w), (False, True, True), (False, False), layouts=(None, 2)
    )
    for a, b in zip(jax.tree_util.tree_leaves(batched), jax.tree_util.tree_leaves(single)):
        np.testing.assert_allclose(a, b, rtol=1e-13)


def test_tree_math_on_slabs():
    """Reductions over a pytree with a slab leaf span the grid; leafwise ops act on the local slab."""
    rng = np.random.default_rng(2)
    g1, g2 = (jnp.asarray(rng.normal(size=(8, 4))) for _ in range(2))
    h = jnp.asarray(rng.normal(size=(3,)))
    g1 = g1.at[3, 1].set(jnp.inf)

    def fn(lay, g1, g2, h):
        x = {"h": h, "f": Slab(g1, lay)}
        y = {"h": 2 * h, "f": Slab(g2, lay)}
        fin = {"h": h, "f": Slab(g2, lay)}
        z = tm.axpy(0.5, y, fin)
        return (
            tm.vdot(y, fin),
            tm.norm(y),
            tm.total(fin),
            tm.abs_total(fin),
            tm.all_finite(x),
            tm.all_finite(fin),
            z["f"].value,
            jnp.asarray(tm.size(x)),
        )

    out = assert_same_on_all_layouts(
        fn, (g1, g2, h), (True, True, False), (False, False, False, False, False, False, True, False)
    )
    vd, nrm, tot, l1, fin_x, fin, z, size = out
    np.testing.assert_allclose(vd, 2 * np.vdot(h, h) + np.vdot(g2, g2), rtol=1e-13)
    np.testing.assert_allclose(nrm, np.sqrt(4 * np.vdot(h, h) + np.vdot(g2, g2)), rtol=1e-13)
    np.testing.assert_allclose(tot, np.sum(h) + np.sum(g2), rtol=1e-13)
    np.testing.assert_allclose(l1, np.sum(np.abs(h)) + np.sum(np.abs(g2)), rtol=1e-13)
    assert not fin_x and fin
    np.testing.assert_array_equal(z, 0.5 * np.asarray(g2) + np.asarray(g2))
    assert size == 3 + 32


def _cf():
    cf = CorrelatedFieldMaker("cf")
    cf.set_amplitude_total_offset(0.3, (0.5, 0.1))
    cf.add_fluctuations(
        (16, 12),
        (1.0, 0.5),
        fluctuations=(0.7, 0.2),
        loglogavgslope=(-2.0, 0.5),
        flexibility=(0.8, 0.3),
        asperity=(0.2, 0.1),
        prefix="x",
    )
    return cf.finalize()


def _split(cf, xi):
    """Latent as (replicated hyperparameters, the excitation grid)."""
    name = cf._xi_name
    return {k: v for k, v in xi.items() if k != name}, xi[name]


def test_correlated_field_on_slabs_is_layout_free_and_matches_the_whole_field():
    cf = _cf()
    name = cf._xi_name
    rng = np.random.default_rng(3)
    xi = {k: jnp.asarray(rng.normal(size=v.shape)) for k, v in cf.domain.items()}
    t = {k: jnp.asarray(rng.normal(size=v.shape)) for k, v in cf.domain.items()}
    ct = jnp.asarray(rng.normal(size=cf.field_shape))
    hyp, grid = _split(cf, xi)
    thyp, tgrid = _split(cf, t)

    def fn(lay, hyp, grid, thyp, tgrid, ct):
        x = {**hyp, name: Slab(grid, lay)}
        tx = {**thyp, name: Slab(tgrid, lay)}
        f = lambda z: cf._field(z)  # noqa: E731
        s, lin = jax.linearize(f, x)
        (back,) = jax.linear_transpose(lin, x)(ct)
        js = lin(tx)
        # dot test: <J t, ct> == <t, J^T ct> over the whole grid
        lhs = grid_vdot(js, ct, lay)
        rhs = tm.vdot(tx, back)
        bh, bg = _split(cf, back)
        return s, js, bg.value, bh, lhs, rhs

    s, js, bg, bh, lhs, rhs = assert_same_on_all_layouts(
        fn,
        (hyp, grid, thyp, tgrid, ct),
        (False, True, False, True, True),
        (True, True, True, False, False, False),
        layouts=(None, 4),  # (1 and 2 devices of a model axis: the pieces are covered above; compile time)
    )
    np.testing.assert_allclose(lhs, rhs, rtol=1e-12)
    # the same field and derivatives as the whole-grid model, to rounding
    s_ref, lin_ref = jax.linearize(cf._field, xi)
    (back_ref,) = jax.linear_transpose(lin_ref, xi)(ct)
    np.testing.assert_allclose(s, s_ref, rtol=1e-12, atol=1e-12)
    np.testing.assert_allclose(js, lin_ref(t), rtol=1e-10, atol=1e-12)
    np.testing.assert_allclose(bg, back_ref[name], rtol=1e-10, atol=1e-12)
    for k, v in bh.items():
        np.testing.assert_allclose(v, back_ref[k], rtol=1e-10, atol=1e-12)


def test_slab_path_needs_one_grid_with_two_axes():
    cf = CorrelatedFieldMaker("c")
    cf.set_amplitude_total_offset(0.0, (0.5, 0.1))
    cf.add_fluctuations(32, 1.0, fluctuations=(0.7, 0.2), loglogavgslope=(-2.0, 0.5), prefix="x")
    cf = cf.finalize()
    xi = {k: jnp.zeros(v.shape) for k, v in cf.domain.items()}
    xi[cf._xi_name] = Slab(xi[cf._xi_name], GridLayout(4))
    with pytest.raises(ValueError, match="one sub-domain with at least 2 axes"):
        cf._field(xi)


def test_mesh_slab_reductions_are_the_slab_reductions():
    """A ``MeshSlab`` (a whole grid outside any shard_map, rows split over a mesh's model axis) reduces in a
    shard_map to bitwise the one-device block-order sums (also for ``x . x``, one array twice), right to
    rounding; its placement splits the rows (with a leading sample axis too)."""
    from jax.sharding import NamedSharding

    from shardvi.parallel.grid import MeshSlab, unsplit

    rng = np.random.default_rng(5)
    a, b = (jnp.asarray(rng.normal(size=(8, 4))) for _ in range(2))
    stacked = jnp.asarray(rng.normal(size=(3, 8, 4)))

    def reductions(x, y):
        return tm.vdot(x, y), tm.vdot(x, x), tm.norm(y), tm.total(x), tm.all_finite(x)

    ref = jax.jit(lambda a, b: reductions(Slab(a, GridLayout(B)), Slab(b, GridLayout(B))))(a, b)
    for p in (2, 4):
        mesh = Mesh(np.asarray(jax.devices()[:p]), (AX,), axis_types=(AxisType.Auto,))
        lay = GridLayout(B, AX, p)
        put = lambda v: jax.device_put(v, NamedSharding(mesh, P(AX)))  # noqa: E731
        out = jax.jit(lambda a, b: reductions(MeshSlab(a, lay, mesh, 2), MeshSlab(b, lay, mesh, 2)))(put(a), put(b))
        for u, v in zip(out, ref):
            assert np.array_equal(np.asarray(u), np.asarray(v)), p
        batched = MeshSlab(stacked, lay, mesh, 2)
        assert batched.spec() == P(None, AX) and batched.spec("s") == P("s", AX)
        placed = jax.device_put(stacked, batched.sharding())
        assert placed.addressable_shards[0].data.shape == (3, 8 // p, 4)
        assert not bool(jax.jit(lambda v: tm.all_finite(MeshSlab(v, lay, mesh, 2)))(placed.at[1, 7, 2].set(jnp.nan)))
        kept = jax.jit(lambda v: unsplit({"f": MeshSlab(2 * v, lay, mesh, 2)}))(placed)["f"]
        assert kept.sharding.is_equivalent_to(batched.sharding(), 3)
    vd, vv, nrm, tot, fin = ref
    np.testing.assert_allclose(vd, np.vdot(a, b), rtol=1e-13)
    np.testing.assert_allclose(vv, np.vdot(a, a), rtol=1e-13)
    np.testing.assert_allclose(nrm, np.linalg.norm(b), rtol=1e-13)
    np.testing.assert_allclose(tot, np.sum(a), rtol=1e-13)
    assert bool(fin)
