"""Small demo reconstructions shared by the CLI (``python -m shardvi``), benchmarks and tests.

``build_demo(name, npix, seed)`` returns a :class:`Demo` with a likelihood on
the latent space and a starting position:

- ``"lognormal_1d"``: a 1-D log-normal Gaussian-process field with a fixed
  power spectrum and a latent fluctuation amplitude, observed through a mask
  (with a gap) with Gaussian noise. Nonlinear: geoVI differs from MGVI.
- ``"wiener_1d"``: the same GP field, linear (the Wiener filter).
"""
from __future__ import annotations

from typing import Callable, NamedTuple

import jax
import jax.numpy as jnp
import numpy as np

__all__ = ["DEMOS", "Demo", "build_demo"]


class Demo(NamedTuple):
    """A demo reconstruction problem.

    Attributes
    ----------
    name : str
    likelihood : shardvi.Likelihood
        On the latent space.
    position : pytree
        Starting latent position (zeros).
    signal : callable
        Latent pytree -> signal on the full grid (for posterior mean/std).
    truth : np.ndarray
        The signal the data were drawn from.
    """

    name: str
    likelihood: object
    position: object
    signal: Callable
    truth: np.ndarray


def _hartley_field(npix: int):
    k = np.abs(np.fft.fftfreq(npix, d=1.0 / npix))
    amp = jnp.asarray(np.sqrt(npix / (1.0 + (k / 4.0) ** 2) ** 2))

    def field(xi):
        f = jnp.fft.fft(amp * xi) / npix
        return (f.real + f.imag) * np.sqrt(npix) * 0.1
    return field


def _mask(npix, rng):
    mask = np.ones(npix, bool)
    mask[npix // 3: npix // 3 + npix // 6] = False
    return mask & (rng.random(npix) < 0.8)


def build_demo(name: str = "lognormal_1d", npix: int = 64, seed: int = 0, noise_std: float = 0.1) -> Demo:
    """Build a demo problem (see the module docstring for the names)."""
    import shardvi as sv
    if name not in DEMOS:
        raise ValueError(f"demo must be one of {tuple(DEMOS)}, got {name!r}")
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
        signal = field
        truth_latent = jnp.asarray(rng.normal(size=npix))
        position = jnp.zeros(npix)
    truth = np.asarray(signal(truth_latent))
    data = truth[mask] + noise_std * rng.normal(size=int(mask.sum()))
    model = sv.Model(lambda x: signal(x)[mask], domain)
    lh = sv.Gaussian(data, noise_std=noise_std).amend(model)
    return Demo(name, lh, position, signal, truth)


DEMOS = ("lognormal_1d", "wiener_1d")
