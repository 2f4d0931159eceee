"""Multi-device strategies in optimize_kl: bitwise reproducibility, fast mode, no recompilation.

Every run does three global iterations (linear_resample, nonlinear_resample,
nonlinear_update) with 3 sample pairs, so the sample axis (3 keys, 6 samples)
is padded on 2 and 4 devices.
"""

import functools
import os
import warnings

import jax
import numpy as np
import pytest
from _parallel_problem import CONFIGS, MODES, final_arrays, likelihood, run_reconstruction
from _parallel_problem import reference_steps as cached_reference_steps

import shardvi as sv
from shardvi.compilation import CompileCounter

pytestmark = pytest.mark.product_compiler  # bitwise across device counts and strategies (tests/conftest.py)

_arrays = final_arrays


def _run_counting(strategy, **kwargs):
    """Run and record the number of compilations after each iteration."""
    counts = []
    with CompileCounter() as cc:
        samples, state = run_reconstruction(strategy, callback=lambda s, st: counts.append(cc.count), **kwargs)
    return samples, state, counts


def _steps(opt, inputs):
    return [opt.update(*inp) for inp in inputs]


@pytest.fixture(scope="module")
def reference_steps():
    """(samples, state) before and after each iteration of the 1-device vmap run (cached per session)."""
    steps, counts = cached_reference_steps()
    assert counts[2] == counts[1], "the 1-device vmap reference recompiled in iteration 3"
    assert [r.sample_mode for r in steps[-1][1].history] == list(MODES)
    return steps


@pytest.fixture(scope="module")
def reference(reference_steps):
    """Final arrays of the 1-device vmap run (OptimizeVI.update is what optimize_kl iterates)."""
    return _arrays(*reference_steps[-1])


STRATEGIES = {"shard_map": sv.parallel.ShardMap, "pmap": sv.parallel.Pmap, "jit": sv.parallel.JitSharding}
# one device for ShardMap only: Pmap's and JitSharding's 1-device runs (no padding, one chunk) took compile
# time and covered no code path beyond theirs on 2 and 4 devices and the 1-device ShardMap and lax_map runs
CASES = [("lax_map", 1), ("shard_map", 1)] + [(name, n) for name in STRATEGIES for n in (2, 4)]


@pytest.mark.slow
@pytest.mark.parametrize("name,n_devices", CASES, ids=[f"{n}-{d}dev" for n, d in CASES])
def test_bitwise_equal_to_one_device_vmap(reference, name, n_devices):
    """Samples, position, keys and KL energies of every iteration are bitwise those of 1-device vmap."""
    devices = jax.devices()[:n_devices]
    # strategies by name with optimize_kl's devices= (also exercises get_strategy)
    samples, state, counts = _run_counting(name, devices=devices)
    got = _arrays(samples, state)
    assert len(got) == len(reference)
    for a, b in zip(got, reference):
        assert a.dtype == b.dtype and a.shape == b.shape
        assert np.array_equal(a, b), f"{name} on {n_devices} device(s) differs: max |diff| {np.max(np.abs(a - b))}"
    # no recompilation between global iterations: iteration 3 reuses everything compiled before
    assert counts[2] == counts[1], f"{name} recompiled in iteration 3 ({counts})"
    if name != "lax_map":
        strat = sv.parallel.get_strategy(name, "sample_map", devices)
        assert isinstance(strat, STRATEGIES[name]) and strat.devices == tuple(devices)


@pytest.mark.slow
def test_sample_map_and_kl_map_independent(reference):
    """Different strategies (and device sets) for sampling and KL give the same bits."""
    devs = jax.devices()
    samples, state, counts = _run_counting(
        sv.parallel.ShardMap(devices=devs[:4]), kl_strategy=sv.parallel.JitSharding(devices=devs[1:3])
    )
    for a, b in zip(_arrays(samples, state), reference):
        assert np.array_equal(a, b)
    assert counts[2] == counts[1]
    # the result lives on the KL strategy's devices, replicated: usable by eager code
    assert samples.pos["a"].sharding.device_set == set(devs[1:3])
    assert samples.residuals["a"].sharding.is_fully_replicated


