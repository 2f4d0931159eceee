"""Wiener filter in 1-D: MGVI on a linear Gaussian problem equals the closed form.

A Gaussian-process signal with a known power spectrum is observed through a
mask with Gaussian noise. For a linear model MGVI is exact, so the posterior
mean must equal the Wiener filter ``(S^-1 + R^T N^-1 R)^-1 R^T N^-1 d`` and
the sample std the square root of its diagonal. The demo checks the mean
(exit status 1 if it differs by more than ``MAX_REL_ERROR`` relative), prints the
ratio of the sample std to the exact one and writes figures.

    python demos/wiener_filter_1d.py --npix 256 --n-samples 8 --output out/
"""

from __future__ import annotations

import argparse
import os
import sys
import time

import numpy as np

_HERE = os.path.dirname(os.path.abspath(__file__))
if _HERE not in sys.path:  # sibling modules (_demo_utils) when imported from elsewhere
    sys.path.insert(0, _HERE)

import _demo_utils as du  # noqa: E402

MAX_REL_ERROR = 1e-6


def parse(argv=None):
    """Command-line flags (checked; ``ValueError`` naming the flag). Needs neither JAX nor shardvi."""
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--npix", type=int, default=256, help="pixels (default 256)")
    du.add_common_flags(ap, samples=8, iterations=3, seed=42, output="demo_output/wiener_filter_1d")
    args = ap.parse_args(argv)
    du.check_common(args)
    du.check_positive(args.npix, "--npix", minimum=8)
    return args


if __name__ == "__main__":  # --help and bad flags answer before JAX is imported
    ARGS = du.parse_or_exit(parse)

import jax  # noqa: E402

jax.config.update("jax_enable_x64", True)

import jax.numpy as jnp  # noqa: E402

import shardvi as sv  # noqa: E402
from shardvi import plot  # noqa: E402


def power_spectrum(npix: int, length: float = 1.0):
    """P(k) = a / (1 + (k/k0)^2)^2 on the FFT grid (per unit volume)."""
    k = np.abs(np.fft.fftfreq(npix, d=length / npix))
    return 0.2 / (1.0 + (k / 4.0) ** 2) ** 2, k


def build(npix: int, seed: int, noise_std: float = 0.05):
    p, k = power_spectrum(npix)
    amp = jnp.asarray(np.sqrt(p * npix))  # unitary Hartley convention

    def signal(xi):
        f = jnp.fft.fft(amp * xi) / npix
        return (f.real + f.imag) * np.sqrt(npix)  # orthonormal Hartley transform of amp * xi

    rng = np.random.default_rng(seed)
    mask = np.ones(npix, bool)
    mask[npix // 3 : npix // 3 + npix // 6] = False  # a gap in the data
    mask &= rng.random(npix) < 0.7
    model = sv.Model(lambda xi: signal(xi)[mask], jax.ShapeDtypeStruct((npix,), jnp.float64))
    xi_true = jnp.asarray(rng.normal(size=npix))
    truth = signal(xi_true)
    data = np.asarray(truth)[mask] + noise_std * rng.normal(size=mask.sum())
    return model, signal, mask, truth, data, noise_std, p, k


def closed_form(signal, mask, data, noise_std, npix):
    """Dense Wiener filter in latent space (the oracle)."""
    A = np.asarray(jax.vmap(signal)(jnp.eye(npix))).T[mask]  # response in latent coordinates
    prec = np.eye(npix) + A.T @ A / noise_std**2
    cov = np.linalg.inv(prec)
    mean = cov @ A.T @ data / noise_std**2
    S = np.asarray(jax.vmap(signal)(jnp.eye(npix))).T
    return S @ mean, np.sqrt(np.diag(S @ cov @ S.T))


def main(argv=None, *, args=None) -> int:
    """Run the demo with the flags ``argv`` (or already parsed ``args``); returns the exit status."""
    args = parse(argv) if args is None else args
    du.setup_logging(args.quiet)
    devices = du.setup_devices(args.devices)
    strategy = du.make_strategy(args.strategy, devices)

    model, signal, mask, truth, data, noise_std, p, k = build(args.npix, args.seed)
    lh = sv.Gaussian(data, noise_std=noise_std).amend(model)
    t0 = time.perf_counter()
    samples, state = sv.optimize_kl(
        lh,
        jnp.zeros(args.npix),
        key=jax.random.PRNGKey(args.seed),
        n_total_iterations=args.iterations,
        n_samples=args.n_samples,
        sample_mode="linear_resample",
        linear_sampling=sv.CGConfig(tol=1e-10, maxiter=2000),
        kl_minimization=sv.NewtonCGConfig(xtol=1e-12, maxiter=10, cg=sv.CGConfig(tol=1e-10, maxiter=2000)),
        sample_map=strategy,
        kl_map=strategy,
        progress=du.progress(args.quiet),
    )
    wall = time.perf_counter() - t0
    mean, std = samples.mean_and_std(signal)
    wf_mean, wf_std = closed_form(signal, mask, data, noise_std, args.npix)
    err_mean = float(np.max(np.abs(np.asarray(mean) - wf_mean)) / np.max(np.abs(wf_mean)))
    std_ratio = float(np.median(np.asarray(std) / wf_std))
    print(sv.minisanity(samples, lh))
    print(f"max |MGVI mean - Wiener filter| / max|WF| = {err_mean:.2e}")
    print(f"median(sample std / exact std) = {std_ratio:.3f} with {len(samples)} samples")
    print(f"strategy {args.strategy} on {len(devices)} device(s), wall time {wall:.1f} s (including compilation)")

    coords = np.nonzero(mask)[0]
    plot.plot_reconstruction(
        mean,
        std,
        truth=truth,
        data=data,
        data_coords=coords,
        mask=mask,
        title="Wiener filter 1-D (MGVI)",
        path=du.png_path(args.output, "reconstruction.png"),
    )
    plot.plot_samples(
        jax.vmap(signal)(samples.samples),
        truth=truth,
        mask=mask,
        title="posterior samples and their deviations from the posterior mean",
        path=du.png_path(args.output, "samples.png"),
    )
    plot.plot_convergence(state.history, path=du.png_path(args.output, "convergence.png"))
    print(f"figures written to {args.output}/")
    ok = err_mean < MAX_REL_ERROR
    if not ok:
        print("FAILED: MGVI mean differs from the Wiener filter", file=sys.stderr)
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(du.run_main(main, ARGS))
