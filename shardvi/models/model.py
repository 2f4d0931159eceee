"""Generative model: a function of a standard-normal latent pytree."""

from __future__ import annotations

import math
import operator
from collections.abc import Callable

import jax
import jax.numpy as jnp
import numpy as np
from jax import tree_util as jtu

from .._keys import raw_key
from ..module import Module

__all__ = ["Model", "as_shape", "check_latent", "check_real", "leaf_dtype", "normalize_domain"]


def _as_int(x):
    """``x`` as a Python int if it is an integer (Python, NumPy or a 0-d integer array), else ``None``."""
    if isinstance(x, (bool, np.bool_)):
        return None
    try:
        return operator.index(x)
    except TypeError:
        return None


def as_shape(shape, argname: str = "shape", *, minimum: int = 0) -> tuple[int, ...]:
    """A shape given as an int or a sequence of ints, as a tuple of Python ints.

    Parameters
    ----------
    shape : int or sequence of int
        Python or NumPy integers; an int ``n`` is the shape ``(n,)``.
    argname : str
        The argument's name in error messages.
    minimum : int
        The smallest accepted entry.

    Raises
    ------
    TypeError
        If ``shape`` or one of its entries is not an integer (floats and bools included).
    ValueError
        If an entry is below ``minimum``.
    """
    n = _as_int(shape)
    if n is not None:
        return as_shape((n,), argname, minimum=minimum)
    bad = TypeError(f"{argname} must be an int or a sequence of ints, got {shape!r}")
    if isinstance(shape, (str, bytes)):
        raise bad
    try:
        entries = [_as_int(s) for s in shape]
    except TypeError:
        raise bad from None
    out = tuple(s for s in entries if s is not None)
    if len(out) != len(entries):
        raise bad
    if any(s < minimum for s in out):
        raise ValueError(f"{argname} entries must be >= {minimum}, got {out}")
    return out


def normalize_domain(domain, argname: str = "domain", *, real: bool = False):
    """Validate a pytree of ``jax.ShapeDtypeStruct`` (arrays are turned into their shape/dtype).

    ``real=True`` (a latent domain) rejects complex dtypes: the engine's prior
    is ``N(0, I)`` on real coordinates, while ``jax.random.normal`` draws a
    complex latent with unit variance split over its real and imaginary parts.
    Leaves without elements (a shape with a 0) are rejected in any domain: a
    latent leaf holds at least one degree of freedom, a data leaf one datum.
    """
    items, treedef = jtu.tree_flatten_with_path(domain)
    if not items:
        raise ValueError(f"{argname} must contain at least one jax.ShapeDtypeStruct leaf, got {domain!r}")
    out = []
    for path, leaf in items:
        if isinstance(leaf, jax.ShapeDtypeStruct):
            sds = leaf
        elif hasattr(leaf, "shape") and hasattr(leaf, "dtype"):
            sds = jax.ShapeDtypeStruct(leaf.shape, leaf.dtype)
        else:
            raise TypeError(f"{argname} leaves must be jax.ShapeDtypeStruct, got {type(leaf).__name__}")
        if not jnp.issubdtype(sds.dtype, jnp.inexact):
            raise TypeError(f"{argname} leaves must have a floating dtype, got {sds.dtype}")
        if np.dtype(sds.dtype).itemsize < (8 if jnp.issubdtype(sds.dtype, jnp.complexfloating) else 4):
            raise TypeError(
                f"{argname} leaves are {sds.dtype}: the solvers (CG, Newton-CG) need float32 or float64 "
                "latents; declare the domain float32 and cast inside the model where it should compute in "
                f"{sds.dtype}"
            )
        if real and jnp.issubdtype(sds.dtype, jnp.complexfloating):
            raise TypeError(
                f"{argname} leaves must be real (a latent xi ~ N(0, I)), got {sds.dtype}; model a "
                f"complex field from two real latents (re + 1j * im)"
            )
        if math.prod(sds.shape) == 0:
            raise ValueError(
                f"{argname}{jtu.keystr(path)} has shape {tuple(sds.shape)}: it has no elements (every leaf "
                "needs at least one)"
            )
        out.append(sds)
    return jtu.tree_unflatten(treedef, out)


