"""Field parallelism: the largest correlated field whose reconstruction fits a per-process memory budget.

    python benchmarks/bench_field_largest.py [--budget-mib 4096] [--json out.json]
    python benchmarks/bench_field_largest.py --smoke          # ~2 minutes: small sizes, shardvi only

For each configuration — shardvi with the field split over ``P`` processes
(``bench_field_memory.py``'s problem and runs: ``jax.distributed`` on
127.0.0.1, one CPU device per process, ``field_blocks=--blocks``), and
NIFTy.re 9.x in one process (``bench_nifty.py``'s NIFTy.re child, its
fastest configuration ``jit-lmap``, the same kind of problem: a log-normal 2-D
correlated field observed at every pixel) — with ``--pairs`` antithetic pairs
and ``--iterations`` MGVI iterations:

1. the peak resident memory per process (``ru_maxrss``, the largest over the
   processes) at the ``--fit`` grid sizes, and a straight line
   ``peak = fixed + per_pixel * npix**2`` through them;
2. the largest ``npix`` (a multiple of ``--blocks``) whose predicted peak is
   within ``--budget-mib``;
3. runs to verify it, each at the grid where the line through the last run
   and the largest smaller one meets the budget: smaller while the measured
   peak exceeds the budget, larger while it is within, if more than half a
   ``--step`` larger (the fit at small sizes overstates the growth: fixed
   costs); at most ``--max-tries`` runs.

The result is the largest *verified* grid per configuration and its ratio of
pixels to shardvi on one process and to NIFTy.re. All processes share this
machine's 2 cores: the sizes, not the times, are what this measures. Without
the NIFTy.re venv (``benchmarks/setup_nifty_venv.sh``) its row says why it is
missing.
"""

from __future__ import annotations

import argparse
import json
import math
import os
import sys
import tempfile

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, HERE)
import _common as C  # noqa: E402
import bench_field_memory as FM  # noqa: E402
import bench_nifty as BN  # noqa: E402


def shardvi_peak(args, npix: int, nproc: int) -> float:
    """Largest peak RSS (MiB) over the ``nproc`` processes of one field-split run on ``npix``\\ ² pixels."""
    run = argparse.Namespace(**vars(args))
    run.npix = npix
    with tempfile.TemporaryDirectory() as tmp:
        recs = FM._spawn(run, nproc, os.path.join(tmp, "out.npz"))
    return max(r["peak_mib"] for r in recs)


def nifty_peak(args, npix: int, python: str) -> float:
    """Peak RSS (MiB) of NIFTy.re's run on ``npix``\\ ² pixels (``bench_nifty.py``'s child, MGVI iterations)."""
    argv = ["--child", "--engine", "nifty", "--config", "jit-lmap", "--shape", f"{npix},{npix}"]
    argv += ["--samples", str(args.pairs), "--iterations", str(args.iterations)]
    argv += ["--linear-iterations", str(args.iterations), "--cg-maxiter", str(args.cg_iters)]
    argv += ["--kl-maxiter", str(args.newton_iters), "--seed", str(args.seed)]
    rec = C.run_child(python, os.path.join(HERE, "bench_nifty.py"), argv, timeout=args.timeout)
    if "error" in rec:
        raise RuntimeError(rec["error"])
    return rec["rss_peak_mib"]


def fit_line(points):
    """``(fixed MiB, MiB per pixel)`` of the least-squares line through ``[(npix, peak MiB)]`` in ``npix**2``."""
    xs = [n * n for n, _ in points]
    ys = [p for _, p in points]
    mx, my = sum(xs) / len(xs), sum(ys) / len(ys)
    sxx = sum((x - mx) ** 2 for x in xs)
    slope = sum((x - mx) * (y - my) for x, y in zip(xs, ys)) / sxx
    return my - slope * mx, slope


def largest(args, name, peak_of) -> dict:
    """Fit, predict and verify the largest grid of one configuration (``peak_of(npix) -> MiB``)."""
    points = []
    for n in args.fit:
        points.append((n, peak_of(n)))
        print(json.dumps(dict(config=name, npix=n, peak_mib=points[-1][1])), file=sys.stderr, flush=True)
    fixed, per_px = fit_line(points)
    b = args.blocks
    if per_px > 0:
        predicted = int(math.sqrt(max(args.budget_mib - fixed, 0.0) / per_px)) // b * b
    else:  # fixed memory dominates at these sizes: no prediction (larger --fit sizes)
        print(f"{name}: the peak does not grow over the --fit sizes {points}", file=sys.stderr, flush=True)
        predicted = 0
    npix, verified, measured = predicted, None, list(points)
    for _ in range(args.max_tries if predicted else 0):
        peak = peak_of(npix)
        print(json.dumps(dict(config=name, npix=npix, peak_mib=peak, verify=True)), file=sys.stderr, flush=True)
        below = max((m for m in measured if m[0] < npix), default=None)
        measured.append((npix, peak))
        if peak <= args.budget_mib:
            verified = dict(npix=npix, peak_mib=peak)
            if below is None or peak <= below[1]:
                break
            # the line through this run and the largest smaller one (the fit's slope at small sizes carries
            # fixed costs): grow while it predicts a grid more than half a step larger
            slope = (peak - below[1]) / (npix * npix - below[0] * below[0])
            grown = int(math.sqrt(npix * npix + (args.budget_mib - peak) / slope)) // b * b
            if grown <= npix * (1 + args.step / 2):
                break
            npix = grown
        else:  # over: where the line through this run and the largest smaller one meets the budget
            shrunk = npix * (1 - args.step)
            if below is not None and peak > below[1]:
                slope = (peak - below[1]) / (npix * npix - below[0] * below[0])
                shrunk = min(npix - b, math.sqrt(below[0] * below[0] + (args.budget_mib - below[1]) / slope))
            npix = int(shrunk) // b * b
            if verified is not None and npix <= verified["npix"]:
                break
    return dict(
        config=name,
        fit=[dict(npix=n, peak_mib=p) for n, p in points],
        runs=[dict(npix=n, peak_mib=p) for n, p in measured[len(points) :]],
        fixed_mib=fixed,
        mib_per_mpx=per_px * 1e6,
        predicted_npix=predicted,
        verified=verified,
    )


