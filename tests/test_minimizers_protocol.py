"""The Minimizer base and the shared result types (Solution, CGResult): status messages, throw, dispatch."""

import ast
import dataclasses
import importlib
import pathlib
import re

import jax
import jax.numpy as jnp
import numpy as np
import optax
import pytest

import shardvi as sv
from shardvi.minimizers import (
    CGConfig,
    CGResult,
    Minimizer,
    NewtonCGConfig,
    OptaxConfig,
    Solution,
    SolverError,
    Status,
    TrustRegionConfig,
    check_minimizer,
    conjugate_gradient,
    newton_cg,
    status_message,
)

N = 6
_rng = np.random.default_rng(7)
_Q, _ = np.linalg.qr(_rng.normal(size=(N, N)))
A = (_Q * np.geomspace(1.0, 8.0, N)) @ _Q.T  # SPD with eigenvalues in [1, 8]: min_curvature=1 holds
B = _rng.normal(size=N)
EXACT = np.linalg.solve(A, B)


def quadratic():
    a, b = jnp.asarray(A), jnp.asarray(B)

    def fun_and_grad(x):
        ax = a @ x
        return 0.5 * x @ ax - b @ x, ax - b

    return fun_and_grad, lambda x, v: a @ v


def solution(status, nit=3):
    z = jnp.zeros((), jnp.int32)
    return Solution(
        jnp.zeros(2), jnp.asarray(0.0), jnp.zeros(2), jnp.asarray(nit, jnp.int32), z, z, jnp.asarray(status, jnp.int32)
    )


def assert_bitwise(a, b):
    la, lb = jax.tree_util.tree_leaves(a), jax.tree_util.tree_leaves(b)
    assert len(la) == len(lb)
    for u, v in zip(la, lb):
        u, v = np.asarray(u), np.asarray(v)
        assert u.dtype == v.dtype and u.shape == v.shape and u.tobytes() == v.tobytes()


# ---------------------------------------------------------------------------------------------------
# result types
# ---------------------------------------------------------------------------------------------------
FINAL = [s for s in Status if s != Status.RUNNING]


@pytest.mark.parametrize("status", FINAL, ids=[s.name for s in FINAL])
def test_solution_message_converged_and_throw(status):
    res = solution(status)
    assert res.message == status_message(status)
    assert bool(res.converged) == (status == Status.CONVERGED)
    if status == Status.CONVERGED:
        assert res.throw() is res
        return
    expected = f"Solution: the solve failed after 3 iterations: {status_message(status)} (status {status.name})"
    with pytest.raises(SolverError, match=re.escape(expected)) as info:
        res.throw()
    assert info.value.solution is res and int(info.value.status) == status
    assert isinstance(info.value, RuntimeError)
    assert res.throw(accept=status) is res and res.throw(accept=[status, Status.CONVERGED]) is res


@pytest.mark.parametrize("status", FINAL, ids=[s.name for s in FINAL])
def test_cg_result_message_converged_and_throw(status):
    z = jnp.zeros(())
    res = CGResult(jnp.zeros(2), jnp.asarray(4, jnp.int32), jnp.asarray(status, jnp.int32), z, z)
    assert res.message == status_message(status)
    assert bool(res.converged) == (status == Status.CONVERGED)
    if status == Status.CONVERGED:
        assert res.throw() is res
    else:
        expected = f"CGResult: the solve failed after 4 iterations: {status_message(status)} (status {status.name})"
        with pytest.raises(SolverError, match=re.escape(expected)):
            res.throw()


def test_batched_status_message_and_throw():
    res = solution([Status.CONVERGED, Status.MAX_ITERATIONS, Status.MAX_ITERATIONS, Status.NONFINITE])
    assert res.message == (
        f"1 of 4: converged; 2 of 4: {status_message(Status.MAX_ITERATIONS)}; "
        f"1 of 4: {status_message(Status.NONFINITE)}"
    )
    np.testing.assert_array_equal(res.converged, [True, False, False, False])
    with pytest.raises(SolverError, match=r"3 of 4 batched solves failed: 2 x reached maxiter.*; 1 x a non-finite"):
        res.throw()
    with pytest.raises(SolverError, match=r"1 of 4 batched solves failed: 1 x a non-finite"):
        res.throw(accept=Status.MAX_ITERATIONS)
    assert solution([0, 0]).throw() is not None


