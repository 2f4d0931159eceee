"""How well the planner predicts memory: ``sv.parallel.plan``'s peak per device against the measured peak.

    python benchmarks/bench_plan.py [--sizes 256,512] [--pairs 4] [--json out.json]
    python benchmarks/bench_plan.py --radio 64,64 --data-blocks 7 --sizes 64   # visibilities in data blocks
    python benchmarks/bench_plan.py --field-processes 4 --sizes 512   # the field split over 4 processes
    python benchmarks/bench_plan.py --smoke          # seconds: a 32^2 pointwise model

For each size and chunk size (``Vmap`` chunk 1 and all samples at once, one
CPU device per child process) a child builds the correlated-field problem of
``benchmarks/_common.py`` (with ``--radio ANTENNAS,TIMES``: the radio demo's
``size``² sky seen through ``sv.NUFFTResponse`` by ``ANTENNAS`` antennas at
``TIMES`` times, the visibilities cut into ``--data-blocks`` blocks; with ``--field-processes P``:
``bench_field_memory.py``'s log-normal field split into ``P`` row blocks over ``P`` processes on 127.0.0.1, each
building only its rows, ``ShardMap`` with ``model_shards=P`` and chunk 1; the largest process counts), asks the
planner for its prediction, runs one
geoVI iteration (which compiles every step), resets the kernel's peak RSS
counter (``/proc/self/clear_refs``), runs a second iteration and reports

- ``predicted``: the plan's peak per device (compiled steps' arguments,
  outputs and temporaries, plus the samples between steps);
- ``measured``: the peak RSS of the second iteration above the RSS before it,
  plus the arrays the prediction counts that were already alive then (the
  previous samples, the position and the data): the memory the iteration's
  arrays needed, without the compiler and the runtime.

On an accelerator (``JAX_PLATFORMS=cuda,cpu``) ``measured`` is instead the
device allocator's peak over both iterations (``memory_stats()["peak_bytes_in_use"]``:
every array on the device, the compiler's autotuning scratch included) and
``device_floor`` the peak before the first iteration (building the problem):
a measured peak at the floor says only that the iteration needed no more.

The ratio ``measured / predicted`` is the number to read (target: within a
factor of 1.5).
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import time

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import _common as C


def _hwm_bytes() -> int:
    with open("/proc/self/status") as f:
        for line in f:
            if line.startswith("VmHWM:"):
                return int(line.split()[1]) * 1024
    raise RuntimeError("no VmHWM in /proc/self/status")


def _reset_hwm() -> None:
    with open("/proc/self/clear_refs", "w") as f:
        f.write("5")


def _radio(args, jax):
    """``(likelihood, position, data)`` of the radio demo's problem with its visibilities in data blocks."""
    import importlib.util

    spec = importlib.util.spec_from_file_location("radio_imaging", os.path.join(C.ROOT, "demos", "radio_imaging.py"))
    demo = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(demo)
    antennas, times = (int(v) for v in args.radio.split(","))
    prob = demo.RadioProblem(args.size, antennas, times, noise_level=0.1, seed=0)
    position = jax.tree.map(lambda x: 0.1 * x, prob.field.init(jax.random.PRNGKey(1)))
    return prob.blocked_likelihood(args.data_blocks), position, prob.data


