"""Figures for reconstructions (matplotlib, written as PNG).

All figure functions take plain arrays (NumPy or JAX), return the matplotlib
``Figure`` and, when ``path`` is given, save it there (parent folders are
created) and close it.

Maps follow one convention: ``image[i, j]`` is drawn at horizontal position
``i`` and vertical position ``j`` (``image.T`` with the origin in the lower
left). Axes are in pixels unless ``extent`` gives the outer edges
``(x0, x1, y0, y1)`` of the grid in physical coordinates. A ``mask`` (boolean,
True where observed, the shape of the map) is drawn as the outline of the
observed region.

The module never selects a matplotlib backend: the user's choice (or
matplotlib's default, Agg where there is no display) is kept. ``import
shardvi`` does not import this module; ``sv.plot`` does, on first access.
"""

from __future__ import annotations

import os
from collections.abc import Sequence
from typing import Any, overload

import matplotlib.pyplot as plt
import numpy as np
from matplotlib.collections import LineCollection
from matplotlib.legend_handler import HandlerTuple
from matplotlib.lines import Line2D
from matplotlib.ticker import MaxNLocator
from numpy.typing import ArrayLike

__all__ = [
    "plot_reconstruction",
    "plot_samples",
    "plot_power_spectra",
    "plot_convergence",
    "draw_map",
    "save",
]

_MASK_COLOR = "red"  # outline of the observed region on sequential colour maps
_MASK_COLOR_DIVERGING = "black"  # ... and on the diverging one (red is part of it)
_DIVERGING_CMAP = "RdBu_r"

_OUTLINE_LABEL = "edge of the observed region"


def save(fig, path: str | None):
    """Save ``fig`` to ``path`` (PNG) if given and close it; returns ``fig``."""
    if path is not None:
        d = os.path.dirname(os.fspath(path))
        if d:
            os.makedirs(d, exist_ok=True)
        fig.savefig(path, dpi=110, bbox_inches="tight")
        plt.close(fig)
    return fig


@overload
def _np(x: None) -> None: ...
@overload
def _np(x: ArrayLike) -> np.ndarray: ...
def _np(x):
    return None if x is None else np.asarray(x)


def _with_unit(label: str, unit: str) -> str:
    return f"{label} [{unit}]" if unit else label


def _check_mask(mask, shape) -> np.ndarray | None:
    if mask is None:
        return None
    mask = np.asarray(mask)
    if mask.shape != tuple(shape):
        raise ValueError(f"mask has shape {mask.shape}, the map has shape {tuple(shape)}")
    return mask.astype(bool)


def _check_same_shape(arr, shape, name: str, ref: str) -> None:
    """``ValueError`` unless ``arr`` (if given) has ``shape``, the shape of ``ref``."""
    if arr is not None and arr.shape != tuple(shape):
        raise ValueError(f"{name} has shape {arr.shape}, expected {tuple(shape)} (the shape of {ref})")


def _extent(shape, extent) -> tuple:
    """The outer pixel edges ``(x0, x1, y0, y1)``: ``extent`` or pixel indices (centres at integers)."""
    if extent is None:
        return (-0.5, shape[0] - 0.5, -0.5, shape[1] - 0.5)
    extent = tuple(float(e) for e in extent)
    if len(extent) != 4:
        raise ValueError(f"extent must be (x0, x1, y0, y1) for a 2-D map, got {extent}")
    return extent


def _coords(idx, n: int, extent) -> np.ndarray:
    """Pixel indices ``idx`` of a 1-D grid of ``n`` pixels as coordinates: the indices, or the pixel centres
    within the outer edges ``extent = (x0, x1)``."""
    idx = np.asarray(idx, dtype=float)
    if extent is None:
        return idx
    x0, x1 = (float(e) for e in extent)
    return x0 + (idx + 0.5) * (x1 - x0) / n


