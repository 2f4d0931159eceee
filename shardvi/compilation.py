"""Count XLA compilations (to verify that iterations do not recompile)."""
from __future__ import annotations

import threading

from jax import monitoring

__all__ = ["CompileCounter"]

_EVENT = "/jax/core/compile/backend_compile_duration"
_lock = threading.Lock()
_count = 0
_registered = False


def _listener(name, duration, **kwargs):
    global _count
    if name == _EVENT:
        with _lock:
            _count += 1


def _ensure_registered():
    global _registered
    with _lock:
        if not _registered:
            monitoring.register_event_duration_secs_listener(_listener)
            _registered = True


class CompileCounter:
    """Context manager counting XLA backend compilations in this process.

    >>> with CompileCounter() as cc:
    ...     f(x)
    >>> cc.count
    """

    def __init__(self):
        _ensure_registered()
        self._start = None
        self._end = None

    def __enter__(self):
        self._start = _count
        self._end = None
        return self

    def __exit__(self, *exc):
        self._end = _count
        return False

    @property
    def count(self) -> int:
        """Compilations since entering (so far, or until exit)."""
        end = _count if self._end is None else self._end
        return end - self._start
