"""The exclusive writer lock of a checkpoint directory (``.shardvi.lock``: pid, host, start time + flock)."""

from __future__ import annotations

import contextlib
import datetime
import errno
import json
import os
import tempfile
import threading
import time
import warnings

from .files import (
    _TMP_RE,
    LOCK_NAME,
    CheckpointError,
    _file_mode,
    _fsync_dir,
    _host,
    _host_tag,
    _tmp_prefix,
    check_path,
)

try:
    import fcntl
except ImportError:  # pragma: no cover - not POSIX: the lock relies on pid/host alone
    fcntl = None

__all__ = ["checkpoint_lock"]

_LOCK_WAIT = 2.0  # seconds a lock file may stay in a transient state (being created) before it is reported


def _proc_start(pid: int):
    """Start time of ``pid`` in clock ticks since boot (Linux), ``None`` if unknown. Tells pid reuse apart."""
    try:
        with open(f"/proc/{pid}/stat", "rb") as f:
            stat = f.read().decode(errors="replace")
        return int(stat[stat.rindex(")") + 2 :].split()[19])
    except (OSError, ValueError, IndexError):
        return None


def _boot_id():
    try:
        with open("/proc/sys/kernel/random/boot_id") as f:
            return f.read().strip() or None
    except OSError:
        return None


def _pid_alive(pid: int, proc_start=None, boot_id=None) -> bool:
    """Whether process ``pid`` of *this* host still runs (and is the same process: start time, boot)."""
    if boot_id is not None and _boot_id() is not None and boot_id != _boot_id():
        return False  # the machine rebooted since
    if pid <= 0:
        return False
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        pass  # exists, owned by another user
    except OSError:  # pragma: no cover - e.g. unsupported; assume alive (safe side)
        return True
    if proc_start is not None:
        now = _proc_start(pid)
        if now is not None and now != proc_start:
            return False  # the pid was reused by another process
    return True


def _flock(fd: int):
    """Non-blocking exclusive ``flock``: True (acquired), False (held by someone else), None (unsupported)."""
    if fcntl is None:  # pragma: no cover
        return None
    try:
        fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        return True
    except OSError as err:
        if err.errno in (errno.EWOULDBLOCK, errno.EAGAIN, errno.EACCES):
            return False
        return None  # e.g. ENOLCK / EOPNOTSUPP: the filesystem has no flock; pid/host decide


def _same_file(fd: int, path: str) -> bool:
    try:
        a, b = os.fstat(fd), os.stat(path)
    except OSError:
        return False
    return (a.st_dev, a.st_ino) == (b.st_dev, b.st_ino)


def _read_lock_info(fd: int):
    try:
        os.lseek(fd, 0, os.SEEK_SET)
        raw = b""
        while True:
            chunk = os.read(fd, 1 << 16)
            if not chunk:
                break
            raw += chunk
        info = json.loads(raw.decode())
    except (OSError, ValueError, RecursionError):
        return None
    if not (isinstance(info, dict) and isinstance(info.get("pid"), int) and isinstance(info.get("host"), str)):
        return None
    return info


def _describe_holder(info: dict) -> str:
    return f"pid {info['pid']} on host {info['host']!r} (since {info.get('started', '?')})"


def _lock_record() -> bytes:
    pid = os.getpid()
    return json.dumps(
        {
            "pid": pid,
            "host": _host(),
            "started": datetime.datetime.now(datetime.UTC).isoformat(timespec="seconds"),
            "proc_start": _proc_start(pid),
            "boot_id": _boot_id(),
            "program": "shardvi",
        }
    ).encode()


def _new_lock_file(directory: str):
    """A lock file at a temporary name, with our record, flock-ed by us (nobody else knows it yet)."""
    fd, tmp = tempfile.mkstemp(dir=directory, prefix=_tmp_prefix(), suffix="-" + LOCK_NAME)
    try:
        os.fchmod(fd, _file_mode())
    except BaseException:
        os.close(fd)
        os.unlink(tmp)
        raise
    _flock(fd)
    _write_record(fd, tmp)
    return fd, tmp


def _write_record(fd: int, path: str) -> None:
    """Write our owner record into the lock file ``fd`` at ``path``; on failure close and remove it."""
    try:
        os.write(fd, _lock_record())
        os.fsync(fd)
    except BaseException:
        os.close(fd)
        os.unlink(path)
        raise


class _Lock:
    def __init__(self, fd: int, path: str):
        self.fd, self.path = fd, path
        self.thread = threading.get_ident()
        self.depth = 1


_HELD: dict = {}
_HELD_GUARD = threading.Lock()


