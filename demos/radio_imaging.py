"""Radio-interferometric imaging: a positive sky from noisy visibilities on an elliptic uv-coverage.

The sky is ``I = exp(f)`` with ``f`` a correlated field (learned zero mode, fluctuation
amplitude and power-law slope). An array of ``--antennas`` antennas at random positions
observes it for ``--times`` hour angles (earth-rotation synthesis: every baseline
traces an ellipse in the uv-plane). The visibilities ``V = R I`` are computed with
``sv.NUFFTResponse`` (jax-finufft) and get complex Gaussian noise of standard deviation
``sigma`` in the real and the imaginary part, ``sigma = --noise-level * rms|V|``. MGVI
(then geoVI, with ``--linear-iterations`` below ``--iterations``) reconstructs the sky;
the dirty image ``R^dagger V / M`` (``M``
visibilities: the point-spread function peaks at 1) is shown for comparison.

Printed: the reduced chi^2 of the noise-normalized visibility residuals of the
posterior samples (per real degree of freedom, expected 1), and the Pearson
correlation with the truth of the posterior mean and of the dirty image. The script
exits with status 1 if the chi^2 is outside 1 +- 0.2 or the posterior mean does not
correlate with the truth better than the dirty image.

    python demos/radio_imaging.py --npix 64 --antennas 10 --times 16 --output out/
"""

from __future__ import annotations

import argparse
import os
import sys
import time

import numpy as np

_HERE = os.path.dirname(os.path.abspath(__file__))
if _HERE not in sys.path:  # sibling modules (_demo_utils, the flagship) when imported from elsewhere
    sys.path.insert(0, _HERE)

import _demo_utils as du  # noqa: E402


def parse(argv=None):
    """Command-line flags (checked; ``ValueError`` naming the flag). Needs neither JAX nor shardvi."""
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--npix", type=int, default=64, help="image pixels per axis (default 64)")
    ap.add_argument("--antennas", type=int, default=10, help="number of antennas (default 10)")
    ap.add_argument("--times", type=int, default=16, help="hour angles per baseline (default 16)")
    ap.add_argument(
        "--noise-level",
        type=float,
        default=0.05,
        help="noise std per real/imaginary part in units of rms|V| (default 0.05)",
    )
    ap.add_argument(
        "--linear-iterations",
        type=int,
        default=None,
        help="leading MGVI iterations before geoVI (default: all of --iterations; geoVI on this problem needs "
        "many more Newton-CG steps per sample than MGVI needs CG steps)",
    )
    ap.add_argument(
        "--model-shards",
        type=int,
        default=1,
        help="split the visibilities over this many devices of a second mesh axis (model parallelism, "
        "ShardMap only; --devices must be a multiple; default 1: samples only)",
    )
    ap.add_argument(
        "--data-blocks",
        type=int,
        default=8,
        help="fixed blocks the visibilities are cut into with --model-shards > 1 (a multiple of it; default 8)",
    )
    du.add_common_flags(ap, samples=6, iterations=6, seed=0, output="demo_output/radio_imaging")
    args = ap.parse_args(argv)
    du.check_common(args)
    du.check_positive(args.model_shards, "--model-shards")
    du.check_positive(args.data_blocks, "--data-blocks")
    if args.model_shards > 1:
        if args.strategy != "shard_map":
            raise ValueError(f"--model-shards {args.model_shards} needs --strategy shard_map, got {args.strategy!r}")
        if args.devices % args.model_shards:
            raise ValueError(f"--devices ({args.devices}) must be a multiple of --model-shards ({args.model_shards})")
        if args.data_blocks % args.model_shards:
            raise ValueError(
                f"--data-blocks ({args.data_blocks}) must be a multiple of --model-shards ({args.model_shards})"
            )
    du.check_positive(args.npix, "--npix", minimum=8)
    du.check_positive(args.antennas, "--antennas", minimum=3)
    du.check_positive(args.times, "--times", minimum=1)
    if args.linear_iterations is None:
        args.linear_iterations = args.iterations
    du.check_linear_iterations(args)
    du.check_positive_float(args.noise_level, "--noise-level")
    return args


if __name__ == "__main__":  # --help and bad flags answer before JAX is imported
    ARGS = du.parse_or_exit(parse)

