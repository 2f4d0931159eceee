"""Inputs that used to fail late or inside JAX: refused up front, or handled."""

import jax
import jax.numpy as jnp
import numpy as np
import pytest

import shardvi as sv
from shardvi.vi.progress import Progress


def _problem():
    rng = np.random.default_rng(0)
    a = jnp.asarray(rng.normal(size=(10, 6)))
    model = sv.Model(lambda x: jnp.exp(0.3 * (a @ x)), jax.ShapeDtypeStruct((6,), jnp.float64))
    return sv.Gaussian(rng.normal(size=10) + 1.0, noise_std=0.5).amend(model)


def test_half_precision_latents_and_data_are_refused():
    with pytest.raises(TypeError, match="bfloat16: the solvers .* need float32 or float64"):
        sv.Model(lambda x: x, jax.ShapeDtypeStruct((4,), jnp.bfloat16))
    for dtype in (jnp.bfloat16, np.float16):
        with pytest.raises(TypeError, match="data has dtype .*float32 or float64"):
            sv.Gaussian(jnp.ones(4, dtype), noise_std=0.1)
    sv.Gaussian(np.ones(4, np.complex64), noise_std=0.1)  # single precision complex stays allowed


def test_a_typed_key_in_the_state_gives_the_raw_keys_samples():
    lh = _problem()
    opt = sv.OptimizeVI(lh, 1, n_samples=1, sample_mode="linear_resample", progress=False)
    pos = jnp.zeros(6)
    empty = sv.Samples(pos, jnp.zeros((0, 6)))
    typed, st_typed = opt.update(empty, sv.OptimizeVIState(0, jax.random.key(4)))
    raw, st_raw = opt.update(empty, sv.OptimizeVIState(0, jax.random.PRNGKey(4)))
    np.testing.assert_array_equal(np.asarray(typed.residuals), np.asarray(raw.residuals))
    np.testing.assert_array_equal(np.asarray(st_typed.key), np.asarray(st_raw.key))
    with pytest.raises(TypeError, match="state.key"):
        opt.update(empty, sv.OptimizeVIState(0, "seed"))


def test_tiny_grid_distances_are_refused_with_the_reason():
    cfm = sv.CorrelatedFieldMaker("s")
    cfm.set_amplitude_total_offset(0.0, (0.1, 0.05))
    with pytest.raises(ValueError, match=r"distances .* give cell volume 0.*moderate"):
        cfm.add_fluctuations((8, 8), 1e-300, fluctuations=(0.6, 0.1), loglogavgslope=(-2.0, 0.3))
        cfm.finalize()


class _Broken(Progress):
    def end_iteration(self, nit, total, line):
        raise RuntimeError("display failed")


def test_a_display_that_raises_keeps_the_finished_iteration(tmp_path):
    lh = _problem()
    with pytest.raises(RuntimeError, match="display failed"):
        sv.optimize_kl(
            lh,
            jnp.zeros(6),
            key=jax.random.PRNGKey(0),
            n_total_iterations=2,
            n_samples=1,
            sample_mode="linear_resample",
            checkpoint_dir=tmp_path / "run",
            progress=_Broken(),
        )
    samples, state = sv.load_checkpoint(tmp_path / "run", jnp.zeros(6))
    assert state.nit == 1 and len(samples) == 2


def test_samples_index_is_range_checked_and_integer():
    pos = {"a": jnp.zeros(3)}
    s = sv.Samples(pos, {"a": jnp.stack([jnp.ones(3), -jnp.ones(3)])})
    np.testing.assert_array_equal(s[-1]["a"], -np.ones(3))
    assert s[:5]["a"].shape == (2, 3) and s[np.array([1, 0, 1])]["a"].shape == (3, 3)
    assert s[np.array([False, True])]["a"].shape == (1, 3)
    for bad in (2, -3, np.array([0, 2]), np.array([True])):
        with pytest.raises(IndexError, match="Samples .*index"):
            s[bad]
    for bad in (1.5, np.float64(0.0), True, None):
        with pytest.raises(TypeError, match="Samples index must be an integer"):
            s[bad]
    with pytest.raises(IndexError, match="index 1 is out of range for 1 sample"):
        sv.Samples(pos, {"a": jnp.zeros((0, 3))})[1]  # no residuals: the one sample is pos


