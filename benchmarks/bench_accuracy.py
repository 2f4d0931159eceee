"""Posterior accuracy of MGVI and geoVI (shardvi and NIFTy.re) against long NUTS runs.

    bash benchmarks/setup_nuts_venv.sh                                   # once: numpyro + shardvi
    bash benchmarks/setup_nifty_venv.sh                                  # once: NIFTy.re + shardvi
    benchmarks/.venv-nuts/bin/python benchmarks/bench_accuracy.py --reference   # NUTS references (~17 min)
    .venv/bin/python benchmarks/bench_accuracy.py                        # both engines at 8/32/128 pairs
    .venv/bin/python benchmarks/bench_accuracy.py --problems funnel --pairs 32 --engines shardvi
    .venv/bin/python benchmarks/bench_accuracy.py --plot-only            # the figure from --json
    .venv/bin/python benchmarks/bench_accuracy.py --engines shardvi --shardvi-settings defaults \
        --json benchmarks/results/accuracy_defaults.json                 # shardvi with its default solvers

On 2 cores the NUTS references take about 17 minutes (``gp_poisson`` 11 of them) and the full VI
run about an hour, most of it ``gp_poisson`` (minutes per run: its model differentiates a
Cholesky factorization) and NIFTy.re's geoVI at 128 pairs; ``--problems`` / ``--pairs`` /
``--engines`` select a part, ``--update`` adds it to an existing ``--json``.

The problems are defined in ``benchmarks/accuracy_problems.py``. ``--reference`` runs numpyro's
NUTS (``--chains`` chains of ``--draws`` draws after ``--warmup`` warmup steps; target acceptance
``--target-accept``) on ``sv.vi.hamiltonian`` of each problem (in the problem's
``nuts_coordinates`` where it has them) and writes the posterior mean, standard deviation,
Monte-Carlo standard error (``std / sqrt(ESS)``), the smallest bulk ESS, the largest split R-hat
and the divergences of every reported quantity to ``--reference-file`` (default
``benchmarks/results/accuracy_reference.json``); for ``noise_gauss`` (quadrature) and ``linear``
(Wiener filter) it also records the reference against the exact moments (``exact_check``;
``--check-exact`` does only that, for stored references).

Every VI run is one fresh child process (shardvi in this interpreter, NIFTy.re in
``--nifty-python``, default ``benchmarks/.venv-nifty/bin/python``) that calls the engine's
``optimize_kl`` once and prints the posterior mean and standard deviation of the problem's
quantities over the final samples (both engines: the same function on the stacked samples,
``ddof=1``). Both engines get the same likelihood (NIFTy.re: ``jft.Model`` around the problem's
own forward-model callable and ``jft.Gaussian`` / ``jft.Poissonian`` /
``jft.VariableCovarianceGaussian`` / ``jft.VariableCovarianceStudentT`` on its data; NIFTy's
variable-covariance Gaussian takes ``(mean, 1/std)``, so the callable's ``std`` is inverted in
the wrapper), the same start position (the problem's ``start``: ``pos0`` except for the noise
problems, whose ``pos0`` sits in the neck of the funnel between the innovation scale and the
path; ``--start pos0`` starts there), ``n_samples`` antithetic pairs,
``--iterations`` global iterations, the first ``--linear-iterations`` of them MGVI
(``linear_resample``) and the rest geoVI (``nonlinear_resample``) for the geoVI rows, MGVI
throughout for the MGVI rows, and matched solver settings (as ``bench_nifty.py``; ``K`` =
``--geovi-maxiter``, ``L`` = ``--kl-maxiter``; ``--shardvi-settings defaults`` runs shardvi
with the library's default solvers instead and records its ``sv.ConvergenceWarning`` messages):

- sampling CG: relative residual ``|r|_2 <= 1e-6 |b|_2`` (``--cg-tol``), 6 to 500 iterations
  (shardvi ``CGConfig(tol, miniter=6, maxiter=500)``, NIFTy ``cg_kwargs=dict(tol, miniter=6,
  maxiter=500)``, whose fallback rule is the same relative L2 residual);
- geoVI Newton-CG: ``xtol = 0``, i.e. exactly ``K`` Newton steps per sample in both engines
  (their ``xtol`` rules measure different things, see ``bench_nifty.py``); inner CG from 6 to 200
  iterations with the Eisenstat-Walker residual rule and NIFTy's energy rule
  (``energy_reduction_factor=0.1``, given to shardvi too);
- KL Newton-CG: likewise ``xtol = 0`` and exactly ``L`` Newton steps per global iteration
  (a step that cannot lower the energy ends the minimization early in both).

NIFTy.re runs with its jitted sampling solvers (``linear_minimizer_jit=True``,
``nonlinear_minimizer_jit=True``, ``cg=static_cg``, ``minimize=_static_newton_cg``,
``residual_map="vmap"``; ``--nifty-config default`` runs its Python-loop solvers instead).
Random numbers: both engines get ``key=PRNGKey(--seed)`` and derive the per-iteration, per-pair
and data-/prior-space keys in the same way (shardvi follows NIFTy.re's splitting), so both draw
the same white noise: where the solvers converge, the two engines' MGVI samples coincide to
rounding, and differences between the engines come from their solvers and, for geoVI, from the
coordinate transformation, not from different random draws (NIFTy.re's
``VariableCovarianceGaussian`` sees ``1/std``; shardvi's metric square root carries the matching
sign, so the draws agree there too).
NIFTy.re's ``VariableCovarianceStudentT`` has no ``transformation`` (nifty 9.2.0), so its geoVI
on ``noise_student`` raises ``NotImplementedError``: those rows are recorded as unsupported.
Both engines' ``VariableCovarianceGaussian`` geoVI coordinates are the residual map
(NIFTy.re: ``(std_inv (mean - d), log std_inv)``; shardvi: ``((mean - d)/std, log std)``, the same
Gram matrix); the geoVI rows differ by the engines' nonlinear solves.

Scores, for every quantity (``score``):

- ``mean err``: ``|m_VI - m_ref| / sd_ref`` (the median over a quantity's entries for arrays),
- ``std ratio``: ``sd_VI / sd_ref`` (likewise the median),

and per run the worst quantity (largest mean error; std ratio furthest from 1 in log). ``time``
is the wall time of the ``optimize_kl`` call in a fresh process (tracing and compilation
included). The JSON (``--json``) holds every run's values and per-quantity scores; the markdown
table is printed and ``--png`` drawn (``--no-plot``: not drawn).
"""

