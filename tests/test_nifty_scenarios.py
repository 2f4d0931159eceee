"""Scenarios ported from NIFTy.re's upstream test suite (NIFTy-PPL/NIFTy, ``test/test_re/``).

The problems, parameter grids, identities and tolerances carry over; the code is shardvi's. Where upstream
loops over a grid whose every point compiles new programs (this suite is bound by XLA compilation), one
problem covers several points: one optimize_kl run whose iterations go through several sample modes,
one program for all likelihood kinds or all test functions.

Ported (upstream ``test/test_re/<file>::<test>`` -> here; tolerance upstream -> here):

- test_optimize_kl.py::test_optimize_kl_sample_consistency -> test_optimize_kl_samples_are_the_public_
  sampling_functions: optimize_kl's residuals are ``draw_linear_residual`` / ``nonlinearly_update_residual``
  called by hand with ``samples.keys``; rtol 1e-7 -> rtol 1e-12 and equal CG / Newton iteration counts;
  point-estimate residuals exactly 0 (as upstream). Upstream: 5 likelihoods x 3 latent shapes x 2 seeds x
  point estimates on/off x linear/nonlinear_resample; here: the variable-covariance Student-t (the kind whose
  geoVI step takes the explicit square-root path) on a dict latent with a point estimate and a constant,
  through linear_sample, nonlinear_sample (keys reused) and nonlinear_update. The engine calls the same public
  functions for every likelihood; the likelihoods' own maths is below and in tests/test_likelihoods.py.
- test_optimize_kl.py::test_optimize_kl_constants -> test_constants_stay_and_the_rest_moves: exact (as upstream).
- test_optimize_kl.py::test_optimize_kl_device_consistency -> test_optimize_kl_bitwise_across_device_maps:
  rtol = atol = 1e-5 -> bitwise (positions, residuals, keys, KL energy): pmap sampling with shard_map KL,
  2 pairs = 4 samples on 4 devices, the first iteration; the modes x strategies x 1/2/4 devices grid is
  tests/test_parallel_reproducible.py's (bitwise).
- test_ncg.py::test_minimize_ncg, test_minimize_trust_ncg -> test_minimizers_on_standard_functions (and
  test_eggholder_reference_minimum_is_scipys): rtol 2e-6 / atol 2e-5 against scipy's trust-ncg -> atol 1e-9
  against the closed-form minima and scipy at gtol 1e-12; both solvers on all four functions (upstream
  leaves himmelblau out for Newton-CG).
- test_ncg.py::test_cg_steihaug_vs_cg_consistency -> test_steihaug_with_infinite_radius_is_cg: rtol 1e-4 /
  atol 1e-5 -> 1e-9 of the largest entry, also against the Krylov-space closed form.
- test_energies.py, test_likelihood_impl.py::test_gaussian_vs_vcgaussian_consistency,
  test_studt_vs_vcstudt_consistency -> test_gaussian_is_variable_covariance_gaussian_with_fixed_std,
  test_student_t_is_variable_covariance_student_t_with_fixed_std: 10 eps (as upstream).
- test_likelihood_impl.py::test_sqrt_metric_vs_metric_consistency, test_transformation_vs_sqrt_metric_
  consistency -> test_metric_from_left_sqrt_metric, test_metric_from_transformation: rtol 4 eps (as upstream;
  tests/test_likelihoods.py checks the same identities densely at 1e-12).
- test_likelihood_impl.py::test_residuals_allfinite -> test_normalized_residuals_finite.
- test_likelihood.py::test_nonvariable_likelihood_add, test_variable_likelihood_add ->
  test_pytree_data_likelihood_is_the_sum_of_its_parts: rtol 1e-7 (assert_allclose's default) -> 1e-13.
- test_evi.py::test_mgvi_wiener_filter_consistency (line-of-sight response, Gaussian-kernel prior) ->
  test_wiener_filter_consistency_metric, test_wiener_filter_consistency_exact_posterior: metric atol 1e-10 /
  rtol 1e-12 -> rtol 1e-12 of the largest entry; exact posterior mean 1e-8 -> 1e-11; sample covariance:
  upstream's bound and, in addition, 5 standard errors per entry. Its other parts are tests/test_wiener.py's
  (test_kl_minimum_is_posterior_mean: the KL minimum of linear_sample and nonlinear_sample runs is the
  posterior mean; test_linear_sample_covariance: the MGVI draws' covariance).

Added beside the ports: test_jit_strategy_is_bitwise_for_a_division_by_a_square_root: the ``jit`` strategy keeps
the bitwise contract for ``x / sqrt(y)`` (e.g. Poisson's square root metric; ``reproducible_jit`` rewrites it);
a whole Poisson run under ``jit``: tests/test_parallel_reproducible.py::test_poisson_bitwise_under_jit_sharding.

Not ported: test_custom_map.py (NIFTy.re's ``smap``/``lmap`` against ``vmap``: every shardvi strategy's
``map`` against ``Vmap`` is tests/test_parallel_strategies.py::test_chunked_draws_bitwise_for_any_device_count
and tests/test_strategy_base.py), test_estimate_evidence_lower_bound.py (its evidence bracket of a linear
fit: tests/test_evidence.py against exact evidences; its eigenvector files and resume options have no
counterpart), ``freeze``/``partial_insert_and_remove`` and ``concatenate_zip`` (no shardvi counterpart), the
comparisons with classic NIFTy (nifty8 / nifty.cl), and the tests of parts shardvi does not have (HMC,
refinement, HEALPix, multi-grid, Lanczos, ...).
"""

import functools

import jax
import jax.numpy as jnp
import numpy as np
import pytest
import scipy.optimize as so

import shardvi as sv
from shardvi.minimizers import NewtonCGConfig, TrustRegionConfig, newton_cg
from shardvi.minimizers.cg import cg_solve
from shardvi.minimizers.trust_region import _steihaug
from shardvi.parallel import JitSharding, Pmap, ShardMap, Vmap, place
from shardvi.vi import VariableCovarianceStudentT

