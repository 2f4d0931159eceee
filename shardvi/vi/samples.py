"""Posterior samples: a position plus residuals with a leading sample axis."""

from __future__ import annotations

import operator
from collections.abc import Callable

import jax
import jax.numpy as jnp
import numpy as np
from jax import tree_util as jtu

from ._checks import check_bool

__all__ = ["Samples", "check_samples", "interleave_pairs"]


def _shape(x) -> tuple:
    return tuple(np.shape(x))


def _dtype(x):
    """dtype of an array/tracer; ``None`` for Python scalars (weakly typed: they adapt)."""
    if isinstance(x, (bool, int, float, complex)):
        return None
    dtype = getattr(x, "dtype", None)
    if dtype is None:
        return np.asarray(x).dtype
    try:
        return np.dtype(dtype)
    except TypeError:  # an extended dtype (typed PRNG keys)
        return dtype


def _check_like(x, ref, argname: str, refname: str, batch: int | None = None) -> int | None:
    """``x`` has ``ref``'s structure and, per leaf, shape (after a leading axis if ``batch``) and dtype.

    Returns the common leading-axis length when ``batch`` is requested
    (``batch=-1``: any length, the same for every leaf).
    """
    xs, xdef = jtu.tree_flatten(x)
    rs, rdef = jtu.tree_flatten(ref)
    if xdef != rdef:
        raise ValueError(f"{argname} has tree structure {xdef}, expected that of {refname}: {rdef}")
    lead = set()
    for i, (a, r) in enumerate(zip(xs, rs)):
        sa, sr = _shape(a), _shape(r)
        if batch is None:
            if sa != sr:
                raise ValueError(f"{argname} leaf {i} has shape {sa}, expected {sr} (the shape of {refname})")
        else:
            if len(sa) != len(sr) + 1 or sa[1:] != sr:
                raise ValueError(
                    f"{argname} leaf {i} has shape {sa}, expected (n_samples, *{sr}): a leading "
                    f"sample axis in front of the shape of {refname}"
                )
            lead.add(sa[0])
        da, dr = _dtype(a), _dtype(r)
        if da is not None and dr is not None and da != dr:
            raise TypeError(f"{argname} leaf {i} has dtype {da}, expected {dr} (the dtype of {refname})")
    if batch is None:
        return None
    if len(lead) > 1:
        raise ValueError(f"{argname} leaves have different sample counts (leading axes) {sorted(lead)}")
    return lead.pop() if lead else 0


def check_samples(pos, residuals, keys=None) -> None:
    """Validate the parts of a :class:`Samples` (shapes and dtypes only: works on tracers).

    Raises
    ------
    ValueError
        ``residuals`` does not have ``pos``'s structure with one common
        leading sample axis; ``keys`` has a count that is neither the number
        of residuals (unmirrored) nor half of it (antithetic pairs).
    TypeError
        A residual dtype differs from ``pos``'s; ``keys`` is not a raw
        ``uint32`` key array of shape ``(n_keys, 2)``.
    """
    n = _check_like(residuals, pos, "residuals", "pos", batch=-1)
    assert n is not None  # batch given: the length
    if keys is None:
        return
    kd, ks = _dtype(keys), _shape(keys)
    if kd != np.uint32 or len(ks) != 2 or ks[1] != 2:
        raise TypeError(
            f"keys must be raw threefry keys, uint32 of shape (n_keys, 2) (e.g. "
            f"jax.random.split(jax.random.PRNGKey(0), n_keys)), got dtype {kd} shape {ks}"
        )
    if ks[0] not in (n, n / 2) or (n == 0 and ks[0] != 0):
        raise ValueError(
            f"keys holds {ks[0]} keys for {n} residuals: expected one key per residual or one per "
            f"antithetic pair ({n // 2 if n % 2 == 0 else 'n/a'}), or keys=None"
        )


