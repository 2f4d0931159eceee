"""Optional host-side progress logging from inside jitted solver loops."""

from __future__ import annotations

import logging

import jax
import numpy as np

logger = logging.getLogger("shardvi.minimizers")

__all__ = ["log_iteration", "logger"]


def _emit(name, fields, when, *values):
    if not np.any(when):  # under vmap: logged while any sample's entry is to be logged
        return
    parts = []
    for field, v in zip(fields, values):
        v = np.asarray(v)
        if v.ndim == 0:
            parts.append(f"{field}={v.item():.6g}" if v.dtype.kind == "f" else f"{field}={v.item()}")
        else:  # batched under vmap: one value per sample
            parts.append(f"{field}={np.array2string(v, precision=4)}")
    logger.info("%s: %s", name, " ".join(parts))


def log_iteration(name: str | None, when=True, **fields) -> None:
    """Log ``fields`` (traced scalars) through ``logging`` when ``name`` is set (and ``when``, a traced bool).

    Uses ``jax.debug.callback`` so it works under jit, vmap and while loops; when
    ``name`` is None nothing is staged and the compiled program is unchanged.
    """
    if name is None:
        return
    keys = tuple(fields)
    jax.debug.callback(lambda w, *v: _emit(name, keys, w, *v), when, *fields.values())