EPS = float(np.finfo(np.float64).eps)


def _jit(fn, **kw):
    """The tests' own programs: the engine's XLA options (without fusion emitters they compile ~3x faster) at
    LLVM level 0 (what tests/conftest.py gives the engine in tests that compare no bits across programs)."""
    return sv.parallel.reproducible_jit(fn, compiler_options={"xla_backend_optimization_level": 0}, **kw)


def _sds(*shape):
    return jax.ShapeDtypeStruct(shape, jnp.float64)


# ---------------------------------------------------------------------------------------------------
# optimize_kl (test_optimize_kl.py)
# ---------------------------------------------------------------------------------------------------
def _problem():
    """A variable-covariance Student-t likelihood (mean and scale inferred), drawn like upstream's ``LH_INIT``
    entry (normal data, Exp(1) degrees of freedom, positive scales), on a dict latent: the mean model uses
    ``"w"[0]`` and an offset ``"s"``, the scale model ``"w"[1]`` and ``"k"``."""
    rng = np.random.default_rng(42)
    dom = {"w": _sds(2, 3), "s": _sds(), "k": _sds()}

    def mean_std(x):
        return x["w"][0] + x["s"], jnp.exp(1.0 + 0.3 * x["w"][1] + 0.1 * x["k"])

    return VariableCovarianceStudentT(rng.normal(size=3), rng.exponential(size=3) + 0.5).amend(sv.Model(mean_std, dom))


LH = _problem()
POS0 = jax.tree.map(lambda d: jnp.asarray(0.3 * np.random.default_rng(1).normal(size=d.shape)), LH.domain)
POINT_ESTIMATES = ("s",)  # not sampled: residual exactly 0
CONSTANTS = ("k",)  # not optimized: stays where it started
SAMPLE_MASK = {k: k not in POINT_ESTIMATES for k in LH.domain}
N_PAIRS = 2  # 4 samples: one per device (upstream's pmap case n_samples * 2 == len(devices))
MODES = ("linear_sample", "nonlinear_sample", "nonlinear_update")
LIN = sv.CGConfig(tol=1e-10, maxiter=100)
NONLIN = sv.NewtonCGConfig(xtol=1e-8, maxiter=20)
KL = sv.NewtonCGConfig(xtol=1e-8, maxiter=10)


def _run(sample_map="vmap", kl_map="vmap", n_iterations=None):
    """The iterations of MODES (all, or the first ``n_iterations``); the samples after each, the final state."""
    n_iterations = len(MODES) if n_iterations is None else n_iterations
    seen = []
    _, state = sv.optimize_kl(
        LH,
        POS0,
        key=jax.random.PRNGKey(12),
        n_total_iterations=n_iterations,
        n_samples=N_PAIRS,
        sample_mode=lambda i: MODES[i],
        point_estimates=POINT_ESTIMATES,
        constants=CONSTANTS,
        linear_sampling=LIN,
        nonlinear_update=NONLIN,
        kl_minimization=KL,
        sample_map=sample_map,
        kl_map=kl_map,
        callback=lambda s, st: seen.append(s),
        progress=False,
    )
    assert [r.sample_mode for r in state.history] == list(MODES[:n_iterations])
    return seen, state


@pytest.fixture(scope="module")
def vmap_run():
    """The 1-device vmap run (module scope: compiled at the shipped level, the bitwise reference)."""
    return _run()


def _arrays(samples_list, state):
    out = []
    for s in samples_list:
        out += [np.asarray(x) for x in jax.tree.leaves((s.pos, s.residuals, s.keys))]
    return out + [np.asarray([r.kl_energy for r in state.history])]


# the public functions by hand, one sample after the other (lax.map: smaller programs than a batched vmap)
@functools.partial(_jit, static_argnames="config")
def _draw_linear(pos, keys, config):
    return jax.lax.map(lambda k: sv.draw_linear_residual(LH, pos, k, config, sample_mask=SAMPLE_MASK), keys)


@functools.partial(_jit, static_argnames="config")
def _update(pos, residuals, keys, signs, config):
    def one(args):
        r, k, sign = args
        return sv.nonlinearly_update_residual(LH, pos, r, k, sign, config, sample_mask=SAMPLE_MASK)

    return jax.lax.map(one, (residuals, keys, signs))


def _host(tree):
    return jax.tree.map(np.asarray, tree)


def _interleave(r):
    """``(r_0, -r_0, r_1, -r_1, ...)``: antithetic pairs in optimize_kl's order (NumPy: no eager XLA programs)."""
    return jax.tree.map(lambda x: np.stack([np.asarray(x), -np.asarray(x)], axis=1).reshape(-1, *x.shape[1:]), r)


def _assert_close_tree(got, want, what, rtol):
    for (path, a), b in zip(jax.tree_util.tree_leaves_with_path(got), jax.tree.leaves(want)):
        a, b = np.asarray(a), np.asarray(b)
        np.testing.assert_allclose(
            a, b, rtol=rtol, atol=rtol * np.max(np.abs(b)), err_msg=f"{what}{jax.tree_util.keystr(path)}"
        )


