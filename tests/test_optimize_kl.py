"""optimize_kl: modes, callables, point estimates, constants, optax, no recompilation."""

import gc
import importlib
import logging
import weakref

import jax
import jax.numpy as jnp
import numpy as np
import optax
import pytest
from _small_problem import exp_problem

import shardvi as sv
from shardvi.compilation import CompileCounter

_OKL = importlib.import_module("shardvi.vi.engine")  # the engine module (check_kl_result, its checkpoints)
N = 8


@pytest.fixture(scope="module")
def lh():
    rng = np.random.default_rng(3)
    truth = {"a": rng.normal(size=N), "b": np.array(0.3)}

    def call(x):
        return jnp.exp(0.4 * x["a"] + 0.5 * x["b"])

    domain = {"a": jax.ShapeDtypeStruct((N,), jnp.float64), "b": jax.ShapeDtypeStruct((), jnp.float64)}
    model = sv.Model(call, domain)
    data = np.asarray(call(truth)) + 0.1 * rng.normal(size=N)
    return sv.Gaussian(data, noise_std=0.1).amend(model)


def pos0():
    return {"a": jnp.zeros(N), "b": jnp.zeros(())}


FAST = dict(
    linear_sampling=sv.CGConfig(tol=1e-8, maxiter=100),
    nonlinear_update=sv.NewtonCGConfig(xtol=1e-8, maxiter=10),
    kl_minimization=sv.NewtonCGConfig(xtol=1e-8, maxiter=10),
)


@pytest.mark.parametrize(
    "mode", ["linear_sample", "linear_resample", "nonlinear_sample", "nonlinear_resample", "nonlinear_update"]
)
@pytest.mark.slow
def test_all_modes_decrease_kl(lh, mode):
    samples, state = sv.optimize_kl(
        lh, pos0(), key=jax.random.PRNGKey(0), n_total_iterations=3, n_samples=2, sample_mode=mode, **FAST
    )
    assert state.nit == 3 and len(samples) == 4
    energies = [r.kl_energy for r in state.history]
    assert all(np.isfinite(energies))
    # the fit explains the data: likelihood reduced chi^2 of order one
    assert state.history[-1].chi2_likelihood < 3.0


@pytest.mark.slow
def test_sample_key_semantics(lh):
    """_resample draws fresh keys each iteration, _sample reuses them, update keeps residual keys."""
    keys = {}
    for mode in ("linear_resample", "linear_sample", "nonlinear_update"):
        seen = []
        sv.optimize_kl(
            lh,
            pos0(),
            key=jax.random.PRNGKey(0),
            n_total_iterations=3,
            n_samples=2,
            sample_mode=mode,
            callback=lambda s, st: seen.append(np.asarray(s.keys)),
            **FAST,
        )
        keys[mode] = seen
    assert not np.array_equal(keys["linear_resample"][0], keys["linear_resample"][1])
    np.testing.assert_array_equal(keys["linear_sample"][0], keys["linear_sample"][2])
    np.testing.assert_array_equal(keys["nonlinear_update"][0], keys["nonlinear_update"][2])
    # the first iteration draws the same keys whatever the mode
    np.testing.assert_array_equal(keys["linear_sample"][0], keys["linear_resample"][0])


@pytest.mark.slow
def test_callables_per_iteration(lh):
    seen = []
    _, state = sv.optimize_kl(
        lh,
        pos0(),
        key=jax.random.PRNGKey(1),
        n_total_iterations=3,
        n_samples=lambda i: 1 + i,
        sample_mode=lambda i: "linear_resample" if i < 2 else "nonlinear_update",
        linear_sampling=lambda i: sv.CGConfig(tol=1e-6, maxiter=50 + i),
        nonlinear_update=sv.NewtonCGConfig(xtol=1e-6, maxiter=5),
        kl_minimization=lambda i: sv.NewtonCGConfig(xtol=1e-6, maxiter=3 + i),
        callback=lambda s, st: seen.append(len(s)),
    )
    assert seen == [2, 4, 6]
    assert [r.sample_mode for r in state.history] == ["linear_resample", "linear_resample", "nonlinear_resample"]


