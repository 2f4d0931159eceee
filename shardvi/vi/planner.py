"""Choosing the device map: :func:`plan` predicts each candidate's memory per device from its compiled steps.

A candidate is a strategy object (``Vmap`` on one device, ``ShardMap`` over
several, with a chunk size and, for a likelihood amended with
``data_blocks`` / ``field_blocks``, a number of model shards). For each, the
engine's steps of one iteration are lowered and compiled with stand-ins of
the real arguments (nothing is sampled) and ``memory_analysis()`` of the
compiled programs gives their arguments, outputs and temporaries per device;
the samples that live on a device between the steps are added. The plan
recommends one candidate (:attr:`Plan.choice`) and says why.

:func:`check_memory` is the fast check every entry point runs before any
work (:func:`shardvi.parallel.memory.check_memory`): the samples, position
and data a run keeps on one device, against the device's memory.
"""

from __future__ import annotations

import concurrent.futures
import dataclasses
import logging
import math
import time

import jax
import jax.numpy as jnp
import numpy as np
from jax import tree_util as jtu

from ..minimizers.cg import CGConfig
from ..minimizers.newton_cg import NewtonCGConfig
from ..models.model import check_latent
from ..parallel.field_arrays import holds_global
from ..parallel.memory import format_bytes, tree_bytes
from ..parallel.memory import memory_limit as device_memory_limit  # plan's argument has the function's name
from ..parallel.mesh import check_devices
from ..parallel.shard_map import ShardMap
from ..parallel.strategy import MAX_CHUNK, Strategy, place
from ..parallel.vmap import Vmap
from ._checks import check_bool
from .likelihood import Likelihood, amend_hint
from .modes import parse_sample_mode
from .settings import DEFAULT_KL_MINIMIZATION, DEFAULT_LINEAR_SAMPLING, DEFAULT_NONLINEAR_UPDATE

__all__ = ["Candidate", "Plan", "choose_strategy", "plan", "resolve_auto"]

logger = logging.getLogger("shardvi")

_HEADROOM = 0.9  # a candidate fits when its prediction is at most this fraction of the limit


@dataclasses.dataclass(frozen=True)
class Candidate:
    """One device map with its predicted memory per device (bytes).

    Attributes
    ----------
    strategy : Strategy
        Ready to pass as ``sample_map`` / ``kl_map``.
    label : str
        Short description (``ShardMap x4 chunk 2``).
    steps : dict of str to int
        Arguments + outputs + temporaries of each compiled step per device
        (``"draw"``, ``"curve"`` for geoVI, ``"kl"``).
    temporaries : dict of str to int
        The temporaries alone, per step.
    resident : int
        The samples a device keeps between steps.
    peak : int
        The prediction: ``max(draw + resident, curve, kl)``.
    seconds : float or None
        Measured time of one sampling step (``measure=True``), else ``None``.
    """

    strategy: Strategy
    label: str
    steps: dict
    temporaries: dict
    resident: int
    peak: int
    seconds: float | None = None


@dataclasses.dataclass(frozen=True)
class Plan:
    """The candidates, the recommended one and why. ``print(plan)`` shows the table.

    Attributes
    ----------
    candidates : tuple of Candidate
    choice : Strategy
        The recommended device map (``plan.choice`` is what ``sample_map="auto"`` uses).
    reason : str
        One paragraph: why this one.
    limit : int or None
        Bytes per device the candidates are held against (``None``: unknown).
    limit_source : str
    n_samples : int
        Antithetic pairs per iteration.
    """

    candidates: tuple
    choice: Strategy
    reason: str
    limit: int | None
    limit_source: str
    n_samples: int

    def __str__(self):
        rows: list[tuple[str, ...]] = [("candidate", "draw", "geoVI", "KL", "samples", "peak/device", "fits", "time")]
        for c in self.candidates:
            fits = "-" if self.limit is None else ("yes" if c.peak <= _HEADROOM * self.limit else "no")
            rows.append(
                (
                    ("* " if c.strategy == self.choice else "  ") + c.label,
                    *(format_bytes(c.steps[s]) if s in c.steps else "-" for s in ("draw", "curve", "kl")),
                    format_bytes(c.resident),
                    format_bytes(c.peak),
                    fits,
                    "-" if c.seconds is None else f"{c.seconds:.3g} s",
                )
            )
        widths = [max(len(r[i]) for r in rows) for i in range(len(rows[0]))]
        lines = ["  ".join(v.ljust(w) for v, w in zip(r, widths, strict=True)).rstrip() for r in rows]
        limit = "unknown" if self.limit is None else format_bytes(self.limit)
        head = f"plan for {self.n_samples} sample pairs; memory per device: {limit} ({self.limit_source})"
        return "\n".join([head, *lines, "", self.reason])


