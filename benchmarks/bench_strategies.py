"""Time every sample-map strategy on 1, 2 and 4 forced CPU devices against single-device vmap.

    python benchmarks/bench_strategies.py [--npix 128] [--samples 4] [--iterations 3] [--json out.json]

One reconstruction (the ``lognormal_1d`` demo: a 1-D log-normal GP field with
masked Gaussian data, geoVI ``nonlinear_resample``) per configuration, with
the same strategy as ``sample_map`` and ``kl_map``. For each configuration:

- ``first_s``: wall time of the first global iteration (tracing + compilation + run),
- ``compile_s`` / ``n_compiles``: XLA backend compile time and number of compilations
  in the whole run (from ``jax.monitoring`` events),
- ``iter_median_s``: median wall time of the following iterations (steady state;
  they compile nothing — ``recompiles`` counts compilations after the first iteration),
- ``ratio``: ``iter_median_s`` over that of single-device ``vmap`` (chunk 1, the reproducible reference),
- ``bitwise``: final samples bitwise equal to the reference.

The row ``vmap(plain jit)`` compiles the engine steps with a plain ``jax.jit``
instead of :func:`shardvi.parallel.reproducible_jit` (XLA CSE on, constants
foldable): the cost of the reproducibility measures.

Prints a table and (``--json``) writes the records. Forced CPU devices share the
machine's cores, so this measures overheads, not multi-device speed-ups.
"""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import statistics
import sys
import time

os.environ.setdefault("JAX_PLATFORMS", "cpu")

import jax

jax.config.update("jax_num_cpu_devices", 4)
from shardvi.parallel import depth_first_cpu_schedule  # noqa: E402

depth_first_cpu_schedule()  # a model axis over these CPU devices
jax.config.update("jax_enable_x64", True)

import numpy as np  # noqa: E402
from jax import monitoring  # noqa: E402

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), ".."))
import shardvi as sv  # noqa: E402
from shardvi.examples import build_demo  # noqa: E402

_COMPILE = {"n": 0, "s": 0.0}


def _listener(name, duration, **kwargs):
    if name == "/jax/core/compile/backend_compile_duration":
        _COMPILE["n"] += 1
        _COMPILE["s"] += duration


monitoring.register_event_duration_secs_listener(_listener)


class _PlainJit:
    """Compile the engine steps with a plain ``jax.jit`` (no reproducibility measures) for one row."""

    def __enter__(self):
        import importlib

        # the module whose OptimizeVI compiles the engine steps (by its global ``reproducible_jit``)
        okl = importlib.import_module("shardvi.vi.engine")
        assert hasattr(okl, "OptimizeVI") and okl.reproducible_jit is not None
        self._mod, self._saved = okl, okl.reproducible_jit
        okl.reproducible_jit = lambda fn, platform=None, **kw: jax.jit(fn, **kw)

    def __exit__(self, *exc):
        self._mod.reproducible_jit = self._saved


def configurations():
    devs = jax.devices()
    yield "vmap", 1, sv.parallel.Vmap()
    yield "vmap(plain jit)", 1, (sv.parallel.Vmap(), _PlainJit())
    yield "vmap(chunk=None)", 1, sv.parallel.Vmap(chunk_size=None)
    yield "lax_map", 1, sv.parallel.LaxMap()
    for name, cls in (
        ("pmap", sv.parallel.Pmap),
        ("shard_map", sv.parallel.ShardMap),
        ("jit", sv.parallel.JitSharding),
    ):
        for n in (1, 2, 4):
            yield name, n, cls(devices=devs[:n])
    yield "shard_map(psum)", 4, sv.parallel.ShardMap(devices=devs[:4], reduce="psum")


