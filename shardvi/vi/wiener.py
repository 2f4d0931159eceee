"""The exact posterior of a linear-Gaussian problem: :func:`wiener_filter_posterior`.

With a model affine in the latent, ``s(xi) = s0 + R xi``, and Gaussian noise,
the whitened response ``A = N^{-1/2} R`` (the Jacobian of the likelihood's
transformation) and the whitened data ``y = N^{-1/2} (d - s0)`` define the
posterior ``N(m, D)`` of ``xi ~ N(0, I)``::

    D = (I + A^T A)^{-1},   m = D A^T y                    (signal space)
      = I - A^T (I + A A^T)^{-1} A,   m = A^T (I + A A^T)^{-1} y   (data space)

The samples are MGVI's with the same keys: ``r = D (A^T e1 + e2)`` with white
``e1`` (data-like) and ``e2`` (latent), which is exactly ``N(0, D)`` here. In
data space the same draw reads ``r = e2 + A^T (I + A A^T)^{-1} (e1 - A e2)``:
both spaces give the same residuals up to the CG tolerance, and signal-space
residuals are bitwise those of ``optimize_kl``'s linear samples at the same
position and key. Data space pays when there are fewer data than latent
parameters (its CG runs in the smaller space and converges in fewer steps).
"""

from __future__ import annotations

import functools
from typing import NamedTuple

import jax
import jax.numpy as jnp
import numpy as np
from jax import tree_util as jtu

from .. import tree_math as tm
from ..minimizers.cg import CGConfig, conjugate_gradient
from ..minimizers.status import Status, status_message
from ..models.model import check_latent
from ..parallel.memory import check_memory
from ..parallel.reproducible import engine_options_key, reproducible_jit
from ..parallel.strategy import Placed, Strategy, get_strategy
from ._checks import check_bool
from .field_split import one_zero_residual
from .gaussian import Gaussian
from .kl import kl_metric, kl_value_and_grad
from .likelihood import AmendedLikelihood, Likelihood, amend_hint
from .planner import choose_strategy
from .samples import Samples, interleave_pairs
from .sampling import draw_linear_residual
from .settings import raw_key

__all__ = ["WienerFilterInfo", "wiener_filter_posterior"]

SPACES = ("signal", "data")
DEFAULT_CG = CGConfig(tol=1e-10, maxiter=10_000)


class WienerFilterInfo(NamedTuple):
    """How the solves of :func:`wiener_filter_posterior` went.

    Attributes
    ----------
    space : {"signal", "data"}
        The space the linear systems were solved in.
    mean_nit : int
        CG iterations of the posterior-mean solve.
    mean_status : Status
        Its status (``CONVERGED`` or why not).
    sample_nit : tuple of int
        CG iterations per sample pair.
    sample_status : tuple of Status
        Status per sample pair.
    nonlinearity : float
        ``|s(a + b) - s(a) - s(b) + s(0)|`` relative to the sizes of the four
        terms, for two random latents: ~1e-16 (float64) for an affine model.
    """

    space: str
    mean_nit: int
    mean_status: Status
    sample_nit: tuple
    sample_status: tuple
    nonlinearity: float

    @property
    def converged(self) -> bool:
        """Whether the mean solve and every sample solve converged."""
        return all(s is Status.CONVERGED for s in (self.mean_status, *self.sample_status))

    @property
    def message(self) -> str:
        bad = [i for i, s in enumerate(self.sample_status) if s is not Status.CONVERGED]
        parts = [f"mean ({self.space} space, {self.mean_nit} CG iterations): {status_message(self.mean_status)}"]
        if bad:
            parts.append(f"samples {bad}: {status_message(self.sample_status[bad[0]])}")
        else:
            parts.append(f"{len(self.sample_status)} sample pairs: converged")
        return "; ".join(parts)