from __future__ import annotations

import argparse
import json
import math
import os
import sys
import time

HERE = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.dirname(HERE)
sys.path.insert(0, HERE)
RESULTS = os.path.join(HERE, "results")
REFERENCE = os.path.join(RESULTS, "accuracy_reference.json")
NIFTY_PYTHON = os.path.join(HERE, ".venv-nifty", "bin", "python")
ENGINES = ("shardvi", "nifty")
#: the options that define a VI run (``--update`` adds only to a JSON made with the same ones)
RUN_SETTINGS = (
    "iterations",
    "linear_iterations",
    "geovi_maxiter",
    "kl_maxiter",
    "cg_tol",
    "seed",
    "nifty_config",
    "start",
    "shardvi_settings",
)
#: NIFTy's inner-CG energy rule of its Newton-CG (``energy_reduction_factor``), given to shardvi too
ENERGY_RULE = 0.1


def log(msg):
    print(msg, file=sys.stderr, flush=True)


def _flat_quantities(problem, unravel):
    import jax
    import jax.numpy as jnp

    def q(flat):
        return {k: jnp.ravel(v) for k, v in problem.quantities(unravel(flat)).items()}

    return jax.jit(jax.vmap(q))


# ================================================================================================ NUTS
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
            return s, (s.z, s.diverging, s.num_steps)

        return jax.lax.scan(draw, state, None, args.draws)[1]

    key = jax.random.PRNGKey(2026)
    z0 = 0.1 * jax.random.normal(key, (args.chains, flat0.size), flat0.dtype)
    t0 = time.perf_counter()
    z, div, steps = jax.block_until_ready(
        jax.jit(jax.vmap(chain, in_axes=(None, 0, 0)))(problem.lh, jax.random.split(key, args.chains), z0)
    )
    wall = time.perf_counter() - t0
    to_latent = lambda f: ravel_pytree(coords(unravel(f))[0])[0]  # noqa: E731
    qs = _flat_quantities(problem, unravel)(jax.jit(jax.vmap(to_latent))(z.reshape(-1, flat0.size)))
    out = {
        "wall_s": wall,
        "draws": int(z.shape[0] * z.shape[1]),
        "divergences": int(np.sum(div)),
        "mean_leapfrog_steps": float(np.mean(steps)),
        "coordinates": "problem" if coords is problem.nuts_coordinates else "latent",
        "q": {},
    }
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
        f"{min(q['ess_min'] for q in out['q'].values()):.0f}, max R-hat "
        f"{max(q['rhat_max'] for q in out['q'].values()):.4f}, {out['mean_leapfrog_steps']:.1f} leapfrog steps/draw"
    )
    return out


