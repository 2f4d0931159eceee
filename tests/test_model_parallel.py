"""Model parallelism I: data cut into blocks, split over a second mesh axis (``model_shards``).

The math of the blocked likelihood against the unblocked one (energy, gradient, metric, metric
sample, the geoVI map), the Wiener filter in closed form, bitwise equality of whole runs across
mesh layouts, the psum mode, the collectives of one metric application, and the errors.
"""

from __future__ import annotations

import re
import warnings

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from _model_parallel_problem import (
    N_DATA,
    linear_blocked_problem,
    masked_problem,
    one_device_run,
    radio_problem,
    run_layout,
    start_position,
)

import shardvi as sv
from shardvi import tree_math as tm
from shardvi.parallel import JitSharding, Pmap, ShardMap, Vmap
from shardvi.parallel.blocks import model_axis

pytestmark = pytest.mark.product_compiler  # bitwise across mesh layouts and strategies (tests/conftest.py)


def _close(a, b, rtol=1e-12):
    for x, y in zip(jax.tree.leaves(a), jax.tree.leaves(b)):
        np.testing.assert_allclose(np.asarray(x), np.asarray(y), rtol=rtol, atol=rtol * np.max(np.abs(y)))


# ----------------------------------------------------------------------------- the math
@pytest.mark.parametrize(
    "problem, data_blocks",
    [(masked_problem, 4), (radio_problem, 4), (masked_problem, 7), (radio_problem, 10)],
    ids=["masked", "radio", "masked-7-padded", "radio-10-padded"],
)
def test_blocked_operators_equal_the_unblocked_ones(problem, data_blocks):
    """Any block count: where it does not divide the 96 data the padding changes no term."""
    model, full, blocked = problem(data_blocks)
    assert blocked.padded == (N_DATA % data_blocks != 0)
    x = jax.tree.map(lambda v: 0.5 * v, model.init(jax.random.PRNGKey(3)))
    t = model.init(jax.random.PRNGKey(4))
    r = jax.tree.map(lambda v: 0.2 * v, model.init(jax.random.PRNGKey(5)))
    key = jax.random.PRNGKey(6)

    @jax.jit  # one program for all the checks (eager ops would compile one by one)
    def both(blocked, full, x, t, r):
        got, want = {}, {}
        got["energy"], want["energy"] = blocked.energy(x), full.energy(x)
        got["vg"], want["vg"] = blocked.energy_and_grad(x), (full.energy(x), jax.grad(full.energy)(x))
        got["metric"], want["metric"] = blocked.metric_operator(x)(t), full.metric_operator(x)(t)
        # the metric sample: the blocks draw the unblocked likelihood's white noise (each datum's by its index)
        e1 = tm.random_like(key, full.lsm_tangents_shape)
        got["lsm"], want["lsm"] = blocked.left_sqrt_metric(x, key), full.left_sqrt_metric(x, e1)
        # the geoVI map phi(r) = Jbar^T (T(s(x + r)) - T(s(x))) and its linearization
        phi, phi_jvp, phi_vjp = blocked.geovi_operators(x)
        xbar, vjp = jax.vjp(full.transformation, x)
        jbar_t = tm.linear_adjoint(vjp)
        want_phi = lambda rr: jbar_t(tm.sub(full.transformation(tm.add(x, rr)), xbar))  # noqa: E731
        got["phi"], want["phi"] = phi(r), want_phi(r)
        got["phi_jvp"], want["phi_jvp"] = phi_jvp(r, t), jax.jvp(want_phi, (r,), (t,))[1]
        got["phi_vjp"], want["phi_vjp"] = phi_vjp(r, t), tm.linear_adjoint(jax.vjp(want_phi, r)[1])(t)
        res = full.normalized_residual(x)
        got["chi2"] = blocked.chi2_sum(x)[0]
        want["chi2"] = jnp.sum(jnp.abs(res) ** 2) / (2.0 if jnp.iscomplexobj(res) else 1.0)
        return got, want

    got, want = both(blocked, full, x, t, r)
    for name in want:
        _close(got[name], want[name])
    assert blocked.chi2_sum_dof == N_DATA
    np.testing.assert_allclose(blocked.normalization(), full.normalization(), rtol=1e-14)