def check_latent(
    x, domain, argname: str, *, finite: bool = True, batch: tuple = (), exact_dtype: bool = False, hint: str = ""
) -> None:
    """Raise a clear error unless ``x`` matches ``domain`` in structure, shapes, kind of dtype and finiteness.

    Only shapes and dtypes are read unless ``finite`` (so traced values pass
    with ``finite=False``). ``batch`` is a leading shape every leaf has in
    front of the domain's shape. A complex leaf on a real domain is a
    ``TypeError`` (converting it would drop the imaginary part); so is a
    non-numeric one, and with ``exact_dtype`` any dtype other than the
    domain's (for functions that do not convert their inputs). A 64-bit
    domain with JAX's 64-bit mode off is a ``ValueError`` that says so.
    ``hint`` is appended to a structure or shape mismatch.
    """
    xs, xdef = jtu.tree_flatten(x)
    ds, ddef = jtu.tree_flatten(domain)
    check_x64(domain, "the domain")
    if xdef != ddef:
        raise ValueError(f"{argname} has tree structure {xdef}, expected {ddef} (the domain){hint}")
    for i, (a, d) in enumerate(zip(xs, ds)):
        want = tuple(batch) + tuple(d.shape)
        if tuple(np.shape(a)) != want:
            raise ValueError(f"{argname} leaf {i} has shape {tuple(np.shape(a))}, expected {want}{hint}")
        dtype = leaf_dtype(a)
        if not jnp.issubdtype(dtype, jnp.number):
            raise TypeError(f"{argname} leaf {i} must be numeric, got dtype {dtype}")
        if jnp.issubdtype(dtype, jnp.complexfloating) and not jnp.issubdtype(d.dtype, jnp.complexfloating):
            raise TypeError(
                f"{argname} leaf {i} is complex ({dtype}) but the domain is real ({d.dtype}): "
                f"the imaginary part would be dropped"
            )
        if exact_dtype and dtype != np.dtype(d.dtype):
            raise TypeError(f"{argname} leaf {i} has dtype {dtype}, expected {np.dtype(d.dtype)} (the domain's)")
    if finite and not all(_all_finite(a) for a in xs):
        raise ValueError(f"{argname} contains non-finite values (nan or inf)")


def check_x64(tree, what: str) -> None:
    """``ValueError`` if ``tree`` has 64-bit leaves (arrays or ``ShapeDtypeStruct``) while JAX's 64-bit mode is off.

    JAX would then make float32 arrays of them: the run fails later with a
    dtype mismatch, or computes in another precision than declared.
    """
    if jax.dtypes.canonicalize_dtype(np.float64) == np.float64:
        return
    for leaf in jtu.tree_leaves(tree):
        dtype = np.dtype(leaf_dtype(leaf))
        if (dtype.kind == "f" and dtype.itemsize >= 8) or (dtype.kind == "c" and dtype.itemsize >= 16):
            raise ValueError(
                f"{what} is {dtype}, but JAX's 64-bit mode is off (JAX makes float32 arrays): call "
                "jax.config.update('jax_enable_x64', True) at the start of the program, before creating arrays, "
                "or declare float32 (jnp.float32) throughout"
            )


def leaf_dtype(a):
    """The dtype of an array, tracer, ``ShapeDtypeStruct`` or Python/NumPy scalar (no device work)."""
    dtype = getattr(a, "dtype", None)
    return np.dtype(dtype) if dtype is not None else np.asarray(a).dtype


def check_real(x, argname: str, what: str = "a real number or array (float or int)") -> np.dtype:
    """The dtype of ``x`` (array, tracer or number; no device work) where it is real (float or int); ``TypeError``
    naming ``argname`` and ``what`` is expected otherwise (complex, bool, strings, ragged sequences)."""
    try:
        dtype = leaf_dtype(x)
    except (TypeError, ValueError):
        dtype = None
    if dtype is None or not (jnp.issubdtype(dtype, jnp.floating) or jnp.issubdtype(dtype, jnp.integer)):
        got = f"dtype {dtype}" if dtype is not None else "a ragged sequence"
        raise TypeError(f"{argname} must be {what}, got {type(x).__name__} with {got}")
    return dtype


def _all_finite(a) -> bool:
    """On the host where the values are (no compilation); with JAX for arrays spread over processes."""
    if isinstance(a, jax.Array) and not a.is_fully_addressable:
        return bool(jnp.all(jnp.isfinite(a)))
    return bool(np.all(np.isfinite(np.asarray(a))))