import jax  # noqa: E402

jax.config.update("jax_enable_x64", True)

import jax.numpy as jnp  # noqa: E402

import shardvi as sv  # noqa: E402
from shardvi import plot  # noqa: E402
from shardvi.vi.diagnostics import pooled_chi2  # noqa: E402

CHI2_TOL = 0.2
ARCSEC = np.pi / (180 * 3600)


def uv_coverage(n_antennas: int, n_times: int, u_max: float, rng, declination_deg: float = 35.0):
    """Earth-rotation uv-tracks of a random array.

    Antennas are uniform in a disk; baseline ``(bx, by)`` at hour angle ``h`` (over
    -4 h .. +4 h) projects to ``u = bx cos h - by sin h``,
    ``v = sin(dec) (bx sin h + by cos h)``: ellipses with axis ratio ``sin(dec)``.
    The coordinates are scaled so that the longest projected baseline is ``u_max``.

    Returns
    -------
    u, v : ndarray, shape (n_baselines * n_times,)
        Baseline coordinates in wavelengths.
    """
    r = np.sqrt(rng.random(n_antennas))
    phi = 2 * np.pi * rng.random(n_antennas)
    ant = np.stack([r * np.cos(phi), r * np.sin(phi)], axis=1)
    i, j = np.triu_indices(n_antennas, k=1)
    b = ant[j] - ant[i]
    h = np.linspace(-np.pi / 3, np.pi / 3, n_times)
    u = b[:, :1] * np.cos(h) - b[:, 1:] * np.sin(h)
    v = np.sin(np.radians(declination_deg)) * (b[:, :1] * np.sin(h) + b[:, 1:] * np.cos(h))
    scale = u_max / np.max(np.hypot(u, v))
    return (u * scale).ravel(), (v * scale).ravel()


def observe(response, field, xi):
    """``response(exp(field(xi)))``: the sky ``exp(f)`` seen through the instrument."""
    return response(jnp.exp(field(xi)))


def observe_block(template, field, xi, inputs):
    """The visibilities of one block of baselines ``inputs = {"u", "v"}`` (model parallelism)."""
    return template(jnp.exp(field(xi)), inputs)


class RadioProblem:
    """Sky model, NUFFT response, simulated visibilities and the likelihood.

    Attributes
    ----------
    field : shardvi.CorrelatedField
        Log-sky ``f``.
    response : shardvi.NUFFTResponse
    truth : ndarray, shape (npix, npix)
        ``exp(f(xi_true))``, a prior draw.
    data : complex ndarray, shape (M,)
        Noisy visibilities.
    noise_std : float
        Per real/imaginary component.
    likelihood : shardvi.Likelihood
    """

    def __init__(
        self, npix: int, n_antennas: int, n_times: int, noise_level: float, seed: int, pixel_arcsec: float = 0.5
    ):
        self.npix = npix
        cfm = sv.CorrelatedFieldMaker("sky", dtype=jnp.float64)
        cfm.set_amplitude_total_offset(0.0, (0.3, 0.1))
        cfm.add_fluctuations(
            (npix, npix), 1.0 / npix, fluctuations=(1.0, 0.2), loglogavgslope=(-2.0, 0.3), prefix="diffuse"
        )
        self.field = cfm.finalize()
        rng = np.random.default_rng(seed)
        dl = pixel_arcsec * ARCSEC
        # longest baseline resolves 0.8 of the grid's Nyquist frequency 1 / (2 dl)
        u, v = uv_coverage(n_antennas, n_times, 0.8 / (2 * dl), rng)
        self.u, self.v = u, v
        self.response = sv.NUFFTResponse(u, v, (npix, npix), dl, eps=1e-9, dtype=np.float64)
        k_truth, k_noise = jax.random.split(jax.random.PRNGKey(seed))
        self.xi_true = self.field.init(k_truth)
        self.truth = np.asarray(self.sky(self.xi_true))
        vis = np.asarray(self.response(jnp.asarray(self.truth)))
        self.noise_std = float(noise_level * np.sqrt(np.mean(np.abs(vis) ** 2)))
        n = np.asarray(jax.random.normal(k_noise, (2, vis.size), jnp.float64))
        self.data = vis + self.noise_std * (n[0] + 1j * n[1])
        # a Partial of the response and the field (modules): their arrays are arguments of the compiled
        # steps, not constants (a lambda closing over self would hide them from JAX)
        model = sv.Model(jax.tree_util.Partial(observe, self.response, self.field), self.field.domain)
        self.likelihood = sv.Gaussian(jnp.asarray(self.data), noise_std=self.noise_std).amend(model)

    def blocked_likelihood(self, data_blocks: int):
        """The likelihood with the visibilities cut into ``data_blocks`` blocks (split with ``model_shards``).

        The model evaluates one block of baselines at a time (``data_inputs``: the
        response's ``u``, ``v``); the same numbers as :attr:`likelihood` up to the
        order of the sums over visibilities.
        """
        call = jax.tree_util.Partial(observe_block, self.response.without_points(), self.field)
        model = sv.Model(call, self.field.domain, data_inputs=self.response.data_inputs)
        return sv.Gaussian(jnp.asarray(self.data), noise_std=self.noise_std).amend(model, data_blocks=data_blocks)

    def sky(self, xi):
        """``I = exp(f(xi))``."""
        return jnp.exp(self.field(xi))

    def dirty_image(self):
        """``R^dagger d / M``: the data back-projected; a unit point source gives a peak of 1."""
        return np.asarray(self.response.adjoint(jnp.asarray(self.data))) / self.data.size