def _model_blocks(likelihood) -> int | None:
    """The data or field blocks a model axis can split, ``None`` for a likelihood that has none."""
    return likelihood.layout.model_blocks


def _divisors(n: int) -> list:
    return [k for k in range(1, n + 1) if n % k == 0]


def _chunk_options(per_device: int) -> list:
    """Chunk sizes worth comparing: 1, 4, 16, ... below ``per_device``, and all of them at once (each at most
    :data:`~shardvi.parallel.strategy.MAX_CHUNK`)."""
    out, c = [], 1
    while c < per_device:
        out.append(c)
        c *= 4
    return [c for c in (*out, per_device) if c <= MAX_CHUNK]


def _candidates(likelihood, devices, n_samples: int, mirror: bool, split_over_processes: bool = False) -> list:
    """``[(strategy, label)]``: one device with ``Vmap``, all devices with ``ShardMap`` (and model shards).

    Arrays split over processes exclude ``Vmap`` (one device holds no other process's rows).
    """
    m = n_samples * (2 if mirror else 1)
    out = []
    for c in _chunk_options(max(m, 1)) if not split_over_processes else ():
        chunk = None if c == m and c > 1 else c
        out.append((Vmap(chunk_size=chunk), f"Vmap chunk {'all' if chunk is None else chunk}"))
    if len(devices) > 1:
        blocks = _model_blocks(likelihood)
        shards = [1] if blocks is None else [k for k in _divisors(len(devices)) if blocks % k == 0]
        for k in shards:
            rows = len(devices) // k
            per = math.ceil(m / rows)
            for c in _chunk_options(max(per, 1)):
                label = f"ShardMap {rows}x{k}" if k > 1 else f"ShardMap x{rows}"
                out.append((ShardMap(devices=tuple(devices), chunk_size=c, model_shards=k), f"{label} chunk {c}"))
    return out


def _analysis(compiled) -> tuple[int, int]:
    """``(arguments + outputs - aliased + temporaries, temporaries)`` per device of a compiled program."""
    m = compiled.memory_analysis()
    if m is None:
        raise RuntimeError("this backend gives no memory analysis of compiled programs")
    total = m.argument_size_in_bytes + m.output_size_in_bytes - m.alias_size_in_bytes + m.temp_size_in_bytes
    return int(total), int(m.temp_size_in_bytes)


def _compile_all(lowered: dict) -> dict:
    """``{name: _analysis(compiled)}`` of lowered steps, compiled side by side (XLA releases the GIL).

    The lowering (which runs the user's model code) happened in the calling
    thread; only the compilations run in worker threads, all joined here.
    """
    if len(lowered) == 1:
        return {k: _analysis(low.compile()) for k, low in lowered.items()}
    with concurrent.futures.ThreadPoolExecutor(max_workers=len(lowered), thread_name_prefix="shardvi-plan") as pool:
        futures = {k: pool.submit(low.compile) for k, low in lowered.items()}
        return {k: _analysis(f.result()) for k, f in futures.items()}


def _stand_in(strategy, tree):
    """``ShapeDtypeStruct``\\ s of ``tree`` placed as the strategy places latents (no array is made)."""
    leaves = jtu.tree_leaves(tree)
    sharding = place(strategy, np.zeros(1, leaves[0].dtype)).sharding
    return jtu.tree_map(lambda x: jax.ShapeDtypeStruct(np.shape(x), x.dtype, sharding=sharding), tree)


