"""Log-normal 2-D correlated field behind a mask with gaps: MGVI then geoVI, with checks.

The sky is ``s = exp(f)`` with ``f`` a correlated field (:class:`shardvi.CorrelatedFieldMaker`)
whose zero-mode std, fluctuation amplitude and power-law slope are learned with the
field (pure power law: with a learned ``flexibility`` these MGVI/geoVI runs drift to
large fluctuations and too steep spectra and miss the coverage check). It is observed
on a masked grid (a rectangular gap, a circular gap and randomly dropped pixels) with
additive Gaussian noise. The truth is a draw from the
prior (``--seed``). The reconstruction runs ``--linear-iterations`` MGVI iterations
(``linear_resample``) and then geoVI (``nonlinear_resample``) up to ``--iterations``.

Checks (the script exits with status 1 and says which failed):

- reduced chi^2 of the likelihood residual within 1 +- 0.1. The quantity is
  ``mean_i mean_j ((d_j - R s_i)_j / sigma)^2``: the noise-normalized data residual of
  every posterior sample ``s_i``, squared, averaged over the observed pixels ``j`` and
  over the samples (``sv.residual_stats``; the ``red.chi2`` of the ``likelihood`` row of
  ``sv.minisanity``). Under the model, posterior samples and the data are jointly
  distributed like the truth and the data, so its expectation is exactly 1; a
  residual of the posterior *mean* alone would be expected below 1 (overfitting).
- the truth lies within posterior mean +- 2 posterior std of ``s`` on at least 90 % of
  *all* pixels (observed and unobserved; the fraction on observed pixels only is
  printed too).

    python demos/correlated_field_2d.py --npix 64 --n-samples 10 --iterations 8 --output out/

Field parallelism: ``--model-shards 2 --devices 4`` cuts the field and the data into
``--field-blocks`` blocks of rows (default: the model shards) and runs on a (2 samples x
2 model shards) mesh (``--strategy shard_map`` or ``jit``); it gives bitwise the samples of
``--field-blocks 2 --devices 1``.
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
    ap.add_argument("--npix", type=int, default=64, help="pixels per axis (default 64)")
    ap.add_argument("--noise-std", type=float, default=0.2, help="Gaussian noise std (default 0.2)")
    ap.add_argument("--linear-iterations", type=int, default=2, help="leading MGVI iterations before geoVI (default 2)")
    ap.add_argument(
        "--model-shards",
        type=int,
        default=1,
        help="devices that share the field (its rows) and the data; > 1 needs --strategy shard_map or jit (default 1)",
    )
    ap.add_argument(
        "--field-blocks",
        type=int,
        default=None,
        help="fixed blocks of rows the field and data are cut into (a multiple of --model-shards dividing --npix; "
        "default --model-shards when > 1, else no split): runs with the same blocks are bitwise equal on any "
        "number of devices",
    )
    du.add_common_flags(ap, samples=10, iterations=8, seed=0, output="demo_output/correlated_field_2d")
    args = ap.parse_args(argv)
    du.check_common(args)
    du.check_positive(args.npix, "--npix", minimum=8)
    du.check_positive(args.model_shards, "--model-shards")
    if args.field_blocks is None and args.model_shards > 1:
        args.field_blocks = args.model_shards
    if args.field_blocks is not None:
        du.check_positive(args.field_blocks, "--field-blocks")
        if args.npix % args.field_blocks:
            raise ValueError(f"--field-blocks ({args.field_blocks}) must divide --npix ({args.npix})")
        if args.field_blocks % args.model_shards:
            raise ValueError(
                f"--field-blocks ({args.field_blocks}) must be a multiple of --model-shards ({args.model_shards})"
            )
    if args.model_shards > 1:
        if args.strategy not in ("shard_map", "jit"):
            raise ValueError(
                f"--model-shards {args.model_shards} needs --strategy shard_map or jit, got {args.strategy!r}"
            )
        if args.devices % args.model_shards:
            raise ValueError(f"--devices ({args.devices}) must be a multiple of --model-shards ({args.model_shards})")
    du.check_linear_iterations(args)
    du.check_positive_float(args.noise_std, "--noise-std")
    return args


if __name__ == "__main__":  # --help and bad flags answer before JAX is imported
    ARGS = du.parse_or_exit(parse)

import jax  # noqa: E402

jax.config.update("jax_enable_x64", True)

import jax.numpy as jnp  # noqa: E402

import shardvi as sv  # noqa: E402
from shardvi import plot  # noqa: E402
from shardvi.vi.diagnostics import pooled_chi2  # noqa: E402

CHI2_TOL = 0.1
COVERAGE_MIN = 0.9


def observe(response, field, xi):
    """``response(exp(field(xi)))``: the sky ``exp(f)`` seen through the instrument."""
    return response(jnp.exp(field(xi)))


class Problem:
    """The flagship reconstruction problem (also used by ``multi_device_comparison.py``).

    Attributes
    ----------
    field : shardvi.CorrelatedField
        Log-sky correlated field ``f(xi)``.
    mask : bool ndarray, shape (npix, npix)
        Observed pixels.
    likelihood : shardvi.Likelihood
        Gaussian likelihood on the latent space.
    xi_true : dict
        Latent truth (a prior draw).
    truth : ndarray
        ``exp(f(xi_true))``.
    data : ndarray
        Noisy data on the observed pixels (C order).
    noise_std : float
    """

    def __init__(self, npix: int, seed: int, noise_std: float = 0.2, field_blocks: int | None = None):
        du.check_positive(npix, "--npix", minimum=8)
        if (
            isinstance(noise_std, bool)
            or not isinstance(noise_std, (int, float))
            or not (np.isfinite(noise_std) and noise_std > 0)
        ):
            raise ValueError(f"noise_std (--noise-std) must be a positive finite float, got {noise_std!r}")
        cfm = sv.CorrelatedFieldMaker("cf", dtype=jnp.float64)
        cfm.set_amplitude_total_offset(0.0, (0.1, 0.05))
        cfm.add_fluctuations(
            (npix, npix), 1.0 / npix, fluctuations=(0.6, 0.1), loglogavgslope=(-2.0, 0.3), prefix="sky"
        )
        self.field = cfm.finalize()
        self.npix, self.noise_std = npix, noise_std
        self.mask = make_mask(npix, np.random.default_rng(seed))
        self.response = sv.Mask(self.mask)
        k_truth, k_noise = jax.random.split(jax.random.PRNGKey(seed))
        self.xi_true = self.field.init(k_truth)
        self.truth = np.asarray(self.sky(self.xi_true))
        noise = noise_std * np.asarray(jax.random.normal(k_noise, (self.response.size,), jnp.float64))
        self.data = np.asarray(self.response(self.truth)) + noise
        # a Partial of the response and the field (modules): their arrays are arguments of the compiled
        # steps, not constants (a lambda closing over self would hide them from JAX)
        model = sv.Model(jax.tree_util.Partial(observe, self.response, self.field), self.field.domain)
        # field_blocks: field and data cut into blocks of rows that a strategy's model_shards split over devices
        self.likelihood = sv.Gaussian(jnp.asarray(self.data), noise_std=noise_std).amend(
            model, field_blocks=field_blocks
        )

    def sky(self, xi):
        """``s = exp(f(xi))`` on the full grid."""
        return jnp.exp(self.field(xi))

    def initial_position(self, seed: int):
        """A small random latent start: 0.1 times a prior draw (NIFTy's customary start)."""
        return jax.tree.map(lambda x: 0.1 * x, self.field.init(jax.random.PRNGKey(seed + 1000)))

    def data_image(self):
        """Data on the grid, NaN where unobserved."""
        img = np.full(self.mask.shape, np.nan)
        img[self.mask] = self.data
        return img


def make_mask(npix: int, rng) -> np.ndarray:
    """Observed pixels: a rectangular and a circular gap, and 15 % of the rest dropped at random."""
    mask = rng.random((npix, npix)) >= 0.15
    a, b = npix // 8, npix // 8 + npix // 4
    mask[a:b, npix // 2 : npix // 2 + npix // 3] = False  # rectangular gap
    x, y = np.meshgrid(np.arange(npix), np.arange(npix), indexing="ij")
    mask[(x - 0.65 * npix) ** 2 + (y - 0.3 * npix) ** 2 < (npix / 7) ** 2] = False  # circular gap
    return mask


def solver_configs():
    """MGVI sampling CG, geoVI Newton-CG and KL Newton-CG settings used by the demos.

    The KL minimization stops on the energy decrease (``absdelta``), not on ``xtol``:
    ``xtol`` bounds the step's mean absolute entry over *all* latent entries, which the
    thousands of field excitations make tiny while the few hyperparameters still move.
    The geoVI update stops when its full Newton step is below ``xtol = 1e-3`` per
    latent entry (a thousandth of a prior standard deviation); tight inner CG solves
    (``tol=0.01``) make its steps Newton steps, so every sample converges within
    ``maxiter``, where loose ones (``tol=0.5``) leave the bound on the step above any
    useful ``xtol`` for dozens of steps.
    """
    return dict(
        linear_sampling=sv.CGConfig(tol=1e-4, maxiter=1000),
        nonlinear_update=sv.NewtonCGConfig(xtol=1e-3, maxiter=30, cg=sv.CGConfig(tol=0.01, maxiter=1000)),
        kl_minimization=sv.NewtonCGConfig(xtol=None, absdelta=0.01, maxiter=30, cg=sv.CGConfig(tol=0.5, maxiter=200)),
    )


def reconstruct(
    problem: Problem, *, n_samples: int, iterations: int, linear_iterations: int, seed: int, strategy, progress="auto"
):
    """MGVI (``linear_resample``) for ``linear_iterations``, then geoVI (``nonlinear_resample``).

    ``progress`` is that of :func:`shardvi.optimize_kl`.
    """

    def mode(i):
        return "linear_resample" if i < linear_iterations else "nonlinear_resample"

    return sv.optimize_kl(
        problem.likelihood,
        problem.initial_position(seed),
        key=jax.random.PRNGKey(seed + 1),
        n_total_iterations=iterations,
        n_samples=n_samples,
        sample_mode=mode,
        sample_map=strategy,
        kl_map=strategy,
        progress=progress,
        **solver_configs(),
    )


def check(chi2: float, coverage: float) -> list:
    """Failure messages of the flagship's two checks (empty when both hold; NaN fails)."""
    failures = []
    if not abs(chi2 - 1.0) <= CHI2_TOL:
        failures.append(f"reduced chi^2 {chi2:.4f} is outside 1 +- {CHI2_TOL}")
    if not coverage >= COVERAGE_MIN:
        failures.append(f"2-sigma coverage {100 * coverage:.1f} % of pixels is below {100 * COVERAGE_MIN:.0f} %")
    return failures


def main(argv=None, *, args=None) -> int:
    """Run the demo with the flags ``argv`` (or already parsed ``args``); returns the exit status."""
    args = parse(argv) if args is None else args
    du.setup_logging(args.quiet)
    devices = du.setup_devices(args.devices)
    if args.model_shards > 1:  # samples over the rows of a (devices / k, k) mesh, the field's rows over its columns
        cls = sv.parallel.JitSharding if args.strategy == "jit" else sv.parallel.ShardMap
        strategy = cls(devices=devices, model_shards=args.model_shards)
    else:
        strategy = du.make_strategy(args.strategy, devices)
    t0 = time.perf_counter()
    problem = Problem(args.npix, args.seed, args.noise_std, field_blocks=args.field_blocks)
    samples, state = reconstruct(
        problem,
        n_samples=args.n_samples,
        iterations=args.iterations,
        linear_iterations=args.linear_iterations,
        seed=args.seed,
        strategy=strategy,
        progress=du.progress(args.quiet),
    )
    wall = time.perf_counter() - t0

    sky_samples = np.asarray(samples.map(problem.sky))
    mean, std = sky_samples.mean(0), sky_samples.std(0, ddof=1)
    stats = sv.residual_stats(samples, problem.likelihood)
    chi2 = pooled_chi2(stats["likelihood"])
    cov_all = du.coverage(problem.truth, mean, std)
    cov_obs = du.coverage(problem.truth, mean, std, where=problem.mask)
    corr = float(np.corrcoef(np.log(mean).ravel(), np.log(problem.truth).ravel())[0, 1])

    print(sv.minisanity(samples, problem.likelihood))
    print(
        f"grid {args.npix}x{args.npix}, {problem.mask.sum()} observed pixels "
        f"({100 * problem.mask.mean():.0f} %), {len(samples)} samples, strategy {args.strategy} on "
        f"{len(devices)} device(s)"
        + (
            f" ({len(devices) // args.model_shards} sample x {args.model_shards} model shards, "
            f"{args.field_blocks} field blocks)"
            if args.field_blocks
            else ""
        )
    )
    print(
        f"reduced chi^2 of the likelihood residual (per-sample, noise-normalized): {chi2:.4f} "
        f"(required 1 +- {CHI2_TOL})"
    )
    print(
        f"truth within posterior mean +- 2 std: {100 * cov_all:.1f} % of all pixels "
        f"(required >= {100 * COVERAGE_MIN:.0f} %), {100 * cov_obs:.1f} % of observed pixels"
    )
    print(f"correlation of log posterior mean with log truth: {corr:.4f}")
    print(f"wall time {wall:.1f} s (including compilation)")

    out = args.output
    plot.plot_reconstruction(
        mean,
        std,
        truth=problem.truth,
        data=problem.data_image(),
        mask=problem.mask,
        title=f"log-normal correlated field {args.npix}x{args.npix} (MGVI + geoVI)",
        path=du.png_path(out, "reconstruction.png"),
    )
    plot.plot_samples(
        sky_samples,
        truth=problem.truth,
        mask=problem.mask,
        title="posterior samples of the sky: deviations from the posterior mean",
        path=du.png_path(out, "samples.png"),
    )
    spectra = np.asarray(samples.map(problem.field.power_spectrum))
    plot.plot_power_spectra(
        problem.field.k_lengths[0],
        spectra,
        truth=np.asarray(problem.field.power_spectrum(problem.xi_true)),
        title="power spectrum of log-sky: posterior samples vs truth",
        xlabel="|k| [cycles per field width]",
        ylabel="P(|k|) of log-sky",
        path=du.png_path(out, "power_spectrum.png"),
    )
    plot.plot_convergence(state.history, path=du.png_path(out, "convergence.png"))
    print(f"figures written to {out}/")

    failures = check(chi2, cov_all)
    for f in failures:
        print(f"FAILED: {f}", file=sys.stderr)
    if not failures:
        print("checks passed: reduced chi^2 and 2-sigma coverage")
    return 1 if failures else 0


if __name__ == "__main__":
    sys.exit(du.run_main(main, ARGS))