def _sample_index(index, n: int):
    """``index`` checked against ``n`` samples (see :meth:`Samples.__getitem__`); a concrete scalar as an int."""
    what = "Samples index must be an integer, a slice or an integer or boolean array"
    if isinstance(index, slice):
        for part in (index.start, index.stop, index.step):
            if part is not None and (isinstance(part, (bool, np.bool_)) or not hasattr(part, "__index__")):
                raise TypeError(f"{what}; the slice {index} has a {type(part).__name__} bound")
        if index.step is not None and operator.index(index.step) == 0:
            raise ValueError("Samples index: slice step cannot be zero")
        return index
    if isinstance(index, list):
        index = np.asarray(index) if index else np.zeros((0,), np.intp)
    dtype = getattr(index, "dtype", None)
    if dtype is None:  # Python scalars and other objects
        if isinstance(index, bool) or not hasattr(index, "__index__"):
            raise TypeError(f"{what}, got {type(index).__name__} {index!r}")
        index = operator.index(index)
        if not -n <= index < n:
            raise IndexError(f"Samples index {index} is out of range for {n} sample(s)")
        return index
    is_bool = jnp.issubdtype(dtype, jnp.bool_)
    if not is_bool and not jnp.issubdtype(dtype, jnp.integer):
        raise TypeError(f"{what}, got an index of dtype {dtype}")
    if is_bool and np.ndim(index) == 0:
        raise TypeError(f"{what}, got the bool {index!r}")
    try:
        host = np.asarray(index)
    except (jax.errors.TracerArrayConversionError, jax.errors.ConcretizationTypeError):
        return index  # traced: its values are unknown here
    if is_bool:
        if host.shape != (n,):
            raise IndexError(f"Samples boolean index has shape {host.shape}, expected ({n},): one entry per sample")
        return index
    bad = host[(host < -n) | (host >= n)]
    if bad.size:
        raise IndexError(f"Samples index {int(bad.ravel()[0])} is out of range for {n} sample(s)")
    return int(host) if host.ndim == 0 else index


def interleave_pairs(r):
    """``[r_0, -r_0, r_1, -r_1, ...]`` along the leading axis: the antithetic samples of residuals ``r``."""
    return jtu.tree_map(lambda x: jnp.stack([x, -x], axis=1).reshape((-1,) + x.shape[1:]), r)


