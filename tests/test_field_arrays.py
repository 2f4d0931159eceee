"""``sv.parallel.field_array`` / ``process_rows``: grid-shaped arrays split by rows over a strategy's model axis.

Built from the rows each device holds only (``fill`` is called per distinct row range), equal to the
whole array, split as the engine splits the field; bad arguments raise clear errors. A run whose data,
noise and start are such arrays split over two processes (each building its rows only) is bitwise the
one-device run: tests/test_distributed.py.
"""

import jax
import numpy as np
import pytest
from jax.sharding import PartitionSpec as P

import shardvi as sv


def whole(shape=(8, 6)):
    return np.arange(np.prod(shape), dtype=np.float64).reshape(shape) / 7.0


def recorder(a):
    calls = []

    def fill(rows):
        calls.append((rows.start, rows.stop))
        return a[rows]

    return fill, calls


def test_field_array_is_split_by_rows_over_the_model_axis_and_fills_each_row_range_once():
    a = whole()
    strategy = sv.parallel.ShardMap(devices=jax.devices()[:4], model_shards=2)  # 2 sample x 2 model shards
    fill, calls = recorder(a)
    x = sv.parallel.field_array(strategy, a.shape, fill)
    np.testing.assert_array_equal(np.asarray(x), a)
    assert x.sharding.spec == P("model") and x.sharding.mesh == strategy.mesh
    assert {s.data.shape for s in x.addressable_shards} == {(4, 6)}
    assert sorted(calls) == [(0, 4), (4, 8)]  # one call per row range, shared by the sample shards
    assert sv.parallel.process_rows(strategy, a.shape) == slice(0, 8)  # one process: all rows
    f32 = sv.parallel.field_array(strategy, a.shape, lambda r: a[r], dtype=np.float32)
    assert f32.dtype == np.float32 and np.array_equal(np.asarray(f32), a.astype(np.float32))


@pytest.mark.parametrize("strategy", [sv.parallel.Vmap(), sv.parallel.ShardMap(devices=jax.devices()[:2])])
def test_without_a_model_axis_the_array_is_whole(strategy):
    a = whole()
    fill, calls = recorder(a)
    x = sv.parallel.field_array(strategy, a.shape, fill)
    np.testing.assert_array_equal(np.asarray(x), a)
    assert calls == [(0, 8)] and sv.parallel.process_rows(strategy, a.shape) == slice(0, 8)


@pytest.mark.parametrize(
    "kwargs,exc,match",
    [
        (dict(shape=(7, 6)), ValueError, "does not divide the grid's 7 rows"),
        (dict(shape=()), ValueError, "shape must be a non-empty tuple"),
        (dict(shape=(8, 0)), ValueError, "shape must be a non-empty tuple"),
        (dict(shape=5), TypeError, "shape must be a tuple"),
        (dict(fill="rows"), TypeError, "fill must be callable"),
        (dict(fill=lambda r: np.zeros((3, 6))), ValueError, r"fill returned shape \(3, 6\) for the rows 0:4"),
        (dict(fill=lambda r: np.full((4, 6), "x")), TypeError, "fill must return a numeric array"),
        (dict(strategy="shard_map"), TypeError, "strategy must be a shardvi.parallel strategy object"),
    ],
)
def test_bad_arguments_raise_clear_errors(kwargs, exc, match):
    args = dict(strategy=sv.parallel.ShardMap(devices=jax.devices()[:2], model_shards=2), shape=(8, 6))
    args["fill"] = lambda r: whole()[r]
    args.update(kwargs)
    with pytest.raises(exc, match=match):
        sv.parallel.field_array(args["strategy"], args["shape"], args["fill"])


def test_field_model_splits_the_grids_power_index_by_rows():
    """Each grid's power index built by rows (``power_index_rows``) and split as the data: the same values and
    tree structure, so the same compiled programs; without a model axis the model itself; a model whose grids
    hide in a closure is refused (nothing would be split)."""
    from jax.tree_util import Partial
    from test_field_split import exp_of, field

    cf = field()
    strategy = sv.parallel.ShardMap(devices=jax.devices()[:4], model_shards=2)
    model = sv.Model(Partial(exp_of, cf), cf.domain)
    split = sv.parallel.field_model(strategy, model)
    assert jax.tree.structure(split) == jax.tree.structure(model)
    index = split.call.args[0].grids[0].power_index
    assert isinstance(index, jax.Array) and index.sharding.spec == P("model")
    assert {s.data.shape for s in index.addressable_shards} == {(4, 8)}
    np.testing.assert_array_equal(np.asarray(index), cf.grids[0].power_index)
    for a, b in zip(jax.tree.leaves(split), jax.tree.leaves(model), strict=True):
        assert a is b or b is cf.grids[0].power_index
    xi = cf.init(jax.random.PRNGKey(0))
    np.testing.assert_array_equal(jax.jit(lambda m, x: m(x))(split, xi), jax.jit(lambda m, x: m(x))(model, xi))
    assert sv.parallel.field_model(sv.parallel.ShardMap(devices=jax.devices()[:2]), model) is model
    with pytest.raises(ValueError, match="holds no grid in its pytree"):
        sv.parallel.field_model(strategy, sv.Model(lambda xi: exp_of(cf, xi), cf.domain))
