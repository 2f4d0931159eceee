"""Static selections of latent entries (point estimates, constants)."""

from __future__ import annotations

from jax import tree_util as jtu

from .. import tree_math as tm

__all__ = ["parse_selection", "project", "any_selected"]


def parse_selection(spec, domain, argname: str):
    """Pytree of Python bools (True = selected) shaped like ``domain``'s structure.

    ``spec`` is empty/None, a sequence of top-level keys of a dict domain, or
    a pytree of bools with the domain's structure.
    """
    treedef = jtu.tree_structure(domain)
    if spec is None or (isinstance(spec, (tuple, list, set, frozenset)) and len(spec) == 0):
        return jtu.tree_unflatten(treedef, [False] * treedef.num_leaves)
    if isinstance(spec, (tuple, list, set, frozenset)) and all(isinstance(k, str) for k in spec):
        if not isinstance(domain, dict):
            raise TypeError(
                f"{argname} given as keys {tuple(spec)} needs a dict latent domain, got {type(domain).__name__}"
            )
        unknown = sorted(set(spec) - set(domain))
        if unknown:
            raise ValueError(f"{argname} names unknown latent keys {unknown}; known: {sorted(domain)}")
        return {k: jtu.tree_map(lambda _: k in spec, v) for k, v in domain.items()}  # noqa: B023 -- called at once
    if isinstance(spec, str):
        raise TypeError(f"{argname} must be a sequence of keys, not a single string {spec!r}")
    try:
        leaves = treedef.flatten_up_to(spec)
    except (ValueError, TypeError) as err:
        raise ValueError(
            f"{argname} must be a sequence of dict keys or a pytree of bools with the latent structure {treedef}"
        ) from err
    if not all(isinstance(b, bool) for b in leaves):
        raise TypeError(f"{argname} pytree leaves must be Python bools")
    return jtu.tree_unflatten(treedef, leaves)


def project(keep, v):
    """Zero the entries of ``v`` whose ``keep`` flag is False (static, free when all True)."""
    return jtu.tree_map(lambda k, x: x if k else tm.zeros_like(x), keep, v)


def any_selected(sel) -> bool:
    return any(jtu.tree_leaves(sel))
