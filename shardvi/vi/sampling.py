"""MGVI (linear) and geoVI (nonlinear) residuals for one antithetic pair."""

from __future__ import annotations

import functools

import jax
import jax.core
import jax.numpy as jnp
import numpy as np
from jax import tree_util as jtu

from .. import tree_math as tm
from ..minimizers.cg import CGConfig, CGResult, conjugate_gradient
from ..minimizers.newton_cg import NewtonCGConfig, newton_cg
from ..minimizers.solution import Solution
from ..models.model import check_latent
from ..parallel.grid import is_slab
from .defaults import DEFAULT_LINEAR_SAMPLING, DEFAULT_NONLINEAR_UPDATE
from .likelihood import Likelihood
from .masks import project

__all__ = ["metric_sample", "draw_linear_residual", "nonlinearly_update_residual"]


def _check_inputs(lh, pos, key, config, config_type, *, residual=None, sign=None) -> None:
    """Shapes, dtypes and types of the public sampling functions' inputs, and the finiteness of ``pos`` and
    ``residual`` where their values are known (traced inputs, e.g. under ``vmap``, pass)."""
    if not isinstance(lh, Likelihood):
        raise TypeError(f"likelihood must be a shardvi Likelihood, got {type(lh).__name__}")
    for name, x in (("pos", pos), ("residual", residual)):
        if x is not None:
            known = not any(isinstance(v, jax.core.Tracer) for v in jtu.tree_leaves(x))
            check_latent(x, lh.domain, name, finite=known, exact_dtype=True)
    kdtype = getattr(key, "dtype", None)
    typed = kdtype is not None and jax.dtypes.issubdtype(kdtype, jax.dtypes.prng_key)  # pyright: ignore[reportPrivateImportUsage] -- public jax API
    raw = not typed and kdtype == np.uint32
    if not ((typed and np.shape(key) == ()) or (raw and np.shape(key) == (2,))):
        is_batch = (typed and np.ndim(key) >= 1) or (raw and np.ndim(key) == 2 and np.shape(key)[1] == 2)
        batch = " (a batch of keys: these functions draw one residual; map them with jax.vmap)" if is_batch else ""
        raise TypeError(
            f"key must be one jax.random key (PRNGKey(seed): uint32 of shape (2,), or a scalar "
            f"jax.random.key), got {type(key).__name__} of dtype {kdtype} and shape "
            f"{np.shape(key)}{batch}"
        )
    if sign is not None:
        _check_sign(sign)
    if not isinstance(config, config_type):
        raise TypeError(f"config must be a {config_type.__name__}, got {type(config).__name__}")


def _check_sign(sign) -> None:
    """``metric_sample_sign``: a real scalar, ``+1`` or ``-1`` where its value is known (a traced one passes)."""
    dtype = getattr(sign, "dtype", None)
    if isinstance(sign, bool) or not (
        isinstance(sign, (int, float, np.integer, np.floating))
        or (dtype is not None and (jnp.issubdtype(dtype, jnp.integer) or jnp.issubdtype(dtype, jnp.floating)))
    ):
        raise TypeError(f"metric_sample_sign must be a real scalar, +1 or -1, got {type(sign).__name__}")
    if np.shape(sign) != ():
        raise TypeError(f"metric_sample_sign must be a scalar (+1 or -1), got shape {np.shape(sign)}")
    try:
        value = float(sign)
    except jax.errors.ConcretizationTypeError:  # traced (e.g. mapped over the samples): checked by its caller
        return
    if value not in (1.0, -1.0):
        raise ValueError(f"metric_sample_sign must be +1 or -1 (the sample or its mirror), got {sign}")


def _keep(lh, sample_mask):
    """``sample_mask`` checked: one Python / NumPy bool per leaf of ``lh.domain`` (all True when ``None``)."""
    if sample_mask is None:
        return jax.tree_util.tree_map(lambda _: True, lh.domain)
    want = jtu.tree_structure(lh.domain, is_leaf=is_slab)  # a field split's row blocks: one leaf
    flags, got = jtu.tree_flatten(sample_mask)
    if got != want:
        raise ValueError(f"sample_mask must have the structure of the likelihood's domain {want}, got {got}")
    bad = [type(f).__name__ for f in flags if not isinstance(f, (bool, np.bool_))]
    if bad:
        raise TypeError(f"sample_mask must hold one bool per latent leaf (True: sampled), got {bad[0]}")
    return jtu.tree_unflatten(got, [bool(f) for f in flags])