def test_solution_is_a_jit_output_and_host_helpers_refuse_tracers():
    out = jax.jit(lambda s: solution(s))(jnp.asarray(int(Status.MAX_ITERATIONS)))
    assert isinstance(out, Solution) and out.message == status_message(Status.MAX_ITERATIONS)
    assert not bool(jax.jit(lambda r: r.converged)(out))  # converged is an array: fine under tracing

    def traced(r, what):
        return r.message if what == "message" else r.throw()

    for what in ("message", "throw"):
        with pytest.raises(TypeError, match=f"Solution.{what}.*concrete status"):
            jax.jit(traced, static_argnums=1)(out, what)


@pytest.mark.parametrize(
    "accept,exc,match",
    [
        ("MAX_ITERATIONS", TypeError, "accept must hold Status codes"),
        (1.0, TypeError, "accept must be a Status or a sequence"),
        ([True], TypeError, "accept must hold Status codes"),
        (99, ValueError, "99, which is no Status code"),
        (Status.RUNNING, ValueError, "RUNNING"),
    ],
)
def test_throw_rejects_bad_accept(accept, exc, match):
    with pytest.raises(exc, match=match):
        solution(Status.CONVERGED).throw(accept=accept)


def test_one_result_module_and_one_entry_point_per_solver():
    cg, ncg_mod, optax_adapter, sol_mod = (
        importlib.import_module(f"shardvi.minimizers.{m}") for m in ("cg", "newton_cg", "optax_adapter", "solution")
    )  # the package's newton_cg is the function
    assert not hasattr(ncg_mod, "OptimizeResult") and cg.CGResult is sol_mod.CGResult is CGResult
    # the two solver functions; the trust region and the optax adapter run through their Minimizer's minimize only
    assert sv.minimizers.conjugate_gradient is cg.conjugate_gradient and sv.minimizers.newton_cg is ncg_mod.newton_cg
    for name in ("optax_minimize", "trust_region_newton_cg"):
        assert not hasattr(sv.minimizers, name), name
    tr_mod = importlib.import_module("shardvi.minimizers.trust_region")
    assert tr_mod.__all__ == ["TrustRegionConfig"] and optax_adapter.__all__ == ["OptaxConfig", "check_optimizer"]
    # the optax adapter does not depend on Newton-CG
    tree = ast.parse(pathlib.Path(optax_adapter.__file__).read_text())
    imported = {n.module for n in ast.walk(tree) if isinstance(n, ast.ImportFrom)}
    assert "newton_cg" not in imported and "solution" in imported


# ---------------------------------------------------------------------------------------------------
# solvers return these types; a failed solve raises through throw
# ---------------------------------------------------------------------------------------------------
def test_solvers_return_the_shared_types_and_throw_on_failure():
    fg, hp = quadratic()
    res = conjugate_gradient(lambda v: jnp.asarray(A) @ v, jnp.asarray(B), config=CGConfig(tol=1e-12))
    assert isinstance(res, CGResult)
    np.testing.assert_allclose(res.throw().x, EXACT, rtol=1e-10)
    short = conjugate_gradient(lambda v: jnp.asarray(A) @ v, jnp.asarray(B), config=CGConfig(tol=1e-12, maxiter=2))
    with pytest.raises(SolverError, match="after 2 iterations: reached maxiter"):
        short.throw()
    diverged = OptaxConfig(optax.sgd(1e3), maxiter=1000).minimize(fg, None, jnp.ones(N))
    assert isinstance(diverged, Solution)
    with pytest.raises(SolverError, match=r"non-finite.*\(status NONFINITE\)"):
        diverged.throw(accept=Status.MAX_ITERATIONS)


# ---------------------------------------------------------------------------------------------------
# the Minimizer protocol
# ---------------------------------------------------------------------------------------------------
def test_newton_cg_config_minimize_is_newton_cg():
    fg, hp = quadratic()
    cfg = NewtonCGConfig(gtol=1e-12, xtol=None)
    assert isinstance(cfg, Minimizer)
    via = jax.jit(lambda x, c: c.minimize(fg, hp, x, min_curvature=1.0), static_argnums=1)(jnp.zeros(N), cfg)
    direct = jax.jit(lambda x, c: newton_cg(fg, hp, x, c, min_curvature=1.0), static_argnums=1)(jnp.zeros(N), cfg)
    assert isinstance(via, Solution)
    assert_bitwise(via, direct)
    assert via.throw().message == "converged"
    np.testing.assert_allclose(via.x, EXACT, rtol=1e-10)


