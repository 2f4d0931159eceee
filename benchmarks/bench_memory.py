"""XLA memory of the compiled steps: shardvi's engine steps vs NIFTy.re's jitted pieces (no run, compile only).

    python benchmarks/bench_memory.py [--size 1024] [--pairs 4] [--json out.json]
    python benchmarks/bench_memory.py --smoke          # seconds; shardvi only, pointwise model

Peak RSS mixes compiler memory, the JAX runtime and live arrays; this script
asks XLA instead. For every compiled step it reports
``compiled.memory_analysis()``: ``temp`` (scratch buffers XLA allocates while
the step runs: the working set beyond inputs and outputs), ``args`` and
``out``, each also in units of one latent vector (``8 * n_latent`` bytes), plus
the compile time. Problem: ``benchmarks/_common.py::Problem`` on ``--size`` x
``--size`` pixels with ``2 * --pairs`` samples.

- shardvi (``sv.OptimizeVI`` steps, exactly what ``optimize_kl`` runs, via
  ``Placed.lower``): ``draw_linear`` (MGVI CG for all pairs), ``curve``
  (geoVI Newton-CG for all samples), ``minimize`` (KL Newton-CG), and the bare
  ``kl_metric`` (``jax.jit``), for ``Vmap()`` (chunk 1) and
  ``Vmap(chunk_size=None)``.
- NIFTy.re (``benchmarks/.venv-nifty``): ``draw_linear_residual`` with
  ``static_cg`` and ``nonlinearly_update_residual`` with ``_static_newton_cg``
  (one sample: NIFTy.re's ``lmap`` calls them sample by sample), and the KL
  pieces its Python Newton-CG calls: ``_kl_vg`` and ``_kl_met`` for
  ``kl_map`` = ``vmap`` and ``smap``.
"""

from __future__ import annotations

import argparse
import importlib
import json
import os
import sys
import time

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import _common as C


def _analyse(lowered_fn):
    t = time.perf_counter()
    compiled = lowered_fn().compile()
    dt = time.perf_counter() - t
    m = compiled.memory_analysis()
    return dict(
        compile_s=dt,
        temp_bytes=int(m.temp_size_in_bytes),
        args_bytes=int(m.argument_size_in_bytes),
        out_bytes=int(m.output_size_in_bytes),
    )


def child_shardvi(args, problem):
    import jax
    import jax.numpy as jnp

    sv = C.import_shardvi()
    from shardvi.vi.kl import kl_metric

    lh = problem.shardvi_likelihood()
    lin = sv.CGConfig(tol=None, maxiter=10)
    newton = sv.NewtonCGConfig(xtol=None, maxiter=2, cg=sv.CGConfig(tol=0.5, maxiter=10))
    n = args.pairs
    pos = problem.position
    res = jax.tree.map(lambda x: jnp.stack([0.1 * x] * (2 * n)), pos)
    keys = jax.random.split(jax.random.PRNGKey(0), n)
    out = []
    for name, strategy in (("vmap", sv.parallel.Vmap()), ("vmap-all", sv.parallel.Vmap(chunk_size=None))):
        opt = sv.OptimizeVI(
            lh,
            1,
            n_samples=n,
            sample_map=strategy,
            kl_map=strategy,
            linear_sampling=lin,
            nonlinear_update=newton,
            kl_minimization=newton,
        )
        steps = (
            ("draw_linear", lambda: opt._draw_linear.lower(pos, keys, config=lin)),
            ("curve", lambda: opt._curve.lower(pos, res, jnp.repeat(keys, 2, axis=0), opt._signs(n), config=newton)),
            ("minimize", lambda: opt._minimize.lower(pos, res, config=newton)),
            ("kl_metric", lambda: jax.jit(lambda p, r, t: kl_metric(lh, p, r, t, strategy)).lower(pos, res, pos)),
        )
        for step, lower in steps:
            out.append(dict(engine="shardvi", config=name, step=step, **_analyse(lower)))
    return out


def child_nifty(args, problem):
    import jax
    import jax.numpy as jnp
    import nifty.re as jft
    from nifty.re import evi

    okl = importlib.import_module("nifty.re.optimize_kl")  # the module (nifty.re re-exports a function of that name)
    call, std = problem.call, problem.noise_std
    model = jft.Model(lambda x: call(x.tree if isinstance(x, jft.Vector) else x), domain=jft.Vector(problem.domain))
    lh = jft.Gaussian(problem.data, noise_cov_inv=lambda r: r / std**2, noise_std_inv=lambda r: r / std).amend(model)
    n = args.pairs
    pos = jft.Vector(problem.position)
    res = jft.Vector(jax.tree.map(lambda x: jnp.stack([0.1 * x] * (2 * n)), problem.position))
    samples = jft.Samples(pos=pos, samples=res, keys=None)
    key = jax.random.PRNGKey(0)
    out = []
    draw = jax.jit(evi.draw_linear_residual, static_argnames=("jit_metric", "cg", "cg_name", "cg_kwargs"))
    out.append(
        dict(
            engine="nifty",
            config="jit (1 sample)",
            step="draw_linear_residual",
            **_analyse(lambda: draw.lower(lh, pos, key, cg=jft.conjugate_gradient.static_cg, cg_kwargs=None)),
        )
    )
    curve = jax.jit(evi.nonlinearly_update_residual, static_argnames=("minimize", "jit_residual_funcs"))
    mk = dict(maxiter=2, cg_kwargs=dict(maxiter=10))
    out.append(
        dict(
            engine="nifty",
            config="jit (1 sample)",
            step="nonlinearly_update_residual",
            **_analyse(
                lambda: curve.lower(
                    lh,
                    pos,
                    jax.tree.map(lambda x: x[0], res),
                    key,
                    1.0,
                    minimize=jft.optimize._static_newton_cg,
                    minimize_kwargs=mk,
                )
            ),
        )
    )
    for kl_map in ("vmap", "smap"):
        vg = jax.jit(okl._kl_vg, static_argnames=("map", "reduce", "named_sharding"))
        met = jax.jit(okl._kl_met, static_argnames=("map", "reduce", "named_sharding", "named_sharding_rep"))
        out.append(
            dict(
                engine="nifty", config=kl_map, step="_kl_vg", **_analyse(lambda: vg.lower(lh, pos, samples, map=kl_map))
            )
        )
        out.append(
            dict(
                engine="nifty",
                config=kl_map,
                step="_kl_met",
                **_analyse(lambda: met.lower(lh, pos, pos, samples, map=kl_map)),
            )
        )
    return out


