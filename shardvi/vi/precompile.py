"""Compile engine steps ahead of their first call, in the background, while earlier steps run.

The engine's steps are compiled on their first call (per configuration and
sample count), and compiling a step takes seconds, longer than running it on a
small problem. Most of that time the other steps could be compiled too: the
KL minimization of an iteration while its samples are drawn, the geoVI update
of a later iteration while the linear ones run. :class:`Precompiler` does
that: a step is *submitted* with a thunk that lowers it with stand-in
arguments of the shapes, dtypes and placements of its real call
(``step.lower(*args)``), and the lowered step is then compiled; JAX keeps
the executable in the step's own cache, so the real call compiles nothing.
Lowering (tracing in Python) and compiling (XLA) run in two threads, a
pipeline: the next step is traced while the previous one compiles. Before the
real call the caller *claims* the step: a step that is being lowered or
compiled is waited for, a lowered one that waits for the compile thread is
compiled by the caller, and one not lowered yet is cancelled (the call
compiles it); either way in parallel with what the threads are doing.

The result is the same program, bitwise: the same lowering with the same
compiler options. A precompilation that fails is dropped: the real call
traces and compiles the step again and raises the error there, at the step
and iteration it belongs to. A stand-in whose placement differs from the real
call's only costs time (the real call compiles its own program).
"""

from __future__ import annotations

import concurrent.futures
import concurrent.futures.thread  # registers its exit hook now, before ours (hooks run in reverse order)
import logging
import threading
import weakref
from collections.abc import Callable, Hashable
from typing import Any

__all__ = ["Precompiler"]

logger = logging.getLogger("shardvi.vi")

_LIVE: weakref.WeakSet = weakref.WeakSet()  # precompilers that may hold submitted compilations


def _cancel_all_at_exit() -> None:
    """At interpreter exit, drop the compilations that have not started (only a running one is waited for)."""
    for pc in list(_LIVE):
        pc.cancel_pending()


# runs before concurrent.futures joins its worker threads (which would first run every queued compilation)
_register_atexit = getattr(threading, "_register_atexit", None)
if _register_atexit is not None:
    _register_atexit(_cancel_all_at_exit)


class _Job:
    """One submitted step: ``thunk`` lowers it; the compile stage compiles what it returned."""

    __slots__ = ("key", "thunk", "lowered", "state", "ok", "done", "lowering_done", "epoch")

    def __init__(self, key: Hashable, thunk: Callable[[], object] | None, epoch: int):
        self.key, self.thunk, self.epoch = key, thunk, epoch
        self.lowered: Any = None  # what the thunk returned (a ``jax.stages.Lowered``), until compiled
        self.state = "queued"  # -> "lowering" -> "to-compile" -> "compiling" -> "done"; or "cancelled"
        self.ok = False
        self.done = threading.Event()
        self.lowering_done = threading.Event()  # the thunk has returned (or the job never reached it)