def _outline(ax, mask, ext, color, min_pixels):
    """The boundary of the observed region of ``mask`` as a ``LineCollection`` on ``ax`` (None if nothing to draw).

    Contours at 0.5 of the mask through the pixel centres; an outline enclosing less than ``min_pixels``
    pixels is left out (one ended by the grid's edge is measured as closed by the line between its ends).
    """
    if mask.all() or not mask.any():
        return None
    import contourpy  # a dependency of matplotlib

    lines = contourpy.contour_generator(z=mask.T.astype(float), line_type="Separate").lines(0.5)
    keep = []
    for xy in lines:  # columns of mask.T (= i), rows (= j)
        xy = np.asarray(xy)
        x, y = xy[:, 0], xy[:, 1]
        area = 0.5 * abs(np.dot(x, np.roll(y, -1)) - np.dot(y, np.roll(x, -1)))  # shoelace
        if area >= min_pixels:
            keep.append(xy)
    if not keep:
        return None
    nx, ny = mask.shape
    x0, x1, y0, y1 = ext
    scale = np.array([(x1 - x0) / nx, (y1 - y0) / ny])
    segs = [np.array([x0, y0]) + (xy + 0.5) * scale for xy in keep]
    lc = LineCollection(segs, colors=color, linewidths=0.8, label=_OUTLINE_LABEL, zorder=3)
    ax.add_collection(lc, autolim=False)
    return lc


def draw_map(
    ax,
    image,
    *,
    mask=None,
    extent=None,
    xlabel: str | None = None,
    ylabel: str | None = None,
    label: str = "",
    colorbar: bool = True,
    mask_color: str = "red",
    mask_min_pixels: float = 3.0,
    **imshow_kwargs,
):
    """Draw one 2-D map on ``ax``: image, outline of the observed region, axis labels, colour bar.

    Parameters
    ----------
    ax : matplotlib Axes
    image : array, shape (nx, ny)
        ``image[i, j]`` is drawn at horizontal position ``i``, vertical ``j``. NaN
        entries are left blank.
    mask : bool array, shape (nx, ny), optional
        True where observed. Its boundary is drawn as contour lines (a
        ``LineCollection`` labelled ``"edge of the observed region"``; none when
        every or no pixel is observed).
    extent : (x0, x1, y0, y1), optional
        Outer edges of the grid in physical coordinates; default: pixel
        indices, pixel centres at integers.
    xlabel, ylabel : str, optional
        Axis labels; default ``"x [pixel]"`` and ``"y [pixel]"``. An empty
        string leaves the axis unlabelled.
    label : str
        Label of the colour bar.
    colorbar : bool
        Whether to add a colour bar to this panel.
    mask_color : str
        Colour of the mask outline.
    mask_min_pixels : float
        Outlines that enclose less than this area (in pixels) are not drawn,
        so that isolated unobserved (or observed) pixels do not clutter the
        map: a single pixel's outline encloses half a pixel, that of a square
        of ``n x n`` pixels ``n**2 - 0.5``. 0 draws every outline.
    **imshow_kwargs
        Passed to ``ax.imshow`` (``vmin``, ``vmax``, ``cmap``, ...).

    Returns
    -------
    matplotlib.image.AxesImage
    """
    image = np.asarray(image)
    if image.ndim != 2:
        raise ValueError(f"draw_map needs a 2-D image, got shape {image.shape}")
    ext = _extent(image.shape, extent)
    im = ax.imshow(image.T, origin="lower", extent=ext, **imshow_kwargs)
    mask = _check_mask(mask, image.shape)
    if mask is not None:
        _outline(ax, mask, ext, mask_color, mask_min_pixels)
    ax.set_xlabel("x [pixel]" if xlabel is None else xlabel)
    ax.set_ylabel("y [pixel]" if ylabel is None else ylabel)
    if colorbar:
        cb = ax.figure.colorbar(im, ax=ax, fraction=0.046, pad=0.04)
        cb.set_label(label)
    return im


def _mask_legend(fig, colors=(_MASK_COLOR,)):
    """A legend entry for the mask outline below the panels, if any panel has one."""
    drawn = [c for ax in fig.axes for c in ax.collections if c.get_label() == _OUTLINE_LABEL]
    if not drawn:
        return
    handle = tuple(Line2D([], [], color=c, lw=0.8) for c in colors)
    fig.legend(
        [handle],
        [_OUTLINE_LABEL],
        handler_map={tuple: HandlerTuple(ndivide=None)},
        loc="outside lower center",
        fontsize=8,
        frameon=False,
    )


def _shade_unobserved(ax, mask, x):
    """Grey bands over the runs of unobserved pixels of a 1-D ``mask`` (pixel centres ``x``)."""
    if mask is None or mask.all():
        return
    dx = x[1] - x[0] if x.size > 1 else 1.0
    bad = np.concatenate([[False], ~mask, [False]])
    starts = np.flatnonzero(~bad[:-1] & bad[1:])
    stops = np.flatnonzero(bad[:-1] & ~bad[1:])
    for k, (a, b) in enumerate(zip(starts, stops)):
        ax.axvspan(
            x[a] - dx / 2, x[b - 1] + dx / 2, color="0.88", lw=0, zorder=0, label="unobserved" if k == 0 else None
        )