def _metric_sample_parts(lh: Likelihood, lsm, key, keep):
    """``(y, e2)``: the metric sample ``y = L e1 + e2`` (``lsm``: ``e -> L e``) and its prior part ``e2``."""
    k1, k2 = jax.random.split(key)
    e2 = project(keep, tm.random_like(k2, lh.domain))
    return project(keep, tm.add(lh._data_noise_sample(lsm, k1), e2)), e2


def metric_sample(likelihood: Likelihood, pos, key, sample_mask=None):
    """``y = J^T L e1 + e2 ~ N(0, M(pos))`` restricted to the sampled entries.

    ``e1`` (data-like) and ``e2`` (latent) are white and drawn from ``key``.
    """
    return _metric_sample_parts(
        likelihood, functools.partial(likelihood.left_sqrt_metric, pos), key, _keep(likelihood, sample_mask)
    )[0]


def draw_linear_residual(
    likelihood: Likelihood, pos, key, config: CGConfig = DEFAULT_LINEAR_SAMPLING, *, sample_mask=None
) -> tuple[object, CGResult]:
    """MGVI residual ``r ~ N(0, M(pos)^{-1})`` (its mirror is ``-r``).

    Parameters
    ----------
    likelihood : Likelihood
        Likelihood on the latent space (``lh.amend(model)``).
    pos : pytree
        Expansion point.
    key : jax key
        One key per pair; the same key gives the same residual on any device.
    config : CGConfig
        Stopping rules of the CG solve ``M r = y``; default ``optimize_kl``'s
        ``linear_sampling`` default, ``CGConfig(tol=1e-6, maxiter=500)``.
    sample_mask : pytree of bool, optional
        False for point-estimated entries (their residual is exactly 0).

    Returns
    -------
    residual, CGResult
        ``CGResult.status`` is ``NONPOSITIVE_CURVATURE`` where a CG direction
        has ``d.M.d < |d|^2`` beyond rounding: ``M = J^T F J + I`` cannot do
        that for a valid likelihood (its Fisher metric ``F`` is not positive
        semi-definite, e.g. a callable ``noise_cov_inv`` that is not positive).

    Notes
    -----
    The CG solve of ``M r = y`` with ``y = J^T L e1 + e2`` starts at the prior
    part ``e2``, which is the exact solution where the likelihood carries no
    information (``J = 0``) and a prior-scaled guess elsewhere. Started at 0,
    an energy-based stopping rule (``absdelta``) can stop a solve after a few
    iterations with ``r`` close to 0, i.e. a collapsed sample.
    """
    lh = likelihood
    _check_inputs(lh, pos, key, config, CGConfig)
    keep = _keep(lh, sample_mask)
    # the square root and the metric at pos share the model's evaluation and linearization there (computed once,
    # not per CG iteration); the metric sample and the CG solve use them
    lsm, lh_metric = lh.sampling_operators(pos)
    y, e2 = _metric_sample_parts(lh, lsm, key, keep)
    metric = lambda v: tm.add(lh_metric(v), v)  # noqa: E731 -- the Hamiltonian's metric M = J^T F J + I
    # M = J^T F J + I >= I: a direction with d.M.d < |d|^2 (beyond rounding) means a broken likelihood metric
    # (e.g. a noise covariance that is not positive definite); CG stops there with NONPOSITIVE_CURVATURE
    res = conjugate_gradient(lambda v: project(keep, metric(project(keep, v))), y, e2, config, min_curvature=1.0)
    return res.x, res


