"""The same reconstruction on 1 device and on N devices: how different are the results?

Runs the flagship problem (``correlated_field_2d.py``: a log-normal correlated field
behind a mask, MGVI then geoVI) twice with one multi-device strategy: on the first
device only and on ``--devices`` devices (on CPU that many host devices are forced
before JAX starts). Prints the largest absolute and relative differences of the
latent samples, the posterior mean and std of the sky and the KL energies, and plots
the two posterior means and their difference.

With ``--reduce fixed`` (default; sv.parallel's reproducible mode) every difference
must be exactly 0 — the script exits with status 1 otherwise. With ``--reduce psum``
(per-device sums combined by ``psum``) every sample mean differs by about one ulp; the
iterative solvers (CG, Newton-CG with their stopping rules) amplify that to the level of
their tolerances, so the check is that the posterior means differ by less than
``PSUM_STD_FRACTION`` (5 %) of the posterior std on every pixel.

    python demos/multi_device_comparison.py --devices 4 --strategy shard_map --output out/
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

MULTI_DEVICE_NAMES = ("shard_map", "pmap", "jit")
REDUCE_MODES = ("fixed", "psum")  # = shardvi.parallel.REDUCE_MODES (tests/test_demos.py checks)
PSUM_STD_FRACTION = 0.05


def parse(argv=None):
    """Command-line flags (checked; ``ValueError`` naming the flag). Needs neither JAX nor shardvi."""
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--npix", type=int, default=48, help="pixels per axis (default 48)")
    ap.add_argument("--linear-iterations", type=int, default=2, help="leading MGVI iterations before geoVI (default 2)")
    ap.add_argument("--reduce", default="fixed", help="'fixed' (reproducible, default) or 'psum'")
    ap.add_argument("--chunk-size", type=int, default=1, help="samples per vectorized step per device (default 1)")
    du.add_common_flags(
        ap,
        samples=4,
        iterations=3,
        seed=0,
        output="demo_output/multi_device_comparison",
        strategy="shard_map",
        devices=4,
    )
    args = ap.parse_args(argv)
    if args.strategy not in MULTI_DEVICE_NAMES:
        raise ValueError(f"--strategy must be a multi-device strategy {MULTI_DEVICE_NAMES}, got {args.strategy!r}")
    du.check_common(args)
    du.check_positive(args.devices, "--devices", minimum=2)
    du.check_positive(args.npix, "--npix", minimum=8)
    du.check_positive(args.chunk_size, "--chunk-size")
    du.check_linear_iterations(args)
    if args.reduce not in REDUCE_MODES:
        raise ValueError(f"--reduce must be one of {REDUCE_MODES}, got {args.reduce!r}")
    return args


if __name__ == "__main__":  # --help and bad flags answer before JAX is imported
    ARGS = du.parse_or_exit(parse)

import jax  # noqa: E402

jax.config.update("jax_enable_x64", True)

import correlated_field_2d as flagship  # noqa: E402

from shardvi import parallel  # noqa: E402

MULTI_DEVICE = {"shard_map": parallel.ShardMap, "pmap": parallel.Pmap, "jit": parallel.JitSharding}


def run(problem, devices, args):
    """One reconstruction on ``devices``; returns flat latent samples, sky mean/std, KL energies, seconds."""
    strategy = MULTI_DEVICE[args.strategy](devices=tuple(devices), chunk_size=args.chunk_size, reduce=args.reduce)
    t0 = time.perf_counter()
    samples, state = flagship.reconstruct(
        problem,
        n_samples=args.n_samples,
        iterations=args.iterations,
        linear_iterations=args.linear_iterations,
        seed=args.seed,
        strategy=strategy,
        progress=du.progress(args.quiet),
    )
    sky = np.asarray(samples.map(problem.sky))
    flat = np.concatenate([np.asarray(x).reshape(len(samples), -1) for x in jax.tree.leaves(samples.samples)], axis=1)
    kl = np.asarray([r.kl_energy for r in state.history])
    return dict(samples=flat, mean=sky.mean(0), std=sky.std(0, ddof=1), kl_energy=kl, time=time.perf_counter() - t0)


def plot_comparison(one, many, n, title, path, *, mask=None):
    """Posterior mean and std on 1 and N devices and the differences (N minus 1).

    ``title`` is the figure's title; ``mask`` (True where observed, optional) is outlined on every map.
    """
    import matplotlib.pyplot as plt
    from matplotlib.ticker import FormatStrFormatter

    from shardvi import plot

    fig, axes = plt.subplots(2, 3, figsize=(12.5, 7.5), layout="constrained")
    for row, key in enumerate(("mean", "std")):
        a, b = one[key], many[key]
        lo, hi = min(a.min(), b.min()), max(a.max(), b.max())
        d = b - a
        lim = max(float(np.max(np.abs(d))), float(np.spacing(np.max(np.abs(a)))))  # >= 1 ulp
        for col, (img, panel_title, cbar_label, kw) in enumerate(
            (
                (a, f"posterior {key}, 1 device", f"posterior {key}", dict(vmin=lo, vmax=hi)),
                (b, f"posterior {key}, {n} devices", f"posterior {key}", dict(vmin=lo, vmax=hi)),
                (
                    d,
                    f"{key} difference ({n} dev − 1 dev)\nmax |diff| = {np.max(np.abs(d)):.2g}",
                    f"{key} difference",
                    dict(vmin=-lim, vmax=lim, cmap="RdBu_r", mask_color="black"),
                ),
            )
        ):
            ax = axes[row, col]
            im = plot.draw_map(
                ax,
                img,
                mask=mask,
                label=cbar_label,
                xlabel=None if row == 1 else "",
                ylabel=None if col == 0 else "",
                **kw,
            )
            ax.set_title(panel_title, fontsize=9)
            if col == 2:
                im.colorbar.formatter = FormatStrFormatter("%.1e")
    fig.suptitle(title)
    return plot.save(fig, path)


def main(argv=None, *, args=None) -> int:
    """Run the comparison with the flags ``argv`` (or already parsed ``args``); returns the exit status."""
    args = parse(argv) if args is None else args
    du.setup_logging(args.quiet)
    devices = du.setup_devices(args.devices)
    problem = flagship.Problem(args.npix, args.seed)
    one = run(problem, devices[:1], args)
    many = run(problem, devices, args)

    n = len(devices)
    print(
        f"{args.strategy} (reduce={args.reduce}, chunk_size={args.chunk_size}) on 1 vs {n} "
        f"{devices[0].platform} devices: {args.npix}x{args.npix} log-normal field, {2 * args.n_samples} samples, "
        f"{args.iterations} iterations"
    )
    print(f"{'quantity':<12} {'max abs diff':>14} {'max rel diff':>14}  bitwise equal")
    diffs = {}
    for key in ("samples", "mean", "std", "kl_energy"):
        d = diffs[key] = du.diff_stats(many[key], one[key])
        print(f"{key:<12} {d['max_abs']:>14.3e} {d['max_rel']:>14.3e}  {'yes' if d['bitwise_equal'] else 'no'}")
    print(f"wall time (including compilation): 1 device {one['time']:.1f} s, {n} devices {many['time']:.1f} s")
    plot_comparison(
        one,
        many,
        n,
        f"{args.strategy} (reduce={args.reduce}) on 1 vs {n} devices, same RNG keys",
        du.png_path(args.output, "comparison.png"),
        mask=problem.mask,
    )
    print(f"figures written to {args.output}/")

    if args.reduce == "fixed":
        bad = [k for k, d in diffs.items() if not d["bitwise_equal"]]
        if bad:
            print(f"FAILED: reproducible mode, but {', '.join(bad)} differ between 1 and {n} devices", file=sys.stderr)
            return 1
        print(f"check passed: 1 and {n} devices give bitwise identical results")
    else:
        ratio = float(np.max(np.abs(many["mean"] - one["mean"]) / one["std"]))
        print(f"max |mean difference| / posterior std = {ratio:.2e}")
        if not ratio < PSUM_STD_FRACTION:
            print(
                f"FAILED: the posterior means differ by {ratio:.2e} posterior std (allowed {PSUM_STD_FRACTION})",
                file=sys.stderr,
            )
            return 1
        print(
            f"check passed: differences below {PSUM_STD_FRACTION} posterior std (psum round-off, amplified "
            f"by the iterative solvers)"
        )
    return 0


if __name__ == "__main__":
    sys.exit(du.run_main(main, ARGS))