def _measure_candidate(
    likelihood, pos, strategy, label, n_samples, mode, lin, nonlin, klc, mirror, measure
) -> Candidate:
    from .engine import OptimizeVI  # here: the engine imports this module's check

    opt = OptimizeVI(
        likelihood,
        1,
        n_samples=n_samples,
        sample_mode=mode,
        mirror_samples=mirror,
        linear_sampling=lin,
        nonlinear_update=nonlin,
        kl_minimization=klc,
        sample_map=strategy,
        kl_map=strategy,
        progress=False,
        precompile=False,
    )
    m = n_samples * (2 if mirror else 1)
    key_shape = (n_samples, 2)
    keys = np.zeros(key_shape, np.uint32)
    residuals = jtu.tree_map(lambda p: jax.ShapeDtypeStruct((m, *np.shape(p)), jnp.result_type(p)), pos)
    field_split = likelihood.layout.splits_latent
    # a field split's grid leaves are wrapped for the model axis: real (zero) stand-ins, placed as in a run
    zeros = jtu.tree_map(lambda s: np.zeros(s.shape, s.dtype), residuals) if field_split else None
    lowered = {"draw": opt._draw_linear.lower(opt._split(pos), keys, config=lin)}
    if parse_sample_mode(mode).nonlinear:
        if field_split:
            lowered["curve"] = opt._curve.lower(
                opt._split(pos), opt._split(zeros), np.zeros((m, 2), np.uint32), opt._signs(n_samples), config=nonlin
            )
        else:
            sstrat = opt.sample_strategy
            lowered["curve"] = opt._curve.step.__wrapped__.lower(
                opt._curve.likelihood,
                place(sstrat, pos),
                _stand_in(sstrat, residuals),
                place(sstrat, np.zeros((m, 2), np.uint32)),
                place(sstrat, opt._signs(n_samples)),
                config=nonlin,
            )
    if field_split:
        lowered["kl"] = opt._minimize.lower(opt._split(pos, True), opt._split(zeros, True), config=klc)
    else:
        kstrat = opt.kl_strategy
        lowered["kl"] = opt._minimize.step.__wrapped__.lower(
            opt._minimize.likelihood, place(kstrat, pos), _stand_in(kstrat, residuals), config=klc
        )
    analyses = _compile_all(lowered)
    steps = {k: a[0] for k, a in analyses.items()}
    temps = {k: a[1] for k, a in analyses.items()}
    # the previous iteration's samples, on every device for the KL step (a split field's grid leaves: its rows)
    shards = getattr(strategy, "model_shards", 1) or 1
    split = likelihood.layout.latent_split(likelihood.domain)
    resident = sum(
        tree_bytes(r) // (shards if s else 1) for r, s in zip(jtu.tree_leaves(residuals), jtu.tree_leaves(split))
    )
    peak = max(steps["draw"] + resident, steps.get("curve", 0), steps["kl"])
    seconds = None
    if measure:
        real_keys = jax.random.split(jax.random.PRNGKey(0), n_samples)
        jax.block_until_ready(opt._draw_linear(opt._split(pos), real_keys, config=lin))
        t0 = time.perf_counter()
        jax.block_until_ready(opt._draw_linear(opt._split(pos), real_keys, config=lin))
        seconds = time.perf_counter() - t0
    return Candidate(strategy, label, steps, temps, resident, int(peak), seconds)


def _positive_int(v, name):
    if isinstance(v, bool) or not isinstance(v, (int, np.integer)) or v < 1:
        raise ValueError(f"{name} must be an int >= 1, got {v!r}")
    return int(v)


def plan(
    likelihood: Likelihood,
    position,
    *,
    n_samples: int,
    devices=None,
    memory_limit: int | None = None,
    sample_mode: str = "nonlinear_resample",
    mirror_samples: bool = True,
    linear_sampling: CGConfig = DEFAULT_LINEAR_SAMPLING,
    nonlinear_update: NewtonCGConfig = DEFAULT_NONLINEAR_UPDATE,
    kl_minimization=DEFAULT_KL_MINIMIZATION,
    measure: bool = False,
) -> Plan:
    """Predict the memory per device of the candidate device maps of a run and recommend one.

    Parameters
    ----------
    likelihood : Likelihood
        On the latent space (``lh.amend(model)``, with ``data_blocks`` /
        ``field_blocks`` where the data or the field may be split).
    position : pytree
        A latent position of the run (its shapes and dtypes are used).
    n_samples : int
        Antithetic sample pairs per iteration (the largest of a schedule).
    devices : sequence of jax.Device, optional
        The devices the run may use (default: all ``jax.devices()``).
    memory_limit : int, optional
        Bytes per device (default: the device's memory; on CPU the host's
        available memory shared by the process's CPU devices).
    sample_mode, mirror_samples, linear_sampling, nonlinear_update, kl_minimization
        As in :func:`~shardvi.optimize_kl`; the steps they compile are the
        ones measured (``sample_mode`` must be a mode name).
    measure : bool
        Also time one sampling step per candidate (this draws samples). A
        Python or NumPy bool.

    Returns
    -------
    Plan
        Every candidate with its prediction; ``plan.choice`` the recommended
        strategy: the fastest kind that fits — on a GPU (or TPU) the largest
        chunk on the most devices, on CPU chunk 1 on the most devices — and,
        where nothing fits, the one that needs the least memory.

    Raises
    ------
    TypeError
        ``likelihood`` is not a Likelihood, ``sample_mode`` not a mode name,
        ``mirror_samples`` or ``measure`` not a bool, ``devices`` not a
        sequence of devices.
    ValueError
        ``n_samples`` is not an int >= 1, ``memory_limit`` not an int > 0.
    """
    return _plan(
        likelihood,
        position,
        n_samples,
        devices,
        memory_limit,
        sample_mode,
        mirror_samples,
        (linear_sampling, nonlinear_update, kl_minimization),
        measure,
        first_fit=False,
    )


