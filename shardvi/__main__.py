"""Command-line tools: ``python -m shardvi compare ...``, ``plan ...`` and ``strategies``.

``plan`` prints :func:`shardvi.parallel.plan` for a demo problem: each
candidate device map with its predicted memory per device and the
recommended one::

    python -m shardvi plan --demo lognormal_1d --devices 4 --npix 256 --n-samples 8

``strategies`` lists the registered device-map strategies (the names
``--strategy`` takes; :func:`shardvi.parallel.strategy_names`).

``compare`` runs the same reconstruction with one strategy on 1 device and on
N devices and prints the largest absolute and relative differences of the
samples, the posterior mean and the posterior standard deviation::

    python -m shardvi compare --devices 4 --strategy shard_map [--demo lognormal_1d] [--n-samples 4]

In the reproducible mode (default) every difference is exactly 0; with
``--reduce psum`` each cross-device mean differs by about one ulp, and the
solvers (CG, Newton-CG) amplify that over the iterations to relative
differences of ~1e-5 or less in the final samples. On CPU the devices are
forced with ``jax_num_cpu_devices`` (as many as ``--devices``, at most
:data:`MAX_CPU_DEVICES`). Progress (a bar
on a terminal, one line per iteration otherwise) goes to standard error unless
``--quiet``; the result goes to standard output. The arguments are parsed before
JAX is imported: ``--help`` and bad flags answer at once (exit status 2, a
usage line naming the flag). A run whose samples cannot fit the memory ends
with one error line and exit status 1.
"""

from __future__ import annotations

import argparse
import json
import math
import os
import sys
import time
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from .vi.progress import Progress

__all__ = ["MAX_CPU_DEVICES", "compare", "main", "strategies"]

MAX_CPU_DEVICES = 2048
"""Most devices ``--devices`` takes. On CPU the CLI forces that many XLA:CPU devices: 2048 start in about a
second and ``plan`` answers in seconds; 4096 fail in XLA (multiprocess computations) and creating 8192 takes
tens of seconds. A real accelerator has its own count: more than exist is refused once JAX is imported."""

_MAX_SEED = 2**63  # jax.random.PRNGKey takes a seed that fits int64


def _int_flag(minimum: int, maximum: int | None = None, what: str | None = None):
    """An argparse ``type``: an int in ``[minimum, maximum]`` (``ArgumentTypeError`` otherwise, saying ``what``
    is expected; default: the range)."""
    if what is None:
        what = f"an integer >= {minimum}" if maximum is None else f"an integer from {minimum} to {maximum}"

    def parse(text: str) -> int:
        try:
            value = int(text)
        except ValueError:
            raise argparse.ArgumentTypeError(f"expected {what}, got {text!r}") from None
        if value < minimum or (maximum is not None and value > maximum):
            raise argparse.ArgumentTypeError(f"expected {what}, got {value}")
        return value

    return parse


