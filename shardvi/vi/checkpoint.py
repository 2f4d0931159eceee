"""Array-only checkpoints: ``.npz`` arrays plus a JSON index, written atomically.

Layout of ``checkpoint_dir``::

    state-000003.npz   arrays of iteration 3 (pos, residuals, keys, RNG state)
    latest.json        metadata + name and SHA-256 of the newest complete npz

Every file is written to a temporary name, flushed, fsynced and renamed, so a
crash at any moment leaves either the previous or the new checkpoint, never a
partial one. Loading uses ``allow_pickle=False``: no code is ever executed.
"""
from __future__ import annotations

import hashlib
import json
import os
import tempfile

import jax.numpy as jnp
import numpy as np
from jax import tree_util as jtu

from .diagnostics import IterationReport
from .samples import Samples

__all__ = ["save_checkpoint", "load_checkpoint", "has_checkpoint", "CheckpointError", "FORMAT"]

FORMAT = "shardvi-checkpoint-v1"
_INDEX = "latest.json"
_KEEP = 2


class CheckpointError(ValueError):
    """A checkpoint is missing, corrupted, or belongs to a different model."""


def _atomic_write(path: str, write) -> None:
    d = os.path.dirname(path) or "."
    fd, tmp = tempfile.mkstemp(dir=d, prefix=".tmp-", suffix=os.path.basename(path))
    try:
        with os.fdopen(fd, "wb") as f:
            write(f)
            f.flush()
            os.fsync(f.fileno())
        os.replace(tmp, path)
    except BaseException:
        if os.path.exists(tmp):
            os.unlink(tmp)
        raise
    dfd = os.open(d, os.O_RDONLY)
    try:
        os.fsync(dfd)
    finally:
        os.close(dfd)


def _structure(pos) -> dict:
    leaves_p = jtu.tree_flatten_with_path(pos)[0]
    return {"treedef": str(jtu.tree_structure(pos)),
            "leaves": [[jtu.keystr(p), list(np.shape(x)), str(np.asarray(x).dtype)] for p, x in leaves_p]}


def _sha256(path: str) -> str:
    h = hashlib.sha256()
    with open(path, "rb") as f:
        for chunk in iter(lambda: f.read(1 << 20), b""):
            h.update(chunk)
    return h.hexdigest()


def save_checkpoint(directory: str, samples: Samples, state) -> str:
    """Write ``samples`` and an ``OptimizeVIState`` to ``directory``; returns the npz path."""
    os.makedirs(directory, exist_ok=True)
    arrays = {}
    for i, x in enumerate(jtu.tree_leaves(samples.pos)):
        arrays[f"pos_{i}"] = np.asarray(x)
    for i, x in enumerate(jtu.tree_leaves(samples.residuals)):
        arrays[f"residuals_{i}"] = np.asarray(x)
    keys = samples.keys if samples.keys is not None else np.zeros((0, 2), np.uint32)
    arrays["keys"] = np.asarray(keys)
    arrays["state_key"] = np.asarray(state.key)
    name = f"state-{state.nit:06d}.npz"
    path = os.path.join(directory, name)
    _atomic_write(path, lambda f: np.savez(f, **arrays))
    meta = {
        "format": FORMAT,
        "nit": int(state.nit),
        "npz": name,
        "sha256": _sha256(path),
        "structure": _structure(samples.pos),
        "n_residuals": len(samples),
        "history": [r._asdict() for r in state.history],
    }
    _atomic_write(os.path.join(directory, _INDEX), lambda f: f.write(json.dumps(meta, indent=1).encode()))
    _prune(directory, keep={name})
    return path


def _prune(directory: str, keep: set) -> None:
    old = sorted(f for f in os.listdir(directory) if f.startswith("state-") and f.endswith(".npz"))
    for f in old[:-_KEEP]:
        if f not in keep:
            os.unlink(os.path.join(directory, f))
    for f in os.listdir(directory):  # temporaries of a crashed writer
        if f.startswith(".tmp-"):
            try:
                os.unlink(os.path.join(directory, f))
            except FileNotFoundError:
                pass


def has_checkpoint(directory) -> bool:
    return directory is not None and os.path.isfile(os.path.join(directory, _INDEX))


def load_checkpoint(directory: str, like_pos):
    """Read the newest checkpoint in ``directory``.

    Parameters
    ----------
    directory : str
        A ``checkpoint_dir`` written by :func:`save_checkpoint`.
    like_pos : pytree
        A latent position of the current model; the checkpoint must have the
        same tree structure, shapes and dtypes.

    Returns
    -------
    (Samples, OptimizeVIState)

    Raises
    ------
    CheckpointError
        Missing/corrupted files, a checksum mismatch or a different structure.
    """
    from .optimize_kl import OptimizeVIState  # noqa: cyclic at import time only

    index = os.path.join(directory, _INDEX)
    try:
        with open(index, "rb") as f:
            meta = json.loads(f.read().decode())
    except FileNotFoundError:
        raise CheckpointError(f"no checkpoint in {directory!r} (missing {_INDEX})") from None
    except (UnicodeDecodeError, json.JSONDecodeError) as err:
        raise CheckpointError(f"checkpoint index {index!r} is corrupted: {err}") from None
    if not isinstance(meta, dict) or meta.get("format") != FORMAT:
        raise CheckpointError(f"{index!r} is not a {FORMAT} checkpoint index")
    expected = _structure(like_pos)
    if meta["structure"] != expected:
        raise CheckpointError(
            f"checkpoint in {directory!r} was written for a different model structure:\n"
            f"  checkpoint: {meta['structure']}\n  current:    {expected}")
    path = os.path.join(directory, meta["npz"])
    if not os.path.isfile(path):
        raise CheckpointError(f"checkpoint arrays {path!r} are missing")
    if _sha256(path) != meta["sha256"]:
        raise CheckpointError(f"checkpoint arrays {path!r} do not match their recorded SHA-256 (corrupted)")
    try:
        with np.load(path, allow_pickle=False) as z:
            data = {k: z[k] for k in z.files}
    except Exception as err:  # zipfile/format errors
        raise CheckpointError(f"checkpoint arrays {path!r} are unreadable: {err}") from None
    treedef = jtu.tree_structure(like_pos)
    n = treedef.num_leaves
    try:
        pos = jtu.tree_unflatten(treedef, [jnp.asarray(data[f"pos_{i}"]) for i in range(n)])
        res = jtu.tree_unflatten(treedef, [jnp.asarray(data[f"residuals_{i}"]) for i in range(n)])
        keys = jnp.asarray(data["keys"])
        key = jnp.asarray(data["state_key"])
    except KeyError as err:
        raise CheckpointError(f"checkpoint arrays {path!r} lack entry {err}") from None
    history = tuple(IterationReport(**r) for r in meta.get("history", []))
    samples = Samples(pos, res, keys if keys.shape[0] else None)
    return samples, OptimizeVIState(nit=int(meta["nit"]), key=key, history=history)