@pytest.mark.slow
def test_point_estimates_not_sampled(lh):
    samples, _ = sv.optimize_kl(
        lh,
        pos0(),
        key=jax.random.PRNGKey(2),
        n_total_iterations=2,
        n_samples=2,
        sample_mode="nonlinear_resample",
        point_estimates=("b",),
        **FAST,
    )
    assert np.all(np.asarray(samples.residuals["b"]) == 0.0)
    assert np.any(np.asarray(samples.residuals["a"]) != 0.0)
    # pytree-of-bools form is equivalent
    samples2, _ = sv.optimize_kl(
        lh,
        pos0(),
        key=jax.random.PRNGKey(2),
        n_total_iterations=2,
        n_samples=2,
        sample_mode="nonlinear_resample",
        point_estimates={"a": False, "b": True},
        **FAST,
    )
    np.testing.assert_array_equal(np.asarray(samples.pos["a"]), np.asarray(samples2.pos["a"]))


@pytest.mark.slow
def test_constants_not_optimized(lh):
    start = {"a": jnp.zeros(N), "b": jnp.asarray(0.7)}
    samples, _ = sv.optimize_kl(
        lh,
        start,
        key=jax.random.PRNGKey(2),
        n_total_iterations=2,
        n_samples=1,
        sample_mode="linear_resample",
        constants=("b",),
        **FAST,
    )
    assert float(samples.pos["b"]) == 0.7
    assert np.any(np.asarray(samples.pos["a"]) != 0.0)


@pytest.mark.slow
def test_mirror_off(lh):
    samples, _ = sv.optimize_kl(
        lh,
        pos0(),
        key=jax.random.PRNGKey(2),
        n_total_iterations=1,
        n_samples=3,
        sample_mode="linear_resample",
        mirror_samples=False,
        **FAST,
    )
    assert len(samples) == 3


@pytest.mark.slow
def test_optax_kl_minimization(lh):
    """An optax optimizer as KL minimizer reaches the same MAP as Newton-CG."""
    kw = dict(key=jax.random.PRNGKey(0), n_total_iterations=1, n_samples=0, sample_mode="linear_resample")
    s_newton, _ = sv.optimize_kl(lh, pos0(), kl_minimization=sv.NewtonCGConfig(xtol=1e-12, maxiter=100), **kw)
    s_optax, st = sv.optimize_kl(
        lh, pos0(), kl_minimization=sv.OptaxConfig(optax.lbfgs(), maxiter=500, gtol=1e-9), **kw
    )
    np.testing.assert_allclose(np.asarray(s_optax.pos["a"]), np.asarray(s_newton.pos["a"]), atol=1e-6)


@pytest.mark.slow
def test_no_recompilation_after_first_iteration(lh):
    counts = []
    with CompileCounter() as cc:
        sv.optimize_kl(
            lh,
            pos0(),
            key=jax.random.PRNGKey(4),
            n_total_iterations=4,
            n_samples=2,
            sample_mode="nonlinear_resample",
            callback=lambda s, st: counts.append(cc.count),
            **FAST,
        )
    assert counts[0] > 0
    assert counts[1:] == [counts[0]] * 3, counts


@pytest.mark.slow
def test_no_recompilation_linear_then_update(lh):
    counts = []
    with CompileCounter() as cc:
        sv.optimize_kl(
            lh,
            pos0(),
            key=jax.random.PRNGKey(4),
            n_total_iterations=5,
            n_samples=2,
            sample_mode=lambda i: "linear_resample" if i < 2 else "nonlinear_update",
            callback=lambda s, st: counts.append(cc.count),
            **FAST,
        )
    assert counts[1] == counts[0]  # same mode class: no new compilation
    assert counts[4] == counts[3]  # nonlinear_update keeps its compiled update


@pytest.mark.slow
def test_iteration_log_line(lh, caplog):
    with caplog.at_level(logging.INFO, logger="shardvi"):
        sv.optimize_kl(
            lh,
            pos0(),
            key=jax.random.PRNGKey(0),
            n_total_iterations=1,
            n_samples=1,
            sample_mode="linear_resample",
            **FAST,
        )
    lines = [r.getMessage() for r in caplog.records if r.name == "shardvi"]
    assert any("iteration 1/1" in m and "KL" in m and "red.chi2" in m for m in lines)


