"""Memory of a device and what a run keeps on it: the limit a plan is held against.

:func:`memory_limit` is the memory one device of a run may use: an
accelerator's ``bytes_limit`` (``jax.Device.memory_stats()``), or on CPU the
host memory available now (``MemAvailable`` of ``/proc/meminfo``, shared by
the CPU devices of the process). :func:`check_memory` holds what a run keeps
on a device between the engine's steps (the samples, the position and the
likelihood's arrays) against it and raises :class:`InsufficientMemoryError`
before any work when the run cannot fit.
"""

from __future__ import annotations

import math

import jax
import numpy as np
from jax import tree_util as jtu

from ..exceptions import ShardviError

__all__ = [
    "InsufficientMemoryError",
    "check_memory",
    "format_bytes",
    "memory_limit",
    "tree_bytes",
]


class InsufficientMemoryError(ShardviError, MemoryError):
    """A run's predicted memory per device exceeds the device's (or ``memory_limit``); raised before any work.

    Attributes
    ----------
    predicted, limit : int
        Bytes per device: the prediction and the limit it was held against.
    """

    def __init__(self, message: str, predicted: int, limit: int):
        self.predicted, self.limit = int(predicted), int(limit)
        super().__init__(message)


def format_bytes(n: float) -> str:
    """``1.5 GiB``-style text of a byte count."""
    n = float(n)
    for unit in ("B", "KiB", "MiB", "GiB", "TiB"):
        if abs(n) < 1024 or unit == "TiB":
            return f"{n:.0f} {unit}" if unit == "B" else f"{n:.1f} {unit}"
        n /= 1024
    return f"{n:.1f} TiB"  # pragma: no cover


def _host_available() -> int | None:
    try:
        with open("/proc/meminfo") as f:
            for line in f:
                if line.startswith("MemAvailable:"):
                    return int(line.split()[1]) * 1024
    except OSError:
        pass
    try:
        import os

        return int(os.sysconf("SC_AVPHYS_PAGES")) * int(os.sysconf("SC_PAGE_SIZE"))
    except (ValueError, OSError, AttributeError):
        return None


def memory_limit(devices, memory_limit: int | None = None) -> tuple[int | None, str]:
    """``(bytes per device, where the number comes from)``; ``(None, reason)`` where it cannot be known.

    ``memory_limit`` (bytes, an int > 0) wins. Accelerators report their
    ``bytes_limit``; CPU devices share the host's available memory, so each
    of ``n`` CPU devices of this process gets ``1/n`` of it.
    """
    if memory_limit is not None:
        if isinstance(memory_limit, bool) or not isinstance(memory_limit, (int, np.integer)) or memory_limit <= 0:
            raise ValueError(f"memory_limit must be a positive int (bytes per device), got {memory_limit!r}")
        return int(memory_limit), "memory_limit"
    devices = list(devices)
    stats = None
    try:
        stats = devices[0].memory_stats()
    except Exception:  # noqa: BLE001 -- a backend without memory statistics
        stats = None
    if stats and stats.get("bytes_limit"):
        return int(stats["bytes_limit"]), f"{devices[0].platform} bytes_limit"
    if devices[0].platform == "cpu":
        avail = _host_available()
        if avail is None:
            return None, "host memory unknown"
        local_cpu = sum(1 for d in devices if d.process_index == jax.process_index())
        return avail // max(local_cpu, 1), f"host MemAvailable / {max(local_cpu, 1)} CPU device(s)"
    return None, f"{devices[0].platform} reports no memory limit"


_device_limit = memory_limit  # for check_memory, whose argument has that name


def tree_bytes(tree) -> int:
    """Bytes of the arrays (or ``ShapeDtypeStruct``\\ s) of ``tree``."""
    return sum(
        math.prod(np.shape(x)) * np.dtype(x.dtype).itemsize for x in jtu.tree_leaves(tree) if hasattr(x, "dtype")
    )


def check_memory(likelihood, n_samples: int, strategy, *, mirror_samples=True, memory_limit=None, what="run"):
    """Raise :class:`InsufficientMemoryError` if the samples, position and data of a run cannot fit one device.

    The fast check before any work (no compilation): ``2 n_samples``
    residuals of the latent's size, twice (as the sampling step returns them
    and as every device holds all of them for the KL step), the position and
    the likelihood's arrays (split over the model shards), against
    :func:`memory_limit`. A run that passes may still need more for its
    temporaries (:func:`shardvi.parallel.plan` predicts those).
    """
    devs = getattr(strategy, "devices", None) or (jax.local_devices()[0],)
    limit, source = _device_limit(devs, memory_limit)
    if limit is None:
        return
    k = getattr(strategy, "model_shards", 1)
    latent = likelihood.layout.latent_bytes_per_device(likelihood.domain, k)  # a field split: its rows only
    m = int(n_samples) * (2 if mirror_samples else 1)
    data = tree_bytes([x for x in jtu.tree_leaves(likelihood) if hasattr(x, "dtype")]) // max(k, 1)
    need = (2 * m + 2) * latent + data  # the samples twice: drawn (sharded) and placed for the KL step
    if need <= limit:
        return
    per_pair = (4 if mirror_samples else 2) * latent
    room = max((limit - data - 2 * latent) // per_pair, 0)
    raise InsufficientMemoryError(
        f"{what} with n_samples={n_samples} cannot fit: its samples alone need {format_bytes(need)} per device "
        f"({m} residuals of {format_bytes(latent)} each, twice: as drawn and as held on every device for the KL "
        "step, plus the data"
        + (f" split over model_shards={k}" if k > 1 else "")
        + f") but a device has {format_bytes(limit)} ({source}). The samples of at most n_samples={room} fit; "
        "every device holds all samples, so use fewer pairs (or split a field-split latent over more "
        "model_shards), or pass memory_limit=... (bytes per device) if the limit is wrong. "
        "sv.parallel.plan(...) predicts the whole run's memory, temporaries of each chunk_size and model_shards "
        "included.",
        need,
        limit,
    )
