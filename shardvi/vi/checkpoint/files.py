"""Checkpoint files: names, paths, atomic writes with the umask's permissions, the directory check."""

from __future__ import annotations

import contextlib
import hashlib
import os
import re
import socket
import tempfile

import jax
import numpy as np
from jax import tree_util as jtu

from ...exceptions import ShardviError

__all__ = ["CheckpointError", "FORMAT", "LOCK_NAME", "check_path", "prepare_checkpoint_dir"]

FORMAT = "shardvi-checkpoint-v2"
_LEGACY_FORMATS = ("shardvi-checkpoint-v1",)  # no `files`, no `fingerprint`: loaded, not fingerprint-checked
_INDEX = "latest.json"
LOCK_NAME = ".shardvi.lock"
_NPZ_RE = re.compile(r"state-[0-9]{6,}\.npz")
_TMP_RE = re.compile(r"\.tmp-([0-9]+)-([0-9a-f]{8})-")


class CheckpointError(ShardviError, ValueError):
    """A checkpoint is missing, corrupted, locked, or belongs to a different run,
    or ``checkpoint_dir`` cannot be used."""


def _umask() -> int:
    """The process umask (read from ``/proc`` where possible: ``os.umask`` has to set it to read it)."""
    try:
        with open("/proc/self/status") as f:
            for line in f:
                if line.startswith("Umask:"):
                    return int(line.split()[1], 8)
    except (OSError, ValueError, IndexError):
        pass
    old = os.umask(0o022)
    os.umask(old)
    return old


def _file_mode() -> int:
    """Permissions of a file created by ``open()`` under the current umask."""
    return 0o666 & ~_umask()


def _host() -> str:
    return socket.gethostname()


def _host_tag(host=None) -> str:
    return hashlib.sha256((host or _host()).encode()).hexdigest()[:8]


def _tmp_prefix() -> str:
    """Temporaries carry their writer's pid and host, so a writer only ever removes its own or dead ones."""
    return f".tmp-{os.getpid()}-{_host_tag()}-"


def _fsync_dir(d: str) -> None:
    try:
        dfd = os.open(d, os.O_RDONLY)
    except OSError:  # pragma: no cover - platforms without directory fds
        return
    try:
        os.fsync(dfd)
    except OSError:  # pragma: no cover - some filesystems refuse fsync on directories
        pass
    finally:
        os.close(dfd)


def _atomic_write(path: str, write) -> None:
    """Write via a temporary: write, flush, fsync, umask permissions, rename, fsync the directory."""
    d = os.path.dirname(path) or "."
    fd, tmp = tempfile.mkstemp(dir=d, prefix=_tmp_prefix(), suffix="-" + os.path.basename(path))
    try:
        with os.fdopen(fd, "wb") as f:
            write(f)
            f.flush()
            os.fchmod(f.fileno(), _file_mode())  # mkstemp creates 0600
            os.fsync(f.fileno())
        os.replace(tmp, path)
    except BaseException:
        with contextlib.suppress(FileNotFoundError):
            os.unlink(tmp)
        raise
    _fsync_dir(d)


def _sha256(path: str) -> str:
    h = hashlib.sha256()
    with open(path, "rb") as f:
        for chunk in iter(lambda: f.read(1 << 20), b""):
            h.update(chunk)
    return h.hexdigest()


def _on_host(x) -> np.ndarray:
    """``x`` as a NumPy array; an array split over processes (a field split's rows) gathered from all of them."""
    if isinstance(x, jax.Array) and not x.is_fully_addressable:
        from jax.experimental import multihost_utils

        return np.asarray(multihost_utils.process_allgather(x, tiled=True))
    return np.asarray(x)


def _structure(pos) -> dict:
    leaves_p = jtu.tree_flatten_with_path(pos)[0]
    return {
        "treedef": str(jtu.tree_structure(pos)),
        "leaves": [
            [jtu.keystr(p), list(np.shape(x)), str(np.dtype(x.dtype) if hasattr(x, "dtype") else np.asarray(x).dtype)]
            for p, x in leaves_p
        ],
    }


def check_path(directory, argname: str = "checkpoint_dir") -> str:
    """``directory`` as a ``str``: ``TypeError`` unless a path, ``ValueError`` if empty."""
    if isinstance(directory, bool) or not isinstance(directory, (str, bytes, os.PathLike)):
        raise TypeError(f"{argname} must be a path (str or os.PathLike), got {type(directory).__name__}")
    path = os.fsdecode(os.fspath(directory))
    if not path:
        raise ValueError(f"{argname} must be a non-empty path, got {directory!r}")
    return path


def prepare_checkpoint_dir(checkpoint_dir) -> str:
    """Create ``checkpoint_dir`` if needed and check that checkpoints can be written there.

    Run before iteration 0, so that an unusable directory costs no compute:
    the directory is created, and a probe file is created, written, fsynced
    and removed.

    Returns
    -------
    str
        The directory as a ``str``.

    Raises
    ------
    TypeError
        ``checkpoint_dir`` is not a path.
    ValueError
        ``checkpoint_dir`` is empty.
    CheckpointError
        It cannot be created (a file is in the way, no permission), is not a
        writable directory, or holds a directory where ``latest.json`` or the
        lock file should be.
    """
    d = check_path(checkpoint_dir)
    try:
        os.makedirs(d, exist_ok=True)
    except FileExistsError:
        raise CheckpointError(f"checkpoint_dir {d!r} exists and is not a directory") from None
    except OSError as err:
        raise CheckpointError(f"checkpoint_dir {d!r} cannot be created: {err.strerror or err}") from err
    if not os.path.isdir(d):
        raise CheckpointError(f"checkpoint_dir {d!r} exists and is not a directory")
    for name in (_INDEX, LOCK_NAME):
        p = os.path.join(d, name)
        if os.path.lexists(p) and not os.path.isfile(p):
            raise CheckpointError(
                f"checkpoint_dir {d!r}: {name!r} there is not a regular file (a directory?); move it away"
            )
    try:
        fd, probe = tempfile.mkstemp(dir=d, prefix=_tmp_prefix(), suffix="-probe")
        try:
            os.write(fd, b"shardvi write probe\n")
            os.fsync(fd)
        finally:
            os.close(fd)
            os.unlink(probe)
    except OSError as err:
        raise CheckpointError(f"checkpoint_dir {d!r} is not writable: {err.strerror or err}") from err
    return d