def test_poisson_and_student_t_blocked_equal_unblocked():
    """The other data-space likelihoods cut into blocks (also padded ones: 96 data in 5 or 7 blocks, in 10 of
    which the last holds padding only): energy, gradient, metric, metric sample and geoVI map as unblocked."""
    model, _, _ = masked_problem()
    counts = np.random.default_rng(4).poisson(2.0, N_DATA).astype(np.float64)
    d = np.asarray(model(model.init(jax.random.PRNGKey(2))))
    pairs = [
        (sv.Poisson(counts).amend(model), sv.Poisson(counts).amend(model, data_blocks=4)),
        (sv.Poisson(counts).amend(model), sv.Poisson(counts).amend(model, data_blocks=7)),
        (sv.StudentT(d, 3.0, 0.2).amend(model), sv.StudentT(d, 3.0, 0.2).amend(model, data_blocks=2)),
        (sv.StudentT(d, 3.0, 0.2).amend(model), sv.StudentT(d, 3.0, 0.2).amend(model, data_blocks=5)),
        (sv.Poisson(counts).amend(model), sv.Poisson(counts).amend(model, data_blocks=10)),
    ]
    assert [b.padded for _, b in pairs] == [False, True, False, True, True]
    x = jax.tree.map(lambda v: 0.5 * v, model.init(jax.random.PRNGKey(3)))
    t = model.init(jax.random.PRNGKey(4))
    key = jax.random.PRNGKey(6)

    @jax.jit
    def both(pairs, x, t):
        out = []
        for full, blocked in pairs:
            phi = blocked.geovi_operators(x)[0]
            xbar, vjp = jax.vjp(full.transformation, x)
            want_phi = tm.linear_adjoint(vjp)(tm.sub(full.transformation(tm.add(x, t)), xbar))
            e1 = tm.random_like(key, full.lsm_tangents_shape)
            out.append(
                (
                    (blocked.energy_and_grad(x), blocked.metric_operator(x)(t), phi(t)),
                    ((full.energy(x), jax.grad(full.energy)(x)), full.metric_operator(x)(t), want_phi),
                    (blocked.left_sqrt_metric(x, key), blocked.chi2_sum(x)[0]),
                    (full.left_sqrt_metric(x, e1), jnp.sum(full.normalized_residual(x) ** 2)),
                )
            )
        return out

    for (full, blocked), (got, want, got2, want2) in zip(pairs, both(pairs, x, t)):
        _close(got, want)
        _close(got2, want2)
        np.testing.assert_allclose(blocked.normalization(), full.normalization(), rtol=1e-14)


def test_wiener_filter_closed_form_with_blocked_data():
    """Linear model, Gaussian noise: the MGVI position is the posterior mean, whatever the mesh."""
    lh, _, mean = linear_blocked_problem()
    n_lat = mean.shape[0]
    cfg = sv.NewtonCGConfig(xtol=1e-12, maxiter=20, cg=sv.CGConfig(tol=1e-12, maxiter=50))
    for strat in (ShardMap(devices=jax.devices()[:4], model_shards=2),):  # (Vmap: the same bits, tested below)
        samples, _ = sv.optimize_kl(
            lh,
            {"x": jnp.zeros(n_lat)},
            key=jax.random.PRNGKey(0),
            n_total_iterations=2,
            n_samples=2,
            sample_mode="linear_resample",
            linear_sampling=sv.CGConfig(tol=1e-12, maxiter=50),
            kl_minimization=cfg,
            sample_map=strat,
            kl_map=strat,
            progress=False,
        )
        np.testing.assert_allclose(np.asarray(samples.pos["x"]), mean, rtol=1e-9, atol=1e-10)
        # each antithetic residual solves M r = y exactly: r.M.r is the chi^2 of y, never 0
        res = np.asarray(samples.residuals["x"])
        np.testing.assert_array_equal(res[0::2], -res[1::2])