@pytest.mark.parametrize("min_curvature", [None, 0.0, 1.0])
def test_newton_cg_config_minimize_forwards_its_arguments(monkeypatch, min_curvature):
    ncg_mod = importlib.import_module("shardvi.minimizers.newton_cg")
    calls = []
    monkeypatch.setattr(ncg_mod, "newton_cg", lambda *a, **k: calls.append((a, k)) or "sentinel")
    cfg = NewtonCGConfig(maxiter=7)
    fg, hp = quadratic()
    x0 = jnp.zeros(N)
    assert cfg.minimize(fg, hp, x0, min_curvature=min_curvature) == "sentinel"
    assert calls == [((fg, hp, x0, cfg), {"min_curvature": min_curvature})]


def test_optax_config_minimize_ignores_hessp():
    fg, hp = quadratic()
    cfg = OptaxConfig(optax.adam(0.05), maxiter=4000, gtol=1e-9)
    assert isinstance(cfg, Minimizer)

    def broken_hessp(x, v):
        raise AssertionError("the optax adapter must not call hessp")

    via = jax.jit(lambda x: cfg.minimize(fg, broken_hessp, x, min_curvature=1.0))(jnp.zeros(N))
    direct = jax.jit(lambda x: cfg.minimize(fg, None, x))(jnp.zeros(N))
    assert_bitwise(via, direct)
    assert bool(via.converged), via.message
    np.testing.assert_allclose(via.x, EXACT, atol=1e-8)


@dataclasses.dataclass(frozen=True)
class GradientDescent(Minimizer):
    """A fixed number of gradient-descent steps: the smallest custom minimizer."""

    step: float = 0.1
    steps: int = 25

    def minimize(self, fun_and_grad, hessp, x0, *, min_curvature=None):
        x = jax.lax.fori_loop(0, self.steps, lambda _, x: sv.tree_math.axpy(-self.step, fun_and_grad(x)[1], x), x0)
        f, g = fun_and_grad(x)
        n = jnp.asarray(self.steps, jnp.int32)
        return Solution(x, f, g, n, jnp.zeros((), jnp.int32), n + 1, jnp.asarray(Status.MAX_ITERATIONS, jnp.int32))


def test_custom_minimizer_subclass_is_accepted_and_used():
    fg, hp = quadratic()
    gd = check_minimizer(GradientDescent(step=0.2, steps=30), "kl_minimization", params=jnp.zeros(N))
    res = jax.jit(lambda x, m: m.minimize(fg, hp, x, min_curvature=1.0), static_argnums=1)(jnp.zeros(N), gd)
    x = np.zeros(N)
    for _ in range(30):
        x = x - 0.2 * (A @ x - B)
    np.testing.assert_allclose(res.x, x, rtol=1e-13, atol=1e-15)
    assert int(res.nit) == 30 and int(res.nfev) == 31
    assert res.throw(accept=Status.MAX_ITERATIONS) is res
    with pytest.raises(SolverError, match="reached maxiter"):
        res.throw()


def test_check_minimizer_rejects_what_cannot_minimize():
    with pytest.raises(TypeError, match=r"kl_minimization must be a shardvi.minimizers.Minimizer.*got CGConfig"):
        check_minimizer(CGConfig(), "kl_minimization")
    with pytest.raises(TypeError, match="kl_minimization must be a shardvi.minimizers.Minimizer.*got function$"):
        check_minimizer(lambda f, h, x: x, "kl_minimization")
    # an optax optimizer itself: the message says how to wrap it
    with pytest.raises(TypeError, match=r"got GradientTransformation.*kl_minimization=sv.OptaxConfig\(optimizer"):
        check_minimizer(optax.adam(1e-2), "kl_minimization")

    @dataclasses.dataclass  # mutable: eq without hash
    class Mutable(Minimizer):
        step: float = 0.1

        def minimize(self, fun_and_grad, hessp, x0, *, min_curvature=None):
            return None

    with pytest.raises(TypeError, match="kl_minimization must be hashable"):
        check_minimizer(Mutable(), "kl_minimization")

    class NoMinimize(Minimizer):
        pass

    with pytest.raises(TypeError, match="abstract"):
        NoMinimize()


