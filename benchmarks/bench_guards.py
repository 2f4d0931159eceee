"""Time per iteration of ``optimize_kl`` with and without the reproducibility rewrite's product guards.

    python benchmarks/bench_guards.py on     # guards on (the default on jax >= 0.11)
    python benchmarks/bench_guards.py off    # guards off (jax 0.10.2's rewrite)

The guards (``shardvi._jax_compat.guard_products``) write every product that may reach an addition
as ``(x * 0.5) * 2`` with opaque constants, so that XLA's fused multiply-adds give the same bits in
every program. The problem: ``benchmarks/_common.py``'s correlated field (exp link) on 128^2 and
256^2, 4 pairs, 5 iterations (2 MGVI, 3 geoVI), 5 geoVI and 5 KL Newton steps, all samples
vectorized (``Vmap(chunk_size=None)``). Prints one JSON line: the first iteration (compilation
included) and the median of the later ones.
"""

import json
import os
import sys
import time

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import jax

jax.config.update("jax_enable_x64", True)
import _common as C  # noqa: E402

import shardvi as sv  # noqa: E402
from shardvi import _jax_compat as compat  # noqa: E402

guards = sys.argv[1] == "on"
compat.guard_products = (lambda version=None: True) if guards else (lambda version=None: False)
out = {}
for n in (128, 256):
    prob = C.Problem((n, n))
    lh = sv.Gaussian(prob.data, noise_std=prob.noise_std).amend(sv.Model(prob.call, prob.domain))
    times = []
    t0 = [time.perf_counter()]

    def cb(s, st):
        jax.block_until_ready(s.pos)
        times.append(time.perf_counter() - t0[0])
        t0[0] = time.perf_counter()

    strat = sv.parallel.Vmap(chunk_size=None)
    sv.optimize_kl(
        lh,
        prob.position,
        key=jax.random.PRNGKey(0),
        n_total_iterations=5,
        n_samples=4,
        sample_mode=lambda i: "linear_resample" if i < 2 else "nonlinear_resample",
        nonlinear_update=sv.NewtonCGConfig(xtol=0.0, maxiter=5),
        kl_minimization=sv.NewtonCGConfig(xtol=0.0, maxiter=5),
        sample_map=strat,
        kl_map=strat,
        progress=False,
        callback=cb,
    )
    out[n] = {"first_s": times[0], "later_median_s": sorted(times[1:])[len(times[1:]) // 2], "iters": times}
print(json.dumps({"guards": guards, "jax": jax.__version__, "device": str(jax.devices()[0]), "res": out}))