# ----------------------------------------------------------------------------- bitwise across layouts
def _layouts():
    """Mesh layouts (sample shards x model shards) compared with the one-device run (``Vmap``, layout 1x1)."""
    d = jax.devices()
    return {
        "1x2": ShardMap(devices=d[:2], model_shards=2),
        "2x2": ShardMap(devices=d[:4], model_shards=2),
        "1x4": ShardMap(devices=d[:4], model_shards=4),
        "4x1": ShardMap(devices=d[:4]),  # samples only
    }


def _assert_same_run(got, ref, name):
    (arrays, kl, _), (ref_arrays, ref_kl, _) = got, ref
    assert kl == ref_kl, name
    for a, b in zip(arrays, ref_arrays):
        np.testing.assert_array_equal(np.asarray(a), np.asarray(b), err_msg=name)


# every layout once (each case compiles its own programs: a second model on a layout adds suite time, no code
# path): the masked model on 1x2 and 4x1, the radio model (NUFFT, complex data) on the two that split the data
# most, 2x2 and 1x4; the masked model on 2x2 also in the JitSharding and the two-process tests
LAYOUT_CASES = [("masked", "1x2"), ("masked", "4x1"), ("radio", "2x2"), ("radio", "1x4")]


@pytest.mark.slow
@pytest.mark.parametrize("problem,layout", LAYOUT_CASES, ids=[f"{p}-{m}" for p, m in LAYOUT_CASES])
def test_mgvi_geovi_runs_bitwise_equal_on_every_mesh_layout(problem, layout):
    """ShardMap on every layout against one device (the reference is computed once per test process). LLVM
    level 0 for these runs (~0.7x the compile time): each device runs the same per-block program on any layout
    at any level; the default level is compared in the JitSharding and the two-process tests."""
    ref = one_device_run(problem, level=0)
    assert ref[2].history[-1].chi2_likelihood is not None and np.isfinite(ref[2].history[-1].chi2_likelihood)
    model, _, blocked = (masked_problem if problem == "masked" else radio_problem)()
    got = run_layout(
        blocked, start_position(model), _layouts()[layout], compiler_options={"xla_backend_optimization_level": 0}
    )
    _assert_same_run(got, ref, layout)


@pytest.mark.slow
def test_jit_sharding_run_with_split_data_is_bitwise_equal_to_one_device():
    """JitSharding(model_shards=2) on a 2x2 mesh (the per-sample work manual over both axes inside the jit) on the
    radio model: MGVI, geoVI and KL bitwise those of one device at the engine's default compiler level, its NUFFT
    (a custom call XLA's partitioner would gather) run on each device's own samples and blocks, no warning."""
    model, _, blocked = radio_problem()
    with warnings.catch_warnings():
        warnings.simplefilter("error", UserWarning)
        warnings.simplefilter("ignore", sv.ConvergenceWarning)  # short runs: solves stopped at maxiter by design
        got = run_layout(blocked, start_position(model), JitSharding(devices=jax.devices()[:4], model_shards=2))
    _assert_same_run(got, one_device_run("radio"), "jit 2x2")


