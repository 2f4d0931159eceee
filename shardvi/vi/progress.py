"""Progress display of the MGVI / geoVI driver.

``optimize_kl(..., progress=...)`` (and :class:`~shardvi.OptimizeVI`) takes

``"auto"`` (default) or ``True``
    A live bar when standard error is a terminal, otherwise one summary line
    per global iteration on standard error.
``"bar"``
    The live bar (``tqdm``) on standard error, terminal or not: global
    iterations done, elapsed time, ETA and the stage now running
    (``compiling + MGVI sampling``, ``geoVI update``, ``KL minimization``,
    ``writing checkpoint``), each shown when it starts; the summary line of
    every finished iteration is printed above the bar.
``"lines"``
    One summary line per finished iteration on standard error (KL, solver
    iteration counts, reduced chi^2, wall time), nothing else.
``False``, ``None`` or ``"off"``
    Nothing is printed.
a :class:`Progress` instance
    Custom display: its methods are called at the start of every iteration and
    stage and at the end of every iteration.

Logging is not affected by any of these: the same summary line always goes to
the ``logging`` logger ``"shardvi"`` at level INFO
(``logging.basicConfig(level=logging.INFO)`` shows it). A display does not
repeat the line where that logger already prints it to the console (standard
error or output), so it appears once.

A stage is labelled ``compiling + ...`` the first time it runs with a given
sample count and solver configuration: that is when JAX compiles it (later
iterations with the same count and configuration reuse the compiled program).
``tqdm`` is imported only when a bar is shown.
"""

from __future__ import annotations

import contextlib
import logging
import os
import sys
import threading
from typing import TextIO

__all__ = [
    "PROGRESS_MODES",
    "Progress",
    "LineProgress",
    "BarProgress",
    "check_progress",
    "open_display",
    "logged_to_console",
]

PROGRESS_MODES = ("auto", "bar", "lines", "off")


class Progress:
    """Progress display interface; this base class shows nothing (``progress=False``).

    Subclass it for a custom display and pass an instance as ``progress``. The
    driver calls, for each global iteration ``nit`` (0-based) of
    ``n_total_iterations``: :meth:`start_iteration`, then :meth:`stage` when
    each stage starts, then :meth:`end_iteration` with the summary line; and
    :meth:`close` once at the end of :meth:`OptimizeVI.run` (also after an
    error).
    """

    def start_iteration(self, nit: int, total: int) -> None:
        """Global iteration ``nit`` (0-based) of ``total`` starts."""

    def stage(self, name: str, compiling: bool) -> None:
        """Stage ``name`` starts; ``compiling``: JAX compiles it on this call."""

    def end_iteration(self, nit: int, total: int, line: str) -> None:
        """Global iteration ``nit`` finished; ``line`` is its one-line summary."""

    def close(self) -> None:
        """The run ended (normally or by an exception)."""


def logged_to_console(logger_name: str = "shardvi") -> bool:
    """Whether an INFO record of ``logger_name`` reaches a handler that writes to stderr or stdout."""
    logger = logging.getLogger(logger_name)
    if not logger.isEnabledFor(logging.INFO):
        return False
    consoles = {id(s) for s in (sys.stderr, sys.stdout, sys.__stderr__, sys.__stdout__) if s is not None}
    node = logger
    while node is not None:
        for h in node.handlers:
            if (
                isinstance(h, logging.StreamHandler)
                and h.level <= logging.INFO
                and id(getattr(h, "stream", None)) in consoles
            ):
                return True
        node = node.parent if node.propagate else None
    return False


def stage_label(name: str, compiling: bool) -> str:
    """``"compiling + NAME"`` on a compiling call, else ``NAME``."""
    return f"compiling + {name}" if compiling else name


class LineProgress(Progress):
    """One summary line per finished iteration, written to ``stream`` (default: ``sys.stderr`` at each write).

    Skipped where logging already prints the line to the console (:func:`logged_to_console`).
    """

    def __init__(self, stream: TextIO | None = None):
        self._stream = stream

    def end_iteration(self, nit: int, total: int, line: str) -> None:
        if not logged_to_console():
            stream = self._stream if self._stream is not None else sys.stderr
            print(line, file=stream, flush=True)


