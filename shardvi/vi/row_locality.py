"""The check that a model acts on a split field row block by row block: :func:`check_row_local`.

With ``field_blocks`` and a model axis (``model_shards > 1``), each device
evaluates the model on its own rows of the field. A model that mixes rows
across blocks (a flip or roll along the grid's first axis, a transpose) then
computes something else than on the whole field, without any error. Before
the first iteration the engine evaluates the sample-averaged Hamiltonian and
its gradient (a VJP) at a random latent both ways, split over the strategy's
model axis and with all blocks on one device, and refuses the model where
they differ. A row-local model gives the same bits on every layout, so the
tolerance only absorbs the ``reduce="psum"`` mode's rounding. Blocks that do
not divide the grid's rows end with padding rows, which a model that moves
rows would move into the grid on one device too: there the comparison is with
the grid in one block (no padding), on any strategy, to a tolerance for the
other grouping of the sums (1e-9 relative in float64, 1e-4 in float32).
"""

from __future__ import annotations

import jax
import jax.numpy as jnp
import numpy as np
from jax import tree_util as jtu

from ..parallel.grid import unsplit
from ..parallel.strategy import Placed
from ..parallel.vmap import Vmap
from .field_split import one_zero_residual, split_latent, unpadded_latent
from .kl import kl_value_and_grad

__all__ = ["check_row_local"]

_RTOL = 1e-8


def _value_and_grad(strategy):
    def f(lh, pos, residuals):
        v, g = kl_value_and_grad(lh, pos, residuals, strategy)
        return v, unsplit(g)

    return Placed(strategy, jax.jit(f))


def _evaluate(likelihood, strategy, x):
    pos = split_latent(likelihood, strategy, x)
    res = split_latent(likelihood, strategy, one_zero_residual(x))
    v, g = _value_and_grad(strategy)(likelihood, pos, res)
    return float(v), [np.asarray(a) for a in jtu.tree_leaves(unpadded_latent(likelihood, g))]


def check_row_local(likelihood, strategy, pos, *, seed: int = 0) -> None:
    """``ValueError`` if ``likelihood``'s model is not row-local under ``strategy``'s model axis.

    Nothing is checked for a likelihood without ``field_blocks``, a strategy
    without a model axis (unless the blocks end with padding rows: then the
    model is compared with the grid in one block on any strategy), or data
    split over processes (the whole field cannot be evaluated on one device
    there).
    """
    if not likelihood.layout.needs_row_check(getattr(strategy, "model_shards", 1)):
        return
    if any(isinstance(x, jax.Array) and not x.is_fully_addressable for x in jtu.tree_leaves((likelihood, pos))):
        return
    leaves, treedef = jtu.tree_flatten(pos)
    keys = jax.random.split(jax.random.PRNGKey(seed), len(leaves))
    x = jtu.tree_unflatten(
        treedef,
        [jnp.asarray(p) + 0.3 * jax.random.normal(k, np.shape(p), jnp.result_type(p)) for p, k in zip(leaves, keys)],
    )
    x = jax.device_get(x)
    v_split, g_split = _evaluate(likelihood, strategy, x)
    padded = likelihood.layout.rows is not None
    # padding rows: against the grid in one block (no padding; sums grouped otherwise: rounding apart)
    v_whole, g_whole = _evaluate(likelihood.one_block() if padded else likelihood, Vmap(), x)
    scale = max(abs(v_whole), 1.0)
    worst = abs(v_split - v_whole) / scale
    for a, b in zip(g_split, g_whole, strict=True):
        worst = max(worst, float(np.max(np.abs(a - b))) / max(float(np.max(np.abs(b))), 1e-300))
    single = any(np.dtype(d.dtype) == np.float32 for d in jtu.tree_leaves(likelihood.domain))
    tolerance = (1e-4 if single else 1e-9) if padded else _RTOL
    if not worst <= tolerance:
        model = getattr(likelihood, "model", None)
        name = getattr(getattr(model, "call", None), "__name__", None) or type(model).__name__
        raise ValueError(
            f"field_blocks: the model ({name}) mixes rows across blocks: evaluated on each device's rows of the "
            f"field split over model_shards={getattr(strategy, 'model_shards', 1)}"
            f"{f' with the padding rows of field_blocks={likelihood.n_blocks}' if padded else ''}, its "
            f"Hamiltonian or gradient differs from the "
            f"whole field's by {worst:.2e} (relative) at a random latent (energy {v_split:.6e} against "
            f"{v_whole:.6e}). An operation along the grid's first axis that moves rows (a flip, roll, shift or "
            "transpose) cannot run on a split field: write the model without it, use JitSharding (which gathers "
            "a model that fails on one device's rows), model_shards=1, or amend without field_blocks. "
            "check_field_split=False skips this check (for a field too large for one device), at the risk of a "
            "silently wrong posterior."
        )
