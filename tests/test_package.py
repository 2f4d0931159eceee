"""Package hygiene: no import cycle, a light ``import shardvi``, a small public API, one version, a removable
compile counter, the public example problems."""

import ast
import importlib.metadata
import os
import subprocess
import sys

import jax
import numpy as np
import pytest
from _timeouts import scaled

import shardvi as sv
from shardvi.compilation import CompileCounter

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
PKG = os.path.join(ROOT, "shardvi")


# ------------------------------------------------------------------------------------------------ import graph
def _modules():
    """``{dotted module name: (path, is_package)}`` for every ``shardvi/**/*.py``."""
    mods = {}
    for dirpath, dirnames, filenames in os.walk(PKG):
        dirnames[:] = [d for d in dirnames if d != "__pycache__"]
        for fn in filenames:
            if fn.endswith(".py"):
                rel = os.path.relpath(os.path.join(dirpath, fn), ROOT)[:-3].split(os.sep)
                is_pkg = rel[-1] == "__init__"
                mods[".".join(rel[:-1] if is_pkg else rel)] = (os.path.join(dirpath, fn), is_pkg)
    return mods


def _is_type_checking(test):
    return (isinstance(test, ast.Name) and test.id == "TYPE_CHECKING") or (
        isinstance(test, ast.Attribute) and test.attr == "TYPE_CHECKING"
    )


def _imports(tree):
    """Every Import/ImportFrom node, at any depth (functions too), except under ``if TYPE_CHECKING:``."""
    out = []

    def visit(node):
        if isinstance(node, ast.If) and _is_type_checking(node.test):
            for child in node.orelse:
                visit(child)
            return
        if isinstance(node, (ast.Import, ast.ImportFrom)):
            out.append(node)
        for child in ast.iter_child_nodes(node):
            visit(child)

    visit(tree)
    return out


def import_graph():
    """``{module: set of shardvi modules whose import it triggers}``.

    ``import a.b.c`` / ``from a.b import c`` runs the modules ``a.b.c`` (when it is a
    module), ``a.b`` and ``a`` — except packages enclosing the importer, which are
    already being imported when it runs (an edge to them is no dependency).
    ``importlib.import_module`` calls (the lazy ``__getattr__`` of ``shardvi``) are not
    imports at module load and make no edges.
    """
    mods = _modules()
    graph = {}
    for name, (path, is_pkg) in mods.items():
        with open(path) as f:
            tree = ast.parse(f.read(), path)
        package = name if is_pkg else name.rpartition(".")[0]
        enclosing = {".".join(name.split(".")[:i]) for i in range(1, name.count(".") + 1)}
        if is_pkg:
            enclosing.add(name)
        targets = set()
        for node in _imports(tree):
            if isinstance(node, ast.Import):
                found = [a.name for a in node.names]
            else:
                if node.level:
                    base = package.split(".")
                    base = base[: len(base) - (node.level - 1)]
                    base = ".".join(base + ([node.module] if node.module else []))
                else:
                    base = node.module
                found = [base] + [f"{base}.{a.name}" for a in node.names if f"{base}.{a.name}" in mods]
            for target in found:
                parts = target.split(".")
                for i in range(1, len(parts) + 1):
                    prefix = ".".join(parts[:i])
                    if prefix in mods and prefix not in enclosing and prefix != name:
                        targets.add(prefix)
        graph[name] = targets
    return graph


def find_cycle(graph):
    """One cycle as a list ``[m0, m1, ..., m0]``, or ``None``."""
    state = {}  # 1: on the stack, 2: done
    stack = []

    def dfs(node):
        state[node] = 1
        stack.append(node)
        for nxt in sorted(graph.get(node, ())):
            if state.get(nxt) == 1:
                return stack[stack.index(nxt) :] + [nxt]
            if nxt not in state:
                cycle = dfs(nxt)
                if cycle:
                    return cycle
        stack.pop()
        state[node] = 2
        return None

    for node in sorted(graph):
        if node not in state:
            cycle = dfs(node)
            if cycle:
                return cycle
    return None


def test_import_graph_model():
    """The graph sees what it must: relative imports, submodules named in ``from . import``, function-level
    imports, parents of the target; and ignores ``TYPE_CHECKING`` and enclosing packages."""
    graph = import_graph()
    assert "shardvi.vi.optimize_kl" in graph and "shardvi.examples" in graph
    # the lazy __getattr__ and the TYPE_CHECKING block: no edges; the version only
    assert graph["shardvi"] == {"shardvi._version"}
    assert {"shardvi.models", "shardvi.vi"} <= graph["shardvi.examples"]  # function-level imports count
    assert {"shardvi.examples", "shardvi.vi.progress"} <= graph["shardvi.__main__"]
    assert all("shardvi.vi" not in targets for name, targets in graph.items() if name.startswith("shardvi.vi."))
    assert find_cycle({"a": {"b"}, "b": {"c"}, "c": {"a"}}) == ["a", "b", "c", "a"]
    assert find_cycle({"a": {"b"}, "b": set()}) is None


def test_no_import_cycle():
    cycle = find_cycle(import_graph())
    assert cycle is None, "import cycle: " + " -> ".join(cycle)


# ------------------------------------------------------------------------------------------------ import cost
def test_import_shardvi_loads_neither_matplotlib_nor_finufft():
    code = "import shardvi, sys; assert 'matplotlib' not in sys.modules and 'jax_finufft' not in sys.modules"
    res = subprocess.run(
        [sys.executable, "-c", code],
        check=False,
        capture_output=True,
        text=True,
        cwd=ROOT,
        timeout=scaled(120),
        env={**os.environ, "JAX_PLATFORMS": "cpu"},
    )
    assert res.returncode == 0, res.stderr


