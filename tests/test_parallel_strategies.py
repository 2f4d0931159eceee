"""Strategy objects: construction, bad input, padding, chunking, gradients, collectives."""

import dataclasses
import re
import warnings
from unittest import mock

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from _parallel_problem import likelihood, position
from jax.sharding import PartitionSpec as P

import shardvi as sv
from shardvi.examples import build_demo
from shardvi.parallel import JitSharding, LaxMap, Pmap, ShardMap, Vmap
from shardvi.parallel.reproducible import reproducible_jit
from shardvi.vi.kl import kl_value_and_grad

pytestmark = pytest.mark.product_compiler  # bitwise across strategies and device counts (tests/conftest.py)

MULTI = (ShardMap, Pmap, JitSharding)


def _fake_device(platform):
    dev = mock.create_autospec(jax.Device, instance=True)
    dev.platform = platform
    return dev


# -- construction and bad input ---------------------------------------------------------------


def test_names_objects_and_fields():
    devs = jax.devices()[:2]
    for name, cls in (("shard_map", ShardMap), ("pmap", Pmap), ("jit", JitSharding)):
        s = sv.parallel.get_strategy(name, "kl_map", devs)
        assert isinstance(s, cls) and s.name == name and s.devices == tuple(devs)
        assert s.chunk_size == 1 and s.reduce == "fixed" and s.pad
        assert cls(devices=devs, chunk_size=3).chunk_size == 3
        assert cls() == cls() and hash(cls(devices=devs)) == hash(cls(devices=list(devs)))
        with pytest.raises(dataclasses.FrozenInstanceError):
            s.chunk_size = 2
        assert cls().resolved_devices == tuple(jax.devices())  # None: all devices, resolved at use
    assert isinstance(sv.parallel.get_strategy("vmap"), Vmap)
    assert isinstance(sv.parallel.get_strategy("lax_map"), LaxMap)
    assert LaxMap(batch_size=2).batch_size == 2 and Vmap(chunk_size=None).chunk_size is None
    assert set(sv.parallel.STRATEGY_NAMES) == {"vmap", "lax_map", "pmap", "shard_map", "jit"}
    assert isinstance(ShardMap(), sv.parallel.Strategy)


BAD_DEVICES = [
    ([], ValueError, "devices is empty"),
    (jax.devices()[0], TypeError, "single device"),
    ("cpu", TypeError, "sequence of jax.Device"),
    ([0, 1], TypeError, r"devices\[0\] must be a jax.Device"),
    ([jax.devices()[0], jax.devices()[0]], ValueError, "twice"),
    ([_fake_device("cpu"), _fake_device("gpu")], ValueError, "mixes platforms"),
]


@pytest.mark.parametrize("cls", MULTI)
@pytest.mark.parametrize("devices,exc,match", BAD_DEVICES, ids=[m for *_, m in BAD_DEVICES])
def test_bad_devices(cls, devices, exc, match):
    with pytest.raises(exc, match=match):
        cls(devices=devices)


@pytest.mark.parametrize("devices,exc,match", BAD_DEVICES[:1] + BAD_DEVICES[-1:])
def test_bad_devices_in_optimize_kl(devices, exc, match):
    with pytest.raises(exc, match=match):
        sv.optimize_kl(
            likelihood(),
            position(),
            key=jax.random.PRNGKey(0),
            n_total_iterations=1,
            n_samples=1,
            sample_map="shard_map",
            devices=devices,
        )


@pytest.mark.parametrize(
    "kwargs,exc,match",
    [
        (dict(chunk_size=0), ValueError, "chunk_size"),
        (dict(chunk_size=1.5), ValueError, "chunk_size"),
        (dict(chunk_size=None), ValueError, "chunk_size"),
        (dict(chunk_size=True), ValueError, "chunk_size"),
        (dict(reduce="sum"), ValueError, "reduce"),
        (dict(pad="yes"), TypeError, "pad"),
    ],
)
def test_bad_options(kwargs, exc, match):
    for cls in MULTI:
        with pytest.raises(exc, match=match):
            cls(**kwargs)
    with pytest.raises(TypeError, match="check_vma"):
        ShardMap(check_vma=1)
    with pytest.raises(ValueError, match="reduce"):
        Vmap(reduce="mean")


