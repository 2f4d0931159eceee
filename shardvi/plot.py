"""Figures for reconstructions (matplotlib, written as PNG).

All functions take plain arrays (NumPy or JAX), return the matplotlib
``Figure`` and, when ``path`` is given, save it there (parent folders are
created) and close it.

The module never selects a matplotlib backend: the user's choice (or
matplotlib's default, Agg where there is no display) is kept. ``import
shardvi`` does not import this module; ``sv.plot`` does, on first access.
"""

from __future__ import annotations

import os
from collections.abc import Sequence
from typing import overload

import matplotlib.pyplot as plt
import numpy as np
from numpy.typing import ArrayLike

__all__ = ["plot_reconstruction", "plot_samples", "plot_power_spectra", "plot_convergence", "save"]


def save(fig, path: str | None):
    """Save ``fig`` to ``path`` (PNG) if given; returns ``fig``."""
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
):
    """Truth, data, posterior mean and posterior std.

    Parameters
    ----------
    mean, std : array, shape (n,) or (nx, ny)
        Posterior mean and standard deviation of the field.
    truth : array, optional
        Ground truth, same shape.
    data : array, optional
        1-D: data values at ``data_coords`` (pixel indices); 2-D: an image
        (NaN where unobserved), e.g. a dirty image.
    data_label : str
        Legend entry / panel title of ``data``.
    """
    mean, std, truth, data = _np(mean), _np(std), _np(truth), _np(data)
    if mean.ndim == 1:
        fig, ax = plt.subplots(figsize=(8, 4))
        x = np.arange(mean.size)
        if data is not None:
            xc = np.arange(data.size) if data_coords is None else np.asarray(data_coords)
            ax.plot(xc, data, ".", color="0.6", ms=3, label=data_label)
        if truth is not None:
            ax.plot(x, truth, "k-", lw=1.2, label="truth")
        ax.plot(x, mean, "C0-", lw=1.5, label="posterior mean")
        ax.fill_between(x, mean - 2 * std, mean + 2 * std, color="C0", alpha=0.25, label="±2σ")
        ax.legend(loc="best", fontsize=8)
        ax.set_xlabel("pixel")
        ax.set_title(title)
        return save(fig, path)
    panels = [("truth", truth), (data_label, data), ("posterior mean", mean), ("posterior std", std)]
    panels = [(n, a) for n, a in panels if a is not None]
    if truth is not None:
        panels.append(("|mean - truth| / std", np.abs(mean - truth) / std))
    fig, axes = plt.subplots(1, len(panels), figsize=(3.6 * len(panels), 3.4))
    vmin = np.nanmin([np.nanmin(a) for n, a in panels if n in ("truth", "posterior mean")])
    vmax = np.nanmax([np.nanmax(a) for n, a in panels if n in ("truth", "posterior mean")])
    for ax, (name, arr) in zip(np.atleast_1d(axes), panels):
        kw = dict(vmin=vmin, vmax=vmax) if name in ("truth", "posterior mean") else {}
        if name.startswith("|mean"):
            kw = dict(vmin=0, vmax=3, cmap="magma")
        im = ax.imshow(arr.T, origin="lower", **kw)
        ax.set_title(name, fontsize=9)
        ax.set_xticks([])
        ax.set_yticks([])
        fig.colorbar(im, ax=ax, fraction=0.046, pad=0.04)
    fig.suptitle(title)
    return save(fig, path)


def plot_samples(samples, *, truth=None, max_samples: int = 6, title: str = "", path: str | None = None):
    """Individual posterior samples (leading axis), 1-D lines or 2-D images.

    2-D: the images (and ``truth`` as a first panel, if given) share one colour
    scale and colour bar.
    """
    samples, truth = _np(samples), _np(truth)
    samples = samples[:max_samples]
    if samples.ndim == 2:
        fig, ax = plt.subplots(figsize=(8, 4))
        for i, s in enumerate(samples):
            ax.plot(s, lw=0.8, alpha=0.7, label="samples" if i == 0 else None)
        if truth is not None:
            ax.plot(truth, "k-", lw=1.2, label="truth")
        ax.legend(fontsize=8)
        ax.set_title(title)
        return save(fig, path)
    panels = ([("truth", truth)] if truth is not None else []) + [(f"sample {i}", s) for i, s in enumerate(samples)]
    vmin = min(float(np.nanmin(a)) for _, a in panels)
    vmax = max(float(np.nanmax(a)) for _, a in panels)
    fig, axes = plt.subplots(1, len(panels), figsize=(3 * len(panels) + 0.6, 3), squeeze=False)
    for ax, (name, img) in zip(axes[0], panels):
        im = ax.imshow(img.T, origin="lower", vmin=vmin, vmax=vmax)
        ax.set_title(name, fontsize=9)
        ax.set_xticks([])
        ax.set_yticks([])
    fig.colorbar(im, ax=list(axes[0]), fraction=0.02, pad=0.01)
    fig.suptitle(title)
    return save(fig, path)


def plot_power_spectra(k, spectra, *, truth=None, title: str = "power spectrum", path: str | None = None):
    """Posterior power-spectrum samples (shape (n_samples, n_k)) vs ``k`` on log-log axes."""
    k, spectra, truth = _np(k), _np(spectra), _np(truth)
    sel = k > 0
    fig, ax = plt.subplots(figsize=(6, 4))
    for i, p in enumerate(np.atleast_2d(spectra)):
        ax.loglog(k[sel], p[sel], color="C0", alpha=0.4, lw=0.8, label="samples" if i == 0 else None)
    if np.atleast_2d(spectra).shape[0] > 1:
        ax.loglog(k[sel], np.mean(np.atleast_2d(spectra), axis=0)[sel], "C0-", lw=2, label="mean")
    if truth is not None:
        ax.loglog(k[sel], truth[sel], "k--", lw=1.5, label="truth")
    ax.set_xlabel("|k|")
    ax.set_ylabel("P(k)")
    ax.legend(fontsize=8)
    ax.set_title(title)
    return save(fig, path)


def plot_convergence(history: Sequence, *, title: str = "convergence", path: str | None = None):
    """KL energy and reduced chi^2 per global iteration from ``state.history``."""
    it = [r.iteration for r in history]
    fig, (a1, a2) = plt.subplots(1, 2, figsize=(9, 3.5))
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
    a2.legend(fontsize=8)
    fig.suptitle(title)
    return save(fig, path)
