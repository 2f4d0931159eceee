"""Shared pieces of the demos: argument checks, CPU device set-up, strategies, summaries.

Imported by the demo scripts (``demos/`` is on ``sys.path`` when a script runs
as ``python demos/NAME.py``; the scripts add it themselves otherwise). This
module imports neither JAX nor shardvi at import time: the scripts parse their
arguments (and answer ``--help``) with it before they import JAX.
"""

from __future__ import annotations

import argparse
import logging
import os
import sys

import numpy as np

__all__ = [
    "add_common_flags",
    "check_common",
    "check_positive",
    "setup_devices",
    "make_strategy",
    "diff_stats",
    "coverage",
    "setup_logging",
    "png_path",
    "parse_or_exit",
    "run_main",
    "progress",
]


def add_common_flags(
    ap: argparse.ArgumentParser,
    *,
    samples: int,
    iterations: int,
    seed: int,
    output: str,
    strategy: str = "vmap",
    devices: int = 1,
) -> None:
    """``--n-samples --iterations --strategy --devices --seed --output`` with the given defaults."""
    ap.add_argument(
        "--n-samples", type=int, default=samples, help=f"antithetic sample pairs per iteration (default {samples})"
    )
    ap.add_argument(
        "--iterations", type=int, default=iterations, help=f"global MGVI/geoVI iterations (default {iterations})"
    )
    ap.add_argument(
        "--strategy",
        default=strategy,
        metavar="NAME",
        help=f"sample_map/kl_map strategy: a name registered in shardvi.parallel, e.g. vmap, lax_map, "
        f"shard_map, pmap or jit ('python -m shardvi strategies' lists them; default {strategy})",
    )
    ap.add_argument(
        "--devices",
        type=int,
        default=devices,
        help=f"number of devices; on CPU that many are forced (default {devices})",
    )
    ap.add_argument("--seed", type=int, default=seed, help=f"seed of truth, noise and samples (default {seed})")
    ap.add_argument("--output", default=output, help=f"folder for the PNG figures (default {output})")
    ap.add_argument(
        "--quiet",
        action="store_true",
        help="no progress (bar on a terminal, one line per iteration otherwise) on stderr",
    )


def progress(quiet: bool):
    """The ``progress`` argument of ``optimize_kl`` for ``--quiet``: ``False``, else ``"auto"``."""
    return False if quiet else "auto"


def parse_or_exit(parse, argv=None):
    """``parse(argv)`` for a script's ``__main__`` block, run before JAX is imported.

    ``--help`` prints and exits 0 and an unknown flag exits 2 (argparse); a
    ``ValueError`` of the checks prints ``error: ...`` and exits 2.
    """
    try:
        return parse(argv)
    except ValueError as err:
        print(f"error: {err}", file=sys.stderr)
        sys.exit(2)


def run_main(main, args) -> int:
    """``main(args=args)``; a ``ValueError`` prints ``error: ...`` and gives exit status 2."""
    try:
        return main(args=args)
    except ValueError as err:
        print(f"error: {err}", file=sys.stderr)
        return 2


def check_positive(value, flag: str, minimum: int = 1) -> int:
    """``value`` as an int ``>= minimum``, else ``ValueError`` naming ``flag``."""
    if isinstance(value, bool) or not isinstance(value, (int, np.integer)) or value < minimum:
        raise ValueError(f"{flag} must be an int >= {minimum}, got {value!r}")
    return int(value)


def check_positive_float(value, flag: str) -> float:
    """``value`` as a positive finite float, else ``ValueError`` naming ``flag``."""
    if not (np.isfinite(value) and value > 0):
        raise ValueError(f"{flag} must be a positive finite float, got {value!r}")
    return float(value)


def check_linear_iterations(args) -> None:
    """``--linear-iterations`` an int in ``[0, --iterations]`` (``ValueError`` naming the flag)."""
    check_positive(args.linear_iterations, "--linear-iterations", minimum=0)
    if args.linear_iterations > args.iterations:
        raise ValueError(f"--linear-iterations ({args.linear_iterations}) must be <= --iterations ({args.iterations})")


