"""Fingerprints: what a checkpoint belongs to (data hashes, latent structure, settings) and how two differ."""

from __future__ import annotations

import hashlib
import json
import math

import jax
import numpy as np
from jax import tree_util as jtu

from .files import _on_host, _structure

__all__ = ["fingerprint"]

_HASH_CHUNK_BYTES = 1 << 23  # hashed this many bytes at a time (bounded temporaries)


def _leaf_record(path: str, x) -> list:
    """``[path, shape, dtype, sha256]``; ``sha256`` of the bytes, ``None`` for a shape-only leaf."""
    if isinstance(x, jax.ShapeDtypeStruct):
        return [path, list(x.shape), str(np.dtype(x.dtype)), None]
    a = _on_host(x)  # an array split over processes: the same bytes (and hash) as the whole one
    h = hashlib.sha256(json.dumps([list(a.shape), str(a.dtype)]).encode() + b"\0")
    # the C-order bytes, a few MiB at a time (a broadcast view is never copied whole)
    rows = a.reshape(1, *a.shape) if a.ndim == 0 else a
    step = max(1, _HASH_CHUNK_BYTES // max(1, rows.nbytes // max(1, rows.shape[0])))
    for i in range(0, rows.shape[0], step):
        h.update(np.ascontiguousarray(rows[i : i + step]).reshape(-1).view(np.uint8))  # pyright: ignore[reportArgumentType]
    return [path, list(a.shape), str(a.dtype), h.hexdigest()]


def _describe_tree(tree) -> dict:
    """Records of the known leaves of ``tree`` and the paths of its unknown (``None``) parts."""
    if tree is None:
        return {"leaves": [], "unknown": ["<all>"]}
    flat = jtu.tree_flatten_with_path(tree, is_leaf=lambda x: x is None or isinstance(x, jax.ShapeDtypeStruct))[0]
    leaves, unknown = [], []
    for p, x in flat:
        if x is None:
            unknown.append(jtu.keystr(p) or "<all>")
        else:
            leaves.append(_leaf_record(jtu.keystr(p), x))
    return {"leaves": leaves, "unknown": unknown}


_JSON_SCALARS = (type(None), bool, int, float, str)


def _json_scalar(name: str, path: str, v):
    """A settings leaf as a JSON scalar (NumPy scalars and 0-d arrays by value); ``TypeError`` otherwise."""
    if isinstance(v, _JSON_SCALARS):
        return v
    if isinstance(v, np.generic) or (isinstance(v, (np.ndarray, jax.Array)) and np.ndim(v) == 0):
        item = np.asarray(v).item()
        if isinstance(item, _JSON_SCALARS):
            return item
    where = f"{name}{path}" if path else name
    raise TypeError(
        f"fingerprint setting {where} must be None, a bool, int, float or str (or a pytree of them), "
        f"got {type(v).__name__}" + (f" of shape {np.shape(v)}" if hasattr(v, "shape") else "")
    )


def _settings_record(name: str, value):
    """JSON form of a setting: plain JSON values as they are, a pytree of bools (a selection) as the
    list of its selected paths, other pytrees as ``[[path, leaf], ...]``."""
    if isinstance(value, _JSON_SCALARS):
        return value
    flat = [(jtu.keystr(p), _json_scalar(name, jtu.keystr(p), v)) for p, v in jtu.tree_flatten_with_path(value)[0]]
    if all(isinstance(v, bool) for _, v in flat):
        return [p or "." for p, v in flat if v]
    return [[p, v] for p, v in flat]


def _same(a, b) -> bool:
    """``a == b`` for JSON values, with NaN equal to NaN (a setting stored as NaN matches NaN)."""
    if isinstance(a, float) and isinstance(b, float) and math.isnan(a) and math.isnan(b):
        return True
    if isinstance(a, list) and isinstance(b, list):
        return len(a) == len(b) and all(_same(x, y) for x, y in zip(a, b))
    if isinstance(a, dict) and isinstance(b, dict):
        return a.keys() == b.keys() and all(_same(a[k], b[k]) for k in a)
    return a == b


def fingerprint(likelihood, position, **settings) -> dict:
    """What a checkpoint belongs to: likelihood data and kind, latent structure, run settings.

    Parameters
    ----------
    likelihood : Likelihood
        Its ``data_leaves`` (the data and noise arrays it was built from and,
        after ``amend``, the model's output shapes) are hashed with SHA-256
        per leaf (bytes, shape, dtype); unknown parts (``None``: a user-built
        likelihood, a callable noise covariance) are listed as unknown.
    position : pytree
        A latent position: tree structure, shapes and dtypes.
    **settings
        JSON values (``None``, bool, int, float, str; NumPy scalars by
        value) or pytrees of them (e.g. ``mirror_samples``, the
        ``point_estimates`` mask). A NaN setting matches NaN when compared.

    Returns
    -------
    dict
        JSON-serializable; stored in the index by :func:`save_checkpoint`.

    Raises
    ------
    TypeError
        A setting, or a leaf of one, is not a JSON scalar (e.g. an array).
    """
    records = {k: _settings_record(k, v) for k, v in sorted(settings.items())}  # checked before any hashing
    return {
        "likelihood": _describe_tree(getattr(likelihood, "data_leaves", None)),
        "latent": _structure(position),
        "settings": records,
    }


def _short(h):
    return "-" if h is None else h[:12]


def _fingerprint_differences(saved: dict, current: dict) -> list:
    """Human-readable differences between two fingerprints (components missing in one are skipped)."""
    out = []
    if isinstance(saved.get("likelihood"), dict) and "likelihood" in current:
        s, c = saved["likelihood"], current["likelihood"]
        sl = {r[0]: r for r in s["leaves"]}
        cl = {r[0]: r for r in c["leaves"]}
        if s["unknown"] != c["unknown"] or set(sl) != set(cl):
            out.append(
                "likelihood: a different kind or data structure (checkpoint: "
                f"{sorted(sl) + ['unknown ' + u for u in s['unknown']]}, now: "
                f"{sorted(cl) + ['unknown ' + u for u in c['unknown']]})"
            )
        else:
            for p in sl:
                a, b = sl[p], cl[p]
                what = "model output" if "model_output" in p else "data"
                if a[1:3] != b[1:3]:
                    out.append(f"{what} {p}: shape {a[1]} {a[2]} in the checkpoint, {b[1]} {b[2]} now")
                elif a[3] != b[3]:
                    out.append(
                        f"{what} {p}: the values differ (SHA-256 {_short(a[3])}... in the checkpoint, "
                        f"{_short(b[3])}... now)"
                    )
    if "latent" in saved and "latent" in current and saved["latent"] != current["latent"]:
        out.append(f"latent structure: {saved['latent']} in the checkpoint, {current['latent']} now")
    ss, cs = saved.get("settings"), current.get("settings", {})
    if isinstance(ss, dict):
        for k in sorted(set(ss) & set(cs)):
            if not _same(ss[k], cs[k]):
                out.append(f"{k}: {ss[k]!r} in the checkpoint, {cs[k]!r} now")
    return out