@jtu.register_pytree_node_class
class Samples:
    """Samples ``pos + residuals[i]`` of an approximate posterior.

    Parameters
    ----------
    pos : pytree
        Latent position (the KL's expansion point / variational mean).
    residuals : pytree
        Same structure as ``pos`` with an extra leading axis of length
        ``n``; mirrored (antithetic) samples come in pairs ``+r, -r``.
        ``n = 0`` (MAP) is allowed.
    keys : array, optional
        RNG keys, one per sample pair (raw ``uint32`` keys, shape ``(n_pairs, 2)``).

    Notes
    -----
    The constructor checks shapes and dtypes (:func:`check_samples`); JAX's
    pytree round trips (``tree_map``, ``vmap`` axes) are not checked, so an
    ``in_axes`` spec is built with ``Samples.tree_unflatten(None, (None, 0, None))``.
    ``len(samples)`` is ``n``. Iterating yields ``pos + residuals[i]``; with no
    residuals it yields ``pos`` once, and ``mean``/``mean_and_std`` reduce to
    the point estimate (std 0); one unmirrored sample has a NaN (undefined)
    corrected std.
    """

    def __init__(self, pos, residuals, keys=None):
        check_samples(pos, residuals, keys)
        self.pos = pos
        self.residuals = residuals
        self.keys = keys

    def tree_flatten(self):
        return (self.pos, self.residuals, self.keys), None

    @classmethod
    def tree_unflatten(cls, aux, children):
        # no validation: JAX rebuilds pytrees with placeholders (vmap axes, sharding specs) as leaves
        obj = cls.__new__(cls)
        obj.pos, obj.residuals, obj.keys = children
        return obj

    def __len__(self) -> int:
        leaves = jtu.tree_leaves(self.residuals)
        return int(leaves[0].shape[0]) if leaves else 0

    @property
    def samples(self):
        """All samples stacked along a leading axis (``pos[None]`` if there are none)."""
        if len(self) == 0:
            return jtu.tree_map(lambda p: p[None], self.pos)
        return jtu.tree_map(lambda p, r: p[None] + r, self.pos, self.residuals)

    def __iter__(self):
        stacked = self.samples
        n = max(len(self), 1)
        for i in range(n):
            yield jtu.tree_map(lambda x: x[i], stacked)  # noqa: B023 -- called at once

    def __getitem__(self, index):
        """Sample ``index`` (``pos + residuals[index]``), or the samples an index array or slice selects, stacked.

        Parameters
        ----------
        index : int, slice, integer or boolean array, or tuple
            Indexes the ``max(len(self), 1)`` samples (with no residuals the
            one sample is ``pos``) with NumPy's rules: negative integers count
            from the end, slices clip, a boolean mask has one entry per
            sample. In a tuple ``(index, *rest)``, ``rest`` indexes every
            leaf of the selected samples. A traced integer index (under
            ``jax.jit``) is not range-checked.

        Raises
        ------
        IndexError
            An integer out of range; a boolean mask of another length.
        TypeError
            Any other index (a float, a bool, ``None``).
        ValueError
            A slice step of zero.
        """
        rest = ()
        if isinstance(index, tuple):
            if not index:
                raise TypeError("Samples index must select samples, got the empty tuple ()")
            index, rest = index[0], index[1:]
        index = _sample_index(index, max(len(self), 1))
        return jtu.tree_map(lambda x: x[(index, *rest)], self.samples)

    def at(self, pos) -> Samples:
        """The same residuals around a new position (same structure, shapes and dtypes as ``self.pos``)."""
        _check_like(pos, self.pos, "pos", "samples.pos")
        return Samples(pos, self.residuals, self.keys)

    def to_host(self) -> Samples:
        """The same samples as NumPy arrays in host memory.

        Results of a multi-device run live on several devices (committed to
        the strategy's mesh); JAX refuses to mix them with arrays on other
        devices (``s1.pos - s4.pos`` of a 1- and a 4-device run). Host
        copies mix with anything: ``s1.to_host().pos - s4.to_host().pos``.
        Arrays split over several processes must be gathered first (e.g.
        ``jax.experimental.multihost_utils.process_allgather``).
        """
        self._check_addressable("to_host")
        return Samples.tree_unflatten(None, tuple(jax.device_get(list(self.tree_flatten()[0]))))

    def to_device(self, device=None) -> Samples:
        """The same samples on one device (default: ``jax.devices()[0]``, where a 1-device run computes).

        Use it to compare the results of runs on different device sets inside
        JAX (``s1.to_device().pos - s4.to_device().pos``); :meth:`to_host`
        gives NumPy copies instead.
        """
        self._check_addressable("to_device")
        if device is None:
            device = jax.devices()[0]
        elif not isinstance(device, jax.Device):
            raise TypeError(f"device must be a jax.Device or None, got {type(device).__name__}")
        return Samples.tree_unflatten(None, tuple(jax.device_put(list(self.tree_flatten()[0]), device)))

    def _check_addressable(self, method: str) -> None:
        for leaf in jtu.tree_leaves(self):
            if isinstance(leaf, jax.Array) and not leaf.is_fully_addressable:
                raise ValueError(
                    f"these samples are split over several processes: gather them before {method} (e.g. "
                    "jax.experimental.multihost_utils.process_allgather(samples, tiled=True))"
                )

    def map(self, fn: Callable):
        """``fn`` applied to every sample, stacked (vectorized with ``jax.vmap``)."""
        return jax.vmap(fn)(self.samples)

    def mean(self, fn: Callable | None = None):
        """Sample mean of ``fn(sample)`` (of the samples themselves if ``fn`` is None)."""
        return self.mean_and_std(fn)[0]

    def mean_and_std(self, fn: Callable | None = None, correct_bias: bool = True):
        """Sample mean and standard deviation of ``fn(sample)``.

        Parameters
        ----------
        fn : callable, optional
            Applied to every sample first (default: the samples themselves).
        correct_bias : bool
            Divide the variance by ``n - 1`` (Bessel's correction, default)
            instead of ``n``. A Python or NumPy bool.

        Returns
        -------
        mean, std : pytree
            ``std`` is real (for complex values the root mean square of
            ``|value - mean|``). With no residuals (``n = 0``, a point estimate) the mean is
            ``fn(pos)`` and ``std`` is 0. With one sample (``n = 1``,
            unmirrored) the corrected ``std`` is undefined and NaN, as NumPy's
            ``std(ddof=1)``; ``correct_bias=False`` gives 0.

        Raises
        ------
        TypeError
            ``correct_bias`` is not a bool.
        """
        correct_bias = check_bool(correct_bias, "correct_bias")
        vals = self.map(fn) if fn is not None else self.samples
        n = len(self)
        mean = jtu.tree_map(lambda v: jnp.mean(v, axis=0), vals)
        if n == 0 or (n == 1 and not correct_bias):
            return mean, jtu.tree_map(lambda m: jnp.zeros_like(jnp.real(m)), mean)
        if n == 1:
            return mean, jtu.tree_map(lambda m: jnp.full_like(jnp.real(m), jnp.nan), mean)
        ddof = 1 if correct_bias else 0
        std = jtu.tree_map(lambda v: jnp.std(v, axis=0, ddof=ddof), vals)
        return mean, std

    def __repr__(self):
        return f"Samples(n={len(self)}, pos={jtu.tree_map(lambda x: x.shape, self.pos)})"
