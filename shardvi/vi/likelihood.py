"""Likelihood: energy, Fisher metric and its square root, on signal or latent space.

``Likelihood`` is the base class (a :class:`~shardvi.Module`: its arrays are pytree leaves);
``AmendedLikelihood`` and ``SumLikelihood`` are what ``amend`` and ``+`` build.
"""

from __future__ import annotations

import functools
import math
from collections.abc import Callable
from typing import Self

import jax
import jax.numpy as jnp
import numpy as np
from jax import tree_util as jtu

from .. import tree_math as tm
from ..models.model import Model, normalize_domain
from ..module import Module
from .layout import WHOLE, Layout
from .masks import project

__all__ = ["AmendedLikelihood", "FunctionLikelihood", "Likelihood", "SumLikelihood"]


def _kind(dtype) -> str:
    """NumPy's dtype kind, with ml_dtypes floats (bfloat16: kind 'V') as 'f'."""
    if jnp.issubdtype(dtype, jnp.complexfloating):
        return "c"
    return "f" if jnp.issubdtype(dtype, jnp.floating) else jnp.dtype(dtype).kind


def _shape_tree(tree):
    return jtu.tree_map(lambda d: (tuple(d.shape), _kind(d.dtype)), tree)


def _check_same_domain_dtypes(a, b, what: str) -> None:
    """``a + b``: the latents both parts read must have one dtype (a sum cannot cast one part's latents)."""
    da = [jnp.dtype(d.dtype) for d in jtu.tree_leaves(a)]
    db = [jnp.dtype(d.dtype) for d in jtu.tree_leaves(b)]
    if da != db:
        raise TypeError(
            f"likelihoods disagree on the dtype of {what}: {[str(d) for d in da]} vs {[str(d) for d in db]}; "
            f"give both models latents of one dtype"
        )


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
                f"(e.g. np.asarray(data, {jnp.dtype(t.dtype).name})) or build the model in the data's dtype"
            )


def _check_model_matches_data(model, likelihood) -> None:
    """``amend``: the model output must match the data in structure and shapes (``ValueError``) and in dtypes."""
    if _shape_tree(model.target) != _shape_tree(likelihood.domain):
        raise ValueError(
            "model output does not match the likelihood's data: model.target is "
            f"{_shape_tree(model.target)}, likelihood expects {_shape_tree(likelihood.domain)}"
        )
    _check_same_dtypes(model.target, likelihood.domain)


def _overrides(obj, name: str) -> bool:
    """Whether ``type(obj)`` defines method ``name`` itself rather than inheriting :class:`Likelihood`'s."""
    return getattr(type(obj), name) is not getattr(Likelihood, name)


def pulled_back_transformation_at(likelihood, signal_bar: Callable) -> Callable:
    """``likelihood.transformation_at(signal_bar())``, or its global ``transformation`` where it has no local one.

    For a likelihood on a model's output: ``signal_bar`` evaluates the model at the expansion
    point, which only a likelihood with local coordinates needs.
    """
    if _overrides(likelihood, "transformation_at"):
        return likelihood.transformation_at(signal_bar())
    return likelihood.transformation


def _inherits(obj, cls, *names: str) -> bool:
    """Whether ``type(obj)`` takes every method in ``names`` from ``cls`` (a subclass overrides none of them)."""
    return all(getattr(type(obj), n) is getattr(cls, n) for n in names)


class _Opaque:
    """A value kept out of the pytree (a static leaf compared by identity): e.g. fingerprint-only arrays."""

    __slots__ = ("value",)

    def __init__(self, value):
        self.value = value


