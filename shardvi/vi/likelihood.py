"""Likelihood: energy, Fisher metric and its square root, on signal or latent space."""
from __future__ import annotations

import functools
from typing import Callable, Optional

import jax
import jax.numpy as jnp
from jax import tree_util as jtu

from .. import tree_math as tm
from ..models.model import Model, normalize_domain

__all__ = ["Likelihood"]


def _kind(dtype) -> str:
    """NumPy's dtype kind, with ml_dtypes floats (bfloat16: kind 'V') as 'f'."""
    if jnp.issubdtype(dtype, jnp.complexfloating):
        return "c"
    return "f" if jnp.issubdtype(dtype, jnp.floating) else jnp.dtype(dtype).kind


def _shape_tree(tree):
    return jtu.tree_map(lambda d: (tuple(d.shape), _kind(d.dtype)), tree)


def _check_same_dtypes(target, domain) -> None:
    """``amend``: the model's output dtypes must be the data's, leaf by leaf (no implicit casts).

    A float32 model on float64 data (or the reverse, or bfloat16) would fail
    deep inside a VJP; casting silently would change the precision of one
    side without the user knowing.
    """
    for (path, t), d in zip(jtu.tree_flatten_with_path(target)[0], jtu.tree_leaves(domain)):
        if jnp.dtype(t.dtype) != jnp.dtype(d.dtype):
            leaf = jtu.keystr(path) or "the output"
            raise TypeError(
                f"model output dtype does not match the likelihood's data at {leaf}: the model gives "
                f"{jnp.dtype(t.dtype).name}, the data are {jnp.dtype(d.dtype).name}; cast the data "
                f"(e.g. np.asarray(data, {jnp.dtype(t.dtype).name})) or build the model in the data's dtype")