def exact_check(name, ref) -> dict | None:
    """The NUTS reference against exact moments, where a problem has them (``None`` otherwise).

    ``noise_gauss``: quadrature over the two scales (``accuracy_problems.brownian_quadrature``);
    ``linear``: the Wiener filter (``accuracy_problems.wiener_exact``). Per quantity the largest
    ``|m_NUTS - m_exact| / mcse`` and ``/ sd_exact`` and the range of ``sd_NUTS / sd_exact``.
    """
    import accuracy_problems
    import numpy as np

    exact = {"noise_gauss": accuracy_problems.brownian_quadrature, "linear": accuracy_problems.wiener_exact}.get(name)
    if exact is None:
        return None
    out = {}
    for k, (m, s) in exact(accuracy_problems.make(name)).items():
        r = ref["q"][k]
        m, s = np.ravel(m), np.ravel(s)
        diff = np.abs(np.asarray(r["mean"]) - m)
        ratio = np.asarray(r["std"]) / s
        out[k] = {
            "max_mean_err_mcse": float(np.max(diff / np.asarray(r["mcse"]))),
            "max_mean_err_sd": float(np.max(diff / s)),
            "std_ratio_min": float(ratio.min()),
            "std_ratio_max": float(ratio.max()),
        }
    log(f"  {name} against its exact moments: {out}")
    return out


# ================================================================================================ VI child
def _sample_mode(method, args):
    linear = args.iterations if method == "MGVI" else args.linear_iterations
    return lambda i: "linear_resample" if i < linear else "nonlinear_resample"


def start_position(problem, args):
    """The VI start: the problem's ``start`` (``pos0`` where it has none), or ``pos0`` with ``--start pos0``."""
    return problem.pos0 if args.start == "pos0" or problem.start is None else problem.start


def matched_solvers(geovi_maxiter=20, kl_maxiter=10, cg_tol=1e-6) -> dict:
    """shardvi's solver settings matched with NIFTy.re's (the module docstring), as ``optimize_kl`` keywords."""
    import shardvi as sv

    inner = sv.CGConfig(tol=0.5, miniter=6, maxiter=200)
    return dict(
        linear_sampling=sv.CGConfig(tol=cg_tol, miniter=6, maxiter=500),
        nonlinear_update=sv.NewtonCGConfig(
            xtol=0.0, maxiter=geovi_maxiter, cg=inner, energy_reduction_factor=ENERGY_RULE
        ),
        kl_minimization=sv.NewtonCGConfig(xtol=0.0, maxiter=kl_maxiter, cg=inner, energy_reduction_factor=ENERGY_RULE),
    )


def shardvi_run(problem, method, pairs, args):
    """shardvi's ``optimize_kl`` with the matched settings: ``(stacked samples, wall seconds, solver info)``."""
    import warnings

    import jax

    import shardvi as sv

    solvers = matched_solvers(args.geovi_maxiter, args.kl_maxiter, args.cg_tol)
    if args.shardvi_settings == "defaults":  # the library's solver settings (what a user gets without choosing)
        solvers = {}
    t0 = time.perf_counter()
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always", sv.ConvergenceWarning)
        samples, state = sv.optimize_kl(
            problem.lh,
            start_position(problem, args),
            key=jax.random.PRNGKey(args.seed),
            n_total_iterations=args.iterations,
            n_samples=pairs,
            sample_mode=_sample_mode(method, args),
            progress=False,
            **solvers,
        )
        stacked = jax.block_until_ready(samples.samples)
    wall = time.perf_counter() - t0
    last = state.history[-1]
    # the last iteration's per-sample geoVI Newton statuses (1: step cap, as xtol = 0; others: see
    # shardvi.minimizers.status_message) and the KL minimization's status
    info = {
        "geovi_status": [int(x) for x in (last.nonlinear_status or [])],
        "kl_status": sv.minimizers.status_message(last.kl_status),
        "convergence_warnings": [str(w.message).split(":")[0] for w in caught if w.category is sv.ConvergenceWarning],
    }
    return stacked, wall, info


