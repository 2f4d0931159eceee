"""Multi-process runs: one JAX runtime over several processes (``jax.distributed``).

Every process runs the same program (SPMD): build the likelihood, call
:func:`shardvi.optimize_kl` with a multi-device ``sample_map``/``kl_map``
and ``devices=None`` (all global devices). Strategies replicate their
outputs, so samples, positions and KL energies are ordinary (fully
replicated) arrays every process can read, bitwise equal to a one-process run.

>>> import shardvi as sv
>>> sv.parallel.initialize_distributed("127.0.0.1:12345", num_processes=2, process_id=rank,
...                                    local_device_count=2)   # before any other JAX call
"""

from __future__ import annotations

import re

import jax

from .. import host_memory

__all__ = ["initialize_distributed", "shutdown_distributed", "is_distributed"]

_ADDRESS = re.compile(r"^[\w.\-\[\]:]+:\d+$")


def _check_int(value, argname, minimum):
    if isinstance(value, bool) or not isinstance(value, int) or value < minimum:
        raise ValueError(f"{argname} must be an int >= {minimum}, got {value!r}")


def initialize_distributed(
    coordinator_address: str,
    num_processes: int,
    process_id: int,
    *,
    local_device_count: int | None = None,
    bind_address: str | None = None,
    initialization_timeout: int = 120,
    platform: str | None = None,
    cap_heaps: bool = False,
) -> None:
    """Join a multi-process JAX runtime (wraps ``jax.distributed.initialize``).

    Call it first thing in every process, before any JAX computation.

    Parameters
    ----------
    coordinator_address : str
        ``"host:port"`` of process 0's coordinator, e.g. ``"127.0.0.1:12345"``.
    num_processes : int
        Number of processes (>= 1).
    process_id : int
        This process's rank, ``0 <= process_id < num_processes``.
    local_device_count : int, optional
        For CPU runs: number of CPU devices of this process (sets
        ``jax_num_cpu_devices``; only possible before the first JAX op).
    bind_address : str, optional
        Address the coordinator (process 0) binds to; defaults to
        ``coordinator_address`` (so a loopback address stays on loopback).
    initialization_timeout : int
        Seconds to wait for all processes to join.
    platform : str, optional
        Restrict JAX to a platform, e.g. ``"cpu"`` (sets ``jax_platforms``).
    cap_heaps : bool
        Opt-in, glibc only: let this process's threads share at most two malloc heaps, set
        before JAX starts its threads (:func:`shardvi.host_memory.cap_heaps`; it changes the
        whole process's allocator, never a result).

    Raises
    ------
    TypeError, ValueError
        Malformed arguments (named in the message).
    RuntimeError
        JAX was already used in this process, so devices can no longer be set.
    """
    if not isinstance(coordinator_address, str) or not _ADDRESS.match(coordinator_address):
        raise ValueError(f"coordinator_address must be 'host:port', got {coordinator_address!r}")
    _check_int(num_processes, "num_processes", 1)
    _check_int(process_id, "process_id", 0)
    if process_id >= num_processes:
        raise ValueError(f"process_id must be < num_processes={num_processes}, got {process_id}")
    if local_device_count is not None:
        _check_int(local_device_count, "local_device_count", 1)
    _check_int(initialization_timeout, "initialization_timeout", 1)
    if bind_address is not None and (not isinstance(bind_address, str) or not _ADDRESS.match(bind_address)):
        raise ValueError(f"bind_address must be 'host:port', got {bind_address!r}")
    if not isinstance(cap_heaps, bool):
        raise TypeError(f"cap_heaps must be a bool, got {type(cap_heaps).__name__}")
    if cap_heaps:
        host_memory.cap_heaps()  # before JAX starts its threads (see there)
    try:
        if platform is not None:
            jax.config.update("jax_platforms", platform)
        if local_device_count is not None:
            jax.config.update("jax_num_cpu_devices", local_device_count)
    except RuntimeError as err:
        raise RuntimeError(
            "initialize_distributed must run before any JAX computation in this process "
            f"(setting devices failed: {err})"
        ) from err
    jax.distributed.initialize(
        coordinator_address=coordinator_address,
        num_processes=num_processes,
        process_id=process_id,
        coordinator_bind_address=bind_address or coordinator_address,
        initialization_timeout=initialization_timeout,
    )


def shutdown_distributed() -> None:
    """Leave the multi-process runtime (``jax.distributed.shutdown``)."""
    jax.distributed.shutdown()


def is_distributed() -> bool:
    """True when this process is part of a multi-process runtime."""
    return jax.process_count() > 1