class Precompiler:
    """Lower and compile submitted steps in the background; :meth:`claim` each before its real call.

    Parameters
    ----------
    enabled : bool
        ``False``: :meth:`submit` does nothing (every step compiles on its
        first call, in the calling thread).

    Notes
    -----
    Two worker threads, a pipeline: one runs the submitted thunks (tracing and
    lowering, Python), the other compiles what they return (XLA, which releases
    the GIL), so the next step is traced while the previous one compiles, and
    only one XLA compilation runs in the background at a time. A thunk that
    returns an object without ``compile`` (e.g. an executable) is done when it
    returns. The threads start on the first submission and are kept for the
    life of the object (idle workers cost nothing). A step is submitted at
    most once: later submissions of a submitted or claimed key are ignored. At
    interpreter exit the steps that have not started a stage are dropped, so a
    script that stops before its last iteration waits at most for the stages
    that are running.
    """

    def __init__(self, enabled: bool = True):
        self.enabled = bool(enabled)
        self._jobs: dict[Hashable, _Job] = {}
        self._known: set = set()  # keys ever submitted or claimed
        self._lowerer: concurrent.futures.ThreadPoolExecutor | None = None
        self._compiler: concurrent.futures.ThreadPoolExecutor | None = None
        self._lock = threading.Lock()
        self._epoch = 0  # counts cancel_pending calls: a step lowered across one is dropped

    def submit(self, key: Hashable, thunk: Callable[[], object]) -> None:
        """Run ``thunk()`` (``lower(...)`` of step ``key``) and compile its result in the background, once per key."""
        if not self.enabled:
            return
        with self._lock:
            if key in self._known:
                return
            self._known.add(key)
            if self._lowerer is None:
                self._lowerer = concurrent.futures.ThreadPoolExecutor(1, thread_name_prefix="shardvi-precompile-lower")
                self._compiler = concurrent.futures.ThreadPoolExecutor(1, thread_name_prefix="shardvi-precompile")
                _LIVE.add(self)
            job = self._jobs[key] = _Job(key, thunk, self._epoch)
            self._lowerer.submit(self._lower, job)

    def ready(self, key: Hashable) -> bool:
        """Whether step ``key`` was compiled in the background (successfully, and not claimed yet)."""
        with self._lock:
            job = self._jobs.get(key)
        return job is not None and job.done.is_set() and job.ok

    def claim(self, key: Hashable) -> None:
        """Before the real call of step ``key``: make sure it is compiled, or leave it to the call.

        A step being compiled in the background is waited for; one lowered and waiting for the
        compile thread is compiled now, in the calling thread (in parallel with the background
        compilation), also when its lowering was under way at the claim (its end is waited for);
        one not lowered yet is cancelled (the call compiles it).
        """
        with self._lock:
            self._known.add(key)
            job = self._jobs.get(key)
        if job is not None and job.state == "lowering":
            job.lowering_done.wait()
        with self._lock:
            job = self._jobs.pop(key, None)
            if job is None:
                return
            lowered = job.lowered if job.state == "to-compile" else None
            if lowered is not None:
                job.state, job.lowered = "compiling", None
            elif self._cancel(job):
                return
        if lowered is None:
            job.done.wait()  # never raises: the stages catch the step's errors
            return
        logger.debug("compiling %r in the calling thread (lowered in the background)", key)
        ok = _attempt(key, lowered.compile)[0]
        with self._lock:
            job.state, job.ok = "done", ok
        job.done.set()

    def cancel_pending(self) -> None:
        """Cancel the submitted steps that wait for a stage (e.g. the run stopped); forget all submitted steps.

        A step being compiled finishes (its executable lands in the step's cache); one being
        lowered is not compiled after that.
        """
        with self._lock:
            self._epoch += 1
            jobs, self._jobs = self._jobs, {}
            for key, job in jobs.items():
                if self._cancel(job):
                    self._known.discard(key)

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

    # -- the two stages (worker threads) --------------------------------------------------------
    @staticmethod
    def _cancel(job: _Job) -> bool:
        """(lock held) Cancel ``job`` if it waits for a stage (its thunk's result is dropped); whether it did."""
        if job.state not in ("queued", "to-compile"):
            return job.state == "cancelled"
        job.state, job.lowered = "cancelled", None
        job.lowering_done.set()
        job.done.set()
        return True

    def _lower(self, job: _Job) -> None:
        with self._lock:
            if job.state != "queued":
                return
            job.state = "lowering"
        try:
            self._lowered(job, *_attempt(job.key, job.thunk))
        finally:
            job.lowering_done.set()

    def _lowered(self, job: _Job, ok: bool, lowered) -> None:
        """(lowering stage) Hand the thunk's result to the compile stage, or finish the job."""
        job.thunk = None
        with self._lock:
            if job.epoch != self._epoch:  # cancel_pending ran while it was lowered
                job.state = "to-compile"
                self._cancel(job)
                self._known.discard(job.key)
                return
            if not ok or not hasattr(lowered, "compile"):
                job.state, job.ok = "done", ok
                job.done.set()
                return
            job.state, job.lowered = "to-compile", lowered
            assert self._compiler is not None
            self._compiler.submit(self._compile, job)

    def _compile(self, job: _Job) -> None:
        with self._lock:
            if job.state != "to-compile":
                return
            job.state, lowered, job.lowered = "compiling", job.lowered, None
        assert lowered is not None
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