def _acquire(directory: str) -> _Lock:
    """Create ``LOCK_NAME`` exclusively (``O_CREAT | O_EXCL``) and hold an ``flock`` on it.

    An existing lock whose holder is alive (its ``flock`` is held, or its pid
    runs on this host) or lives on another host (which this host cannot check)
    is reported; one left by a dead process of this host is taken over with a
    warning.
    """
    path = os.path.join(directory, LOCK_NAME)
    deadline = time.monotonic() + _LOCK_WAIT
    while True:
        try:
            fd = os.open(path, os.O_RDWR | os.O_CREAT | os.O_EXCL, _file_mode())
        except FileExistsError:
            fd = None
        except OSError as err:
            raise CheckpointError(
                f"checkpoint_dir {directory!r}: cannot create the lock file {path!r}: {err.strerror or err}"
            ) from err
        if fd is not None:
            # a checker may hold our fresh file's flock for an instant (it sees no record yet and lets go)
            while _flock(fd) is False and time.monotonic() < deadline:
                time.sleep(0.005)
            _write_record(fd, path)
            _fsync_dir(directory)
            return _Lock(fd, path)

        try:
            fd = os.open(path, os.O_RDWR)
        except FileNotFoundError:
            continue  # released just now
        except OSError as err:
            raise CheckpointError(
                f"checkpoint_dir {directory!r}: the lock file {path!r} cannot be opened: {err.strerror or err}"
            ) from err
        got = _flock(fd)
        info = _read_lock_info(fd)
        if not _same_file(fd, path):
            os.close(fd)  # released (and maybe replaced) meanwhile: look again
            continue
        if info is None and time.monotonic() < deadline:
            os.close(fd)
            time.sleep(0.02)  # being created right now: its creator flocks it, then writes its record
            continue
        if info is None and got is not True:
            os.close(fd)
            raise CheckpointError(
                f"checkpoint_dir {directory!r} is locked by {path!r}, which holds no readable owner record"
                + (
                    " and is in use by a running process"
                    if got is False
                    else ". If no other run uses this directory, delete that file and start again"
                )
            )
        if info is None:
            # unreadable for the whole grace period although nobody holds its flock: its creator died
            # between creating and writing it
            info = {"pid": -1, "host": _host(), "started": "?"}
        same_host = info["host"] == _host()
        alive = (
            got is False
            or not same_host
            or _pid_alive(
                info["pid"],
                info.get("proc_start") if isinstance(info.get("proc_start"), int) else None,
                info.get("boot_id") if isinstance(info.get("boot_id"), str) else None,
            )
        )
        if alive:
            os.close(fd)
            if got is not False and not same_host:
                hint = (
                    f"This host cannot check whether that process still runs: if that run has ended, "
                    f"delete {path!r} and start again."
                )
            elif got is not False:
                hint = (
                    f"If pid {info['pid']} is not a shardvi run using this directory, delete {path!r} and start again."
                )
            else:
                hint = "Wait for that run to finish, or use another checkpoint_dir."
            raise CheckpointError(
                f"checkpoint_dir {directory!r} is in use by another run: {path!r} is held by "
                f"{_describe_holder(info)}. {hint}"
            )
        # stale: its process is gone (and its flock with it). We hold the old file's flock (if the filesystem
        # has flock), so no one else takes it over; replace it atomically by our own, already locked, file.
        new_fd, tmp = _new_lock_file(directory)
        try:
            os.replace(tmp, path)
        except BaseException:
            os.close(new_fd)
            with contextlib.suppress(OSError):
                os.unlink(tmp)
            raise
        finally:
            os.close(fd)
        _fsync_dir(directory)
        dead = (
            "a process that died while creating it (no owner record)"
            if info["pid"] < 0
            else f"{_describe_holder(info)}, a process that no longer runs (it crashed or was killed)"
        )
        warnings.warn(
            f"checkpoint_dir {directory!r}: took over the stale lock {path!r} of {dead}", RuntimeWarning, stacklevel=4
        )
        return _Lock(new_fd, path)


def _release(lock: _Lock) -> None:
    try:
        if _same_file(lock.fd, lock.path):
            with contextlib.suppress(FileNotFoundError):
                os.unlink(lock.path)
    finally:
        os.close(lock.fd)  # releases the flock


def _clean_stale_temporaries(directory: str) -> None:
    """Remove temporaries of dead writers on this host; never those of a live writer or another host."""
    tag = _host_tag()
    try:
        names = os.listdir(directory)
    except OSError:  # pragma: no cover
        return
    for f in names:
        m = _TMP_RE.match(f)
        if m is None or m.group(2) != tag:
            continue
        pid = int(m.group(1))
        if pid == os.getpid() or _pid_alive(pid):
            continue
        with contextlib.suppress(OSError):
            os.unlink(os.path.join(directory, f))


@contextlib.contextmanager
def checkpoint_lock(directory):
    """Hold the exclusive writer lock of ``directory`` (a context manager, re-entrant per thread).

    The lock is the file ``.shardvi.lock``, created with ``O_CREAT | O_EXCL``
    and holding JSON with the owner's pid, host and start time; the owner
    also holds an ``flock`` on it, which the kernel releases when the process
    dies. Acquiring it removes the temporaries of dead writers of this host.

    Raises
    ------
    CheckpointError
        Another live process holds the lock (the message names it), or a lock
        from another host is present (this host cannot tell whether it is
        stale: delete the file if that run has ended). A lock left by a dead
        process of this host is taken over with a ``RuntimeWarning``.
    """
    d = check_path(directory)
    key = os.path.realpath(d)
    with _HELD_GUARD:
        held = _HELD.get(key)
        if held is not None and held.thread == threading.get_ident():
            held.depth += 1
    if held is not None and held.thread == threading.get_ident():
        try:
            yield
        finally:
            with _HELD_GUARD:
                held.depth -= 1
        return
    lock = _acquire(d)
    with _HELD_GUARD:
        _HELD[key] = lock
    try:
        _clean_stale_temporaries(d)
        yield
    finally:
        with _HELD_GUARD:
            _HELD.pop(key, None)
        _release(lock)
