"""Compile engine steps ahead of their first call, in a background thread, while earlier steps run.

The engine's steps are compiled on their first call (per configuration and
sample count), and compiling a step takes seconds, longer than running it on a
small problem. Most of that time the other steps could be compiled too: the
KL minimization of an iteration while its samples are drawn, the geoVI update
of a later iteration while the linear ones run. :class:`Precompiler` does
that: a step is *submitted* with a thunk that lowers and compiles it with
stand-in arguments of the shapes, dtypes and placements of its real call
(``step.lower(*args).compile()``); JAX keeps the executable in the step's own
cache, so the real call compiles nothing. Before the real call the caller
*claims* the step: a compilation that has started is waited for, one that has
not is cancelled (the caller compiles it now, in parallel with what the
thread is doing).

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


class Precompiler:
    """Compile submitted steps in one background thread; :meth:`claim` each before its real call.

    Parameters
    ----------
    enabled : bool
        ``False``: :meth:`submit` does nothing (every step compiles on its
        first call, in the calling thread).

    Notes
    -----
    One worker thread, started on the first submission and kept for the life of
    the object (an idle worker costs nothing). A step is submitted at most
    once: later submissions of a submitted or claimed key are ignored. At
    interpreter exit the compilations that have not started are dropped, so a
    script that stops before its last iteration waits at most for the one
    compilation that is running.
    """

    def __init__(self, enabled: bool = True):
        self.enabled = bool(enabled)
        self._futures: dict[Hashable, concurrent.futures.Future] = {}
        self._known: set = set()  # keys ever submitted or claimed
        self._executor: concurrent.futures.ThreadPoolExecutor | None = None
        self._lock = threading.Lock()

    def submit(self, key: Hashable, thunk: Callable[[], object]) -> None:
        """Compile ``thunk()`` (``lower(...).compile()`` of step ``key``) in the background, once per key."""
        if not self.enabled:
            return
        with self._lock:
            if key in self._known:
                return
            self._known.add(key)
            if self._executor is None:
                self._executor = concurrent.futures.ThreadPoolExecutor(1, thread_name_prefix="shardvi-precompile")
                _LIVE.add(self)
            self._futures[key] = self._executor.submit(_run, key, thunk)

    def ready(self, key: Hashable) -> bool:
        """Whether step ``key`` was compiled in the background (successfully, and not claimed yet)."""
        with self._lock:
            f = self._futures.get(key)
        return f is not None and f.done() and not f.cancelled() and f.result()

    def claim(self, key: Hashable) -> None:
        """Before the real call of step ``key``: wait for its compilation, or cancel it if it has not started."""
        with self._lock:
            self._known.add(key)
            f = self._futures.pop(key, None)
        if f is not None and not f.cancel():
            f.result()  # never raises: _run catches the step's errors

    def cancel_pending(self) -> None:
        """Cancel the submitted compilations that have not started (e.g. the run stopped); forget them."""
        with self._lock:
            futures, self._futures = self._futures, {}
            for key, f in futures.items():
                if f.cancel():
                    self._known.discard(key)

    def join(self) -> None:
        """Wait until the submitted compilations have finished (they stay unclaimed)."""
        with self._lock:
            futures = list(self._futures.values())
        concurrent.futures.wait(futures)

    def pending(self) -> tuple:
        """The keys submitted and not claimed yet."""
        with self._lock:
            return tuple(self._futures)


def _run(key, thunk) -> bool:
    """Compile one step; ``False`` (logged at debug level) when it fails: the real call raises the error."""
    try:
        thunk()
    except Exception as e:  # noqa: BLE001 -- the real call of the step compiles it again and raises there
        logger.debug("precompiling %r failed (%s: %s); it compiles on its first call", key, type(e).__name__, e)
        return False
    return True
