"""shardvi scaling: time per global iteration and peak memory vs pixel count (1-D, 2-D) and vs sample count.

    python benchmarks/bench_scaling.py [--max-pixels 1048576] [--json out.json]
    python benchmarks/bench_scaling.py --smoke          # seconds

Problem: ``benchmarks/_common.py::Problem`` (correlated field with a
non-parametric spectrum, exp link, Gaussian noise on every pixel) on 1-D grids
of ``--sizes-1d`` pixels and 2-D grids of ``N x N`` for ``N`` in
``--sizes-2d``; then at ``--sweep-shape`` with ``--sweep-pairs`` antithetic
pairs. One fresh process per point (so the peak RSS is the point's own).

Every point runs ``sv.optimize_kl`` for ``--iterations`` global iterations:
the first ``linear_resample``, the rest ``nonlinear_resample`` (``--linear``:
all ``linear_resample``), with a nearly fixed amount of work per iteration so
that times are comparable across sizes: sampling CG ``CGConfig(tol=None,
maxiter=--cg-iters)`` (exactly that many iterations), geoVI
``NewtonCGConfig(xtol=None, maxiter=--newton-iters)`` and KL
``NewtonCGConfig(xtol=None, maxiter=--newton-iters)`` (exactly that many
Newton steps), inner CG ``CGConfig(tol=0.5, maxiter=--cg-iters)``
(Eisenstat-Walker: at most that many). Columns:

- ``first``: wall time of iteration 1 (tracing + compilation + run);
- ``iter``: median wall time of the iterations that compiled nothing (the
  steady state: iteration 2 compiles the geoVI step, so with the default 5
  iterations it is the median of iterations 3, 4, 5);
- ``per Mpix``: ``iter`` per million latent parameters;
- ``KL hessp``: KL-metric applications (inner CG iterations) in the last iteration;
- ``RSS``: peak resident memory of the process (``ru_maxrss``), ``base`` the
  resident memory just before ``optimize_kl`` (imports, problem, data),
  ``RSS - base`` what the optimization added (XLA compilation included);
- ``state MiB``: position + residuals, ``8 * n_latent * (1 + 2 * pairs)`` bytes.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import time

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import _common as C


# ================================================================================================ child
def child_main(args):
    jax = C.setup_jax()
    cs = C.CompileStats()
    sv = C.import_shardvi()
    problem = C.Problem(args.shape, model=args.model)
    jax.block_until_ready(problem.data)
    lh = problem.shardvi_likelihood()
    strategy = sv.parallel.Vmap(chunk_size=None) if args.strategy == "vmap-all" else sv.parallel.Vmap()
    inner = sv.CGConfig(tol=0.5, maxiter=args.cg_iters)
    newton = sv.NewtonCGConfig(xtol=None, maxiter=args.newton_iters, cg=inner)
    times, compiles, work = [], [], []
    snap = cs.snapshot()
    rss_base = C.current_rss_mib()
    t = [time.perf_counter()]

    def callback(samples, state):
        jax.block_until_ready(samples.pos)
        now = time.perf_counter()
        times.append(now - t[0])
        compiles.append(cs.snapshot()["n"] - snap["n"] - sum(compiles))
        r = state.history[-1]
        work.append(
            dict(kl_nit=r.kl_nit, kl_hessp=r.kl_cg_nit, sampling_cg=sum(r.sampling_nit), geovi_nit=sum(r.nonlinear_nit))
        )
        t[0] = time.perf_counter()

    mode = (
        (lambda i: "linear_resample")
        if args.linear
        else (lambda i: "linear_resample" if i < 1 else "nonlinear_resample")
    )
    sv.optimize_kl(
        lh,
        problem.position,
        key=jax.random.PRNGKey(1),
        n_total_iterations=args.iterations,
        n_samples=args.pairs,
        sample_mode=mode,
        linear_sampling=sv.CGConfig(tol=None, maxiter=args.cg_iters),
        nonlinear_update=newton,
        kl_minimization=newton,
        sample_map=strategy,
        kl_map=strategy,
        callback=callback,
    )
    end = cs.snapshot()
    warm = [x for x, c in zip(times[1:], compiles[1:]) if c == 0]
    rec = dict(
        shape=list(args.shape),
        ndim=len(args.shape),
        n_pixels=problem.n_data,
        n_latent=problem.n_latent,
        pairs=args.pairs,
        strategy=args.strategy,
        iterations=args.iterations,
        iter_s=times,
        iter_compiles=compiles,
        first_s=times[0],
        iter_median_s=C.median(warm),
        n_warm=len(warm),
        compile_s=end["s"] - snap["s"],
        n_compiles=end["n"] - snap["n"],
        rss_base_mib=rss_base,
        rss_peak_mib=C.peak_rss_mib(),
        state_mib=8 * problem.n_latent * (1 + 2 * args.pairs) / 2**20,
        last_work=work[-1],
    )
    print(json.dumps(rec), flush=True)


# ================================================================================================ parent
def main(argv=None):
    ap = argparse.ArgumentParser(
        description=__doc__.splitlines()[0], formatter_class=argparse.RawDescriptionHelpFormatter
    )
    ap.add_argument("--sizes-1d", default="1024,4096,16384,65536,262144,1048576", help="1-D pixel counts")
    ap.add_argument("--sizes-2d", default="64,128,256,512,1024", help="2-D grid sizes N (N x N pixels)")
    ap.add_argument("--pairs", type=int, default=1, help="antithetic pairs for the size sweeps")
    ap.add_argument("--sweep-shape", default="128,128", help="grid of the sample-count sweep")
    ap.add_argument("--sweep-pairs", default="1,2,4,8", help="pair counts of the sample-count sweep (empty: skip)")
    ap.add_argument("--iterations", type=int, default=5, help="global iterations per point")
    ap.add_argument("--linear", action="store_true", help="all iterations linear_resample (MGVI only)")
    ap.add_argument("--cg-iters", type=int, default=10, help="sampling CG iterations / inner CG maxiter")
    ap.add_argument("--newton-iters", type=int, default=2, help="geoVI and KL Newton steps per iteration")
    ap.add_argument(
        "--strategy",
        choices=("vmap", "vmap-all"),
        default="vmap",
        help="vmap: Vmap() (chunk 1, reproducible default); vmap-all: Vmap(chunk_size=None)",
    )
    ap.add_argument("--max-pixels", type=int, default=None, help="skip points with more pixels")
    ap.add_argument("--timeout", type=float, default=900, help="seconds per point")
    ap.add_argument(
        "--model",
        choices=("cf", "pointwise"),
        default="cf",
        help="cf: correlated field; pointwise: signal = exp(latent) (no FFTs, fast to compile)",
    )
    ap.add_argument("--smoke", action="store_true", help="two tiny points, pointwise model, 2 linear iterations")
    ap.add_argument("--json", default=None, help="write the records to this file")
    ap.add_argument("--child", action="store_true", help=argparse.SUPPRESS)
    ap.add_argument("--shape", help=argparse.SUPPRESS)
    args = ap.parse_args(argv)
    if args.child:
        args.shape = tuple(int(s) for s in args.shape.split(","))
        return child_main(args)
    if args.smoke:
        args.sizes_1d, args.sizes_2d, args.sweep_pairs = "256", "16", ""
        args.iterations, args.linear, args.cg_iters, args.newton_iters, args.model = 2, True, 3, 1, "pointwise"
    points = [("1-D", (int(n),), args.pairs) for n in args.sizes_1d.split(",") if n]
    points += [("2-D", (int(n), int(n)), args.pairs) for n in args.sizes_2d.split(",") if n]
    sweep_shape = tuple(int(s) for s in args.sweep_shape.split(","))
    points += [("samples", sweep_shape, int(p)) for p in args.sweep_pairs.split(",") if p]
    if args.max_pixels:
        points = [p for p in points if _npix(p[1]) <= args.max_pixels]
    script = os.path.abspath(__file__)
    records, errors = [], []
    for sweep, shape, pairs in points:
        child = [
            "--child",
            "--shape",
            ",".join(map(str, shape)),
            "--pairs",
            str(pairs),
            "--iterations",
            str(args.iterations),
            "--cg-iters",
            str(args.cg_iters),
            "--newton-iters",
            str(args.newton_iters),
            "--strategy",
            args.strategy,
            "--model",
            args.model,
        ] + (["--linear"] if args.linear else [])
        rec = C.run_child(sys.executable, script, child, timeout=args.timeout)
        rec["sweep"] = sweep
        if "error" in rec:
            errors.append(dict(sweep=sweep, shape=list(shape), pairs=pairs, error=rec["error"]))
            print(f"{sweep} {shape} {pairs}: {rec['error'][-400:]}", file=sys.stderr, flush=True)
            continue
        records.append(rec)
        print(
            json.dumps({k: rec[k] for k in ("sweep", "shape", "pairs", "first_s", "iter_median_s", "rss_peak_mib")}),
            file=sys.stderr,
            flush=True,
        )
    meta = dict(
        C.machine_meta(),
        model=args.model,
        iterations=args.iterations,
        linear=args.linear,
        cg_iters=args.cg_iters,
        newton_iters=args.newton_iters,
        strategy=args.strategy,
        pairs=args.pairs,
        command=" ".join([os.path.relpath(script, C.ROOT)] + list(argv if argv is not None else sys.argv[1:])),
    )
    C.write_json(args.json, dict(meta=meta, records=records, errors=errors))
    print_table(meta, records)
    return 1 if errors else 0


def _npix(shape):
    n = 1
    for s in shape:
        n *= s
    return n


def print_table(meta, records):
    print(
        f"\nshardvi optimize_kl, {meta['model']} model, strategy {meta['strategy']}, {meta['iterations']} iterations "
        f"({'all linear' if meta['linear'] else '1 linear + geoVI'}), sampling CG {meta['cg_iters']} its, "
        f"{meta['newton_iters']} Newton steps; iter = median of the iterations that compiled nothing; "
        f"{meta['cpu_count']} CPU cores\n"
    )
    header = [
        "sweep",
        "shape",
        "latent",
        "pairs",
        "first s",
        "iter s",
        "s per Mlatent",
        "KL hessp",
        "compile s",
        "RSS MiB",
        "base MiB",
        "RSS-base MiB",
        "state MiB",
    ]
    rows = []
    for r in records:
        per = r["iter_median_s"] / (r["n_latent"] / 1e6) if r["iter_median_s"] else None
        rows.append(
            [
                r["sweep"],
                "x".join(map(str, r["shape"])),
                r["n_latent"],
                r["pairs"],
                C.fmt(r["first_s"], ".2f"),
                C.fmt(r["iter_median_s"], ".3f"),
                C.fmt(per, ".2f"),
                r["last_work"]["kl_hessp"],
                C.fmt(r["compile_s"], ".1f"),
                C.fmt(r["rss_peak_mib"], ".0f"),
                C.fmt(r["rss_base_mib"], ".0f"),
                C.fmt(r["rss_peak_mib"] - r["rss_base_mib"], ".0f"),
                C.fmt(r["state_mib"], ".1f"),
            ]
        )
    print(C.markdown_table(header, rows, align="ll" + "r" * (len(header) - 2)))


if __name__ == "__main__":
    sys.exit(main())
