"""Cost of the layout-free slab path of the correlated field (field parallelism).

Per call of a compiled function: the field and the gradient of a Gaussian energy
(``value_and_grad``), and 10 applications of the metric ``J^T J + I`` at one
linearization (a CG solve's work), for

- ``whole``: the ordinary correlated field on one device (``fftn``, plain reductions);
- ``slab-1dev``: the slab path on one device (``B`` fixed blocks, block-order sums);
- ``slab-Pdev``: the slab path split over ``P`` forced CPU devices of one process
  (time only: the devices share this machine's cores; memory per process is
  ``bench_model_parallel.py``'s job).

Medians of ``--repeats`` calls after one warm-up call.

    .venv/bin/python benchmarks/bench_field_split.py --sizes 256,512 --blocks 4 --json out.json
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
import time

import _common

_common.setup_jax()

import jax  # noqa: E402

jax.config.update("jax_num_cpu_devices", 4)
from shardvi.parallel import depth_first_cpu_schedule  # noqa: E402

depth_first_cpu_schedule()  # a model axis over these CPU devices
import jax.numpy as jnp  # noqa: E402
import numpy as np  # noqa: E402
from jax.sharding import AxisType, Mesh  # noqa: E402
from jax.sharding import PartitionSpec as P  # noqa: E402

_common.import_shardvi()
import shardvi as sv  # noqa: E402
from shardvi import tree_math as tm  # noqa: E402
from shardvi.parallel.grid import GridLayout, Slab  # noqa: E402

AX = "m"


def make_cf(n):
    cf = sv.CorrelatedFieldMaker("cf")
    cf.set_amplitude_total_offset(0.3, (0.5, 0.1))
    cf.add_fluctuations(
        (n, n),
        1.0 / n,
        fluctuations=(0.7, 0.2),
        loglogavgslope=(-3.0, 0.5),
        flexibility=(0.8, 0.3),
        asperity=(0.2, 0.1),
        prefix="x",
    )
    return cf.finalize()


def work(cf, layout):
    """``(hyp, grid, data) -> (energy, grad, 10 metric applications)`` with the grid a slab (or whole)."""
    name = cf._xi_name

    def wrap(grid):
        return grid if layout is None else Slab(grid, layout)

    def vdot(a, b):
        return jnp.vdot(a, b) if layout is None else tm.vdot(Slab(a, layout), Slab(b, layout))

    def fn(hyp, grid, data):
        x = {**hyp, name: wrap(grid)}

        def energy(z):
            r = data - cf._field(z)
            return 0.5 * vdot(r, r) + 0.5 * tm.vdot(z, z)

        e, g = jax.value_and_grad(energy)(x)
        _, lin = jax.linearize(cf._field, x)
        adj = jax.linear_transpose(lin, x)

        def apply(_, v):
            return tm.add(adj(lin(v))[0], v)

        v = jax.lax.fori_loop(0, 10, apply, g)
        return e, g, v

    return fn


def timed(f, args, repeats):
    jax.block_until_ready(f(*args))
    ts = []
    for _ in range(repeats):
        t0 = time.perf_counter()
        jax.block_until_ready(f(*args))
        ts.append(time.perf_counter() - t0)
    return statistics.median(ts)


def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--sizes", default="256,512")
    ap.add_argument("--blocks", type=int, default=4)
    ap.add_argument("--repeats", type=int, default=5)
    ap.add_argument("--json", default=None)
    args = ap.parse_args(argv)
    rows = []
    for n in (int(s) for s in args.sizes.split(",")):
        cf = make_cf(n)
        name = cf._xi_name
        rng = np.random.default_rng(0)
        xi = {k: jnp.asarray(0.1 * rng.normal(size=v.shape)) for k, v in cf.domain.items()}
        hyp = {k: v for k, v in xi.items() if k != name}
        grid, data = xi[name], jnp.asarray(rng.normal(size=(n, n)))
        configs = [("whole", None), ("slab-1dev", 0)] + [(f"slab-{p}dev", p) for p in (2, 4)]
        ref = None
        for label, p in configs:
            if p is None:
                f = jax.jit(work(cf, None))
            elif p == 0:
                f = jax.jit(work(cf, GridLayout(args.blocks)))
            else:
                mesh = Mesh(np.asarray(jax.devices()[:p]), (AX,), axis_types=(AxisType.Auto,))
                g_spec = {**{k: P() for k in hyp}, name: P(AX)}
                f = jax.jit(
                    jax.shard_map(
                        work(cf, GridLayout(args.blocks, AX, p)),
                        mesh=mesh,
                        in_specs=(P(), P(AX), P(AX)),
                        out_specs=(P(), g_spec, g_spec),
                        check_vma=False,
                    )
                )
            t = timed(f, (hyp, grid, data), args.repeats)
            e = float(f(hyp, grid, data)[0])
            if p == 0:
                ref = e
            bitwise = None if p is None or ref is None else e == ref
            rows.append({"n": n, "config": label, "s": t, "energy": e, "energy_equals_slab_1dev": bitwise})
    base = {r["n"]: r["s"] for r in rows if r["config"] == "whole"}
    for r in rows:
        r["ratio_to_whole"] = r["s"] / base[r["n"]]
    print("| grid | config | s per call | ratio to whole | energy == slab-1dev |")
    print("|---:|:---|---:|---:|:---|")
    for r in rows:
        print(
            f"| {r['n']}² | {r['config']} | {r['s']:.4f} | {r['ratio_to_whole']:.2f} | "
            f"{'' if r['energy_equals_slab_1dev'] is None else r['energy_equals_slab_1dev']} |"
        )
    if args.json:
        with open(args.json, "w") as fh:
            json.dump(rows, fh, indent=1)
    return 0


if __name__ == "__main__":
    sys.exit(main())
