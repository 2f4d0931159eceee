"""Posterior accuracy of MGVI and geoVI against long NUTS runs (reference posteriors).

    bash benchmarks/setup_nuts_venv.sh                                   # once: numpyro + shardvi
    benchmarks/.venv-nuts/bin/python benchmarks/bench_accuracy.py --reference   # NUTS references (~10 min)
    .venv/bin/python benchmarks/bench_accuracy.py                        # shardvi at 8/32/128 pairs
    .venv/bin/python benchmarks/bench_accuracy.py --problems noise_gauss --pairs 32

The problems are defined in ``benchmarks/accuracy_problems.py``. ``--reference`` runs numpyro's
NUTS (``--chains`` chains of ``--draws`` draws after ``--warmup`` warmup steps; target acceptance
``--target-accept``) on ``sv.vi.hamiltonian`` of each problem and writes the posterior mean, standard deviation,
Monte-Carlo standard error (``std / sqrt(ESS)``), the smallest bulk ESS, the largest split R-hat
and the divergences of every reported quantity to ``--reference-file`` (default
``benchmarks/results/accuracy_reference.json``).

The VI runs use ``optimize_kl`` from the problem's starting position with ``n_samples`` pairs,
``--iterations`` global iterations, the first ``--linear-iterations`` of them MGVI
(``linear_resample``) and the rest geoVI (``nonlinear_resample``) for the geoVI rows, MGVI
throughout for the MGVI rows, and the library's default solver settings. For every quantity:

- ``mean err``: ``|m_VI - m_ref| / sd_ref`` (the median over a quantity's entries for arrays),
- ``std ratio``: ``sd_VI / sd_ref`` (likewise the median),

and the wall time of the ``optimize_kl`` call (compilation included). The JSON (``--json``)
holds every entry's values; the markdown table is printed.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import time

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, HERE)
RESULTS = os.path.join(HERE, "results")
REFERENCE = os.path.join(RESULTS, "accuracy_reference.json")


def log(msg):
    print(msg, file=sys.stderr, flush=True)


def _flat_quantities(problem, unravel):
    import jax
    import jax.numpy as jnp

    def q(flat):
        return {k: jnp.ravel(v) for k, v in problem.quantities(unravel(flat)).items()}

    return jax.jit(jax.vmap(q))


def nuts_reference(name, args) -> dict:
    """NUTS on ``name``'s posterior: per quantity ``mean``, ``std``, ``mcse`` and the chain diagnostics."""
    import accuracy_problems
    import jax
    import numpy as np
    from jax.flatten_util import ravel_pytree
    from numpyro.diagnostics import effective_sample_size, split_gelman_rubin
    from numpyro.infer.hmc import hmc

    import shardvi as sv

    problem = accuracy_problems.make(name)
    flat0, unravel = ravel_pytree(problem.xi_true)
    coords = (args.nuts_coordinates == "problem" and problem.nuts_coordinates) or (lambda z: (z, 0.0))

    def potential(lh, f):
        xi, log_det = coords(unravel(f))
        return sv.vi.hamiltonian(lh, xi) - log_det

    init_kernel, sample_kernel = hmc(potential_fn_gen=lambda lh: lambda f: potential(lh, f), algo="NUTS")

    def chain(lh, key, z0):
        state = init_kernel(
            z0, args.warmup, target_accept_prob=args.target_accept, max_tree_depth=10, model_args=(lh,), rng_key=key
        )
        state, _ = jax.lax.scan(lambda s, _: (sample_kernel(s, model_args=(lh,)), None), state, None, args.warmup)

        def draw(s, _):
            s = sample_kernel(s, model_args=(lh,))
            return s, (s.z, s.diverging)

        return jax.lax.scan(draw, state, None, args.draws)[1]

    key = jax.random.PRNGKey(2026)
    z0 = 0.1 * jax.random.normal(key, (args.chains, flat0.size), flat0.dtype)
    t0 = time.perf_counter()
    z, div = jax.block_until_ready(
        jax.jit(jax.vmap(chain, in_axes=(None, 0, 0)))(problem.lh, jax.random.split(key, args.chains), z0)
    )
    wall = time.perf_counter() - t0
    to_latent = lambda f: ravel_pytree(coords(unravel(f))[0])[0]  # noqa: E731
    qs = _flat_quantities(problem, unravel)(jax.jit(jax.vmap(to_latent))(z.reshape(-1, flat0.size)))
    out = {"wall_s": wall, "draws": int(z.shape[0] * z.shape[1]), "divergences": int(np.sum(div)), "q": {}}
    for k, v in qs.items():
        v = np.asarray(v).reshape(args.chains, args.draws, -1)
        ess = np.asarray(effective_sample_size(v))
        flat = v.reshape(-1, v.shape[-1])
        out["q"][k] = {
            "mean": flat.mean(0).tolist(),
            "std": flat.std(0, ddof=1).tolist(),
            "mcse": (flat.std(0, ddof=1) / np.sqrt(ess)).tolist(),
            "ess_min": float(ess.min()),
            "rhat_max": float(np.max(np.asarray(split_gelman_rubin(v)))),
        }
    log(
        f"  NUTS {name}: {wall:.1f} s, {out['divergences']} divergences, min ESS "
        f"{min(q['ess_min'] for q in out['q'].values()):.0f}"
    )
    return out