@pytest.mark.parametrize("strategy", ["jit", "psum"])
def test_metric_of_blocked_data_under_other_strategies(strategy):
    """JitSharding gives the one-device bits with the data replicated and with
    them split over a model axis (one gather of per-block terms, the data never gathered); the psum mode (per-shard
    block sums added by a psum over the model axis) is within 1e-12 for ShardMap and JitSharding."""
    model, _, blocked = masked_problem()
    xs = jax.tree.map(lambda v: jnp.stack([v, 0.5 * v, -v, 0.2 * v]), model.init(jax.random.PRNGKey(3)))
    t = model.init(jax.random.PRNGKey(4))

    def apply(strat, compiled=False):
        fn = jax.jit(strat.map(lambda lh, xx, tt: lh.metric_operator(xx)(tt), (None, 0, None)))
        if compiled:
            return fn.lower(strat.place(blocked), xs, t).compile().as_text()
        return fn(strat.place(blocked), xs, t)

    ref = apply(Vmap())
    d = jax.devices()
    if strategy == "jit":
        for strat in (JitSharding(devices=d[:4]), JitSharding(devices=d[:4], model_shards=2)):
            got = apply(strat)
            for a, b in zip(jax.tree.leaves(got), jax.tree.leaves(ref)):
                np.testing.assert_array_equal(np.asarray(a), np.asarray(b))
        counts = sv.parallel.count_collectives(apply(strat, compiled=True))
        # one gather of per-block terms over the row inside the sample loop, the gather of the outputs after it
        assert counts.all_gather == 2 and counts.in_loops == 1 and counts.all_reduce == 0, counts
    else:
        for strat in (
            ShardMap(devices=d[:4], model_shards=4, reduce="psum"),
            JitSharding(devices=d[:4], model_shards=2, reduce="psum"),
        ):
            _close(apply(strat), ref, rtol=1e-12)


def test_one_gather_over_the_model_axis_per_metric_application():
    """The data blocks are split over the model axis: one all-gather per metric application, no sample collective."""
    model, _, blocked = masked_problem()
    strat = ShardMap(devices=jax.devices()[:4], model_shards=2)
    x = model.init(jax.random.PRNGKey(3))
    xs = jax.tree.map(lambda v: jnp.stack([v, v]), x)

    def apply(lh, xs, t):
        return strat.map(lambda lik, xx, tt: lik.metric_operator(xx)(tt), (None, 0, None))(lh, xs, t)

    placed = strat.place(blocked)
    for leaf in jax.tree.leaves(placed.blocks):  # a device holds its blocks only (per datum, or block indices)
        assert leaf.sharding.spec[0] == "model"
        assert leaf.addressable_shards[0].data.shape[0] == leaf.shape[0] // 2
        assert leaf.shape[0] in (blocked.n_data, blocked.n_blocks)
    text = jax.jit(apply).lower(placed, xs, x).compile().as_text()
    counts = sv.parallel.count_collectives(text)
    # the metric's block sum (one all-gather over the row), then the strategy's gather of the stacked outputs
    assert counts.all_gather == 2, counts
    assert counts.all_reduce == 0, counts


# ----------------------------------------------------------------------------- errors
def test_bad_blocking_raises_clear_errors():
    model, _, _ = masked_problem()
    d = np.ones(N_DATA)
    with pytest.raises(ValueError, match="data_blocks=97 exceeds the 96 data"):
        sv.Gaussian(d, noise_std=1.0).amend(model, data_blocks=97)
    coupled = sv.Likelihood(lambda s: 0.5 * jnp.sum(s) ** 2, domain=jax.ShapeDtypeStruct((N_DATA,), jnp.float64))
    coupled.amend(model, data_blocks=4)  # dividing: no padding, no per-datum sum
    with pytest.raises(ValueError, match="padding sums the energy per datum.*couples data"):
        coupled.amend(model, data_blocks=5)
    from shardvi.vi.blocked import assemble_process_blocks

    with pytest.raises(ValueError, match="every process's data must fill its blocks"):
        assemble_process_blocks(sv.Gaussian(d, noise_std=1.0).amend(model, data_blocks=5), ShardMap(model_shards=2))
    with pytest.raises(ValueError, match="data_blocks must be a positive int"):
        sv.Gaussian(d, noise_std=1.0).amend(model, data_blocks=0)
    with pytest.raises(ValueError, match="needs a model built with data_inputs"):
        sv.Gaussian(np.ones(3), noise_std=1.0).amend(sv.Model(lambda xi: xi["x"], {"x": jnp.zeros(3)}), data_blocks=1)
    with pytest.raises(ValueError, match="data_inputs: their data axis has length 96"):
        sv.Gaussian(np.ones(48), noise_std=1.0).amend(model, data_blocks=2)
    with pytest.raises(ValueError, match="leading .data. axis"):
        sv.Model(lambda xi, inp: xi["x"], {"x": jnp.zeros(3)}, data_inputs={"a": np.ones(3), "b": np.ones(4)})
    _, _, blocked = masked_problem()
    with pytest.raises(ValueError, match="model_shards=3 does not divide data_blocks=4"):
        ShardMap(devices=jax.devices()[:3], model_shards=3).place(blocked)
    with pytest.raises(ValueError, match="model_shards=3 does not divide the 4 devices"):
        ShardMap(devices=jax.devices()[:4], model_shards=3)
    with pytest.raises(ValueError, match="Pmap maps samples only"):
        Pmap(model_shards=2)
    with pytest.raises(ValueError, match="model_shards=3 does not divide data_blocks=4"):
        xs = jax.tree.map(lambda v: v[None], model.init(jax.random.PRNGKey(0)))
        JitSharding(devices=jax.devices()[:3], model_shards=3).map(lambda lh, x: lh.energy(x), (None, 0))(blocked, xs)
    with pytest.raises(TypeError, match="cannot be added"):
        blocked + blocked


