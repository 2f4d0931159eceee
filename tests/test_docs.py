"""The documentation's Python examples run as written: README.md and docs/guide/*.md.

Each file's ```` ```python ```` blocks run in order in one namespace, in this process (float64 and 4 CPU
devices, tests/conftest.py) and in a temporary working directory (figures and checkpoints the examples
write go there). A block is not run when the line before its fence is the marker ``<!-- docs-test: skip -->``
(invisible in the rendered page): fragments with ``...``, code that has to start a process of its own
(``jax.distributed``), and the field-split comparison of docs/guide/model-parallelism.md (long to compile;
tests/test_field_split.py checks the same equality).

An example prepares its process as a user's script does; JAX is already set up here, so
``jax.config.update("jax_num_cpu_devices", n)`` is checked against the 4 devices of this process instead
of being applied (it raises once JAX has run). Every file must run without a solver convergence warning
(``sv.ConvergenceWarning``): the guides teach settings that converge, and what an example says it shows
(the same bits on 1 and 4 devices, a resumed run equal to a straight one) is checked (``CLAIMS``). The
examples are small (a 32 x 32 image, a few iterations), so that this module runs quickly; programs the
files share are compiled once (the test session's compilation cache).
"""

import glob
import logging
import os
import re
import warnings

import jax
import numpy as np
import pytest

import shardvi as sv

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
SKIP = "<!-- docs-test: skip -->"
FILES = ["README.md"] + sorted(os.path.relpath(p, ROOT) for p in glob.glob(os.path.join(ROOT, "docs", "guide", "*.md")))


def python_blocks(path):
    """``(first line number, code, skipped)`` of every ```` ```python ```` block of the Markdown file ``path``."""
    with open(os.path.join(ROOT, path)) as f:
        lines = f.read().splitlines()
    blocks, i = [], 0
    while i < len(lines):
        if lines[i].strip() == "```python":
            skipped = i > 0 and lines[i - 1].strip() == SKIP
            start = i + 1
            i = start
            while lines[i].strip() != "```":
                i += 1
            blocks.append((start + 1, "\n".join(lines[start:i]) + "\n", skipped))
        i += 1
    return blocks


class _Records(logging.Handler):
    def __init__(self):
        super().__init__(logging.WARNING)
        self.messages = []

    def emit(self, record):
        self.messages.append(record.getMessage())


def _convergence_warnings(caught, logged):
    """Messages of solver convergence warnings: the warning category, or "did not converge" in a warning or log."""
    bad = [str(w.message) for w in caught if issubclass(w.category, sv.ConvergenceWarning)]
    bad += [str(w.message) for w in caught if "did not converge" in str(w.message)]
    return bad + [m for m in logged if "did not converge" in m]


def run_file(path, monkeypatch, tmp_path):
    """Execute the runnable blocks of ``path`` in order in one namespace; returns the namespace."""
    devices = len(jax.devices("cpu"))
    update = jax.config.update

    def config_update(name, value):
        if name == "jax_num_cpu_devices":  # set once, before any JAX operation: here by tests/conftest.py
            assert value <= devices, f"{path} asks for {value} CPU devices, the test process has {devices}"
            return
        update(name, value)

    monkeypatch.setattr(jax.config, "update", config_update)
    monkeypatch.chdir(tmp_path)
    ns: dict = {"__name__": "__docs__"}
    handler = _Records()
    logger = logging.getLogger("shardvi")
    logger.addHandler(handler)
    try:
        with warnings.catch_warnings(record=True) as caught:
            warnings.simplefilter("always")
            for line, code, skipped in python_blocks(path):
                if not skipped:
                    exec(compile(code, f"{path}:{line}", "exec"), ns)
    finally:
        logger.removeHandler(handler)
    bad = _convergence_warnings(caught, handler.messages)
    assert not bad, f"{path}: convergence warnings: {bad}"
    return ns


def test_code_fences_are_closed_and_blocks_compile():
    for path in FILES:
        blocks = python_blocks(path)
        with open(os.path.join(ROOT, path)) as f:
            assert f.read().count("```") % 2 == 0, f"{path}: unclosed code fence"
        for _, code, _ in blocks:
            compile(code, path, "exec")  # skipped blocks too: they must at least be valid Python


def test_readme_links_to_existing_guides():
    with open(os.path.join(ROOT, "README.md")) as f:
        links = re.findall(r"\]\(((?:docs|demos)/[^)#]+)", f.read())
    assert links
    for link in links:
        assert os.path.exists(os.path.join(ROOT, link)), link


def test_readme_example(monkeypatch, tmp_path, capsys):
    ns = run_file("README.md", monkeypatch, tmp_path)
    out = capsys.readouterr().out
    mean, std, truth, state = (ns[k] for k in ("mean", "std", "truth", "state"))
    assert np.shape(mean) == np.shape(std) == np.shape(truth) == (32, 32)
    assert np.mean(np.abs(np.asarray(mean) - np.asarray(truth)) < 2 * np.asarray(std)) >= 0.85
    # every solve converged (the warnings are checked by run_file; this holds without them too)
    for r in state.history:
        assert r.kl_status == 0 and set(r.sampling_status) == {0} and not r.nonlinear_status, r
    assert 0.8 < state.history[-1].chi2_likelihood < 1.3
    assert re.search(r"^likelihood\s+[0-9.]+", out, re.M) and "truth within mean +- 2 std" in out


def _all_true(tree):
    return all(bool(x) for x in jax.tree.leaves(tree))


# what a guide's example says it shows, checked on its namespace
CLAIMS = {
    "docs/guide/checkpoints.md": lambda ns: ns["state"].nit == 4 and _all_true(ns["same"]),
    "docs/guide/model-parallelism.md": lambda ns: (
        float(ns["lh_rows"].energy(ns["x0"])) == float(ns["lh"].energy(ns["x0"]))
    ),
    "docs/guide/strategies.md": lambda ns: _all_true(ns["same"]),
    "docs/guide/tutorial.md": lambda ns: (
        np.mean(np.abs(np.asarray(ns["mean"]) - np.asarray(ns["truth"])) < 2 * np.asarray(ns["std"])) >= 0.85
        and set(ns["geo_state"].history[-1].nonlinear_status) == {0}
    ),
    "docs/guide/troubleshooting.md": lambda ns: all(
        np.all(x == 0) for x in jax.tree.leaves((ns["diff"], ns["on_one"]))
    ),
}
# examples that compare the bits of different programs (1 against N devices) run at the shipped LLVM level
# (tests/conftest.py); the other files' examples share these programs and load them from the session's cache
BITWISE = ("checkpoints.md", "strategies.md", "troubleshooting.md")


@pytest.mark.parametrize(
    "path",
    [
        pytest.param(p, marks=[pytest.mark.product_compiler] if p.endswith(BITWISE) else [])
        for p in FILES
        if p != "README.md"
    ],
)
def test_guide_examples_run(path, monkeypatch, tmp_path):
    ns = run_file(path, monkeypatch, tmp_path)
    if path in CLAIMS:
        assert CLAIMS[path](ns), f"{path}: the example does not show what its text says"