def child(args) -> dict:
    jax = C.setup_jax()
    sv = C.import_shardvi()
    if args.radio:
        lh, position, data = _radio(args, jax)
    else:
        problem = C.Problem((args.size, args.size), model="pointwise" if args.smoke else "cf")
        lh, position, data = problem.shardvi_likelihood(), problem.position, problem.data
    strategy = sv.parallel.Vmap(chunk_size=None if args.chunk == "all" else int(args.chunk))
    settings = dict(
        sample_mode="nonlinear_resample",
        linear_sampling=sv.CGConfig(tol=1e-4, maxiter=60),
        nonlinear_update=sv.NewtonCGConfig(xtol=1e-4, maxiter=3, cg=sv.CGConfig(tol=0.1, maxiter=30)),
        kl_minimization=sv.NewtonCGConfig(xtol=None, absdelta=0.01, maxiter=5, cg=sv.CGConfig(tol=0.5, maxiter=30)),
    )
    t0 = time.perf_counter()
    plan = sv.parallel.plan(lh, position, n_samples=args.pairs, devices=jax.devices()[:1], **settings)
    plan_s = time.perf_counter() - t0
    label = "Vmap chunk " + ("all" if args.chunk == "all" else str(args.chunk))
    cand = next(c for c in plan.candidates if c.label == label)
    opt = sv.OptimizeVI(
        lh, 2, n_samples=args.pairs, sample_map=strategy, kl_map=strategy, progress=False, precompile=False, **settings
    )
    pos = jax.tree.map(lambda x: jax.numpy.asarray(x), position)
    samples = sv.Samples(pos, jax.tree.map(lambda p: jax.numpy.zeros((0, *p.shape), p.dtype), pos))
    state = opt.init_state(jax.random.PRNGKey(0))
    floor = C.device_peak_mib()  # an accelerator's peak before the run: the problem's set-up
    samples, state = opt.update(samples, state)  # compiles every step
    jax.block_until_ready(samples.residuals)
    alive = sum(x.nbytes for x in jax.tree.leaves((samples.residuals, samples.pos, data)))
    before = C.current_rss_mib() * 2**20
    _reset_hwm()
    samples, state = opt.update(samples, state)
    jax.block_until_ready(samples.residuals)
    measured = _hwm_bytes() - before + alive
    on_device = C.device_peak_mib()
    if on_device is not None:  # an accelerator: its allocator's peak over both iterations, everything included
        measured = on_device * 2**20
    return dict(
        size=args.size,
        chunk=args.chunk,
        pairs=args.pairs,
        n_latent=sum(x.size for x in jax.tree.leaves(pos)),
        n_data=int(data.size),
        platform=jax.devices()[0].platform,
        plan_s=plan_s,
        device_floor=None if floor is None else int(floor * 2**20),
        data_blocks=args.data_blocks if args.radio else None,
        predicted=cand.peak,
        measured=int(measured),
        ratio=measured / cand.peak,
        steps=cand.steps,
    )


def field_child(args) -> dict:
    """One of ``--field-processes`` processes: the plan's prediction for its device and its measured peak."""
    import bench_field_memory as F

    sv = C.import_shardvi()
    C.join_local_runtime(sv, args.port, args.field_processes, args.pid)
    import jax
    import jax.numpy as jnp

    jax.config.update("jax_enable_x64", True)
    nproc = args.field_processes
    strategy = sv.parallel.ShardMap(devices=jax.devices(), model_shards=nproc)
    _, lh, position = F.split_problem(sv, strategy, args.size, nproc)
    data = lh.likelihood.data
    settings = dict(
        sample_mode="nonlinear_resample",
        linear_sampling=sv.CGConfig(tol=1e-4, maxiter=60),
        nonlinear_update=sv.NewtonCGConfig(xtol=1e-4, maxiter=3, cg=sv.CGConfig(tol=0.1, maxiter=30)),
        kl_minimization=sv.NewtonCGConfig(xtol=None, absdelta=0.01, maxiter=5, cg=sv.CGConfig(tol=0.5, maxiter=30)),
    )
    plan = sv.parallel.plan(lh, position, n_samples=args.pairs, devices=jax.devices(), **settings)
    label = f"ShardMap 1x{nproc} chunk 1"
    cand = next(c for c in plan.candidates if c.label == label)
    opt = sv.OptimizeVI(
        lh, 2, n_samples=args.pairs, sample_map=strategy, kl_map=strategy, progress=False, precompile=False, **settings
    )
    samples = sv.Samples(position, jax.tree.map(lambda p: jnp.zeros((0, *p.shape), p.dtype), position))
    state = opt.init_state(jax.random.PRNGKey(0))
    samples, state = opt.update(samples, state)  # compiles every step
    jax.block_until_ready(samples.residuals)

    def local_bytes(tree):
        return sum(sum(s.data.nbytes for s in x.addressable_shards) for x in jax.tree.leaves(tree))

    alive = local_bytes((samples.residuals, samples.pos, data))
    before = C.current_rss_mib() * 2**20
    _reset_hwm()
    samples, state = opt.update(samples, state)
    jax.block_until_ready(samples.residuals)
    measured = _hwm_bytes() - before + alive
    out = dict(size=args.size, chunk="1", pairs=args.pairs, processes=nproc, pid=args.pid, predicted=cand.peak)
    out.update(measured=int(measured), ratio=measured / cand.peak, steps=cand.steps, data_blocks=None, n_data=data.size)
    sv.parallel.shutdown_distributed()
    return out


