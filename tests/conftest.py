"""Strict test set-up: float64 and 4 forced CPU devices, before any JAX op."""

import os

os.environ.setdefault("JAX_PLATFORMS", "cpu")

import jax

jax.config.update("jax_num_cpu_devices", 4)
jax.config.update("jax_enable_x64", True)
jax.config.update("jax_threefry_partitionable", True)

import pytest  # noqa: E402


@pytest.fixture
def key():
    return jax.random.PRNGKey(42)