def plot_reconstruction(
    mean,
    std,
    *,
    truth=None,
    data=None,
    data_coords=None,
    title: str = "",
    data_label: str = "data",
    path: str | None = None,
    mask=None,
    unit: str = "",
    extent=None,
    xlabel: str | None = None,
    ylabel: str | None = None,
    mask_min_pixels: float = 3.0,
):
    """Truth, data, posterior mean and posterior std.

    1-D: one panel with the data points, the truth, the posterior mean and a
    ±2σ band. 2-D: one map per quantity (truth, data, mean, std and, with a
    truth, ``|mean - truth| / std``), each with a labelled colour bar; truth
    and mean share one colour scale.

    Parameters
    ----------
    mean, std : array, shape (n,) or (nx, ny)
        Posterior mean and standard deviation of the field.
    truth : array, optional
        Ground truth, same shape.
    data : array, optional
        1-D: data values at ``data_coords`` (pixel indices); 2-D: an image
        (NaN where unobserved), e.g. a dirty image.
    data_coords : array of int, optional
        1-D: pixel indices of ``data`` (default ``0, 1, ...``).
    title : str
        Figure title.
    data_label : str
        Legend entry / panel title of ``data``.
    path : str, optional
        Where to save the PNG (the figure is then closed).
    mask : bool array, same shape as ``mean``, optional
        True where observed. 2-D: the outline of the observed region on the
        truth, data, mean and std maps; 1-D: unobserved pixels shaded grey.
    unit : str
        Unit of the field values, appended to the colour bar labels (2-D) or
        the value axis label (1-D) as ``"[unit]"``; empty: no unit.
    extent : tuple, optional
        Outer edges of the grid in physical coordinates, ``(x0, x1, y0, y1)``
        (2-D) or ``(x0, x1)`` (1-D); default: pixel indices.
    xlabel, ylabel : str, optional
        Axis labels. Defaults: ``"x [pixel]"``; ``"y [pixel]"`` in 2-D, the
        value axis ``"value"`` with ``unit`` in 1-D.
    mask_min_pixels : float
        2-D: outlines enclosing less than this many pixels are not drawn (see
        :func:`draw_map`).

    Returns
    -------
    matplotlib.figure.Figure

    Raises
    ------
    ValueError
        If ``mean`` is not 1-D or 2-D, or ``std``, ``truth``, a 2-D ``data`` or
        ``mask`` does not have its shape.
    """
    mean, std, truth, data = _np(mean), _np(std), _np(truth), _np(data)
    if mean.ndim not in (1, 2):
        raise ValueError(f"mean must be 1-D or 2-D, got shape {mean.shape}")
    _check_same_shape(std, mean.shape, "std", "mean")
    _check_same_shape(truth, mean.shape, "truth", "mean")
    if mean.ndim == 2:
        _check_same_shape(data, mean.shape, "data", "mean")
    elif data is not None and data_coords is not None and np.shape(data_coords) != data.shape:
        raise ValueError(f"data_coords has shape {np.shape(data_coords)}, expected {data.shape} (the shape of data)")
    mask = _check_mask(mask, mean.shape)
    if mean.ndim == 1:
        fig, ax = plt.subplots(figsize=(8, 4))
        x = _coords(np.arange(mean.size), mean.size, extent)
        _shade_unobserved(ax, mask, x)
        if data is not None:
            xc = np.arange(data.size) if data_coords is None else np.asarray(data_coords)
            ax.plot(_coords(xc, mean.size, extent), data, ".", color="0.45", ms=3, label=data_label)
        if truth is not None:
            ax.plot(x, truth, "k-", lw=1.2, label="truth")
        ax.plot(x, mean, "C0-", lw=1.5, label="posterior mean")
        ax.fill_between(x, mean - 2 * std, mean + 2 * std, color="C0", alpha=0.25, label="±2σ")
        ax.legend(loc="best", fontsize=8)
        ax.set_xlabel("x [pixel]" if xlabel is None else xlabel)
        ax.set_ylabel(_with_unit("value", unit) if ylabel is None else ylabel)
        ax.set_title(title)
        return save(fig, path)
    panels = [("truth", truth), (data_label, data), ("posterior mean", mean), ("posterior std", std)]
    panels = [(n, a) for n, a in panels if a is not None]
    if truth is not None:
        panels.append(("|mean − truth| / std", np.abs(mean - truth) / std))
    fig, axes = plt.subplots(1, len(panels), figsize=(3.9 * len(panels), 3.9), layout="constrained", squeeze=False)
    shared = [a for n, a in panels if n in ("truth", "posterior mean")]
    vmin = float(np.nanmin([np.nanmin(a) for a in shared]))
    vmax = float(np.nanmax([np.nanmax(a) for a in shared]))
    for k, (ax, (name, arr)) in enumerate(zip(axes[0], panels)):
        kw: dict[str, Any]
        if name.startswith("|mean"):
            kw, label, panel_mask = dict(vmin=0, vmax=3, cmap="magma"), name + " (clipped at 3)", None
        else:
            kw = dict(vmin=vmin, vmax=vmax) if name in ("truth", "posterior mean") else {}
            label, panel_mask = _with_unit(name, unit), mask
        draw_map(
            ax,
            arr,
            mask=panel_mask,
            mask_min_pixels=mask_min_pixels,
            extent=extent,
            xlabel=xlabel,
            ylabel=ylabel if k == 0 else "",  # the row shares one y axis label
            label=label,
            **kw,
        )
        ax.set_title(name, fontsize=10)
    _mask_legend(fig)
    fig.suptitle(title)
    return save(fig, path)