@pytest.mark.slow
def test_optimize_kl_samples_are_the_public_sampling_functions(vmap_run):
    """Each iteration's residuals are ``draw_linear_residual`` / ``nonlinearly_update_residual`` called by hand
    with the run's sample keys at the iteration's expansion point, with the same iteration counts.

    Upstream (``test_optimize_kl_sample_consistency``): ``draw_residual`` == (``draw_linear_residual``,
    ``nonlinearly_update_residual``) == ``optimize_kl``'s samples for ``samples.keys``, rtol 1e-7; ours 1e-12.
    """
    seen, state = vmap_run
    assert not LH._lsm_from_transformation  # the geoVI update draws its metric sample with the explicit square root
    keys = np.asarray(seen[0].keys)
    assert keys.shape == (N_PAIRS, 2)
    for s in seen[1:]:  # *_sample reuses the first iteration's keys, nonlinear_update keeps them
        np.testing.assert_array_equal(np.asarray(s.keys), keys)
    signs = np.tile([1.0, -1.0], N_PAIRS)
    keys2 = np.repeat(keys, 2, axis=0)

    # iteration 1, linear_sample at POS0: +-r, r the MGVI residual of each key
    r_lin, info = _draw_linear(_host(POS0), keys, config=LIN)
    assert np.all(np.asarray(info.converged))
    assert np.asarray(info.nit).tolist() == state.history[0].sampling_nit
    _assert_close_tree(seen[0].residuals, _interleave(r_lin), "iteration 1 (linear_sample)", 1e-12)

    # iteration 2, nonlinear_sample at the first KL minimum: geoVI-curved +-r, the same keys
    # (NumPy inputs: the engine's arrays are committed to devices, a different jit cache key than POS0's)
    pos1 = _host(seen[0].pos)
    r_lin, info = _draw_linear(pos1, keys, config=LIN)
    assert np.asarray(info.nit).tolist() == state.history[1].sampling_nit
    r_nl, res = _update(pos1, _interleave(r_lin), keys2, signs, config=NONLIN)
    assert np.all(np.asarray(res.converged))
    assert np.asarray(res.nit).tolist() == state.history[1].nonlinear_nit
    _assert_close_tree(seen[1].residuals, r_nl, "iteration 2 (nonlinear_sample)", 1e-12)
    # the update really curved the residuals (else this would not test it)
    assert np.max(np.abs(np.asarray(r_nl["w"]) - np.asarray(_interleave(r_lin)["w"]))) > 1e-3

    # iteration 3, nonlinear_update at the second KL minimum, from the previous residuals
    pos2 = _host(seen[1].pos)
    r_up, res = _update(pos2, _host(seen[1].residuals), keys2, signs, config=NONLIN)
    assert np.all(np.asarray(res.converged))
    assert np.asarray(res.nit).tolist() == state.history[2].nonlinear_nit
    _assert_close_tree(seen[2].residuals, r_up, "iteration 3 (nonlinear_update)", 1e-12)

    # point estimates: residuals exactly 0 (upstream's _assert_zero_point_estimate_residuals); the rest nonzero
    for s in seen:
        for k in LH.domain:
            r = np.asarray(s.residuals[k])
            assert np.all(r == 0.0) if k in POINT_ESTIMATES else np.all(r != 0.0), k


@pytest.mark.slow
def test_constants_stay_and_the_rest_moves(vmap_run):
    """Constants keep their start value exactly; every other latent entry moved (``test_optimize_kl_constants``)."""
    seen, _ = vmap_run
    for s in seen:
        for k in LH.domain:
            moved = np.asarray(s.pos[k]) - np.asarray(POS0[k])
            assert np.all(moved == 0.0) if k in CONSTANTS else np.all(moved != 0.0), k


@pytest.mark.slow
@pytest.mark.product_compiler
def test_optimize_kl_bitwise_across_device_maps(vmap_run):
    """``pmap`` sampling and ``shard_map`` KL on 4 devices: bitwise the 1-device vmap run.

    Upstream (``test_optimize_kl_device_consistency``) compares 1 device and many at rtol = atol = 1e-5
    over 5 modes x n_samples (2, 4, 8) x 3 x 3 (residual, KL) device maps, skipping the pmap cases whose
    sample count does not fit the devices. tests/test_parallel_reproducible.py runs linear_resample,
    nonlinear_resample and nonlinear_update with a padded sample axis (3 pairs) on 1, 2 and 4 devices for
    every strategy, and shard_map sampling with jit KL, all bitwise. This adds upstream's exact-fit case
    (2 pairs = 4 samples on 4 devices), a pair of different strategies (pmap, shard_map), point estimates,
    constants and a variable-covariance likelihood on a dict latent, for the first iteration: MGVI draws and
    KL minimization (the geoVI iterations would add their compilation; the tests above run geoVI on every
    strategy).
    """
    ref_seen, ref_state = vmap_run
    got = _arrays(*_run("pmap", "shard_map", n_iterations=1))
    ref = _arrays(ref_seen[:1], ref_state._replace(history=ref_state.history[:1]))
    assert len(got) == len(ref)
    for a, b in zip(got, ref):
        assert a.dtype == b.dtype and a.shape == b.shape
        assert np.array_equal(a, b), f"max |diff| {np.max(np.abs(a - b))}"


# ---------------------------------------------------------------------------------------------------
# found while porting: x / sqrt(y) must compile to the same arithmetic under every strategy
# ---------------------------------------------------------------------------------------------------
@pytest.mark.product_compiler
def test_jit_strategy_is_bitwise_for_a_division_by_a_square_root():
    """The strategies' bitwise contract (``Strategy`` docstring) for ``x / sqrt(y)`` (Poisson's
    ``left_sqrt_metric``): XLA rewrites it into ``x * rsqrt(y)`` in the one-device programs and kept the
    division in the SPMD one (1 ulp apart in ~1/4 of the entries) until ``reproducible_jit`` wrote the rsqrt
    form itself."""
    rng = np.random.default_rng(0)
    pos, xs = jnp.asarray(rng.normal(size=64)), jnp.asarray(rng.normal(size=(4, 64)))

    def run(strat):  # at the shipped options (product_compiler): the bitwise contract is theirs
        f = sv.parallel.reproducible_jit(lambda p, x: strat.map(lambda p, x: x / jnp.sqrt(jnp.exp(p)), (None, 0))(p, x))
        return np.asarray(f(*place(strat, (pos, xs))))

    ref = run(Vmap())
    devs = jax.devices()[:4]
    for strat in (ShardMap(devices=devs), Pmap(devices=devs), JitSharding(devices=devs)):
        np.testing.assert_array_equal(run(strat), ref)