@pytest.mark.slow
def test_fast_mode_within_1e12(reference_steps):
    """reduce="psum": every global iteration (same inputs) agrees with the reference to <= 1e-12 relative.

    Only the cross-device sums differ (~1 ulp each). Over several nonlinear
    iterations such differences can grow like any rounding perturbation, so
    each iteration is compared from the reference's input state. (Pmap and
    JitSharding fast means: tests/test_parallel_strategies.py.)
    """
    strat = sv.parallel.ShardMap(devices=jax.devices()[:4], reduce="psum")
    opt = sv.OptimizeVI(
        likelihood(), 3, n_samples=3, sample_mode=lambda i: MODES[i], sample_map=strat, kl_map=strat, **CONFIGS
    )
    for k, ((s, st), (rs, rst)) in enumerate(zip(_steps(opt, reference_steps[:-1]), reference_steps[1:])):
        got = jax.tree.leaves((s.pos, s.residuals)) + [st.history[-1].kl_energy]
        ref = jax.tree.leaves((rs.pos, rs.residuals)) + [rst.history[-1].kl_energy]
        for a, b in zip(got, ref):
            a, b = np.asarray(a), np.asarray(b)
            rel = np.max(np.abs(a - b)) / np.max(np.abs(b))
            assert rel <= 1e-12, f"iteration {k + 1}: relative difference {rel:.3e}"


def _cf_likelihood():
    """A 2-D correlated field with flexibility (FFTs, cumsums, scalar normalizations), exp link, full data.

    8 x 8 pixels: the property does not depend on the grid, compilation time (all of this test's time) does
    (12 x 12: ~25 % more). Without the ``array / scalar`` rewrite of ``reproducible_jit`` shard_map(2) and
    pmap(4) differ from vmap here (by ~1e-13), so the test catches the loss of that rewrite.
    """
    n = 8
    cfm = sv.CorrelatedFieldMaker("cf")
    cfm.set_amplitude_total_offset(0.0, (0.5, 0.1))
    cfm.add_fluctuations(
        (n, n),
        (1 / n, 1 / n),
        fluctuations=(1.0, 0.3),
        loglogavgslope=(-3.0, 0.5),
        flexibility=(0.5, 0.2),
        asperity=None,
        prefix="ax",
    )
    field = cfm.finalize()
    model = sv.Model(lambda xi: jax.numpy.exp(field(xi)), field.domain)
    truth = model.init(jax.random.PRNGKey(0))
    data = model(truth) + 0.1 * jax.random.normal(jax.random.PRNGKey(1), (n, n))
    return sv.Gaussian(data, noise_std=0.1).amend(model), model.init(jax.random.PRNGKey(2))


@functools.cache
def _cf_run(strategy_name, n_devices, mode):
    """Final arrays of one iteration (``mode``) on the correlated-field problem; cached per test process."""
    lh, pos0 = _cf_likelihood()
    pos0 = jax.tree.map(lambda x: 0.1 * x, pos0)
    cfg = dict(
        linear_sampling=sv.CGConfig(tol=1e-6, maxiter=40),
        nonlinear_update=sv.NewtonCGConfig(xtol=1e-6, maxiter=3),
        kl_minimization=sv.NewtonCGConfig(xtol=1e-6, maxiter=3),
    )
    strategy = {"vmap": sv.parallel.Vmap, **STRATEGIES}[strategy_name]
    strategy = strategy() if strategy_name == "vmap" else strategy(devices=jax.devices()[:n_devices])
    samples, state = sv.optimize_kl(
        lh,
        pos0,
        key=jax.random.PRNGKey(3),
        n_total_iterations=1,
        n_samples=2,
        sample_mode=mode,
        sample_map=strategy,
        kl_map=strategy,
        **cfg,
    )
    return _arrays(samples, state)