@pytest.mark.slow
def test_minisanity_table(lh):
    samples, _ = sv.optimize_kl(
        lh, pos0(), key=jax.random.PRNGKey(0), n_total_iterations=2, n_samples=2, sample_mode="linear_resample", **FAST
    )
    table = sv.minisanity(samples, lh)
    assert "likelihood" in table and "prior['a']" in table and "prior['b']" in table
    stats = sv.residual_stats(samples, lh)
    # reduced chi^2 computed by hand
    nres = jax.vmap(lh.normalized_residual)(samples.samples)
    np.testing.assert_allclose(stats["likelihood"]["."][0], float(jnp.mean(nres**2)), rtol=1e-12)
    assert stats["prior"]["['a']"][3] == N


@pytest.mark.slow
def test_samples_api(lh):
    samples, _ = sv.optimize_kl(
        lh, pos0(), key=jax.random.PRNGKey(0), n_total_iterations=1, n_samples=2, sample_mode="linear_resample", **FAST
    )
    items = list(samples)
    assert len(items) == 4
    np.testing.assert_allclose(np.asarray(items[1]["a"]), np.asarray(samples.pos["a"] + samples.residuals["a"][1]))
    m, s = samples.mean_and_std(lambda x: x["a"] ** 2)
    vals = np.stack([np.asarray(x["a"]) ** 2 for x in items])
    np.testing.assert_allclose(np.asarray(m), vals.mean(0), rtol=1e-12)
    np.testing.assert_allclose(np.asarray(s), vals.std(0, ddof=1), rtol=1e-12)
    # mirrored residuals average to zero: the mean of the samples is the position
    np.testing.assert_allclose(np.asarray(samples.mean()["a"]), np.asarray(samples.pos["a"]), atol=1e-14)
    moved = samples.at({"a": jnp.ones(N), "b": jnp.zeros(())})
    np.testing.assert_allclose(np.asarray(moved[0]["a"]), 1 + np.asarray(samples.residuals["a"][0]))


def test_run_frees_the_last_iterations_samples_before_the_kl_step(monkeypatch, tmp_path):
    """``run`` keeps no reference to an iteration's samples once the next ones are drawn: their residuals are
    freed before the next KL step allocates (``linear_resample`` needs only the position). Those of a checkpoint
    that ``optimize_kl`` resumes too."""
    lh, pos = exp_problem()
    last = []  # weak references to the residuals each callback (or the checkpoint loader) handed out
    alive_at_kl = []
    real_check, real_load = _OKL.check_kl_result, _OKL.ckpt.load_checkpoint

    def at_kl(*args):
        gc.collect()
        alive_at_kl.append([r() is not None for r in last])
        return real_check(*args)

    def load(*args, **kwargs):
        samples, state = real_load(*args, **kwargs)
        last.append(weakref.ref(samples.residuals["a"]))
        return samples, state

    monkeypatch.setattr(_OKL, "check_kl_result", at_kl)
    monkeypatch.setattr(_OKL.ckpt, "load_checkpoint", load)
    kw = dict(
        key=jax.random.PRNGKey(5),
        n_samples=2,
        sample_mode="linear_resample",
        progress=False,
        callback=lambda s, st: last.append(weakref.ref(s.residuals["a"])),
    )
    sv.optimize_kl(lh, pos, n_total_iterations=3, **kw)
    assert alive_at_kl == [[], [False], [False, False]], alive_at_kl
    ck = tmp_path / "ck"
    sv.optimize_kl(lh, pos, n_total_iterations=1, checkpoint_dir=ck, **kw)
    last.clear(), alive_at_kl.clear()
    sv.optimize_kl(lh, pos, n_total_iterations=3, checkpoint_dir=ck, resume=True, **kw)
    assert alive_at_kl == [[False], [False, False]], alive_at_kl  # the loaded samples first


def test_the_likelihood_is_placed_once_when_both_strategies_place_alike():
    """One placed copy of the likelihood's host arrays when the sampling and KL strategies are equal, one per
    strategy when they differ (each on its own devices)."""
    lh, _ = exp_problem()
    same = sv.OptimizeVI(lh, 1, n_samples=1, sample_map="vmap", kl_map=sv.parallel.Vmap())
    assert same._minimize.likelihood is same._draw_linear.likelihood
    two = sv.parallel.ShardMap(devices=jax.devices()[:2])
    mixed = sv.OptimizeVI(lh, 1, n_samples=2, sample_map=two, kl_map="vmap")
    placed = [jax.tree.leaves(s.likelihood)[0] for s in (mixed._draw_linear, mixed._minimize)]
    assert [len(a.sharding.device_set) for a in placed] == [2, 1]
