"""The driver's pieces outside ``optimize_kl.py``: import graph, sample-mode policy, chi^2 sums."""

import ast
import pathlib

import jax
import jax.numpy as jnp
import numpy as np
import pytest

import shardvi as sv
from shardvi.vi.diagnostics import chi2_sums, pooled_chi2, reduced_chi2, residual_stats
from shardvi.vi.modes import SampleMode, SampleSource, plan_samples, recorded_as

ROOT = pathlib.Path(sv.__file__).parent


def _module_file(name):
    path = ROOT.parent.joinpath(*name.split("."))
    for f in (path.with_suffix(".py"), path / "__init__.py"):
        if f.is_file():
            return f
    return None


def _imports(name):
    """shardvi modules that module ``name`` imports explicitly (anywhere in the file, lazy imports included)."""
    f = _module_file(name)
    package = name if f.name == "__init__.py" else name.rpartition(".")[0]
    out = set()
    for node in ast.walk(ast.parse(f.read_text())):
        if isinstance(node, ast.Import):
            out |= {a.name for a in node.names if a.name.startswith("shardvi")}
        elif isinstance(node, ast.ImportFrom):
            if node.level:
                base = package.split(".")[: len(package.split(".")) - node.level + 1]
                mod = ".".join(base + ([node.module] if node.module else []))
            else:
                mod = node.module or ""
            if not mod.startswith("shardvi"):
                continue
            subs = {f"{mod}.{a.name}" for a in node.names if _module_file(f"{mod}.{a.name}")}
            out |= subs or {mod}
    return {m for m in out if _module_file(m)}


def _reachable(start):
    seen, todo = set(), list(start)
    while todo:
        m = todo.pop()
        if m not in seen:
            seen.add(m)
            todo.extend(_imports(m))
    return seen


def test_checkpoint_does_not_import_the_driver():
    """``vi.checkpoint`` -> ``vi.optimize_kl`` is no edge (the driver imports checkpoints: no cycle)."""
    ckpt = ["shardvi.vi.checkpoint"] + [
        f"shardvi.vi.checkpoint.{p.stem}" for p in (ROOT / "vi" / "checkpoint").glob("*.py") if p.stem != "__init__"
    ]
    reach = _reachable(ckpt)
    assert "shardvi.vi.state" in reach and "shardvi.vi.optimize_kl" not in reach, sorted(reach)
    assert "shardvi.vi.checkpoint" in _imports("shardvi.vi.optimize_kl")
    assert sv.OptimizeVIState is sv.vi.checkpoint.store.OptimizeVIState


@pytest.mark.parametrize(
    "mode, n, n_prev, want",
    [
        ("linear_resample", 3, 3, ("linear_resample", SampleSource.FRESH, False)),
        ("linear_sample", 3, 3, ("linear_sample", SampleSource.REUSE, False)),
        ("linear_sample", 3, 2, ("linear_sample", SampleSource.FRESH, False)),
        ("nonlinear_sample", 2, 2, ("nonlinear_sample", SampleSource.REUSE, False)),
        ("nonlinear_resample", 2, 2, ("nonlinear_resample", SampleSource.FRESH, False)),
        ("nonlinear_update", 2, 2, ("nonlinear_update", SampleSource.UPDATE, False)),
        ("nonlinear_update", 2, 0, ("nonlinear_resample", SampleSource.FRESH, True)),
        ("nonlinear_update", 2, 3, ("nonlinear_resample", SampleSource.FRESH, True)),
        ("linear_sample", 0, 0, ("linear_sample", SampleSource.NONE, False)),
        ("linear_resample", 0, 2, ("linear_resample", SampleSource.NONE, False)),
    ],
)
def test_sample_mode_policy(mode, n, n_prev, want):
    plan = plan_samples(SampleMode(mode), n, n_prev)
    assert (plan.mode.value, plan.source, plan.fallback) == want


def test_recorded_as_allows_only_the_update_fallback():
    assert recorded_as(SampleMode.NONLINEAR_UPDATE, "nonlinear_resample")
    assert recorded_as(SampleMode.NONLINEAR_UPDATE, "nonlinear_update")
    assert not recorded_as(SampleMode.NONLINEAR_RESAMPLE, "nonlinear_update")
    assert not recorded_as(SampleMode.LINEAR_SAMPLE, "linear_resample")


@pytest.mark.slow
def test_chi2_sums_agree_with_the_minisanity_table():
    """The log line's pooled chi^2 (jittable sums) equals the dof-weighted table value, complex data included."""
    dom = {"a": jax.ShapeDtypeStruct((6,), jnp.float64), "b": jax.ShapeDtypeStruct((2,), jnp.float64)}
    model = sv.Model(lambda x: (x["a"][:3] + 1j * x["a"][3:]) * jnp.exp(x["b"][0]), dom)
    k = jax.random.split(jax.random.PRNGKey(0), 4)
    data = jax.random.normal(k[0], (3,)) + 1j * jax.random.normal(k[1], (3,))
    lh = sv.Gaussian(data, noise_std=0.5).amend(model)
    pos = {"a": jnp.full(6, 0.1), "b": jnp.full(2, -0.2)}
    res = {"a": jax.random.normal(k[2], (4, 6)), "b": jax.random.normal(k[3], (4, 2))}
    samples = sv.Samples(pos, res)
    lh_sums, prior_sums = jax.jit(lambda p, r: chi2_sums(sv.Samples(p, r), lh))(pos, res)
    assert lh_sums[1] == 4 * 3 and prior_sums[1] == 4 * 8
    stats = residual_stats(samples, lh)
    np.testing.assert_allclose(reduced_chi2(lh_sums), pooled_chi2(stats["likelihood"]), rtol=1e-13)
    np.testing.assert_allclose(reduced_chi2(prior_sums), pooled_chi2(stats["prior"]), rtol=1e-13)
    nres = np.asarray(jax.vmap(lh.normalized_residual)(samples.samples))
    np.testing.assert_allclose(reduced_chi2(lh_sums), np.mean(np.abs(nres) ** 2) / 2, rtol=1e-13)
    assert chi2_sums(samples)[0] is None


def test_the_driver_is_thin_and_vi_functions_are_short():
    """``optimize_kl.py`` is the driver (options, resume, the run); the engine and its steps live elsewhere, and no
    function of ``shardvi.vi`` has more than 100 lines of code (its docstring aside)."""
    assert len((ROOT / "vi" / "optimize_kl.py").read_text().splitlines()) <= 400
    long = []
    for f in sorted((ROOT / "vi").rglob("*.py")):
        for node in ast.walk(ast.parse(f.read_text())):
            if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)):
                body = node.body
                doc = isinstance(body[0], ast.Expr) and isinstance(body[0].value, ast.Constant) and len(body) > 1
                start = body[1 if doc else 0].lineno
                if node.end_lineno - start + 1 > 100:
                    long.append(f"{f.name}:{node.name}")
    assert long == []
