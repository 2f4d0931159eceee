"""Where the compile time of the engine goes: per step, tracing/lowering vs XLA, and each reproducibility measure.

    python benchmarks/bench_compile.py [--shape 128,128] [--variants default,o3,...] [--runs 1] [--json out.json]
    python benchmarks/bench_compile.py --smoke          # seconds: pointwise model, two variants

The problem is ``bench_nifty.py``'s (``_common.Problem``: a 2-D correlated
field, ``exp`` link, Gaussian noise, 4 antithetic pairs) with its matched
solver settings. Each variant runs in a fresh process, which builds an
:class:`shardvi.OptimizeVI` and, for each compiled engine step, times

- ``lower``: tracing the step to a jaxpr (including shardvi's jaxpr rewrite)
  and lowering it to StableHLO (``step.lower(...)``),
- ``compile``: XLA's compilation of that module (``lowered.compile()``),
- ``ops`` / ``fft``: StableHLO operations / FFTs in the lowered module text.
  Through shardvi's jaxpr rewrite every call site is its own code, so the FFT
  count is the number of copies of the model's transforms the program holds
  (forwards, linearizations, transposes at each solver call site); plain
  ``jax.jit`` emits identical sub-functions once and calls them from each
  site (XLA inlines them again), so there it counts distinct functions,
- ``run``: one execution of the compiled step (the fastest of 3).

Steps: ``draw`` (MGVI sampling: metric sample + CG), ``curve`` (geoVI
update: Newton-CG), ``kl`` (KL minimization: Newton-CG), ``diag``
(diagnostics) and the two small helpers (sample interleaving, key repeat).

Variants (each changes one thing against ``default``, the engine as shipped):

- ``default``: reproducible compilation (``reproducible_jit``: jaxpr rewrite
  with optimization barriers on constants and ``array / scalar`` written as a
  multiplication; XLA CSE off; classic emitters) and LLVM optimization level 1
  on CPU (``shardvi.parallel.CPU_COMPILER_OPTIONS``);
- ``o3``: the same with LLVM level 3 (XLA's default);
- ``cse``: XLA's CSE pass on (``xla_disable_hlo_passes=""``);
- ``fusion``: XLA:CPU's MLIR fusion emitters (``xla_cpu_use_fusion_emitters``);
- ``no-rewrite``: no jaxpr rewrite (no barriers, no division rewrite);
- ``plain``: plain ``jax.jit`` with XLA's default options (no reproducibility
  measure at all: what the steps cost without bitwise equality across devices);
- ``vmap-all``: ``Vmap(chunk_size=None)`` (all samples vectorized at once)
  instead of the fixed chunk of 1 (``Vmap()``);
- ``field-arg``: the model as ``jax.tree_util.Partial(forward, field)``, so
  the correlated field's arrays are arguments instead of closure constants.
"""

from __future__ import annotations

import argparse
import collections
import importlib
import json
import os
import re
import sys
import time

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import _common as C

VARIANTS = ("default", "o3", "cse", "fusion", "no-rewrite", "plain", "vmap-all", "field-arg")
STEPS = ("draw", "curve", "kl", "diag", "helpers")


def _hlo_stats(text):
    """StableHLO ops, and FFTs counted per call site (shardvi's partitioned FFT is lowered once, as a private
    function that every site calls)."""
    ops = collections.Counter(re.findall(r"stablehlo\.(\w+)", text))
    funcs = re.split(r"\n\s*func\.func ", text)
    per_func = {}
    for body in funcs:
        m = re.match(r"(?:public|private)\s+@([\w.$-]+)", body)
        if m:
            per_func[m.group(1)] = body.count("stablehlo.fft")
    wrappers = {name: n for name, n in per_func.items() if n and name.startswith("fft")}
    ffts = 0
    for body in funcs:
        m = re.match(r"(?:public|private)\s+@([\w.$-]+)", body)
        if m and m.group(1) in wrappers:
            continue
        ffts += body.count("stablehlo.fft") + sum(
            n * len(re.findall(rf"call @{re.escape(name)}\(", body)) for name, n in wrappers.items()
        )
    return sum(ops.values()), ffts