def _check_likelihood(lh, space: str) -> None:
    if not isinstance(lh, Likelihood):
        raise TypeError(f"likelihood must be a shardvi Likelihood, got {type(lh).__name__}")
    lh.layout.require("wiener_filter_posterior")
    data = lh.data_likelihood
    if not isinstance(data, Gaussian):
        got = type(lh).__name__ + ("" if data is None else f" of {type(data).__name__}")
        raise TypeError(
            "wiener_filter_posterior needs a linear-Gaussian problem: lh = sv.Gaussian(...).amend(model) with a "
            f"model affine in the latent; got {got} (use sv.optimize_kl for other likelihoods)"
        )
    if space == "data" and lh.layout.splits_data:
        raise ValueError(
            f"space='data' needs the whitened response on the whole data, which {lh.layout.name} "
            f"({lh.layout.argument}) never assemble: use space='signal' (its solves run in the latent space, "
            "summed over the blocks)"
        )


def _defect_terms(f, a, b):
    """Squared norms of ``s(a + b) - s(a) - s(b) + s(0)`` and of the four terms (``s = f``)."""
    parts = (f(tm.add(a, b)), f(a), f(b), f(tm.zeros_like(a)))
    defect = tm.add(tm.sub(parts[0], parts[1]), tm.sub(parts[3], parts[2]))
    return jnp.stack([tm.norm(x) ** 2 for x in (defect, *parts)])


@jax.jit
def _defect(lik, a, b):
    """``|s(a + b) - s(a) - s(b) + s(0)|`` relative to the four terms' norms (for blocked data: the norms over
    all blocks)."""
    norms = jnp.sqrt(lik.layout.model_sum(lik, _defect_terms, a, b))
    return norms[0] / jnp.maximum(jnp.sum(norms[1:]), jnp.finfo(tm.leaf_dtype(a)).tiny)


def _nonlinearity(lh) -> float:
    """Relative size of ``s(a + b) - s(a) - s(b) + s(0)`` for two fixed random latents (0 for an affine model)."""
    ka, kb = jax.random.split(jax.random.PRNGKey(20260511))
    return float(_defect(lh, tm.random_like(ka, lh.domain), tm.random_like(kb, lh.domain)))


def _tolerance(lh) -> float:
    eps = float(jnp.finfo(tm.leaf_dtype(lh.domain)).eps)
    return 1e3 * eps


def _whitened(lh: AmendedLikelihood, pos):
    """``(y, A, A^T)``: whitened data ``y = N^{-1/2}(d - s0)`` and the whitened response and its adjoint."""
    _, a_op, a_adj = tm.linearize_with_adjoint(lh.transformation, pos)
    y = tm.add(lh.normalized_residual(pos), a_op(pos))  # N^{-1/2}(d - s(pos)) + A pos
    return y, a_op, a_adj


def _data_space_solver(a_op, a_adj, config):
    """``w -> (I + A A^T)^{-1} w`` by CG (its CGResult)."""
    return lambda w: conjugate_gradient(lambda v: tm.add(v, a_op(a_adj(v))), w, None, config, min_curvature=1.0)


def _mean_signal(lh, pos, config, strategy):
    # the KL's gradient and metric at one zero residual: evaluated as the KL's are, through the strategy's map
    # (per device, blocked data summed over the blocks where they are), so the same bits on every layout
    zero = one_zero_residual(pos)
    g = kl_value_and_grad(lh, pos, zero, strategy)[1]
    res = conjugate_gradient(lambda t: kl_metric(lh, pos, zero, t, strategy), g, None, config, min_curvature=1.0)
    return tm.sub(pos, res.x), res.nit, res.status


def _mean_data(lh, pos, config, strategy):
    del strategy  # unblocked data: the whole data on every device
    y, a_op, a_adj = _whitened(lh, pos)
    res = _data_space_solver(a_op, a_adj, config)(y)
    return a_adj(res.x), res.nit, res.status


