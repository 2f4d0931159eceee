"""Figures are valid PNGs; the Wiener-filter demo reproduces the closed form; the README names the public
pieces; ``import shardvi`` is light; the minisanity table is aligned (the README's code: tests/test_docs.py)."""

import os
import re
import runpy
import subprocess
import sys
import textwrap

import jax
import jax.numpy as jnp
import numpy as np
import pytest

import shardvi as sv
from shardvi import plot
from shardvi.vi.diagnostics import IterationReport, format_residual_stats

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))

PNG_MAGIC = b"\x89PNG\r\n\x1a\n"


def is_png(path):
    with open(path, "rb") as f:
        return os.path.getsize(path) > 1000 and f.read(8) == PNG_MAGIC


@pytest.mark.slow
def test_plot_functions_write_pngs(tmp_path):
    rng = np.random.default_rng(0)
    img = rng.normal(size=(16, 12))
    mask = np.ones((16, 12), bool)
    mask[3:8, 4:9] = False
    plot.plot_reconstruction(
        img, np.abs(img) + 0.1, truth=img + 0.1, data=img, mask=mask, unit="K", path=tmp_path / "a.png"
    )
    plot.plot_reconstruction(
        img[0],
        np.ones(12),
        truth=img[1],
        data=img[2, :5],
        data_coords=np.arange(5),
        mask=mask[5],
        path=tmp_path / "b.png",
    )
    plot.plot_samples(rng.normal(size=(3, 16, 12)), mask=mask, extent=(0, 8, 0, 6), path=tmp_path / "c.png")
    plot.plot_samples(rng.normal(size=(3, 16)), truth=img[:, 0], mask=mask[:, 5], path=tmp_path / "d.png")
    k = np.linspace(0, 10, 20)
    plot.plot_power_spectra(k, np.exp(-rng.random((4, 20))), truth=np.ones(20), path=tmp_path / "e.png")
    hist = [
        IterationReport(
            i,
            "linear_resample" if i < 2 else "nonlinear_resample",
            2,
            10.0 / i,
            [3],
            [],
            2,
            5,
            0,
            1.0 + 1 / i,
            1.0,
            0.1,
        )
        for i in (1, 2, 3)
    ]
    plot.plot_convergence(hist, path=tmp_path / "f.png")
    for name in "abcdef":
        assert is_png(tmp_path / f"{name}.png"), name


@pytest.mark.slow
def test_wiener_demo_runs_and_matches(tmp_path, monkeypatch, capsys):
    monkeypatch.setattr(
        sys,
        "argv",
        ["wiener_filter_1d.py", "--npix", "64", "--n-samples", "2", "--iterations", "2", "--output", str(tmp_path)],
    )
    mod = runpy.run_path(os.path.join(ROOT, "demos", "wiener_filter_1d.py"), run_name="demo")
    assert mod["main"]() == 0
    out, err = capsys.readouterr()
    rel = float(re.search(r"max \|MGVI mean - Wiener filter\| / max\|WF\| = (\S+)", out).group(1))
    assert rel < mod["MAX_REL_ERROR"]
    assert "vmap on 1 device(s)" in out
    # progress (not --quiet, stderr no terminal): one summary line per iteration
    assert [ln.split(" [")[0] for ln in err.splitlines() if ln.startswith("iteration")] == [
        "iteration 1/2",
        "iteration 2/2",
    ]
    for f in ("reconstruction.png", "samples.png", "convergence.png"):
        assert is_png(tmp_path / f)


def run_python(code):
    """Run ``code`` in a fresh interpreter (no conftest); returns stdout, fails on a non-zero exit."""
    res = subprocess.run(
        [sys.executable, "-c", textwrap.dedent(code)],
        capture_output=True,
        text=True,
        cwd=ROOT,
        timeout=300,
        env={**os.environ, "JAX_PLATFORMS": "cpu"},
    )
    assert res.returncode == 0, res.stderr
    return res.stdout


@pytest.mark.slow
def test_import_is_light_and_plot_is_lazy():
    """``import shardvi`` loads neither JAX, jax-finufft, matplotlib nor tqdm; ``sv.plot`` and
    ``sv.NUFFTResponse`` load what they need on first use; the user's matplotlib backend is kept; the engine's
    packages load neither scipy (the ELBO's eigensolvers) nor optax (``OptaxConfig`` runs) until those run."""
    out = run_python("""
        import sys
        import shardvi as sv
        heavy = ("jax", "jax_finufft", "matplotlib", "tqdm")
        print([m for m in heavy if m in sys.modules])
        import matplotlib
        matplotlib.use("svg")
        print(sv.plot.plot_samples.__module__, matplotlib.get_backend(), "matplotlib" in sys.modules)
        import numpy as np
        r = sv.NUFFTResponse(np.array([10.0, -5.0]), np.array([3.0, 7.0]), (8, 8), (1e-3, 1e-3), dtype=np.float32)
        print("jax_finufft" in sys.modules, r(np.ones((8, 8), np.float32)).shape)
        print("jax_finufft" in sys.modules, "tqdm" in sys.modules)
        print(sorted(set(sv.__all__) - set(dir(sv))), hasattr(sv, "no_such_name"))
        sv.optimize_kl, sv.OptaxConfig, sv.estimate_evidence_lower_bound  # the engine's packages, imported
        print("scipy" in sys.modules, "optax" in sys.modules)  # loaded where used (~23 MiB per process)
        """)
    assert out.splitlines() == ["[]", "shardvi.plot svg True", "False (2,)", "True False", "[] False", "False False"]


