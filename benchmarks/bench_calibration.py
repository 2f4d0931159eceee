"""Calibration: how well do MGVI and geoVI posterior samples cover the truth, against a long NUTS run?

    bash benchmarks/setup_nuts_venv.sh                      # once: benchmarks/.venv-nuts (numpyro + shardvi)
    benchmarks/.venv-nuts/bin/python benchmarks/bench_calibration.py            # full run (~10 min, 2 cores)
    benchmarks/.venv-nuts/bin/python benchmarks/bench_calibration.py --quick    # smoke run (~1 min)

numpyro is not a dependency of shardvi: the script runs in its own venv
(``benchmarks/.venv-nuts``, made by ``benchmarks/setup_nuts_venv.sh``; jax pinned
to the project venv's version). Started with another interpreter that has no
numpyro, it runs that setup script and re-executes itself with the venv's
python; if the venv cannot be made it prints ``skipped: ...`` and exits 0.

Problems (all in shardvi's standardized coordinates, latent ``xi ~ N(0, I)``; the
truth ``xi_true`` is a prior draw, the data a draw given the truth, one
realization per ``--seeds`` entry; the grid, mask and spectrum are the same for
every seed):

- ``wiener``: 1-D Gaussian process on ``--npix`` pixels, ``f = Hartley(A xi)``
  with the orthonormal Hartley transform and the amplitude ``A = sqrt(P)``,
  ``P(k) = 0.2 / (1 + (k/4)^2)^2`` (as ``demos/wiener_filter_1d.py``; pixel std
  about 1.1); signal ``s = f``; Gaussian noise std 0.3 on the observed pixels
  (a gap of 1/6 of the grid and 30 % of the rest dropped at random). Linear:
  MGVI and geoVI are exact up to sampling noise.
- ``lognormal``: the same GP, ``s = exp(f)``, Gaussian noise std 0.3, same mask.
- ``poisson``: the same GP, rate ``s = 0.5 exp(f)`` (``--poisson-rate``), counts
  ~ Poisson(s) on the same mask (``sv.Poisson``): low counts, about 0.9 per pixel
  on average, many zeros — the regime where a Gaussian approximation in the
  latent space is strained most. ``--poisson-rate 4`` gives about 7 counts per
  pixel, a nearly Gaussian posterior.
- ``cf2d``: 2-D ``sv.CorrelatedFieldMaker`` field on 32x32 (pure power law as in
  ``demos/correlated_field_2d.py``: offset std (0.1, 0.05), fluctuations
  (0.6, 0.1), log-log slope (-2, 0.3), all three *inferred* with the field:
  1027 latent parameters), signal ``s = f``, Gaussian noise std 0.2 on the
  demo's mask (a rectangular and a circular gap, 15 % dropped at random).
  ``--cf-hyper fixed`` fixes the three at their prior means (a linear problem).
  Fewer seeds (``--seeds-cf``, default 2) and NUTS draws (``--draws-cf``, 1000
  per chain) than the 1-D problems: NUTS needs 30-60 leapfrog steps per draw here.

Methods, for each problem and seed:

- shardvi ``optimize_kl`` with ``sample_mode="linear_resample"`` (MGVI) or
  ``"nonlinear_resample"`` (geoVI) in every iteration, ``n_samples`` in
  ``--pairs`` antithetic pairs, ``--iterations`` global iterations (default 6;
  ``--iterations-cf`` for ``cf2d``, default 8) from ``0.1 * (prior draw)``.
  Solvers: sampling CG ``tol=1e-6``; geoVI Newton-CG ``xtol=1e-5,
  absdelta=1e-6``, at most 20 steps (``--geovi-maxiter``; 5 for ``cf2d``,
  ``--geovi-maxiter-cf``, the NIFTy demos' value: 20 steps for 128 samples of
  the 1027-parameter field take minutes); KL Newton-CG ``absdelta=1e-3``, at
  most 30 steps (``--kl-maxiter``); inner CGs ``tol=0.5``.
  ``sample_map = kl_map = sv.parallel.Vmap(chunk_size=None)`` (all samples
  vectorized; ``--vmap-chunk``).
- NUTS (numpyro; the potential is ``sv.vi.hamiltonian(lh, xi)`` on the flattened
  latent (``jax.flatten_util.ravel_pytree``): the very same likelihood and model
  code), through numpyro's functional interface
  (``numpyro.infer.hmc.hmc(potential_fn_gen=...)``) so that the likelihood is an
  argument of one compiled program per problem, reused for every seed;
  ``--chains`` chains (vmapped), ``--warmup`` warmup steps (step size and
  diagonal mass matrix adaptation) and ``--draws`` draws each (``--draws-cf``
  for ``cf2d``), target acceptance 0.8 (``--target-accept``), each chain started
  at 0.1 times a standard-normal draw. Convergence of the reference: split
  R-hat and bulk ESS of every signal pixel (``numpyro.diagnostics``), reported
  as the maximum R-hat and the minimum ESS over pixels, and the number of
  divergent transitions.

Metrics on the signal ``s`` over all pixels (observed and unobserved), with
``m, sd`` the posterior mean and std of a method (VI: ``Samples.mean_and_std``,
i.e. ``n - 1`` in the variance over the ``2 * pairs`` samples; NUTS: all draws):

- ``cov1``, ``cov2``: fraction of pixels with ``|s_true - m| <= k sd`` for k = 1, 2.
  For the exact posterior this is 68.3 / 95.4 % *on average over data
  realizations* if the posterior is Gaussian; a single realization fluctuates
  (neighbouring pixels are correlated), and for skewed posteriors (log-normal,
  Poisson) mean +- k std is not a 68/95 % interval even for the exact posterior:
  the NUTS row is the reference.
- ``sd/sd_NUTS``: median over pixels of ``sd_VI / sd_NUTS`` (1 = right width).
- ``dmean``: RMS over pixels of ``(m_VI - m_NUTS) / sd_NUTS``.
- ``time``: wall time of the ``optimize_kl`` call or of the NUTS run, for the
  first seed (including compilation) / the median of the later seeds (a
  persistent compilation cache in a temporary folder is shared by the VI runs
  and the NUTS program is compiled once per problem, so later seeds mostly
  reuse compiled programs).
- ``ideal``: the coverage a Gaussian posterior would give if its width came
  from ``pairs`` exact antithetic pairs (the sample std is then
  ``sd * sqrt(2 chi2_pairs / (2 pairs - 1))``): ``P(|t_n| <= k sqrt(2n/(2n-1)))``
  with ``t_n`` Student's t with ``n = pairs`` degrees of freedom — 4 pairs
  cannot give 95 % even where MGVI is exact.

Every number in the table is the mean over the seeds, except the NUTS
diagnostics column (the worst seed: largest R-hat, smallest ESS, total
divergences); the JSON has the per-seed values. Results: a JSON (printed last
and written to ``--json``, default ``benchmarks/results/calibration.json``), a
markdown table, and the figure ``--figure`` (default
``benchmarks/results/calibration.png``): one column per problem, coverage
against the number of pairs (top) and the median ``sd_VI / sd_NUTS`` (bottom).
``--replot JSON`` prints the table and draws the figure of an earlier run.
"""

