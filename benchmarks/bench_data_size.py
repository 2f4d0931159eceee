"""Compile time and peak memory of ``optimize_kl`` against the size of the data.

    python benchmarks/bench_data_size.py [--problem all] [--json out.json]
    python benchmarks/bench_data_size.py --problem pointwise --sizes 100000,400000
    python benchmarks/bench_data_size.py --smoke          # seconds

Compile time should not grow with the data: were a likelihood's data closure
constants of the compiled engine steps, XLA would compile (and keep copies of)
arrays as large as the data; as program arguments, as the engine passes them,
they cost nothing at compile time. Problems (float64, Gaussian noise on every datum):

- ``pointwise``: latent ``xi`` of shape ``(n,)``, signal ``exp(0.5 * xi)``,
  ``n`` data (``--sizes``, default ``1e5, 4e5, 1e6, 4e6``);
- ``cf``: ``exp`` of a correlated field (:class:`shardvi.CorrelatedFieldMaker`,
  non-parametric spectrum, as in ``demos/correlated_field_2d.py``) on an
  ``N x N`` grid, every pixel observed (``--sizes``, default ``256, 512, 1024``).

Every configuration runs in a fresh process (its peak RSS is its own):
``sv.optimize_kl`` for one global iteration, ``linear_resample`` with one
antithetic pair, sampling ``CGConfig(tol=None, maxiter=--cg-iters)`` and KL
``NewtonCGConfig(xtol=None, maxiter=--newton-iters)`` (inner CG ``tol=0.5``,
at most ``--cg-iters``), default ``sample_map="vmap"``, ``progress=False``.
Columns:

- ``compile s``: XLA backend compilation (sum of the
  ``/jax/core/compile/backend_compile_duration`` events during ``optimize_kl``),
  ``n``: their number;
- ``trace+lower s``: jaxpr tracing and MLIR lowering events (nested traces
  counted twice);
- ``first s``: wall time of the iteration (tracing, compilation and run);
- ``RSS MiB``: peak resident memory of the process (``ru_maxrss``), ``base``
  just before ``optimize_kl`` (imports, problem, data);
- ``max const KiB``: the largest constant in the lowered StableHLO of the KL
  step (``minimize``) and of all engine steps, found by lowering the steps
  again after the run with the arguments they were called with (after the
  RSS and timings are taken; ``--no-constants`` skips it; ``-`` where the
  engine's internals are not found).

The parent polls each child's resident memory and kills it above
``--max-rss-gib`` (a shared machine); a configuration that runs past
``--timeout`` or is killed is recorded as such: that is the finding.
``--repeats k`` runs each configuration in k processes and reports medians.
``PYTHONPATH=/path/to/other/checkout`` measures another shardvi (the child
records the ``shardvi.__file__`` it imported).
"""

from __future__ import annotations

import argparse
import json
import os
import re
import subprocess
import sys
import time

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import _common as C

DEFAULT_SIZES = {"pointwise": "100000,400000,1000000,4000000", "cf": "256,512,1024"}
_TENSOR = re.compile(r"tensor<((?:\d+x)*)([a-z]+)(\d+)>")


# ================================================================================================ child
_COMPILE_EVENT = "/jax/core/compile/backend_compile_duration"
_TRACE_EVENTS = ("/jax/core/compile/jaxpr_trace_duration", "/jax/core/compile/jaxpr_to_mlir_module_duration")


class _Compiles:
    """Number and seconds of XLA compilations, seconds of tracing + lowering (``jax.monitoring`` events).

    Local on purpose: the script measures other checkouts (``PYTHONPATH``) whose
    ``shardvi.compilation`` may lack the seconds, and must not import shardvi
    from this checkout to get them.
    """

    def __init__(self):
        from jax import monitoring

        self.n, self.s, self.trace_lower_s = 0, 0.0, 0.0
        monitoring.register_event_duration_secs_listener(self._listener)

    def _listener(self, name, duration, **kwargs):
        if name == _COMPILE_EVENT:
            self.n += 1
            self.s += duration
        elif name in _TRACE_EVENTS:
            self.trace_lower_s += duration

    def snapshot(self):
        return {"n": self.n, "s": self.s, "trace_lower_s": self.trace_lower_s}


def _import_shardvi():
    """``import shardvi``; with ``PYTHONPATH`` set, check that the package came from there."""
    import shardvi

    roots = [os.path.realpath(p) for p in os.environ.get("PYTHONPATH", "").split(os.pathsep) if p]
    here = os.path.realpath(shardvi.__file__)
    if roots and not any(here.startswith(r + os.sep) for r in roots):
        raise RuntimeError(f"imported shardvi from {here}, not from PYTHONPATH={os.environ['PYTHONPATH']}")
    return shardvi


