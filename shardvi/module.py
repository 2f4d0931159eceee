"""``Module``: the base of shardvi's pytree classes (likelihoods, models, responses, fields).

A module's arrays are pytree leaves, everything else is static configuration.
The engine passes modules to its compiled steps as *arguments*: data, noise,
masks and grids are then inputs of the XLA programs, not constants baked into
them (no copy of the data in every compiled program, new data of the same
shapes reuse the compiled programs, and the data can carry a sharding).

Rules
-----
- Subclass :class:`Module` and set attributes in ``__init__`` (or declare a
  ``dataclass``). After ``__init__`` the instance is immutable.
- Every attribute is split leaf by leaf: arrays (``jax.Array``,
  ``numpy.ndarray``, NumPy scalars of a numeric or bool dtype) are dynamic
  leaves; anything else (Python numbers, strings, callables, shapes,
  ``jax.ShapeDtypeStruct``) is static and part of the tree structure.
  Containers (tuples, dicts, other modules, ``jax.tree_util.Partial``) are
  searched for arrays. The split is fixed when the module is first flattened
  and kept by every rebuilt copy, so JAX may put tracers or placeholders at
  the leaves.
- Validation belongs in ``__init__``: JAX rebuilds modules from their leaves
  (with tracers, or placeholders) without calling ``__init__``.
- Arrays hidden inside a plain Python closure cannot be found; such a
  closure is static and its arrays stay constants of the compiled program.
  Keep arrays as attributes (or in a ``jax.tree_util.Partial``) instead.
"""

from __future__ import annotations

import functools

import jax
import numpy as np
from jax import tree_util as jtu

__all__ = ["Module", "is_array"]

_FROZEN = "_Module__frozen"


def is_array(x) -> bool:
    """True for the leaves a :class:`Module` passes as program inputs (numeric/bool arrays)."""
    if isinstance(x, jax.Array):
        return True
    return isinstance(x, (np.ndarray, np.generic)) and np.dtype(x.dtype).kind in "biufc"


class _Static:
    """Hashable, comparable wrapper of a module's static parts (JAX compares tree structures).

    Hashable values compare by value; unhashable ones (e.g. a NumPy array of
    strings) by identity.
    """

    __slots__ = ("value", "_key")

    def __init__(self, value):
        self.value = value
        leaves, treedef = jtu.tree_flatten(value)
        self._key = (treedef, tuple(_hashable(v) for v in leaves))

    def __hash__(self):
        return hash(self._key)

    def __eq__(self, other):
        if not isinstance(other, _Static):
            return NotImplemented
        try:
            return bool(self._key == other._key)
        except Exception:  # noqa: BLE001 -- a static value whose __eq__ does not return a bool
            return False

    def __repr__(self):
        return f"_Static({self.value!r})"


class _Identity:
    __slots__ = ("obj",)

    def __init__(self, obj):
        self.obj = obj

    def __hash__(self):
        return id(self.obj)

    def __eq__(self, other):
        return isinstance(other, _Identity) and other.obj is self.obj


def _hashable(v):
    try:
        hash(v)
    except TypeError:
        return _Identity(v)
    return v


_LAYOUT = "_Module__layout"


def _layout(obj) -> tuple:
    """``(names, treedefs, masks)`` of ``obj``'s attributes; masks mark the array leaves (dynamic).

    Fixed when first needed (from the values ``__init__`` set) and carried over by unflattening, so
    that JAX may replace the leaves by anything (tracers, placeholders, ``None``) without moving
    them between the dynamic and the static part.
    """
    layout = obj.__dict__.get(_LAYOUT)
    if layout is None:
        names, treedefs, masks = [], [], []
        for name, value in vars(obj).items():
            if name in (_FROZEN, _LAYOUT):
                continue
            leaves, treedef = jtu.tree_flatten(value)
            names.append(name)
            treedefs.append(treedef)
            masks.append(tuple(is_array(x) for x in leaves))
        layout = (tuple(names), tuple(treedefs), tuple(masks))
        object.__setattr__(obj, _LAYOUT, layout)
    return layout


def _flatten_with_keys(obj):
    names, treedefs, masks = _layout(obj)
    children, statics = [], []
    for name, treedef, mask in zip(names, treedefs, masks):
        leaves = treedef.flatten_up_to(obj.__dict__[name])
        dynamic = treedef.unflatten([x if m else None for x, m in zip(leaves, mask)])
        children.append((jtu.GetAttrKey(name), dynamic))
        statics.append(tuple(x for x, m in zip(leaves, mask) if not m))
    return children, (names, treedefs, masks, _Static(tuple(statics)))


def _flatten(obj):
    children, aux = _flatten_with_keys(obj)
    return [c for _, c in children], aux


def _unflatten(cls, aux, children):
    names, treedefs, masks, statics = aux
    obj = object.__new__(cls)
    for name, treedef, mask, dynamic, static in zip(names, treedefs, masks, children, statics.value):
        dyn, sta = iter(treedef.flatten_up_to(dynamic)), iter(static)
        leaves = [next(dyn) if m else (next(dyn), next(sta))[1] for m in mask]
        object.__setattr__(obj, name, treedef.unflatten(leaves))
    object.__setattr__(obj, _LAYOUT, (names, treedefs, masks))
    object.__setattr__(obj, _FROZEN, True)
    return obj


def _freezing_init(init):
    @functools.wraps(init)
    def __init__(self, *args, **kwargs):
        init(self, *args, **kwargs)
        if type(self).__init__ is __init__:  # the outermost __init__ has run: freeze
            object.__setattr__(self, _FROZEN, True)

    return __init__


class Module:
    """Base class of pytree objects whose arrays are leaves and whose configuration is static.

    See the module docstring for the rules. ``jax.tree_util.tree_leaves(m)``
    lists the arrays of ``m`` (attribute order, recursively); two modules
    with the same static configuration and array shapes share the same
    compiled programs.
    """

    def __init_subclass__(cls, **kwargs):
        super().__init_subclass__(**kwargs)
        if "__init__" in cls.__dict__:
            cls.__init__ = _freezing_init(cls.__dict__["__init__"])
        jtu.register_pytree_with_keys(cls, _flatten_with_keys, functools.partial(_unflatten, cls), _flatten)

    def __setattr__(self, name, value):
        if self.__dict__.get(_FROZEN, False):
            raise AttributeError(
                f"{type(self).__name__} is immutable: cannot set {name!r} after construction (build a new one)"
            )
        # during __init__ the object may have been flattened already (e.g. traced by jax.eval_shape to find
        # its output shapes): the layout read then must not miss the attributes set after it
        self.__dict__.pop(_LAYOUT, None)
        object.__setattr__(self, name, value)

    def __delattr__(self, name):
        raise AttributeError(f"{type(self).__name__} is immutable: cannot delete {name!r}")

    def _replaced(self, **changes):
        """A copy with the attributes in ``changes`` replaced (``__init__`` is not run: no validation)."""
        new = object.__new__(type(self))
        for name, value in vars(self).items():
            if name not in (_FROZEN, _LAYOUT):
                object.__setattr__(new, name, changes.pop(name, value))
        if changes:
            raise AttributeError(f"{type(self).__name__} has no attributes {sorted(changes)}")
        object.__setattr__(new, _FROZEN, True)
        return new
