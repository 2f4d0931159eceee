"""Errors that point at the cause: 64-bit mode, a likelihood not amended, too few CPU devices."""

import os
import subprocess
import sys
import textwrap

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from _timeouts import scaled

import shardvi as sv


def test_a_float64_model_without_x64_names_the_switch():
    code = textwrap.dedent(
        """
        import jax, jax.numpy as jnp, numpy as np, shardvi as sv
        model = sv.Model(jnp.exp, jax.ShapeDtypeStruct((8,), jnp.float64))
        lh = sv.Gaussian(np.ones(8, np.float32), noise_std=0.1).amend(model)
        for run in (
            lambda: sv.optimize_kl(lh, np.zeros(8), key=jax.random.PRNGKey(0), n_total_iterations=1, n_samples=1),
            lambda: sv.wiener_filter_posterior(lh, key=jax.random.PRNGKey(0), n_samples=1, check_linear=False),
        ):
            try:
                run()
            except ValueError as err:
                print("ERR", err)
        try:  # float64 data become float32: a value beyond its range is named as such, not as non-finite
            sv.Gaussian(np.array([1e200, 1.0]), noise_std=1.0)
        except ValueError as err:
            print("DATA", err)
        """
    )
    env = {k: v for k, v in os.environ.items() if k not in ("JAX_ENABLE_X64", "XLA_FLAGS")}
    env["JAX_PLATFORMS"] = "cpu"
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, env=env, timeout=scaled(120))
    errs = [line for line in out.stdout.splitlines() if line.startswith("ERR")]
    assert len(errs) == 2, out.stdout + out.stderr
    for e in errs:
        assert "float64, but JAX's 64-bit mode is off" in e and "jax.config.update('jax_enable_x64', True)" in e
    (data,) = [line for line in out.stdout.splitlines() if line.startswith("DATA")]
    assert "1 value(s) beyond float32's range" in data and "jax_enable_x64" in data, data


def test_a_likelihood_not_amended_says_amend():
    model = sv.Model(lambda xi: jnp.exp(xi["f"]), {"f": jax.ShapeDtypeStruct((8,), jnp.float64)})
    lh = sv.Gaussian(np.ones(8), noise_std=0.1)
    with pytest.raises(ValueError, match=r"Gaussian is on the data space .* lh\.amend\(model\)"):
        sv.optimize_kl(
            lh, model.init(jax.random.PRNGKey(0)), key=jax.random.PRNGKey(0), n_total_iterations=1, n_samples=1
        )
    with pytest.raises(TypeError, match=r"\.amend\(model\)"):
        sv.wiener_filter_posterior(lh, position={"f": jnp.zeros(8)}, key=jax.random.PRNGKey(0), n_samples=1)
    # an amended one does not get the hint
    with pytest.raises(ValueError, match=r"tree structure") as info:
        sv.optimize_kl(lh.amend(model), jnp.zeros(8), key=jax.random.PRNGKey(0), n_total_iterations=1, n_samples=1)
    assert "amend" not in str(info.value)


def test_too_few_cpu_devices_says_how_to_force_more():
    with pytest.raises(ValueError, match=r"model_shards=2 does not divide the 1 devices.*jax_num_cpu_devices', 2"):
        sv.parallel.ShardMap(devices=jax.devices()[:1], model_shards=2)
    with pytest.raises(ValueError, match=r"model_shards=3 does not divide the 4 devices") as info:
        sv.parallel.ShardMap(devices=jax.devices()[:4], model_shards=3)
    assert "jax_num_cpu_devices" not in str(info.value)  # enough devices: a divisor is what is missing