def plot_samples(
    samples,
    *,
    truth=None,
    max_samples: int = 6,
    title: str = "",
    path: str | None = None,
    mean=None,
    mask=None,
    unit: str = "",
    extent=None,
    xlabel: str | None = None,
    ylabel: str | None = None,
    mask_min_pixels: float = 3.0,
):
    """The posterior mean and how individual posterior samples deviate from it.

    2-D: a panel with the truth (if given), a panel with the posterior mean
    (one shared colour scale and colour bar), then one panel per sample showing
    ``sample - mean`` on a diverging colour map with limits symmetric about 0
    (one shared colour bar). 1-D: the samples, their mean and the truth as
    lines, and below them ``sample - mean``.

    Parameters
    ----------
    samples : array, shape (n_samples, n) or (n_samples, nx, ny)
        Posterior samples (leading axis).
    truth : array, optional
        Ground truth, shape of one sample.
    max_samples : int
        At most this many samples are drawn (the first ones).
    title : str
        Figure title.
    path : str, optional
        Where to save the PNG (the figure is then closed).
    mean : array, optional
        Posterior mean that the deviations are taken from; default: the mean
        of all of ``samples`` (not only the drawn ones).
    mask : bool array, shape of one sample, optional
        True where observed; drawn as in :func:`plot_reconstruction`, on every
        map.
    unit : str
        Unit of the field values, appended to the colour bar (2-D) or value
        axis (1-D) labels.
    extent : tuple, optional
        Outer edges of the grid, ``(x0, x1, y0, y1)`` (2-D) or ``(x0, x1)``
        (1-D); default: pixel indices.
    xlabel, ylabel : str, optional
        Axis labels; defaults as in :func:`plot_reconstruction`.
    mask_min_pixels : float
        2-D: outlines enclosing less than this many pixels are not drawn (see
        :func:`draw_map`).

    Returns
    -------
    matplotlib.figure.Figure
    """
    samples, truth = _np(samples), _np(truth)
    if samples.ndim not in (2, 3):
        raise ValueError(f"samples must have shape (n_samples, n) or (n_samples, nx, ny), got {samples.shape}")
    mean = samples.mean(axis=0) if mean is None else _np(mean)
    _check_same_shape(mean, samples.shape[1:], "mean", "one sample")
    _check_same_shape(truth, samples.shape[1:], "truth", "one sample")
    mask = _check_mask(mask, samples.shape[1:])
    shown = samples[:max_samples]
    dev = shown - mean
    if samples.ndim == 2:
        fig, (a1, a2) = plt.subplots(2, 1, figsize=(8, 5.5), sharex=True, height_ratios=(3, 2), layout="constrained")
        x = _coords(np.arange(mean.size), mean.size, extent)
        for ax in (a1, a2):
            _shade_unobserved(ax, mask, x)
        for i, (s, d) in enumerate(zip(shown, dev)):
            a1.plot(x, s, lw=0.8, alpha=0.7, label="samples" if i == 0 else None)
            a2.plot(x, d, lw=0.8, alpha=0.8)
        a1.plot(x, mean, "C0-", lw=2, label="posterior mean")
        if truth is not None:
            a1.plot(x, truth, "k-", lw=1.2, label="truth")
        a2.axhline(0.0, color="k", lw=0.8)
        a1.legend(fontsize=8)
        a1.set_ylabel(_with_unit("value", unit) if ylabel is None else ylabel)
        a2.set_ylabel(_with_unit("sample − mean", unit))
        a2.set_xlabel("x [pixel]" if xlabel is None else xlabel)
        a1.set_title(title)
        return save(fig, path)
    first = ([("truth", truth)] if truth is not None else []) + [("posterior mean", mean)]
    n = len(first) + len(shown)
    fig, axes = plt.subplots(1, n, figsize=(3.3 * n + 1.2, 3.6), layout="constrained", squeeze=False)
    axes = axes[0]
    vmin = min(float(np.nanmin(a)) for _, a in first)
    vmax = max(float(np.nanmax(a)) for _, a in first)
    lim = max(float(np.nanmax(np.abs(dev))), np.finfo(float).tiny)
    for k, (ax, (name, img)) in enumerate(zip(axes, first)):
        im = draw_map(
            ax,
            img,
            mask=mask,
            mask_min_pixels=mask_min_pixels,
            extent=extent,
            xlabel=xlabel,
            ylabel=ylabel if k == 0 else "",  # the row shares one y axis label
            colorbar=False,
            vmin=vmin,
            vmax=vmax,
        )
        ax.set_title(name, fontsize=10)
    fig.colorbar(im, ax=list(axes[: len(first)]), fraction=0.05, pad=0.02).set_label(
        _with_unit(", ".join(name for name, _ in first), unit)
    )
    for i, (ax, d) in enumerate(zip(axes[len(first) :], dev)):
        im = draw_map(
            ax,
            d,
            mask=mask,
            mask_min_pixels=mask_min_pixels,
            extent=extent,
            xlabel=xlabel,
            ylabel="",
            colorbar=False,
            mask_color=_MASK_COLOR_DIVERGING,
            vmin=-lim,
            vmax=lim,
            cmap=_DIVERGING_CMAP,
        )
        ax.set_title(f"sample {i} − mean", fontsize=10)
    fig.colorbar(im, ax=list(axes[len(first) :]), fraction=0.05, pad=0.02).set_label(
        _with_unit("sample − posterior mean", unit)
    )
    _mask_legend(fig, (_MASK_COLOR, _MASK_COLOR_DIVERGING))
    fig.suptitle(title)
    return save(fig, path)