# ---------------------------------------------------------------------------------------------------
# minimizers (test_ncg.py)
# ---------------------------------------------------------------------------------------------------
def rosenbrock(x):  # upstream's variant: (x1 - x0)^2 instead of (x1 - x0^2)^2; minimum (1, 1)
    return jnp.sum(100.0 * jnp.diff(x) ** 2 + (1.0 - x[:-1]) ** 2)


def himmelblau(p):
    x, y = p
    return (x**2 + y - 11.0) ** 2 + (x + y**2 - 7.0) ** 2


def matyas(p):
    x, y = p
    return 0.26 * (x**2 + y**2) - 0.48 * x * y


def eggholder(p):
    x, y = p
    return -(y + 47) * jnp.sin(jnp.sqrt(jnp.abs(x / 2.0 + y + 47.0))) - x * jnp.sin(jnp.sqrt(jnp.abs(x - (y + 47.0))))


# upstream's starts; the minima: closed forms, and for eggholder scipy's trust-ncg from (100, 100) at gtol 1e-12
# (test_eggholder_reference_minimum_is_scipys; a local minimum, as the assertions below also check)
STANDARD = (rosenbrock, himmelblau, matyas, eggholder)
STARTS = np.array([[0.0, 0.0], [0.0, 0.0], [6.0, 6.0], [100.0, 100.0]])
MINIMA = np.array([[1.0, 1.0], [3.0, 2.0], [0.0, 0.0], [97.27334976932791, 111.09957009923288]])


def _eggholder_np(x, y):
    return -(y + 47) * np.sin(np.sqrt(np.abs(x / 2.0 + y + 47.0))) - x * np.sin(np.sqrt(np.abs(x - (y + 47.0))))


MINIMUM_VALUES = [0.0, 0.0, 0.0, _eggholder_np(*MINIMA[3])]


def _family(x, onehot):
    """``sum_i onehot_i f_i(x)``: with a one-hot weight exactly ``f_i`` and its derivatives (``0 * f_j = 0``),
    so that one vmapped program minimizes all four functions."""
    return sum(w * f(x) for w, f in zip(onehot, STANDARD))


def _hessp(onehot):
    return lambda x, v: jax.jvp(jax.grad(_family), (x, onehot), (v, jnp.zeros_like(onehot)))[1]


@_jit
def _minimize_all(x0s):
    """Newton-CG (line search) and trust-region Newton-CG from each start: one program."""

    def one(x0, onehot):
        fg = jax.value_and_grad(lambda x: _family(x, onehot))
        ncg = newton_cg(fg, _hessp(onehot), x0, NewtonCGConfig(xtol=None, gtol=1e-10, maxiter=200))
        tr = TrustRegionConfig(xtol=None, gtol=1e-10, maxiter=400).minimize(fg, _hessp(onehot), x0)
        return ncg, tr

    return jax.vmap(one)(x0s, jnp.eye(len(STANDARD)))


def test_minimizers_on_standard_functions():
    """Newton-CG (line search) and trust-region Newton-CG reach the minimum of each standard function.

    Upstream: ``test_minimize_ncg`` (rosenbrock, matyas, eggholder; himmelblau "a tough cookie" left out)
    and ``test_minimize_trust_ncg`` (all four) against scipy's trust-ncg at rtol 2e-6, atol 2e-5 (scipy at
    its default gtol 1e-5). Here both solvers on all four, atol 1e-9 to the minima (closed forms; eggholder:
    scipy's trust-ncg at gtol 1e-12, a local minimum, test_eggholder_reference_minimum_is_scipys), the
    gradient there below 1e-8 and the objective value the minimum's.
    """
    for solver, res in zip(("newton_cg", "trust_region"), _minimize_all(jnp.asarray(STARTS))):
        for i, f in enumerate(STANDARD):
            name = f"{solver} on {f.__name__}"
            assert int(res.status[i]) == sv.minimizers.Status.CONVERGED, name
            np.testing.assert_allclose(np.asarray(res.x[i]), MINIMA[i], rtol=0, atol=1e-9, err_msg=name)
            assert np.linalg.norm(np.asarray(res.grad[i])) <= 1e-8, name
            np.testing.assert_allclose(float(res.fun[i]), MINIMUM_VALUES[i], rtol=1e-12, atol=1e-18, err_msg=name)


def test_eggholder_reference_minimum_is_scipys():
    """The eggholder reference above is scipy's trust-ncg result (with exact derivatives) from (100, 100),
    a local minimum (Hessian eigenvalues 0.21 and 0.85)."""
    grad, hess = _jit(lambda x: jax.grad(eggholder)(x)), _jit(lambda x: jax.hessian(eggholder)(x))
    res = so.minimize(
        lambda x: _eggholder_np(*x),
        STARTS[3],
        jac=lambda x: np.asarray(grad(jnp.asarray(x))),
        hess=lambda x: np.asarray(hess(jnp.asarray(x))),
        method="trust-ncg",
        options=dict(gtol=1e-12),
    )
    assert res.success, res.message
    np.testing.assert_allclose(res.x, MINIMA[3], rtol=0, atol=1e-10)
    assert np.linalg.norm(np.asarray(grad(jnp.asarray(MINIMA[3])))) <= 1e-10
    assert np.linalg.eigvalsh(np.asarray(hess(jnp.asarray(MINIMA[3])))).min() > 0.1  # a minimum, not a saddle


