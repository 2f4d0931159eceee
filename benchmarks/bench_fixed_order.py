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

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import jax

jax.config.update("jax_enable_x64", True)
import _common as C  # noqa: E402

from shardvi import tree_math  # noqa: E402
from shardvi.parallel import fft  # noqa: E402

fixed = sys.argv[1] == "on"
tree_math._FIXED_ORDER = fft._PAD_LINES = fixed  # read at trace time: before the first step is traced
out = {n: C.time_vectorized_iterations(n) for n in (128, 100)}
print(json.dumps({"fixed_order": fixed, "jax": jax.__version__, "device": str(jax.devices()[0]), "res": out}))