def _draw_data(lh, mean, key, config):
    """``r = e2 + A^T (I + A A^T)^{-1} (e1 - A e2)``: MGVI's draw from ``key`` (same ``e1``, ``e2``), in data space."""
    _, a_op, a_adj = _whitened(lh, mean)
    k1, k2 = jax.random.split(key)
    e2 = tm.random_like(k2, lh.domain)
    e1 = tm.random_like(k1, lh.lsm_tangents_shape)
    res = _data_space_solver(a_op, a_adj, config)(tm.sub(e1, a_op(e2)))
    return tm.add(e2, a_adj(res.x)), res.nit, res.status


def _draw_signal(lh, mean, key, config):
    r, res = draw_linear_residual(lh, mean, key, config)
    return r, res.nit, res.status


_MEAN = {"signal": _mean_signal, "data": _mean_data}


@functools.lru_cache(maxsize=32)
def _mean_step(strategy: Strategy, space: str, options: tuple = ()):
    """The compiled mean solve, its inputs placed by ``strategy`` (blocked data: split over its model axis).

    ``options``: the engine's compiler options when built (part of the cache key only).
    """
    return Placed(
        strategy, reproducible_jit(functools.partial(_MEAN[space], strategy=strategy), static_argnames="config")
    )


@functools.lru_cache(maxsize=32)
def _draw_step(strategy: Strategy, space: str, mirror: bool, options: tuple = ()):
    """The compiled sample step (kept per strategy and space: repeated calls do not trace or compile again).

    ``options``: the engine's compiler options when built (part of the cache key only).
    """
    draw_fn = _draw_signal if space == "signal" else _draw_data

    def draw(lik, m, keys, config):
        r, nit, status = strategy.map(lambda li, mm, k: draw_fn(li, mm, k, config), (None, None, 0))(lik, m, keys)
        return (interleave_pairs(r) if mirror else r), nit, status

    return Placed(strategy, reproducible_jit(draw, static_argnames="config"))


