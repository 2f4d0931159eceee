"""The base of shardvi's errors and its warning categories.

Every error the library raises on its own account derives from
:class:`ShardviError` (and from the built-in class that says what went
wrong, e.g. ``ValueError``), so ``except sv.ShardviError`` catches them all
while ``except ValueError`` keeps working. Bad arguments raise plain
``TypeError`` / ``ValueError`` naming the argument.
"""

from __future__ import annotations

__all__ = ["ConvergenceWarning", "ShardviError"]


class ShardviError(Exception):
    """Base class of the errors shardvi raises (solver, non-finite, curvature, checkpoint)."""


class ConvergenceWarning(UserWarning):
    """A solver stopped before its stopping criterion held (e.g. at ``maxiter``); its result is kept.

    Emitted once per run and stage, naming the configuration field to change
    and a suggested value; the per-iteration log line counts the unconverged
    solves of every iteration. Silence it with
    ``warnings.filterwarnings("ignore", category=shardvi.ConvergenceWarning)``.
    """
