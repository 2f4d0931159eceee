"""Small, ready-made reconstruction problems to run, test and benchmark shardvi with.

The same problems drive the CLI (``python -m shardvi compare --demo NAME``), the
strategy benchmark (``benchmarks/bench_strategies.py``) and the strategy tests.

>>> import jax, shardvi as sv
>>> from shardvi.examples import build_demo
>>> demo = build_demo("lognormal_1d", npix=64, seed=0)
>>> samples, state = sv.optimize_kl(demo.likelihood, demo.position, key=jax.random.PRNGKey(0),
...                                 n_total_iterations=3, n_samples=2)
>>> mean, std = samples.mean_and_std(demo.signal)   # (npix,) each, compare with demo.truth

Problems (``DEMOS``); all are dimensionless and live on a periodic 1-D grid of
``npix`` pixels of unit spacing:

- ``"lognormal_1d"``: ``s = exp(0.3 + 0.8 exp(0.3 fluct) f(xi))`` with ``f`` a
  Gaussian-process field of fixed power spectrum ``P(k) ∝ (1 + (k / 4)^2)^-2``
  (``k`` in cycles per grid length) and ``fluct`` a scalar latent that scales its
  amplitude log-normally. Nonlinear: geoVI differs from MGVI.
- ``"wiener_1d"``: ``s = f(xi)``, the same field, linear (the exact posterior is
  the Wiener filter, which MGVI and geoVI both reproduce).

Both are observed through a mask (a contiguous gap of ``npix // 6`` pixels
starting at ``npix // 3``, and each remaining pixel kept with probability 0.8)
with white Gaussian noise of standard deviation ``noise_std``.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any, NamedTuple

import jax
import jax.numpy as jnp
import numpy as np

from .models.harmonic import hartley

__all__ = ["DEMOS", "Demo", "build_demo"]

DEMOS = ("lognormal_1d", "wiener_1d")
"""Names accepted by :func:`build_demo`."""


class Demo(NamedTuple):
    """A reconstruction problem built by :func:`build_demo`.

    Attributes
    ----------
    name : str
        One of :data:`DEMOS`.
    likelihood : shardvi.Likelihood
        Gaussian likelihood already amended with the forward model, i.e. on the
        latent space: pass it to :func:`shardvi.optimize_kl`.
    position : pytree
        Starting latent position, all zeros. ``"lognormal_1d"``:
        ``{"xi": (npix,), "fluct": ()}``; ``"wiener_1d"``: an ``(npix,)`` array.
        float64.
    signal : callable
        Latent pytree -> signal on the full grid, shape ``(npix,)`` (use it with
        ``samples.mean_and_std(signal)`` for the posterior mean and std).
    truth : np.ndarray
        The signal the data were drawn from, shape ``(npix,)``.
    """

    name: str
    likelihood: Any
    position: Any
    signal: Callable[[Any], jax.Array]
    truth: np.ndarray


def _hartley_field(npix: int) -> Callable[[jax.Array], jax.Array]:
    """White ``(npix,)`` latent -> GP field with spectrum ``∝ (1 + (k/4)^2)^-2`` (a Hartley transform)."""
    k = np.abs(np.fft.fftfreq(npix, d=1.0 / npix))
    amp = jnp.asarray(np.sqrt(npix / (1.0 + (k / 4.0) ** 2) ** 2))

    def field(xi):
        # the library's Hartley transform: its FFT stays split over the samples under the jit strategy
        return hartley(amp * xi) * (0.1 / np.sqrt(npix))

    return field


def _mask(npix: int, rng: np.random.Generator) -> np.ndarray:
    """Boolean ``(npix,)`` observation mask: a gap of ``npix // 6`` pixels, then 80 % of the rest at random."""
    mask = np.ones(npix, bool)
    mask[npix // 3 : npix // 3 + npix // 6] = False
    return mask & (rng.random(npix) < 0.8)


def build_demo(name: str = "lognormal_1d", npix: int = 64, seed: int = 0, noise_std: float = 0.1) -> Demo:
    """Build one of the example problems (see the module docstring).

    Parameters
    ----------
    name : str
        One of :data:`DEMOS`.
    npix : int
        Number of grid pixels, at least 4. The latent space has ``npix`` (+1 for
        ``"lognormal_1d"``) dimensions; about ``0.8 * 5/6 * npix`` data.
    seed : int
        Seed of the NumPy generator drawing the mask, the true latent and the noise.
    noise_std : float
        Standard deviation of the Gaussian noise (same units as the signal).

    Returns
    -------
    Demo
        Likelihood on the latent space, zero starting position, signal function
        and true signal. The same arguments give the same numbers.

    Raises
    ------
    ValueError
        If ``name`` is unknown or ``npix`` is not an int >= 4.
    """
    from .models import Model
    from .vi import Gaussian

    if name not in DEMOS:
        raise ValueError(f"demo must be one of {DEMOS}, got {name!r}")  # the CLI's --demo
    if isinstance(npix, bool) or not isinstance(npix, int) or npix < 4:
        raise ValueError(f"npix must be an int >= 4, got {npix!r}")
    rng = np.random.default_rng(seed)
    field = _hartley_field(npix)
    mask = _mask(npix, rng)
    if name == "lognormal_1d":
        domain = {"xi": jax.ShapeDtypeStruct((npix,), jnp.float64), "fluct": jax.ShapeDtypeStruct((), jnp.float64)}

        def signal(x):
            return jnp.exp(0.3 + 0.8 * jnp.exp(0.3 * x["fluct"]) * field(x["xi"]))

        truth_latent = {"xi": jnp.asarray(rng.normal(size=npix)), "fluct": jnp.asarray(0.5)}
        position = {"xi": jnp.zeros(npix), "fluct": jnp.zeros(())}
    else:
        domain = jax.ShapeDtypeStruct((npix,), jnp.float64)
        signal = field  # pyright: ignore[reportAssignmentType] -- both branches: latent -> signal
        truth_latent = jnp.asarray(rng.normal(size=npix))
        position = jnp.zeros(npix)
    truth = np.asarray(signal(truth_latent))
    data = truth[mask] + noise_std * rng.normal(size=int(mask.sum()))
    model = Model(lambda x: signal(x)[mask], domain)
    lh = Gaussian(data, noise_std=noise_std).amend(model)
    return Demo(name, lh, position, signal, truth)