def wiener_filter_posterior(
    likelihood: Likelihood,
    position=None,
    *,
    key,
    n_samples: int,
    space: str = "signal",
    cg: CGConfig = DEFAULT_CG,
    mirror_samples: bool = True,
    sample_map: str | Strategy = "vmap",
    devices=None,
    check_linear: bool = True,
    memory_limit: int | None = None,
) -> tuple[Samples, WienerFilterInfo]:
    """Exact posterior mean and samples of a linear-Gaussian problem (the Wiener filter).

    Parameters
    ----------
    likelihood : Likelihood
        ``sv.Gaussian(data, ...).amend(model)`` (optionally with
        ``data_blocks``) with ``model`` affine in the latent ``xi ~ N(0, I)``.
    position : pytree, optional
        Where the problem is linearized (any point, for an affine model);
        default zeros of ``lh.domain``.
    key : jax key
        Random key; pair ``i`` draws from ``jax.random.split(key, n_samples)[i]``
        (as :func:`~shardvi.optimize_kl` does), on any device count.
    n_samples : int
        Number of sample pairs (``>= 0``; ``2 * n_samples`` samples with
        ``mirror_samples``).
    space : {"signal", "data"}
        Solve ``(I + A^T A) x = b`` in the latent space, or
        ``(I + A A^T) w = c`` in the data space (see the module docstring);
        both give the same result up to the CG tolerance.
    cg : CGConfig
        Stopping rules of every CG solve (default relative residual 1e-10).
    mirror_samples : bool
        Antithetic pairs ``+r, -r`` (default) or one sample per key (then
        ``n_samples=1`` gives one sample, whose
        :meth:`~shardvi.Samples.mean_and_std` std is NaN: use pairs or
        ``n_samples >= 2``).
    sample_map, devices
        How the sample solves are mapped over devices, as in
        :func:`~shardvi.optimize_kl` (``"auto"`` included).
    check_linear : bool
        Measure the model's nonlinearity on two random latents and raise if it
        is above round-off (a nonlinear model has no Wiener filter).
    memory_limit : int, optional
        Bytes per device; as in :func:`~shardvi.optimize_kl`, the samples
        must fit before any work
        (:class:`~shardvi.parallel.memory.InsufficientMemoryError`).

    Returns
    -------
    samples : Samples
        ``samples.pos`` is the exact posterior mean (latent space),
        ``samples.residuals`` are exact posterior draws around it.
    info : WienerFilterInfo

    Raises
    ------
    TypeError
        ``lh`` is not an amended Gaussian, bad argument types.
    ValueError
        A nonlinear model, ``n_samples < 0``, an unknown ``space``, a
        ``position`` that does not match ``lh.domain``, ``space="data"``
        with blocked data.
    NotImplementedError
        A likelihood amended with ``field_blocks``.

    Notes
    -----
    Data amended with ``data_blocks`` (``amend(model, data_blocks=B)``) are
    solved in signal space, every sum over the blocks in block order; a
    strategy with ``model_shards = k`` keeps each device's blocks there (the
    mean solve and the samples), bitwise the one-device result.
    """
    lh = likelihood
    if space not in SPACES:
        raise ValueError(f"space must be one of {SPACES}, got {space!r}")
    _check_likelihood(lh, space)
    if isinstance(n_samples, bool) or not isinstance(n_samples, (int, np.integer)):
        raise TypeError(f"n_samples must be an int >= 0 (number of pairs), got {type(n_samples).__name__}")
    if n_samples < 0:
        raise ValueError(f"n_samples must be >= 0, got {n_samples}")
    if not isinstance(cg, CGConfig):
        raise TypeError(f"cg must be a CGConfig, got {type(cg).__name__}")
    check_bool(mirror_samples, "mirror_samples")
    check_bool(check_linear, "check_linear")
    key = raw_key(key)
    if position is None:
        position = jtu.tree_map(lambda d: jnp.zeros(d.shape, d.dtype), lh.domain)
    check_latent(position, lh.domain, "position", exact_dtype=True, hint=amend_hint(lh))
    if sample_map == "auto":
        sample_map = choose_strategy(
            lh,
            position,
            n_samples=max(n_samples, 1),
            devices=devices,
            mirror_samples=mirror_samples,
            memory_limit=memory_limit,
            sample_mode="linear_resample",
        )
        devices = None
    strategy = get_strategy(sample_map, "sample_map", devices)
    check_memory(
        lh,
        n_samples,
        strategy,
        mirror_samples=mirror_samples,
        memory_limit=memory_limit,
        what="wiener_filter_posterior",
    )
    nonlin = _nonlinearity(lh) if check_linear else float("nan")
    if check_linear and not nonlin <= _tolerance(lh):
        raise ValueError(
            f"wiener_filter_posterior needs a model affine in the latent: s(a + b) - s(a) - s(b) + s(0) is "
            f"{nonlin:.2e} of the terms' size for two random latents (round-off would be <= {_tolerance(lh):.1e}); "
            "use sv.optimize_kl for a nonlinear model (or check_linear=False if the model is linear up to "
            "its own rounding)"
        )
    mean, mean_nit, mean_status = _mean_step(strategy, space, engine_options_key())(lh, position, config=cg)
    if n_samples == 0:
        residuals = jtu.tree_map(lambda p: jnp.zeros((0,) + p.shape, p.dtype), mean)
        info = WienerFilterInfo(space, int(mean_nit), Status(int(mean_status)), (), (), nonlin)
        return Samples(mean, residuals, None), info
    keys = jax.random.split(key, n_samples)
    r, nit, status = _draw_step(strategy, space, mirror_samples, engine_options_key())(lh, mean, keys, config=cg)
    info = WienerFilterInfo(
        space,
        int(mean_nit),
        Status(int(mean_status)),
        tuple(int(n) for n in np.asarray(nit)),
        tuple(Status(int(s)) for s in np.asarray(status)),
        nonlin,
    )
    return Samples(mean, r, keys), info
