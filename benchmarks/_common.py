"""Shared pieces of the benchmark scripts (problem, RSS, subprocess runner, tables; compile counter from shardvi).

Imported by the benchmark *children* in both the project venv and the separate
NIFTy.re venv (``benchmarks/.venv-nifty``, which has shardvi installed too), so
the forward model is literally the same Python code in both engines.
"""

from __future__ import annotations

import json
import math
import os
import resource
import statistics
import subprocess
import sys
import time

HERE = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.dirname(HERE)


def CompileStats():
    """A running :class:`shardvi.compilation.CompileCounter` (the library's listener, in either venv).

    ``snapshot()`` gives ``{"n": compilations, "s": their seconds, "trace_lower_s":
    jaxpr tracing + MLIR lowering seconds}``; ``close()`` unregisters it.
    """
    import_shardvi()
    from shardvi.compilation import CompileCounter

    return CompileCounter()


def peak_rss_mib() -> float:
    """Peak resident set size of this process so far (``ru_maxrss``, KiB on Linux) in MiB."""
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024.0


def current_rss_mib() -> float:
    """Current resident set size (from /proc; 0 where unavailable)."""
    try:
        with open("/proc/self/statm") as f:
            return int(f.read().split()[1]) * os.sysconf("SC_PAGE_SIZE") / 2**20
    except (OSError, ValueError, IndexError):
        return 0.0


def device_peak_mib() -> float | None:
    """Peak memory in use on the first JAX device so far (``memory_stats()["peak_bytes_in_use"]``) in MiB.

    ``None`` on CPU and wherever the runtime keeps no such statistic.
    """
    import jax

    dev = jax.devices()[0]
    stats = dev.memory_stats() if dev.platform != "cpu" else None
    return stats["peak_bytes_in_use"] / 2**20 if stats and "peak_bytes_in_use" in stats else None


def setup_jax(x64: bool = True):
    """CPU platform and float64 (both engines), before any JAX op."""
    os.environ.setdefault("JAX_PLATFORMS", "cpu")
    import jax

    jax.config.update("jax_enable_x64", x64)
    return jax


def import_shardvi():
    """Import the shardvi of this checkout (installed editable in both venvs; the path is a fallback)."""
    if ROOT not in sys.path:
        sys.path.insert(0, ROOT)
    import shardvi

    return shardvi


# ------------------------------------------------------------------------------------------------ problem
class Problem:
    """Correlated-field reconstruction with an exponential link and Gaussian noise.

    ``signal(xi) = exp(cf(xi))`` with ``cf`` a shardvi correlated field (non-parametric
    spectrum) on a ``shape`` grid; data ``d = signal(xi_true) + noise_std * n``.
    ``call`` is the plain Python forward model both engines use; ``domain`` is a dict of
    ``jax.ShapeDtypeStruct``. ``model="pointwise"`` replaces the correlated field by the
    white latent itself (``signal = exp(xi)``): no FFTs, compiles in a fraction of the
    time (the scripts' ``--smoke`` modes use it).
    """

    def __init__(self, shape, noise_std=0.1, seed=42, link="exp", model="cf"):
        jax = setup_jax()
        import jax.numpy as jnp

        sv = import_shardvi()
        self.shape = tuple(int(s) for s in shape)
        self.model = model
        if model == "cf":
            cfm = sv.CorrelatedFieldMaker("cf")
            cfm.set_amplitude_total_offset(0.0, (0.5, 0.1))
            cfm.add_fluctuations(
                self.shape,
                tuple(1.0 / s for s in self.shape),
                fluctuations=(1.0, 0.3),
                loglogavgslope=(-3.0, 0.5),
                flexibility=(0.5, 0.2),
                asperity=None,
                prefix="ax",
            )
            field = cfm.finalize()
        elif model == "pointwise":
            field = sv.Model(lambda xi: xi["xi"], {"xi": jax.ShapeDtypeStruct(self.shape, jnp.float64)})
        else:
            raise ValueError(f"model must be 'cf' or 'pointwise', got {model!r}")
        self.field = field
        self.domain = dict(field.domain)
        if link == "exp":

            def call(xi):
                return jnp.exp(field(xi))
        elif link == "linear":

            def call(xi):
                return field(xi)
        else:
            raise ValueError(f"link must be 'exp' or 'linear', got {link!r}")
        self.call = call
        self.link = link
        k_truth, k_noise, k_pos = jax.random.split(jax.random.PRNGKey(seed), 3)
        self.truth = self.init(k_truth)
        self.noise_std = float(noise_std)
        sig = call(self.truth)
        self.data = sig + self.noise_std * jax.random.normal(k_noise, sig.shape, sig.dtype)
        # NIFTy demos' start: a small random latent (same numbers for both engines)
        self.position = jax.tree.map(lambda x: 0.1 * x, self.init(k_pos))
        self.n_data = int(self.data.size)
        self.n_latent = int(sum(math.prod(d.shape) for d in jax.tree.leaves(self.domain)))
        data, std = self.data, self.noise_std

        def normalized_residual(xi):
            return (data - call(xi)) / std

        def hamiltonian(xi):
            r = normalized_residual(xi)
            return 0.5 * jnp.vdot(r, r) + 0.5 * sum(jnp.vdot(x, x) for x in jax.tree.leaves(xi))

        @jax.jit
        def evaluate(stacked):
            """(KL = mean_i H(xi_i), reduced chi^2 = mean_i |r_i|^2 / n_data) over stacked latent samples."""
            kl = jnp.mean(jax.vmap(hamiltonian)(stacked))
            r = jax.vmap(normalized_residual)(stacked)
            chi2 = jnp.mean(jnp.sum(r.reshape(r.shape[0], -1) ** 2, axis=1)) / data.size
            return kl, chi2

        self.evaluate = evaluate

    def init(self, key):
        """A standard-normal latent (dict like ``domain``)."""
        import jax

        leaves, tree = jax.tree.flatten(self.domain)
        keys = jax.random.split(key, len(leaves))
        return jax.tree.unflatten(tree, [jax.random.normal(k, d.shape, d.dtype) for k, d in zip(keys, leaves)])

    def shardvi_likelihood(self):
        sv = import_shardvi()
        return sv.Gaussian(self.data, noise_std=self.noise_std).amend(sv.Model(self.call, self.domain))


