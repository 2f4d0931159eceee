"""Termination status shared by all solvers."""

from __future__ import annotations

import enum

__all__ = ["Status", "status_message"]


class Status(enum.IntEnum):
    """Why a solver stopped. Stored as an int32 array inside results."""

    RUNNING = -1
    CONVERGED = 0
    MAX_ITERATIONS = 1
    NONPOSITIVE_CURVATURE = 2
    NONFINITE = 3
    LINE_SEARCH_FAILED = 4


_MESSAGES = {
    Status.RUNNING: "still running",
    Status.CONVERGED: "converged",
    Status.MAX_ITERATIONS: "reached maxiter before any stopping criterion held",
    Status.NONPOSITIVE_CURVATURE: "operator has non-positive curvature along a search direction",
    Status.NONFINITE: "a non-finite value (nan/inf) appeared",
    Status.LINE_SEARCH_FAILED: "line search found no decrease of the objective",
}


def status_message(code) -> str:
    """Readable message for a status code (int or 0-d array)."""
    try:
        return _MESSAGES[Status(int(code))]
    except ValueError:
        return f"unknown status {int(code)}"
