"""KL-metric application microbenchmark: shardvi vs NIFTy.re, time vs pixel count.

    python benchmarks/bench_metric.py [--sizes 32,64,128,256,512,1024] [--pairs 4] [--repeats 10] [--json out.json]
    python benchmarks/bench_metric.py --smoke           # seconds; shardvi only

The standard benchmark of the NIFTy.re paper (Edenhofer et al. 2024): apply
the sample-averaged Fisher metric of the KL,
``t -> mean_i M(xi_bar + r_i) t`` with ``M = J^T F J + 1``, to a tangent.
Problem: ``benchmarks/_common.py::Problem`` on an ``N x N`` grid (2-D
correlated field, exp link, Gaussian noise) with ``2 * --pairs`` residuals
``r_i`` (antithetic, ``0.1 * N(0, 1)``), the same position, residuals and
tangent in both engines.

- shardvi: ``jax.jit(lambda pos, res, t: shardvi.vi.kl.kl_metric(lh, pos, res, t, strategy))``;
  configurations ``vmap`` (``sv.parallel.Vmap()``, chunk 1: the reproducible
  default), ``vmap-all`` (``Vmap(chunk_size=None)``: all samples vectorized),
  and ``vmap+repro`` / ``vmap-all+repro``: the same compiled with
  ``shardvi.parallel.reproducible.reproducible_jit`` as ``OptimizeVI``
  compiles its KL step (XLA CSE off, constants behind optimization barriers)
  instead of ``jax.jit``.
- NIFTy.re: ``jft.OptimizeVI(lh, 1, kl_map=...).kl_metric(pos, t,
  primals_samples=jft.Samples(...))`` — the jitted function NIFTy.re's KL
  Newton-CG calls; configurations ``vmap`` (its default ``kl_map``) and
  ``smap`` (``lax.scan`` over samples).

Per size and configuration (one fresh process per engine and size): ``compile``
wall time of the first call (trace + compile + one run), then ``--warmup``
untimed calls and ``--repeats`` timed calls (``block_until_ready`` each);
``median``/``min`` of those; ``check`` = ``<out, w>`` for a fixed random ``w``,
compared across engines (relative difference, should be ~1e-15). Ratios are
shardvi / NIFTy.re-fastest (the faster NIFTy.re configuration at that size).
NIFTy.re runs in ``benchmarks/.venv-nifty`` (see ``setup_nifty_venv.sh``);
without it only shardvi is measured (``skipped: ...`` is printed).
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import sys
import time

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import _common as C

SHARDVI_CONFIGS = ("vmap", "vmap-all", "vmap+repro", "vmap-all+repro")
NIFTY_CONFIGS = ("vmap", "smap")


# ================================================================================================ child
def _inputs(problem, pairs, seed=7):
    import jax
    import jax.numpy as jnp

    k_r, k_t, k_w = jax.random.split(jax.random.PRNGKey(seed), 3)
    leaves, tree = jax.tree.flatten(problem.domain)
    keys = jax.random.split(k_r, len(leaves))
    half = [0.1 * jax.random.normal(k, (pairs,) + d.shape, d.dtype) for k, d in zip(keys, leaves)]
    res = jax.tree.unflatten(tree, [jnp.stack([h, -h], axis=1).reshape((2 * pairs,) + h.shape[1:]) for h in half])
    tangent = problem.init(k_t)
    w = problem.init(k_w)
    return res, tangent, w


def _time(fn, args, warmup, repeats):
    import jax

    t0 = time.perf_counter()
    out = jax.block_until_ready(fn(*args))
    first = time.perf_counter() - t0
    for _ in range(warmup):
        jax.block_until_ready(fn(*args))
    ts = []
    for _ in range(repeats):
        t = time.perf_counter()
        jax.block_until_ready(fn(*args))
        ts.append(time.perf_counter() - t)
    return out, first, ts


def _check(out, w):
    import jax
    import numpy as np

    return float(sum(np.vdot(np.asarray(a), np.asarray(b)) for a, b in zip(jax.tree.leaves(out), jax.tree.leaves(w))))


def child_main(args):
    jax = C.setup_jax()
    cs = C.CompileStats()
    problem = C.Problem((args.size, args.size), model=args.model)
    res, tangent, w = _inputs(problem, args.pairs)
    pos = problem.position
    records = []
    for config in args.configs.split(","):
        before = cs.snapshot()
        if args.engine == "shardvi":
            sv = C.import_shardvi()
            from shardvi.parallel.reproducible import reproducible_jit
            from shardvi.vi.kl import kl_metric

            lh = problem.shardvi_likelihood()
            strategy = sv.parallel.Vmap(chunk_size=None) if config.startswith("vmap-all") else sv.parallel.Vmap()
            jit = reproducible_jit if config.endswith("+repro") else jax.jit
            fn = jit(lambda p, r, t, strategy=strategy: kl_metric(lh, p, r, t, strategy))
            fargs = (pos, res, tangent)
        else:
            import nifty.re as jft

            call, std = problem.call, problem.noise_std
            model = jft.Model(
                lambda x: call(x.tree if isinstance(x, jft.Vector) else x), domain=jft.Vector(problem.domain)
            )
            lh = jft.Gaussian(problem.data, noise_cov_inv=lambda r: r / std**2, noise_std_inv=lambda r: r / std).amend(
                model
            )
            opt = jft.OptimizeVI(lh, 1, kl_map=config)
            samples = jft.Samples(pos=jft.Vector(pos), samples=jft.Vector(res), keys=None)

            def fn(p, t, samples=samples, opt=opt):
                return opt.kl_metric(p, t, primals_samples=samples)

            fargs = (jft.Vector(pos), jft.Vector(tangent))
        out, first, ts = _time(fn, fargs, args.warmup, args.repeats)
        out = out.tree if hasattr(out, "tree") else out
        after = cs.snapshot()
        records.append(
            dict(
                engine=args.engine,
                config=config,
                size=args.size,
                n_pixels=args.size**2,
                n_latent=problem.n_latent,
                n_samples=2 * args.pairs,
                first_s=first,
                compile_s=after["s"] - before["s"],
                n_compiles=after["n"] - before["n"],
                median_s=statistics.median(ts),
                min_s=min(ts),
                times_s=ts,
                check=_check(out, w),
            )
        )
    print(json.dumps(dict(records=records, rss_peak_mib=C.peak_rss_mib())), flush=True)


# ================================================================================================ parent
def main(argv=None):
    ap = argparse.ArgumentParser(
        description=__doc__.splitlines()[0], formatter_class=argparse.RawDescriptionHelpFormatter
    )
    ap.add_argument("--sizes", default="32,64,128,256,512,1024", help="grid sizes N (N x N pixels), comma separated")
    ap.add_argument("--pairs", type=int, default=4, help="antithetic sample pairs (2x samples)")
    ap.add_argument("--repeats", type=int, default=10, help="timed calls per configuration (median)")
    ap.add_argument("--warmup", type=int, default=2, help="untimed calls after the first")
    ap.add_argument("--max-pixels", type=int, default=None, help="skip sizes with more pixels")
    ap.add_argument("--shardvi", default=",".join(SHARDVI_CONFIGS), help=f"shardvi configurations {SHARDVI_CONFIGS}")
    ap.add_argument(
        "--nifty",
        default=",".join(NIFTY_CONFIGS),
        help=f"NIFTy.re configurations {NIFTY_CONFIGS}; empty: skip NIFTy.re",
    )
    ap.add_argument("--nifty-python", default=None, help="interpreter with nifty installed (default: make the venv)")
    ap.add_argument("--timeout", type=float, default=900, help="seconds per child process")
    ap.add_argument(
        "--model",
        choices=("cf", "pointwise"),
        default="cf",
        help="cf: correlated field; pointwise: signal = exp(latent) (no FFTs, fast to compile)",
    )
    ap.add_argument("--smoke", action="store_true", help="sizes 16,32, pointwise model, 3 repeats, shardvi only")
    ap.add_argument("--json", default=None, help="write the records to this file")
    ap.add_argument("--child", action="store_true", help=argparse.SUPPRESS)
    ap.add_argument("--engine", help=argparse.SUPPRESS)
    ap.add_argument("--configs", help=argparse.SUPPRESS)
    ap.add_argument("--size", type=int, help=argparse.SUPPRESS)
    args = ap.parse_args(argv)
    if args.child:
        return child_main(args)
    if args.smoke:
        args.sizes, args.repeats, args.warmup, args.nifty, args.shardvi = "16,32", 3, 1, "", "vmap,vmap-all"
        args.model = "pointwise"
    sizes = [int(s) for s in args.sizes.split(",") if s]
    if args.max_pixels:
        sizes = [s for s in sizes if s * s <= args.max_pixels]
    for name, cfgs, allowed in (("shardvi", args.shardvi, SHARDVI_CONFIGS), ("nifty", args.nifty, NIFTY_CONFIGS)):
        for c in [c for c in cfgs.split(",") if c]:
            if c not in allowed:
                ap.error(f"unknown {name} configuration {c!r}; choose from {allowed}")
    engines = [("shardvi", args.shardvi, sys.executable)]
    skip_reason = None
    if args.nifty:
        from bench_nifty import nifty_python

        py, skip_reason = nifty_python(args)
        if py is None:
            print(f"skipped: NIFTy.re metric ({skip_reason}); measuring shardvi only", flush=True)
        else:
            engines.append(("nifty", args.nifty, py))
    script = os.path.abspath(__file__)
    records, errors, rss = [], [], {}
    for size in sizes:
        for engine, cfgs, py in engines:
            out = C.run_child(
                py,
                script,
                [
                    "--child",
                    "--engine",
                    engine,
                    "--configs",
                    cfgs,
                    "--size",
                    str(size),
                    "--pairs",
                    str(args.pairs),
                    "--repeats",
                    str(args.repeats),
                    "--warmup",
                    str(args.warmup),
                    "--model",
                    args.model,
                ],
                timeout=args.timeout,
            )
            if "error" in out:
                errors.append(dict(engine=engine, size=size, error=out["error"]))
                print(f"{engine} {size}: {out['error'][-400:]}", file=sys.stderr, flush=True)
                continue
            rss[f"{engine}/{size}"] = out["rss_peak_mib"]
            for r in out["records"]:
                r["process_rss_peak_mib"] = out["rss_peak_mib"]
                records.append(r)
                print(
                    json.dumps({k: r[k] for k in ("engine", "config", "size", "median_s", "first_s")}),
                    file=sys.stderr,
                    flush=True,
                )
    # ratios and consistency per size
    for size in sizes:
        rows = [r for r in records if r["size"] == size]
        nifty = [r for r in rows if r["engine"] == "nifty"]
        best = min(nifty, key=lambda r: r["median_s"]) if nifty else None
        ref_check = best["check"] if best else next((r["check"] for r in rows if r["config"] == "vmap"), None)
        for r in rows:
            r["ratio_vs_nifty_fastest"] = r["median_s"] / best["median_s"] if best else None
            r["nifty_fastest"] = f"nifty/{best['config']}" if best else None
            r["check_rel_diff"] = (abs(r["check"] - ref_check) / abs(ref_check)) if ref_check else None
    meta = dict(
        C.machine_meta(),
        sizes=sizes,
        model=args.model,
        pairs=args.pairs,
        repeats=args.repeats,
        warmup=args.warmup,
        nifty_skipped=skip_reason,
        command=" ".join([os.path.relpath(script, C.ROOT)] + list(argv if argv is not None else sys.argv[1:])),
    )
    C.write_json(args.json, dict(meta=meta, records=records, errors=errors))
    print_table(meta, records)
    return 1 if errors and not records else 0


def print_table(meta, records):
    model = "correlated field" if meta["model"] == "cf" else "pointwise model"
    print(
        f"\nsample-averaged KL metric application, 2-D {model}, {2 * meta['pairs']} samples; "
        f"median of {meta['repeats']} calls after warm-up, ms; {meta['cpu_count']} CPU cores\n"
    )
    cols = sorted({f"{r['engine']}/{r['config']}" for r in records}, key=lambda c: (c.startswith("nifty"), c))
    header = (
        ["pixels"]
        + [f"{c} ms" for c in cols]
        + [f"{c} ratio" for c in cols if c.startswith("shardvi")]
        + ["max rel diff"]
    )
    rows = []
    for size in meta["sizes"]:
        by = {f"{r['engine']}/{r['config']}": r for r in records if r["size"] == size}
        if not by:
            continue
        diffs = [r["check_rel_diff"] for r in by.values() if r["check_rel_diff"] is not None]
        rows.append(
            [f"{size}x{size}"]
            + [C.fmt(by[c]["median_s"] * 1e3, ".2f") if c in by else "-" for c in cols]
            + [
                C.fmt(by[c]["ratio_vs_nifty_fastest"], ".2f") if c in by else "-"
                for c in cols
                if c.startswith("shardvi")
            ]
            + [C.fmt(max(diffs), ".1e") if diffs else "-"]
        )
    print(C.markdown_table(header, rows))


if __name__ == "__main__":
    sys.exit(main())