def nifty_likelihood(problem):
    """NIFTy.re's likelihood of ``problem``: its data, its forward-model callable in ``jft.Model``."""
    import nifty.re as jft
    import numpy as np

    lh, call = problem.lh.likelihood, problem.lh.model.call
    kind = type(lh).__name__
    if kind == "Gaussian":
        std = np.asarray(lh.noise_std)
        nlh = jft.Gaussian(np.asarray(lh.data), noise_cov_inv=lambda r: r / std**2, noise_std_inv=lambda r: r / std)
        forward = call
    elif kind == "Poisson":
        nlh = jft.Poissonian(np.rint(np.asarray(lh.counts)).astype(np.int64))
        forward = call
    elif kind == "VariableCovarianceGaussian":  # NIFTy: (mean, 1/std)
        nlh = jft.VariableCovarianceGaussian(np.asarray(lh.data))

        def forward(xi):
            mean, std = call(xi)
            return mean, 1.0 / std

    elif kind == "VariableCovarianceStudentT":  # NIFTy: (mean, std), as shardvi
        nlh = jft.VariableCovarianceStudentT(np.asarray(lh.data), np.asarray(lh.dof))

        def forward(xi):
            return tuple(call(xi))

    else:
        raise NotImplementedError(f"no NIFTy.re counterpart of {kind}")
    domain = jft.Vector(problem.lh.model.domain)
    model = jft.Model(lambda x: forward(x.tree if isinstance(x, jft.Vector) else x), domain=domain)
    return nlh.amend(model)


def nifty_run(problem, method, pairs, args):
    """NIFTy.re's ``optimize_kl`` with the matched settings: ``(stacked samples, wall seconds, {})``."""
    import logging

    import jax
    import nifty.re as jft

    logging.getLogger("NIFTy.RE").setLevel(logging.ERROR)
    lh = nifty_likelihood(problem)
    draw = dict(cg_name=None, cg_kwargs=dict(tol=args.cg_tol, miniter=6, maxiter=500))
    inner = dict(name=None, miniter=6, maxiter=200)
    curve = dict(minimize_kwargs=dict(name=None, xtol=0.0, maxiter=args.geovi_maxiter, cg_kwargs=inner))
    kl = dict(minimize_kwargs=dict(name=None, xtol=0.0, maxiter=args.kl_maxiter, cg_kwargs=inner))
    kw = {}
    if args.nifty_config != "default":
        kw = dict(linear_minimizer_jit=True, nonlinear_minimizer_jit=True, residual_map=args.nifty_config.split("-")[1])
        draw["cg"] = jft.conjugate_gradient.static_cg
        curve["minimize"] = jft.optimize._static_newton_cg
    t0 = time.perf_counter()
    samples, _ = jft.optimize_kl(
        lh,
        jft.Vector(start_position(problem, args)),
        key=jax.random.PRNGKey(args.seed),
        n_total_iterations=args.iterations,
        n_samples=pairs,
        sample_mode=_sample_mode(method, args),
        draw_linear_kwargs=draw,
        nonlinearly_update_kwargs=curve,
        kl_kwargs=kl,
        **kw,
    )
    stacked = jax.block_until_ready(samples.samples.tree)
    return stacked, time.perf_counter() - t0, {}


def posterior_moments(problem, stacked) -> dict:
    """Mean, std (``ddof=1``), min and max over the stacked samples of every quantity, and the mean Hamiltonian."""
    import jax
    import numpy as np

    import shardvi as sv

    qs = jax.jit(jax.vmap(problem.quantities))(stacked)
    energy = jax.jit(jax.vmap(lambda xi: sv.vi.hamiltonian(problem.lh, xi)))(stacked)
    return {
        "mean_hamiltonian": float(np.mean(energy)),
        "q": {
            k: {
                "mean": np.ravel(np.mean(v, 0)).tolist(),
                "std": np.ravel(np.std(v, 0, ddof=1)).tolist(),
                "min": np.ravel(np.min(v, 0)).tolist(),
                "max": np.ravel(np.max(v, 0)).tolist(),
            }
            for k, v in qs.items()
        },
    }