class Likelihood:
    """Negative log-likelihood ``H(s) = -log p(d | s)`` with its Fisher geometry.

    The Fisher metric is ``F(s) = (dT/ds)^T (dT/ds)`` for the *transformation*
    ``T``; when no explicit ``metric``/``left_sqrt_metric`` is given they are
    derived from ``T`` with one JVP and one VJP.

    Parameters
    ----------
    energy : callable
        ``s -> H(s)``, a real scalar.
    transformation : callable, optional
        ``s -> T(s)``; needed for geoVI and for the default metric.
    domain : pytree of jax.ShapeDtypeStruct
        Shapes/dtypes of ``s``.
    metric : callable, optional
        ``(s, t) -> F(s) t``.
    left_sqrt_metric : callable, optional
        ``(s, e) -> L(s) e`` with ``L L^T = F`` and ``e`` shaped like
        ``lsm_tangents_shape``.
    lsm_tangents_shape : pytree of jax.ShapeDtypeStruct, optional
        Shape of ``e`` (default: the shape of ``T(s)``).
    normalized_residual : callable, optional
        ``s -> (d - s) / noise``-like residual, used by diagnostics.
    metric_operator : callable, optional
        ``s -> (t -> F(s) t)``: the metric at ``s`` as a linear operator, with
        the work that depends on ``s`` alone done once (see
        :meth:`metric_operator`; default: derived from ``metric`` or ``T``).

    Attributes
    ----------
    data_leaves : pytree or None
        What this likelihood was built from, for checkpoint fingerprints only:
        the data and noise arrays (set by ``Gaussian``, ``Poisson``,
        ``StudentT``, ``VariableCovarianceGaussian``; kept through ``amend``,
        which adds the model's output shapes, and ``+``). ``None`` (the
        default for a likelihood built directly) or ``None`` leaves mark
        unknown parts; set it to e.g. ``{"data": d}`` to have them checked.
    """

    def __init__(self, energy: Callable, transformation: Optional[Callable] = None, *, domain,
                 metric: Optional[Callable] = None, left_sqrt_metric: Optional[Callable] = None,
                 lsm_tangents_shape=None, normalized_residual: Optional[Callable] = None,
                 metric_operator: Optional[Callable] = None):
        if not callable(energy):
            raise TypeError(f"energy must be callable, got {type(energy).__name__}")
        self.domain = normalize_domain(domain)
        self._energy = energy
        self._transformation = transformation
        self._metric = metric
        self._metric_operator = metric_operator
        self._lsm = left_sqrt_metric
        self._normalized_residual = normalized_residual
        if lsm_tangents_shape is None and transformation is not None:
            lsm_tangents_shape = jax.eval_shape(transformation, self.domain)
        if lsm_tangents_shape is None and left_sqrt_metric is not None:
            raise ValueError("lsm_tangents_shape is required with an explicit left_sqrt_metric "
                             "and no transformation")
        self.lsm_tangents_shape = lsm_tangents_shape
        self.data_leaves = None  # see Attributes: for checkpoint fingerprints

    # -- core maps -------------------------------------------------------------------------
    def energy(self, s):
        """Negative log-likelihood at ``s`` (up to an ``s``-independent constant)."""
        return self._energy(s)

    def __call__(self, s):
        return self._energy(s)

    def transformation(self, s):
        """``T(s)``: coordinates in which the Fisher metric is the identity."""
        if self._transformation is None:
            raise NotImplementedError("this likelihood has no transformation (needed for geoVI)")
        return self._transformation(s)

    def metric(self, s, t):
        """Fisher metric ``F(s) t``."""
        if self._metric is not None:
            return self._metric(s, t)
        return self.metric_operator(s)(t)

    def metric_operator(self, s) -> Callable:
        """``t -> F(s) t``: the metric at ``s`` as a linear operator.

        Whatever depends on ``s`` alone (for an amended likelihood: the model
        and its linearization at ``s``) is computed once, here; applying the
        operator runs only the linear parts. Use it where the metric at one
        point is applied many times (a CG solve).
        """
        if self._metric_operator is not None:
            return self._metric_operator(s)
        if self._metric is not None:
            return functools.partial(self._metric, s)
        _, jvp, adj = tm.linearize_with_adjoint(self.transformation, s)
        return lambda t: adj(jvp(t))

    def left_sqrt_metric(self, s, e):
        """``L(s) e`` with ``L L^T = F(s)``; a standard normal ``e`` gives ``N(0, F)``."""
        if self._lsm is not None:
            return self._lsm(s, e)
        if self._transformation is None:
            raise NotImplementedError("this likelihood has neither a left_sqrt_metric nor a transformation "
                                      "(one is needed to draw samples)")
        _, vjp = jax.vjp(self.transformation, s)
        return tm.linear_adjoint(vjp)(e)

    def normalized_residual(self, s):
        """Noise-weighted data residual at ``s``."""
        if self._normalized_residual is None:
            raise NotImplementedError("this likelihood defines no normalized_residual")
        return self._normalized_residual(s)

    @property
    def has_normalized_residual(self) -> bool:
        return self._normalized_residual is not None

    @property
    def has_transformation(self) -> bool:
        return self._transformation is not None

    # -- composition -----------------------------------------------------------------------
    def amend(self, model) -> "Likelihood":
        """This likelihood pulled back to the latent space of ``model``.

        The metric becomes ``J^T F J`` and the left square root ``J^T L`` with
        ``J = d model / d xi``, applied matrix-free. The model's output must
        match the data in structure and shapes (else ``ValueError``) and in
        dtypes, leaf by leaf (else ``TypeError``: nothing is cast implicitly).
        """
        if not isinstance(model, Model):
            if callable(model):
                raise TypeError("model must be a shardvi.Model (wrap the function: sv.Model(call, domain))")
            raise TypeError(f"model must be a shardvi.Model, got {type(model).__name__}")
        if _shape_tree(model.target) != _shape_tree(self.domain):
            raise ValueError(
                "model output does not match the likelihood's data: model.target is "
                f"{_shape_tree(model.target)}, likelihood expects {_shape_tree(self.domain)}")
        _check_same_dtypes(model.target, self.domain)
        lh = self

        def energy(xi):
            return lh.energy(model(xi))

        def metric_operator(xi):  # J^T F(s) J with one evaluation of the model
            s, jvp, adj = tm.linearize_with_adjoint(model, xi)
            fs = lh.metric_operator(s)
            return lambda t: adj(fs(jvp(t)))

        def metric(xi, t):
            return metric_operator(xi)(t)

        def lsm(xi, e):
            s, vjp = jax.vjp(model, xi)
            return tm.linear_adjoint(vjp)(lh.left_sqrt_metric(s, e))

        trafo = (lambda xi: lh.transformation(model(xi))) if lh.has_transformation else None
        nres = (lambda xi: lh.normalized_residual(model(xi))) if lh.has_normalized_residual else None
        # a likelihood with a metric but neither transformation nor left square root has no lsm
        has_lsm = self.lsm_tangents_shape is not None
        out = Likelihood(energy, trafo, domain=model.domain, metric=metric,
                         left_sqrt_metric=lsm if has_lsm else None,
                         lsm_tangents_shape=self.lsm_tangents_shape, normalized_residual=nres,
                         metric_operator=metric_operator)
        out.data_leaves = {"likelihood": self.data_leaves, "model_output": self.domain}
        return out

    def __add__(self, other: "Likelihood") -> "Likelihood":
        """Sum of independent likelihoods (energies and metrics add).

        Both must live on the same domain, or both on dicts whose entries agree
        where their keys overlap; the sum lives on the union of the keys.
        """
        if not isinstance(other, Likelihood):
            return NotImplemented
        a, b = self, other
        if _shape_tree(a.domain) == _shape_tree(b.domain):
            domain = a.domain
            pa = pb = (lambda x: x)
            lift_a = lift_b = (lambda x, full=None: x)
        elif isinstance(a.domain, dict) and isinstance(b.domain, dict):
            for k in set(a.domain) & set(b.domain):
                if _shape_tree(a.domain[k]) != _shape_tree(b.domain[k]):
                    raise ValueError(f"likelihoods disagree on the shape of domain entry {k!r}")
            domain = {**a.domain, **b.domain}
            ka, kb = tuple(a.domain), tuple(b.domain)
            pa = lambda x: {k: x[k] for k in ka}  # noqa: E731
            pb = lambda x: {k: x[k] for k in kb}  # noqa: E731

            def _lift(keys):
                def lift(part, full):
                    return {k: (part[k] if k in keys else jnp.zeros_like(full[k])) for k in full}
                return lift
            lift_a, lift_b = _lift(ka), _lift(kb)
        else:
            raise ValueError("cannot add likelihoods on different domains: "
                             f"{_shape_tree(a.domain)} vs {_shape_tree(b.domain)}")

        def energy(x):
            return a.energy(pa(x)) + b.energy(pb(x))

        def metric_operator(x):
            ma, mb = a.metric_operator(pa(x)), b.metric_operator(pb(x))
            return lambda t: tm.add(lift_a(ma(pa(t)), t), lift_b(mb(pb(t)), t))

        def metric(x, t):
            return metric_operator(x)(t)

        def lsm(x, e):
            return tm.add(lift_a(a.left_sqrt_metric(pa(x), e[0]), x), lift_b(b.left_sqrt_metric(pb(x), e[1]), x))

        both_t = a.has_transformation and b.has_transformation
        trafo = (lambda x: (a.transformation(pa(x)), b.transformation(pb(x)))) if both_t else None
        both_r = a.has_normalized_residual and b.has_normalized_residual
        nres = (lambda x: (a.normalized_residual(pa(x)), b.normalized_residual(pb(x)))) if both_r else None
        has_lsm = a.lsm_tangents_shape is not None and b.lsm_tangents_shape is not None
        out = Likelihood(energy, trafo, domain=domain, metric=metric,
                         left_sqrt_metric=lsm if has_lsm else None,
                         lsm_tangents_shape=(a.lsm_tangents_shape, b.lsm_tangents_shape) if has_lsm else None,
                         normalized_residual=nres, metric_operator=metric_operator)
        out.data_leaves = (a.data_leaves, b.data_leaves)
        return out
