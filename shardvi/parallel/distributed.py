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
import socket
import time

import jax

from .. import host_memory
from ..exceptions import ShardviError

__all__ = ["DistributedTimeoutError", "initialize_distributed", "shutdown_distributed", "is_distributed"]


class DistributedTimeoutError(ShardviError, TimeoutError):
    """Not every process of a multi-process run joined within ``initialization_timeout`` seconds.

    Raised by :func:`initialize_distributed`'s check before JAX's own
    initialization (whose timeout ends the process), so ``try``/``finally``
    and the caller's clean-up run.
    """


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
    heartbeat_timeout: int = 100,
    platform: str | None = None,
    cap_heaps: bool = False,
    preflight: bool = True,
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
    heartbeat_timeout : int
        Seconds without a heartbeat after which the runtime declares a process
        dead (JAX's ``heartbeat_timeout_seconds``). JAX then ends every
        surviving process (an abort, no Python exception): a run's checkpoints
        up to its last finished iteration stay intact, and the run resumes by
        restarting all processes with the same ``checkpoint_dir``.
    platform : str, optional
        Restrict JAX to a platform, e.g. ``"cpu"`` (sets ``jax_platforms``).
    cap_heaps : bool
        Opt-in, glibc only: let this process's threads share at most two malloc heaps, set
        before JAX starts its threads (:func:`shardvi.host_memory.cap_heaps`; it changes the
        whole process's allocator, never a result).
    preflight : bool
        Before JAX's initialization, meet every process over a plain TCP
        connection to the coordinator address (process 0 listens there
        until all have joined, then frees the port for JAX), so that a process
        that never comes, or a coordinator that cannot be reached, raises
        :class:`DistributedTimeoutError` within ``initialization_timeout``
        instead of ending the process inside JAX.

    Raises
    ------
    TypeError, ValueError
        Malformed arguments (named in the message).
    DistributedTimeoutError
        Not every process joined within ``initialization_timeout`` seconds.
    OSError
        Process 0 cannot listen on the coordinator address (e.g. the port is in use).
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
    _check_int(heartbeat_timeout, "heartbeat_timeout", 1)
    if not isinstance(preflight, bool):
        raise TypeError(f"preflight must be a bool, got {type(preflight).__name__}")
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
    if preflight and num_processes > 1:
        _meet(
            bind_address or coordinator_address, coordinator_address, num_processes, process_id, initialization_timeout
        )
    jax.distributed.initialize(
        coordinator_address=coordinator_address,
        num_processes=num_processes,
        process_id=process_id,
        coordinator_bind_address=bind_address or coordinator_address,
        initialization_timeout=initialization_timeout,
        heartbeat_timeout_seconds=heartbeat_timeout,
    )


def _host_port(address: str) -> tuple[str, int]:
    host, _, port = address.rpartition(":")
    return host.strip("[]"), int(port)


def _meet(bind: str, address: str, n: int, me: int, timeout: float) -> None:
    """Every process reaches process 0 at ``address`` within ``timeout`` s, or :class:`DistributedTimeoutError`.

    Process 0 listens on ``bind``, takes one line ``shardvi <id>`` from each other process, answers ``go``
    to all once everyone is there and waits for them to close first (so the port is free again at once,
    for JAX's coordinator). The others connect (retrying until process 0 listens), send their line and
    wait for ``go``.
    """
    deadline = time.monotonic() + timeout
    if me == 0:
        _meet_as_coordinator(_host_port(bind), address, n, deadline, timeout)
    else:
        _meet_as_peer(_host_port(address), address, me, deadline, timeout)


def _meet_as_coordinator(bind, address, n, deadline, timeout) -> None:
    joined: dict[int, socket.socket] = {}
    with socket.create_server(bind, backlog=n) as server:
        server.settimeout(0.2)
        while len(joined) < n - 1:
            if time.monotonic() > deadline:
                for c in joined.values():
                    c.close()
                missing = sorted(set(range(1, n)) - set(joined))
                raise DistributedTimeoutError(
                    f"initialize_distributed: {len(joined) + 1} of {n} processes reached the coordinator {address} "
                    f"within initialization_timeout={timeout:g} s (missing process ids: {missing})"
                )
            try:
                conn, _ = server.accept()
            except (TimeoutError, BlockingIOError):
                continue
            conn.settimeout(max(deadline - time.monotonic(), 0.1))
            try:
                line = conn.makefile("rb").readline(64).decode("ascii", "replace").split()
            except OSError:
                line = []
            if len(line) == 2 and line[0] == "shardvi" and line[1].isdigit() and 0 < int(line[1]) < n:
                joined.setdefault(int(line[1]), conn)
            else:
                conn.close()
        for c in joined.values():
            c.sendall(b"go\n")
        for c in joined.values():  # the peer closes first: no TIME_WAIT on the coordinator's port
            c.settimeout(max(deadline - time.monotonic(), 1.0))
            try:
                c.recv(1)
            except OSError:
                pass
            c.close()


def _meet_as_peer(coordinator, address, me, deadline, timeout) -> None:
    reached = False
    while True:
        remaining = deadline - time.monotonic()
        if remaining <= 0:
            what = "all processes to join at" if reached else "the coordinator (process 0) at"
            raise DistributedTimeoutError(
                f"initialize_distributed: process {me} waited initialization_timeout={timeout:g} s for {what} {address}"
            )
        try:
            with socket.create_connection(coordinator, timeout=min(remaining, 5.0)) as conn:
                reached = True
                conn.sendall(f"shardvi {me}\n".encode("ascii"))
                conn.settimeout(max(deadline - time.monotonic(), 0.1))
                if conn.makefile("rb").readline(8) == b"go\n":
                    return
        except OSError:  # refused (process 0 not listening yet), reset or timed out: try again until the deadline
            pass
        time.sleep(0.2)


def shutdown_distributed() -> None:
    """Leave the multi-process runtime (``jax.distributed.shutdown``)."""
    jax.distributed.shutdown()


def is_distributed() -> bool:
    """True when this process is part of a multi-process runtime."""
    return jax.process_count() > 1