def test_steihaug_with_infinite_radius_is_cg():
    """CG-Steihaug with an infinite radius stopped after i iterations is plain CG after i iterations
    (``conjugate_gradient`` with ``miniter = maxiter = i``), and both are the minimizer of ``g.p + p.A.p/2``
    over the Krylov space ``K_i(A, g)``.

    Upstream (``test_cg_steihaug_vs_cg_consistency``, seeds 3637, 12, 42, sizes 5, 9, 14, i = 0..3): the
    subproblem solver against ``cg``, rtol 1e-4, atol 1e-5. Here i = 1..4 (shardvi's loops take at least
    one step), all three within 1e-9 of the largest entry (``A = B B^T``, ``B = 6 + N(0, 1)``, has condition
    numbers up to 3e7: after 4 steps the routes' roundings differ by up to ~5e-11 of it). The systems are
    embedded in 14 x 14 ones, ``diag(A, I)`` and ``(g, 0)``, whose Krylov spaces are ``K_i(A, g) x {0}``:
    one program for all of them.
    """
    problems = []
    for seed in (3637, 12, 42):
        rng = np.random.default_rng(seed)
        for size in (5, 9, 14):
            b = 6.0 + rng.normal(size=(size, size))
            problems.append((b @ b.T, rng.normal(size=size)))
    a_pad = np.stack([np.eye(14) for _ in problems])
    g_pad = np.zeros((len(problems), 14))
    for k, (a, g) in enumerate(problems):
        a_pad[k, : len(g), : len(g)], g_pad[k, : len(g)] = a, g
    steps, cgs = _steihaug_and_cg_steps(jnp.asarray(a_pad), jnp.asarray(g_pad), jnp.arange(1, 5))
    for k, (a, g) in enumerate(problems):
        n = len(g)
        basis = _krylov_basis(a, g, 4)
        for i in range(1, 5):
            got, cg = np.asarray(steps[k, i - 1]), np.asarray(cgs[k, i - 1])
            assert np.all(got[n:] == 0.0) and np.all(cg[n:] == 0.0)
            v = basis[:, :i]
            want = -v @ np.linalg.solve(v.T @ a @ v, v.T @ g)
            scale = np.max(np.abs(want))
            assert np.max(np.abs(got[:n] - cg[:n])) <= 1e-9 * scale, (k, i)
            assert np.max(np.abs(got[:n] - want)) <= 1e-9 * scale, (k, i)
            assert np.max(np.abs(cg[:n] - want)) <= 1e-9 * scale, (k, i)


def _krylov_basis(a, g, k):
    """Orthonormal basis of ``K_k(a, g)`` (Arnoldi with full reorthogonalization, twice: numerically exact)."""
    v = [g / np.linalg.norm(g)]
    for _ in range(k - 1):
        w = a @ v[-1]
        for _ in range(2):
            w = w - np.stack(v, axis=1) @ (np.stack(v) @ w)
        v.append(w / np.linalg.norm(w))
    return np.stack(v, axis=1)


@_jit
def _steihaug_and_cg_steps(a, g, maxiters):
    """Per ``i`` in ``maxiters``: CG-Steihaug's step for ``g`` and CG's solution of ``A p = -g`` after ``i`` steps.

    CG through ``cg_solve``, the solver behind ``conjugate_gradient`` (``conjugate_gradient(matvec, b,
    config=CGConfig(tol=None, miniter=i, maxiter=i))`` is ``cg_solve`` with these arguments), whose iteration
    bounds may be traced: one program for all ``i`` instead of one per ``CGConfig``.
    """

    def one(a, g, i):
        step = _steihaug(lambda d: a @ d, g, jnp.inf, 0.0, i, None, jnp.float64).z
        cg = cg_solve(lambda v: a @ v, -g, tol=None, miniter=i, maxiter=i).x
        return step, cg

    per_problem = jax.vmap(one, in_axes=(None, None, 0))
    return jax.vmap(per_problem, in_axes=(0, 0, None))(a, g, maxiters)


# ---------------------------------------------------------------------------------------------------
# likelihood identities (test_energies.py, test_likelihood_impl.py, test_likelihood.py)
# ---------------------------------------------------------------------------------------------------
SHAPE = (4, 2)
N_TRIES = 5


def _draws(seed, n=5):
    """``n`` independent standard-normal arrays of SHAPE (numpy)."""
    rng = np.random.default_rng(seed)
    return [rng.normal(size=SHAPE) for _ in range(n)]


@pytest.mark.parametrize("seed", [3639, 12, 41, 42])
def test_gaussian_is_variable_covariance_gaussian_with_fixed_std(seed):
    """Energy differences and the mean block of the metric agree at rtol = 10 eps, atol = 10 eps (upstream)."""
    d, m1, m2, t, u = _draws(seed)
    std = np.exp(1.0 + u)  # upstream: inv_std = 1 / exp(1 + N(0, 1)); shardvi's VCG takes the std itself
    gauss = sv.Gaussian(d, noise_std=std)
    vcg = sv.VariableCovarianceGaussian(d)
    m1, m2, t, std = (jnp.asarray(x) for x in (m1, m2, t, std))
    diff_g = gauss.energy(m2) - gauss.energy(m1)
    diff_vcg = vcg.energy((m2, std)) - vcg.energy((m1, std))
    np.testing.assert_allclose(float(diff_vcg), float(diff_g), rtol=10 * EPS, atol=10 * EPS)
    met_g = gauss.metric(m1, t)
    met_vcg = vcg.metric((m1, std), (t, jnp.asarray(d) / 2))[0]
    np.testing.assert_allclose(np.asarray(met_vcg), np.asarray(met_g), rtol=10 * EPS, atol=10 * EPS)


@pytest.mark.parametrize("seed", [3639, 12, 41, 42])
def test_student_t_is_variable_covariance_student_t_with_fixed_std(seed):
    """The same for StudentT and VariableCovarianceStudentT (upstream: rtol 10 eps, atol 4 eps)."""
    d, m1, m2, t, u = _draws(seed)
    dof = np.random.default_rng(seed + 1).exponential(size=SHAPE) + 0.1
    std = np.exp(1.0 + u)
    studt = sv.StudentT(d, dof, std)
    vcst = VariableCovarianceStudentT(d, dof)
    m1, m2, t, std = (jnp.asarray(x) for x in (m1, m2, t, std))
    diff_t = studt.energy(m2) - studt.energy(m1)
    diff_vct = vcst.energy((m2, std)) - vcst.energy((m1, std))
    np.testing.assert_allclose(float(diff_vct), float(diff_t), rtol=10 * EPS, atol=4 * EPS)
    met_t = studt.metric(m1, t)
    met_vct = vcst.metric((m1, std), (t, jnp.asarray(d) / 2))[0]
    np.testing.assert_allclose(np.asarray(met_vct), np.asarray(met_t), rtol=10 * EPS, atol=4 * EPS)


