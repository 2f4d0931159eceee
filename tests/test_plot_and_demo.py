"""Figures are valid PNGs; the Wiener-filter demo reproduces the closed form."""
import os
import runpy
import sys

import numpy as np

from shardvi import plot
from shardvi.vi.diagnostics import IterationReport

PNG_MAGIC = b"\x89PNG\r\n\x1a\n"


def is_png(path):
    with open(path, "rb") as f:
        return os.path.getsize(path) > 1000 and f.read(8) == PNG_MAGIC


def test_plot_functions_write_pngs(tmp_path):
    rng = np.random.default_rng(0)
    img = rng.normal(size=(16, 12))
    plot.plot_reconstruction(img, np.abs(img) + 0.1, truth=img + 0.1, data=img, path=tmp_path / "a.png")
    plot.plot_reconstruction(img[0], np.ones(12), truth=img[1], data=img[2, :5], data_coords=np.arange(5),
                             path=tmp_path / "b.png")
    plot.plot_samples(rng.normal(size=(3, 16, 12)), path=tmp_path / "c.png")
    plot.plot_samples(rng.normal(size=(3, 16)), truth=img[0], path=tmp_path / "d.png")
    k = np.linspace(0, 10, 20)
    plot.plot_power_spectra(k, np.exp(-rng.random((4, 20))), truth=np.ones(20), path=tmp_path / "e.png")
    hist = [IterationReport(i, "linear_resample", 2, 10.0 / i, [3], [], 2, 5, 0, 1.0 + 1 / i, 1.0, 0.1)
            for i in (1, 2, 3)]
    plot.plot_convergence(hist, path=tmp_path / "f.png")
    for name in "abcdef":
        assert is_png(tmp_path / f"{name}.png"), name


def test_wiener_demo_runs_and_matches(tmp_path, monkeypatch, capsys):
    root = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
    monkeypatch.setattr(sys, "argv", ["wiener_filter_1d.py", "--npix", "64", "--samples", "2",
                                      "--iterations", "2", "--output", str(tmp_path)])
    mod = runpy.run_path(os.path.join(root, "demos", "wiener_filter_1d.py"), run_name="demo")
    assert mod["main"]() == 0
    out = capsys.readouterr().out
    assert "Wiener filter" in out
    for f in ("reconstruction.png", "samples.png", "convergence.png"):
        assert is_png(tmp_path / f)
