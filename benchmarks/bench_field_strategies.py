"""``ShardMap`` against ``JitSharding`` with the field split: time per iteration, bitwise to one device.

    python benchmarks/bench_field_strategies.py [--npix 128] [--blocks 4] [--iterations 5] [--json out.json]

The flagship demo's problem (``demos/correlated_field_2d.py``: a 2-D log-normal
correlated field, the data of an ``sv.Mask``) with the likelihood amended with
``field_blocks=--blocks``, one reconstruction (2 antithetic pairs, MGVI) per
strategy and mesh layout (samples x model) of up to 4 forced CPU devices, and one with
``Vmap()`` (one device, the same blocks) as the reference. Per run:

- ``first_s``: the first iteration (tracing, compiling, running);
- ``iter_median_s``: median of the later iterations (they compile nothing);
- ``bitwise``: the samples equal the ``Vmap()`` run's bitwise.

The table gives ``jit`` / ``shard_map`` per layout. Forced CPU devices share the
machine's cores: this compares the strategies' overheads, not speed-ups.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import sys

os.environ.setdefault("JAX_PLATFORMS", "cpu")

import jax

jax.config.update("jax_num_cpu_devices", 4)
from shardvi.parallel import depth_first_cpu_schedule  # noqa: E402

depth_first_cpu_schedule()  # a model axis over these CPU devices

import numpy as np  # noqa: E402

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path[:0] = [os.path.join(HERE, ".."), os.path.join(HERE, "..", "demos")]
import correlated_field_2d as demo  # noqa: E402

import shardvi as sv  # noqa: E402

STRATEGIES = {"shard_map": sv.parallel.ShardMap, "jit": sv.parallel.JitSharding}


def run(problem, strategy, iterations):
    samples, state = demo.reconstruct(
        problem,
        n_samples=2,
        iterations=iterations,
        linear_iterations=iterations,
        seed=0,
        strategy=strategy,
        progress=False,
    )
    times = [h.wall_time for h in state.history]
    arrays = [np.asarray(x) for x in jax.tree.leaves((samples.pos, samples.residuals))]
    return arrays, {"first_s": times[0], "iter_median_s": statistics.median(times[1:])}


def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--npix", type=int, default=128, help="pixels per axis (default 128)")
    ap.add_argument("--blocks", type=int, default=4, help="field blocks (default 4)")
    ap.add_argument("--iterations", type=int, default=5, help="MGVI iterations per run, >= 2 (default 5)")
    ap.add_argument(
        "--layouts", default="2x2,1x4", help="SAMPLESxMODEL mesh layouts of at most 4 devices (default 2x2,1x4)"
    )
    ap.add_argument("--json", help="write the records here")
    args = ap.parse_args(argv)
    if args.iterations < 2:
        ap.error("--iterations must be >= 2 (the first compiles)")
    layouts = [tuple(int(v) for v in lay.split("x")) for lay in args.layouts.split(",")]
    if any(s * m > 4 or args.blocks % m for s, m in layouts):
        ap.error(f"--layouts must use at most 4 devices, the model shards dividing --blocks, got {args.layouts}")

    problem = demo.Problem(args.npix, 0, 0.2, field_blocks=args.blocks)
    ref, vmap_rec = run(problem, sv.parallel.Vmap(), args.iterations)
    records = [{"strategy": "vmap", "layout": "1 device", **vmap_rec, "bitwise": True}]
    print(json.dumps(records[-1]), flush=True)
    for s, m in layouts:
        for name, cls in STRATEGIES.items():
            arrays, rec = run(problem, cls(devices=jax.devices()[: s * m], model_shards=m), args.iterations)
            same = all(np.array_equal(a, b) for a, b in zip(arrays, ref))
            records.append({"strategy": name, "layout": f"{s}x{m}", **rec, "bitwise": same})
            print(json.dumps(records[-1]), flush=True)

    print(f"\n{args.npix}^2, {args.blocks} field blocks, 2 pairs, {args.iterations} iterations, forced CPU devices")
    print("| strategy | layout | first s | iter s (median) | jit / shard_map | bitwise |")
    print("|---|---|---:|---:|---:|:---:|")
    by = {(r["strategy"], r["layout"]): r for r in records}
    for r in records:
        sm = by.get(("shard_map", r["layout"]))
        ratio = f"{r['iter_median_s'] / sm['iter_median_s']:.2f}x" if r["strategy"] == "jit" and sm else ""
        print(
            f"| {r['strategy']} | {r['layout']} | {r['first_s']:.2f} | {r['iter_median_s']:.3f} | {ratio} | "
            f"{'yes' if r['bitwise'] else 'NO'} |"
        )
    if args.json:
        with open(args.json, "w") as f:
            json.dump({"args": vars(args), "records": records}, f, indent=1)


if __name__ == "__main__":
    main()