def child_main(args):
    os.environ.setdefault("JAX_PLATFORMS", "cpu")
    import jax

    jax.config.update("jax_enable_x64", True)
    if ROOT not in sys.path:
        sys.path.append(ROOT)
    import accuracy_problems

    problem = accuracy_problems.make(args.problem)
    run = shardvi_run if args.engine == "shardvi" else nifty_run
    try:
        stacked, wall, info = run(problem, args.method, args.pairs_one, args)
    except NotImplementedError as err:  # NIFTy.re: no geoVI transformation for this likelihood
        print(json.dumps({"unsupported": f"{type(err).__name__}: {err}"}), flush=True)
        return 0
    print(json.dumps({"wall_s": wall, "n_samples": 2 * args.pairs_one, **info, **posterior_moments(problem, stacked)}))
    return 0


# ================================================================================================ parent
def score(run: dict, ref: dict) -> dict:
    """Per quantity: the median over entries of ``|m - m_ref|/sd_ref`` and of ``sd/sd_ref``."""
    import numpy as np

    out = {}
    for k, r in ref["q"].items():
        m, s = np.asarray(run["q"][k]["mean"]), np.asarray(run["q"][k]["std"])
        rm, rs = np.asarray(r["mean"]), np.asarray(r["std"])
        out[k] = {"mean_err": float(np.median(np.abs(m - rm) / rs)), "std_ratio": float(np.median(s / rs))}
    return out


def worst(sc: dict) -> dict:
    """The worst quantity of a score: the largest mean error, the std ratio furthest from 1 (in log)."""
    q_mean = max(sc, key=lambda k: sc[k]["mean_err"])
    q_std = max(sc, key=lambda k: abs(math.log(sc[k]["std_ratio"])))
    return {
        "mean_err": sc[q_mean]["mean_err"],
        "mean_err_quantity": q_mean,
        "std_ratio": sc[q_std]["std_ratio"],
        "std_ratio_quantity": q_std,
    }


def table(rows) -> str:
    lines = [
        "| problem | method | pairs | engine | mean err (ref sd) | std ratio | time s |",
        "|:---|:---|---:|:---|---:|---:|---:|",
    ]
    for r in rows:
        engine = "NIFTy.re" if r["engine"] == "nifty" else r["engine"]
        if "worst" not in r:
            lines.append(f"| {r['problem']} | {r['method']} | {r['pairs']} | {engine} | - | - | {r['status']} |")
            continue
        w = r["worst"]
        lines.append(
            f"| {r['problem']} | {r['method']} | {r['pairs']} | {engine} | {w['mean_err']:.2f} "
            f"({w['mean_err_quantity']}) | {w['std_ratio']:.2f} ({w['std_ratio_quantity']}) | {r['wall_s']:.1f} |"
        )
    return "\n".join(lines)


def child_args(args, name, method, pairs, engine):
    return [
        "--child",
        "--engine",
        engine,
        "--problem",
        name,
        "--method",
        method,
        "--pairs-one",
        str(pairs),
        "--iterations",
        str(args.iterations),
        "--linear-iterations",
        str(args.linear_iterations),
        "--geovi-maxiter",
        str(args.geovi_maxiter),
        "--kl-maxiter",
        str(args.kl_maxiter),
        "--cg-tol",
        repr(args.cg_tol),
        "--seed",
        str(args.seed),
        "--nifty-config",
        args.nifty_config,
        "--start",
        args.start,
        "--shardvi-settings",
        args.shardvi_settings,
    ]


