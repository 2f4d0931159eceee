"""Model comparison with the evidence lower bound: which prior generated the data?

A 1-D Gaussian-process signal with correlation scale ``k0 = 4`` (the truth) is
observed with Gaussian noise through a mask. Three priors compete: too smooth
(``k0 = 1``), the true one, too rough (``k0 = 16``). For each, MGVI
(``optimize_kl``) gives posterior samples and :func:`shardvi.estimate_evidence_lower_bound`
their ELBO. The problems are linear, so the exact log-evidence is known: the
demo prints both, checks that the ELBO picks the true prior and agrees with
the exact evidence within 5 standard errors (exit status 1 otherwise) and
draws the comparison.

    python demos/model_comparison.py --npix 128 --n-samples 16 --output out/
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

TRUE_K0 = 4.0
CANDIDATES = (1.0, TRUE_K0, 16.0)
NOISE_STD = 0.1
MAX_SIGMAS = 5.0


def parse(argv=None):
    """Command-line flags (checked; ``ValueError`` naming the flag). Needs neither JAX nor shardvi."""
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--npix", type=int, default=128, help="pixels (default 128)")
    du.add_common_flags(ap, samples=16, iterations=2, seed=3, output="demo_output/model_comparison")
    args = ap.parse_args(argv)
    du.check_common(args)
    du.check_positive(args.npix, "--npix", minimum=16)
    return args


if __name__ == "__main__":  # --help and bad flags answer before JAX is imported
    ARGS = du.parse_or_exit(parse)

import jax  # noqa: E402

jax.config.update("jax_enable_x64", True)

import jax.numpy as jnp  # noqa: E402

import shardvi as sv  # noqa: E402


def amplitude(npix: int, k0: float):
    """``sqrt(P(k) npix)`` for ``P(k) = a / (1 + (k/k0)^2)^2``, normalized to unit signal variance."""
    k = np.abs(np.fft.fftfreq(npix, d=1.0 / npix))
    p = 1.0 / (1.0 + (k / k0) ** 2) ** 2
    return np.sqrt(p / p.mean())


def response(npix: int, k0: float):
    """The signal ``s(xi)`` (an orthonormal Hartley transform of ``amp * xi``) as a matrix, latent -> pixels."""
    amp = amplitude(npix, k0)
    f = np.fft.fft(np.eye(npix) * amp[:, None], axis=0)  # column j: the transform of amp_j e_j
    return ((f.real + f.imag) / np.sqrt(npix)).astype(np.float64)


def build(npix: int, seed: int):
    rng = np.random.default_rng(seed)
    mask = rng.random(npix) < 0.6
    truth = response(npix, TRUE_K0) @ rng.normal(size=npix)
    data = truth[mask] + NOISE_STD * rng.normal(size=int(mask.sum()))
    return mask, truth, data


def _apply(S, xi):
    return S @ xi


def exact_log_evidence(S, data):
    """``log p(d) = log N(d; 0, S S^T + N)``."""
    cov = S @ S.T + NOISE_STD**2 * np.eye(len(data))
    sign, logdet = np.linalg.slogdet(2 * np.pi * cov)
    assert sign > 0
    quad = data @ np.linalg.solve(cov, data)
    return -0.5 * (quad + logdet)


def main(argv=None, *, args=None) -> int:
    """Run the demo with the flags ``argv`` (or already parsed ``args``); returns the exit status."""
    args = parse(argv) if args is None else args
    du.setup_logging(args.quiet)
    devices = du.setup_devices(args.devices)
    strategy = du.make_strategy(args.strategy, devices)
    mask, truth, data = build(args.npix, args.seed)

    rows, means = [], []
    t0 = time.perf_counter()
    for k0 in CANDIDATES:
        S = response(args.npix, k0)[mask]
        # the response matrix as an argument of the compiled steps (a Partial's arrays are pytree leaves),
        # not a constant: the three priors share one set of compiled programs
        model = sv.Model(jax.tree_util.Partial(_apply, jnp.asarray(S)), jax.ShapeDtypeStruct((args.npix,), jnp.float64))
        lh = sv.Gaussian(data, noise_std=NOISE_STD).amend(model)
        samples, _ = sv.optimize_kl(
            lh,
            jnp.zeros(args.npix),
            key=jax.random.PRNGKey(args.seed),
            n_total_iterations=args.iterations,
            n_samples=args.n_samples,
            sample_mode="linear_resample",
            linear_sampling=sv.CGConfig(tol=1e-8, maxiter=2000),
            kl_minimization=sv.NewtonCGConfig(xtol=1e-10, maxiter=10, cg=sv.CGConfig(tol=1e-10, maxiter=2000)),
            sample_map=strategy,
            kl_map=strategy,
            progress=du.progress(args.quiet),
        )
        elbo = sv.estimate_evidence_lower_bound(lh, samples, sample_map=strategy)
        rows.append((k0, elbo, exact_log_evidence(S, data)))
        full = jnp.asarray(response(args.npix, k0))
        means.append(samples.mean_and_std(lambda xi, full=full: full @ xi))
    wall = time.perf_counter() - t0

    print(f"{'prior k0':>9} | {'ELBO':>10} | {'std':>6} | {'exact log-evidence':>18} | (ELBO - exact) / std")
    for k0, elbo, exact in rows:
        print(
            f"{k0:9.1f} | {elbo.value:10.2f} | {elbo.std:6.2f} | {exact:18.2f} | {(elbo.value - exact) / elbo.std:+.2f}"
        )
    best = max(rows, key=lambda r: r[1].value)[0]
    print(f"the ELBO picks k0 = {best:g} (truth: {TRUE_K0:g}); {len(devices)} device(s), {wall:.1f} s")
    agree = all(abs(e.value - x) <= MAX_SIGMAS * e.std for _, e, x in rows)

    import matplotlib.pyplot as plt

    fig, (ax0, ax1) = plt.subplots(1, 2, figsize=(11, 4))
    labels = [f"k0={k0:g}" + (" (true)" if k0 == TRUE_K0 else "") for k0, _, _ in rows]
    x = np.arange(len(rows))
    ax0.errorbar(x, [e.value for _, e, _ in rows], yerr=[e.std for _, e, _ in rows], fmt="o", label="ELBO (MGVI)")
    ax0.plot(x, [ex for _, _, ex in rows], "kx", ms=9, label="exact log-evidence")
    ax0.set_xticks(x, labels)
    ax0.set_xlabel("prior (correlation scale k0)")
    ax0.set_ylabel("log-evidence [nats]")
    ax0.legend()
    ax0.set_title("evidence per prior")
    grid = np.arange(args.npix)
    ax1.plot(grid, truth, "k", lw=1, label="truth")
    ax1.plot(grid[mask], data, ".", ms=3, color="0.5", label="data")
    for lab, (m, s) in zip(labels, means):
        ax1.plot(grid, m, label=lab)
        ax1.fill_between(grid, np.asarray(m) - np.asarray(s), np.asarray(m) + np.asarray(s), alpha=0.2)
    ax1.legend(fontsize=8)
    ax1.set_xlabel("x [pixel]")
    ax1.set_ylabel("signal")
    ax1.set_title("posterior mean ± 1σ per prior")
    sv.plot.save(fig, du.png_path(args.output, "model_comparison.png"))
    print(f"figure written to {args.output}/")

    ok = best == TRUE_K0 and agree
    if not ok:
        print("FAILED: the ELBO does not pick the true prior or disagrees with the exact evidence", file=sys.stderr)
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(du.run_main(main, ARGS))
