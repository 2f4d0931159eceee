"""Opt-in persistent compilation cache: a second run of the same problem compiles nothing.

>>> samples, state = sv.optimize_kl(..., compilation_cache_dir="~/.cache/shardvi-xla")

or around any code (e.g. :class:`~shardvi.OptimizeVI`):

>>> with sv.compile_cache.persistent_compilation_cache("~/.cache/shardvi-xla"):
...     samples, state = opt.run(samples, state)

This is JAX's persistent compilation cache (``jax_compilation_cache_dir``),
switched on for the duration of the block only: every program XLA compiles
inside it is stored in the directory under a key of its HLO, compile options,
devices and jax/XLA version, and a later run that compiles the same program
(same shapes, configs, strategy and devices; the data may differ, as they are
arguments of the engine's programs) loads the executable instead of compiling
it. A loaded executable is the one XLA compiled, so results are bitwise those
of a run without the cache. On leaving the block, JAX's own cache settings are
restored (a cache configured by the user stays in effect outside the block).

The directory is trusted code: anyone who can write to it can make this
process run arbitrary code (JAX's warning). It is shared by every program
compiled in the block, including a user's callback; JAX manages its files
(one file per program plus an access-time file); shardvi never deletes any.
"""

from __future__ import annotations

import contextlib
import os

import jax

__all__ = ["check_cache_dir", "persistent_compilation_cache"]

# jax.config options the block sets (and restores): directory, cache everything (the engine's small helper
# programs too, so that a cached run compiles nothing), cache enabled
_OPTIONS = (
    ("jax_compilation_cache_dir", None),
    ("jax_persistent_cache_min_compile_time_secs", 0.0),
    ("jax_persistent_cache_min_entry_size_bytes", 0),
    ("jax_enable_compilation_cache", True),
)


def check_cache_dir(path, argname: str = "compilation_cache_dir") -> str:
    """Validate and create a cache directory; return it as an absolute path (``~`` expanded).

    Raises
    ------
    TypeError
        ``path`` is not a ``str`` / ``os.PathLike``.
    ValueError
        ``path`` is empty, names a file, or cannot be created or written to.
    """
    if isinstance(path, bytes) or not isinstance(path, (str, os.PathLike)):
        raise TypeError(f"{argname} must be a str or os.PathLike directory path, got {type(path).__name__}")
    path = os.fspath(path)
    if not path:
        raise ValueError(f"{argname} must be a non-empty directory path, got ''")
    path = os.path.abspath(os.path.expanduser(path))
    if os.path.exists(path) and not os.path.isdir(path):
        raise ValueError(f"{argname} {path!r} exists and is not a directory")
    try:
        os.makedirs(path, exist_ok=True)
    except OSError as err:
        raise ValueError(f"{argname} {path!r} cannot be created: {err.strerror or err}") from None
    if not os.access(path, os.W_OK | os.X_OK):
        raise ValueError(f"{argname} {path!r} is not writable")
    return path


def _reset_jax_cache() -> None:
    """Make JAX (re)open its persistent cache at the configured directory on the next compilation."""
    from jax.experimental.compilation_cache import compilation_cache as cc

    cc.reset_cache()


@contextlib.contextmanager
def persistent_compilation_cache(path, argname: str = "compilation_cache_dir"):
    """Use ``path`` as JAX's persistent compilation cache inside the ``with`` block.

    Parameters
    ----------
    path : str or os.PathLike
        Directory (created if missing) shared between runs; see the module docstring.
    argname : str
        Name used in error messages.

    Yields
    ------
    str
        The absolute cache directory.
    """
    path = check_cache_dir(path, argname)
    previous = {name: getattr(jax.config, name) for name, _ in _OPTIONS}
    wanted = {name: (path if value is None else value) for name, value in _OPTIONS}
    if previous == wanted:  # already this cache, configured by the caller: nothing to switch
        yield path
        return
    for name, value in wanted.items():
        jax.config.update(name, value)
    _reset_jax_cache()
    try:
        yield path
    finally:
        for name, value in previous.items():
            jax.config.update(name, value)
        _reset_jax_cache()
