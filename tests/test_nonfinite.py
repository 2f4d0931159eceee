"""NaN/inf during optimization stops with an error naming iteration and stage; the last good state stays."""

import jax
import jax.numpy as jnp
import numpy as np
import pytest

import shardvi as sv

N = 5


def sqrt_lh():
    # s = sqrt(xi + 0.2): NaN for xi < -0.2. The posterior is wide, so samples around the MAP fall there.
    model = sv.Model(lambda xi: jnp.sqrt(xi + 0.2), jax.ShapeDtypeStruct((N,), jnp.float64))
    return sv.Gaussian(np.full(N, 0.5), noise_std=3.0).amend(model)


@pytest.mark.slow
def test_nan_in_kl_names_iteration_and_stage(tmp_path):
    d = str(tmp_path / "ck")
    with pytest.raises(sv.NonFiniteError, match=r"KL minimization at iteration 1") as info:
        sv.optimize_kl(
            sqrt_lh(),
            jnp.full(N, 0.1),
            key=jax.random.PRNGKey(0),
            n_total_iterations=3,
            n_samples=lambda i: 0 if i == 0 else 2,
            sample_mode="linear_resample",
            kl_minimization=sv.NewtonCGConfig(xtol=1e-6, maxiter=5),
            checkpoint_dir=d,
        )
    assert info.value.iteration == 1 and info.value.stage == "KL minimization"
    assert isinstance(info.value, FloatingPointError)
    # the last good state (after iteration 0) is saved and loads
    samples, state = sv.load_checkpoint(d, jnp.zeros(N))
    assert state.nit == 1 and len(samples) == 0
    assert bool(jnp.all(jnp.isfinite(samples.pos)))


@pytest.mark.slow
def test_nan_in_sampling_names_stage():
    model = sv.Model(lambda xi: jnp.exp(xi), jax.ShapeDtypeStruct((N,), jnp.float64))
    lh = sv.Gaussian(np.ones(N), noise_std=1.0).amend(model)
    bad = sv.Likelihood(
        lh.energy,
        lh.transformation,
        domain=lh.domain,
        metric=lambda x, t: t * jnp.nan,
        left_sqrt_metric=lh.left_sqrt_metric,
        lsm_tangents_shape=lh.lsm_tangents_shape,
    )
    with pytest.raises(sv.NonFiniteError, match=r"sampling \(MGVI linear CG\) at iteration 0"):
        sv.optimize_kl(
            bad,
            jnp.zeros(N),
            key=jax.random.PRNGKey(0),
            n_total_iterations=1,
            n_samples=1,
            sample_mode="linear_resample",
        )


def test_line_search_backs_off_nan_region():
    """A trial step into a NaN region is rejected by the line search, not propagated."""
    model = sv.Model(lambda xi: jnp.sqrt(xi + 0.2), jax.ShapeDtypeStruct((N,), jnp.float64))
    lh = sv.Gaussian(np.full(N, 0.01), noise_std=0.01).amend(model)  # optimum near the NaN boundary
    samples, state = sv.optimize_kl(
        lh,
        jnp.full(N, 1.0),
        key=jax.random.PRNGKey(0),
        n_total_iterations=1,
        n_samples=0,
        sample_mode="linear_resample",
        kl_minimization=sv.NewtonCGConfig(xtol=1e-10, maxiter=50),
    )
    assert bool(jnp.all(jnp.isfinite(samples.pos)))
    np.testing.assert_allclose(np.asarray(jnp.sqrt(samples.pos + 0.2)), 0.01, atol=2e-3)