class Likelihood(Module):
    """Negative log-likelihood ``H(s) = -log p(d | s)`` with its Fisher geometry.

    The base class of all likelihoods. A likelihood is a :class:`~shardvi.Module`:
    its arrays (data, noise, masks) are pytree leaves, so the engine passes
    them to its compiled programs as arguments. The Fisher metric is
    ``F(s) = (dT/ds)^T (dT/ds)`` for the *transformation* ``T``; what a
    subclass does not define is derived from ``T`` with one JVP and one VJP.

    Subclassing
    -----------
    Set ``self.domain`` (pytree of ``jax.ShapeDtypeStruct``, the shapes of
    ``s``) and the data arrays as attributes in ``__init__``, then implement
    :meth:`energy` and, for geoVI and the default metric,
    :meth:`transformation`; optionally :meth:`metric` /
    :meth:`metric_operator`, :meth:`left_sqrt_metric` (then also set
    ``self.lsm_tangents_shape``) and :meth:`normalized_residual`. Call
    :meth:`set_domain` at the end of ``__init__``.

    Built from functions
    --------------------
    ``Likelihood(energy, transformation=None, *, domain, metric=None,
    left_sqrt_metric=None, lsm_tangents_shape=None, normalized_residual=None,
    metric_operator=None, data_leaves=None, normalization=None)`` builds a
    :class:`FunctionLikelihood`: ``energy`` is ``s -> H(s)``,
    ``transformation`` ``s -> T(s)``, ``metric`` ``(s, t) -> F(s) t``,
    ``left_sqrt_metric`` ``(s, e) -> L(s) e`` with ``L L^T = F`` (``e`` shaped
    like ``lsm_tangents_shape``, default: the shape of ``T(s)``),
    ``normalized_residual`` ``s -> (d - s) / noise``-like, ``metric_operator``
    ``s -> (t -> F(s) t)``, ``normalization`` the constant ``c`` with
    ``-log p(d | s) = energy(s) + c`` (:meth:`normalization`; ``None``:
    unknown). Arrays the functions close over are constants of the compiled
    programs (prefer a subclass for large data).

    Attributes
    ----------
    domain : pytree of jax.ShapeDtypeStruct
        Shapes/dtypes of ``s``.
    lsm_tangents_shape : pytree of jax.ShapeDtypeStruct or None
        Shape of the white noise ``e`` of :meth:`left_sqrt_metric`.
    data_leaves : pytree or None
        What this likelihood was built from, for checkpoint fingerprints only:
        the data and noise arrays (``Gaussian``, ``Poisson``, ``StudentT``,
        ``VariableCovarianceGaussian``; kept through ``amend``, which adds the
        model's output shapes, and ``+``). ``None`` (or ``None`` leaves) marks
        unknown parts.
    """

    def __new__(cls, *args, **kwargs) -> Self:
        if cls is Likelihood:  # Likelihood(energy, ...): a likelihood built from functions
            return object.__new__(FunctionLikelihood)  # pyright: ignore[reportReturnType] -- a Likelihood subclass
        return object.__new__(cls)

    def set_domain(self, domain, lsm_tangents_shape=None) -> None:
        """Set ``domain`` (validated) and ``lsm_tangents_shape`` (default: the shape of ``T(s)``)."""
        self.domain = normalize_domain(domain)
        if lsm_tangents_shape is None and self.has_transformation:
            lsm_tangents_shape = jax.eval_shape(self.transformation, self.domain)
        if lsm_tangents_shape is None and self._has_explicit_lsm:
            raise ValueError("lsm_tangents_shape is required with an explicit left_sqrt_metric and no transformation")
        self.lsm_tangents_shape = lsm_tangents_shape

    @property
    def layout(self) -> Layout:
        """How this likelihood is cut over a device map's model axis (:mod:`shardvi.vi.layout`).

        :data:`~shardvi.vi.layout.WHOLE` unless amended with ``data_blocks`` or ``field_blocks``.
        """
        return WHOLE

    @property
    def data_likelihood(self) -> Likelihood | None:
        """The likelihood of the data alone that this one was amended from (``lh`` of ``lh.amend(model, ...)``;
        its blocks' for cut data), or ``None`` where this one is not an amended likelihood (a likelihood on
        the data themselves, a sum, a custom one)."""
        return None

    #: Set ``True`` in a subclass whose explicit :meth:`left_sqrt_metric` is ``(dT/ds)^T e``, the transpose of the
    #: transformation's linearization (e.g. a transformation ``T(s) = W s`` with a self-adjoint ``W`` and square
    #: root ``e -> W e``). The geoVI update then draws its metric sample with the linearization of ``T`` it
    #: computes anyway: one model evaluation fewer in its compiled program. The default square root is one.
    lsm_is_transformation_vjp: bool = False

    @property
    def _has_explicit_lsm(self) -> bool:
        return _overrides(self, "left_sqrt_metric")

    @property
    def _lsm_from_transformation(self) -> bool:
        """Whether ``left_sqrt_metric(s, e) == (dT/ds)^T e`` (up to rounding) for the transformation ``T``."""
        return self.has_transformation and (self.lsm_is_transformation_vjp or not self._has_explicit_lsm)

    def _transformation_metric(self, s) -> Callable:
        """``t -> (dT/ds)^T (dT/ds) t`` at ``s``: the metric derived from the transformation."""
        _, jvp, adj = tm.linearize_with_adjoint(self.transformation, s)
        return lambda t: adj(jvp(t))

    # -- core maps -------------------------------------------------------------------------
    def energy(self, s):
        """Negative log-likelihood at ``s`` (up to an ``s``-independent constant)."""
        raise NotImplementedError(f"{type(self).__name__} defines no energy")

    def __call__(self, s):
        return self.energy(s)

    def normalization(self) -> float | None:
        """``c`` with ``-log p(d | s) = energy(s) + c`` in nats, or ``None`` where unknown.

        :meth:`energy` drops the terms that do not depend on the signal (a
        Gaussian's ``log det(2 pi N) / 2``, a Poisson's ``log d!``, ...);
        this returns them, computed on the host in float64 from the data. The
        evidence lower bound adds it (:func:`~shardvi.estimate_evidence_lower_bound`),
        so that it bounds ``log p(d)``. The base class does not know it:
        ``None``.
        """
        return None

    def transformation(self, s):
        """``T(s)``: coordinates in which the Fisher metric is the identity."""
        raise NotImplementedError("this likelihood has no transformation (needed for geoVI)")

    def transformation_at(self, s_bar) -> Callable:
        """``s -> T(s)``, the geoVI coordinates around the expansion point ``s_bar``.

        The geoVI update curves its samples with this map: its Jacobian at
        ``s_bar`` must reproduce the Fisher metric there,
        ``(dT/ds)^T (dT/ds) = F(s_bar)`` (exactly, or in expectation over data
        drawn at ``s_bar`` where the Fisher geometry is curved), or the update
        is inconsistent with the metric that drew the linear sample. The
        default is the global :meth:`transformation` (exact everywhere for a
        Fisher metric that is the pull-back of a Euclidean one: ``Gaussian``,
        ``Poisson``, ``StudentT``; in expectation for the variable-covariance
        ones). A likelihood whose map depends on the expansion point
        overrides this.
        """
        del s_bar
        return self.transformation

    def metric(self, s, t):
        """Fisher metric ``F(s) t``."""
        return self.metric_operator(s)(t)

    def metric_operator(self, s) -> Callable:
        """``t -> F(s) t``: the metric at ``s`` as a linear operator.

        Whatever depends on ``s`` alone (for an amended likelihood: the model
        and its linearization at ``s``) is computed once, here; applying the
        operator runs only the linear parts. Use it where the metric at one
        point is applied many times (a CG solve).
        """
        if _overrides(self, "metric"):
            return functools.partial(self.metric, s)
        return self._transformation_metric(s)

    def left_sqrt_metric(self, s, e):
        """``L(s) e`` with ``L L^T = F(s)``; a standard normal ``e`` gives ``N(0, F)``."""
        if not self.has_transformation:
            raise NotImplementedError(
                "this likelihood has neither a left_sqrt_metric nor a transformation (one is needed to draw samples)"
            )
        _, vjp = jax.vjp(self.transformation, s)
        return tm.linear_adjoint(vjp)(e)

    def sampling_operators(self, s) -> tuple[Callable, Callable]:
        """``(e -> L(s) e, t -> F(s) t)``: the left square root and the metric at one point.

        What an MGVI sample needs (the metric sample ``L e`` and the metric for
        its CG solve). What the two share is computed once: for an amended
        likelihood the model's evaluation and linearization at ``s``, so a
        sampling program holds one copy of the model's forward pass instead of
        two. The default is ``(partial(left_sqrt_metric, s), metric_operator(s))``.
        """
        return functools.partial(self.left_sqrt_metric, s), self.metric_operator(s)

    def geovi_root(self, xi_bar, keep) -> tuple[Callable, Callable]:
        """The geoVI update's root problem at ``xi_bar``: ``(lsm, problem)``.

        ``lsm`` (``e -> L e``) draws the metric sample ``y`` (``e -> Jbar^T e``
        where that is the likelihood's square root: one model evaluation fewer);
        ``problem(y)`` is ``(fun_and_grad, hessp, hessp_at)`` of
        ``|delta(r)|^2 / 2``, ``delta(r) = r + Jbar^T (x(xi_bar + r) - x(xi_bar)) - y``
        with ``x`` the coordinates :meth:`transformation_at` ``xi_bar`` and
        ``Jbar`` their Jacobian there, restricted to the entries where ``keep``
        is True; ``hessp`` is the Gauss-Newton ``J_delta^T J_delta`` and
        ``hessp_at(r)`` (or ``None``) that operator linearized once at ``r``.
        A likelihood whose data are cut into blocks sums the same terms over
        its blocks.
        """
        # the likelihood's coordinates around xi_bar (for a curved Fisher geometry they depend on it)
        transformation = self.transformation_at(xi_bar)
        # linearized (not jax.vjp): its residuals pass a barrier, and jbar_t runs in every pass of the Newton-CG loops
        x_bar, _, jbar_t = tm.linearize_with_adjoint(transformation, xi_bar)
        lsm = jbar_t if self._lsm_from_transformation else functools.partial(self.left_sqrt_metric, xi_bar)

        def problem(y):
            def delta(r):
                r = project(keep, r)
                xr = transformation(tm.add(xi_bar, r))
                g = tm.add(r, jbar_t(tm.sub(xr, x_bar)))
                return project(keep, tm.sub(g, y))

            def fun_and_grad(r):
                d, vjp = jax.vjp(delta, r)
                return 0.5 * tm.vdot(d, d), tm.linear_adjoint(vjp)(d)

            def hessp_at(r):  # Gauss-Newton J_g^T J_g at r: delta evaluated and linearized once per Newton step
                _, jvp, adj = tm.linearize_with_adjoint(delta, r)
                return lambda v: adj(jvp(v))

            return fun_and_grad, lambda r, v: hessp_at(r)(v), hessp_at

        return lsm, problem

    def _data_noise_sample(self, lsm, key):
        """``lsm(e1)`` with white noise ``e1`` (shaped like ``lsm_tangents_shape``) drawn from ``key``."""
        return lsm(tm.random_like(key, self.lsm_tangents_shape))

    def normalized_residual(self, s):
        """Noise-weighted data residual at ``s``."""
        raise NotImplementedError("this likelihood defines no normalized_residual")

    @property
    def has_normalized_residual(self) -> bool:
        return _overrides(self, "normalized_residual")

    @property
    def has_transformation(self) -> bool:
        return _overrides(self, "transformation")

    @property
    def data_leaves(self):
        return None

    # -- composition -----------------------------------------------------------------------
    def amend(self, model, *, data_blocks: int | None = None, field_blocks: int | None = None) -> Likelihood:
        """This likelihood pulled back to the latent space of ``model``.

        The metric becomes ``J^T F J`` and the left square root ``J^T L`` with
        ``J = d model / d xi``, applied matrix-free. The model's output must
        match the data in structure and shapes (else ``ValueError``) and in
        dtypes, leaf by leaf (else ``TypeError``: nothing is cast implicitly).

        ``data_blocks=B`` cuts the data axis into ``B`` fixed blocks (model
        parallelism): ``model`` must be built with ``data_inputs``; where ``B``
        does not divide the number of data the last block is padded with inert
        data (they change no sum). Energies, gradients and metric
        applications become sums over blocks in a fixed order, which a strategy
        with ``model_shards`` dividing ``B`` splits over devices with bitwise
        the results of one device (:class:`~shardvi.vi.blocked.BlockedLikelihood`).

        ``field_blocks=B`` (pixel-wise data on a grid) cuts the grid's first axis
        into ``B`` fixed blocks of rows, for the data and for the latent leaves
        with the grid's shape (field parallelism): a strategy with
        ``model_shards`` dividing ``B`` splits data and field over devices, each
        computing its slab, with bitwise the results of one device
        (:class:`~shardvi.vi.field_split.FieldSplitLikelihood`). Where ``B`` does
        not divide the rows, the blocks end with padding rows (unobserved data,
        zero latent) that nothing returned holds.
        """
        if data_blocks is not None and field_blocks is not None:
            raise ValueError("give data_blocks (split the data) or field_blocks (split data and field), not both")
        for argument, n_blocks in (("field_blocks", field_blocks), ("data_blocks", data_blocks)):
            if n_blocks is not None:  # the layout that argument names builds the cut likelihood
                return Layout.for_argument(argument).amend(self, model, n_blocks)
        return AmendedLikelihood(self, model)

    def __add__(self, other: Likelihood) -> SumLikelihood:
        """Sum of independent likelihoods (energies and metrics add).

        Both must live on the same domain, or both on dicts whose entries agree
        where their keys overlap; the sum lives on the union of the keys.
        """
        if not isinstance(other, Likelihood):
            return NotImplemented
        return SumLikelihood(self, other)