def test_unknown_strategy_names_the_argument():
    run = dict(key=jax.random.PRNGKey(0), n_total_iterations=1, n_samples=1)
    with pytest.raises(ValueError, match="kl_map must be one of"):
        sv.optimize_kl(likelihood(), position(), kl_map="gspmd", **run)
    with pytest.raises(TypeError, match="sample_map must be"):
        sv.optimize_kl(likelihood(), position(), sample_map=3, **run)


@pytest.mark.parametrize("cls", MULTI)
def test_unplaceable_sample_count_raises(cls):
    """pad=False: a count that is no multiple of devices x chunk_size names n_samples and the counts that work."""
    strat = cls(devices=jax.devices()[:4], pad=False)
    with pytest.raises(ValueError, match=r"n_samples: .* cannot place 3 samples on 4 device\(s\).*multiple of 4"):
        sv.optimize_kl(
            likelihood(),
            position(),
            key=jax.random.PRNGKey(0),
            n_total_iterations=1,
            n_samples=3,
            sample_map=strat,
            kl_map=strat,
        )
    with pytest.raises(ValueError, match=r"multiple of 8 .* e.g. 8, 16, 24"):
        cls(devices=jax.devices()[:4], chunk_size=2, pad=False).map(lambda x: x, (0,))(jnp.ones(6))


def test_bad_in_axes():
    for s in (ShardMap(), Pmap(), JitSharding(), Vmap()):
        with pytest.raises(ValueError, match="in_axes has 1 entries for 2 arguments"):
            s.map(lambda a, b: a, (0,))(jnp.ones(4), jnp.ones(4))
        with pytest.raises(ValueError, match="at least one argument must be mapped"):
            s.map(lambda a: a, (None,))(jnp.ones(4))


@pytest.mark.skipif(jax.process_count() > 1, reason="single-process check")
def test_place_replicates_over_the_strategy_devices():
    devs = jax.devices()[1:3]
    x = ShardMap(devices=devs).place({"a": jnp.ones(3)})["a"]
    assert x.sharding.device_set == set(devs) and x.sharding.is_fully_replicated
    assert Vmap().place(jnp.ones(2)).sharding.device_set == {jax.local_devices()[0]}


# -- padding, chunking, fast means ------------------------------------------------------------


def _per_sample(w, x):
    y = w * x
    return jnp.sum(jnp.sin(y) ** 2) / 3.0, y


def _samples(n):
    return jax.random.normal(jax.random.PRNGKey(7), (n, 4))


W = jnp.array([0.3, -0.7, 1.1, 0.2])


@pytest.mark.parametrize("chunk", [1, 2])
@pytest.mark.parametrize("cls", MULTI)
@pytest.mark.slow
def test_padding_is_dropped_and_contributes_exactly_zero(cls, chunk):
    xs = _samples(5)  # 4 devices: padded to 8 samples
    ref_strat = Vmap(chunk_size=chunk)
    ref_map = reproducible_jit(lambda w, x: ref_strat.map(_per_sample, (None, 0))(w, x))(W, xs)
    ref_mean = reproducible_jit(lambda w, x: sv.parallel.map_mean(ref_strat, _per_sample, (None, 0))(w, x))(W, xs)
    strat = cls(devices=jax.devices()[:4], chunk_size=chunk)
    args = strat.place((W, xs))
    got_map = reproducible_jit(lambda w, x: strat.map(_per_sample, (None, 0))(w, x))(*args)
    got_mean = reproducible_jit(lambda w, x: sv.parallel.map_mean(strat, _per_sample, (None, 0))(w, x))(*args)
    for a, b in zip(jax.tree.leaves(got_map), jax.tree.leaves(ref_map)):
        assert a.shape[0] == 5 and np.array_equal(a, b)
    for a, b in zip(jax.tree.leaves(got_mean), jax.tree.leaves(ref_mean)):
        assert np.array_equal(a, b)
    # the mean is the fixed-order (left to right) sum over the 5 real samples only, times 1/5
    vals = np.asarray(ref_map[1])
    acc = vals[0].copy()
    for v in vals[1:]:
        acc = acc + v
    np.testing.assert_array_equal(np.asarray(got_mean[1]), acc * (1.0 / 5))
    # fast mode: per-device sums + psum, padding masked to exact zeros
    fast = cls(devices=jax.devices()[:4], chunk_size=chunk, reduce="psum")
    got_fast = jax.jit(lambda w, x: sv.parallel.map_mean(fast, _per_sample, (None, 0))(w, x))(*fast.place((W, xs)))
    for a, b in zip(jax.tree.leaves(got_fast), jax.tree.leaves(ref_mean)):
        np.testing.assert_allclose(a, b, rtol=1e-14, atol=0)
    padded_mean = (np.asarray(ref_map[1]).sum(0) + 3 * np.asarray(ref_map[1])[-1]) / 5
    assert not np.allclose(np.asarray(got_fast[1]), padded_mean, rtol=1e-6)