def plot(data, path):
    """Per problem: geoVI (solid) and MGVI (dashed) worst mean error and |log std ratio| vs pairs."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    rows = [r for r in data["rows"] if "worst" in r]
    problems = list(dict.fromkeys(r["problem"] for r in rows))
    fig, axes = plt.subplots(
        2, len(problems), figsize=(2.4 * len(problems), 5.0), squeeze=False, sharex=True, sharey="row"
    )
    style = {
        "shardvi": dict(color="C0", lw=3.0, alpha=0.55, marker="o", ms=5),
        "nifty": dict(color="C1", lw=1.2, marker="x", ms=6),
    }
    floor = 1e-3  # values below (a std ratio of exactly 1, the exact means of `linear`) are drawn at the floor
    for j, name in enumerate(problems):
        for engine in ENGINES:
            for method, ls in (("geoVI", "-"), ("MGVI", "--")):
                sel = sorted(
                    (r for r in rows if (r["problem"], r["engine"], r["method"]) == (name, engine, method)),
                    key=lambda r: r["pairs"],
                )
                if not sel:
                    continue
                x = [r["pairs"] for r in sel]
                label = f"{'NIFTy.re' if engine == 'nifty' else engine} {method}"
                err = [max(r["worst"]["mean_err"], floor) for r in sel]
                lsr = [max(abs(math.log(r["worst"]["std_ratio"])), floor) for r in sel]
                axes[0, j].plot(x, err, ls=ls, label=label, **style[engine])
                axes[1, j].plot(x, lsr, ls=ls, label=label, **style[engine])
        axes[0, j].set_title(name, fontsize=9)
        axes[1, j].set_xlabel("pairs")
        for ax in axes[:, j]:
            ax.set_xscale("log", base=2)
            ax.set_xticks([8, 32, 128], ["8", "32", "128"])
            ax.set_yscale("log")
            ax.grid(alpha=0.3, which="both")
    axes[0, 0].set_ylim(floor, 30)
    axes[1, 0].set_ylim(floor, 3)
    axes[0, 0].set_ylabel("mean error / ref sd\n(worst quantity)")
    axes[1, 0].set_ylabel("|log std ratio|\n(worst quantity)")
    axes[1, 0].legend(fontsize=7, loc="lower left")
    fig.suptitle("MGVI (dashed) and geoVI (solid) against NUTS: shardvi (thick) and NIFTy.re (thin, x)", fontsize=10)
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    log(f"wrote {path}")


def parse(argv=None):
    import accuracy_problems

    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--problems", default=",".join(accuracy_problems.PROBLEMS))
    p.add_argument("--pairs", default="8,32,128")
    p.add_argument("--methods", default="MGVI,geoVI")
    p.add_argument("--engines", default=",".join(ENGINES), help=f"comma-separated subset of {ENGINES}")
    p.add_argument("--iterations", type=int, default=10)
    p.add_argument("--linear-iterations", type=int, default=2)
    p.add_argument("--geovi-maxiter", type=int, default=20, help="geoVI Newton steps per sample (both engines)")
    p.add_argument("--kl-maxiter", type=int, default=10, help="KL Newton steps per iteration (both engines)")
    p.add_argument("--cg-tol", type=float, default=1e-6, help="sampling CG relative residual (both engines)")
    p.add_argument("--seed", type=int, default=0)
    p.add_argument(
        "--start",
        choices=("problem", "pos0"),
        default="problem",
        help="VI start: the problem's start (away from a funnel's neck) or its pos0",
    )
    p.add_argument(
        "--shardvi-settings",
        choices=("matched", "defaults"),
        default="matched",
        help="shardvi's solvers: the settings matched with NIFTy.re's, or the library's defaults (shardvi only)",
    )
    p.add_argument(
        "--nifty-config",
        choices=("jit-vmap", "jit-lmap", "jit-smap", "default"),
        default="jit-vmap",
        help="NIFTy.re's sampling solvers: jitted with this residual_map, or its Python-loop default",
    )
    p.add_argument("--nifty-python", default=NIFTY_PYTHON, help="interpreter with nifty installed")
    p.add_argument("--timeout", type=float, default=900, help="seconds per child run")
    p.add_argument("--reference", action="store_true", help="run NUTS and write --reference-file")
    p.add_argument("--reference-file", default=REFERENCE)
    p.add_argument(
        "--check-exact",
        action="store_true",
        help="compare the stored NUTS references with the exact moments (noise_gauss, linear) and record it",
    )
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
    p.add_argument("--png", default=os.path.join(RESULTS, "accuracy.png"))
    p.add_argument("--no-plot", action="store_true", help="do not draw --png")
    p.add_argument(
        "--update",
        action="store_true",
        help="add the runs to --json (replacing those of the same problem/method/pairs/engine) instead of a new file",
    )
    p.add_argument("--plot-only", action="store_true", help="draw --png from an existing --json and exit")
    # child mode (internal)
    p.add_argument("--child", action="store_true", help=argparse.SUPPRESS)
    p.add_argument("--engine", choices=ENGINES, help=argparse.SUPPRESS)
    p.add_argument("--problem", help=argparse.SUPPRESS)
    p.add_argument("--method", help=argparse.SUPPRESS)
    p.add_argument("--pairs-one", type=int, help=argparse.SUPPRESS)
    return p.parse_args(argv)


def main(argv=None):
    args = parse(argv)
    if args.child:
        return child_main(args)
    if args.plot_only:
        with open(args.json) as f:
            plot(json.load(f), args.png)
        return 0
    names = [n for n in args.problems.split(",") if n]
    if args.reference or args.check_exact:
        import jax

        jax.config.update("jax_enable_x64", True)
        refs = {}
        if os.path.exists(args.reference_file):
            with open(args.reference_file) as f:
                refs = json.load(f)
        for name in names:
            if args.reference:
                refs[name] = nuts_reference(name, args)
                refs[name]["settings"] = {
                    "chains": args.chains,
                    "warmup": args.warmup,
                    "draws": args.draws,
                    "target_accept": args.target_accept,
                }
            check = exact_check(name, refs[name]) if name in refs else None
            if check is not None:
                refs[name]["exact_check"] = check
            with open(args.reference_file, "w") as f:
                json.dump(refs, f, indent=1)
        return 0
    import _common as C

    with open(args.reference_file) as f:
        refs = json.load(f)
    engines = [e for e in args.engines.split(",") if e]
    for e in engines:
        if e not in ENGINES:
            raise SystemExit(f"unknown engine {e!r}; choose from {ENGINES}")
    if "nifty" in engines and not os.path.exists(args.nifty_python):
        log(f"skipped: NIFTy.re ({args.nifty_python} not found; run benchmarks/setup_nifty_venv.sh)")
        engines.remove("nifty")
    python = {"shardvi": sys.executable, "nifty": args.nifty_python}
    script = os.path.abspath(__file__)
    settings = {k: getattr(args, k) for k in RUN_SETTINGS}
    command = " ".join(["benchmarks/bench_accuracy.py"] + list(argv if argv is not None else sys.argv[1:]))
    data = {"meta": dict(C.machine_meta(), commands=[]), "settings": settings, "rows": []}
    if args.update and os.path.exists(args.json):  # add to / replace rows of an earlier run with the same settings
        with open(args.json) as f:
            data = json.load(f)
        data["settings"].setdefault("shardvi_settings", "matched")  # files written before the option
        if data["settings"] != settings:
            raise SystemExit(f"--update: settings differ from {args.json}'s: {data['settings']} vs {settings}")
    entry = {"command": command, "total_s": None}
    data["meta"]["commands"].append(entry)
    t_all = time.perf_counter()
    for name in names:
        for method in (m for m in args.methods.split(",") if m):
            for pairs in (int(p) for p in args.pairs.split(",") if p):
                for engine in engines:
                    rec = C.run_child(
                        python[engine], script, child_args(args, name, method, pairs, engine), timeout=args.timeout
                    )
                    row = {"problem": name, "method": method, "pairs": pairs, "engine": engine}
                    if "q" in rec:
                        sc = score(rec, refs[name])
                        row.update(wall_s=rec["wall_s"], score=sc, worst=worst(sc), run=rec)
                        log(f"  {name} {method} {pairs} {engine}: {row['worst']} {rec['wall_s']:.1f} s")
                    else:
                        row["status"] = "unsupported" if "unsupported" in rec else "failed"
                        row["error"] = rec.get("unsupported") or rec.get("error")
                        log(f"  {name} {method} {pairs} {engine}: {row['status']}: {str(row['error'])[-400:]}")
                    data["rows"] = sorted(
                        [r for r in data["rows"] if _row_key(r) != _row_key(row)] + [row], key=_row_order
                    )
                    entry["total_s"] = time.perf_counter() - t_all
                    with open(args.json, "w") as f:  # after every run: a long run that stops keeps its rows
                        json.dump(data, f, indent=1)
    print(table(data["rows"]))
    if not args.no_plot:
        plot(data, args.png)
    return 0


def _row_key(r):
    return r["problem"], r["method"], r["pairs"], r["engine"]


def _row_order(r):
    import accuracy_problems

    names = list(accuracy_problems.PROBLEMS)
    return (
        names.index(r["problem"]) if r["problem"] in names else len(names),
        ("MGVI", "geoVI").index(r["method"]) if r["method"] in ("MGVI", "geoVI") else 2,
        r["pairs"],
        ENGINES.index(r["engine"]),
    )


if __name__ == "__main__":
    sys.exit(main())