def time_vectorized_iterations(n: int) -> dict:
    """The ``n x n`` :class:`Problem` through 5 ``optimize_kl`` iterations (2 MGVI, 3 geoVI; 4 pairs, 5 geoVI and 5
    KL Newton steps, every sample at once: ``Vmap(chunk_size=None)``), timed per iteration.

    Returns ``{"first_s": the first iteration (compilation included), "later_median_s": the median of the others,
    "iters": every iteration's seconds}``.
    """
    prob = Problem((n, n))  # (sets up jax)
    import jax

    sv = import_shardvi()
    times = []
    t0 = [time.perf_counter()]

    def cb(s, st):
        jax.block_until_ready(s.pos)
        times.append(time.perf_counter() - t0[0])
        t0[0] = time.perf_counter()

    strat = sv.parallel.Vmap(chunk_size=None)
    sv.optimize_kl(
        prob.shardvi_likelihood(),
        prob.position,
        key=jax.random.PRNGKey(0),
        n_total_iterations=5,
        n_samples=4,
        sample_mode=lambda i: "linear_resample" if i < 2 else "nonlinear_resample",
        nonlinear_update=sv.NewtonCGConfig(xtol=0.0, maxiter=5),
        kl_minimization=sv.NewtonCGConfig(xtol=0.0, maxiter=5),
        sample_map=strat,
        kl_map=strat,
        progress=False,
        callback=cb,
    )
    return {"first_s": times[0], "later_median_s": sorted(times[1:])[len(times[1:]) // 2], "iters": times}


# ------------------------------------------------------------------------------------------------ stats
def median(xs):
    xs = [x for x in xs if x is not None]
    return statistics.median(xs) if xs else None


def finite_positive(x) -> bool:
    return isinstance(x, (int, float)) and math.isfinite(x) and x > 0


def run_child(python, script, args, timeout=None, env=None):
    """Run ``python script *args`` in a fresh process; return the JSON object of its last stdout line."""
    e = dict(os.environ)
    e.setdefault("JAX_PLATFORMS", "cpu")
    if env:
        e.update(env)
    t0 = time.perf_counter()
    try:
        p = subprocess.run([python, script, *args], capture_output=True, text=True, timeout=timeout, env=e)
    except subprocess.TimeoutExpired:
        return dict(error=f"timeout after {timeout} s")
    wall = time.perf_counter() - t0
    lines = [ln for ln in p.stdout.splitlines() if ln.startswith("{")]
    if p.returncode != 0 or not lines:
        tail = (p.stderr or p.stdout)[-3000:]
        return dict(error=f"exit {p.returncode}: {tail}")
    rec = json.loads(lines[-1])
    rec["process_wall_s"] = wall
    return rec


def fmt(x, spec=".3f"):
    if x is None:
        return "-"
    if isinstance(x, float) and not math.isfinite(x):
        return str(x)
    return format(x, spec)


def markdown_table(header, rows, align=None):
    """A GitHub markdown table; ``align``: string of 'l'/'r' per column."""
    align = align or ("l" + "r" * (len(header) - 1))
    out = ["| " + " | ".join(header) + " |", "|" + "|".join(":---" if a == "l" else "---:" for a in align) + "|"]
    out += ["| " + " | ".join(str(c) for c in r) + " |" for r in rows]
    return "\n".join(out)


def machine_meta():
    import platform

    meta = dict(cpu_count=os.cpu_count(), python=platform.python_version(), machine=platform.machine())
    try:
        import jax

        meta["jax"] = jax.__version__
    except Exception:  # noqa: BLE001  # pragma: no cover -- metadata is best effort
        pass
    return meta


def write_json(path, obj):
    if path:
        d = os.path.dirname(os.path.abspath(path))
        os.makedirs(d, exist_ok=True)
        tmp = path + ".tmp"
        with open(tmp, "w") as f:
            json.dump(obj, f, indent=2)
        os.replace(tmp, path)


# ----------------------------------------------------------------------------- multi-process memory runs
def join_local_runtime(sv, port: int, nproc: int, pid: int, **kwargs) -> None:
    """Join the ``nproc``-process JAX runtime on 127.0.0.1 (one CPU device per process), before any JAX op."""
    sv.parallel.initialize_distributed(
        f"127.0.0.1:{port}",
        num_processes=nproc,
        process_id=pid,
        local_device_count=1,
        initialization_timeout=120,
        **kwargs,
    )


def free_port() -> int:
    """A free TCP port on 127.0.0.1 (the ``jax.distributed`` coordinator's)."""
    import socket

    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def spawn_processes(argv, nproc, timeout, what):
    """Run ``argv + ["--pid", i]`` for ``i < nproc`` at once; the JSON lines they print, from all of them.

    ``SystemExit`` naming ``what`` when one fails or the group runs past ``timeout`` seconds (all killed).
    """
    here = os.path.dirname(os.path.abspath(__file__))
    env = dict(os.environ, JAX_PLATFORMS="cpu", PYTHONPATH=os.pathsep.join([os.path.dirname(here), here]))
    procs = [
        subprocess.Popen(argv + ["--pid", str(i)], env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
        for i in range(nproc)
    ]
    recs = []
    for i, p in enumerate(procs):
        try:
            so, se = p.communicate(timeout=timeout)
        except subprocess.TimeoutExpired:
            for q in procs:
                q.kill()
            raise SystemExit(f"{what}: no result within {timeout} s") from None
        if p.returncode != 0:
            raise SystemExit(f"{what} process {i} failed:\n{se[-3000:]}")
        recs += [json.loads(line) for line in so.splitlines() if line.startswith("{")]
    return recs


def memory_row(p, recs, bitwise) -> dict:
    """One ``P`` of a per-process memory benchmark: the largest base, peak, ``peak - base`` and times."""
    return dict(
        P=p,
        base_mib=max(r["base_mib"] for r in recs),
        peak_mib=max(r["peak_mib"] for r in recs),
        above_mib=max(r["peak_mib"] - r["base_mib"] for r in recs),
        first_s=max(r["first_s"] for r in recs),
        iter_s=max((r["iter_s"] for r in recs if r["iter_s"] is not None), default=None),
        bitwise_vs_P1=bool(bitwise),
    )


def memory_table(rows) -> str:
    """The Markdown table of :func:`memory_row` rows (``above_ratio`` added: ``above`` over the first row's)."""
    for r in rows:
        r["above_ratio"] = r["above_mib"] / rows[0]["above_mib"]
    hdr = ["P", "base MiB", "peak MiB", "above base MiB", "above / P=1", "first s", "iter s", "bitwise = P=1"]
    body = [
        [
            str(r["P"]),
            fmt(r["base_mib"], ".0f"),
            fmt(r["peak_mib"], ".0f"),
            fmt(r["above_mib"], ".0f"),
            fmt(r["above_ratio"], ".2f"),
            fmt(r["first_s"], ".1f"),
            fmt(r["iter_s"], ".2f"),
            str(r["bitwise_vs_P1"]),
        ]
        for r in rows
    ]
    return markdown_table(hdr, body)