def test_resuming_a_checkpoint_beyond_n_total_iterations_is_refused(tmp_path):
    lh = _problem()
    kw = dict(
        key=jax.random.PRNGKey(0),
        n_samples=1,
        sample_mode="linear_resample",
        progress=False,
        checkpoint_dir=tmp_path / "run",
    )
    sv.optimize_kl(lh, jnp.zeros(6), n_total_iterations=1, **kw)
    with pytest.raises(ValueError, match=r"n_total_iterations=0 is below the 1 iterations the checkpoint"):
        sv.optimize_kl(lh, jnp.zeros(6), n_total_iterations=0, resume=True, **kw)
    _, state = sv.optimize_kl(lh, jnp.zeros(6), n_total_iterations=1, resume=True, **kw)  # finished: its result
    assert state.nit == 1


def test_optimizevi_update_needs_samples_and_init_state_a_count():
    opt = sv.OptimizeVI(_problem(), 1, n_samples=1, sample_mode="linear_resample", progress=False)
    with pytest.raises(TypeError, match="samples must be a shardvi.Samples, got ArrayImpl"):
        opt.update(jnp.zeros(6), opt.init_state(jax.random.PRNGKey(0)))
    with pytest.raises(ValueError, match="nit must be an int >= 0"):
        opt.init_state(jax.random.PRNGKey(0), nit=-5)
    with pytest.raises(TypeError, match="nit must be an int >= 0"):
        opt.init_state(jax.random.PRNGKey(0), nit=1.5)


def test_save_checkpoint_checks_samples_and_state(tmp_path):
    s = sv.Samples({"a": jnp.zeros(3)}, {"a": jnp.zeros((2, 3))})
    with pytest.raises(TypeError, match="samples must be a shardvi.Samples, got dict"):
        sv.save_checkpoint(tmp_path / "ck", {"a": jnp.zeros(3)}, sv.OptimizeVIState(0, jax.random.PRNGKey(0)))
    with pytest.raises(TypeError, match="state must be an OptimizeVIState"):
        sv.save_checkpoint(tmp_path / "ck", s, None)
    with pytest.raises(TypeError, match="state.key must be (one threefry|a jax.random key)"):
        sv.save_checkpoint(tmp_path / "ck", s, sv.OptimizeVIState(0, "seed"))
    assert not (tmp_path / "ck").exists()


def test_a_callback_of_the_wrong_arity_is_refused_before_iteration_0():
    lh = _problem()
    with pytest.raises(TypeError, match=r"callback must be callable as callback\(samples, state\)"):
        sv.optimize_kl(
            lh,
            jnp.zeros(6),
            key=jax.random.PRNGKey(0),
            n_total_iterations=1,
            n_samples=1,
            sample_mode="linear_resample",
            progress=False,
            callback=lambda: None,
        )
    opt = sv.OptimizeVI(lh, 1, n_samples=1, sample_mode="linear_resample", progress=False)
    start = sv.Samples(jnp.zeros(6), jnp.zeros((0, 6)))
    with pytest.raises(TypeError, match="callback must be callable"):
        opt.run(start, opt.init_state(jax.random.PRNGKey(0)), callback=lambda s, st, extra: None)


def test_nonlinear_update_of_samples_mirrored_otherwise_names_mirror_samples():
    mirrored = sv.Samples(jnp.zeros(6), 0.1 * jnp.stack([jnp.ones(6), -jnp.ones(6)]), jnp.zeros((1, 2), jnp.uint32))
    with pytest.raises(ValueError, match=r"2 residuals for 1 keys.*pass mirror_samples=True"):
        sv.optimize_kl(
            _problem(),
            mirrored,
            key=jax.random.PRNGKey(1),
            n_total_iterations=1,
            n_samples=1,
            sample_mode="nonlinear_update",
            mirror_samples=False,
            progress=False,
        )


def test_run_refuses_a_state_beyond_its_iterations():
    lh = _problem()
    opt = sv.OptimizeVI(lh, 1, n_samples=1, sample_mode="linear_resample", progress=False)
    samples = sv.Samples(jnp.zeros(6), jnp.zeros((0, 6)))
    with pytest.raises(ValueError, match="state.nit=2 completed iterations is above n_total_iterations=1"):
        opt.run(samples, opt.init_state(jax.random.PRNGKey(0), nit=2))
    out, state = opt.run(samples, opt.init_state(jax.random.PRNGKey(0), nit=1))  # finished: returned as given
    assert np.array_equal(out.pos, samples.pos) and len(out) == 0 and state.nit == 1
