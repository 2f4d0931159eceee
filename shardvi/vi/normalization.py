"""The likelihoods' normalization constants: ``c`` with ``-log p(d | s) = energy(s) + c``.

The energies of the likelihoods drop every term that does not depend on the
signal (as NIFTy.re's do); :meth:`~shardvi.Likelihood.normalization` returns
what they drop, evaluated on the host in float64 from the data, so that
:func:`~shardvi.estimate_evidence_lower_bound` bounds ``log p(d)`` itself.
"""

from __future__ import annotations

import math

import numpy as np
from jax import tree_util as jtu

__all__ = ["LOG_2PI", "gamma_ln", "host", "summed_over_data"]

LOG_2PI = math.log(2.0 * math.pi)


def host(x) -> np.ndarray:
    """``x`` as a host NumPy array (complex kept; real as float64)."""
    a = np.asarray(x)
    return a if np.iscomplexobj(a) else a.astype(np.float64)


def gamma_ln(x):
    """``log Gamma(x)`` elementwise, float64 (SciPy, imported here: the likelihoods do not load it)."""
    import scipy.special

    return scipy.special.gammaln(x)


def summed_over_data(fn, data, *per_datum) -> float:
    """``sum over data leaves and entries of fn(d, *p)``, each ``p`` broadcast to its data leaf.

    ``data`` and every tree in ``per_datum`` have the same structure; ``fn``
    gets host arrays (``p`` broadcast to ``d``'s shape) and returns an array
    summed in float64.
    """
    total = 0.0
    for d, *ps in zip(jtu.tree_leaves(data), *(jtu.tree_leaves(p) for p in per_datum), strict=True):
        dh = host(d)
        total += float(np.sum(fn(dh, *(np.broadcast_to(host(p), dh.shape) for p in ps)), dtype=np.float64))
    return total