def main(argv=None):
    ap = argparse.ArgumentParser(
        description=__doc__.split("\n\n")[0], formatter_class=argparse.RawDescriptionHelpFormatter
    )
    ap.add_argument("--budget-mib", type=float, default=4096.0, help="peak resident memory per process")
    ap.add_argument("--fit", default="512,1024", help="grid sizes of the line fit, comma separated")
    ap.add_argument("--processes", default="1,4", help="shardvi process counts")
    ap.add_argument("--nifty", action=argparse.BooleanOptionalAction, default=True, help="NIFTy.re row")
    FM.add_problem_arguments(ap)
    ap.add_argument(
        "--step",
        type=float,
        default=0.05,
        help="relative shrink when over without a line; growth under half of it stops",
    )
    ap.add_argument("--max-tries", type=int, default=3, help="verification runs per configuration")
    ap.add_argument("--timeout", type=float, default=3000, help="seconds per run")
    ap.add_argument(
        "--smoke", action="store_true", help="small sizes, P = 1, 2, shardvi only, a budget to match (~2 minutes)"
    )
    ap.add_argument("--json")
    args = ap.parse_args(argv)
    if args.smoke:
        args.fit, args.processes, args.nifty, args.iterations, args.cg_iters = "64,256", "1,2", False, 2, 2
    args.fit = [int(n) for n in args.fit.split(",")]
    procs = [int(p) for p in args.processes.split(",")]
    if len(args.fit) < 2 or len(set(args.fit)) < 2:
        ap.error("--fit needs at least two different grid sizes")
    for p in procs:
        if args.blocks % p:
            ap.error(f"--blocks {args.blocks} must be a multiple of every process count, not of {p}")
    for n in args.fit:
        if n % args.blocks:
            ap.error(f"--blocks {args.blocks} must divide every --fit size, not {n}")
    if args.smoke:  # a budget just above the larger fit point's peak: the search and its verification run
        args.budget_mib = shardvi_peak(args, args.fit[-1], procs[0]) + 20.0
    rows = [largest(args, f"shardvi P={p}", lambda n, p=p: shardvi_peak(args, n, p)) for p in procs]
    if args.nifty:
        py, reason = BN.nifty_python(argparse.Namespace(nifty_python=None))
        if py is None:
            print(f"skipped: NIFTy.re ({reason})", flush=True)
        else:
            rows.append(largest(args, "NIFTy.re (1 process)", lambda n: nifty_peak(args, n, py)))
    ref = {r["config"]: r["verified"]["npix"] ** 2 for r in rows if r["verified"]}
    one = ref.get(f"shardvi P={procs[0]}")
    nifty = ref.get("NIFTy.re (1 process)")
    table = []
    for r in rows:
        v = r["verified"]
        px = v["npix"] ** 2 if v else None
        table.append(
            [
                r["config"],
                ", ".join(f"{p['npix']}²: {p['peak_mib']:.0f}" for p in r["fit"]),
                f"{r['fixed_mib']:.0f}",
                f"{r['mib_per_mpx']:.0f}",
                str(r["predicted_npix"] or "-"),
                f"{v['npix']}² ({px / 1e6:.1f} Mpx)" if v else "none",
                f"{v['peak_mib']:.0f}" if v else "-",
                f"{px / one:.2f}" if px and one else "-",
                f"{px / nifty:.2f}" if px and nifty else "-",
            ]
        )
    header = [
        "configuration",
        "fit: peak MiB",
        "fixed MiB",
        "MiB / Mpx",
        "predicted npix",
        "largest verified",
        "its peak MiB",
        f"pixels / shardvi P={procs[0]}",
        "pixels / NIFTy.re",
    ]
    print(
        f"\nlargest 2-D correlated field within {args.budget_mib:.0f} MiB peak RSS per process; {args.pairs} pairs, "
        f"{args.iterations} MGVI iterations, {args.blocks} field blocks; 2 cores shared by all processes\n"
    )
    print(C.markdown_table(header, table, "llrrrlrrr"))
    if args.json:
        C.write_json(args.json, dict(meta=C.machine_meta() | vars(args), rows=rows))
    return 0


if __name__ == "__main__":
    sys.exit(main())