def child_main(args):
    C.setup_jax()
    problem = C.Problem((args.size, args.size), model=args.model)
    recs = (child_shardvi if args.engine == "shardvi" else child_nifty)(args, problem)
    vec = 8 * problem.n_latent
    for r in recs:
        r.update(
            size=args.size,
            n_latent=problem.n_latent,
            n_samples=2 * args.pairs,
            temp_vectors=r["temp_bytes"] / vec,
            args_vectors=r["args_bytes"] / vec,
            out_vectors=r["out_bytes"] / vec,
        )
    print(json.dumps(dict(records=recs)), flush=True)


def main(argv=None):
    ap = argparse.ArgumentParser(
        description=__doc__.splitlines()[0], formatter_class=argparse.RawDescriptionHelpFormatter
    )
    ap.add_argument("--size", type=int, default=1024, help="N (N x N pixels)")
    ap.add_argument("--pairs", type=int, default=4, help="antithetic sample pairs")
    ap.add_argument("--model", choices=("cf", "pointwise"), default="cf")
    ap.add_argument("--no-nifty", action="store_true", help="shardvi only")
    ap.add_argument("--nifty-python", default=None, help="interpreter with nifty installed (default: make the venv)")
    ap.add_argument("--timeout", type=float, default=1200)
    ap.add_argument("--smoke", action="store_true", help="16 x 16 pointwise model, shardvi only")
    ap.add_argument("--json", default=None)
    ap.add_argument("--child", action="store_true", help=argparse.SUPPRESS)
    ap.add_argument("--engine", help=argparse.SUPPRESS)
    args = ap.parse_args(argv)
    if args.child:
        return child_main(args)
    if args.smoke:
        args.size, args.pairs, args.model, args.no_nifty = 16, 1, "pointwise", True
    engines = [("shardvi", sys.executable)]
    skip = None
    if not args.no_nifty:
        from bench_nifty import nifty_python

        py, skip = nifty_python(args)
        if py is None:
            print(f"skipped: NIFTy.re ({skip}); measuring shardvi only", flush=True)
        else:
            engines.append(("nifty", py))
    script = os.path.abspath(__file__)
    records, errors = [], []
    for engine, py in engines:
        out = C.run_child(
            py,
            script,
            [
                "--child",
                "--engine",
                engine,
                "--size",
                str(args.size),
                "--pairs",
                str(args.pairs),
                "--model",
                args.model,
            ],
            timeout=args.timeout,
        )
        if "error" in out:
            errors.append(dict(engine=engine, error=out["error"]))
            print(f"{engine}: {out['error'][-600:]}", file=sys.stderr)
            continue
        records += out["records"]
    meta = dict(
        C.machine_meta(),
        size=args.size,
        pairs=args.pairs,
        model=args.model,
        nifty_skipped=skip,
        command=" ".join([os.path.relpath(script, C.ROOT)] + list(argv if argv is not None else sys.argv[1:])),
    )
    C.write_json(args.json, dict(meta=meta, records=records, errors=errors))
    print(
        f"\nXLA memory analysis of the compiled steps, {args.size}x{args.size} {args.model}, {2 * args.pairs} "
        f"samples; 'vec' = one latent vector ({8 * records[0]['n_latent'] / 2**20:.1f} MiB)\n"
        if records
        else ""
    )
    header = ["engine", "config", "step", "temp MiB", "temp vec", "args vec", "out vec", "compile s"]
    rows = [
        [
            r["engine"],
            r["config"],
            r["step"],
            C.fmt(r["temp_bytes"] / 2**20, ".1f"),
            C.fmt(r["temp_vectors"], ".1f"),
            C.fmt(r["args_vectors"], ".1f"),
            C.fmt(r["out_vectors"], ".1f"),
            C.fmt(r["compile_s"], ".1f"),
        ]
        for r in records
    ]
    print(C.markdown_table(header, rows, align="lll" + "r" * 5))
    return 1 if errors else 0


if __name__ == "__main__":
    sys.exit(main())