def build_problem(problem, size, noise_std=0.1, seed=42):
    """(likelihood, start position, number of data) of a problem; see the module docstring."""
    import jax
    import jax.numpy as jnp

    import shardvi as sv

    k_truth, k_noise, k_pos = jax.random.split(jax.random.PRNGKey(seed), 3)
    if problem == "pointwise":
        domain = {"xi": jax.ShapeDtypeStruct((size,), jnp.float64)}

        def signal(xi):
            return jnp.exp(0.5 * xi["xi"])

        model = sv.Model(signal, domain)
    elif problem == "cf":
        cfm = sv.CorrelatedFieldMaker("cf", dtype=jnp.float64)
        cfm.set_amplitude_total_offset(0.0, (0.1, 0.05))
        cfm.add_fluctuations(
            (size, size), 1.0 / size, fluctuations=(0.6, 0.1), loglogavgslope=(-2.0, 0.3), prefix="sky"
        )
        field = cfm.finalize()

        def log_normal(f, xi):
            return jnp.exp(f(xi))

        # the field (a module) as an argument of a Partial: its grids are program inputs, not constants
        signal = jax.tree_util.Partial(log_normal, field)
        model = sv.Model(signal, field.domain)
    else:
        raise ValueError(f"problem must be 'pointwise' or 'cf', got {problem!r}")
    truth = model.init(k_truth)
    sig = signal(truth)
    data = sig + noise_std * jax.random.normal(k_noise, sig.shape, sig.dtype)
    jax.block_until_ready(data)
    lh = sv.Gaussian(data, noise_std=noise_std).amend(model)
    position = jax.tree.map(lambda x: 0.1 * x, model.init(k_pos))
    return lh, position, int(data.size)


def _record_engine_calls():
    """Remember the first call of every engine step (``Placed``) by name; None where not found."""
    try:
        from shardvi.parallel.strategy import Placed
    except ImportError:
        return None
    calls = {}
    orig = Placed.__call__

    def call(self, *args, **kwargs):
        name = getattr(self.__wrapped__, "__name__", None) or repr(self.__wrapped__)
        calls.setdefault(name, (self, args, kwargs))
        return orig(self, *args, **kwargs)

    Placed.__call__ = call
    return calls