def check_common(args) -> None:
    """Validate the flags added by :func:`add_common_flags` (``ValueError`` naming the flag)."""
    check_positive(args.n_samples, "--n-samples")
    check_positive(args.iterations, "--iterations")
    check_positive(args.devices, "--devices")
    check_positive(args.seed, "--seed", minimum=0)
    if not args.strategy:
        raise ValueError("--strategy must be a strategy name, got an empty string")
    if not args.output:
        raise ValueError("--output must be a folder path, got an empty string")


def setup_devices(n: int, flag: str = "--devices"):
    """Make ``n`` devices available and return the first ``n``.

    On CPU (``JAX_PLATFORMS`` unset or ``cpu``) ``n`` host devices are forced with
    ``jax_num_cpu_devices``; that works only before the first JAX computation of the
    process, so in a process that already runs JAX the existing devices are used.
    """
    import jax

    if os.environ.get("JAX_PLATFORMS", "cpu") in ("cpu", ""):
        try:
            if n > 1:
                jax.config.update("jax_num_cpu_devices", n)
                # a model axis over these devices needs XLA:CPU's depth-first schedule (before JAX starts)
                from shardvi.parallel import depth_first_cpu_schedule

                depth_first_cpu_schedule()
        except RuntimeError:
            pass  # backend already initialized: use what exists
    devices = jax.devices()
    if len(devices) < n:
        raise ValueError(
            f"{flag}={n} but only {len(devices)} {devices[0].platform} device(s) exist; on CPU "
            f"run the demo in a fresh process (devices are forced before the first JAX op)"
        )
    return list(devices[:n])


def make_strategy(name: str, devices):
    """The strategy registered as ``name`` (reproducible mode, chunk size 1) on ``devices``.

    ``--strategy`` is checked here, once JAX is imported: the registry
    (:func:`shardvi.parallel.strategy_names`) is not read while parsing.
    """
    from shardvi import parallel

    if name not in parallel.strategy_names():
        raise ValueError(f"--strategy must be one of {parallel.strategy_names()}, got {name!r}")
    try:
        return parallel.get_strategy(name, "--strategy", tuple(devices))
    except ValueError as err:
        raise ValueError(f"--strategy {name} with --devices {len(devices)}: {err}") from err


def diff_stats(a, b) -> dict:
    """Max absolute and relative (to ``max|b|``) difference and bitwise equality of two arrays."""
    a, b = np.asarray(a), np.asarray(b)
    abs_ = float(np.max(np.abs(a - b))) if a.size else 0.0
    scale = float(np.max(np.abs(b))) if b.size else 0.0
    return {
        "max_abs": abs_,
        "max_rel": abs_ / scale if scale > 0 else abs_,
        "bitwise_equal": bool(np.array_equal(a, b)),
    }


def coverage(truth, mean, std, k: float = 2.0, where=None) -> float:
    """Fraction of pixels (optionally only where ``where`` is True) with ``|truth - mean| <= k * std``."""
    inside = np.abs(np.asarray(truth) - np.asarray(mean)) <= k * np.asarray(std)
    if where is not None:
        inside = inside[np.asarray(where, bool)]
    return float(np.mean(inside))


def setup_logging(quiet: bool) -> None:
    """Show warnings as plain messages (also with ``quiet``, which only silences the progress).

    The per-iteration lines come from ``optimize_kl(..., progress=...)`` (see
    :func:`progress`); the ``shardvi`` logger is kept at WARNING so that they
    are not printed twice.
    """
    logging.basicConfig(level=logging.WARNING, format="%(message)s")
    logging.getLogger("shardvi").setLevel(logging.WARNING)


def png_path(folder: str, name: str) -> str:
    """``folder/name`` (the folder is created)."""
    os.makedirs(folder, exist_ok=True)
    return os.path.join(folder, name)