def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--sizes", default="256,512")
    ap.add_argument("--pairs", type=int, default=4)
    ap.add_argument("--chunks", default="1,all")
    ap.add_argument("--json", default=None)
    ap.add_argument("--smoke", action="store_true")
    ap.add_argument("--radio", default=None, help="ANTENNAS,TIMES: the radio demo's problem in --data-blocks blocks")
    ap.add_argument("--data-blocks", type=int, default=8)
    ap.add_argument("--field-processes", type=int, default=None, help="P: the field split over P processes")
    ap.add_argument("--child", action="store_true", help=argparse.SUPPRESS)
    ap.add_argument("--size", type=int, default=None, help=argparse.SUPPRESS)
    ap.add_argument("--chunk", default=None, help=argparse.SUPPRESS)
    ap.add_argument("--port", type=int, default=0, help=argparse.SUPPRESS)
    ap.add_argument("--pid", type=int, default=0, help=argparse.SUPPRESS)
    args = ap.parse_args(argv)
    if args.child:
        print(json.dumps(field_child(args) if args.field_processes else child(args)))
        return 0
    sizes = [32] if args.smoke else [int(s) for s in args.sizes.split(",")]
    rows = []
    for size in sizes:
        if args.field_processes:
            argv_child = [sys.executable, os.path.abspath(__file__), "--child", "--size", str(size)]
            argv_child += ["--pairs", str(args.pairs), "--field-processes", str(args.field_processes)]
            argv_child += ["--port", str(C.free_port())]
            recs = C.spawn_processes(argv_child, args.field_processes, 3600, f"{size}^2 over {args.field_processes}")
            r = max(recs, key=lambda x: x["measured"])
            r["predicted"] = max(x["predicted"] for x in recs)
            r["ratio"] = r["measured"] / r["predicted"]
            rows.append(r)
            print(
                f"{size}^2 over {args.field_processes} processes: predicted {r['predicted'] / 2**20:.1f} MiB, "
                f"measured {r['measured'] / 2**20:.1f} MiB (largest process), ratio {r['ratio']:.2f}",
                flush=True,
            )
            continue
        for chunk in args.chunks.split(","):
            argv_child = ["--child", "--size", str(size), "--chunk", chunk, "--pairs", str(args.pairs)]
            argv_child += ["--smoke"] if args.smoke else []
            argv_child += ["--radio", args.radio, "--data-blocks", str(args.data_blocks)] if args.radio else []
            r = C.run_child(sys.executable, os.path.abspath(__file__), argv_child, timeout=3600)
            if "error" in r:
                print(f"{size}^2 chunk {chunk}: {r['error']}", file=sys.stderr)
                continue
            rows.append(r)
            print(
                f"{size}^2 chunk {chunk}: predicted {r['predicted'] / 2**20:.1f} MiB, measured "
                f"{r['measured'] / 2**20:.1f} MiB, ratio {r['ratio']:.2f}",
                flush=True,
            )
    table = C.markdown_table(
        ["grid", "chunk", "pairs", "predicted MiB", "measured MiB", "measured / predicted"],
        [
            [
                f"{r['size']}²"
                + (f", {r['n_data']} visibilities in {r['data_blocks']} blocks" if r["data_blocks"] else "")
                + (f", field over {r['processes']} processes" if r.get("processes") else ""),
                r["chunk"],
                r["pairs"],
                f"{r['predicted'] / 2**20:.1f}",
                f"{r['measured'] / 2**20:.1f}",
                f"{r['ratio']:.2f}",
            ]
            for r in rows
        ],
    )
    print(table)
    if args.json:
        C.write_json(args.json, dict(meta=C.machine_meta(), rows=rows))
    return 0


if __name__ == "__main__":
    sys.exit(main())
