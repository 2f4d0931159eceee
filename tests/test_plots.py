"""What the figures of ``sv.plot`` (and the multi-device demo's comparison figure) show.

Every figure is built from a tiny synthetic input and inspected through matplotlib's
objects (images, collections, lines, labels), not written to a file.
"""

import importlib.util
import os
import sys

import matplotlib

matplotlib.use("Agg")  # tests only: the library never selects a backend

import matplotlib.pyplot as plt
import numpy as np
import pytest
from matplotlib.collections import LineCollection

from shardvi import plot
from shardvi.vi.diagnostics import IterationReport

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
OUTLINE = "edge of the observed region"
NX, NY = 12, 10
GAP = (slice(2, 6), slice(3, 7))  # unobserved block: x in 2..5, y in 3..6
LONE = (9, 8)  # one isolated unobserved pixel


@pytest.fixture(autouse=True)
def _close_figures():
    yield
    plt.close("all")


@pytest.fixture
def maps():
    rng = np.random.default_rng(0)
    truth = rng.normal(size=(NX, NY))
    mask = np.ones((NX, NY), bool)
    mask[GAP] = False
    mask[LONE] = False
    std = 0.1 + np.where(mask, 0.0, 1.0)
    mean = truth + 0.1 * rng.normal(size=truth.shape)
    data = np.where(mask, truth + 0.05 * rng.normal(size=truth.shape), np.nan)
    return dict(truth=truth, mask=mask, std=std, mean=mean, data=data)


def outlines(ax):
    return [c for c in ax.collections if isinstance(c, LineCollection) and c.get_label() == OUTLINE]


def colorbar_label(ax):
    return ax.images[0].colorbar.ax.get_ylabel()


def history(modes, samples=None):
    samples = samples or [2] * len(modes)
    return [
        IterationReport(i + 1, m, n, 10.0 / (i + 1), [3], [], 2, 5, 0, 1.0 + 1 / (i + 1), 1.0, 0.1)
        for i, (m, n) in enumerate(zip(modes, samples))
    ]


def test_reconstruction_2d_outlines_the_observed_region_and_labels_everything(maps):
    fig = plot.plot_reconstruction(
        maps["mean"], maps["std"], truth=maps["truth"], data=maps["data"], mask=maps["mask"], unit="K"
    )
    axes = [ax for ax in fig.axes if ax.images and ax.get_title()]
    assert [ax.get_title() for ax in axes] == [
        "truth",
        "data",
        "posterior mean",
        "posterior std",
        "|mean − truth| / std",
    ]
    for ax in axes[:4]:
        (lc,) = outlines(ax)  # the gap; the lone pixel is below mask_min_pixels
        (seg,) = lc.get_segments()
        # the contour runs halfway between the gap's pixel centres and their observed neighbours
        np.testing.assert_allclose(seg.min(0), [GAP[0].start - 0.5, GAP[1].start - 0.5])
        np.testing.assert_allclose(seg.max(0), [GAP[0].stop - 0.5, GAP[1].stop - 0.5])
    assert outlines(axes[4]) == []  # no outline on |mean - truth| / std
    assert [colorbar_label(ax) for ax in axes] == [
        "truth [K]",
        "data [K]",
        "posterior mean [K]",
        "posterior std [K]",
        "|mean − truth| / std (clipped at 3)",
    ]
    assert all(ax.get_xlabel() == "x [pixel]" for ax in axes)
    assert axes[0].get_ylabel() == "y [pixel]" and all(ax.get_ylabel() == "" for ax in axes[1:])
    # truth and mean share one colour scale; the map is image.T with the origin in the lower left
    assert axes[0].images[0].get_clim() == axes[2].images[0].get_clim()
    np.testing.assert_array_equal(axes[2].images[0].get_array(), maps["mean"].T)
    assert axes[2].images[0].origin == "lower"
    assert any(t.get_text() == OUTLINE for leg in fig.legends for t in leg.get_texts())


