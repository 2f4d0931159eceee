"""Results of runs on different device sets mix after ``Samples.to_host`` / ``Samples.to_device``."""

import jax
import jax.numpy as jnp
import numpy as np
import pytest

import shardvi as sv


def _run(sample_map):
    rng = np.random.default_rng(0)
    a = jnp.asarray(rng.normal(size=(12, 8)))
    lh = sv.Gaussian(rng.normal(size=12), noise_std=0.3).amend(
        sv.Model(lambda x: a @ x, jax.ShapeDtypeStruct((8,), jnp.float64))
    )
    samples, _ = sv.wiener_filter_posterior(lh, key=jax.random.PRNGKey(0), n_samples=4, sample_map=sample_map)
    return samples


def test_one_and_four_device_results_mix_after_to_host_and_to_device():
    s1 = _run("vmap")
    s4 = _run(sv.parallel.ShardMap(devices=jax.devices()[:4]))
    assert len(s4.residuals.sharding.device_set) == 4
    with pytest.raises(ValueError, match="incompatible devices"):
        jax.jit(lambda a, b: a - b)(s1.residuals, s4.residuals)  # what to_host / to_device are for
    h1, h4 = s1.to_host(), s4.to_host()
    assert isinstance(h4.pos, np.ndarray) and isinstance(h4.residuals, np.ndarray) and isinstance(h4.keys, np.ndarray)
    np.testing.assert_array_equal(h1.residuals - h4.residuals, 0.0)  # the bitwise contract, on the host
    d4 = s4.to_device()
    assert d4.residuals.sharding.device_set == {jax.devices()[0]}
    assert float(jnp.max(jnp.abs(s1.to_device().residuals - d4.residuals))) == 0.0
    assert len(d4) == len(s4) == 8
    m, s = h4.mean_and_std()
    np.testing.assert_array_equal(np.asarray(m), np.asarray(s4.mean_and_std()[0]))
    with pytest.raises(TypeError, match="device must be a jax.Device"):
        s4.to_device("cpu:0")