def _plan(
    likelihood, position, n_samples, devices, memory_limit, sample_mode, mirror, configs, measure, first_fit, gpu=None
):
    """:func:`plan`; ``first_fit``: on an accelerator, measure the candidates in the order of preference and stop
    at the first that fits (the choice is the same, the table holds only the candidates measured). ``gpu``
    overrides whether the devices count as an accelerator (default: any platform other than CPU)."""
    if not isinstance(likelihood, Likelihood):
        raise TypeError(f"likelihood must be a shardvi Likelihood, got {type(likelihood).__name__}")
    n_samples = _positive_int(n_samples, "n_samples")
    mirror, measure = check_bool(mirror, "mirror_samples"), check_bool(measure, "measure")
    if not isinstance(sample_mode, str):
        raise TypeError("sample_mode of a plan must be a mode name (the mode whose steps are measured)")
    parse_sample_mode(sample_mode)
    devs = check_devices(devices, "devices") or tuple(jax.devices())
    limit, source = device_memory_limit(devs, memory_limit)
    check_latent(position, likelihood.domain, "position", hint=amend_hint(likelihood))  # as optimize_kl does
    pos = jtu.tree_map(lambda x, d: jnp.asarray(x, d.dtype), position, likelihood.domain)
    across = holds_global((likelihood, position))
    todo = _candidates(likelihood, devs, n_samples, mirror, across)
    gpu = devs[0].platform != "cpu" if gpu is None else gpu
    if first_fit and gpu:
        todo.sort(key=lambda c: _accelerator_preference(c[0]), reverse=True)
    lin, nonlin, klc = configs
    cands = []
    for strategy, label in todo:
        cand = _measure_candidate(
            likelihood, pos, strategy, label, n_samples, sample_mode, lin, nonlin, klc, mirror, measure
        )
        cands.append(cand)
        if first_fit and gpu and _fits(cand, limit):
            break
    choice, reason = _recommend(cands, limit, "gpu" if gpu else "cpu")
    return Plan(tuple(cands), choice.strategy, reason, limit, source, n_samples)


def _fits(cand: Candidate, limit: int | None) -> bool:
    return limit is None or cand.peak <= _HEADROOM * limit


def _devices_used(strategy) -> int:
    return len(strategy.devices) if getattr(strategy, "devices", None) else 1


def _accelerator_preference(strategy) -> tuple:
    """Larger is better on a GPU: the most devices, the largest chunk, the fewest model shards."""
    chunk = math.inf if strategy.chunk_size is None else strategy.chunk_size
    return (_devices_used(strategy), chunk, -(getattr(strategy, "model_shards", 1) or 1))