def solver_configs():
    """MGVI sampling CG, geoVI Newton-CG and KL Newton-CG settings."""
    return dict(
        linear_sampling=sv.CGConfig(tol=1e-4, maxiter=1000),
        nonlinear_update=sv.NewtonCGConfig(xtol=1e-3, maxiter=30, cg=sv.CGConfig(tol=0.01, maxiter=1000)),
        kl_minimization=sv.NewtonCGConfig(xtol=None, absdelta=0.01, maxiter=30, cg=sv.CGConfig(tol=0.5, maxiter=200)),
    )


def sky_extent(response):
    """Outer pixel edges ``(l0, l1, m0, m1)`` of the image grid in arcsec; ``(l, m) = (0, 0)`` at the centre
    of pixel ``(nx // 2, ny // 2)`` (the response's convention)."""
    (nx, ny), (dl, dm) = response.image_shape, response.pixel_size
    l0, m0 = (-(nx // 2) - 0.5) * dl / ARCSEC, (-(ny // 2) - 0.5) * dm / ARCSEC
    return (l0, l0 + nx * dl / ARCSEC, m0, m0 + ny * dm / ARCSEC)


def plot_uv(u, v, path):
    """The uv-coverage (both halves: ``V(-u, -v) = conj V(u, v)`` for a real sky)."""
    import matplotlib.pyplot as plt

    fig, ax = plt.subplots(figsize=(4.2, 4))
    ax.plot(u / 1e3, v / 1e3, ".", color="C0", ms=1.5, label="(u, v)")
    ax.plot(-u / 1e3, -v / 1e3, ".", color="C1", ms=1.5, label="(-u, -v)")
    ax.legend(fontsize=7, loc="upper right", markerscale=4)
    ax.set_xlabel("u [kλ]")
    ax.set_ylabel("v [kλ]")
    ax.set_aspect("equal")
    ax.set_title(f"uv-coverage ({u.size} visibilities)")
    return plot.save(fig, path)


def correlation(a, b) -> float:
    return float(np.corrcoef(np.ravel(a), np.ravel(b))[0, 1])


def check(chi2: float, corr_mean: float, corr_dirty: float) -> list:
    """Failure messages (empty when the chi^2 is within 1 +- CHI2_TOL and the mean beats the dirty image)."""
    failures = []
    if not abs(chi2 - 1.0) <= CHI2_TOL:
        failures.append(f"reduced chi^2 {chi2:.4f} is outside 1 +- {CHI2_TOL}")
    if not corr_mean > corr_dirty:
        failures.append(
            f"posterior mean correlates worse with the truth ({corr_mean:.4f}) than the dirty image ({corr_dirty:.4f})"
        )
    return failures


def main(argv=None, *, args=None) -> int:
    """Run the demo with the flags ``argv`` (or already parsed ``args``); returns the exit status."""
    args = parse(argv) if args is None else args
    du.setup_logging(args.quiet)
    devices = du.setup_devices(args.devices)
    if args.model_shards > 1:  # samples over the rows of a (devices / k, k) mesh, visibilities over its columns
        strategy = sv.parallel.ShardMap(devices=devices, model_shards=args.model_shards)
    else:
        strategy = du.make_strategy(args.strategy, devices)
    t0 = time.perf_counter()
    prob = RadioProblem(args.npix, args.antennas, args.times, args.noise_level, args.seed)
    lh = prob.likelihood if args.model_shards == 1 else prob.blocked_likelihood(args.data_blocks)
    pos = jax.tree.map(lambda x: 0.1 * x, prob.field.init(jax.random.PRNGKey(args.seed + 1000)))
    samples, state = sv.optimize_kl(
        lh,
        pos,
        key=jax.random.PRNGKey(args.seed + 1),
        n_total_iterations=args.iterations,
        n_samples=args.n_samples,
        sample_mode=lambda i: "linear_resample" if i < args.linear_iterations else "nonlinear_resample",
        sample_map=strategy,
        kl_map=strategy,
        progress=du.progress(args.quiet),
        **solver_configs(),
    )
    wall = time.perf_counter() - t0

    sky = np.asarray(samples.map(prob.sky))
    mean, std = sky.mean(0), sky.std(0, ddof=1)
    dirty = prob.dirty_image()
    chi2 = pooled_chi2(sv.residual_stats(samples, prob.likelihood)["likelihood"])
    c_mean, c_dirty = correlation(mean, prob.truth), correlation(dirty, prob.truth)
    rel_err = float(np.sqrt(np.mean((mean - prob.truth) ** 2) / np.mean(prob.truth**2)))
    cov = du.coverage(prob.truth, mean, std)

    print(sv.minisanity(samples, prob.likelihood))
    print(
        f"image {args.npix}x{args.npix}, {args.antennas} antennas x {args.times} hour angles = "
        f"{prob.data.size} complex visibilities, noise std {prob.noise_std:.3g} per component, "
        f"{len(samples)} samples, strategy {args.strategy} on {len(devices)} device(s)"
        + (
            f" ({len(devices) // args.model_shards} sample x {args.model_shards} model shards, "
            f"{args.data_blocks} data blocks)"
            if args.model_shards > 1
            else ""
        )
    )
    print(f"reduced chi^2 of the visibility residuals (per-sample, per real dof): {chi2:.4f}")
    print(f"correlation with the truth: posterior mean {c_mean:.4f}, dirty image {c_dirty:.4f}")
    print(
        f"relative rms error of the posterior mean {rel_err:.4f}; truth within mean +- 2 std on "
        f"{100 * cov:.1f} % of pixels"
    )
    print(f"wall time {wall:.1f} s (including compilation)")

    out = args.output
    sky_axes = dict(extent=sky_extent(prob.response), xlabel="l [arcsec]", ylabel="m [arcsec]")
    plot.plot_reconstruction(
        mean,
        std,
        truth=prob.truth,
        data=dirty,
        data_label="dirty image",
        title=f"radio imaging {args.npix}x{args.npix} (NUFFT, MGVI + geoVI)",
        path=du.png_path(out, "reconstruction.png"),
        **sky_axes,
    )
    plot.plot_samples(
        sky,
        truth=prob.truth,
        max_samples=4,
        title="posterior samples of the sky: deviations from the posterior mean",
        path=du.png_path(out, "samples.png"),
        **sky_axes,
    )
    plot_uv(prob.u, prob.v, du.png_path(out, "uv_coverage.png"))
    plot.plot_convergence(state.history, path=du.png_path(out, "convergence.png"))
    print(f"figures written to {out}/")

    failures = check(chi2, c_mean, c_dirty)
    for f in failures:
        print(f"FAILED: {f}", file=sys.stderr)
    if not failures:
        print("checks passed: reduced chi^2, posterior mean beats the dirty image")
    return 1 if failures else 0


if __name__ == "__main__":
    sys.exit(du.run_main(main, ARGS))
