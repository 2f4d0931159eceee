"""Field parallelism: per-process memory and time of a correlated-field reconstruction whose field is split.

    python benchmarks/bench_field_memory.py [--npix 2048] [--blocks 8] [--json out.json]
    python benchmarks/bench_field_memory.py --mask vector   # data of an sv.Mask, whole on every process
    python benchmarks/bench_field_memory.py --mask grid     # the same data on the grid, each process its rows
    python benchmarks/bench_field_memory.py --smoke          # seconds

For ``P`` in ``--processes`` (default 1, 2, 4): ``P`` processes on
127.0.0.1 (``jax.distributed``, one CPU device each) run one reconstruction
with ``ShardMap(model_shards=P)`` of a likelihood amended with
``field_blocks=--blocks``: the field's excitations, the data, the samples'
residuals and every vector of the sampling CG and the KL Newton-CG are split
into slabs of grid rows, each process holding ``N / P`` of the ``N`` rows
(the correlated field's transform is the slab FFT, one all-to-all per
transpose). Problem: a log-normal field ``exp(f)``, ``f`` a 2-D correlated
field on ``--npix``\\ ² pixels, observed at every pixel with Gaussian noise;
``--pairs`` antithetic pairs, ``--iterations`` MGVI iterations with fixed
work (sampling CG and KL Newton-CG iteration counts). Each process builds
only its rows of the data and of the start position's excitations
(``sv.parallel.field_array``; every row's noise from its own seed) and of the
field's power index (``sv.parallel.field_model``; ``--power-index whole``:
every process holds all of it).

Per process: ``base`` the resident memory of the idle JAX runtime (after
``jax.distributed`` and one small computation, before the problem), ``peak``
the peak resident memory (``ru_maxrss``), ``above = peak - base``. Per ``P``:
the largest ``above`` over its processes, its ratio to ``P = 1``, the median
time per iteration after the first, and whether the final position and
residuals (assembled from the processes' rows) are bitwise those of ``P = 1``.

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


# ================================================================================================ child
def _field(sv, jnp, npix):
    cfm = sv.CorrelatedFieldMaker("f", dtype=jnp.float64)
    cfm.set_amplitude_total_offset(0.0, (0.3, 0.1))
    cfm.add_fluctuations((npix, npix), 1.0 / npix, fluctuations=(1.0, 0.2), loglogavgslope=(-3.0, 0.3), prefix="d")
    return cfm.finalize()


def _exp_field(cf, xi):
    import jax.numpy as jnp

    return jnp.exp(cf(xi))


def _data_rows(np, npix, seed, sigma, rows):
    """The rows ``rows`` of a smooth positive image plus white noise (each row's noise from its own seed: any
    process builds any rows alike, without the others)."""
    x = np.linspace(0.0, 2 * np.pi, npix, endpoint=False)
    d = 1.0 + 0.5 * np.sin(x[rows, None] * 3) * np.cos(x[None, :] * 2)
    for j, r in enumerate(range(rows.start, rows.stop)):
        d[j] += sigma * np.random.default_rng([seed, r]).normal(size=npix)
    return d


def _masked_exp_field(cf, response, xi):
    import jax.numpy as jnp

    return response(jnp.exp(cf(xi)))


def _observed(np, npix):
    """The pixels a ``--mask`` problem observes: 60 %, a fixed pattern (the same on every process)."""
    r, c = np.ogrid[:npix, :npix]
    return (r * 7 + c * 13) % 10 < 6


def split_problem(
    sv, strategy, npix: int, blocks: int, seed: int = 0, noise: float = 0.1, mask: str = "none", power_index="split"
):
    """``(field, likelihood, start)``: the log-normal field amended with ``field_blocks=blocks``, its data and the
    zero start's excitations split by rows over ``strategy``'s model axis (each process builds only its rows).

    ``mask``: ``"none"`` (data at every pixel), ``"vector"`` (60 % of the pixels seen through ``sv.Mask``, the
    data given as the mask's vector, whole on every process) or ``"grid"`` (the same data given on the grid,
    each process building its rows). ``power_index``: ``"split"`` (each process builds its rows of the field's
    power index, ``sv.parallel.field_model``) or ``"whole"`` (every process holds the whole index)."""
    import jax
    import jax.numpy as jnp
    import numpy as np
    from jax.tree_util import Partial

    cf = _field(sv, jnp, npix)
    if power_index == "split":
        cf = sv.parallel.field_model(strategy, cf)
    grid = (npix, npix)
    if mask == "none":
        model = sv.Model(Partial(_exp_field, cf), cf.domain)
        data = sv.parallel.field_array(strategy, grid, lambda rows: _data_rows(np, npix, seed, noise, rows))
    else:
        observed = _observed(np, npix)
        model = sv.Model(Partial(_masked_exp_field, cf, sv.Mask(observed)), cf.domain)
        if mask == "vector":
            data = _data_rows(np, npix, seed, noise, slice(0, npix))[observed]
        else:
            data = sv.parallel.field_array(strategy, grid, lambda rows: _data_rows(np, npix, seed, noise, rows))
    lh = sv.Gaussian(data, noise_std=noise).amend(model, field_blocks=blocks)

    def zeros(d):
        if tuple(d.shape) == grid:
            return sv.parallel.field_array(strategy, grid, lambda rows: np.zeros((rows.stop - rows.start, npix)))
        return jnp.zeros(d.shape, d.dtype)

    return cf, lh, jax.tree.map(zeros, cf.domain)


def child(args):
    import resource

    os.environ["JAX_PLATFORMS"] = "cpu"
    import shardvi as sv

    C.join_local_runtime(sv, args.port, args.nproc, args.pid, cap_heaps=args.trim_host_memory)
    import jax
    import jax.numpy as jnp
    import numpy as np

    jax.config.update("jax_enable_x64", True)

    jax.block_until_ready(jnp.ones(4) + 1)
    base = C.current_rss_mib()
    strategy = sv.parallel.ShardMap(devices=jax.devices(), model_shards=args.nproc)
    cf, lh, pos0 = split_problem(
        sv, strategy, args.npix, args.blocks, args.seed, args.noise, args.mask, args.power_index
    )
    lin = sv.CGConfig(tol=None, maxiter=args.cg_iters)
    inner = sv.CGConfig(tol=None, maxiter=args.cg_iters)
    kl = sv.NewtonCGConfig(xtol=None, maxiter=args.newton_iters, cg=inner)
    times = []
    t0 = [time.perf_counter()]

    def callback(samples, state):
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
        sample_map=strategy,
        kl_map=strategy,
        progress=False,
        callback=callback,
        trim_host_memory=args.trim_host_memory,
    )
    jax.block_until_ready((samples.pos, samples.residuals))
    peak = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024
    # this process's rows of every array (and the replicated ones whole): the parent assembles them
    parts = {}
    for k, a in enumerate(jax.tree.leaves((samples.pos, samples.residuals))):
        for j, s in enumerate(a.addressable_shards):
            idx = [(sl.start or 0, sl.stop if sl.stop is not None else n) for sl, n in zip(s.index, a.shape)]
            parts[f"{k}_{j}_data"] = np.asarray(s.data)
            parts[f"{k}_{j}_index"] = np.asarray(idx, dtype=np.int64).reshape(-1, 2)
            parts[f"{k}_shape"] = np.asarray(a.shape, dtype=np.int64)
    np.savez(args.out.replace(".npz", f"_{args.pid}.npz"), **parts)
    rec = dict(
        pid=args.pid,
        nproc=args.nproc,
        base_mib=base,
        peak_mib=peak,
        first_s=times[0],
        iter_s=C.median(times[1:]) if len(times) > 1 else None,
        n_latent=cf.size,
    )
    print(json.dumps(rec), flush=True)
    sv.parallel.shutdown_distributed()


# ================================================================================================ parent
def _assemble(out, nproc, np):
    """The whole final arrays from the processes' parts."""
    arrays = {}
    for pid in range(nproc):
        z = np.load(out.replace(".npz", f"_{pid}.npz"))
        for key in z.files:
            if not key.endswith("_shape"):
                continue
            k = int(key.split("_")[0])
            if k not in arrays:
                arrays[k] = np.full(tuple(z[key]), np.nan)
            j = 0
            while f"{k}_{j}_data" in z.files:
                idx = tuple(slice(a, b) for a, b in z[f"{k}_{j}_index"])
                arrays[k][idx] = z[f"{k}_{j}_data"]
                j += 1
    return [arrays[k] for k in sorted(arrays)]