def test_reconstruction_2d_extent_labels_and_every_outline(maps):
    ext = (0.0, 24.0, -5.0, 5.0)  # 2 units per pixel in x, 1 in y
    fig = plot.plot_reconstruction(
        maps["mean"],
        maps["std"],
        mask=maps["mask"],
        extent=ext,
        xlabel="l [arcsec]",
        ylabel="m [arcsec]",
        mask_min_pixels=0,
    )
    mean_ax, std_ax = (ax for ax in fig.axes if ax.images and ax.get_title())
    assert mean_ax.images[0].get_extent() == list(ext)
    assert (mean_ax.get_xlabel(), mean_ax.get_ylabel(), std_ax.get_ylabel()) == ("l [arcsec]", "m [arcsec]", "")
    assert colorbar_label(mean_ax) == "posterior mean"  # no unit: no brackets
    segs = sorted(outlines(mean_ax)[0].get_segments(), key=len)
    assert len(segs) == 2  # mask_min_pixels=0: the lone pixel is outlined too
    gap = segs[1]
    np.testing.assert_allclose(gap.min(0), [2 * GAP[0].start, -5 + GAP[1].start])
    np.testing.assert_allclose(gap.max(0), [2 * GAP[0].stop, -5 + GAP[1].stop])


def test_reconstruction_without_mask_or_with_a_full_one_draws_no_outline(maps):
    for mask in (None, np.ones((NX, NY), bool)):
        fig = plot.plot_reconstruction(maps["mean"], maps["std"], mask=mask)
        assert not any(outlines(ax) for ax in fig.axes)
        assert not fig.legends


def test_mask_of_the_wrong_shape_is_rejected(maps):
    with pytest.raises(ValueError, match="mask has shape"):
        plot.plot_reconstruction(maps["mean"], maps["std"], mask=maps["mask"].T)


def test_reconstruction_1d_shades_the_unobserved_runs():
    n = 30
    mask = np.ones(n, bool)
    mask[5:9] = False
    mask[20] = False
    x = np.sin(np.arange(n) / 4)
    fig = plot.plot_reconstruction(
        x, 0.1 * np.ones(n), truth=x, data=x[mask], data_coords=np.nonzero(mask)[0], mask=mask, unit="mJy"
    )
    (ax,) = fig.axes
    xs = sorted((p.get_x(), p.get_x() + p.get_width()) for p in ax.patches)  # the grey bands
    np.testing.assert_allclose(xs, [(4.5, 8.5), (19.5, 20.5)])
    assert (ax.get_xlabel(), ax.get_ylabel()) == ("x [pixel]", "value [mJy]")


def test_samples_2d_show_the_mean_then_sample_minus_mean(maps):
    rng = np.random.default_rng(1)
    samples = maps["mean"] + rng.normal(size=(5, NX, NY))
    mean = samples.mean(0)
    fig = plot.plot_samples(samples, truth=maps["truth"], max_samples=3, mask=maps["mask"], unit="K")
    axes = [ax for ax in fig.axes if ax.images]
    assert [ax.get_title() for ax in axes] == [
        "truth",
        "posterior mean",
        "sample 0 − mean",
        "sample 1 − mean",
        "sample 2 − mean",
    ]
    np.testing.assert_allclose(axes[1].images[0].get_array(), mean.T)  # the mean of all 5 samples
    dev = samples[:3] - mean
    lim = np.max(np.abs(dev))
    for i, ax in enumerate(axes[2:]):
        im = ax.images[0]
        np.testing.assert_allclose(im.get_array(), dev[i].T)
        assert im.get_clim() == (-lim, lim)  # symmetric about 0, shared
        assert im.get_cmap().name == "RdBu_r"
    assert axes[0].images[0].get_clim() == axes[1].images[0].get_clim()
    assert all(len(outlines(ax)) == 1 for ax in axes)
    # one colour bar for truth and mean, one for the deviations
    assert axes[1].images[0].colorbar.ax.get_ylabel() == "truth, posterior mean [K]"
    assert axes[-1].images[0].colorbar.ax.get_ylabel() == "sample − posterior mean [K]"
    assert axes[0].get_ylabel() == "y [pixel]" and all(ax.get_xlabel() == "x [pixel]" for ax in axes)


def test_samples_2d_deviations_from_a_given_mean():
    samples = np.arange(2 * 4 * 3, dtype=float).reshape(2, 4, 3)
    mean = np.full((4, 3), 5.0)
    fig = plot.plot_samples(samples, mean=mean)
    axes = [ax for ax in fig.axes if ax.images]
    assert [ax.get_title() for ax in axes] == ["posterior mean", "sample 0 − mean", "sample 1 − mean"]
    np.testing.assert_array_equal(axes[1].images[0].get_array(), (samples[0] - mean).T)