def test_plot_never_selects_a_backend():
    with open(os.path.join(PKG, "plot.py")) as f:
        tree = ast.parse(f.read())
    calls = [n.func.attr for n in ast.walk(tree) if isinstance(n, ast.Call) and isinstance(n.func, ast.Attribute)]
    assert "use" not in calls and "switch_backend" not in calls


# ------------------------------------------------------------------------------------------------ public API
INTERNAL = (
    "check_devices",
    "chunked_apply",
    "opaque_constants",
    "match_vma",
    "nufft2d_type1",
    "nufft2d_type2",
    "fixed_order_mean",
    "map_mean",
    "place",
    "reproducible_jit",
    "check_progress",
)


def test_top_level_all_holds_no_internal_helper():
    assert not [n for n in sv.__all__ if n in INTERNAL or n.startswith(("nufft2d", "_"))]
    assert len(set(sv.__all__)) == len(sv.__all__)
    for name in (
        "Model",
        "Gaussian",
        "optimize_kl",
        "Samples",
        "CGConfig",
        "NewtonCGConfig",
        "plot",
        "examples",
        "compilation",
        "parallel",
        "minimizers",
    ):
        assert name in sv.__all__, name
    with pytest.raises(AttributeError, match="check_devices"):
        sv.check_devices  # noqa: B018


def test_version_has_one_source_and_matches_the_metadata():
    from shardvi._version import __version__

    assert sv.__version__ == __version__ == importlib.metadata.version("shardvi")
    with open(os.path.join(ROOT, "pyproject.toml")) as f:
        text = f.read()
    assert 'dynamic = ["version"]' in text and "\nversion =" not in text.split("[tool.setuptools.dynamic]")[0]
    assert os.path.isfile(os.path.join(PKG, "py.typed")) and '"py.typed"' in text


# ------------------------------------------------------------------------------------------------ CompileCounter
def test_compile_counter_counts_and_stops_after_close():
    from shardvi._jax_compat import event_listener_counts

    before, before_events = event_listener_counts()
    with CompileCounter() as outer:
        with CompileCounter() as inner:
            jax.jit(lambda x: x * 3.0 + 1.0)(np.float64(1.0))
        assert event_listener_counts()[0] == before + 1
        jax.jit(lambda x: x * 5.0 - 2.0)(np.float64(1.0))
    assert (inner.count, outer.count) == (1, 2)
    assert outer.seconds > 0 and outer.snapshot()["n"] == 2 and not outer.active
    assert event_listener_counts() == (before, before_events)  # no listener left behind
    jax.jit(lambda x: x * 7.0 + 4.0)(np.float64(1.0))
    assert (inner.count, outer.count) == (1, 2)
    outer.close()  # idempotent


def test_compile_counter_close_without_context_manager():
    cc = CompileCounter()
    jax.jit(lambda x: x - 9.0)(np.float64(1.0))
    cc.close()
    jax.jit(lambda x: x - 11.0)(np.float64(1.0))
    assert cc.count == 1 and cc.snapshot() == {
        "n": 1,
        "s": cc.seconds,
        "hits": cc.cache_hits,
        "trace_lower_s": cc.trace_lower_seconds,
    }


def test_benchmarks_use_the_library_compile_counter():
    sys.path.insert(0, os.path.join(ROOT, "benchmarks"))
    try:
        import _common
    finally:
        sys.path.remove(os.path.join(ROOT, "benchmarks"))
    cs = _common.CompileStats()
    cs.close()
    assert isinstance(cs, CompileCounter)
    with open(os.path.join(ROOT, "benchmarks", "_common.py")) as f:
        assert "register_event_duration_secs_listener" not in f.read()


# ------------------------------------------------------------------------------------------------ examples
def test_examples_are_public_and_deterministic():
    from shardvi import examples

    assert set(examples.__all__) == {"DEMOS", "Demo", "build_demo"} and sv.examples is examples
    assert not os.path.exists(os.path.join(PKG, "_demo_models.py"))
    a, b = examples.build_demo("lognormal_1d", npix=16, seed=3), examples.build_demo("lognormal_1d", npix=16, seed=3)
    assert a.truth.shape == (16,) and np.array_equal(a.truth, b.truth)
    assert a.signal(a.position).shape == (16,) and set(a.position) == {"xi", "fluct"}
    w = examples.build_demo("wiener_1d", npix=16)
    assert w.position.shape == (16,) and np.isfinite(float(w.likelihood(w.position)))
    with pytest.raises(ValueError, match="demo must be one of"):
        examples.build_demo("nope")
    with pytest.raises(ValueError, match="npix"):
        examples.build_demo(npix=3)


def test_parallel_exports_what_users_need_only():
    """sv.parallel's public list: the strategies, multi-process set-up, field arrays, FFTs, reproducibility;
    not the engine's placement and reduction helpers (importable, but not public API)."""
    public = set(sv.parallel.__all__)
    assert {"Vmap", "LaxMap", "ShardMap", "Pmap", "JitSharding", "Strategy", "initialize_distributed"} <= public
    engine_only = {"place", "Placed", "map_mean", "fixed_order_mean", "chunked_apply", "sample_mesh", "sharded"}
    assert not public & engine_only
    assert len(public) <= 32
    for name in public:
        assert getattr(sv.parallel, name) is not None