def largest_constants(calls):
    """Bytes of the largest constant in the lowered StableHLO of each recorded engine step."""
    out = {}
    for name, (placed, args, kwargs) in calls.items():
        try:
            module = placed.lower(*args, **kwargs).compiler_ir("stablehlo")
        except Exception as e:  # noqa: BLE001 - an engine whose steps lower differently: report, do not fail
            out[name] = f"not lowered: {type(e).__name__}"
            continue
        best = 0
        stack = [module.operation]
        while stack:
            op = stack.pop()
            for region in op.regions:
                for block in region.blocks:
                    for o in block.operations:
                        if o.operation.name == "stablehlo.constant":
                            m = _TENSOR.fullmatch(str(o.result.type))
                            if m:
                                n = 1
                                for d in m.group(1).split("x")[:-1]:
                                    n *= int(d)
                                best = max(best, n * max(int(m.group(3)), 8) // 8)
                        stack.append(o.operation)
        out[name] = best
    return out


def child_main(args):
    jax = C.setup_jax()
    cs = _Compiles()
    sv = _import_shardvi()
    calls = None if args.no_constants else _record_engine_calls()
    lh, position, n_data = build_problem(args.problem, args.size)
    n_latent = sum(x.size for x in jax.tree.leaves(position))
    lin = sv.CGConfig(tol=None, maxiter=args.cg_iters)
    newton = sv.NewtonCGConfig(xtol=None, maxiter=args.newton_iters, cg=sv.CGConfig(tol=0.5, maxiter=args.cg_iters))
    times = []
    snap = cs.snapshot()
    rss_base = C.current_rss_mib()
    t0 = time.perf_counter()

    def callback(samples, state):
        jax.block_until_ready(samples.pos)
        times.append(time.perf_counter() - t0)

    sv.optimize_kl(
        lh,
        position,
        key=jax.random.PRNGKey(1),
        n_total_iterations=1,
        n_samples=1,
        sample_mode="linear_resample",
        linear_sampling=lin,
        nonlinear_update=newton,
        kl_minimization=newton,
        callback=callback,
        progress=False,
    )
    total = time.perf_counter() - t0
    end = cs.snapshot()
    rec = {
        "problem": args.problem,
        "size": args.size,
        "n_data": n_data,
        "n_latent": int(n_latent),
        "data_mib": 8 * n_data / 2**20,
        "shardvi_file": sv.__file__,
        "compile_s": end["s"] - snap["s"],
        "n_compiles": end["n"] - snap["n"],
        "trace_lower_s": end["trace_lower_s"] - snap["trace_lower_s"],
        "first_s": times[0] if times else None,
        "optimize_kl_s": total,
        "rss_base_mib": rss_base,
        "rss_peak_mib": C.peak_rss_mib(),
    }
    if calls is not None:
        consts = largest_constants(calls)
        rec["max_constant_bytes"] = consts
        rec["kl_max_constant_bytes"] = consts.get("minimize")
        rec["all_max_constant_bytes"] = max((v for v in consts.values() if isinstance(v, int)), default=None)
    print(json.dumps(rec), flush=True)


# ================================================================================================ parent
def _rss_mib(pid):
    """Resident memory of process ``pid`` (from /proc; 0 where unavailable)."""
    try:
        with open(f"/proc/{pid}/statm") as f:
            return int(f.read().split()[1]) * os.sysconf("SC_PAGE_SIZE") / 2**20
    except (OSError, ValueError, IndexError):
        return 0.0


def run_child(args_list, timeout, max_rss_mib):
    """Run this script as a child; its JSON record, or ``dict(error=...)`` (timeout, memory, crash)."""
    env = dict(os.environ)
    env.setdefault("JAX_PLATFORMS", "cpu")
    t0 = time.perf_counter()
    p = subprocess.Popen(
        [sys.executable, os.path.abspath(__file__), *args_list],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        env=env,
    )
    seen, why = 0.0, None
    while p.poll() is None:
        seen = max(seen, _rss_mib(p.pid))
        if time.perf_counter() - t0 > timeout:
            why = f"timeout after {timeout:.0f} s"
        elif seen > max_rss_mib:
            why = f"killed at {seen:.0f} MiB resident (limit {max_rss_mib:.0f} MiB)"
        if why:
            p.kill()
            p.communicate()
            return {"error": why, "process_wall_s": time.perf_counter() - t0, "rss_seen_mib": seen}
        time.sleep(0.2)
    out, err = p.communicate()
    wall = time.perf_counter() - t0
    lines = [ln for ln in out.splitlines() if ln.startswith("{")]
    if p.returncode != 0 or not lines:
        return {"error": f"exit {p.returncode}: {(err or out)[-2000:]}", "process_wall_s": wall, "rss_seen_mib": seen}
    rec = json.loads(lines[-1])
    rec["process_wall_s"] = wall
    return rec


_MEDIAN_KEYS = (
    "compile_s",
    "trace_lower_s",
    "first_s",
    "optimize_kl_s",
    "rss_peak_mib",
    "rss_base_mib",
    "process_wall_s",
)


def _aggregate(runs):
    """One record from the runs of a configuration: the last run's fields, medians of the measurements."""
    if "error" in runs[-1]:
        return dict(runs[-1], runs=runs)
    rec = dict(runs[-1], runs=runs)
    for k in _MEDIAN_KEYS:
        rec[k] = C.median([r.get(k) for r in runs])
    return rec


def main(argv=None):
    ap = argparse.ArgumentParser(
        description=__doc__.splitlines()[0], formatter_class=argparse.RawDescriptionHelpFormatter
    )
    ap.add_argument("--problem", choices=("pointwise", "cf", "all"), default="all")
    ap.add_argument(
        "--sizes",
        default=None,
        help="comma-separated: data sizes n (pointwise) or grid sizes N (cf, N x N); "
        f"default pointwise {DEFAULT_SIZES['pointwise']}, cf {DEFAULT_SIZES['cf']}",
    )
    ap.add_argument("--cg-iters", type=int, default=5, help="sampling CG iterations / inner CG maxiter")
    ap.add_argument("--newton-iters", type=int, default=2, help="KL Newton steps")
    ap.add_argument("--repeats", type=int, default=1, help="processes per configuration (medians reported)")
    ap.add_argument("--timeout", type=float, default=360, help="seconds per configuration")
    ap.add_argument("--max-rss-gib", type=float, default=8.0, help="kill a configuration above this resident memory")
    ap.add_argument("--no-constants", action="store_true", help="skip the largest-constant inspection")
    ap.add_argument("--smoke", action="store_true", help="two tiny pointwise configurations")
    ap.add_argument("--json", default=None, help="write the records to this file")
    ap.add_argument("--child", action="store_true", help=argparse.SUPPRESS)
    ap.add_argument("--size", type=int, help=argparse.SUPPRESS)
    args = ap.parse_args(argv)
    if args.child:
        return child_main(args)
    if args.smoke:
        args.problem, args.sizes, args.cg_iters, args.newton_iters = "pointwise", "256,1024", 2, 1
    problems = ("pointwise", "cf") if args.problem == "all" else (args.problem,)
    if args.sizes is not None and args.problem == "all":
        ap.error("--sizes needs a single --problem")
    for opt, val in (("--cg-iters", args.cg_iters), ("--newton-iters", args.newton_iters), ("--repeats", args.repeats)):
        if val < 1:
            ap.error(f"{opt} must be >= 1, got {val}")
    points = [(p, int(float(s))) for p in problems for s in (args.sizes or DEFAULT_SIZES[p]).split(",") if s]
    records, errors = [], []
    for problem, size in points:
        load_before = os.getloadavg()
        child = [
            "--child",
            "--problem",
            problem,
            "--size",
            str(size),
            "--cg-iters",
            str(args.cg_iters),
            "--newton-iters",
            str(args.newton_iters),
        ] + (["--no-constants"] if args.no_constants else [])
        runs = []
        for _ in range(args.repeats):
            runs.append(run_child(child, args.timeout, 1024 * args.max_rss_gib))
            if "error" in runs[-1]:
                break
        rec = _aggregate(runs)
        rec.update(problem=problem, size=size, load_before=list(load_before), load_after=list(os.getloadavg()))
        if "error" in rec:
            errors.append(rec)
            print(f"{problem} {size}: {rec['error'][-600:]}", file=sys.stderr, flush=True)
            continue
        records.append(rec)
        print(
            json.dumps({k: rec[k] for k in ("problem", "size", "compile_s", "first_s", "rss_peak_mib", "load_before")}),
            file=sys.stderr,
            flush=True,
        )
    meta = dict(
        C.machine_meta(),
        cg_iters=args.cg_iters,
        newton_iters=args.newton_iters,
        repeats=args.repeats,
        pythonpath=os.environ.get("PYTHONPATH"),
        command=" ".join(
            [os.path.relpath(os.path.abspath(__file__), C.ROOT)] + list(argv if argv is not None else sys.argv[1:])
        ),
    )
    C.write_json(args.json, {"meta": meta, "records": records, "errors": errors})
    print_table(meta, records, errors)
    return 1 if errors else 0


def _kib(x):
    return C.fmt(x / 1024, ".0f") if isinstance(x, int) else "-"


def print_table(meta, records, errors):
    print(
        f"\nshardvi optimize_kl, 1 iteration linear_resample, 1 pair, sampling CG {meta['cg_iters']} its, "
        f"{meta['newton_iters']} KL Newton steps; {meta['cpu_count']} CPU cores; median of {meta['repeats']} "
        f"process(es) per row; load = 1-min load average before the row\n"
    )
    header = [
        "problem",
        "size",
        "data",
        "data MiB",
        "compile s",
        "n",
        "trace+lower s",
        "first s",
        "RSS MiB",
        "base MiB",
        "KL max const KiB",
        "max const KiB",
        "load",
    ]
    rows = []
    for r in sorted(records + errors, key=lambda r: (r["problem"], r["size"])):
        size = f"{r['size']}²" if r["problem"] == "cf" else str(r["size"])
        load = f"{r['load_before'][0]:.2f}"
        if "error" in r:
            rows.append(
                [
                    r["problem"],
                    size,
                    "-",
                    "-",
                    "-",
                    "-",
                    "-",
                    "-",
                    f"≥ {r['rss_seen_mib']:.0f}" if r.get("rss_seen_mib") else "-",
                    "-",
                    "-",
                    "-",
                    load,
                ]
            )
            rows[-1][7] = r["error"].split(":")[0] if r["error"].startswith("exit") else r["error"]
            continue
        rows.append(
            [
                r["problem"],
                size,
                r["n_data"],
                C.fmt(r["data_mib"], ".1f"),
                C.fmt(r["compile_s"], ".1f"),
                r["n_compiles"],
                C.fmt(r["trace_lower_s"], ".1f"),
                C.fmt(r["first_s"], ".1f"),
                C.fmt(r["rss_peak_mib"], ".0f"),
                C.fmt(r["rss_base_mib"], ".0f"),
                _kib(r.get("kl_max_constant_bytes")),
                _kib(r.get("all_max_constant_bytes")),
                load,
            ]
        )
    print(C.markdown_table(header, rows, align="ll" + "r" * (len(header) - 2)))


if __name__ == "__main__":
    sys.exit(main())
