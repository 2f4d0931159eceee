"""Count XLA compilations (to verify that iterations do not recompile) and time them.

>>> from shardvi.compilation import CompileCounter
>>> with CompileCounter() as cc:
...     f(x)
>>> cc.count, cc.seconds, cc.cache_hits

The counter is a :mod:`jax.monitoring` listener of the
``/jax/core/compile/backend_compile_duration`` event (one per program JAX
builds, compiled by XLA or loaded from the persistent compilation cache, see
:mod:`shardvi.compile_cache`) and of ``/jax/compilation_cache/cache_hits``. It is registered when the
counter is created and unregistered by :meth:`CompileCounter.close` (or on
leaving the ``with`` block): a closed counter keeps its numbers and stops
counting, and no listener is left behind. Counters are independent and may nest.
"""

from __future__ import annotations

import threading
from typing import Self

from jax import monitoring

__all__ = ["CACHE_HIT_EVENT", "COMPILE_EVENT", "TRACE_LOWER_EVENTS", "CompileCounter"]

COMPILE_EVENT = "/jax/core/compile/backend_compile_duration"
"""The :mod:`jax.monitoring` event of one program built by the backend (an XLA compilation or a cache load)."""

CACHE_HIT_EVENT = "/jax/compilation_cache/cache_hits"
"""The :mod:`jax.monitoring` event of a program loaded from the persistent compilation cache (recorded on the
thread that builds it, before that build's :data:`COMPILE_EVENT`)."""

TRACE_LOWER_EVENTS = ("/jax/core/compile/jaxpr_trace_duration", "/jax/core/compile/jaxpr_to_mlir_module_duration")
"""The :mod:`jax.monitoring` events of tracing to a jaxpr and lowering it to MLIR."""


class CompileCounter:
    """Count XLA backend compilations in this process, from creation until :meth:`close`.

    Usable as a context manager (closed on exit) or directly (``cc =
    CompileCounter()``, ..., ``cc.close()``). Thread-safe.

    Attributes
    ----------
    count : int
        Number of programs built so far (or until closed): XLA compilations and
        loads from the persistent compilation cache. No new program means no
        recompilation.
    seconds : float
        Their total duration in seconds.
    cache_hits : int
        How many of them were loaded from the persistent compilation cache.
    cache_seconds : float
        The seconds of those loads (included in ``seconds``).
    trace_lower_seconds : float
        Seconds spent tracing jaxprs and lowering them to MLIR. A function traced
        inside another jitted function is counted in both.
    """

    def __init__(self):
        self.count = 0
        self.seconds = 0.0
        self.cache_hits = 0
        self.cache_seconds = 0.0
        self.trace_lower_seconds = 0.0
        self._lock = threading.Lock()
        self._hit = threading.local()  # a cache hit announced on this thread, for its next COMPILE_EVENT
        # bound methods, stored once: registered and unregistered by identity
        self._callback, self._event_callback = self._listener, self._event_listener
        self._active = True
        monitoring.register_event_duration_secs_listener(self._callback)
        monitoring.register_event_listener(self._event_callback)

    def _event_listener(self, event, **kwargs):
        if event == CACHE_HIT_EVENT:
            self._hit.pending = True

    def _listener(self, event, duration_secs, **kwargs):
        if event == COMPILE_EVENT:
            hit = getattr(self._hit, "pending", False)
            self._hit.pending = False
            with self._lock:
                self.count += 1
                self.seconds += duration_secs
                if hit:
                    self.cache_hits += 1
                    self.cache_seconds += duration_secs
        elif event in TRACE_LOWER_EVENTS:
            with self._lock:
                self.trace_lower_seconds += duration_secs

    @property
    def compiled(self) -> int:
        """Programs XLA compiled (``count`` less the cache loads)."""
        return self.count - self.cache_hits

    @property
    def active(self) -> bool:
        """Whether the listener is registered (``False`` after :meth:`close`)."""
        return self._active

    def close(self) -> None:
        """Unregister the listener; the numbers stay. Idempotent."""
        with self._lock:
            if not self._active:
                return
            self._active = False
        try:
            monitoring.unregister_event_duration_listener(self._callback)
        except (AssertionError, ValueError):  # already dropped by ``jax.monitoring.clear_event_listeners()``
            pass
        try:
            monitoring.unregister_event_listener(self._event_callback)
        except (AssertionError, ValueError):
            pass

    def snapshot(self) -> dict:
        """The numbers now: ``{"n": count, "s": seconds, "hits": cache_hits, "trace_lower_s": trace_lower_seconds}``.

        (The keys of the benchmark records in ``benchmarks/``.)
        """
        with self._lock:
            return {
                "n": self.count,
                "s": self.seconds,
                "hits": self.cache_hits,
                "trace_lower_s": self.trace_lower_seconds,
            }

    def __enter__(self) -> Self:
        return self

    def __exit__(self, *exc) -> bool:
        self.close()
        return False

    def __repr__(self) -> str:
        return (
            f"CompileCounter(count={self.count}, seconds={self.seconds:.3f}, cache_hits={self.cache_hits}, "
            f"trace_lower_seconds={self.trace_lower_seconds:.3f}, active={self._active})"
        )