def _likelihood_kinds(seed):
    """Upstream's ``lh_init_true`` + ``lh_init_approx``: (name, likelihood on SHAPE, latent draw(rng)) ."""
    rng = np.random.default_rng(seed)
    d = rng.normal(size=SHAPE)
    dof = rng.exponential(size=SHAPE)
    std = rng.exponential(size=SHAPE)  # upstream: noise_std_inv = 1 / Exp(1)
    return [
        ("gaussian", sv.Gaussian(d, noise_std=std), lambda r: r.normal(size=SHAPE)),
        ("student_t", sv.StudentT(d, dof, std), lambda r: r.normal(size=SHAPE)),
        ("poisson", sv.Poisson(rng.poisson(3.14, size=SHAPE)), lambda r: r.exponential(size=SHAPE)),
        (
            "vc_gaussian",
            sv.VariableCovarianceGaussian(d),
            lambda r: (r.normal(size=SHAPE), 3.0 + 1.0 / np.exp(r.normal(size=SHAPE))),
        ),
        (
            "vc_student_t",
            VariableCovarianceStudentT(d, dof),
            lambda r: (r.normal(size=SHAPE), np.exp(3.0 + 0.1 * r.normal(size=SHAPE))),
        ),
    ]


def _tries(draw, seed):
    """N_TRIES latent points and N_TRIES tangents, stacked (numpy)."""
    rng = np.random.default_rng(seed)
    pts = [draw(rng) for _ in range(2 * N_TRIES)]
    stack = lambda xs: jax.tree.map(lambda *a: jnp.asarray(np.stack(a)), *xs)  # noqa: E731
    return stack(pts[:N_TRIES]), stack(pts[N_TRIES:])


@_jit
def _metric_identities(cases):
    """Per kind (``{name: (lh, p, t)}``), per point: ``F t``, ``L (L^T t)`` (``L^T`` by transposing the square
    root), from the transformation alone ``J_T^T J_T t``, the square root ``L e`` and ``J_T^T e`` for ``e = t``
    (the lsm tangents have the shape of the signal here), and the normalized residual. One program for all kinds."""

    def one(lh, p, t):
        met = lh.metric(p, t)
        e0 = jax.tree.map(lambda d: jnp.zeros(d.shape, d.dtype), lh.lsm_tangents_shape)
        lsm_t = jax.linear_transpose(lambda e: lh.left_sqrt_metric(p, e), e0)
        via_lsm = lh.left_sqrt_metric(p, lsm_t(t)[0])
        _, vjp = jax.vjp(lh.transformation, p)
        via_trafo = vjp(jax.jvp(lh.transformation, (p,), (t,))[1])[0]
        return met, via_lsm, via_trafo, (lh.left_sqrt_metric(p, t), vjp(t)[0]), lh.normalized_residual(p)

    return {name: jax.vmap(functools.partial(one, lh))(p, t) for name, (lh, p, t) in cases.items()}


@pytest.fixture(scope="module", params=[3639, 12, 41, 42])
def metric_identities(request):
    cases = {}
    for name, lh, draw in _likelihood_kinds(request.param):
        cases[name] = (lh, *_tries(draw, request.param + 1))
    return _metric_identities(cases)


def test_metric_from_left_sqrt_metric(metric_identities):
    """``F t == L (L^T t)`` at rtol 4 eps, all five kinds (``test_sqrt_metric_vs_metric_consistency``)."""
    for name, (met, via_lsm, _, _, _) in metric_identities.items():
        for a, b in zip(jax.tree.leaves(via_lsm), jax.tree.leaves(met)):
            np.testing.assert_allclose(np.asarray(a), np.asarray(b), rtol=4 * EPS, atol=0, err_msg=name)


def test_metric_from_transformation(metric_identities):
    """Where the transformation is exact (Gaussian, StudentT, Poisson): the metric and the square root derived from
    the transformation alone, ``J_T^T J_T t`` and ``J_T^T e``, are the likelihood's ``F t`` and ``L e`` at rtol
    4 eps (``test_transformation_vs_sqrt_metric_consistency``). For the variable-covariance kinds the
    transformation's metric has the known mean-std cross terms (tests/test_variable_covariance.py)."""
    for name in ("gaussian", "student_t", "poisson"):
        met, _, via_trafo, (lsm_e, trafo_vjp_e), _ = metric_identities[name]
        np.testing.assert_allclose(np.asarray(via_trafo), np.asarray(met), rtol=4 * EPS, atol=0, err_msg=name)
        np.testing.assert_allclose(np.asarray(trafo_vjp_e), np.asarray(lsm_e), rtol=4 * EPS, atol=0, err_msg=name)


def test_normalized_residuals_finite(metric_identities):
    """``normalized_residual`` is finite at the drawn points, every kind (``test_residuals_allfinite``)."""
    for name, (*_, r) in metric_identities.items():
        assert all(bool(np.all(np.isfinite(np.asarray(x)))) for x in jax.tree.leaves(r)), name


_DOM_AB = {"a": _sds(3, 2), "b": _sds(4, 2)}
_DOM_AB_VC = {"a": _sds(2, 3, 2), "b": _sds(2, 4, 2)}


# upstream's second forward pair: forward_a = exp, forward_b = reciprocal (|.| where a value must be positive);
# module-level functions: the models are the same static configuration for every seed (no recompilation)
def _fwd_a(x):
    return jnp.exp(x["a"])


def _fwd_b(x):
    return jnp.abs(jnp.reciprocal(x["b"]))


