"""The small reconstruction shared by the parallel tests and the two-process worker (not a test module)."""

import functools

import jax
import jax.numpy as jnp
import numpy as np

import shardvi as sv

N = 8
MODES = ("linear_resample", "nonlinear_resample", "nonlinear_update")
CONFIGS = dict(
    linear_sampling=sv.CGConfig(tol=1e-8, maxiter=60),
    nonlinear_update=sv.NewtonCGConfig(xtol=1e-8, maxiter=5),
    kl_minimization=sv.NewtonCGConfig(xtol=1e-8, maxiter=5),
)


def likelihood():
    """A nonlinear model with a replicated scalar: ``exp(0.4 a + 0.5 b) / 1.3`` observed with noise."""
    rng = np.random.default_rng(3)
    truth = {"a": rng.normal(size=N), "b": np.array(0.3)}

    def call(x):
        return jnp.exp(0.4 * x["a"] + 0.5 * x["b"]) / 1.3

    domain = {"a": jax.ShapeDtypeStruct((N,), jnp.float64), "b": jax.ShapeDtypeStruct((), jnp.float64)}
    data = np.asarray(call(truth)) + 0.1 * rng.normal(size=N)
    return sv.Gaussian(data, noise_std=0.1).amend(sv.Model(call, domain))


def position():
    return {"a": jnp.zeros(N), "b": jnp.zeros(())}


def run_reconstruction(strategy, *, n_samples=3, n_iterations=3, kl_strategy=None, lh=None, **kwargs):
    """Three global iterations: linear_resample, nonlinear_resample, nonlinear_update."""
    return sv.optimize_kl(
        lh or likelihood(),
        position(),
        key=jax.random.PRNGKey(1),
        n_total_iterations=n_iterations,
        n_samples=n_samples,
        sample_mode=lambda i: MODES[min(i, 2)],
        sample_map=strategy,
        kl_map=strategy if kl_strategy is None else kl_strategy,
        **{**CONFIGS, **kwargs},
    )


@functools.cache
def reference_steps():
    """``(samples, state)`` before and after each of the three iterations of the 1-device vmap run.

    Cached for the test session (shared by the parallel and distributed tests). Also returns the
    number of compilations after each iteration.
    """
    from shardvi.compilation import CompileCounter

    opt = sv.OptimizeVI(likelihood(), 3, n_samples=3, sample_mode=lambda i: MODES[i], **CONFIGS)
    samples = sv.Samples(position(), jax.tree.map(lambda p: jnp.zeros((0,) + p.shape), position()), None)
    state = opt.init_state(jax.random.PRNGKey(1))
    out, counts = [(samples, state)], []
    with CompileCounter() as cc:
        for _ in range(3):
            samples, state = opt.update(samples, state)
            out.append((samples, state))
            counts.append(cc.count)
    return tuple(out), tuple(counts)


def final_arrays(samples, state):
    """Position, residuals, keys and the KL energy history as numpy arrays."""
    leaves = [np.asarray(x) for x in jax.tree.leaves((samples.pos, samples.residuals, samples.keys))]
    return leaves + [np.asarray([r.kl_energy for r in state.history])]