def plot_power_spectra(
    k,
    spectra,
    *,
    truth=None,
    title: str = "power spectrum",
    path: str | None = None,
    xlabel: str = "|k|",
    ylabel: str = "P(|k|)",
):
    """Posterior power-spectrum samples against ``|k|`` on log-log axes.

    Every sample as a thin line, their mean (with more than one sample) and the
    truth; ``k = 0`` (the zero mode) is left out.

    Parameters
    ----------
    k : array, shape (n_k,)
        ``|k|`` of the spectra's entries.
    spectra : array, shape (n_samples, n_k) or (n_k,)
        Power spectrum of every posterior sample.
    truth : array, shape (n_k,), optional
        The true power spectrum.
    title : str
        Axes title.
    path : str, optional
        Where to save the PNG (the figure is then closed).
    xlabel, ylabel : str
        Axis labels (e.g. with the unit of ``k``).

    Returns
    -------
    matplotlib.figure.Figure

    Raises
    ------
    ValueError
        If ``k`` is not 1-D, ``spectra`` not of shape ``(n_k,)`` or
        ``(n_samples, n_k)``, or ``truth`` not of shape ``(n_k,)``.
    """
    k, spectra, truth = _np(k), _np(spectra), _np(truth)
    if k.ndim != 1:
        raise ValueError(f"k must be 1-D (the |k| of the spectra's entries), got shape {k.shape}")
    if spectra.ndim not in (1, 2) or spectra.shape[-1] != k.size:
        raise ValueError(
            f"spectra must have shape ({k.size},) or (n_samples, {k.size}) (one entry per k), got {spectra.shape}"
        )
    _check_same_shape(truth, k.shape, "truth", "k")
    sel = k > 0
    fig, ax = plt.subplots(figsize=(6, 4))
    for i, p in enumerate(np.atleast_2d(spectra)):
        ax.loglog(k[sel], p[sel], color="C0", alpha=0.4, lw=0.8, label="samples" if i == 0 else None)
    if np.atleast_2d(spectra).shape[0] > 1:
        ax.loglog(k[sel], np.mean(np.atleast_2d(spectra), axis=0)[sel], "C0-", lw=2, label="mean")
    if truth is not None:
        ax.loglog(k[sel], truth[sel], "k--", lw=1.5, label="truth")
    ax.set_xlabel(xlabel)
    ax.set_ylabel(ylabel)
    ax.legend(fontsize=8)
    ax.set_title(title)
    return save(fig, path)


