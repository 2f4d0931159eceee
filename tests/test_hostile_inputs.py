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