@pytest.mark.parametrize("cls", MULTI)
@pytest.mark.slow
def test_fast_kl_means_differ_by_ulps(cls):
    demo = build_demo("lognormal_1d", npix=16)
    pos = jax.tree.map(lambda x: x + 0.1, demo.position)
    r = jax.tree.map(lambda x: 0.3 * jax.random.normal(jax.random.PRNGKey(3), (6,) + x.shape), pos)

    def kl(strat):
        f = jax.jit(lambda p, r: kl_value_and_grad(demo.likelihood, p, r, strat))
        return jax.tree.leaves(f(*sv.parallel.place(strat, (pos, r))))

    for a, b in zip(kl(cls(devices=jax.devices()[:4], reduce="psum")), kl(Vmap())):
        a, b = np.asarray(a), np.asarray(b)
        assert np.max(np.abs(a - b)) <= 1e-14 * np.max(np.abs(b))


@pytest.mark.slow
def test_chunked_draws_bitwise_for_any_device_count():
    """Keys split on the host, sharded with the samples: the same draws on 1, 2 and 4 devices."""
    demo = build_demo("lognormal_1d", npix=16)
    cfg = sv.CGConfig(tol=1e-10, maxiter=50)
    keys = jax.random.split(jax.random.PRNGKey(11), 5)
    pos = jax.tree.map(lambda x: x + 0.1, demo.position)

    def draw(strat):
        f = reproducible_jit(
            lambda p, k: strat.map(lambda p, k: sv.draw_linear_residual(demo.likelihood, p, k, cfg)[0], (None, 0))(p, k)
        )
        return [np.asarray(x) for x in jax.tree.leaves(f(*sv.parallel.place(strat, (pos, keys))))]

    ref = draw(Vmap(chunk_size=2))
    devs = jax.devices()
    for strat in (
        ShardMap(devices=devs[:4], chunk_size=2),  # 2 devices: test_parallel_reproducible (whole runs)
        Pmap(devices=devs[:4], chunk_size=2),
        JitSharding(devices=devs[:4], chunk_size=2),
        LaxMap(batch_size=2),
    ):
        for a, b in zip(draw(strat), ref):
            assert np.array_equal(a, b), strat


# -- per-sample gradients of replicated parameters (the check_vma trap) ------------------------


def _loss(w, x):
    return jnp.sum(jnp.sin(w * x) ** 2) + 0.5 * jnp.dot(w, w)


@pytest.mark.slow
def test_per_sample_gradients_of_replicated_parameters():
    xs = _samples(6)
    grad = jax.grad(_loss)
    ref = jax.vmap(grad, (None, 0))(W, xs)
    devs = jax.devices()[:2]
    for strat in (
        ShardMap(devices=devs),
        ShardMap(devices=devs, check_vma=True),
        Pmap(devices=devs),
        JitSharding(devices=devs),
    ):
        out = jax.jit(strat.map(grad, (None, 0)))(*strat.place((W, xs)))
        np.testing.assert_allclose(out, ref, rtol=1e-14, atol=1e-15, err_msg=str(strat))
    # the trap the strategies avoid: a plain shard_map with check_vma=True sums the gradient of the
    # replicated w over devices
    mesh = sv.parallel.sample_mesh(devs)
    body = lambda w, x: jax.vmap(lambda xx: jax.grad(lambda ww: _loss(ww, xx))(w))(x)  # noqa: E731
    trapped = jax.jit(
        jax.shard_map(body, mesh=mesh, in_specs=(P(), P("samples")), out_specs=P("samples"), check_vma=True)
    )(W, xs)
    assert not np.allclose(trapped, ref)


# -- collectives ------------------------------------------------------------------------------