def child(args):
    jax = C.setup_jax()
    sv = C.import_shardvi()
    import shardvi.parallel.reproducible as rep

    # the module (``import shardvi.vi.optimize_kl as okl`` binds the function shardvi.vi re-exports)
    okl = importlib.import_module("shardvi.vi.optimize_kl")

    variant = args.variant
    options = {
        "o3": {"xla_backend_optimization_level": 3},
        "cse": {"xla_disable_hlo_passes": ""},
        "fusion": {"xla_cpu_use_fusion_emitters": True},
    }.get(variant)
    if variant == "no-rewrite":
        rep.opaque_constants = lambda fn, static_argnames=(): fn  # reproducible_jit looks it up at call time
    if variant == "plain":
        okl.reproducible_jit = lambda fn, **kw: jax.jit(fn, static_argnames=kw["static_argnames"])
        okl.engine_compiler_options = lambda extra=None, platform=None: {}
    problem = C.Problem(args.shape, model=args.model)
    if variant == "field-arg" and args.model == "cf":
        lh = sv.Gaussian(problem.data, noise_std=problem.noise_std).amend(
            sv.Model(jax.tree_util.Partial(_exp_field, problem.field), problem.domain)
        )
    else:
        lh = problem.shardvi_likelihood()
    n = problem.n_latent
    inner = sv.CGConfig(tol=0.5, miniter=6, maxiter=200)
    lin = sv.CGConfig(tol=None, absdelta=1e-4 * n / 10, miniter=6, maxiter=100)
    nonlin = sv.NewtonCGConfig(xtol=0, maxiter=5, cg=inner)
    kl = sv.NewtonCGConfig(xtol=1e-4, maxiter=10, cg=inner)
    strategy = sv.parallel.Vmap(chunk_size=None) if variant == "vmap-all" else sv.parallel.Vmap()
    opt = sv.OptimizeVI(
        lh,
        5,
        n_samples=args.samples,
        linear_sampling=lin,
        nonlinear_update=nonlin,
        kl_minimization=kl,
        sample_map=strategy,
        kl_map=strategy,
        compiler_options=options,
        progress=False,
    )
    pos = problem.position
    keys = jax.random.split(jax.random.PRNGKey(args.seed), args.samples)
    out = {}

    def measure(name, step, *a, **kw):
        t0 = time.perf_counter()
        lowered = step.lower(*a, **kw)
        t1 = time.perf_counter()
        compiled = lowered.compile()
        t2 = time.perf_counter()
        ops, ffts = _hlo_stats(lowered.as_text())
        rec = out.setdefault(name, dict(lower=0.0, compile=0.0, ops=0, fft=0, run=0.0))
        rec["lower"] += t1 - t0
        rec["compile"] += t2 - t1
        rec["ops"] += ops
        rec["fft"] += ffts
        lh_arg = (step.likelihood,) if isinstance(step, okl._WithLikelihood) else ()
        placed = sv.parallel.place(strategy, a)
        times = []
        for _ in range(3):
            t0 = time.perf_counter()
            jax.block_until_ready(compiled(*lh_arg, *placed))
            times.append(time.perf_counter() - t0)
        rec["run"] += min(times)

    measure("draw", opt._draw_linear, pos, keys, config=lin)
    r, *_ = opt._draw_linear(pos, keys, config=lin)
    measure("helpers", opt._interleave, r)
    measure("helpers", opt._repeat_keys, keys)
    residuals = opt._interleave(r)
    ekeys = opt._expand(keys)
    signs = opt._signs(args.samples)
    measure("curve", opt._curve, pos, residuals, ekeys, signs, config=nonlin)
    measure("kl", opt._minimize, pos, residuals, config=kl)
    measure("diag", opt._diagnostics, pos, residuals)
    print(json.dumps(dict(variant=variant, steps=out, peak_rss_mib=C.peak_rss_mib())))


def _exp_field(field, xi):
    import jax.numpy as jnp

    return jnp.exp(field(xi))


