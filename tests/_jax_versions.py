"""What differs between the supported jax versions in the tests (not a test module)."""

import pytest

from shardvi._jax_compat import jax_version

#: bitwise comparisons between device counts or layouts that XLA:CPU of jax 0.12 breaks in the last bits
#: (up to 7.1e-15 on values of order 10; jax 0.10.2 and 0.11.2 keep them bitwise): expected to fail there
#: until the reproducibility rewrite covers that XLA
DIFFERS_ON_JAX_0_12 = pytest.mark.xfail(
    jax_version() >= (0, 12),
    reason="bitwise equality across device counts not reached on jax 0.12's XLA:CPU (last-bit differences)",
    strict=False,
)