def vi_run(name, method, pairs, args, seed=0) -> dict:
    """``optimize_kl`` on ``name``: per quantity the sample ``mean`` and ``std``, and the wall time."""
    import accuracy_problems
    import jax
    import numpy as np

    import shardvi as sv

    problem = accuracy_problems.make(name)
    linear = args.iterations if method == "MGVI" else args.linear_iterations
    t0 = time.perf_counter()
    samples, _ = sv.optimize_kl(
        problem.lh,
        problem.pos0,
        key=jax.random.PRNGKey(seed),
        n_total_iterations=args.iterations,
        n_samples=pairs,
        sample_mode=lambda i: "linear_resample" if i < linear else "nonlinear_resample",
        progress=False,
        **solver_settings(args),
    )
    wall = time.perf_counter() - t0
    mean, std = samples.mean_and_std(problem.quantities)
    return {
        "wall_s": wall,
        "q": {k: {"mean": np.ravel(mean[k]).tolist(), "std": np.ravel(std[k]).tolist()} for k in mean},
    }


def solver_settings(args) -> dict:
    """The solver configs that ``--geovi-maxiter`` / ``--kl-maxiter`` change (else the library's defaults)."""
    import shardvi as sv

    out = {}
    if args.geovi_maxiter is not None:
        out["nonlinear_update"] = sv.NewtonCGConfig(xtol=1e-6, maxiter=args.geovi_maxiter)
    if args.kl_maxiter is not None:
        out["kl_minimization"] = sv.NewtonCGConfig(xtol=1e-6, maxiter=args.kl_maxiter)
    return out


def score(run: dict, ref: dict) -> dict:
    """Per quantity: the median over entries of ``|m - m_ref|/sd_ref`` and of ``sd/sd_ref``."""
    import numpy as np

    out = {}
    for k, r in ref["q"].items():
        m, s = np.asarray(run["q"][k]["mean"]), np.asarray(run["q"][k]["std"])
        rm, rs = np.asarray(r["mean"]), np.asarray(r["std"])
        out[k] = {"mean_err": float(np.median(np.abs(m - rm) / rs)), "std_ratio": float(np.median(s / rs))}
    return out


def table(rows) -> str:
    lines = ["| problem | method | pairs | quantity | mean err (ref sd) | std ratio | time s |", "|---" * 7 + "|"]
    for r in rows:
        for k, v in r["score"].items():
            lines.append(
                f"| {r['problem']} | {r['method']} | {r['pairs']} | {k} | {v['mean_err']:.3f} | "
                f"{v['std_ratio']:.3f} | {r['wall_s']:.1f} |"
            )
    return "\n".join(lines)


def parse(argv=None):
    import accuracy_problems

    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--problems", default=",".join(accuracy_problems.PROBLEMS))
    p.add_argument("--pairs", default="8,32,128")
    p.add_argument("--methods", default="MGVI,geoVI")
    p.add_argument("--iterations", type=int, default=10)
    p.add_argument("--linear-iterations", type=int, default=2)
    p.add_argument("--geovi-maxiter", type=int, default=None, help="geoVI Newton steps (default: the library's)")
    p.add_argument("--kl-maxiter", type=int, default=None, help="KL Newton steps (default: the library's)")
    p.add_argument("--reference", action="store_true", help="run NUTS and write --reference-file")
    p.add_argument("--reference-file", default=REFERENCE)
    p.add_argument("--chains", type=int, default=4)
    p.add_argument("--warmup", type=int, default=2000)
    p.add_argument("--draws", type=int, default=12500)
    p.add_argument("--target-accept", type=float, default=0.99)
    p.add_argument(
        "--nuts-coordinates",
        choices=("problem", "latent"),
        default="problem",
        help="NUTS in the problem's own reference parametrization (if any) or in the latent space",
    )
    p.add_argument("--json", default=os.path.join(RESULTS, "accuracy.json"))
    return p.parse_args(argv)


def main(argv=None):
    args = parse(argv)
    import jax

    jax.config.update("jax_enable_x64", True)
    names = [n for n in args.problems.split(",") if n]
    if args.reference:
        refs = {}
        if os.path.exists(args.reference_file):
            with open(args.reference_file) as f:
                refs = json.load(f)
        for name in names:
            refs[name] = nuts_reference(name, args)
            refs[name]["settings"] = {"chains": args.chains, "warmup": args.warmup, "draws": args.draws}
            with open(args.reference_file, "w") as f:
                json.dump(refs, f, indent=1)
        return 0
    with open(args.reference_file) as f:
        refs = json.load(f)
    rows = []
    for name in names:
        for method in args.methods.split(","):
            for pairs in (int(p) for p in args.pairs.split(",")):
                run = vi_run(name, method, pairs, args)
                rows.append(
                    {
                        "problem": name,
                        "method": method,
                        "pairs": pairs,
                        "wall_s": run["wall_s"],
                        "score": score(run, refs[name]),
                        "run": run,
                    }
                )
                log(f"  {name} {method} {pairs}: {rows[-1]['score']}")
    print(table(rows))
    with open(args.json, "w") as f:
        json.dump({"settings": vars(args), "rows": rows}, f, indent=1)
    return 0


if __name__ == "__main__":
    sys.exit(main())