def _recommend(cands, limit, platform) -> tuple[Candidate, str]:
    fits = [c for c in cands if _fits(c, limit)]
    gpu = platform != "cpu"
    if not fits:
        best = min(cands, key=lambda c: c.peak)
        return best, (
            f"No candidate fits {format_bytes(limit or 0)} per device: {best.label} needs the least "
            f"({format_bytes(best.peak)}). Use fewer sample pairs, more devices or, for a likelihood amended with "
            "data_blocks / field_blocks, more model shards."
        )

    if gpu:  # all samples at once where they fit: a GPU idles on one sample at a time
        best = max(fits, key=lambda c: _accelerator_preference(c.strategy))
        why = (
            f"{best.label}: the most devices and the largest chunk that fit ({format_bytes(best.peak)} of "
            f"{format_bytes(limit) if limit else 'unknown'} per device); a GPU runs a whole chunk of samples in "
            "one vectorized step. Results are bitwise equal to runs with the same per-device chunk only: for a "
            "comparison across device counts pass an explicit strategy with a fixed chunk_size."
        )
    else:  # CPU: one sample at a time per device (as fast as larger chunks, less memory, bitwise across counts)
        ones = [c for c in fits if c.strategy.chunk_size == 1] or fits
        best = max(ones, key=lambda c: (_devices_used(c.strategy), -(getattr(c.strategy, "model_shards", 1) or 1)))
        why = (
            f"{best.label}: on CPU a chunk of one sample per device is as fast as larger chunks and needs the "
            f"least memory ({format_bytes(best.peak)} per device); the samples are spread over "
            f"{_devices_used(best.strategy)} device(s), bitwise equal to any other device count with chunk 1."
        )
    if best.seconds is not None:
        fastest = min((c for c in fits if c.seconds is not None), key=lambda c: c.seconds)
        if fastest.seconds < 0.8 * best.seconds:
            best = fastest
            why = f"{best.label}: the fastest measured sampling step ({best.seconds:.3g} s) that fits."
    return best, why


def choose_strategy(
    likelihood,
    position,
    *,
    n_samples: int,
    devices=None,
    memory_limit=None,
    mirror_samples: bool = True,
    sample_mode: str = "nonlinear_resample",
):
    """The strategy ``"auto"`` stands for, logged at INFO level.

    On CPU without a compile: chunk 1 on all devices (or one device). On an
    accelerator :func:`plan`'s choice, found by compiling the candidates in
    the order of preference (most devices, largest chunk, fewest model
    shards) and stopping at the first that fits: usually one candidate's
    steps, compiled once more by the run itself.
    """
    devs = check_devices(devices, "devices") or tuple(jax.devices())
    if devs[0].platform == "cpu":
        blocks = _model_blocks(likelihood)
        k = 1 if blocks is None else max(k for k in _divisors(len(devs)) if blocks % k == 0)
        if len(devs) == 1:
            strategy = Vmap()
        else:
            strategy = ShardMap(devices=devs, chunk_size=1, model_shards=k)
        reason = f"on CPU: chunk 1 on {len(devs)} device(s)" + (f", {k} model shards" if k > 1 else "")
    else:
        configs = (DEFAULT_LINEAR_SAMPLING, DEFAULT_NONLINEAR_UPDATE, DEFAULT_KL_MINIMIZATION)
        p = _plan(
            likelihood,
            position,
            n_samples,
            devs,
            memory_limit,
            sample_mode,
            mirror_samples,
            configs,
            measure=False,
            first_fit=True,
        )
        strategy, reason = p.choice, p.reason
    logger.info("'auto' device map: %r (%s)", strategy, reason)
    return strategy


def resolve_auto(
    likelihood, n_total_iterations, *, sample_map, kl_map, devices, n_samples, mirror_samples=True, memory_limit=None
):
    """``(sample_map, kl_map, devices, n_samples)`` with ``"auto"`` replaced by :func:`choose_strategy`'s choice.

    The largest sample count of the run is planned for. A callable
    ``n_samples`` is called here once per iteration and comes back as a table
    of its values (the optimizer then never calls the user's function again).
    """
    if "auto" not in (sample_map, kl_map):
        return sample_map, kl_map, devices, n_samples
    from .settings import at_iteration

    if callable(n_samples):
        table = tuple(at_iteration(n_samples, i, "n_samples") for i in range(int(n_total_iterations)))
        n_samples = _Table(table)
        counts = table
    else:
        counts = (n_samples,)
    n_max = max([c for c in counts if isinstance(c, (int, np.integer)) and not isinstance(c, bool)] or [1])
    zeros = jtu.tree_map(lambda d: jnp.zeros(d.shape, d.dtype), likelihood.domain)
    chosen = choose_strategy(
        likelihood,
        zeros,
        n_samples=max(int(n_max), 1),
        devices=devices,
        mirror_samples=mirror_samples,
        memory_limit=memory_limit,
    )
    sample_map = chosen if sample_map == "auto" else sample_map
    kl_map = chosen if kl_map == "auto" else kl_map
    return sample_map, kl_map, None, n_samples


class _Table:
    """``i -> values[i]``: a schedule evaluated once."""

    def __init__(self, values):
        self.values = values

    def __call__(self, i):
        return self.values[i]