@pytest.mark.slow
def test_correlated_field_bitwise_across_device_counts():
    """A realistic model, not only the small pointwise one: 1-device vmap == jit on 4 devices, bitwise.

    XLA rewrites ``array / scalar`` into a multiplication by the reciprocal
    in SPMD programs but not in single-device ones (the correlated field's
    normalizations); ``reproducible_jit`` does that rewrite itself,
    everywhere. The model's normalizations are in the sampling and KL steps,
    so MGVI with one multi-device strategy catches the loss of that rewrite;
    the geoVI step and the other strategies run bitwise on the small model
    (``test_bitwise_equal_to_one_device_vmap``) and on the
    masked and radio models (``tests/test_model_parallel.py``), ``shard_map``
    on this model's flagship form in ``tests/test_demos.py`` (multi-device
    comparison). A geoVI step or a ``pmap`` case of this model would add
    much compile time and exercise no code the others do not.

    ``jit``: the correlated field's FFT carries a partitioning rule
    (``shardvi.parallel.fft``), so each device transforms its own samples —
    no warning (the strategy warns about FFTs it cannot split), no gathered
    batch (``tests/test_parallel_strategies.py``).
    """
    mode = "linear_resample"
    with warnings.catch_warnings():
        warnings.simplefilter("error", UserWarning)
        warnings.simplefilter("ignore", sv.ConvergenceWarning)  # short runs: solves stopped at maxiter by design
        got = _cf_run("jit", 4, mode)
    ref = _cf_run("vmap", 1, mode)
    assert len(got) == len(ref)
    for a, b in zip(got, ref):
        assert np.array_equal(a, b), f"jit on 4 devices differs from 1-device vmap: max |diff| {np.max(np.abs(a - b))}"


def _cf16():
    """A 16^2 log-normal correlated field with data, and a position one MGVI iteration produced on it (stored:
    ``tests/data/cf16_after_one_iteration.npz``; the field's structure there, not a random position, is what
    brought the programs apart)."""
    n = 16
    cfm = sv.CorrelatedFieldMaker("cf")
    cfm.set_amplitude_total_offset(0.0, (0.5, 0.1))
    cfm.add_fluctuations(
        (n, n), 1.0 / n, fluctuations=(1.0, 0.3), loglogavgslope=(-3.0, 0.5), flexibility=(0.5, 0.2), prefix="ax"
    )
    cf = cfm.finalize()
    model = sv.Model(lambda xi: jax.numpy.exp(cf(xi)), cf.domain)
    d = model(model.init(jax.random.PRNGKey(1))) + 0.1 * jax.random.normal(jax.random.PRNGKey(2), (n, n))
    stored = np.load(os.path.join(os.path.dirname(os.path.abspath(__file__)), "data", "cf16_after_one_iteration.npz"))
    return cf, sv.Gaussian(d, noise_std=0.1).amend(model), {k: stored[k] for k in stored.files}


@pytest.mark.product_compiler  # programs compared bitwise (tests/conftest.py)
def test_batched_per_sample_program_bitwise_unbatched_on_a_correlated_field():
    """The per-sample code batched over a leading device axis (``jit(vmap(...))``) and unbatched (``Vmap``, and
    every strategy's per-device code), at a position an MGVI iteration reached on a 16^2 correlated field, where
    two things could make them differ in the last bits:

    - the field's tangent: a harmonic amplitude ``azm * ahat[index]`` has the JVP ``dazm * ahat[index] + azm *
      dahat[index]``, which XLA:CPU may contract into an FMA in one program and not in the other (the
      one-sub-domain amplitude is one gather from the table ``[azm, a_k]``);
    - the sampling CG (one iteration): XLA may compute the linearization's residuals (``exp(f)``) inside the loop
      body in one program (they pass an optimization barrier, ``tree_math.linearize_with_adjoint``).
    """
    _assert_per_sample_pieces_bitwise(*_cf16(), cg_iterations=1)