from __future__ import annotations

import argparse
import json
import math
import os
import shutil
import subprocess
import sys
import tempfile
import time

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import _common as C

PROBLEMS = ("wiener", "lognormal", "poisson", "cf2d")
METHODS = {"MGVI": "linear_resample", "geoVI": "nonlinear_resample"}
RESULTS = os.path.join(C.HERE, "results")


def log(msg):
    print(msg, file=sys.stderr, flush=True)


# ================================================================================================ problems
class Problem:
    """One truth and data realization: ``lh`` on the latent space, ``signal(xi)`` on the full grid."""

    def __init__(self, name, lh, signal, xi_true, pos0, iterations, meta):
        self.name, self.lh, self.signal = name, lh, signal
        self.xi_true, self.pos0, self.iterations, self.meta = xi_true, pos0, iterations, meta
        self.truth = signal(xi_true)


def _mask_1d(npix):
    import numpy as np

    rng = np.random.default_rng(12345)  # the same mask for every seed
    mask = rng.random(npix) < 0.7
    mask[npix // 3 : npix // 3 + npix // 6] = False
    return mask


class ProblemFamily:
    """The seed-independent part of a problem (grid, mask, spectrum, model objects).

    The model objects are built once, so the likelihoods of all seeds have the same
    static structure and differ only in their data arrays: the compiled NUTS program
    and (through the persistent compilation cache) the compiled VI steps are reused.
    """

    def __init__(self, name, args):
        import jax
        import jax.numpy as jnp
        import numpy as np

        sv = C.import_shardvi()
        self.name = name
        if name in ("wiener", "lognormal", "poisson"):
            npix = args.npix
            k = np.abs(np.fft.fftfreq(npix, d=1.0 / npix))
            amp = jnp.asarray(np.sqrt(0.2 / (1.0 + (k / 4.0) ** 2) ** 2 * npix))
            mask = _mask_1d(npix)
            idx = jnp.asarray(np.nonzero(mask)[0])
            offset = math.log(args.poisson_rate) if name == "poisson" else 0.0

            def field(xi):
                f = jnp.fft.fft(amp * xi) / npix
                return (f.real + f.imag) * math.sqrt(npix)  # orthonormal Hartley transform of amp * xi

            if name == "wiener":
                signal = field
            else:

                def signal(xi):
                    return jnp.exp(field(xi) + offset)

            domain = jax.ShapeDtypeStruct((npix,), jnp.float64)
            self.model = sv.Model(lambda xi: signal(xi)[idx], domain)
            self.init = lambda key: jax.random.normal(key, (npix,), jnp.float64)
            self.meta = dict(npix=npix, n_data=int(mask.sum()))
            if name == "poisson":
                self.meta["rate_factor"] = args.poisson_rate
            else:
                self.meta["noise_std"] = 0.3
            self.iterations, self.geovi_maxiter = args.iterations, args.geovi_maxiter
            self.seeds, self.draws = args.seeds, args.draws
        elif name == "cf2d":
            sys.path.insert(0, os.path.join(C.ROOT, "demos"))
            from correlated_field_2d import make_mask

            n = args.npix_cf
            cfm = sv.CorrelatedFieldMaker("cf", dtype=jnp.float64)
            if args.cf_hyper == "inferred":
                cfm.set_amplitude_total_offset(0.0, (0.1, 0.05))
                cfm.add_fluctuations((n, n), 1.0 / n, fluctuations=(0.6, 0.1), loglogavgslope=(-2.0, 0.3), prefix="sky")
            else:
                cfm.set_amplitude_total_offset(0.0, 0.1)
                cfm.add_fluctuations((n, n), 1.0 / n, fluctuations=0.6, loglogavgslope=-2.0, prefix="sky")
            cf = cfm.finalize()
            mask = make_mask(n, np.random.default_rng(777))  # the demo's mask, the same for every seed
            response = sv.Mask(mask)
            signal = cf
            self.model = sv.Model(jax.tree_util.Partial(_observe, response, cf), cf.domain)
            self.init = cf.init
            self.meta = dict(shape=[n, n], n_data=int(mask.sum()), noise_std=0.2, hyperparameters=args.cf_hyper)
            self.iterations, self.geovi_maxiter = args.iterations_cf, args.geovi_maxiter_cf
            self.seeds, self.draws = args.seeds_cf, args.draws_cf
        else:
            raise ValueError(f"unknown problem {name!r}")
        self.signal = signal

    def realize(self, seed) -> Problem:
        """Truth (a prior draw), data given the truth, a start ``0.1 * (prior draw)``."""
        import jax
        import jax.numpy as jnp

        sv = C.import_shardvi()
        k_truth, k_noise, k_pos = jax.random.split(jax.random.PRNGKey(1000 + seed), 3)
        xi_true = self.init(k_truth)
        s_obs = self.model(xi_true)
        if self.name == "poisson":
            data = jax.random.poisson(k_noise, s_obs).astype(jnp.float64)
            lh = sv.Poisson(data).amend(self.model)
        else:
            std = self.meta["noise_std"]
            data = s_obs + std * jax.random.normal(k_noise, s_obs.shape, jnp.float64)
            lh = sv.Gaussian(data, noise_std=std).amend(self.model)
        pos0 = jax.tree.map(lambda x: 0.1 * x, self.init(k_pos))
        return Problem(self.name, lh, self.signal, xi_true, pos0, self.iterations, dict(self.meta))


def _observe(response, field, xi):
    return response(field(xi))


# ================================================================================================ metrics
def metrics(truth, mean, std, ref_mean=None, ref_std=None):
    import numpy as np

    truth, mean, std = (np.asarray(x, dtype=float).ravel() for x in (truth, mean, std))
    z = np.abs(truth - mean)
    out = dict(cov1=float(np.mean(z <= std)), cov2=float(np.mean(z <= 2 * std)))
    if ref_mean is not None:
        ref_mean, ref_std = (np.asarray(x, dtype=float).ravel() for x in (ref_mean, ref_std))
        out["std_ratio"] = float(np.median(std / ref_std))
        out["dmean"] = float(np.sqrt(np.mean(((mean - ref_mean) / ref_std) ** 2)))
    return out


def ideal_coverage(pairs, k):
    """Coverage of mean +- k * (sample std of ``pairs`` exact antithetic pairs, ddof 1) for a Gaussian posterior."""
    from scipy import stats

    n = int(pairs)
    return float(2 * stats.t.cdf(k * math.sqrt(2 * n / (2 * n - 1)), df=n) - 1)


# ================================================================================================ runs
def solver_configs(args, family):
    sv = C.import_shardvi()
    return dict(
        linear_sampling=sv.CGConfig(tol=1e-6, maxiter=1000),
        nonlinear_update=sv.NewtonCGConfig(
            xtol=1e-5, absdelta=args.geovi_absdelta, maxiter=family.geovi_maxiter, cg=sv.CGConfig(tol=0.5, maxiter=200)
        ),
        kl_minimization=sv.NewtonCGConfig(
            xtol=None, absdelta=1e-3, maxiter=args.kl_maxiter, cg=sv.CGConfig(tol=0.5, maxiter=200)
        ),
    )


def run_vi(prob, family, method, pairs, seed, args, cache_dir):
    import jax
    import numpy as np

    sv = C.import_shardvi()
    strategy = sv.parallel.Vmap(chunk_size=args.vmap_chunk or None)
    means = []

    def callback(samples, state):
        means.append(samples.mean_and_std(prob.signal))

    t0 = time.perf_counter()
    samples, state = sv.optimize_kl(
        prob.lh,
        prob.pos0,
        key=jax.random.PRNGKey(2000 + seed),
        n_total_iterations=prob.iterations,
        n_samples=pairs,
        sample_mode=METHODS[method],
        progress=False,
        sample_map=strategy,
        kl_map=strategy,
        compilation_cache_dir=cache_dir,
        callback=callback,
        **solver_configs(args, family),
    )
    mean, std = samples.mean_and_std(prob.signal)
    mean, std = np.asarray(mean), np.asarray(std)
    wall = time.perf_counter() - t0
    h = state.history[-1]
    # how much the last iteration moved the posterior mean, in posterior stds (sampling noise included)
    last_change = None
    if len(means) >= 2:
        m_prev = np.asarray(means[-2][0])
        last_change = float(np.sqrt(np.mean(((mean - m_prev) / std) ** 2)))
    return (
        mean,
        std,
        dict(
            wall_s=wall,
            kl=float(h.kl_energy),
            chi2=None if h.chi2_likelihood is None else float(h.chi2_likelihood),
            kl_nit=int(h.kl_nit),
            geovi_nit_max=max(h.nonlinear_nit) if h.nonlinear_nit else None,
            geovi_nit_median=float(np.median(h.nonlinear_nit)) if h.nonlinear_nit else None,
            # geoVI updates of the last iteration that stopped without meeting their tolerance (maxiter, ...)
            geovi_unconverged=sum(1 for st in (h.nonlinear_status or []) if st != 0) if h.nonlinear_nit else None,
            last_change=last_change,
        ),
    )


def make_nuts(family, args):
    """A compiled NUTS run ``(lh, keys, z0) -> (draws, diverging, num_steps)`` for the family's likelihoods.

    numpyro's functional NUTS (``numpyro.infer.hmc.hmc(potential_fn_gen=..., algo="NUTS")``):
    the likelihood is an argument of the compiled program (``potential_fn_gen(lh)``), so one
    compilation serves every seed. Warmup (step size and diagonal mass matrix adaptation,
    numpyro's windowed scheme) and draws are two ``lax.scan``s; the chains are ``vmap``ped.
    """
    import jax
    from jax.flatten_util import ravel_pytree
    from numpyro.infer.hmc import hmc

    sv = C.import_shardvi()
    _, unravel = ravel_pytree(family.init(jax.random.PRNGKey(0)))  # structure only

    def potential_fn_gen(lh):
        return lambda flat: sv.vi.hamiltonian(lh, unravel(flat))

    init_kernel, sample_kernel = hmc(potential_fn_gen=potential_fn_gen, algo="NUTS")
    n_warm, n_draw = args.warmup, family.draws

    def chain(lh, key, z0):
        state = init_kernel(
            z0,
            n_warm,
            target_accept_prob=args.target_accept,
            max_tree_depth=args.max_tree_depth,
            model_args=(lh,),
            rng_key=key,
        )

        def warm(s, _):
            return sample_kernel(s, model_args=(lh,)), None

        def draw(s, _):
            s = sample_kernel(s, model_args=(lh,))
            return s, (s.z, s.diverging, s.num_steps)

        state, _ = jax.lax.scan(warm, state, None, length=n_warm)
        _, out = jax.lax.scan(draw, state, None, length=n_draw)
        return out

    return jax.jit(jax.vmap(chain, in_axes=(None, 0, 0))), unravel


def run_nuts(prob, nuts, seed, args):
    import jax
    import numpy as np
    from jax.flatten_util import ravel_pytree
    from numpyro.diagnostics import effective_sample_size, split_gelman_rubin

    run, unravel = nuts
    flat0, _ = ravel_pytree(prob.pos0)
    key = jax.random.PRNGKey(3000 + seed)
    k_init, k_run = jax.random.split(key)
    z0 = 0.1 * jax.random.normal(k_init, (args.chains, flat0.size), flat0.dtype)
    t0 = time.perf_counter()
    flat, diverging, steps = jax.block_until_ready(run(prob.lh, jax.random.split(k_run, args.chains), z0))
    wall = time.perf_counter() - t0
    sig = jax.jit(jax.vmap(jax.vmap(lambda f: prob.signal(unravel(f)))))(flat)
    sig = np.asarray(sig).reshape(args.chains, flat.shape[1], -1)
    rhat = np.asarray(split_gelman_rubin(sig)) if args.chains > 1 else np.full(sig.shape[-1], np.nan)
    ess = np.asarray(effective_sample_size(sig))
    flat_all = sig.reshape(-1, sig.shape[-1])
    mean, std = flat_all.mean(axis=0), flat_all.std(axis=0, ddof=1)
    shape = np.shape(prob.truth)
    return (
        mean.reshape(shape),
        std.reshape(shape),
        dict(
            wall_s=wall,
            rhat_max=float(np.nanmax(rhat)),
            rhat_median=float(np.nanmedian(rhat)),
            ess_min=float(np.min(ess)),
            ess_median=float(np.median(ess)),
            divergences=int(np.sum(np.asarray(diverging))),
            steps_median=float(np.median(np.asarray(steps))),
            n_draws=int(args.chains * flat.shape[1]),
            n_latent=int(flat0.size),
        ),
    )


# ================================================================================================ summary
def mean_of(xs):
    xs = [x for x in xs if x is not None]
    return sum(xs) / len(xs) if xs else None


def _walls(rs):
    """First seed's wall time (compiles) and the median of the later seeds' (compiled programs reused)."""
    later = [r["wall_s"] for r in rs[1:]]
    return dict(wall_first_s=rs[0]["wall_s"], wall_later_s=C.median(later) if later else None)


def summarize(records, problems, pairs_list):
    rows = []
    for p in problems:
        nuts = [r for r in records if r["problem"] == p and r["method"] == "NUTS"]
        if not nuts:
            continue
        rows.append(
            dict(
                problem=p,
                method="NUTS",
                pairs=None,
                **{k: mean_of([r[k] for r in nuts]) for k in ("cov1", "cov2")},
                **_walls(nuts),
                rhat_max=max(r["rhat_max"] for r in nuts),
                ess_min=min(r["ess_min"] for r in nuts),
                divergences=sum(r["divergences"] for r in nuts),
                n_seeds=len(nuts),
            )
        )
        for m in METHODS:
            for n in pairs_list:
                rs = [r for r in records if r["problem"] == p and r["method"] == m and r["pairs"] == n]
                if not rs:
                    continue
                row = dict(problem=p, method=m, pairs=n, n_seeds=len(rs))
                for k in ("cov1", "cov2", "std_ratio", "dmean", "last_change"):
                    row[k] = mean_of([r.get(k) for r in rs])
                row.update(_walls(rs))
                row["ideal_cov1"], row["ideal_cov2"] = ideal_coverage(n, 1), ideal_coverage(n, 2)
                rows.append(row)
    return rows


def pct(x):
    return "-" if x is None else f"{100 * x:.1f}"


def _wall(r):
    return C.fmt(r["wall_first_s"], ".1f") + " / " + C.fmt(r["wall_later_s"], ".1f")


def table(rows):
    header = [
        "problem",
        "method",
        "pairs",
        "cov1 %",
        "cov2 %",
        "ideal 1σ/2σ %",
        "sd/sd_NUTS",
        "dmean",
        "time s first / later",
        "NUTS R-hat / ESS / div",
    ]
    out = []
    for r in rows:
        if r["method"] == "NUTS":
            out.append(
                [
                    r["problem"],
                    "NUTS",
                    "-",
                    pct(r["cov1"]),
                    pct(r["cov2"]),
                    "68.3 / 95.4",
                    "1",
                    "0",
                    _wall(r),
                    f"{r['rhat_max']:.3f} / {r['ess_min']:.0f} / {r['divergences']}",
                ]
            )
        else:
            out.append(
                [
                    r["problem"],
                    r["method"],
                    str(r["pairs"]),
                    pct(r["cov1"]),
                    pct(r["cov2"]),
                    f"{pct(r['ideal_cov1'])} / {pct(r['ideal_cov2'])}",
                    C.fmt(r["std_ratio"], ".3f"),
                    C.fmt(r["dmean"], ".3f"),
                    _wall(r),
                    "",
                ]
            )
    return C.markdown_table(header, out, align="lllrrrrrrr")


def figure(rows, problems, pairs_list, path):
    """Top row: coverage vs pairs (1σ filled, 2σ open); bottom row: median sd_VI / sd_NUTS vs pairs."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    n = len(problems)
    fig, axes = plt.subplots(
        2, n, figsize=(3.6 * n, 6.0), sharex=True, sharey="row", squeeze=False, gridspec_kw=dict(height_ratios=(2, 1))
    )
    style = {"MGVI": dict(color="tab:blue", ls="-", shift=1.0), "geoVI": dict(color="tab:orange", ls="--", shift=1.07)}
    for col, p in enumerate(problems):
        ax, bx = axes[0][col], axes[1][col]
        for k in (1, 2):  # a Gaussian posterior whose std comes from n exact antithetic pairs
            ideal = [ideal_coverage(m, k) for m in pairs_list]
            ax.plot(
                pairs_list,
                ideal,
                color="0.5",
                lw=1,
                ls=":",
                marker="_",
                label="exact posterior, n pairs" if k == 1 else None,
            )
        nuts = [r for r in rows if r["problem"] == p and r["method"] == "NUTS"]
        for r in nuts:
            for k in (1, 2):
                ax.axhline(r[f"cov{k}"], color="k", ls="--", lw=1, label="NUTS" if k == 1 else None)
        for m, st in style.items():
            rs = sorted((r for r in rows if r["problem"] == p and r["method"] == m), key=lambda r: r["pairs"])
            if not rs:
                continue
            xs = [r["pairs"] * st["shift"] for r in rs]  # geoVI slightly to the right: they coincide on wiener
            ax.plot(xs, [r["cov1"] for r in rs], marker="o", ls=st["ls"], color=st["color"], label=m)
            ax.plot(xs, [r["cov2"] for r in rs], marker="s", ls=st["ls"], color=st["color"], mfc="white")
            bx.plot(xs, [r["std_ratio"] for r in rs], marker="o", ls=st["ls"], color=st["color"], label=m)
        for lvl in (0.683, 0.954):
            ax.axhline(lvl, color="0.8", lw=0.8, zorder=0)
        bx.axhline(1.0, color="k", ls="--", lw=1)
        ns = nuts[0]["n_seeds"] if nuts else 0
        ax.set_title(f"{p} (mean of {ns} seed{'s' if ns != 1 else ''})")
        for a in (ax, bx):
            a.set_xscale("log", base=2)
            a.grid(alpha=0.3)
        bx.set_xticks(pairs_list)
        bx.set_xticklabels([str(x) for x in pairs_list])
        bx.set_xlabel("antithetic pairs")
    axes[0][0].set_ylabel("coverage of the truth\n(filled: ±1σ, open: ±2σ)")
    axes[1][0].set_ylabel("median sd_VI / sd_NUTS")
    axes[0][0].legend(fontsize=8, loc="lower right")
    fig.tight_layout()
    d = os.path.dirname(os.path.abspath(path))
    os.makedirs(d, exist_ok=True)
    fig.savefig(path, dpi=110)
    plt.close(fig)


# ================================================================================================ main
def ensure_numpyro():
    """Re-execute in benchmarks/.venv-nuts when numpyro is missing here (exit 0 with 'skipped' if impossible)."""
    try:
        import numpyro  # noqa: F401

        return
    except ImportError:
        pass
    if os.environ.get("SHARDVI_CALIBRATION_REEXEC"):
        print("skipped: numpyro does not import in benchmarks/.venv-nuts", flush=True)
        sys.exit(0)
    p = subprocess.run(["bash", os.path.join(C.HERE, "setup_nuts_venv.sh")], capture_output=True, text=True)
    py = p.stdout.strip().splitlines()[-1] if p.stdout.strip() else ""
    if p.returncode != 0 or not py or not os.path.exists(py):
        print(f"skipped: no numpyro venv ({p.stderr.strip()[-500:]})", flush=True)
        sys.exit(0)
    env = dict(os.environ, SHARDVI_CALIBRATION_REEXEC="1")
    os.execve(py, [py, os.path.abspath(__file__), *sys.argv[1:]], env)


def parse(argv=None):
    ap = argparse.ArgumentParser(
        description=__doc__.splitlines()[0], formatter_class=argparse.RawDescriptionHelpFormatter
    )
    ap.add_argument(
        "--problems", default=None, help=f"comma-separated subset of {PROBLEMS} (default: all; --quick: wiener,poisson)"
    )
    ap.add_argument("--pairs", default="4,16,64", help="antithetic sample pairs, comma separated")
    ap.add_argument("--methods", default="MGVI,geoVI", help="MGVI (linear_resample), geoVI (nonlinear_resample)")
    ap.add_argument("--seeds", default="0,1,2", help="truth/data realizations of the 1-D problems, comma separated")
    ap.add_argument("--seeds-cf", default="0,1", help="truth/data realizations of cf2d")
    ap.add_argument("--npix", type=int, default=64, help="pixels of the 1-D problems")
    ap.add_argument("--poisson-rate", type=float, default=0.5, help="poisson: rate = this * exp(GP) (default 0.5)")
    ap.add_argument("--npix-cf", type=int, default=32, help="pixels per axis of cf2d")
    ap.add_argument("--cf-hyper", choices=("inferred", "fixed"), default="inferred", help="cf2d hyperparameters")
    ap.add_argument("--iterations", type=int, default=6, help="global VI iterations (1-D problems)")
    ap.add_argument("--iterations-cf", type=int, default=8, help="global VI iterations (cf2d)")
    ap.add_argument("--geovi-maxiter", type=int, default=20, help="Newton steps per geoVI update (1-D problems)")
    ap.add_argument("--geovi-maxiter-cf", type=int, default=5, help="Newton steps per geoVI update (cf2d)")
    ap.add_argument("--geovi-absdelta", type=float, default=1e-6, help="geoVI Newton stop on energy decrease")
    ap.add_argument("--kl-maxiter", type=int, default=30, help="KL Newton steps per iteration")
    ap.add_argument(
        "--vmap-chunk",
        type=int,
        default=0,
        help="samples per vectorized batch of sample_map/kl_map (sv.parallel.Vmap); 0: all at once (default)",
    )
    ap.add_argument("--chains", type=int, default=2, help="NUTS chains")
    ap.add_argument("--warmup", type=int, default=1000, help="NUTS warmup steps per chain")
    ap.add_argument("--draws", type=int, default=2000, help="NUTS draws per chain (1-D problems)")
    ap.add_argument("--draws-cf", type=int, default=1000, help="NUTS draws per chain (cf2d)")
    ap.add_argument("--target-accept", type=float, default=0.8)
    ap.add_argument("--max-tree-depth", type=int, default=10)
    ap.add_argument(
        "--replot",
        metavar="JSON",
        default=None,
        help="only print the table and draw the figure of an earlier run's JSON",
    )
    ap.add_argument(
        "--quick",
        action="store_true",
        help="smoke run (about a minute): wiener and poisson, 1 seed, 4 pairs, short NUTS",
    )
    ap.add_argument("--json", default=os.path.join(RESULTS, "calibration.json"), help="'' for none")
    ap.add_argument("--figure", default=os.path.join(RESULTS, "calibration.png"), help="'' for none")
    args = ap.parse_args(argv)
    if args.quick:
        args.problems = args.problems or "wiener,poisson"
        args.seeds, args.seeds_cf, args.pairs = "0", "0", "4"
        args.warmup, args.draws, args.draws_cf = 200, 300, 300
        args.iterations, args.iterations_cf = 3, 4
        if args.json == os.path.join(RESULTS, "calibration.json"):
            args.json = os.path.join(RESULTS, "calibration_quick.json")
        if args.figure == os.path.join(RESULTS, "calibration.png"):
            args.figure = os.path.join(RESULTS, "calibration_quick.png")
    args.problems = [p for p in (args.problems or ",".join(PROBLEMS)).split(",") if p]
    bad = [p for p in args.problems if p not in PROBLEMS]
    if bad:
        ap.error(f"unknown problems {bad}; choose from {PROBLEMS}")
    args.methods = [m for m in args.methods.split(",") if m]
    if any(m not in METHODS for m in args.methods):
        ap.error(f"--methods: choose from {tuple(METHODS)}")
    args.pairs = [int(x) for x in args.pairs.split(",") if x]
    args.seeds = [int(x) for x in args.seeds.split(",") if x]
    args.seeds_cf = [int(x) for x in args.seeds_cf.split(",") if x]
    return args


def main(argv=None):
    args = parse(argv)
    if args.replot:
        with open(args.replot) as f:
            old = json.load(f)
        cfg = old["config"]
        rows = summarize(old["records"], cfg["problems"], cfg["pairs"])
        print(table(rows))
        if args.figure:
            figure(rows, cfg["problems"], cfg["pairs"], args.figure)
            print(f"figure written to {args.figure}")
        return 0
    ensure_numpyro()
    C.setup_jax()
    import numpyro

    numpyro.enable_x64()
    cache_dir = tempfile.mkdtemp(prefix="shardvi-calibration-cache-")
    t_start = time.perf_counter()
    records = []
    try:
        for p in args.problems:
            family = ProblemFamily(p, args)
            nuts = make_nuts(family, args)
            for seed in family.seeds:
                prob = family.realize(seed)
                log(f"[{time.perf_counter() - t_start:6.1f}s] {p} seed {seed}: NUTS ...")
                m_ref, s_ref, info = run_nuts(prob, nuts, seed, args)
                rec = dict(problem=p, seed=seed, method="NUTS", pairs=None, **metrics(prob.truth, m_ref, s_ref), **info)
                records.append(rec)
                log(
                    f"    NUTS {info['wall_s']:.1f}s cov1 {rec['cov1']:.3f} cov2 {rec['cov2']:.3f} "
                    f"R-hat<={info['rhat_max']:.3f} ESS>={info['ess_min']:.0f} div {info['divergences']} "
                    f"steps~{info['steps_median']:.0f}"
                )
                for m in args.methods:
                    for n in args.pairs:
                        mean, std, vinfo = run_vi(prob, family, m, n, seed, args, cache_dir)
                        rec = dict(
                            problem=p,
                            seed=seed,
                            method=m,
                            pairs=n,
                            **metrics(prob.truth, mean, std, m_ref, s_ref),
                            **vinfo,
                        )
                        records.append(rec)
                        log(
                            f"    {m:5s} {n:3d} pairs {vinfo['wall_s']:5.1f}s cov1 {rec['cov1']:.3f} "
                            f"cov2 {rec['cov2']:.3f} sd/sdN {rec['std_ratio']:.3f} dmean {rec['dmean']:.3f} "
                            f"last-change {C.fmt(vinfo['last_change'])} kl-nit {vinfo['kl_nit']} "
                            f"geoVI nit {vinfo['geovi_nit_median']}/{vinfo['geovi_nit_max']} "
                            f"unconv {vinfo['geovi_unconverged']}"
                        )
    finally:
        shutil.rmtree(cache_dir, ignore_errors=True)
    total = time.perf_counter() - t_start
    rows = summarize(records, args.problems, args.pairs)
    config = {k: v for k, v in vars(args).items() if k not in ("json", "figure")}
    out = dict(
        benchmark="calibration",
        config=config,
        machine=C.machine_meta(),
        numpyro=numpyro.__version__,
        problems={p: ProblemFamily(p, args).meta for p in args.problems},
        total_wall_s=total,
        records=records,
        summary=rows,
    )
    print(table(rows))
    print(f"\ntotal wall time {total:.0f} s")
    if args.figure:
        figure(rows, args.problems, args.pairs, args.figure)
        print(f"figure written to {args.figure}")
    C.write_json(args.json, out)
    print(json.dumps(out), flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
