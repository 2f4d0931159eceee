"""Compile engine steps ahead of their first call, in the background, while earlier steps run.

The engine's steps are compiled on their first call (per configuration and
sample count), and compiling a step takes seconds, longer than running it on a
small problem. Most of that time the other steps could be compiled too: the
KL minimization of an iteration while its samples are drawn, the geoVI update
of a later iteration while the linear ones run. :class:`Precompiler` does
that: a step is *submitted* with a thunk that lowers it with stand-in
arguments of the shapes, dtypes and placements of its real call
(``step.lower(*args)``). The thunk runs in the calling thread (tracing runs the
user's model code, which never runs in another thread); the lowered step is
then compiled by one background thread (XLA releases the GIL), and JAX keeps
the executable in the step's own cache, so the real call compiles nothing.
Before the real call the caller *claims* the step: a step being compiled is
waited for, one still waiting for the compile thread is compiled by the
caller, in parallel with what the thread is doing.

The result is the same program, bitwise: the same lowering with the same
compiler options. A precompilation that fails is dropped: the real call
traces and compiles the step again and raises the error there, at the step
and iteration it belongs to. :meth:`Precompiler.close` (the engine calls it
when a run ends, also on an error) drops what has not started and waits for
a compilation under way: no thread is left behind.
"""

from __future__ import annotations

import concurrent.futures
import logging
import threading
from collections.abc import Callable, Hashable
from typing import Any

__all__ = ["Precompiler"]

logger = logging.getLogger("shardvi.vi")


class _Job:
    """One submitted step: its lowering, compiled by the background thread or by the caller that claims it."""

    __slots__ = ("key", "lowered", "state", "ok", "done")

    def __init__(self, key: Hashable, lowered: Any):
        self.key, self.lowered = key, lowered
        self.state = "queued"  # -> "compiling" -> "done"; or "cancelled"
        self.ok = False
        self.done = threading.Event()


class Precompiler:
    """Lower submitted steps now and compile them in the background; :meth:`claim` each before its real call.

    Parameters
    ----------
    enabled : bool
        ``False``: :meth:`submit` does nothing (every step compiles on its
        first call, in the calling thread).

    Notes
    -----
    One compile thread, started on the first submission and ended by
    :meth:`close`; a later submission starts a new one. A step is submitted at
    most once: later submissions of a submitted or claimed key are ignored. A
    thunk that returns an object without ``compile`` (e.g. an executable) is
    done when it returns.
    """

    def __init__(self, enabled: bool = True):
        self.enabled = bool(enabled)
        self._jobs: dict[Hashable, _Job] = {}
        self._known: set = set()  # keys ever submitted or claimed
        self._compiler: concurrent.futures.ThreadPoolExecutor | None = None
        self._lock = threading.Lock()

    def submit(self, key: Hashable, thunk: Callable[[], object]) -> None:
        """Run ``thunk()`` (``lower(...)`` of step ``key``) here and compile its result in the background, once."""
        if not self.enabled:
            return
        with self._lock:
            if key in self._known:
                return
            self._known.add(key)
        ok, lowered = _attempt(key, thunk)
        if not ok or not hasattr(lowered, "compile"):
            return
        with self._lock:
            if key not in self._known:  # claimed while it was lowered: the call compiles it
                return
            job = self._jobs[key] = _Job(key, lowered)
            if self._compiler is None:
                self._compiler = concurrent.futures.ThreadPoolExecutor(1, thread_name_prefix="shardvi-precompile")
            self._compiler.submit(self._compile, job)

    def ready(self, key: Hashable) -> bool:
        """Whether step ``key`` was compiled in the background (successfully, and not claimed yet)."""
        with self._lock:
            job = self._jobs.get(key)
        return job is not None and job.done.is_set() and job.ok

    def claim(self, key: Hashable) -> None:
        """Before the real call of step ``key``: make sure it is compiled, or leave it to the call.

        A step being compiled in the background is waited for; one waiting for the compile thread
        is compiled now, in the calling thread (in parallel with the background compilation).
        """
        with self._lock:
            self._known.add(key)
            job = self._jobs.pop(key, None)
            if job is None:
                return
            lowered = job.lowered if job.state == "queued" else None
            if lowered is not None:
                job.state, job.lowered = "compiling", None
        if lowered is None:
            job.done.wait()  # never raises: the compilation catches the step's errors
            return
        logger.debug("compiling %r in the calling thread (lowered ahead)", key)
        ok = _attempt(key, lowered.compile)[0]
        with self._lock:
            job.state, job.ok = "done", ok
        job.done.set()

    def cancel_pending(self) -> None:
        """Cancel the submitted steps that wait for the compile thread; forget all submitted steps.

        A step being compiled finishes (its executable lands in the step's cache).
        """
        with self._lock:
            jobs, self._jobs = self._jobs, {}
            for key, job in jobs.items():
                if job.state == "queued":
                    job.state, job.lowered = "cancelled", None
                    job.done.set()
                    self._known.discard(key)

    def close(self) -> None:
        """:meth:`cancel_pending`, then wait for a compilation under way and end the compile thread."""
        self.cancel_pending()
        with self._lock:
            compiler, self._compiler = self._compiler, None
        if compiler is not None:
            compiler.shutdown(wait=True)

    def join(self) -> None:
        """Wait until the submitted steps have finished (they stay unclaimed)."""
        with self._lock:
            jobs = list(self._jobs.values())
        for job in jobs:
            job.done.wait()

    def pending(self) -> tuple:
        """The keys submitted and not claimed yet."""
        with self._lock:
            return tuple(self._jobs)

    def _compile(self, job: _Job) -> None:
        with self._lock:
            if job.state != "queued":
                return
            job.state, lowered, job.lowered = "compiling", job.lowered, None
        ok, _ = _attempt(job.key, lowered.compile)
        with self._lock:
            job.state, job.ok = "done", ok
        job.done.set()


def _attempt(key, fn) -> tuple[bool, object]:
    """``(True, fn())``, or ``(False, None)`` (logged at debug level) when it fails: the real call raises the error."""
    try:
        return True, fn()
    except Exception as e:  # noqa: BLE001 -- the real call of the step compiles it again and raises there
        logger.debug("precompiling %r failed (%s: %s); it compiles on its first call", key, type(e).__name__, e)
        return False, None
