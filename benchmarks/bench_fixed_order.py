"""Time per iteration of ``optimize_kl`` with and without the fixed-order sums and padded FFT batches.

    python benchmarks/bench_fixed_order.py on     # pairwise sums, FFT batches in full SIMD groups (jax >= 0.12)
    python benchmarks/bench_fixed_order.py off    # XLA's own reductions and FFT batches (older jax's arithmetic)

On jax >= 0.12 the solvers' inner products are pairwise sums written out as additions and every batch of
1-D FFT lines is padded to full SIMD groups (``shardvi._jax_compat.fixed_order_arithmetic``), so that
a single-device and an SPMD program give the same bits. The problem: ``benchmarks/_common.py``'s
correlated field (exp link) on 128^2 (lines fill the groups: no padding) and 100^2 (padded), 4 pairs,
5 iterations (2 MGVI, 3 geoVI), 5 geoVI and 5 KL Newton steps, all samples vectorized
(``Vmap(chunk_size=None)``). Prints one JSON line: the first iteration (compilation included) and the
median of the later ones.
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
from shardvi import tree_math  # noqa: E402
from shardvi.parallel import fft  # noqa: E402

fixed = sys.argv[1] == "on"
tree_math._FIXED_ORDER = fft._PAD_LINES = fixed  # read at trace time: before the first step is traced
out = {}
for n in (128, 100):
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
print(json.dumps({"fixed_order": fixed, "jax": jax.__version__, "device": str(jax.devices()[0]), "res": out}))