def test_optax_config_check_traces_the_optimizer_on_the_parameters():
    params = jax.ShapeDtypeStruct((N,), jnp.float64)
    good = OptaxConfig(optax.lbfgs())
    assert check_minimizer(good, "kl_minimization", params=params) is good
    assert NewtonCGConfig().check(params, "kl_minimization") is None  # nothing to check

    def bad_update(updates, state, params=None):
        return updates  # not (updates, state)

    bad = OptaxConfig(optax.GradientTransformation(lambda p: optax.EmptyState(), bad_update))
    with pytest.raises(TypeError, match=r"kl_minimization\.optimizer\.update must return a pair"):
        check_minimizer(bad, "kl_minimization", params=params)


def test_solvers_name_an_argument_that_is_not_callable():
    fg, hp = quadratic()
    x0 = jnp.zeros(N)
    with pytest.raises(TypeError, match="newton_cg: fun_and_grad must be callable, got int"):
        newton_cg(3, hp, x0)
    with pytest.raises(TypeError, match="newton_cg: hessp must be callable, got NoneType"):
        newton_cg(fg, None, x0)
    with pytest.raises(TypeError, match="newton_cg: hessp_at must be callable, got str"):
        newton_cg(fg, hp, x0, hessp_at="metric")
    with pytest.raises(TypeError, match="TrustRegionConfig.minimize: hessp must be callable, got ndarray"):
        TrustRegionConfig().minimize(fg, np.eye(N), x0)
    with pytest.raises(TypeError, match="OptaxConfig.minimize: fun_and_grad must be callable, got float"):
        OptaxConfig(optax.sgd(0.1)).minimize(1.0, None, x0)


@pytest.mark.parametrize("kw", ["min_curvature", "xtol_curvature"])
def test_newton_cg_rejects_a_bad_curvature_bound(kw):
    fg, hp = quadratic()
    with pytest.raises(ValueError, match=f"newton_cg.{kw} must be a finite number >= 0"):
        newton_cg(fg, hp, jnp.zeros(N), NewtonCGConfig(), **{kw: -1.0})
    with pytest.raises(TypeError, match=f"newton_cg.{kw} must be a float or None"):
        newton_cg(fg, hp, jnp.zeros(N), NewtonCGConfig(), **{kw: "1"})


def test_newton_cg_config_minimize_checks_min_curvature():
    fg, hp = quadratic()
    with pytest.raises(ValueError, match="newton_cg.min_curvature must be a finite number >= 0"):
        NewtonCGConfig().minimize(fg, hp, jnp.zeros(N), min_curvature=float("nan"))


def test_optimize_kl_uses_a_custom_minimizer():
    """The driver calls ``kl_minimization.minimize``: MAP of a linear Gaussian problem, x = d / 2."""
    d = np.array([0.3, -1.2, 2.0, 0.7])
    model = sv.Model(lambda xi: xi["x"], {"x": jax.ShapeDtypeStruct((4,), jnp.float64)})
    lh = sv.Gaussian(d, noise_std=1.0).amend(model)
    samples, state = sv.optimize_kl(
        lh,
        {"x": jnp.zeros(4)},
        key=jax.random.PRNGKey(0),
        n_total_iterations=1,
        n_samples=0,
        sample_mode="linear_resample",
        kl_minimization=GradientDescent(step=0.2, steps=120),
        progress=False,
    )
    np.testing.assert_allclose(samples.pos["x"], d / 2, rtol=1e-12, atol=1e-14)
    assert state.history[0].kl_nit == 120 and state.history[0].kl_status == int(Status.MAX_ITERATIONS)
    with pytest.raises(TypeError, match=r"kl_minimization\(0\) returned .*must be a shardvi.minimizers.Minimizer"):
        sv.optimize_kl(
            lh,
            {"x": jnp.zeros(4)},
            key=jax.random.PRNGKey(0),
            n_total_iterations=1,
            n_samples=0,
            sample_mode="linear_resample",
            kl_minimization=lambda i: sv.CGConfig(),
            progress=False,
        )
