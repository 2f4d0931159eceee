"""Hand freed host memory back to the system between the engine's steps (glibc only).

XLA:CPU keeps a program's arrays in ``malloc``-ed buffers. glibc serves a request
of at least its *mmap threshold* with a mapping of its own, returned to the
system when freed, and smaller ones from its heaps, whose freed pages it keeps.
The threshold starts at 128 KiB but rises to the size of every mapped block
freed, up to 32 MiB: after the first steps, buffers of a few MiB (a
device's slab of a field split over 4 processes, 8 MiB at 2048², and their
complex transforms) come from the heaps, and their freed pages stay resident
while the next step allocates others beside them; so do the pages that
compiling a program freed. Every process of a field split then holds more
than its share (measured in BENCHMARKS.md, section "Opt-in process settings").

:func:`keep_host_memory_low` fixes the threshold at :data:`MMAP_THRESHOLD` (requests of
1 MiB and more get their own mapping), :func:`cap_heaps` lets the threads share at most
:data:`MAX_HEAPS` heaps, and :func:`release_host_memory` returns the heaps' free pages
(``malloc_trim``) when the resident set grew since it last did. None of them changes a
result: they decide where buffers live, not what is computed. They act on the whole
process's allocator, so shardvi calls them only when asked: ``optimize_kl(...,
trim_host_memory=True)`` (the threshold and the cap when the optimizer is built, a trim
before each stage and after the call that compiled a step) and
``initialize_distributed(..., cap_heaps=True)`` (the cap before JAX starts its threads).
On a C library without these calls (not glibc) they do nothing.
"""

from __future__ import annotations

import ctypes
import ctypes.util
import functools
import os

__all__ = [
    "MAX_HEAPS",
    "MMAP_THRESHOLD",
    "TRIM_AFTER_GROWTH",
    "cap_heaps",
    "keep_host_memory_low",
    "release_host_memory",
]

#: bytes: requests of at least this size are mapped on their own (freed: returned to the system)
MMAP_THRESHOLD = 1 << 20
_M_MMAP_THRESHOLD = -3  # glibc's mallopt parameter number (malloc.h)


@functools.cache
def _glibc():
    """The C library when it has glibc's ``mallopt`` and ``malloc_trim``, else ``None``."""
    name = ctypes.util.find_library("c")
    try:
        libc = ctypes.CDLL(name)
        libc.mallopt.argtypes, libc.mallopt.restype = (ctypes.c_int, ctypes.c_int), ctypes.c_int
        libc.malloc_trim.argtypes, libc.malloc_trim.restype = (ctypes.c_size_t,), ctypes.c_int
    except (OSError, AttributeError, TypeError):
        return None
    return libc


def _enabled() -> bool:
    return _glibc() is not None


@functools.cache
def keep_host_memory_low() -> bool:
    """Fix glibc's mmap threshold at :data:`MMAP_THRESHOLD` and cap its heaps (:func:`cap_heaps`), once per
    process; ``True`` if the threshold was set."""
    if not _enabled():
        return False
    cap_heaps()
    return bool(_glibc().mallopt(_M_MMAP_THRESHOLD, MMAP_THRESHOLD))  # pyright: ignore[reportOptionalMemberAccess]


#: glibc heaps ("arenas") that the threads of a process may create at most (:func:`cap_heaps`)
MAX_HEAPS = 2
_M_ARENA_MAX = -8  # glibc's mallopt parameter number (malloc.h)


@functools.cache
def cap_heaps() -> bool:
    """Let the threads of this process create at most :data:`MAX_HEAPS` glibc heaps (once per process).

    glibc gives a thread that finds the heaps in use a heap of its own, up to 8 per core; each keeps
    the pages freed in it. XLA runs a program on a thread pool and compiles on others, so a process
    ends up with many heaps that each hold freed pages (the effect on a field split over processes:
    BENCHMARKS.md, section "Opt-in process settings"). It acts on heaps created after the call: call
    it before JAX starts its runtime (``initialize_distributed(..., cap_heaps=True)`` does) for the
    whole effect. The same as the environment variable ``MALLOC_ARENA_MAX=2``. ``True`` if the cap
    was set.
    """
    if not _enabled():
        return False
    return bool(_glibc().mallopt(_M_ARENA_MAX, MAX_HEAPS))  # pyright: ignore[reportOptionalMemberAccess]


#: bytes: :func:`release_host_memory` trims only after the resident set grew this much since it last did
TRIM_AFTER_GROWTH = 4 << 20

_after_last_trim = [0]  # resident bytes right after the last trim (0: none yet)


def _resident_bytes() -> int:
    """The resident set size (``/proc/self/statm``; 0 where unavailable): read in microseconds."""
    try:
        with open("/proc/self/statm") as f:
            return int(f.read().split()[1]) * os.sysconf("SC_PAGE_SIZE")
    except (OSError, ValueError, IndexError):
        return 0


def release_host_memory(force: bool = False) -> None:
    """Return the free pages of glibc's heaps to the system (``malloc_trim(0)``); nothing elsewhere.

    ``malloc_trim`` walks every heap (its cost: BENCHMARKS.md, "Opt-in process settings"). Unless
    ``force``, it runs only when the resident set grew by :data:`TRIM_AFTER_GROWTH` since the last
    trim (or is not known): a process whose resident set did not grow holds no more freed pages than
    the trim left.
    """
    if not _enabled():
        return
    rss = _resident_bytes()
    if force or not rss or not _after_last_trim[0] or rss >= _after_last_trim[0] + TRIM_AFTER_GROWTH:
        _glibc().malloc_trim(0)  # pyright: ignore[reportOptionalMemberAccess]
        _after_last_trim[0] = _resident_bytes()
