"""Model parallelism: per-process memory and time of a radio reconstruction whose visibilities are split.

    python benchmarks/bench_model_parallel.py [--npix 128] [--vis 2097152] [--json out.json]
    python benchmarks/bench_model_parallel.py --smoke          # seconds

For ``P`` in ``--processes`` (default 1, 2, 4): ``P`` processes on
127.0.0.1 (``jax.distributed``, one CPU device each) run one reconstruction
with ``ShardMap(model_shards=P)``: the ``--vis`` visibilities cut into
``--blocks`` data blocks, each process holding and evaluating ``blocks / P``
of them. No process loads another's data: block ``b``'s baselines and noise
come from a generator seeded with ``(seed, b)``, each process builds the
likelihood of its own blocks and :func:`shardvi.vi.blocked.assemble_process_blocks`
joins them. Problem: a log-normal sky ``exp(f)``, ``f`` a correlated field on
``--npix``\\ ² pixels, seen by ``sv.NUFFTResponse`` (eps 1e-6) with complex
Gaussian noise; ``--pairs`` antithetic pairs, ``--iterations`` MGVI
iterations with fixed work (sampling CG and KL Newton-CG iteration counts).

Per process: ``base`` the resident memory of the idle JAX runtime (after
``jax.distributed`` and one small computation, before the problem), ``peak``
the peak resident memory (``ru_maxrss``), ``above = peak - base``. Per ``P``:
the largest ``above`` over its processes, its ratio to ``P = 1``, the median
time per iteration after the first, and whether the final position and
residuals are bitwise those of ``P = 1``. Also one process with 4 forced CPU
devices, ``ShardMap(model_shards=4)`` against ``Vmap()`` (time only: the
forced devices share one process's memory).

On this machine all processes share 2 cores: times with ``P > 2`` are
oversubscribed; the memory columns are what the benchmark is for.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import time

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, HERE)
import _common as C  # noqa: E402

DL = 2.5e-6  # pixel size (radians)


# ================================================================================================ child
def _sky_model(sv, jnp, npix):
    cfm = sv.CorrelatedFieldMaker("sky", dtype=jnp.float64)
    cfm.set_amplitude_total_offset(0.0, (0.3, 0.1))
    cfm.add_fluctuations((npix, npix), 1.0 / npix, fluctuations=(1.0, 0.2), loglogavgslope=(-3.0, 0.3), prefix="d")
    return cfm.finalize()


def _observe(resp, field, xi, inputs):
    import jax.numpy as jnp

    return resp(jnp.exp(field(xi)), inputs)


def _local_blocks(args, blocks, np):
    """``(u, v, noise)`` of the given blocks, each block from its own generator (seed, block), filled in place."""
    size = args.vis // args.blocks
    u, v = np.empty(size * len(blocks)), np.empty(size * len(blocks))
    n = np.empty(size * len(blocks), np.complex128)
    for i, b in enumerate(blocks):
        rng = np.random.default_rng([args.seed, b])
        sl = slice(i * size, (i + 1) * size)
        u[sl] = rng.uniform(-0.4 / DL, 0.4 / DL, size)
        v[sl] = rng.uniform(-0.4 / DL, 0.4 / DL, size)
        n.real[sl] = rng.normal(size=size)
        n.imag[sl] = rng.normal(size=size)
    return u, v, n


def child(args):
    import resource

    os.environ["JAX_PLATFORMS"] = "cpu"
    if args.mode == "forced":
        import jax

        jax.config.update("jax_num_cpu_devices", 4)
        from shardvi.parallel import depth_first_cpu_schedule

        depth_first_cpu_schedule()  # a model axis over these CPU devices
    else:
        import shardvi as sv

        C.join_local_runtime(sv, args.port, args.nproc, args.pid)
    import jax
    import jax.numpy as jnp
    import numpy as np
    from jax.tree_util import Partial

    jax.config.update("jax_enable_x64", True)
    import shardvi as sv
    from shardvi.vi.blocked import assemble_process_blocks

    jax.block_until_ready(jnp.ones(4) + 1)
    base = C.current_rss_mib()
    phases = {}

    def mark(name):  # (current, peak) resident MiB after a phase
        phases[name] = (round(C.current_rss_mib()), round(C.peak_rss_mib()))

    field = _sky_model(sv, jnp, args.npix)
    truth = jnp.exp(field(field.init(jax.random.PRNGKey(args.seed))))
    scale = float(jnp.sum(truth))  # |V(0)|: the visibility scale; noise std relative to it (the same in every process)
    sigma = args.noise * scale
    probe = sv.NUFFTResponse(np.zeros(1), np.zeros(1), (args.npix, args.npix), DL, eps=1e-6, dtype=np.float64)
    template = probe.without_points()

    if args.mode == "forced":
        strategies = {"vmap": sv.parallel.Vmap(), "shard_map-4": sv.parallel.ShardMap(model_shards=4)}
        mine = range(args.blocks)
    else:
        k = args.nproc
        strategies = {f"P={k}": sv.parallel.ShardMap(devices=jax.devices(), model_shards=k)}
        per = args.blocks // k
        mine = range(args.pid * per, (args.pid + 1) * per)
    mark("field")
    u, v, noise = _local_blocks(args, mine, np)
    mark("baselines")
    resp = sv.NUFFTResponse(u, v, (args.npix, args.npix), DL, eps=1e-6, dtype=np.float64)
    data = noise
    data *= sigma
    size = args.vis // args.blocks
    for i in range(len(mine)):  # the truth's visibilities block by block (one block of NUFFT temporaries)
        sl = slice(i * size, (i + 1) * size)
        data[sl] += np.asarray(template(truth, {"u": jnp.asarray(u[sl]), "v": jnp.asarray(v[sl])}))
    del noise
    model = sv.Model(Partial(_observe, template, field), field.domain, data_inputs=resp.data_inputs)
    del resp
    mark("visibilities")
    local = sv.Gaussian(data, noise_std=sigma).amend(model, data_blocks=len(mine))
    del data, u, v
    mark("likelihood")
    n = field.size
    lin = sv.CGConfig(tol=None, maxiter=args.cg_iters)
    inner = sv.CGConfig(tol=0.5, maxiter=args.cg_iters)
    kl = sv.NewtonCGConfig(xtol=None, maxiter=args.newton_iters, cg=inner)
    pos0 = jax.tree.map(lambda d: jnp.zeros(d.shape, d.dtype), field.domain)
    out = []
    for name, strat in strategies.items():
        lh = local if args.mode == "forced" or args.nproc == 1 else assemble_process_blocks(local, strat)
        if args.mode != "forced":
            del local  # the data live once: in the (placed) global likelihood
        lh = strat.place(lh)
        mark(f"{name}: assembled")
        times = []
        t0 = [time.perf_counter()]

        def callback(samples, state, t0=t0, times=times):
            times.append(time.perf_counter() - t0[0])
            t0[0] = time.perf_counter()

        samples, _ = sv.optimize_kl(
            lh,
            pos0,
            key=jax.random.PRNGKey(1),
            n_total_iterations=args.iterations,
            n_samples=args.pairs,
            sample_mode="linear_resample",
            linear_sampling=lin,
            kl_minimization=kl,
            sample_map=strat,
            kl_map=strat,
            progress=False,
            callback=callback,
        )
        mark(f"{name}: run")
        arrays = [np.asarray(a) for a in jax.tree.leaves((samples.pos, samples.residuals))]
        if args.out and args.pid == 0:
            np.savez(args.out.replace(".npz", f"_{name.replace('=', '')}.npz"), *arrays)
        out.append(
            dict(
                config=name,
                pid=args.pid,
                nproc=args.nproc,
                base_mib=base,
                peak_mib=resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024,
                first_s=times[0],
                iter_s=C.median(times[1:]) if len(times) > 1 else None,
                n_latent=n,
                phases=dict(phases),
            )
        )
    for rec in out:
        print(json.dumps(rec), flush=True)
    if args.mode != "forced":
        sv.parallel.shutdown_distributed()


# ================================================================================================ parent
def _spawn(args, nproc, out, mode="distributed"):
    port = C.free_port()
    base = [sys.executable, os.path.abspath(__file__), "--child", "--mode", mode, "--port", str(port)]
    base += ["--nproc", str(nproc), "--out", out]
    for flag in ("npix", "vis", "blocks", "pairs", "iterations", "cg_iters", "newton_iters", "seed", "noise"):
        base += [f"--{flag.replace('_', '-')}", str(getattr(args, flag))]
    n = 1 if mode == "forced" else nproc
    return C.spawn_processes(base, n, args.timeout, f"P={nproc} ({mode})")


def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--npix", type=int, default=128)
    ap.add_argument("--vis", type=int, default=2**21, help="visibilities (a multiple of --blocks)")
    ap.add_argument("--blocks", type=int, default=8)
    ap.add_argument("--pairs", type=int, default=2)
    ap.add_argument("--iterations", type=int, default=3)
    ap.add_argument("--cg-iters", type=int, default=8)
    ap.add_argument("--newton-iters", type=int, default=2)
    ap.add_argument("--noise", type=float, default=0.02)
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--processes", default="1,2,4")
    ap.add_argument("--no-forced", action="store_true", help="skip the 4-forced-devices run")
    ap.add_argument("--timeout", type=float, default=3000)
    ap.add_argument("--smoke", action="store_true", help="tiny problem (seconds)")
    ap.add_argument("--json")
    ap.add_argument("--child", action="store_true", help=argparse.SUPPRESS)
    ap.add_argument("--mode", default="distributed", help=argparse.SUPPRESS)
    ap.add_argument("--port", type=int, default=0, help=argparse.SUPPRESS)
    ap.add_argument("--nproc", type=int, default=1, help=argparse.SUPPRESS)
    ap.add_argument("--pid", type=int, default=0, help=argparse.SUPPRESS)
    ap.add_argument("--out", default="", help=argparse.SUPPRESS)
    args = ap.parse_args(argv)
    if args.smoke:
        args.npix, args.vis, args.iterations, args.cg_iters, args.newton_iters = 32, 4096, 2, 3, 1
    if args.child:
        return child(args)
    if args.vis % args.blocks:
        ap.error(f"--vis {args.vis} must be a multiple of --blocks {args.blocks}")
    import tempfile

    import numpy as np

    procs = [int(p) for p in args.processes.split(",")]
    for p in procs:
        if args.blocks % p:
            ap.error(f"--blocks {args.blocks} must be a multiple of every process count, not of {p}")
    rows, records = [], []
    with tempfile.TemporaryDirectory() as tmp:
        ref = None
        for p in procs:
            out = os.path.join(tmp, "result.npz")
            recs = _spawn(args, p, out)
            records += recs
            arrays = np.load(out.replace(".npz", f"_P{p}.npz"))
            arrays = [arrays[f"arr_{i}"] for i in range(len(arrays.files))]
            ref = arrays if ref is None else ref
            bitwise = all(np.array_equal(a, b) for a, b in zip(arrays, ref))
            rows.append(C.memory_row(p, recs, bitwise))
            print(json.dumps(rows[-1]), flush=True)
        forced = [] if args.no_forced else _spawn(args, 4, os.path.join(tmp, "forced.npz"), mode="forced")
    table = C.memory_table(rows)
    print(
        f"\n{args.npix}^2 image, {args.vis} visibilities in {args.blocks} blocks, {args.pairs} pairs, "
        f"{args.iterations} MGVI iterations; one CPU device per process, 2 cores shared by all processes\n"
    )
    print(table)
    if forced:
        print("\none process, 4 forced CPU devices (time only):\n")
        fb = [[r["config"], C.fmt(r["first_s"], ".1f"), C.fmt(r["iter_s"], ".2f")] for r in forced]
        print(C.markdown_table(["config", "first s", "iter s"], fb))
    if args.json:
        C.write_json(args.json, dict(meta=C.machine_meta() | vars(args), rows=rows, forced=forced, records=records))
    return 0


if __name__ == "__main__":
    sys.exit(main())
