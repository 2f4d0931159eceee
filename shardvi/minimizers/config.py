"""Frozen, validated solver configurations (defined beside their solvers; re-exported here).

:class:`CGConfig` lives in :mod:`.cg`, :class:`NewtonCGConfig` in
:mod:`.newton_cg` and :class:`OptaxConfig` in :mod:`.optax_adapter`, one file
per algorithm; this module keeps ``from shardvi.minimizers.config import ...``
working.
"""

from __future__ import annotations

from .cg import CGConfig
from .newton_cg import NewtonCGConfig
from .optax_adapter import OptaxConfig

__all__ = ["CGConfig", "NewtonCGConfig", "OptaxConfig"]