def _spawn(args, nproc, out):
    argv = [sys.executable, os.path.abspath(__file__), "--child", "--port", str(C.free_port())]
    argv += ["--nproc", str(nproc), "--out", out]
    flags = ("npix", "blocks", "pairs", "iterations", "cg_iters", "newton_iters", "seed", "noise")
    flags += ("mask", "power_index")
    for flag in flags:
        argv += [f"--{flag.replace('_', '-')}", str(getattr(args, flag))]
    if args.trim_host_memory:
        argv.append("--trim-host-memory")
    return C.spawn_processes(argv, nproc, args.timeout, f"P={nproc}")


def add_problem_arguments(ap) -> None:
    """The problem's and the runs' options but the grid size (also ``bench_field_largest.py``'s)."""
    ap.add_argument("--blocks", type=int, default=8, help="field blocks (a multiple of every process count)")
    ap.add_argument("--pairs", type=int, default=2)
    ap.add_argument("--iterations", type=int, default=3)
    ap.add_argument("--cg-iters", type=int, default=3)
    ap.add_argument("--newton-iters", type=int, default=1)
    ap.add_argument("--noise", type=float, default=0.1)
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument(
        "--mask",
        choices=("none", "vector", "grid"),
        default="none",
        help="none: data at every pixel; vector / grid: 60 %% of the pixels through sv.Mask, the data given as "
        "the mask's vector (whole on every process) or on the grid (each process its rows)",
    )
    ap.add_argument(
        "--power-index",
        choices=("split", "whole"),
        default="split",
        help="split: each process builds its rows of the field's power index (sv.parallel.field_model); "
        "whole: every process holds all of it",
    )
    ap.add_argument(
        "--trim-host-memory",
        action="store_true",
        help="the engine's opt-in allocator settings (optimize_kl(trim_host_memory=True), "
        "initialize_distributed(cap_heaps=True))",
    )