def test_samples_1d_lines_and_deviations():
    rng = np.random.default_rng(2)
    samples = rng.normal(size=(4, 20))
    mask = np.ones(20, bool)
    mask[3:6] = False
    fig = plot.plot_samples(samples, truth=np.zeros(20), max_samples=2, mask=mask)
    top, bottom = fig.axes
    assert bottom.get_ylabel() == "sample − mean" and bottom.get_xlabel() == "x [pixel]"
    devs = [line.get_ydata() for line in bottom.get_lines() if len(line.get_ydata()) == 20]
    np.testing.assert_allclose(devs, samples[:2] - samples.mean(0))
    labels = [line.get_label() for line in top.get_lines()]
    assert "posterior mean" in labels and "truth" in labels
    assert len(top.patches) == len(bottom.patches) == 1  # the unobserved run, shaded in both


def test_convergence_marks_the_switch_from_mgvi_to_geovi():
    hist = history(["linear_resample", "linear_sample", "nonlinear_resample", "nonlinear_update"])
    fig = plot.plot_convergence(hist)
    for ax in fig.axes:
        vlines = [ln for ln in ax.get_lines() if len(set(ln.get_xdata())) == 1 and ln.get_ls() == "--"]
        assert [ln.get_xdata()[0] for ln in vlines] == [2.5]  # between iterations 2 (MGVI) and 3 (geoVI)
        assert [t.get_text() for t in ax.texts] == ["MGVI → geoVI"]
    assert [ax.get_xlabel() for ax in fig.axes] == ["iteration", "iteration"]
    assert [ax.get_ylabel() for ax in fig.axes] == ["KL energy", "reduced χ²"]


def test_convergence_marks_no_switch_within_one_method_and_names_map():
    fig = plot.plot_convergence(history(["linear_resample", "linear_sample", "linear_resample"]))
    assert not any(ax.texts for ax in fig.axes)
    fig = plot.plot_convergence(history(["linear_resample"] * 3, samples=[0, 2, 2]))
    assert [t.get_text() for t in fig.axes[0].texts] == ["MAP → MGVI"]


def test_power_spectra_axis_labels():
    k = np.linspace(0, 5, 8)
    fig = plot.plot_power_spectra(k, np.ones((3, 8)), xlabel="|k| [1/Mpc]")
    (ax,) = fig.axes
    assert (ax.get_xlabel(), ax.get_ylabel()) == ("|k| [1/Mpc]", "P(|k|)")
    assert ax.get_xscale() == ax.get_yscale() == "log"


def load_demo(name):
    """Import ``demos/<name>.py`` as a module (as tests/test_demos.py does)."""
    demos = os.path.join(ROOT, "demos")
    if demos not in sys.path:
        sys.path.insert(0, demos)
    if name in sys.modules:
        return sys.modules[name]
    spec = importlib.util.spec_from_file_location(name, os.path.join(demos, name + ".py"))
    mod = importlib.util.module_from_spec(spec)
    sys.modules[name] = mod
    spec.loader.exec_module(mod)
    return mod


def test_comparison_figure_keeps_its_title_and_outlines_the_mask(maps):
    demo = load_demo("multi_device_comparison")
    one = dict(mean=maps["mean"], std=maps["std"])
    many = dict(mean=maps["mean"] + 1e-3, std=maps["std"])
    fig = demo.plot_comparison(one, many, 4, "shard_map on 1 vs 4 devices", None, mask=maps["mask"])
    assert fig._suptitle.get_text() == "shard_map on 1 vs 4 devices"
    axes = [ax for ax in fig.axes if ax.images]
    assert len(axes) == 6 and all(len(outlines(ax)) == 1 for ax in axes)
    assert axes[2].get_title().startswith("mean difference (4 dev − 1 dev)")
    np.testing.assert_allclose(axes[2].images[0].get_array(), np.full((NY, NX), 1e-3))
    assert [colorbar_label(ax) for ax in axes] == [
        "posterior mean",
        "posterior mean",
        "mean difference",
        "posterior std",
        "posterior std",
        "std difference",
    ]