def _method(report) -> str:
    """The inference method of one iteration: MAP (no samples), MGVI (linear modes) or geoVI (nonlinear)."""
    if report.n_samples == 0:
        return "MAP"
    return "geoVI" if str(report.sample_mode).startswith("nonlinear") else "MGVI"


def _method_switches(history: Sequence) -> list:
    """Per change of method between consecutive reports: (halfway between their iteration numbers, ``"A → B"``)."""
    out = []
    history = list(history)
    for prev, cur in zip(history[:-1], history[1:]):
        a, b = _method(prev), _method(cur)
        if a != b:
            out.append(((prev.iteration + cur.iteration) / 2, f"{a} → {b}"))
    return out


#: what :func:`plot_convergence` reads of every report
_REPORT_FIELDS = ("iteration", "kl_energy", "chi2_likelihood", "chi2_prior", "n_samples", "sample_mode")


def _check_history(history) -> None:
    """``TypeError`` unless ``history`` is a sequence of reports with :data:`_REPORT_FIELDS`."""
    if hasattr(history, "history") or isinstance(history, (str, bytes)) or not isinstance(history, Sequence):
        hint = " (pass state.history)" if hasattr(history, "history") else ""
        raise TypeError(
            f"history must be a sequence of iteration reports (state.history of optimize_kl), "
            f"got {type(history).__name__}{hint}"
        )
    for i, report in enumerate(history):
        missing = [f for f in _REPORT_FIELDS if not hasattr(report, f)]
        if missing:
            raise TypeError(
                f"history must be a sequence of iteration reports (state.history of optimize_kl): history[{i}] "
                f"is a {type(report).__name__} without {', '.join(missing)}"
            )


def plot_convergence(history: Sequence, *, title: str = "convergence", path: str | None = None):
    """KL energy and reduced χ² per global iteration from ``state.history``.

    A dashed vertical line, labelled e.g. ``"MGVI → geoVI"``, marks every
    change of inference method between consecutive iterations, in both panels,
    halfway between the two iterations' numbers. The method of an iteration is
    ``MAP`` without samples, ``geoVI`` for a ``nonlinear_*`` sample mode and
    ``MGVI`` otherwise; a change of sample mode within one method
    (``linear_resample`` to ``linear_sample``) is not marked.

    Parameters
    ----------
    history : sequence of IterationReport
        ``state.history`` of :func:`shardvi.optimize_kl`.
    title : str
        Figure title.
    path : str, optional
        Where to save the PNG (the figure is then closed).

    Returns
    -------
    matplotlib.figure.Figure

    Raises
    ------
    TypeError
        If ``history`` is not a sequence of iteration reports.
    """
    _check_history(history)
    it = [r.iteration for r in history]
    fig, (a1, a2) = plt.subplots(1, 2, figsize=(9, 3.5), layout="constrained")
    a1.plot(it, [r.kl_energy for r in history], "o-")
    a1.set_xlabel("iteration")
    a1.set_ylabel("KL energy")
    chi_lh = [r.chi2_likelihood for r in history]
    if all(c is not None for c in chi_lh):
        a2.plot(it, chi_lh, "o-", label="likelihood")
    a2.plot(it, [r.chi2_prior for r in history], "s-", label="prior (latent)")
    a2.axhline(1.0, color="k", lw=0.8, ls=":")
    a2.set_xlabel("iteration")
    a2.set_ylabel("reduced χ²")
    for ax in (a1, a2):
        ax.xaxis.set_major_locator(MaxNLocator(integer=True))
    for x, label in _method_switches(history):
        right_half = x > (min(it) + max(it)) / 2  # the label on the side with more room
        for ax in (a1, a2):
            ax.axvline(x, color="0.35", lw=1.0, ls="--")
            ax.annotate(
                label,
                (x, 1.0),
                xycoords=("data", "axes fraction"),
                xytext=(-3 if right_half else 3, -3),
                textcoords="offset points",
                ha="right" if right_half else "left",
                va="top",
                fontsize=8,
                color="0.25",
            )
    a2.legend(fontsize=8)
    fig.suptitle(title)
    return save(fig, path)