def test_top_level_names_resolve():
    for name in sv.__all__:
        assert getattr(sv, name) is not None, name
    assert sv.plot is plot and sv.Gaussian is sv.vi.Gaussian and sv.NUFFTResponse is sv.models.NUFFTResponse
    for listed in (
        "CorrelatedFieldMaker",
        "Normal",
        "LogNormal",
        "InvGamma",
        "Laplace",
        "Uniform",
        "prior_model",
        "NUFFTResponse",
        "Mask",
        "Sampling",
        "plot",
    ):
        assert listed in sv.__all__


def test_type_checking_imports_match_the_lazy_table():
    """The static imports (for IDEs and type checkers) name exactly what ``__getattr__`` serves."""
    import ast

    with open(os.path.join(ROOT, "shardvi", "__init__.py")) as f:
        tree = ast.parse(f.read())
    block = next(n for n in tree.body if isinstance(n, ast.If) and getattr(n.test, "id", "") == "TYPE_CHECKING")
    static = {}
    for node in block.body:
        static.setdefault(node.module or "", set()).update(a.name for a in node.names)
    assert static.pop("") == set(sv._SUBMODULES)
    assert static == {mod: set(names) for mod, names in sv._EXPORTS.items()}


def test_plot_never_selects_a_backend():
    with open(os.path.join(ROOT, "shardvi", "plot.py")) as f:
        src = f.read()
    assert not re.search(r"\.use\(|switch_backend", src)


def readme_section(title):
    """The README's text under the heading line ``title`` up to the next heading (outside code blocks)."""
    with open(os.path.join(ROOT, "README.md")) as f:
        lines = f.read().splitlines()
    start = lines.index(title) + 1
    fenced = False
    for end in range(start, len(lines)):
        fenced ^= lines[end].startswith("```")
        if not fenced and lines[end].startswith("#"):
            break
    else:
        end = len(lines)
    return "\n".join(lines[start:end])


def test_readme_pieces_table_lists_the_public_pieces():
    table = readme_section("### Pieces")
    for piece in (
        "sv.CorrelatedFieldMaker",
        "sv.Normal",
        "sv.LogNormal",
        "sv.InvGamma",
        "sv.Laplace",
        "sv.Uniform",
        "sv.prior_model",
        "sv.NUFFTResponse",
        "sv.Mask",
        "sv.Sampling",
        "sv.plot",
        "sv.minisanity",
    ):
        assert f"`{piece}" in table, piece


def test_minisanity_names_and_values():
    """One array latent: rows ``likelihood`` and ``prior`` (no stray ``.``), chi^2 by hand."""
    n = 5
    data = np.linspace(0.5, 1.5, n)
    lh = sv.Gaussian(data, noise_std=0.2).amend(sv.Model(jnp.exp, jax.ShapeDtypeStruct((n,), jnp.float64)))
    rng = np.random.default_rng(0)
    pos, res = 0.1 * rng.normal(size=n), rng.normal(size=(4, n))
    table = sv.minisanity(sv.Samples(jnp.asarray(pos), jnp.asarray(res)), lh)
    lines = table.splitlines()
    assert [ln.split()[0] for ln in lines] == ["residual", "likelihood", "prior"]
    assert "." not in "".join(ln.split()[0] for ln in lines[1:])
    xs = pos + res
    chi2_lh = np.mean(((data - np.exp(xs)) / 0.2) ** 2)
    assert float(lines[1].split()[1]) == float(f"{chi2_lh:.4g}")
    assert float(lines[2].split()[1]) == float(f"{np.mean(xs**2):.4g}")
    assert lines[1].split()[-1] == lines[2].split()[-1] == str(n)


def test_minisanity_columns_stay_aligned_for_long_names():
    row = (1.0123, 0.05, -0.001, 12)
    stats = {
        "likelihood": {".": row},
        "prior": {"['a']": row, "['a_very_long_latent_parameter_name_indeed']": (123.4, 1.0, 2.0, 123456)},
    }
    lines = format_residual_stats(stats).splitlines()
    assert [ln.split()[0] for ln in lines] == [
        "residual",
        "likelihood",
        "prior['a']",
        "prior['a_very_long_latent_parameter_name_indeed']",
    ]
    assert len({len(ln) for ln in lines}) == 1  # every row as wide as the header
    ends = {ln.index(ln.split()[1]) + len(ln.split()[1]) for ln in lines}
    assert len(ends) == 1  # red.chi2 column right-aligned