def nonlinearly_update_residual(
    likelihood: Likelihood,
    pos,
    residual,
    metric_sample_key,
    metric_sample_sign,
    config: NewtonCGConfig = DEFAULT_NONLINEAR_UPDATE,
    *,
    sample_mask=None,
) -> tuple[object, Solution]:
    """geoVI: curve a residual so that ``g(pos + r) = g(pos) + sign * y``.

    With ``x = T(model(xi))`` (``T`` the likelihood's coordinates around
    ``model(pos)``, :meth:`~shardvi.Likelihood.transformation_at`) and
    ``Jbar = dx/dxi`` at ``pos``, the geoVI
    coordinate map is ``g(xi) = xi + Jbar^T (x(xi) - x(pos))`` and
    ``y ~ N(0, M(pos))`` is the metric sample drawn with
    ``metric_sample_key`` (the same ``y`` whose CG solve gave the linear
    residual; to rounding where the likelihood's square root is ``Jbar^T``,
    which this step then applies). The root of
    ``delta(r) = g(pos + r) - g(pos) - sign*y`` is found by Newton-CG on
    ``|delta|^2 / 2`` with the Gauss-Newton Hessian ``J_g^T J_g``, starting
    from ``residual`` (the linear residual, the root of the linearized map;
    for a linear model already the root). Where that solve ends farther from
    the root than zero is (``|delta| > |delta(0)| = |y|``, or not finite),
    it is solved once more from zero, and that solution is returned (with
    the iterations of both): where the coordinates curve strongly within a
    sample's reach (a noise scale learned far below the current one), the
    descent from the linear residual can end in a local minimum of
    ``|delta|`` that is no root. Elsewhere the result is that of the solve
    from ``residual``, to the bit.

    ``config.xtol`` bounds the remaining Newton step ``J_g^-1 delta``: the inner
    CG's residual ``r`` enters as ``|r| / c`` with ``c = 1``, the smallest
    eigenvalue of ``J_g^T J_g = Mbar^2 >= I`` at ``r = 0`` (an estimate away
    from it). A Gauss-Newton direction of non-positive curvature (``J_g``
    singular along it) stops the update with status ``NONPOSITIVE_CURVATURE``.
    The default ``config`` is ``optimize_kl``'s ``nonlinear_update`` default,
    ``NewtonCGConfig(xtol=1e-6, maxiter=50, cg=CGConfig(tol=1e-8, maxiter=500))``:
    inner solves that loose (relative residual 0.5, a minimizer's default) make
    the Newton steps crawl where the coordinates curve.

    Returns
    -------
    residual, Solution
    """
    lh = likelihood
    _check_inputs(lh, pos, metric_sample_key, config, NewtonCGConfig, residual=residual, sign=metric_sample_sign)
    if not lh.has_transformation:
        raise TypeError(
            "likelihood has no transformation: the geoVI update needs one (Gaussian, Poisson, StudentT, ... "
            "and their amend/sum provide it)"
        )
    keep = _keep(lh, sample_mask)
    lsm, problem = lh.geovi_root(pos, keep)
    y = tm.scale(metric_sample_sign, _metric_sample_parts(lh, lsm, metric_sample_key, keep)[0])
    fun_and_grad, hessp, hessp_at = problem(y)

    # J_g^T J_g is positive semi-definite by construction (min_curvature=0: no gradient fallback); at r = 0 it is
    # Mbar^2 >= I, the curvature floor that bounds what an inner CG stopped early leaves of the Newton step
    def solve(start):
        return newton_cg(fun_and_grad, hessp, start, config, hessp_at=hessp_at, min_curvature=0.0, xtol_curvature=1.0)

    res = _from_residual_else_zero(solve, project(keep, residual), y, keep)
    return res.x, res


def _from_residual_else_zero(solve, residual, y, keep) -> Solution:
    """``solve(residual)``; where it ends with ``|delta|^2 / 2 > |y|^2 / 2`` (zero's value) or not finite, ``solve(0)``.

    One while loop of at most two passes over one traced solve: a batch (``vmap``) runs the second pass
    only if one of its samples needs it, and a sample that does not keeps the bits of its first pass.
    The returned counts (``nit``, ``ncg``, ``nfev``) are those of both passes.
    """
    d0 = project(keep, y)
    at_zero = 0.5 * tm.vdot(d0, d0)
    zero = tm.zeros_like(residual)

    def again(state):
        k, sol = state
        return (k == 0) | ((k == 1) & ~(sol.fun <= at_zero))

    def attempt(state):
        k, prev = state
        sol = solve(tm.where(k == 0, residual, zero))
        sol = sol._replace(nit=sol.nit + prev.nit, ncg=sol.ncg + prev.ncg, nfev=sol.nfev + prev.nfev)
        return k + 1, jtu.tree_map(lambda v, p: jax.lax.convert_element_type(v, p.dtype), sol, prev)

    count = jnp.zeros((), jnp.int32)  # the solvers' counters and status are int32 scalars
    init = Solution(zero, jnp.zeros((), at_zero.dtype), zero, count, count, count, count)
    return jax.lax.while_loop(again, attempt, (jnp.int32(0), init))[1]