class FunctionLikelihood(Likelihood):
    """A likelihood built from functions: what ``Likelihood(energy, ...)`` returns (see :class:`Likelihood`).

    The functions are static configuration (compared by identity); arrays
    they close over are constants of the compiled programs. ``data_leaves``
    (optional) describes the data for checkpoint fingerprints.
    """

    def __init__(
        self,
        energy: Callable,
        transformation: Callable | None = None,
        *,
        domain,
        metric: Callable | None = None,
        left_sqrt_metric: Callable | None = None,
        lsm_tangents_shape=None,
        normalized_residual: Callable | None = None,
        metric_operator: Callable | None = None,
        data_leaves=None,
        normalization: float | None = None,
    ):
        if not callable(energy):
            raise TypeError(f"energy must be callable, got {type(energy).__name__}")
        for name, fn in (
            ("transformation", transformation),
            ("metric", metric),
            ("left_sqrt_metric", left_sqrt_metric),
            ("normalized_residual", normalized_residual),
            ("metric_operator", metric_operator),
        ):
            if fn is not None and not callable(fn):
                raise TypeError(f"{name} must be callable or None, got {type(fn).__name__}")
        self._energy = energy
        self._transformation = transformation
        self._metric = metric
        self._metric_operator = metric_operator
        self._lsm = left_sqrt_metric
        self._normalized_residual = normalized_residual
        self._data_leaves = _Opaque(data_leaves)
        if normalization is not None:
            if isinstance(normalization, bool) or not isinstance(normalization, (int, float, np.floating, np.integer)):
                raise TypeError(f"normalization must be a real number or None, got {type(normalization).__name__}")
            if not math.isfinite(float(normalization)):
                raise ValueError(f"normalization must be finite, got {normalization}")
        self._normalization = _Opaque(None if normalization is None else float(normalization))
        self.set_domain(domain, lsm_tangents_shape)

    def normalization(self) -> float | None:
        return self._normalization.value

    @property
    def _has_explicit_lsm(self) -> bool:
        return self._lsm is not None

    def energy(self, s):
        return self._energy(s)

    def transformation(self, s):
        if self._transformation is None:
            return super().transformation(s)
        return self._transformation(s)

    def metric(self, s, t):
        if self._metric is not None:
            return self._metric(s, t)
        return self.metric_operator(s)(t)

    def metric_operator(self, s) -> Callable:
        if self._metric_operator is not None:
            return self._metric_operator(s)
        if self._metric is not None:
            return functools.partial(self._metric, s)
        return self._transformation_metric(s)

    def left_sqrt_metric(self, s, e):
        if self._lsm is not None:
            return self._lsm(s, e)
        return super().left_sqrt_metric(s, e)

    def normalized_residual(self, s):
        if self._normalized_residual is None:
            return super().normalized_residual(s)
        return self._normalized_residual(s)

    @property
    def has_normalized_residual(self) -> bool:
        return self._normalized_residual is not None

    @property
    def has_transformation(self) -> bool:
        return self._transformation is not None

    @property
    def data_leaves(self):
        return self._data_leaves.value