def run_one(problem, strategy, n_samples, iterations):
    configs = dict(
        linear_sampling=sv.CGConfig(tol=1e-8, maxiter=200),
        nonlinear_update=sv.NewtonCGConfig(xtol=1e-8, maxiter=10),
        kl_minimization=sv.NewtonCGConfig(xtol=1e-8, maxiter=10),
    )
    opt = sv.OptimizeVI(
        problem.likelihood,
        iterations + 1,
        n_samples=n_samples,
        sample_mode="nonlinear_resample",
        sample_map=strategy,
        kl_map=strategy,
        **configs,
    )
    samples = sv.Samples(problem.position, jax.tree.map(lambda p: p[None][:0], problem.position), None)
    state = opt.init_state(jax.random.PRNGKey(0))
    n0, s0 = _COMPILE["n"], _COMPILE["s"]
    t0 = time.perf_counter()
    samples, state = opt.update(samples, state)
    jax.block_until_ready(samples.pos)
    first = time.perf_counter() - t0
    n1 = _COMPILE["n"]
    times = []
    for _ in range(iterations):
        t = time.perf_counter()
        samples, state = opt.update(samples, state)
        jax.block_until_ready(samples.pos)
        times.append(time.perf_counter() - t)
    arrays = [np.asarray(x) for x in jax.tree.leaves((samples.pos, samples.residuals))]
    return dict(
        first_s=first,
        compile_s=_COMPILE["s"] - s0,
        n_compiles=_COMPILE["n"] - n0,
        recompiles=_COMPILE["n"] - n1,
        iter_median_s=statistics.median(times),
        iter_s=times,
    ), arrays


def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--npix", type=int, default=128)
    ap.add_argument("--samples", type=int, default=4, help="antithetic sample pairs")
    ap.add_argument("--iterations", type=int, default=3, help="timed global iterations after the first")
    ap.add_argument("--json", default=None, help="also write the records to this file")
    args = ap.parse_args(argv)
    problem = build_demo("lognormal_1d", npix=args.npix, seed=0)
    records, ref_arrays, ref_time = [], None, None
    for name, n_dev, strategy in configurations():
        strategy, context = strategy if isinstance(strategy, tuple) else (strategy, contextlib.nullcontext())
        with context:
            rec, arrays = run_one(problem, strategy, args.samples, args.iterations)
        if ref_arrays is None:
            ref_arrays, ref_time = arrays, rec["iter_median_s"]
        rec.update(
            strategy=name,
            devices=n_dev,
            ratio=rec["iter_median_s"] / ref_time,
            bitwise=all(np.array_equal(a, b) for a, b in zip(arrays, ref_arrays)),
        )
        records.append(rec)
        print(json.dumps(rec), flush=True)
    meta = dict(
        npix=args.npix,
        n_samples=args.samples,
        timed_iterations=args.iterations,
        jax=jax.__version__,
        platform=jax.devices()[0].platform,
        cpu_count=os.cpu_count(),
    )
    print(json.dumps({"meta": meta}))
    print()
    print(
        f"lognormal_1d npix={args.npix}, {args.samples} pairs, nonlinear_resample; median of {args.iterations} "
        f"iterations; {os.cpu_count()} CPU cores shared by all forced devices"
    )
    head = (
        f"{'strategy':<17}{'dev':>4}{'first s':>9}{'compile s':>10}{'#comp':>6}{'recomp':>7}"
        f"{'iter s':>9}{'ratio':>7}  bitwise"
    )
    print(head)
    print("-" * len(head))
    for r in records:
        print(
            f"{r['strategy']:<17}{r['devices']:>4}{r['first_s']:>9.2f}{r['compile_s']:>10.2f}"
            f"{r['n_compiles']:>6}{r['recompiles']:>7}{r['iter_median_s']:>9.3f}{r['ratio']:>7.2f}  "
            f"{'yes' if r['bitwise'] else 'no'}"
        )
    if args.json:
        with open(args.json, "w") as f:
            json.dump({"meta": meta, "records": records}, f, indent=2)


if __name__ == "__main__":
    main()