def _assert_per_sample_pieces_bitwise(cf, lh, pos, cg_iterations):
    """An MGVI residual (``cg_iterations`` CG iterations) and the field's tangent at ``pos + residual`` for 4 keys:
    ``JitSharding`` on 2 devices and the per-sample code batched over a device axis of one bitwise ``Vmap``."""
    from shardvi.parallel.reproducible import reproducible_jit
    from shardvi.vi.sampling import draw_linear_residual

    keys = jax.random.split(jax.random.PRNGKey(7), 4)
    tangent = jax.tree.map(lambda v: 0.7 * v, cf.init(jax.random.PRNGKey(4)))
    cg = sv.CGConfig(tol=None, miniter=cg_iterations, maxiter=cg_iterations)

    def per_sample(lik, p, k):
        r = draw_linear_residual(lik, p, k, cg)[0]
        return r, jax.jvp(cf, (jax.tree.map(jax.numpy.add, p, r),), (tangent,))[1]

    def parts(st):
        f = reproducible_jit(lambda lik, p, k: st.map(per_sample, (None, None, 0))(lik, p, k))
        return jax.tree.leaves(f(st.place(lh), st.place(pos), st.place(keys)))

    def batched(lik, p, k):  # the samples behind a device axis of one, mapped by jax.vmap
        one = lambda kk: sv.parallel.Vmap().map(per_sample, (None, None, 0))(lik, p, kk)  # noqa: E731
        return jax.tree.map(lambda x: x[0], jax.vmap(one)(k[None]))

    want = parts(sv.parallel.Vmap())
    assert np.any(want[-1] != 0)
    got = {
        "JitSharding": parts(sv.parallel.JitSharding(devices=jax.devices()[:2])),
        "batched": jax.tree.leaves(reproducible_jit(batched)(lh, pos, keys)),
    }
    for name, leaves in got.items():
        for a, b in zip(leaves, want):
            a, b = np.asarray(a), np.asarray(b)
            assert np.array_equal(a, b), f"{name} differs from Vmap: max |diff| {np.max(np.abs(a - b))}"


@pytest.mark.product_compiler  # programs compared bitwise (tests/conftest.py)
def test_per_sample_programs_bitwise_on_a_field_of_two_sub_domains():
    """A correlated field of two sub-domains (16x12 and 6 pixels) multiplies their amplitudes, ``azm * ahat_1 *
    ahat_2`` (a multiply-add in its JVP, which XLA:CPU may contract into FMAs differently in different programs).
    ``JitSharding`` (each device runs ``Vmap``'s unbatched per-sample program) and the batched program give the
    residual and the field's tangent of ``Vmap`` bitwise (without the barrier of ``linearize_with_adjoint``,
    ``JitSharding`` is 1.9e-13 off here)."""
    cfm = sv.CorrelatedFieldMaker("cf")
    cfm.set_amplitude_total_offset(0.0, (0.5, 0.1))
    cfm.add_fluctuations((16, 12), 1.0 / 16, fluctuations=(1.0, 0.3), loglogavgslope=(-3.0, 0.5), prefix="sp")
    cfm.add_fluctuations((6,), 1.0 / 6, fluctuations=(0.7, 0.2), loglogavgslope=(-2.0, 0.5), prefix="tm")
    cf = cfm.finalize()
    model = sv.Model(lambda xi: jax.numpy.exp(cf(xi)), cf.domain)
    d = model(model.init(jax.random.PRNGKey(1))) + 0.1 * jax.random.normal(jax.random.PRNGKey(2), cf.field_shape)
    pos = jax.tree.map(lambda v: 0.8 * v, model.init(jax.random.PRNGKey(3)))
    _assert_per_sample_pieces_bitwise(cf, sv.Gaussian(d, noise_std=0.1).amend(model), pos, cg_iterations=4)


def _poisson_likelihood():
    """Counts with an exp link on the small problem's model: the square roots and divisions of the Poisson
    metric (``e / sqrt(s)``, ``t / s``) in every step, geoVI included."""
    rng = np.random.default_rng(5)
    base = likelihood()
    rate = np.asarray(base.model({"a": rng.normal(size=8), "b": np.array(0.3)})) * 4.0
    return sv.Poisson(rng.poisson(rate).astype(np.float64)).amend(base.model)


@pytest.mark.slow
def test_poisson_bitwise_under_jit_sharding():
    """A Poisson run through linear_resample, nonlinear_resample and nonlinear_update: ``JitSharding`` on 4
    devices (GSPMD, where XLA once rewrote ``x / sqrt(y)`` differently than in one-device programs) is
    bitwise the 1-device vmap run."""
    ref = _arrays(*run_reconstruction("vmap", lh=_poisson_likelihood()))
    got = _arrays(*run_reconstruction(sv.parallel.JitSharding(devices=jax.devices()[:4]), lh=_poisson_likelihood()))
    assert len(got) == len(ref)
    for a, b in zip(got, ref):
        assert np.array_equal(a, b), f"jit on 4 devices differs from 1-device vmap: max |diff| {np.max(np.abs(a - b))}"