class BarProgress(Progress):
    """A ``tqdm`` bar over global iterations, labelled with the running stage.

    The bar is created at the first iteration (a run with nothing left to do
    prints nothing). While it is open a daemon thread refreshes it every
    ``refresh_s`` seconds, so the elapsed time keeps counting during a long
    compilation or solve, and the root logger's console handlers write through
    ``tqdm.write`` (log lines appear above the bar instead of breaking it).
    """

    def __init__(self, stream: TextIO | None = None, refresh_s: float = 1.0, leave: bool = True):
        self._stream = stream if stream is not None else sys.stderr
        self._refresh_s = float(refresh_s)
        self._leave = bool(leave)
        self._bar = None
        self._nit = 0
        self._total = 0
        self._stop = threading.Event()
        self._ticker = None
        self._redirect = contextlib.ExitStack()

    def _open(self, nit: int, total: int):
        from tqdm import tqdm  # imported only when a bar is shown
        from tqdm.contrib.logging import logging_redirect_tqdm

        self._redirect.enter_context(logging_redirect_tqdm())
        # tqdm draws nothing on a terminal that reports 0 columns or rows (some pseudo-terminals): fixed size there
        size = _terminal_size(self._stream)
        fixed = size is not None and min(size) == 0
        # the stage on the left: on a narrow terminal the bar shrinks first, the stage stays readable
        self._bar = tqdm(
            total=total,
            initial=nit,
            desc=f"iteration {nit + 1}/{total}",
            unit="it",
            bar_format="{desc} {percentage:3.0f}%|{bar}| {n_fmt}/{total_fmt} [{elapsed}<{remaining}, {rate_fmt}]",
            file=self._stream,
            leave=self._leave,
            smoothing=0.5,
            mininterval=0.0,
            dynamic_ncols=not fixed,
            ncols=(size[0] or 100) if fixed and size is not None else None,
            nrows=20 if fixed else None,
        )
        if self._refresh_s > 0:
            self._stop = threading.Event()  # a fresh one: the display may be reused for another run
            self._ticker = threading.Thread(target=self._tick, name="shardvi-progress", daemon=True)
            self._ticker.start()

    def _tick(self):
        while not self._stop.wait(self._refresh_s):
            bar = self._bar
            if bar is not None:
                bar.refresh()

    def start_iteration(self, nit: int, total: int) -> None:
        if self._bar is None:
            self._open(nit, total)
        self._nit, self._total = nit, total

    def stage(self, name: str, compiling: bool) -> None:
        if self._bar is not None:
            self._bar.set_description_str(f"iteration {self._nit + 1}/{self._total}: {stage_label(name, compiling)}")

    def end_iteration(self, nit: int, total: int, line: str) -> None:
        if self._bar is not None:
            if not logged_to_console():
                self._bar.write(line, file=self._stream)
            self._bar.set_description_str(f"iteration {nit + 1}/{total} done", refresh=False)
            self._bar.update(1)

    def close(self) -> None:
        self._stop.set()
        if self._ticker is not None:
            self._ticker.join()
            self._ticker = None
        if self._bar is not None:
            self._bar.close()
            self._bar = None
        self._redirect.close()


def check_progress(progress, argname: str = "progress"):
    """Validate a ``progress`` value; returns it (``True`` as ``"auto"``, ``False``/``None`` as ``"off"``)."""
    if isinstance(progress, Progress):
        return progress
    if progress is None or progress is False:
        return "off"
    if progress is True:
        return "auto"
    if not isinstance(progress, str):
        raise TypeError(
            f"{argname} must be True, False, one of {PROGRESS_MODES} or a "
            f"shardvi.vi.progress.Progress instance, got {type(progress).__name__}"
        )
    if progress not in PROGRESS_MODES:
        raise ValueError(f"{argname} must be True, False or one of {PROGRESS_MODES}, got {progress!r}")
    return progress


def _terminal_size(stream):
    """``(columns, lines)`` of the terminal of ``stream``; ``None`` without a file descriptor or terminal."""
    try:
        return tuple(os.get_terminal_size(stream.fileno()))
    except (AttributeError, OSError, ValueError):  # no fileno (StringIO raises UnsupportedOperation, an OSError)
        return None


def _isatty(stream) -> bool:
    try:
        return bool(stream.isatty())
    except (AttributeError, ValueError):  # no isatty, or a closed stream
        return False


def open_display(progress, stream: TextIO | None = None, leave: bool = True) -> Progress:
    """The display for a ``progress`` value; ``"auto"`` looks at ``stream`` (default ``sys.stderr``).

    ``leave=False``: a bar is erased when closed (used for a single
    :meth:`OptimizeVI.update` outside :meth:`OptimizeVI.run`).
    """
    if isinstance(progress, Progress):
        return progress
    mode = check_progress(progress)
    stream = stream if stream is not None else sys.stderr
    if mode == "auto":
        mode = "bar" if _isatty(stream) else "lines"
    if mode == "bar":
        return BarProgress(stream, leave=leave)
    if mode == "lines":
        return LineProgress(stream)
    return Progress()