def _gib_flag(text: str) -> int:
    """An argparse ``type``: a number of GiB from one byte (``2**-30``) to below ``2**33`` (``2**63`` bytes);
    returns bytes."""
    what = "a finite number of GiB from 2**-30 (one byte) to below 2**33 (8 EiB)"
    try:
        gib = float(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected {what}, got {text!r}") from None
    if not (math.isfinite(gib) and 2**-30 <= gib < 2**33):
        raise argparse.ArgumentTypeError(f"expected {what}, got {text!r}")
    return int(gib * 2**30)


def _diff(a, b):
    import numpy as np

    a, b = np.asarray(a), np.asarray(b)
    abs_ = float(np.max(np.abs(a - b))) if a.size else 0.0
    scale = float(np.max(np.abs(b))) if b.size else 0.0
    return {
        "max_abs": abs_,
        "max_rel": abs_ / scale if scale > 0 else abs_,
        "bitwise_equal": bool(np.array_equal(a, b)),
    }


def _strategy(name, devices, reduce, chunk_size):
    """The registered strategy ``name`` on ``devices`` (``ValueError`` naming ``--strategy`` if it cannot be)."""
    from . import parallel

    return parallel.get_strategy(name, "--strategy", devices, chunk_size=chunk_size, reduce=reduce)


def strategies() -> str:
    """The registered strategies, one per line: name, class and the first line of its docstring."""
    from . import parallel

    rows = []
    for name in parallel.strategy_names():
        cls = parallel.strategy_class(name)
        doc = (cls.__doc__ or "").strip().splitlines()
        rows.append(f"{name:<12} {cls.__module__}.{cls.__qualname__}: {doc[0] if doc else ''}")
    return "\n".join(rows)


def compare(
    devices: int = 4,
    strategy: str = "shard_map",
    demo: str = "lognormal_1d",
    *,
    npix: int = 64,
    n_samples: int = 4,
    iterations: int = 3,
    reduce: str = "fixed",
    chunk_size: int = 1,
    seed: int = 0,
    progress: bool | str | Progress = "auto",
) -> dict:
    """Run ``demo`` with ``strategy`` on 1 and on ``devices`` devices; return the differences.

    Returns
    -------
    dict
        ``samples``, ``mean``, ``std``, ``kl_energy``: each ``{"max_abs", "max_rel",
        "bitwise_equal"}`` (N devices against 1); ``time_1``, ``time_n``:
        wall time of each run in seconds; plus the settings.

    ``progress`` is passed to :func:`shardvi.optimize_kl` (``False``: silent);
    unless it is ``False``/``"off"`` each run is announced on standard error.
    """
    import jax
    import numpy as np

    import shardvi as sv

    from .examples import build_demo
    from .vi.progress import check_progress

    if isinstance(devices, bool) or not isinstance(devices, int) or devices < 1:
        raise ValueError(f"devices must be an int >= 1, got {devices!r}")
    available = jax.devices()
    if devices > len(available):
        raise ValueError(
            f"devices={devices} but only {len(available)} {available[0].platform} device(s) exist "
            f"(on CPU start a fresh process: python -m shardvi compare --devices {devices})"
        )
    _strategy(strategy, list(available[:devices]), reduce, chunk_size)  # validate before running anything
    progress = check_progress(progress)
    problem = build_demo(demo, npix=npix, seed=seed)
    mode_seq = ("linear_resample", "nonlinear_resample", "nonlinear_update")
    configs: dict[str, Any] = dict(
        linear_sampling=sv.CGConfig(tol=1e-8, maxiter=200),
        nonlinear_update=sv.NewtonCGConfig(xtol=1e-6, maxiter=50, cg=sv.CGConfig(tol=0.01, maxiter=200)),
        kl_minimization=sv.NewtonCGConfig(xtol=1e-6, maxiter=50, cg=sv.CGConfig(tol=0.01, maxiter=200)),
    )

    def run(devs, label):
        strat = _strategy(strategy, list(devs), reduce, chunk_size)
        if progress != "off":
            print(
                f"{label}: {demo} with {strategy} on {len(devs)} device(s), {iterations} iterations",
                file=sys.stderr,
                flush=True,
            )
        t0 = time.perf_counter()
        samples, state = sv.optimize_kl(
            problem.likelihood,
            problem.position,
            key=jax.random.PRNGKey(seed),
            n_total_iterations=iterations,
            n_samples=n_samples,
            sample_mode=lambda i: mode_seq[min(i, 2)],
            sample_map=strat,
            kl_map=strat,
            progress=progress,
            **configs,
        )
        signal = np.stack([np.asarray(problem.signal(s)) for s in samples])
        flat = np.concatenate([np.ravel(np.asarray(x)) for x in jax.tree.leaves(samples.samples)])
        energies = np.asarray([r.kl_energy for r in state.history])
        return flat, signal.mean(0), signal.std(0), energies, time.perf_counter() - t0

    one = run(available[:1], "run 1/2")
    many = run(available[:devices], "run 2/2")
    names = ("samples", "mean", "std", "kl_energy")
    out: dict[str, Any] = {name: _diff(many[i], one[i]) for i, name in enumerate(names)}
    out.update(
        time_1=one[4],
        time_n=many[4],
        devices=devices,
        strategy=strategy,
        demo=demo,
        reduce=reduce,
        chunk_size=chunk_size,
        n_samples=n_samples,
        iterations=iterations,
        npix=npix,
    )
    return out


def _format(res: dict) -> str:
    lines = [
        f"{res['demo']}: {res['strategy']} (reduce={res['reduce']}, chunk_size={res['chunk_size']}) "
        f"on 1 vs {res['devices']} devices, {res['n_samples']} sample pairs, {res['iterations']} iterations",
        f"{'quantity':<12} {'max abs diff':>14} {'max rel diff':>14}  bitwise equal",
    ]
    for name in ("samples", "mean", "std", "kl_energy"):
        d = res[name]
        lines.append(f"{name:<12} {d['max_abs']:>14.3e} {d['max_rel']:>14.3e}  {'yes' if d['bitwise_equal'] else 'no'}")
    lines.append(f"wall time: 1 device {res['time_1']:.2f} s, {res['devices']} devices {res['time_n']:.2f} s")
    return "\n".join(lines)


def _plan(args) -> int:
    """``python -m shardvi plan``: the plan of a demo problem, as a table."""
    import jax

    from .examples import build_demo
    from .parallel.memory import InsufficientMemoryError
    from .vi.planner import plan

    devices = jax.devices()
    if args.devices > len(devices):
        print(f"error: --devices {args.devices} but only {len(devices)} device(s) exist", file=sys.stderr)
        return 2
    try:
        problem = build_demo(args.demo, npix=args.npix)
    except ValueError as err:
        print(f"error: {err}", file=sys.stderr)
        return 2
    try:
        p = plan(
            problem.likelihood,
            problem.position,
            n_samples=args.n_samples,
            devices=devices[: args.devices],
            memory_limit=args.memory_limit,  # bytes (parsed from GiB)
            measure=args.measure,
        )
    except InsufficientMemoryError as err:
        print(f"error: {err}", file=sys.stderr)
        return 1
    print(p)
    return 0


def main(argv=None, force_cpu_devices: bool = False) -> int:
    """Run the CLI; ``force_cpu_devices`` (set by ``python -m shardvi``) forces ``--devices`` CPU devices."""
    ap = argparse.ArgumentParser(prog="python -m shardvi", description="shardvi command-line tools")
    sub = ap.add_subparsers(dest="command", required=True)
    devices_help = (
        f"number of devices (1 to {MAX_CPU_DEVICES}); on CPU that many are forced, on an accelerator at "
        "most as many as exist (default 4)"
    )
    cp = sub.add_parser("compare", help="run one reconstruction on 1 and N devices and print the differences")
    cp.add_argument(
        "--devices",
        type=_int_flag(1, MAX_CPU_DEVICES),
        default=4,
        help=devices_help + "; forced CPU devices meet in every collective, so far more of them than CPU cores "
        "may exceed XLA's rendezvous timeout",
    )
    cp.add_argument(
        "--strategy",
        default="shard_map",
        metavar="NAME",
        help="sample_map/kl_map strategy: a registered name, e.g. shard_map (default), pmap, jit, vmap "
        "or lax_map ('python -m shardvi strategies' lists them all)",
    )
    cp.add_argument("--demo", default="lognormal_1d", help="demo problem: lognormal_1d (default) or wiener_1d")
    cp.add_argument("--npix", type=_int_flag(1), default=64, help="pixels (default 64)")
    cp.add_argument(
        "--n-samples", type=_int_flag(1), default=4, help="antithetic sample pairs per iteration (default 4)"
    )
    cp.add_argument("--iterations", type=_int_flag(0), default=3, help="global MGVI/geoVI iterations (default 3)")
    cp.add_argument(
        "--reduce",
        default="fixed",
        choices=("fixed", "psum"),
        help="cross-device mean: fixed (reproducible, default) or psum",
    )
    cp.add_argument(
        "--chunk-size",
        type=_int_flag(1, 2**31 - 1),  # parallel.strategy.MAX_CHUNK (JAX is imported after the flags are read)
        default=1,
        help="samples per vectorized step per device (default 1)",
    )
    cp.add_argument(
        "--seed",
        type=_int_flag(0, _MAX_SEED - 1, "an integer in [0, 2**63)"),
        default=0,
        help="seed of data and samples, in [0, 2**63) (default 0)",
    )
    cp.add_argument("--json", action="store_true", help="print JSON instead of a table")
    cp.add_argument("--quiet", action="store_true", help="no progress on standard error")
    sub.add_parser("strategies", help="list the registered device-map strategies (--strategy NAME)")
    pp = sub.add_parser("plan", help="print the device-map plan (memory per device of each candidate) of a demo")
    pp.add_argument("--demo", default="lognormal_1d", help="demo problem: lognormal_1d (default) or wiener_1d")
    pp.add_argument("--devices", type=_int_flag(1, MAX_CPU_DEVICES), default=4, help=devices_help)
    pp.add_argument("--npix", type=_int_flag(1), default=64, help="pixels (default 64)")
    pp.add_argument(
        "--n-samples", type=_int_flag(1), default=4, help="antithetic sample pairs per iteration (default 4)"
    )
    pp.add_argument(
        "--memory-limit",
        type=_gib_flag,
        default=None,
        metavar="GIB",
        help="GiB per device, from 2**-30 (one byte) to below 2**33 (default: the device's memory)",
    )
    pp.add_argument("--measure", action="store_true", help="also time one sampling step per candidate")
    args = ap.parse_args(argv)
    if args.command == "strategies":
        print(strategies())
        return 0

    import jax

    if force_cpu_devices and os.environ.get("JAX_PLATFORMS", "cpu") in ("cpu", ""):
        try:  # possible before the first JAX computation only
            jax.config.update("jax_num_cpu_devices", args.devices)
            from ._xla_flags import depth_first_cpu_schedule

            depth_first_cpu_schedule()  # this program's own process: a model axis over its CPU devices
        except RuntimeError:
            pass
    jax.config.update("jax_enable_x64", True)
    from . import parallel

    if args.command == "plan":
        return _plan(args)
    if args.strategy not in parallel.strategy_names():  # the registry is read once JAX is imported
        cp.error(
            f"argument --strategy: invalid choice: {args.strategy!r} (choose from "
            f"{', '.join(parallel.strategy_names())})"
        )
    try:
        res = compare(
            args.devices,
            args.strategy,
            args.demo,
            npix=args.npix,
            n_samples=args.n_samples,
            iterations=args.iterations,
            reduce=args.reduce,
            chunk_size=args.chunk_size,
            seed=args.seed,
            progress=False if args.quiet else "auto",
        )
    except ValueError as err:
        print(f"error: {err}", file=sys.stderr)
        return 2
    except parallel.InsufficientMemoryError as err:
        print(f"error: {err}", file=sys.stderr)
        return 1
    print(json.dumps(res, indent=2) if args.json else _format(res))
    return 0


if __name__ == "__main__":
    sys.exit(main(force_cpu_devices=True))