def test_count_collectives_parses_hlo():
    hlo = """HloModule m

%body (p: (s32[], f32[4])) -> (s32[], f32[4]) {
  %p = (s32[], f32[4]) parameter(0)
  %x = f32[4] get-tuple-element(%p), index=1
  %ar = f32[4] all-reduce(%x), replica_groups={}, to_apply=%add
  ROOT %t = (s32[], f32[4]) tuple(%i, %ar)
}

%cond (p: (s32[], f32[4])) -> pred[] {
  ROOT %c = pred[] constant(true)
}

ENTRY %main (a: f32[4]) -> f32[8] {
  %a = f32[4] parameter(0)
  %w = (s32[], f32[4]) while(%t0), condition=%cond, body=%body
  %ags = f32[8] all-gather-start(%a), dimensions={0}
  ROOT %agd = f32[8] all-gather-done(%ags)
}
"""
    c = sv.parallel.count_collectives(hlo)
    assert c.counts["all-reduce"] == 1 and c.counts["all-gather"] == 1 and c.total == 2
    assert c.loop_counts["all-reduce"] == 1 and c.in_loops == 1 and c.loop_counts["all-gather"] == 0


@pytest.mark.slow
def test_sampling_cg_loop_has_no_collectives_under_every_multi_device_strategy():
    """Each device runs its samples' CG on its own: no collective inside the loop (``JitSharding`` too: its
    per-sample work is manual over the sample axis; a batched GSPMD program would hold an all-reduce in the loop
    condition), the outputs gathered once after it."""
    lh = likelihood()
    keys = jax.random.split(jax.random.PRNGKey(0), 4)
    cfg = sv.CGConfig(tol=1e-8, maxiter=50)
    for strat in (
        ShardMap(devices=jax.devices()[:4]),
        Pmap(devices=jax.devices()[:4]),
        JitSharding(devices=jax.devices()[:4]),
    ):
        opt = sv.OptimizeVI(lh, 1, n_samples=4, sample_map=strat, kl_map=strat)
        found = sv.parallel.collectives(opt._draw_linear, position(), keys, config=cfg)
        assert found.in_loops == 0, f"{strat.name}: {found}"
        assert found.all_gather >= 1, f"{strat.name}: outputs are gathered once, after the loops"


def test_jit_strategy_keeps_correlated_field_ffts_split_over_the_samples():
    """Under ``JitSharding`` each device transforms its own samples: no collective inside the CG loop, no
    warning."""
    n = 8
    cfm = sv.CorrelatedFieldMaker("cf")
    cfm.set_amplitude_total_offset(0.0, (0.5, 0.1))
    cfm.add_fluctuations((n, n), (1 / n, 1 / n), (1.0, 0.3), (-3.0, 0.5), (0.5, 0.2), None, prefix="ax")
    cf = cfm.finalize()
    model = sv.Model(lambda xi: jnp.exp(cf(xi)), cf.domain)
    lh = sv.Gaussian(jnp.ones((n, n)), noise_std=0.1).amend(model)
    pos = jax.tree.map(lambda x: 0.1 * x, model.init(jax.random.PRNGKey(2)))
    keys = jax.random.split(jax.random.PRNGKey(0), 4)
    strat = JitSharding(devices=jax.devices()[:4])
    with warnings.catch_warnings():
        warnings.simplefilter("error", UserWarning)  # JitSharding warns about FFTs it cannot split
        opt = sv.OptimizeVI(lh, 1, n_samples=2, sample_map=strat, kl_map=strat)
        found = sv.parallel.collectives(opt._draw_linear, pos, keys, config=sv.CGConfig(tol=1e-8, maxiter=5))
    assert found.in_loops == 0, str(found)


def test_jit_strategy_runs_custom_calls_per_device():
    """A plain ``jnp.fft`` (a custom call XLA's partitioner would gather) runs on each device's own samples under
    ``JitSharding``: no collective but the gather of the outputs, the bits of ``Vmap``, no warning."""
    x = jax.random.normal(jax.random.PRNGKey(0), (4, 16))
    fn = lambda v: jnp.fft.fft(jnp.sin(v)).real  # noqa: E731
    strat = JitSharding(devices=jax.devices()[:4])
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        got = jax.jit(strat.map(fn, (0,)))(x)
        hlo = jax.jit(strat.map(fn, (0,))).lower(x).compile().as_text()
    np.testing.assert_array_equal(np.asarray(got), np.asarray(jax.jit(Vmap().map(fn, (0,)))(x)))
    counts = sv.parallel.count_collectives(hlo)
    assert counts.total == counts.all_gather == 1, counts
    assert re.search(r"= c128\[16\]\{0\} fft\(", hlo), "each device transforms one sample at a time"