class AmendedLikelihood(Likelihood):
    """``likelihood`` on the latent space of ``model``: ``H(xi) = H_lh(model(xi))`` (see :meth:`Likelihood.amend`).

    Parameters
    ----------
    likelihood : Likelihood
        On the model's output space (its ``domain`` must match ``model.target``).
    model : shardvi.Model
        The forward model; its arrays are leaves too.
    """

    def __init__(self, likelihood: Likelihood, model):
        if not isinstance(likelihood, Likelihood):
            raise TypeError(f"likelihood must be a shardvi Likelihood, got {type(likelihood).__name__}")
        if not isinstance(model, Model):
            if callable(model):
                raise TypeError("model must be a shardvi.Model (wrap the function: sv.Model(call, domain))")
            raise TypeError(f"model must be a shardvi.Model, got {type(model).__name__}")
        _check_model_matches_data(model, likelihood)
        self.likelihood = likelihood
        self.model = model
        self.domain = model.domain
        # a likelihood with a metric but neither transformation nor left square root has no lsm
        self.lsm_tangents_shape = likelihood.lsm_tangents_shape

    @property
    def data_likelihood(self) -> Likelihood:
        return self.likelihood

    def energy(self, xi):
        return self.likelihood.energy(self.model(xi))

    def transformation(self, xi):
        return self.likelihood.transformation(self.model(xi))

    def normalization(self) -> float | None:
        return self.likelihood.normalization()

    def transformation_at(self, xi_bar):
        t = pulled_back_transformation_at(self.likelihood, lambda: self.model(xi_bar))
        return lambda xi: t(self.model(xi))

    def metric_operator(self, xi):
        """``t -> J^T F(s) J t`` with one evaluation (and linearization) of the model."""
        s, jvp, adj = tm.linearize_with_adjoint(self.model, xi)
        fs = self.likelihood.metric_operator(s)
        return lambda t: adj(fs(jvp(t)))

    def left_sqrt_metric(self, xi, e):
        if self.lsm_tangents_shape is None:
            raise NotImplementedError(
                "this likelihood has neither a left_sqrt_metric nor a transformation (one is needed to draw samples)"
            )
        s, vjp = jax.vjp(self.model, xi)
        return tm.linear_adjoint(vjp)(self.likelihood.left_sqrt_metric(s, e))

    def sampling_operators(self, xi):
        """``(e -> J^T L(s) e, t -> J^T F(s) J t)`` with one evaluation and linearization of the model."""
        if not _inherits(self, AmendedLikelihood, "left_sqrt_metric", "metric_operator", "metric"):
            return super().sampling_operators(xi)
        s, jvp, adj = tm.linearize_with_adjoint(self.model, xi)
        ls, fs = self.likelihood.sampling_operators(s)

        def lsm(e):
            if self.lsm_tangents_shape is None:
                self.left_sqrt_metric(xi, e)  # raises its NotImplementedError
            return adj(ls(e))

        return lsm, lambda t: adj(fs(jvp(t)))

    def normalized_residual(self, xi):
        return self.likelihood.normalized_residual(self.model(xi))

    @property
    def has_transformation(self) -> bool:
        return self.likelihood.has_transformation

    @property
    def _lsm_from_transformation(self) -> bool:
        own = _inherits(self, AmendedLikelihood, "left_sqrt_metric", "transformation")
        return own and self.likelihood._lsm_from_transformation

    @property
    def has_normalized_residual(self) -> bool:
        return self.likelihood.has_normalized_residual

    @property
    def data_leaves(self):
        return {"likelihood": self.likelihood.data_leaves, "model_output": self.likelihood.domain}