def _vc_fwd_a(x):
    return jnp.exp(x["a"][0]), jnp.abs(jnp.exp(x["a"][1]))


def _vc_fwd_b(x):
    return jnp.reciprocal(x["b"][0]), jnp.abs(jnp.reciprocal(x["b"][1]))


def _joint(fwd_a, fwd_b):
    def fwd(x):  # {"a": .., "b": ..} data leaves (inside the (mean, std) pair for the variable-covariance kinds)
        return jax.tree.map(lambda u, v: {"a": u, "b": v}, fwd_a(x), fwd_b(x))

    return fwd


_JOINT = _joint(_fwd_a, _fwd_b)
_VC_JOINT = _joint(_vc_fwd_a, _vc_fwd_b)


def _split_kinds(seed):
    """Per kind: (the likelihood on pytree data ``{"a", "b"}`` amended with the joint forward, the sum of the
    parts' likelihoods on ``"a"`` and ``"b"``). Upstream: data leaves of shapes (3, 5) and (12, 5)."""
    rng = np.random.default_rng(seed)
    da, db = rng.normal(size=(3, 2)), rng.normal(size=(4, 2))
    ca, cb = rng.poisson(3.0, size=(3, 2)), rng.poisson(3.0, size=(4, 2))

    def split(make, vc, data_a, data_b):
        dom, joint, fa, fb = (_DOM_AB_VC, _VC_JOINT, _vc_fwd_a, _vc_fwd_b) if vc else (_DOM_AB, _JOINT, _fwd_a, _fwd_b)
        whole = make({"a": data_a, "b": data_b}).amend(sv.Model(joint, dom))
        parts = make(data_a).amend(sv.Model(fa, {"a": dom["a"]})) + make(data_b).amend(sv.Model(fb, {"b": dom["b"]}))
        return whole, parts

    out = {
        "gaussian": split(lambda d: sv.Gaussian(d, noise_std=0.7), False, da, db),
        "student_t": split(lambda d: sv.StudentT(d, 2.2, 0.7), False, da, db),
        "poisson": split(sv.Poisson, False, ca, cb),
        "vc_gaussian": split(sv.VariableCovarianceGaussian, True, da, db),
        "vc_student_t": split(lambda d: VariableCovarianceStudentT(d, 1.7), True, da, db),
    }
    return out, rng


@_jit
def _add_identities(cases):
    """Per kind (``{name: (joint, parts, p, t, e)}``), per point: energy, metric, left square root, normalized
    residual and transformation of both. One program for all kinds."""
    return {name: _add_identities_one(*case) for name, case in cases.items()}


def _add_identities_one(joint, parts, p, t, e):
    def one(p, t, e):
        e_parts = _regroup(e)  # the sum's white noise: one tangent per part, in order
        return (
            (joint.energy(p), parts.energy(p)),
            (joint.metric(p, t), parts.metric(p, t)),
            (joint.left_sqrt_metric(p, e), parts.left_sqrt_metric(p, e_parts)),
            (joint.normalized_residual(p), parts.normalized_residual(p)),
            (joint.transformation(p), parts.transformation(p)),
        )

    return jax.vmap(one)(p, t, e)


def _regroup(x):
    """The joint likelihood's pytree-data outputs in the sum's order: ``{"a": .., "b": ..}`` -> ``(a, b)``,
    also inside the variable-covariance (mean, std) pairs."""
    if isinstance(x, dict):
        return (x["a"], x["b"])
    return tuple(zip(*(_regroup(v) for v in x)))


@pytest.mark.parametrize("seed", [33, 42, 43])
def test_pytree_data_likelihood_is_the_sum_of_its_parts(seed):
    """A likelihood on pytree data ``{"a", "b"}`` equals the sum of the likelihoods on ``"a"`` and ``"b"``:
    energies, metrics, left square roots, normalized residuals and transformations at 100 random points,
    all five kinds (upstream ``test_nonvariable_likelihood_add``, ``test_variable_likelihood_add``:
    ``assert_allclose`` default rtol 1e-7; here rtol 1e-13)."""
    kinds, rng = _split_kinds(seed)
    n = 100
    draw = lambda d: jnp.asarray(rng.normal(size=(n, *d.shape)))  # noqa: E731
    cases = {}
    for name, (joint, parts) in kinds.items():
        assert jax.tree.structure(joint.domain) == jax.tree.structure(parts.domain)
        p, t = (jax.tree.map(draw, joint.domain) for _ in range(2))
        cases[name] = (joint, parts, p, t, jax.tree.map(draw, joint.lsm_tangents_shape))
    for name, got in _add_identities(cases).items():
        for what, (a, b) in zip(("energy", "metric", "left_sqrt_metric"), got[:3]):
            for x, y in zip(jax.tree.leaves(a), jax.tree.leaves(b), strict=True):
                np.testing.assert_allclose(np.asarray(x), np.asarray(y), rtol=1e-13, atol=0, err_msg=f"{name} {what}")
        for what, (a, b) in zip(("normalized_residual", "transformation"), got[3:]):
            for x, y in zip(jax.tree.leaves(_regroup(a)), jax.tree.leaves(b), strict=True):
                np.testing.assert_allclose(np.asarray(x), np.asarray(y), rtol=1e-13, atol=0, err_msg=f"{name} {what}")


# ---------------------------------------------------------------------------------------------------
# Wiener filter (test_evi.py::test_mgvi_wiener_filter_consistency)
# ---------------------------------------------------------------------------------------------------
N_PIX, N_LOS, N_DRAWS = 16, 14, 16_000


def _los_response(end, n):
    """Upstream's line-of-sight response on [0, 1]: lines from 0 to ``end``, pixel ``i`` centred at ``i/(n-1)``."""
    start = np.zeros_like(end)
    end = end * (n - 1)
    return np.stack([np.minimum(np.clip(i + 0.5 - start, 0, 1), np.clip(end - i + 0.5, 0, 1)) for i in range(n)], 1)


