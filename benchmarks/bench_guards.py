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

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import jax

jax.config.update("jax_enable_x64", True)
import _common as C  # noqa: E402

from shardvi import _jax_compat as compat  # noqa: E402

guards = sys.argv[1] == "on"
compat.guard_products = (lambda version=None: True) if guards else (lambda version=None: False)
out = {n: C.time_vectorized_iterations(n) for n in (128, 256)}
print(json.dumps({"guards": guards, "jax": jax.__version__, "device": str(jax.devices()[0]), "res": out}))