def test_model_axis_context_is_scoped():
    from shardvi.parallel.blocks import current_model_axis

    assert current_model_axis() is None
    with model_axis("model", 2):
        assert current_model_axis().size == 2
    assert current_model_axis() is None


def _axis_of(groups: str) -> str:
    """``"model"`` or ``"samples"`` for the replica groups of a collective on the 2x2 mesh of devices 0..3.

    XLA prints them as device lists (``{{0,1},{2,3}}``), iota lists (``[2,2]<=[4]``) or mesh axes
    (``mesh['axis_0'=2,'axis_1'=2] {'axis_0'}``: the first axis is the sample axis, the last the model axis).
    """
    if groups in ("{{0,1},{2,3}}", "[2,2]<=[4]"):
        return "model"
    if groups in ("{{0,2},{1,3}}", "[2,2]<=[2,2]T(1,0)"):
        return "samples"
    m = re.fullmatch(r"mesh\[(.*)\] \{'(\w+)'\}", groups)
    if m:
        names = re.findall(r"'(\w+)'=", m.group(1))
        return {names[0]: "samples", names[-1]: "model"}.get(m.group(2), groups)
    return groups


def test_sampling_cg_gathers_over_the_model_axis_only():
    """In the MGVI sampling step on a 2x2 mesh every collective inside a loop (the CG, the chunk loop) is over the
    model axis; over the sample axis there is only the gather of the results, outside the loops."""
    model, _, blocked = masked_problem()
    strat = ShardMap(devices=jax.devices()[:4], model_shards=2)
    opt = sv.OptimizeVI(blocked, 1, n_samples=2, sample_map=strat, kl_map=strat, progress=False, precompile=False)
    keys = jax.random.split(jax.random.PRNGKey(0), 2)
    text = opt._draw_linear.lower(model.init(jax.random.PRNGKey(1)), keys, config=sv.CGConfig()).compile().as_text()
    counts = sv.parallel.count_collectives(text)
    axes = [
        _axis_of(g)
        for g in re.findall(
            r"= \S+ (?:all-gather|all-reduce)(?:-start)?\(.*?replica_groups=(.*?), (?:dimensions|to_apply|use_global)",
            text,
        )
    ]
    assert len(axes) == counts.total, (axes, counts)
    assert set(axes) <= {"model", "samples"}, axes
    assert counts.in_loops >= 2, counts  # the metric sample's and the CG metric's block sums
    assert axes.count("model") == counts.in_loops, (axes, counts)
    assert axes.count("samples") == counts.total - counts.in_loops, (axes, counts)