def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--npix", type=int, default=2048)
    add_problem_arguments(ap)
    ap.add_argument("--processes", default="1,2,4")
    ap.add_argument("--timeout", type=float, default=3000)
    ap.add_argument("--smoke", action="store_true", help="tiny problem (seconds)")
    ap.add_argument("--json")
    ap.add_argument("--child", action="store_true", help=argparse.SUPPRESS)
    ap.add_argument("--port", type=int, default=0, help=argparse.SUPPRESS)
    ap.add_argument("--nproc", type=int, default=1, help=argparse.SUPPRESS)
    ap.add_argument("--pid", type=int, default=0, help=argparse.SUPPRESS)
    ap.add_argument("--out", default="", help=argparse.SUPPRESS)
    args = ap.parse_args(argv)
    if args.smoke:
        args.npix, args.iterations, args.cg_iters = 32, 2, 2
    if args.child:
        return child(args)
    import tempfile

    import numpy as np

    procs = [int(p) for p in args.processes.split(",")]
    for p in procs:
        if args.blocks % p:
            ap.error(f"--blocks {args.blocks} must be a multiple of every process count, not of {p}")
    if args.npix % args.blocks:
        ap.error(f"--blocks {args.blocks} must divide --npix {args.npix}")
    rows, records = [], []
    with tempfile.TemporaryDirectory() as tmp:
        ref = None
        for p in procs:
            out = os.path.join(tmp, f"P{p}.npz")
            recs = _spawn(args, p, out)
            records += recs
            arrays = _assemble(out, p, np)
            ref = arrays if ref is None else ref
            bitwise = len(arrays) == len(ref) and all(np.array_equal(a, b) for a, b in zip(arrays, ref))
            rows.append(C.memory_row(p, recs, bitwise))
            print(json.dumps(rows[-1]), flush=True)
    table = C.memory_table(rows)
    print(
        f"\n{args.npix}^2 correlated field ({args.npix**2} excitations) with data "
        f"{'at every pixel' if args.mask == 'none' else 'at 60 % of the pixels, given ' + args.mask}, "
        f"{args.blocks} field blocks, {args.pairs} pairs, {args.iterations} MGVI iterations; one CPU device per "
        f"process, 2 cores shared by all processes\n"
    )
    print(table)
    if args.json:
        C.write_json(args.json, dict(meta=C.machine_meta() | vars(args), rows=rows, records=records))
    return 0


if __name__ == "__main__":
    sys.exit(main())