def _wiener(data, response, noise_cov, prior_cov):
    """Upstream's dense Wiener filter: posterior mean and covariance."""
    ninv = np.diag(1.0 / noise_cov)
    post_cov = np.linalg.inv(response.T @ ninv @ response + np.linalg.inv(prior_cov))
    return post_cov @ response.T @ ninv @ data, post_cov


@pytest.fixture(scope="module")
def los():
    """Upstream's problem: a Gaussian-kernel prior (length scale 0.1, jitter 1e-6) on 16 pixels, 14 lines of
    sight of random length, data from an exponentiated prior draw (not from the prior), heteroscedastic noise."""
    rng = np.random.default_rng(42)
    x = np.linspace(0.0, 1.0, N_PIX)
    prior_cov = np.exp(-(((x[:, None] - x[None, :]) / 0.1) ** 2)) + 1e-6 * np.eye(N_PIX)
    prior_lsm = np.linalg.cholesky(prior_cov)
    truth = np.exp(prior_lsm @ rng.normal(size=N_PIX))
    response = _los_response(rng.uniform(size=N_LOS), N_PIX)
    noise_cov = np.mean(truth) * (1 + rng.uniform(0.1, 0.5, size=N_LOS))
    data = response @ truth + np.sqrt(noise_cov) * rng.normal(size=N_LOS)
    post_mean, post_cov = _wiener(data, response, noise_cov, prior_cov)
    r, lsm = jnp.asarray(response), jnp.asarray(prior_lsm)
    model = sv.Model(lambda xi: r @ (lsm @ xi), _sds(N_PIX))
    lh = sv.Gaussian(data, noise_cov_inv=1.0 / noise_cov).amend(model)
    return dict(lh=lh, R=response, L=prior_lsm, N=noise_cov, d=data, S=prior_cov, mean=post_mean, cov=post_cov)


@_jit
def _dense_metric(lh, pos):
    return jax.vmap(lambda e: lh.metric(pos, e), out_axes=1)(jnp.eye(N_PIX))


def test_wiener_filter_consistency_metric(los):
    """The likelihood's metric is ``L^T R^T N^-1 R L`` at any position (upstream: atol 1e-10, rtol 1e-12; here
    rtol 1e-12 of the largest entry) and ``(metric + 1)^-1`` is the standardized posterior covariance (upstream's
    atol 1e-12, rtol 1e-14); the standardized Wiener filter maps to the plain one (upstream's 1e-8)."""
    R, L, N = los["R"], los["L"], los["N"]
    mean_st, cov_st = _wiener(los["d"], R @ L, N, np.eye(N_PIX))
    np.testing.assert_allclose(L @ mean_st, los["mean"], atol=1e-8, rtol=1e-8)
    np.testing.assert_allclose(L @ cov_st @ L.T, los["cov"], atol=1e-8, rtol=1e-8)
    want = L.T @ R.T @ np.diag(1.0 / N) @ R @ L
    for pos in (np.random.default_rng(0).normal(size=N_PIX), np.ones(N_PIX), np.zeros(N_PIX)):
        got = np.asarray(_dense_metric(los["lh"], jnp.asarray(pos)))
        np.testing.assert_allclose(got, want, rtol=1e-12, atol=1e-12 * np.max(np.abs(want)))
        np.testing.assert_allclose(np.linalg.inv(got + np.eye(N_PIX)), cov_st, atol=1e-12, rtol=1e-14)


def _assert_covariance(samples, cov):
    """Sample covariance (known zero mean) of the independent ``samples`` within 5 standard errors of ``cov`` in
    every entry (Wishart: ``sqrt((C_ii C_jj + C_ij^2) / n)``), and a mean |z| of a correct sampler (E|z| = 0.8);
    also within upstream's bound ``sqrt(tr(cov) / n)`` of every entry."""
    n = samples.shape[0]
    emp = samples.T @ samples / n
    assert np.max(np.abs(emp - cov)) <= np.sqrt(np.trace(cov) / n)
    se = np.sqrt((np.outer(np.diag(cov), np.diag(cov)) + cov**2) / n)
    z = np.abs(emp - cov) / se
    assert z.max() < 5.0, f"max z-score {z.max():.2f}"
    assert 0.5 < z.mean() < 1.1, f"mean z-score {z.mean():.2f}"


def test_wiener_filter_consistency_exact_posterior(los):
    """``wiener_filter_posterior``: the posterior mean (upstream: the MC mean of 16000 samples at atol = rtol =
    1e-8; here the mean itself, solved to a relative CG residual of 1e-13: rtol 1e-11) and 16000 independent
    samples (pairs) with the Wiener covariance: upstream's bound ``|cov - D| <= sqrt(tr(D) / n)`` entrywise
    (here 0.02, ~2 standard errors of the largest entry) and every entry within 5 of its own standard
    errors. (Upstream's same check of 16000 MGVI draws: tests/test_wiener.py::test_linear_sample_covariance,
    4000 draws, the same per-entry standard errors.) (With the default CG tolerance, 1e-10, the mean is
    ~1e-8 off here: the posterior precision's condition number is ~140.)"""
    cg = sv.CGConfig(tol=1e-13, maxiter=200)
    whole = Vmap(chunk_size=None)  # all samples' solves in one batch (16000 unbatched solves in a loop: 4x the time)
    samples, info = sv.wiener_filter_posterior(
        los["lh"], key=jax.random.PRNGKey(3), n_samples=N_DRAWS, cg=cg, sample_map=whole
    )
    assert info.converged
    np.testing.assert_allclose(los["L"] @ np.asarray(samples.pos), los["mean"], rtol=1e-11, atol=0)
    r = np.asarray(samples.residuals)
    np.testing.assert_array_equal(r[1::2], -r[0::2])  # antithetic pairs: one independent draw per pair
    _assert_covariance(r[0::2] @ los["L"].T, los["cov"])