class SumLikelihood(Likelihood):
    """``a + b``: independent likelihoods whose energies and metrics add (see :meth:`Likelihood.__add__`).

    On one common domain, or on dicts that agree where their keys overlap (the
    sum then lives on the union of the keys; each part sees its own keys).
    """

    def __init__(self, a: Likelihood, b: Likelihood):
        if not isinstance(a, Likelihood) or not isinstance(b, Likelihood):
            raise TypeError(f"both terms must be shardvi Likelihoods, got {type(a).__name__} and {type(b).__name__}")
        if a.layout != WHOLE or b.layout != WHOLE:
            raise TypeError(
                "a likelihood amended with data_blocks or field_blocks cannot be added to another one: put all "
                "data of a split likelihood into one likelihood (one data axis or grid), or amend without blocks"
            )
        if _shape_tree(a.domain) == _shape_tree(b.domain):
            _check_same_domain_dtypes(a.domain, b.domain, "the domain")
            domain, keys_a, keys_b = a.domain, None, None
        elif isinstance(a.domain, dict) and isinstance(b.domain, dict):
            for k in set(a.domain) & set(b.domain):
                if _shape_tree(a.domain[k]) != _shape_tree(b.domain[k]):
                    raise ValueError(f"likelihoods disagree on the shape of domain entry {k!r}")
                _check_same_domain_dtypes(a.domain[k], b.domain[k], f"domain entry {k!r}")
            domain, keys_a, keys_b = {**a.domain, **b.domain}, tuple(a.domain), tuple(b.domain)
        else:
            raise ValueError(
                f"cannot add likelihoods on different domains: {_shape_tree(a.domain)} vs {_shape_tree(b.domain)}"
            )
        self.a, self.b = a, b
        self.keys_a, self.keys_b = keys_a, keys_b
        self.domain = domain
        has_lsm = a.lsm_tangents_shape is not None and b.lsm_tangents_shape is not None
        self.lsm_tangents_shape = (a.lsm_tangents_shape, b.lsm_tangents_shape) if has_lsm else None

    @staticmethod
    def _part(keys, x):
        return x if keys is None else {k: x[k] for k in keys}

    @staticmethod
    def _lift(keys, part, full):
        if keys is None:
            return part
        return {k: (part[k] if k in keys else jnp.zeros_like(full[k])) for k in full}

    def energy(self, x):
        return self.a.energy(self._part(self.keys_a, x)) + self.b.energy(self._part(self.keys_b, x))

    def normalization(self) -> float | None:
        ca, cb = self.a.normalization(), self.b.normalization()
        return None if ca is None or cb is None else ca + cb

    def transformation(self, x):
        return (self.a.transformation(self._part(self.keys_a, x)), self.b.transformation(self._part(self.keys_b, x)))

    def transformation_at(self, x_bar):
        ta = self.a.transformation_at(self._part(self.keys_a, x_bar))
        tb = self.b.transformation_at(self._part(self.keys_b, x_bar))
        return lambda x: (ta(self._part(self.keys_a, x)), tb(self._part(self.keys_b, x)))

    def _summed(self, ma, mb) -> Callable:
        """``t -> A t + B t`` of operators on the parts' keys."""
        ka, kb = self.keys_a, self.keys_b
        return lambda t: tm.add(self._lift(ka, ma(self._part(ka, t)), t), self._lift(kb, mb(self._part(kb, t)), t))

    def metric_operator(self, x):
        return self._summed(
            self.a.metric_operator(self._part(self.keys_a, x)), self.b.metric_operator(self._part(self.keys_b, x))
        )

    def left_sqrt_metric(self, x, e):
        if self.lsm_tangents_shape is None:
            raise NotImplementedError(
                "this likelihood has neither a left_sqrt_metric nor a transformation (one is needed to draw samples)"
            )
        ka, kb = self.keys_a, self.keys_b
        return tm.add(
            self._lift(ka, self.a.left_sqrt_metric(self._part(ka, x), e[0]), x),
            self._lift(kb, self.b.left_sqrt_metric(self._part(kb, x), e[1]), x),
        )

    def sampling_operators(self, x):
        """Each part's :meth:`~Likelihood.sampling_operators` (what a part's square root and metric share, once)."""
        if not _inherits(self, SumLikelihood, "left_sqrt_metric", "metric_operator", "metric"):
            return super().sampling_operators(x)
        ka, kb = self.keys_a, self.keys_b
        la, ma = self.a.sampling_operators(self._part(ka, x))
        lb, mb = self.b.sampling_operators(self._part(kb, x))

        def lsm(e):
            if self.lsm_tangents_shape is None:
                self.left_sqrt_metric(x, e)  # raises its NotImplementedError
            return tm.add(self._lift(ka, la(e[0]), x), self._lift(kb, lb(e[1]), x))

        return lsm, self._summed(ma, mb)

    def normalized_residual(self, x):
        return (
            self.a.normalized_residual(self._part(self.keys_a, x)),
            self.b.normalized_residual(self._part(self.keys_b, x)),
        )

    @property
    def has_transformation(self) -> bool:
        return self.a.has_transformation and self.b.has_transformation

    @property
    def _lsm_from_transformation(self) -> bool:
        own = _inherits(self, SumLikelihood, "left_sqrt_metric", "transformation")
        return own and self.a._lsm_from_transformation and self.b._lsm_from_transformation

    @property
    def has_normalized_residual(self) -> bool:
        return self.a.has_normalized_residual and self.b.has_normalized_residual

    @property
    def data_leaves(self):
        return (self.a.data_leaves, self.b.data_leaves)


def amend_hint(likelihood) -> str:
    """A hint for a position that does not fit ``likelihood``: where it was never amended with its model."""
    if isinstance(likelihood, (AmendedLikelihood, SumLikelihood)) or likelihood.layout != WHOLE:
        return ""
    return (
        f". The {type(likelihood).__name__} is on the data space (it takes the model's output): amend it with "
        "the forward model, lh.amend(model), so that it takes the model's latent position"
    )
