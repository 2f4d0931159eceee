"""Do the geoVI updates reach their roots? shardvi's and NIFTy.re's nonlinear solves at one position.

    .venv/bin/python benchmarks/bench_geovi_roots.py                          # shardvi alone
    benchmarks/.venv-nifty/bin/python benchmarks/bench_geovi_roots.py        # and NIFTy.re (same keys)

geoVI draws a sample by solving ``g(pos + r) = g(pos) + sign * y`` for ``r`` (``g`` the geoVI
coordinate map, ``y`` the metric sample): the sample distribution geoVI defines is that of the
roots. This script takes the position of the accuracy benchmark's geoVI run with shardvi's
default solvers (``bench_accuracy.py --shardvi-settings defaults``: ``--problem``, 2 MGVI then
8 geoVI iterations, ``--pairs`` antithetic pairs, seed ``--seed``), draws ``--pairs`` fresh
metric samples there (keys ``split(PRNGKey(seed + 1), pairs)``, both signs: the MGVI residual by
CG to 1e-6, then the geoVI update) and reports for each solver setting:

- ``fun``: ``|delta|^2 / 2`` where the solve ended (0 at a root; median and largest),
- ``roots``: how many updates ended within ``1e-10`` of a root,
- ``steps``: Newton steps (median and largest),
- the spread of the samples' ``--quantity`` (standard deviation over the updates, in reference
  standard deviations from ``results/accuracy_reference.json``) and its largest deviation from
  the reference mean: the width geoVI gives that quantity at this position.

Settings: shardvi's defaults (``nonlinearly_update_residual`` without a config: ``optimize_kl``'s
``nonlinear_update`` default); the accuracy benchmark's matched settings
(exactly 20 Newton steps, inner CG to a relative residual of 0.5 with NIFTy's energy rule) in
shardvi; and, where ``nifty.re`` imports, NIFTy.re's ``_static_newton_cg`` with
``--nifty-steps`` Newton steps (``xtol=1e-12``; its Eisenstat-Walker inner CG, energy rule off),
from the same MGVI residuals (NIFTy.re's own draws with the same keys; their largest difference
from shardvi's is printed). Prints a markdown table and writes ``--json``.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import time

HERE = os.path.dirname(os.path.abspath(__file__))
RESULTS = os.path.join(HERE, "results")
ROOT_TOL = 1e-10


def parse(argv=None):
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--problem", default="noise_gauss")
    p.add_argument("--quantity", default="innov_scale", help="a scalar quantity of the problem")
    p.add_argument("--pairs", type=int, default=32)
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--nifty-steps", default="50,200", help="NIFTy.re Newton steps to try (comma-separated)")
    p.add_argument("--json", default=os.path.join(RESULTS, "geovi_roots.json"))
    return p.parse_args(argv)


def _spread(quantities, name, stacked, ref):
    import jax
    import numpy as np

    v = np.ravel(np.asarray(jax.vmap(lambda x: quantities(x)[name])(stacked)))
    z = (v - np.ravel(ref["mean"])[0]) / np.ravel(ref["std"])[0]
    return float(np.std(z, ddof=1)), float(z[np.argmax(np.abs(z))])


def _summary(name, fun, nit, spread, seconds):
    import numpy as np

    fun, nit = np.asarray(fun, float), np.asarray(nit)
    return {
        "setting": name,
        "fun_median": float(np.median(fun)),
        "fun_max": float(np.max(fun)),
        "roots": int(np.sum(fun <= ROOT_TOL)),
        "n": int(fun.size),
        "steps_median": float(np.median(nit)),
        "steps_max": int(np.max(nit)),
        "spread_sd": spread[0],
        "extreme_sd": spread[1],
        "seconds": seconds,
    }


def main(argv=None):
    args = parse(argv)
    os.environ.setdefault("JAX_PLATFORMS", "cpu")
    import jax
    import jax.numpy as jnp
    import numpy as np

    jax.config.update("jax_enable_x64", True)
    sys.path.insert(0, HERE)
    import accuracy_problems
    import bench_accuracy

    import shardvi as sv

    problem = accuracy_problems.make(args.problem)
    with open(os.path.join(RESULTS, "accuracy_reference.json")) as f:
        ref = json.load(f)[args.problem]["q"][args.quantity]
    start = problem.start if problem.start is not None else problem.pos0
    samples, _ = sv.optimize_kl(
        problem.lh,
        start,
        key=jax.random.PRNGKey(args.seed),
        n_total_iterations=10,
        n_samples=args.pairs,
        sample_mode=lambda i: "linear_resample" if i < 2 else "nonlinear_resample",
        progress=False,
    )
    pos = samples.pos
    keys = jax.random.split(jax.random.PRNGKey(args.seed + 1), args.pairs)
    signs = jnp.array([1.0, -1.0])
    lin = sv.CGConfig(tol=1e-6, maxiter=500)
    lh = problem.lh

    @jax.jit
    def linear(keys):
        return jax.vmap(lambda k: sv.draw_linear_residual(lh, pos, k, lin)[0])(keys)

    residuals = linear(keys)

    def stacked_both(fn):
        """``fn(residual, key, sign) -> (latent sample, fun, nit)`` over every key and both signs."""
        both = jax.vmap(lambda s: jax.vmap(lambda r, k: fn(jax.tree.map(lambda a: s * a, r), k, s))(residuals, keys))
        t0 = time.perf_counter()
        x, fun, nit = jax.block_until_ready(jax.jit(both)(signs))
        flat = jax.tree.map(lambda a: a.reshape(-1, *a.shape[2:]), x)
        return flat, np.ravel(fun), np.ravel(nit), time.perf_counter() - t0

    settings = {
        "shardvi defaults": None,  # what optimize_kl and nonlinearly_update_residual use when given none
        "shardvi, 20 steps, inner CG 0.5 + energy rule (matched)": bench_accuracy.matched_solvers()["nonlinear_update"],
    }
    rows = []
    for name, config in settings.items():

        def update(r, k, s, config=config):
            given = () if config is None else (config,)
            rr, sol = sv.nonlinearly_update_residual(lh, pos, r, k, s, *given)
            return jax.tree.map(jnp.add, pos, rr), sol.fun, sol.nit

        x, fun, nit, secs = stacked_both(update)
        rows.append(_summary(name, fun, nit, _spread(problem.quantities, args.quantity, x, ref), secs))

    extra = {}
    try:
        import nifty.re as jft
    except ImportError:
        jft = None
    if jft is not None:
        import logging
        from importlib.metadata import version

        logging.getLogger("NIFTy.RE").setLevel(logging.ERROR)
        nlh = bench_accuracy.nifty_likelihood(problem)
        npos = jft.Vector(pos)
        n_res = jax.jit(
            jax.vmap(
                lambda k: (
                    jft.draw_linear_residual(
                        nlh, npos, k, cg=jft.conjugate_gradient.static_cg, cg_kwargs=dict(tol=1e-6, maxiter=500)
                    )[0].tree
                )
            )
        )(keys)
        diff = max(float(jnp.max(jnp.abs(a - b))) for a, b in zip(jax.tree.leaves(n_res), jax.tree.leaves(residuals)))
        extra["max_abs_difference_of_the_mgvi_residuals"] = diff
        for steps in [int(s) for s in args.nifty_steps.split(",") if s]:

            def nupdate(r, k, s, steps=steps):
                rr, res = jft.nonlinearly_update_residual(
                    nlh,
                    npos,
                    jft.Vector(r),
                    k,
                    s,
                    minimize=jft.optimize._static_newton_cg,
                    minimize_kwargs=dict(
                        name=None,
                        xtol=1e-12,
                        maxiter=steps,
                        cg_kwargs=dict(name=None, miniter=6, maxiter=500),
                        energy_reduction_factor=None,
                    ),
                )
                return jax.tree.map(jnp.add, pos, rr.tree), res.fun, res.nit

            x, fun, nit, secs = stacked_both(nupdate)
            name = f"NIFTy.re {version('nifty')}, `_static_newton_cg`, up to {steps} steps"
            rows.append(_summary(name, fun, nit, _spread(problem.quantities, args.quantity, x, ref), secs))

    out = {
        "problem": args.problem,
        "quantity": args.quantity,
        "pairs": args.pairs,
        "seed": args.seed,
        "rows": rows,
        **extra,
    }
    print(json.dumps(out))
    print(
        f"\n{args.problem}, {2 * args.pairs} geoVI updates at the position of the defaults run (seed {args.seed}); "
        f"`{args.quantity}` in reference sd"
    )
    print("| setting | at a root | median / largest \\|delta\\|^2/2 | Newton steps med / max | spread | extreme | s |")
    print("|:---|---:|---:|---:|---:|---:|---:|")
    for r in rows:
        print(
            f"| {r['setting']} | {r['roots']} / {r['n']} | {r['fun_median']:.1e} / {r['fun_max']:.1e} | "
            f"{r['steps_median']:.0f} / {r['steps_max']} | {r['spread_sd']:.2f} | {r['extreme_sd']:+.1f} | "
            f"{r['seconds']:.1f} |"
        )
    if "max_abs_difference_of_the_mgvi_residuals" in extra:
        print(f"MGVI residuals, NIFTy.re vs shardvi: largest difference {extra[next(iter(extra))]:.1e}")
    os.makedirs(os.path.dirname(os.path.abspath(args.json)), exist_ok=True)
    with open(args.json, "w") as f:
        json.dump(out, f, indent=1)
    return 0


if __name__ == "__main__":
    sys.exit(main())