def main(argv=None):
    ap = argparse.ArgumentParser(
        description=__doc__.splitlines()[0], formatter_class=argparse.RawDescriptionHelpFormatter
    )
    ap.add_argument("--shape", default="128,128", help="grid shape, comma separated")
    ap.add_argument("--samples", type=int, default=4, help="antithetic sample pairs")
    ap.add_argument("--variants", default=",".join(VARIANTS), help=f"comma separated, from {VARIANTS}")
    ap.add_argument("--runs", type=int, default=1, help="fresh-process runs per variant (medians; interleaved)")
    ap.add_argument("--seed", type=int, default=1)
    ap.add_argument("--smoke", action="store_true", help="pointwise 16x16 problem, variants default,o3 (seconds)")
    ap.add_argument("--json", default=None, help="write the records and summary to this file")
    ap.add_argument("--timeout", type=float, default=900, help="seconds per child run")
    ap.add_argument("--child", action="store_true", help=argparse.SUPPRESS)
    ap.add_argument("--variant", help=argparse.SUPPRESS)
    ap.add_argument("--model", default="cf", help=argparse.SUPPRESS)
    args = ap.parse_args(argv)
    args.shape = tuple(int(s) for s in str(args.shape).split(","))
    if args.child:
        return child(args)
    if args.smoke:
        args.shape, args.model, args.variants, args.runs = (16, 16), "pointwise", "default,o3", 1
    variants = [v for v in args.variants.split(",") if v]
    for v in variants:
        if v not in VARIANTS:
            ap.error(f"unknown variant {v!r}; choose from {VARIANTS}")
    shape = ",".join(map(str, args.shape))
    records = []
    for run in range(args.runs):
        for v in variants:
            cmd = ["--child", "--variant", v, "--shape", shape, "--samples", str(args.samples)]
            cmd += ["--seed", str(args.seed), "--model", args.model]
            print(f"[run {run + 1}/{args.runs}] {v} ...", file=sys.stderr, flush=True)
            rec = C.run_child(sys.executable, os.path.abspath(__file__), cmd, timeout=args.timeout)
            if "error" in rec:
                print(f"  {v}: {rec['error']}", file=sys.stderr)
                continue
            records.append(rec)
    summary = summarize(records)
    meta = dict(shape=args.shape, samples=args.samples, runs=args.runs, model=args.model, **C.machine_meta())
    print_tables(meta, summary)
    C.write_json(args.json, dict(meta=meta, records=records, summary=summary))
    return 0


def summarize(records):
    by = collections.defaultdict(list)
    for r in records:
        by[r["variant"]].append(r)
    out = {}
    for v, recs in by.items():
        steps = {}
        for s in STEPS:
            rows = [r["steps"][s] for r in recs if s in r["steps"]]
            if rows:
                steps[s] = {k: C.median([row[k] for row in rows]) for k in rows[0]}
        total = {k: C.median([sum(r["steps"][s][k] for s in r["steps"]) for r in recs]) for k in ("lower", "compile")}
        out[v] = dict(steps=steps, total=total, peak_rss_mib=C.median([r["peak_rss_mib"] for r in recs]))
    return out


def print_tables(meta, summary):
    shape = "x".join(map(str, meta["shape"]))
    print(f"\n{shape} {meta['model']}, {meta['samples']} pairs, medians of {meta['runs']} fresh-process run(s)\n")
    rows = []
    base = summary.get("default", {}).get("total", {}).get("compile")
    for v, s in summary.items():
        for name, st in s["steps"].items():
            lower, comp, run = (C.fmt(st[k], f) for k, f in (("lower", ".2f"), ("compile", ".2f"), ("run", ".3f")))
            rows.append([v, name, lower, comp, st["ops"], st["fft"], run, ""])
        t = s["total"]
        ratio = C.fmt(t["compile"] / base, ".2f") if base else "-"
        rows.append([f"**{v}**", "**all**", C.fmt(t["lower"], ".2f"), C.fmt(t["compile"], ".2f"), "", "", "", ratio])
    header = ["variant", "step", "lower s", "XLA compile s", "HLO ops", "FFTs", "run s", "compile vs default"]
    print(C.markdown_table(header, rows))


if __name__ == "__main__":
    sys.exit(main())