def _check_data_inputs(inputs):
    """A non-empty pytree of arrays sharing a leading data axis of length >= 1 (kept where they are)."""
    items, treedef = jtu.tree_flatten_with_path(inputs)
    if not items:
        raise ValueError(f"data_inputs must contain at least one array, got {inputs!r}")
    out, lengths = [], set()
    for path, leaf in items:
        where = "data_inputs" + jtu.keystr(path)
        if not (isinstance(leaf, jax.Array) or hasattr(leaf, "__array__")):
            raise TypeError(f"{where} must be an array, got {type(leaf).__name__}")
        arr = leaf if isinstance(leaf, jax.Array) else np.asarray(leaf)
        if arr.dtype.kind not in "biufc":
            raise TypeError(f"{where} must be numeric, got dtype {arr.dtype}")
        if arr.ndim == 0:
            raise ValueError(f"{where} is a scalar: every input needs the data axis in front")
        lengths.add((where, int(arr.shape[0])))
        out.append(arr)
    if len({n for _, n in lengths}) != 1:
        raise ValueError(
            f"data_inputs leaves must share the length of their leading (data) axis, got {sorted(lengths)}"
        )
    if next(iter(lengths))[1] == 0:
        raise ValueError("data_inputs have an empty data axis")
    return jtu.tree_unflatten(treedef, out)


class Model(Module):
    """A forward model ``s = call(xi)`` with a standard-normal latent ``xi``.

    A :class:`~shardvi.Module`: the arrays it holds are pytree leaves, passed
    to the engine's compiled programs as arguments. Arrays that ``call``
    closes over stay constants of those programs; to have them passed as
    arguments, make ``call`` a module (e.g. a response such as
    :class:`~shardvi.Mask`, a :class:`~shardvi.CorrelatedField`) or a
    ``jax.tree_util.Partial(f, *arrays)``, or subclass :class:`Model`, store
    the arrays as attributes and define ``__call__`` (call :meth:`set_domain`
    at the end of ``__init__``).

    Parameters
    ----------
    call : callable
        Pure JAX function of one latent pytree; with ``data_inputs``, of the
        latent and one block of the inputs: ``call(xi, inputs_block)`` gives
        the predictions for that block of data.
    domain : pytree of jax.ShapeDtypeStruct
        Shapes and dtypes of the latent parameters ``xi ~ N(0, I)``.
    data_inputs : pytree of arrays, optional
        Per-datum inputs of the forward model, every leaf with the data axis
        in front (length ``N``, the data's length), e.g. ``{"u": u, "v": v}``
        for visibilities or pixel indices for pixel-wise data. They let a
        likelihood amended with ``data_blocks`` (:meth:`Likelihood.amend
        <shardvi.Likelihood.amend>`) evaluate the model block by block, each
        device on the blocks it holds (model parallelism); ``model(xi)`` is
        ``call(xi, data_inputs)``, all data at once.

    Attributes
    ----------
    target : pytree of jax.ShapeDtypeStruct
        Shapes and dtypes of ``model(xi)`` (from ``jax.eval_shape``).
    n_data : int or None
        The length of the data axis of ``data_inputs`` (``None`` without).
    """

    def __init__(self, call: Callable, domain, data_inputs=None):
        if not callable(call):
            raise TypeError(f"call must be callable, got {type(call).__name__}")
        self.call = call
        self.data_inputs = None if data_inputs is None else _check_data_inputs(data_inputs)
        self.set_domain(domain)

    @property
    def n_data(self) -> int | None:
        """Length of the data axis of ``data_inputs`` (``None`` without them)."""
        if getattr(self, "data_inputs", None) is None:
            return None
        return int(np.shape(jtu.tree_leaves(self.data_inputs)[0])[0])

    def set_domain(self, domain) -> None:
        """Set ``domain`` (validated, real) and ``target`` (the output shapes of ``self(xi)``)."""
        self.domain = normalize_domain(domain, real=True)
        self.target = jax.eval_shape(self.__call__, self.domain)

    def __call__(self, xi):
        if getattr(self, "data_inputs", None) is not None:
            return self.call(xi, self.data_inputs)
        return self.call(xi)

    def init(self, key):
        """Standard-normal latent pytree drawn with ``key`` (one subkey per leaf).

        Parameters
        ----------
        key : jax.Array
            One threefry2x32 key, ``jax.random.PRNGKey(seed)`` or ``jax.random.key(seed)``
            (as for :func:`~shardvi.optimize_kl`); to draw several latents, ``jax.vmap`` over keys.

        Raises
        ------
        TypeError
            If ``key`` is not one such key (an int, a batch of keys, another key type).
        """
        raw_key(key)
        leaves, treedef = jtu.tree_flatten(self.domain)
        keys = jax.random.split(key, len(leaves))
        return jtu.tree_unflatten(treedef, [jax.random.normal(k, d.shape, d.dtype) for k, d in zip(keys, leaves)])

    @property
    def size(self) -> int:
        """Number of latent degrees of freedom."""
        return int(sum(math.prod(d.shape) for d in jtu.tree_leaves(self.domain)))

    def __repr__(self):
        call = getattr(self, "call", None)
        name = getattr(call, "__name__", call) if call is not None else type(self).__name__
        return f"Model(call={name!r}, domain={self.domain})"
